"""Why a request waits, in words: read from the decision core's state, deciding nothing.

Every waiting step has a reason the scheduler can state, checked in the order the core
decides in (``Scheduler._decide``): an exclusive (image) job holds or claims the GPU; a
higher class runs or waits (the interactive window, the starvation guard's share); between
chats, the lower classes' engines at once (``lower_class_engines``); older
requests for the same model are ahead; and then the model's engine: loading, every slot
busy, unhealthy, failed and backing off, on its way out, held for a swap so that requests
for loaded models go first (``swap_hold``), or not loaded and its memory does not fit,
naming the engines that could make room and why each may not (pinned, hot until when,
loading, wanted by earlier work). ``/healthz``, ``/admin/state``, ``steward top`` and
the ``waiting`` event all say it with ``explain``.
"""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING

import attrs

from supervisor.scheduler.types import CLASSES, RANK, EngineState, EngineStatus, Job
from supervisor.units import format_elapsed, format_size

if TYPE_CHECKING:
    from supervisor.scheduler.core import Demand, Scheduler


class WaitReason(enum.Enum):
    EXCLUSIVE = "exclusive"  # an image job holds the GPU, or waits for it ahead of this class
    DRAINING_FOR_EXCLUSIVE = "draining_for_exclusive"  # an exclusive job waits for work to drain
    INTERACTIVE_WINDOW = "interactive_window"  # a lower class, held while interactive work runs
    HIGHER_CLASS = "higher_class"  # a lower class, held while a higher one (not interactive) runs
    GUARD_SHARE = "guard_share"  # its class is due a starvation step, but the guard's lane is taken
    # Between chats, lower classes compute on lower_class_engines engines at once, and as many do
    LOWER_CLASS_ENGINES = "lower_class_engines"
    IN_LINE = "in_line"  # older requests for the same model go first
    LOADING = "loading"
    NO_SLOT = "no_slot"
    UNHEALTHY = "unhealthy"
    ENGINE_FAILED = "engine_failed"
    UNLOADING = "unloading"  # its engine is on its way out; it loads again once gone
    FREEING = "freeing"  # memory on its way out makes room: waiting for it to be free
    NO_ROOM = "no_room"  # it does not fit, and nothing may be evicted for it now
    PROMISED = "promised"  # it would fit, but earlier demand waits for that memory
    SWAP_HOLD = "swap_hold"  # its load would evict: held so that requests for loaded models go first
    SHUTTING_DOWN = "shutting_down"


@attrs.frozen
class Wait:
    reason: WaitReason
    why: str  # in words, for a person: "background request for gemma waits: needs 4.0 GiB, ..."


def explain(s: Scheduler, job: Job) -> Wait:
    """Why *job* (waiting) has not started, at the core's current time."""
    what = f"{job.klass} request for {job.model}" if not job.exclusive else f"{job.klass} image job"

    reason, detail = _why(s, job)
    return Wait(reason, f"{what} waits: {detail}")


def _why(s: Scheduler, job: Job) -> tuple[WaitReason, str]:
    now = s.now
    rank = RANK[job.klass]
    blocked_from = s._exclusive_rank()
    if job.exclusive:
        return WaitReason.DRAINING_FOR_EXCLUSIVE, _exclusive_detail(s, job)
    if s.exclusive_holder is not None:
        return WaitReason.EXCLUSIVE, "an image job holds the GPU"
    if blocked_from is not None and rank >= blocked_from:
        return WaitReason.EXCLUSIVE, f"an image job ({CLASSES[blocked_from]}) is next: work drains for it"
    gate = s._gate(job.klass, now, s._guard_turn(now))
    if gate != "open" and s.guard[job.klass] != job.id:
        return _held_by_higher(s, job)
    if gate == "open" and s.guard[job.klass] != job.id and s.lower_engines_full(job.klass, job.model, now):
        return WaitReason.LOWER_CLASS_ENGINES, (
            f"while a chat's engine is hot, background and batch compute on {s.policy.lower_class_engines} "
            f"engine(s) at once, and {', '.join(sorted(s.lower_class_busy()))} computes")
    line = s.queues[job.klass].line(job.model)
    if line and line[0] is not job:
        _, head = _why(s, line[0])
        return WaitReason.IN_LINE, (f"{line.index(job)} older {job.klass} request(s) for {job.model} go first "
                                    f"(the first waits: {head})")
    return _engine_wait(s, job, s.engines[job.model])  # type: ignore[index]


def _exclusive_detail(s: Scheduler, job: Job) -> str:
    running = sum(s.running_by_class[k] for k in CLASSES[RANK[job.klass]:])
    unloading = [e.name for e in s.engines.values() if e.draining or s.ledger.releasing(e.name)]
    parts = [f"needs {format_size(job.exclusive_memory)} of the GPU"]
    if s.exclusive_holder is not None:
        parts.append("another image job holds it")
    if running:
        parts.append(f"{running} running step(s) drain first")
    if unloading:
        parts.append(f"unloading {', '.join(unloading)}")
    return "; ".join(parts)


def _held_by_higher(s: Scheduler, job: Job) -> tuple[WaitReason, str]:
    now = s.now
    limit = s.policy.starvation[job.klass]
    since = s._starved_since(job.klass)
    guard = ""
    if limit > 0 and since is not None:
        due = max(since + limit, s.guard_resume_at)
        lane = s.lane_class()
        if now >= due and lane is not None:
            return WaitReason.GUARD_SHARE, (f"the starvation guard lets one lower-class turn run at a time, "
                                            f"and a {lane} turn has the lane")
        if now >= due:
            return WaitReason.GUARD_SHARE, "the starvation guard's step waits for a moment no interactive step computes"
        guard = f"; the starvation guard lets one step through at {_clock(s, due)}"
    if s._interactive_active(now):
        if s.running_by_class["interactive"]:
            cause = f"{s.running_by_class['interactive']} interactive step(s) running"
        elif s.queues["interactive"].size:
            cause = f"{s.queues['interactive'].size} interactive step(s) waiting"
        else:
            until = s.last_interactive_end + s.policy.interactive_window
            cause = f"the interactive window is open until {_clock(s, until)}"
        return WaitReason.INTERACTIVE_WINDOW, cause + guard
    higher = [k for k in CLASSES[: RANK[job.klass]] if s.running_by_class[k] or s.queues[k].size]
    return WaitReason.HIGHER_CLASS, f"{' and '.join(higher)} work goes first{guard}"


def _engine_wait(s: Scheduler, job: Job, engine: EngineState) -> tuple[WaitReason, str]:
    now, name = s.now, engine.name
    if s.closing:
        return WaitReason.SHUTTING_DOWN, "steward is shutting down"
    if engine.status is EngineStatus.STARTING:
        last = engine.load_s if not engine.waking else None  # a wake's time is not a load's
        usually = "" if last is None else f"; its last load took {format_elapsed(last)}"
        return WaitReason.LOADING, f"{name} is loading (for {format_elapsed(now - engine.start_decided_at)}{usually})"
    if engine.status is EngineStatus.READY and engine.unhealthy:
        return WaitReason.UNHEALTHY, f"{name} fails its health checks"
    if engine.status is EngineStatus.READY:
        return WaitReason.NO_SLOT, f"all {engine.profile.slots} slot(s) of {name} are busy"
    if engine.status is EngineStatus.FAILED:
        return WaitReason.ENGINE_FAILED, (f"{name} failed {engine.failures} time(s) in a row; it restarts at "
                                          f"{_clock(s, engine.retry_at)}")
    if engine.draining:
        return WaitReason.UNLOADING, (f"{name} is being unloaded ({engine.in_flight} step(s) finishing); "
                                      f"it loads again once it is gone")
    if s.ledger.releasing(name):
        return WaitReason.FREEING, f"the memory of {name}'s last process is not yet seen free"
    wanted = _earlier_demand(s)
    option = s._place(engine, now, {}, wanted, (RANK[job.klass], job.seq), idle_only=False)
    if option is None:
        return WaitReason.NO_ROOM, f"needs {format_size(engine.profile.memory)}, more than its devices hold"
    placement = option.placement
    where = "" if not placement.chosen else (
        f" on device{'s' if placement.split else ''} {', '.join(map(str, placement.devices))}")
    need = f"needs {format_size(sum(option.needs.values()))}{where}"
    free = format_size(max(0, sum(s.ledger.free_on(d) for d in option.needs)))
    if option.fits:
        return WaitReason.PROMISED, f"{need}; it is free, but earlier requests wait for that memory"
    if (hold := s._swap_hold(job, option, now)) is not None:
        return WaitReason.SWAP_HOLD, (
            f"{need}, {free} free; held for up to {s.policy.swap_hold:g}s (until {_clock(s, hold.until)}) so that "
            f"{job.klass} requests for the loaded {', '.join(hold.behind)} go first; then it evicts "
            f"{', '.join(hold.would_evict)}")
    if option.victims:
        names = ", ".join(v.name for v in option.victims)
        return WaitReason.PROMISED, f"{need}, {free} free; evicting {names} waits until earlier requests are served"
    if option.victims is not None:
        leaving = [e.name for e in s.engines.values() if any(s.ledger.held_on(e.name, d) for d in option.needs)
                   and (e.draining or s.ledger.releasing(e.name))]
        return WaitReason.FREEING, (f"{need}, {free} free; waiting for "
                                    f"{', '.join(leaving) or 'memory on its way out'} to be unloaded")
    return WaitReason.NO_ROOM, f"{need}, {free} free; {_blockers(s, engine, job, option.needs, wanted)}"


def _earlier_demand(s: Scheduler) -> dict[str, Demand]:
    wanted: dict[str, Demand] = {}
    for rank, klass in enumerate(CLASSES):
        for head in s.queues[klass].heads():
            if head.model is not None:
                demand = (rank, head.seq)
                wanted[head.model] = min(wanted.get(head.model, demand), demand)
    return wanted


def _blockers(s: Scheduler, engine: EngineState, job: Job, needs: dict[int, int], wanted: dict[str, Demand]) -> str:
    """The engines holding the memory it needs, and why none may be evicted for it now."""
    now = s.now
    interactive = job.klass == "interactive"
    reasons = []
    for other in s.engines.values():
        if other is engine or not any(s.ledger.held_on(other.name, d) for d in needs):
            continue
        if other.profile.pinned:
            why = "pinned"
        elif other.status is EngineStatus.STARTING:
            why = "loading"
        elif not interactive and other.hot(now, s.policy.hot_window):
            why = f"hot until {_clock(s, other.last_interactive + s.policy.hot_window)}"
        elif other.name in wanted and wanted[other.name] < (RANK[job.klass], job.seq):
            why = "wanted by earlier requests"
        elif other.status is EngineStatus.SLEEPING:
            why = "asleep, holding its sleeping memory"
        else:
            why = other.status.value
        idle = other.status is EngineStatus.READY and other.in_flight == 0
        reasons.append((other.name, why, idle))
    if not reasons:
        return "memory outside steward's engines holds the rest"
    if len(reasons) == 1:
        name, why, idle = reasons[0]
        return f"the only {'idle ' if idle else ''}engine ({name}) is {why}"
    return "the engines that could make room may not: " + ", ".join(f"{name} ({why})" for name, why, _ in reasons)


def _clock(s: Scheduler, at: float) -> str:
    """A time of the core's clock as the wall clock reads it (HH:MM:SS, local time)."""
    return time.strftime("%H:%M:%S", time.localtime(at + s.wall_offset))
