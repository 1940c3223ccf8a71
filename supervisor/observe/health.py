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
  written now, or usage rows were lost within the window; or a class's answers came more
  than ``health.slowdown`` times slower than their engines decode alone (the median over
  the window, supervisor/observe/slowdown.py), with what computed beside them;
- **ok** otherwise.

``RecentActivity`` counts the last window of rejections, dispatches and crashes (fed from
the event log, where every such decision is already an event), and ``StandingFaults`` keeps
what is wrong until an event says it is over (a task restarting, a file that cannot be
written); ``assess`` is pure, so it runs the same on MockClock as in production;
``serve_health`` assesses every ``health.interval`` and logs each change of status as one ``health`` event (which the alerts follow),
and each class that starts or stops answering too slowly as ``class_slowed`` / ``class_recovered``.
"""

from __future__ import annotations

import collections
import enum
import math
import time
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import attrs
import trio

from supervisor.observe.events import Event, EventLog
from supervisor.scheduler.actor import SchedulerClient
from supervisor.request_class import RequestClass
from supervisor.scheduler.types import SchedulerSnapshot
from supervisor.observe.slowdown import format_factor
from supervisor.supervise import Supervision
from supervisor.units import format_duration, format_elapsed
from supervisor.usage.report import percentile


class HealthStatus(enum.Enum):
    OK = "ok"
    DEGRADED = "degraded"
    OVERLOADED = "overloaded"


# Rejections that say capacity is short right now, and those that say something is broken.
CAPACITY_REASONS = frozenset({"queue_full", "queue_timeout"})
BROKEN_REASONS = frozenset({"insufficient_memory", "engine_failed", "engine_start_failed"})
DEFAULT_SLO_WAIT = {"interactive": 30.0, "background": 300.0, "batch": 1800.0}
MIN_ANSWERS = 3  # a class is judged slow on at least this many answers with a slowdown in the window
ANSWERS_KEPT = 20_000  # per window, at most: the oldest go first past it


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


@attrs.frozen
class Answer:
    """One answer served (status 200), as its ``request`` event told it."""

    at: float
    klass: str
    ttft_s: float | None
    slowdown: float | None
    beside: tuple[str, ...] = ()  # "engine (class)" of each step that computed beside it


@attrs.define
class RecentAnswers:
    """The answers of the last ``window`` seconds, in the order they ended (exact times)."""

    window: float
    answers: collections.deque[Answer] = attrs.Factory(lambda: collections.deque(maxlen=ANSWERS_KEPT))

    def add(self, answer: Answer) -> None:
        self.answers.append(answer)

    def age(self, now: float) -> None:
        while self.answers and self.answers[0].at <= now - self.window:
            self.answers.popleft()


@attrs.frozen
class ClassPace:
    """How a class's answers came over the window: time to first token, and how many times slower
    than their engines decode alone, with the steps that computed beside the slowed ones."""

    answers: int  # served in the window
    measured: int  # of them, those whose slowdown is known
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    slowdown_p50: float | None
    slowdown_p95: float | None
    beside: dict[str, int]  # "engine (class)" -> of the measured answers, how many it computed beside

    def to_json(self) -> dict[str, object]:
        return {"answers": self.answers, "measured": self.measured, "ttft_p50_s": self.ttft_p50_s,
                "ttft_p95_s": self.ttft_p95_s, "slowdown_p50": self.slowdown_p50, "slowdown_p95": self.slowdown_p95,
                "beside": self.beside}


def class_paces(answers: Iterable[Answer]) -> dict[RequestClass, ClassPace]:
    by_class: dict[RequestClass, list[Answer]] = {klass: [] for klass in RequestClass}
    for answer in answers:
        if answer.klass in by_class:
            by_class[answer.klass].append(answer)
    return {klass: _pace(members) for klass, members in by_class.items()}


def _pace(answers: list[Answer]) -> ClassPace:
    ttfts = sorted(a.ttft_s for a in answers if a.ttft_s is not None)
    measured = [a for a in answers if a.slowdown is not None]
    slowdowns = sorted(a.slowdown for a in measured if a.slowdown is not None)
    beside = collections.Counter(label for a in measured for label in set(a.beside))
    return ClassPace(len(answers), len(measured), _round(percentile(ttfts, 0.5)), _round(percentile(ttfts, 0.95)),
                     _round(percentile(slowdowns, 0.5)), _round(percentile(slowdowns, 0.95)),
                     dict(sorted(beside.items(), key=lambda item: (-item[1], item[0]))))


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def slowed_reason(klass: str, pace: ClassPace, limit: float, window: str) -> str | None:
    """Why *klass* answers too slowly (its median slowdown over *limit*), naming what computed
    beside it; None while it does not (or too few of its answers tell: MIN_ANSWERS)."""
    if limit <= 0 or pace.measured < MIN_ANSWERS or pace.slowdown_p50 is None or pace.slowdown_p50 <= limit:
        return None
    said = (f"{klass} answers came {format_factor(pace.slowdown_p50)} slower than their engines alone (median of "
            f"{pace.measured} in the last {window}; p95 {format_factor(pace.slowdown_p95 or pace.slowdown_p50)}; "
            f"health.slowdown {limit:g}×)")
    if not pace.beside:
        return f"{said}: nothing steward runs computed beside them (something else uses the compute)"
    return f"{said}: beside them computed " + ", ".join(
        f"{label} in {count} of {pace.measured}" for label, count in pace.beside.items())


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
    answers: RecentAnswers = attrs.field(init=False)  # served answers: their ttft and slowdown
    last_capacity_rejection: float | None = attrs.field(init=False, default=None)  # trio's clock

    def __attrs_post_init__(self) -> None:
        self.rejections, self.dispatches, self.crashes, self.task_failures, self.rows_lost = (
            WindowCounts(self.window) for _ in range(5))
        self.answers = RecentAnswers(self.window)

    def observe(self, event: Event) -> None:
        f = event.fields
        match event.name:
            case "reject" if f.get("reason") != "shutting_down":
                self.rejections.add(f["reason"], event.mono)
                if f["reason"] in CAPACITY_REASONS:
                    self.last_capacity_rejection = event.mono
            case "timeout":
                self.rejections.add("queue_timeout", event.mono)
                self.last_capacity_rejection = event.mono
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
            case "request" if f.get("status") == 200 and isinstance(f.get("class"), str):
                self.answers.add(Answer(event.mono, f["class"], f.get("ttft_s"), f.get("slowdown"),
                                        tuple(f.get("beside") or ())))

    def age(self, now: float) -> None:
        for counts in (self.rejections, self.dispatches, self.crashes, self.task_failures, self.rows_lost):
            counts.age(now)
        self.answers.age(now)

    def capacity_rejections_until(self) -> float | None:
        """When the last rejection for capacity leaves the window (counts go by whole seconds)."""
        last = self.last_capacity_rejection
        return None if last is None else math.floor(last) + 1 + self.window


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
    waited_share: dict[RequestClass, float | None]  # per class: the share of steps that had to wait, within the window
    waiting_s: dict[RequestClass, float]  # per class: how long its longest-waiting request has waited now
    tasks: dict[str, dict[str, Any]] = attrs.Factory(dict)  # steward's own supervised tasks (supervise.py)
    # Per class: its answers' ttft and slowdown in the window.
    paces: dict[RequestClass, ClassPace] = attrs.Factory(dict)
    slowed: dict[RequestClass, str] = attrs.Factory(dict)  # the classes answering too slowly, and why
    # When rejections for capacity stop making it overloaded, unless more come (Unix time).
    overloaded_until: float | None = None

    def to_json(self) -> dict[str, object]:
        return {"status": self.status.value, "reasons": list(self.reasons), "overloaded_until": self.overloaded_until,
                "rejected": self.rejected,
                "waited_share": self.waited_share, "waiting_s": self.waiting_s, "tasks": self.tasks,
                "answers": {klass: pace.to_json() for klass, pace in self.paces.items()}}


def assess(snapshot: SchedulerSnapshot, recent: RecentActivity, slo_wait: Mapping[str, float], now: float,
           standing: Mapping[str, str] | None = None, *, slowdown_limit: float = 0.0, wall_offset: float = 0.0) -> Health:
    """The health now: pure, from a scheduler snapshot, the recent activity and the standing faults
    (*now* on trio's clock; *wall_offset* turns its times into Unix times)."""
    recent.age(now)
    window = format_duration(recent.window)
    overloaded: list[str] = []
    degraded: list[str] = []
    waiting_s = {}
    for klass in RequestClass:
        since = snapshot.oldest_waiting(klass)
        waiting_s[klass] = round(now - since, 3) if since is not None else 0.0
        if since is not None and now - since > slo_wait[klass]:
            overloaded.append(f"{klass} requests have waited {format_elapsed(now - since)}, over their slo_wait "
                              f"of {format_duration(slo_wait[klass])}")
    rejected = {str(reason): n for reason, n in recent.rejections.totals.items()}
    capacity = {reason: n for reason, n in rejected.items() if reason in CAPACITY_REASONS}
    overloaded_until = None
    if capacity and (until := recent.capacity_rejections_until()) is not None:
        overloaded_until = round(until + wall_offset, 3)
        clock = time.strftime("%H:%M:%S", time.localtime(overloaded_until))
        overloaded.append(f"{sum(capacity.values())} requests rejected for capacity in the last {window} "
                          f"({_counts(capacity)}); overloaded until {clock} unless more are rejected")
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
    paces = class_paces(recent.answers.answers)
    slowed = {klass: reason for klass, pace in paces.items()
              if (reason := slowed_reason(klass, pace, slowdown_limit, window)) is not None}
    degraded += slowed.values()
    status = HealthStatus.OVERLOADED if overloaded else HealthStatus.DEGRADED if degraded else HealthStatus.OK
    return Health(status, tuple(overloaded + degraded), rejected, _waited_share(recent), waiting_s, paces=paces,
                  slowed=slowed, overloaded_until=overloaded_until)


def _waited_share(recent: RecentActivity) -> dict[RequestClass, float | None]:
    counts = recent.dispatches.totals
    share = {}
    for klass in RequestClass:
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
    slowdown_limit: float = 0.0  # health.slowdown; 0: off

    def assess(self) -> Health:
        now = trio.current_time()
        health = assess(self.scheduler.snapshot(), self.recent, self.slo_wait, now, self.standing.faults,
                        slowdown_limit=self.slowdown_limit, wall_offset=time.time() - now)
        return health if self.supervision is None else attrs.evolve(health, tasks=self.supervision.to_json())


async def serve_health(watch: HealthWatch, events: EventLog, interval: float, *,
                       task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Assess every *interval*; each change of status is one ``health`` event, each class that
    starts or stops answering too slowly one ``class_slowed`` or ``class_recovered``."""
    task_status.started()
    previous = HealthStatus.OK
    slowed: dict[str, str] = {}
    while True:
        health = watch.assess()
        for klass in [k for k in RequestClass if k in health.slowed and k not in slowed]:
            pace = health.paces[klass]
            events.emit("class_slowed", "warning", **{"class": klass}, slowdown_p50=pace.slowdown_p50,
                        slowdown_p95=pace.slowdown_p95, answers=pace.measured, beside=pace.beside,
                        limit=watch.slowdown_limit, reason=health.slowed[klass])
        for klass in [k for k in RequestClass if k in slowed and k not in health.slowed]:
            pace = health.paces.get(klass)
            events.emit("class_recovered", "info", **{"class": klass},
                        slowdown_p50=pace.slowdown_p50 if pace is not None else None,
                        answers=pace.measured if pace is not None else 0, limit=watch.slowdown_limit)
        slowed = dict(health.slowed)
        if health.status is not previous:
            level = "info" if health.status is HealthStatus.OK else "warning"
            events.emit("health", level, status=health.status.value, previous=previous.value,
                        reasons=list(health.reasons), until=health.overloaded_until)
            previous = health.status
        await trio.sleep(interval)
