"""Is capacity enough? The answer of /healthz, from what is happening rather than from the
process being alive (that is /livez).

The home-lab seed's health check answered 200 whether an answer took 2 s or 10 minutes.
Here the status is worked out from three things:

- **overloaded** (HTTP 503): a class's longest-waiting request has waited past its
  ``classes.C.slo_wait``, or requests were rejected for capacity (queue full, queue
  timeout) within ``health.window``;
- **degraded**: an engine crashed within the window (it restarts with backoff) or fails its
  health checks now, or requests were refused because what they need can never fit, or
  because their engine failed; or one of steward's own tasks failed within the window
  (it restarts: supervise.py), or is down now; or the event log or the usage log cannot be
  written now, or usage rows were lost within the window;
- **ok** otherwise.

``RecentActivity`` counts the last window of rejections, dispatches and crashes (fed from
the event log, where every such decision is already an event), and ``StandingFaults`` keeps
what is wrong until an event says it is over (a task restarting, a file that cannot be
written); ``assess`` is pure, so it runs the same on MockClock as in production;
``serve_health`` assesses every ``health.interval`` and logs each change of status as one ``health`` event (which the alerts follow).
"""

from __future__ import annotations

import collections
import enum
import math
from collections.abc import Hashable, Mapping
from typing import Any

import attrs
import trio

from supervisor.events import Event, EventLog
from supervisor.scheduler.actor import SchedulerClient
from supervisor.scheduler.types import CLASSES, SchedulerSnapshot
from supervisor.supervise import Supervision
from supervisor.units import format_duration, format_elapsed


class HealthStatus(enum.Enum):
    OK = "ok"
    DEGRADED = "degraded"
    OVERLOADED = "overloaded"


# Rejections that say capacity is short right now, and those that say something is broken.
CAPACITY_REASONS = frozenset({"queue_full", "queue_timeout"})
BROKEN_REASONS = frozenset({"insufficient_memory", "engine_failed", "engine_start_failed"})
DEFAULT_SLO_WAIT = {"interactive": 30.0, "background": 300.0, "batch": 1800.0}


@attrs.define
class WindowCounts:
    """How many of each kind of thing happened in the last ``window`` seconds, in one-second
    buckets: adding, reading and ageing cost the same however many there were (counting every
    request's event once a second held up the event loop at a few hundred requests a second)."""

    window: float
    totals: collections.Counter[Hashable] = attrs.Factory(collections.Counter)
    _buckets: collections.deque[tuple[int, collections.Counter[Hashable]]] = attrs.Factory(collections.deque)

    def add(self, key: Hashable, at: float, count: int = 1) -> None:
        second = math.floor(at)
        if not self._buckets or self._buckets[-1][0] < second:  # events come in the order of their times
            self._buckets.append((second, collections.Counter()))
        self._buckets[-1][1][key] += count
        self.totals[key] += count

    def age(self, now: float) -> None:
        """Forget the seconds that ended more than ``window`` ago."""
        while self._buckets and self._buckets[0][0] + 1 <= now - self.window:
            self.totals.subtract(self._buckets.popleft()[1])
            self.totals = +self.totals  # no zero counts left behind


@attrs.define
class RecentActivity:
    """The last ``window`` seconds of rejections (by reason), dispatches (by class, and whether
    they had to wait) and crashes (by engine), counted from the scheduler's events."""

    window: float
    rejections: WindowCounts = attrs.field(init=False)
    dispatches: WindowCounts = attrs.field(init=False)
    crashes: WindowCounts = attrs.field(init=False)
    task_failures: WindowCounts = attrs.field(init=False)  # steward's own tasks, by name
    rows_lost: WindowCounts = attrs.field(init=False)  # usage rows that never reached the database

    def __attrs_post_init__(self) -> None:
        self.rejections, self.dispatches, self.crashes, self.task_failures, self.rows_lost = (
            WindowCounts(self.window) for _ in range(5))

    def observe(self, event: Event) -> None:
        f = event.fields
        match event.name:
            case "reject" if f.get("reason") != "shutting_down":
                self.rejections.add(f["reason"], event.mono)
            case "timeout":
                self.rejections.add("queue_timeout", event.mono)
            case "dispatch":
                self.dispatches.add((f["class"], f["waited_s"] > 0), event.mono)
            case "crash":
                self.crashes.add(f["engine"], event.mono)
            case "task_failed":
                self.task_failures.add(f["task"], event.mono)
            case "usage_rows_lost":
                self.rows_lost.add("usage", event.mono, f["lost"])
            case "usage_rows_dropped":
                self.rows_lost.add("usage", event.mono, f["dropped"])

    def age(self, now: float) -> None:
        for counts in (self.rejections, self.dispatches, self.crashes, self.task_failures, self.rows_lost):
            counts.age(now)


@attrs.define
class StandingFaults:
    """What is wrong now and stays so until an event says it is over, by source: a task of
    steward's waiting to restart, the event log or the usage log that cannot be written."""

    faults: dict[str, str] = attrs.Factory(dict)

    def observe(self, event: Event) -> None:
        f = event.fields
        match event.name:
            case "task_failed" if not f.get("fatal"):
                self.faults[f"task:{f['task']}"] = (f"steward's task {f['task']!r} failed ({f.get('error')}); it "
                                                    f"restarts in {f.get('restart_in_s')}s")
            case "task_restarted":
                self.faults.pop(f"task:{f['task']}", None)
            case "usage_write_failed":
                self.faults["usage_log"] = (f"the usage log {f.get('path')} cannot be written ({f.get('detail')}): "
                                            f"its rows wait in memory")
            case "usage_write_recovered":
                self.faults.pop("usage_log", None)
            case "log_write_failed":
                self.faults["event_log"] = f"the event log {f.get('path')} cannot be written ({f.get('detail')})"
            case "log_write_recovered" | "log_reopened":
                self.faults.pop("event_log", None)


@attrs.frozen
class Health:
    status: HealthStatus
    reasons: tuple[str, ...]
    rejected: dict[str, int]  # by reason, within the window
    waited_share: dict[str, float | None]  # per class: the share of steps that had to wait, within the window
    waiting_s: dict[str, float]  # per class: how long its longest-waiting request has waited now
    tasks: dict[str, dict[str, Any]] = attrs.Factory(dict)  # steward's own supervised tasks (supervise.py)

    def to_json(self) -> dict[str, object]:
        return {"status": self.status.value, "reasons": list(self.reasons), "rejected": self.rejected,
                "waited_share": self.waited_share, "waiting_s": self.waiting_s, "tasks": self.tasks}


def assess(snapshot: SchedulerSnapshot, recent: RecentActivity, slo_wait: Mapping[str, float], now: float,
           standing: Mapping[str, str] | None = None) -> Health:
    """The health now: pure, from a scheduler snapshot, the recent activity and the standing faults."""
    recent.age(now)
    window = format_duration(recent.window)
    overloaded: list[str] = []
    degraded: list[str] = []
    waiting_s = {}
    for klass in CLASSES:
        since = snapshot.oldest_waiting(klass)
        waiting_s[klass] = round(now - since, 3) if since is not None else 0.0
        if since is not None and now - since > slo_wait[klass]:
            overloaded.append(f"{klass} requests have waited {format_elapsed(now - since)}, over their slo_wait "
                              f"of {format_duration(slo_wait[klass])}")
    rejected = {str(reason): n for reason, n in recent.rejections.totals.items()}
    capacity = {reason: n for reason, n in rejected.items() if reason in CAPACITY_REASONS}
    if capacity:
        overloaded.append(f"{sum(capacity.values())} requests rejected for capacity in the last {window} "
                          f"({_counts(capacity)})")
    broken = {reason: n for reason, n in rejected.items() if reason in BROKEN_REASONS}
    if broken:
        degraded.append(f"{sum(broken.values())} requests refused in the last {window} ({_counts(broken)})")
    for engine, crashes in sorted(recent.crashes.totals.items()):
        degraded.append(f"engine {engine!r} crashed {crashes} time(s) in the last {window}")
    degraded += [f"engine {e.name!r} fails its health checks" for e in snapshot.engines if not e.healthy]
    degraded += [fault for _, fault in sorted((standing or {}).items())]
    for task, failures in sorted(recent.task_failures.totals.items()):
        degraded.append(f"steward's task {task!r} failed {failures} time(s) in the last {window}")
    if lost := recent.rows_lost.totals["usage"]:
        degraded.append(f"{lost} usage rows lost in the last {window}")
    status = HealthStatus.OVERLOADED if overloaded else HealthStatus.DEGRADED if degraded else HealthStatus.OK
    return Health(status, tuple(overloaded + degraded), rejected, _waited_share(recent), waiting_s)


def _waited_share(recent: RecentActivity) -> dict[str, float | None]:
    counts = recent.dispatches.totals
    share = {}
    for klass in CLASSES:
        waited, total = counts[klass, True], counts[klass, True] + counts[klass, False]
        share[klass] = round(waited / total, 4) if total else None
    return share


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{reason}: {n}" for reason, n in sorted(counts.items()))


@attrs.define(eq=False)
class HealthWatch:
    """How /healthz and /metrics read the health: assessed fresh at each call."""

    scheduler: SchedulerClient
    recent: RecentActivity
    slo_wait: Mapping[str, float]
    standing: StandingFaults = attrs.Factory(StandingFaults)
    supervision: Supervision | None = None

    def assess(self) -> Health:
        health = assess(self.scheduler.snapshot(), self.recent, self.slo_wait, trio.current_time(),
                        self.standing.faults)
        return health if self.supervision is None else attrs.evolve(health, tasks=self.supervision.to_json())


async def serve_health(watch: HealthWatch, events: EventLog, interval: float, *,
                       task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Assess every *interval*; each change of status is one ``health`` event."""
    task_status.started()
    previous = HealthStatus.OK
    while True:
        health = watch.assess()
        if health.status is not previous:
            level = "info" if health.status is HealthStatus.OK else "warning"
            events.emit("health", level, status=health.status.value, previous=previous.value,
                        reasons=list(health.reasons))
            previous = health.status
        await trio.sleep(interval)
