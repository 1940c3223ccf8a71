"""The last hour, one sample every 10 s: what the ``/ui`` page plots and ``GET /admin/history``
serves (``steward top`` may draw sparklines from it).

``take_sample`` is pure: a scheduler snapshot and the two counters' totals in (completion
tokens and rejections, as /metrics counts them: no second count), one ``Sample`` out. The
ring lives in memory only, owned by ``serve_history``: a restart begins a new hour.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio

from supervisor.engines.memory_plan import Device, device_label
from supervisor.observe.metrics import device_tiers
from supervisor.request_class import RequestClass
from supervisor.scheduler.types import SchedulerSnapshot

HISTORY_PATH = "/admin/history"
INTERVAL_S = 10.0
SAMPLES = 360  # an hour of them


@attrs.frozen
class Totals:
    """Counters since start, read at one moment: completion tokens, and rejections by reason."""

    tokens: int
    rejected: Mapping[str, int]


@attrs.frozen
class Sample:
    ts: float  # wall clock, epoch seconds
    devices: Mapping[str, Mapping[str, int]]  # device label -> tier -> bytes (the admin state's tiers)
    queued: Mapping[str, int]  # class -> steps waiting
    running: Mapping[str, int]  # class -> steps running
    tokens_per_s: float  # completion tokens over the interval
    rejected: int  # steps refused or timed out in the interval
    rejected_by: Mapping[str, int]  # the same, by reason

    def to_json(self) -> dict[str, Any]:
        return {"ts": round(self.ts, 3), "devices": dict(self.devices), "queued": dict(self.queued),
                "running": dict(self.running), "tokens_per_s": self.tokens_per_s, "rejected": self.rejected,
                "rejected_by": dict(self.rejected_by)}


def take_sample(snapshot: SchedulerSnapshot, device: Device, totals: Totals, before: Totals, *, wall: float,
                elapsed_s: float) -> Sample:
    """One sample: the memory and queues now, the counters' growth since *before* (*elapsed_s* ago)."""
    by_reason = {reason: grown for reason, count in totals.rejected.items()
                 if (grown := count - before.rejected.get(reason, 0)) > 0}
    tokens = max(0, totals.tokens - before.tokens)
    return Sample(ts=wall,
                  devices={device_label(device, d.index): device_tiers(snapshot, d, freeing=True)
                           for d in snapshot.devices},
                  queued={klass.value: snapshot.queued_by_class[klass] for klass in RequestClass},
                  running={klass.value: snapshot.running_by_class[klass] for klass in RequestClass},
                  tokens_per_s=round(tokens / elapsed_s, 3) if elapsed_s > 0 else 0.0,
                  rejected=sum(by_reason.values()), rejected_by=by_reason)


@attrs.define(eq=False)
class History:
    """The ring: the newest ``SAMPLES`` samples, oldest first."""

    samples: collections.deque[Sample] = attrs.Factory(lambda: collections.deque(maxlen=SAMPLES))

    def to_json(self) -> dict[str, Any]:
        return {"interval_s": INTERVAL_S, "samples": [sample.to_json() for sample in self.samples]}


async def serve_history(history: History, snapshot: Callable[[], SchedulerSnapshot], totals: Callable[[], Totals],
                        device: Device, wall: Callable[[], float], *, interval: float = INTERVAL_S,
                        task_status: trio.TaskStatus[History] = trio.TASK_STATUS_IGNORED) -> None:
    """Append a sample every *interval* seconds (the first one interval after start: a rate
    needs an interval). The sole writer of *history*; restarted, it keeps the samples it had."""
    task_status.started(history)
    before, since = totals(), trio.current_time()
    while True:
        await trio.sleep_until(since + interval)
        now, current = trio.current_time(), totals()
        history.samples.append(take_sample(snapshot(), device, current, before, wall=wall(), elapsed_s=now - since))
        before, since = current, now
