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

import attrs

from supervisor.scheduler.classes import engines_bounded, lower_class_busy, lower_engines_full
from supervisor.scheduler.eviction import place
from supervisor.scheduler.exclusive import exclusive_rank
from supervisor.scheduler.gaps import left_to_gaps
from supervisor.scheduler.guard import (
    Gate,
    gate,
    guard_turn,
    in_turn,
    lane_class,
    lane_due_at,
    starved_since,
    turn_order,
)
from supervisor.scheduler.state import CoreState, Demand
from supervisor.scheduler.swaps import swap_hold
from supervisor.request_class import ALL_CLASSES, RequestClass
from supervisor.scheduler.types import EngineState, EngineStatus, Job
from supervisor.units import format_elapsed, format_size


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


def explain(s: CoreState, job: Job) -> Wait:
    """Why *job* (waiting) has not started, at the core's current time."""
    what = f"{job.klass} request for {job.model}" if not job.exclusive else f"{job.klass} image job"

    reason, detail = _why(s, job)
    return Wait(reason, f"{what} waits: {detail}")


def wait_detail(s: CoreState, job: Job) -> str:
    """Why *job* waits, without its subject ("needs 4.0 GiB, 2.0 GiB free; ..."): for a rule that
    says it in a sentence of its own (a fallback's why)."""
    return _why(s, job)[1]


def _why(s: CoreState, job: Job) -> tuple[WaitReason, str]:
    now = s.now
    rank = job.klass.rank
    blocked_from = exclusive_rank(s)
    if job.exclusive:
        return WaitReason.DRAINING_FOR_EXCLUSIVE, _exclusive_detail(s, job)
    if s.exclusive_holder is not None:
        return WaitReason.EXCLUSIVE, "an image job holds the GPU"
    if blocked_from is not None and rank >= blocked_from:
        return WaitReason.EXCLUSIVE, f"an image job ({RequestClass.of_rank(blocked_from)}) is next: work drains for it"
    class_gate = gate(s, job.klass, now, guard_turn(s, now))
    mine = s.turns.step[job.klass] == job.id  # the guard's turn waits for this step's engine to load
    if class_gate is Gate.BLOCKED and not mine:
        return _held_by_higher(s, job)
    if not mine and lower_engines_full(s, job.klass, job.model, now):
        return WaitReason.LOWER_CLASS_ENGINES, _engines_bound(s, job, turn_due=class_gate is Gate.GUARD)
    line = s.queues[job.klass].line(job.model)
    if line and line[0] is not job:
        _, head = _why(s, line[0])
        return WaitReason.IN_LINE, (f"{line.index(job)} older {job.klass} request(s) for {job.model} go first "
                                    f"(the first waits: {head})")
    return _engine_wait(s, job, s.engines[job.model])  # type: ignore[index]


def _exclusive_detail(s: CoreState, job: Job) -> str:
    running = sum(s.running_by_class[k] for k in job.klass.and_lower)
    unloading = [e.name for e in s.engines.values() if e.draining or s.ledger.releasing(e.name)]
    parts = [f"needs {format_size(job.exclusive_memory)} of the GPU"]
    if s.exclusive_holder is not None:
        parts.append("another image job holds it")
    if running:
        parts.append(f"{running} running step(s) drain first")
    if unloading:
        parts.append(f"unloading {', '.join(unloading)}")
    return "; ".join(parts)


def _engines_bound(s: CoreState, job: Job, *, turn_due: bool) -> str:
    """Rule 3c's bound, and the guard turn that claims the lower classes' engines (rule 4)."""
    claim = s.turns.claim
    engines = claim.engines if claim is not None else tuple(sorted(lower_class_busy(s)))
    usually = _usually(s, engines)
    bound = (f"while a chat's engine is hot, background and batch compute on {s.policy.lower_class_engines} "
             f"engine(s) at once")
    if claim is not None and claim.klass == job.klass:
        return (f"its starvation guard turn is due and waits for the steps on {', '.join(engines)} to end{usually}"
                + (f"; {bound}" if turn_due and engines_bounded(s, s.now) else ""))
    if claim is not None and job.model in claim.engines:
        return (f"a {claim.klass} turn of the starvation guard is due and waits for the steps on "
                f"{', '.join(engines)} to end{usually}; no other background or batch step starts there before it")
    return f"{bound}, and {', '.join(engines)} computes"


def _usually(s: CoreState, engines: tuple[str, ...]) -> str:
    """How long the engines' steps took lately (measured), in words; "" if never measured."""
    step = s.measured_step(engines)
    return "" if step is None else f" (their steps took {format_elapsed(step)} on average lately)"


def _held_by_higher(s: CoreState, job: Job) -> tuple[WaitReason, str]:
    """Held back by higher work; when the starvation guard's turn comes, as a time the core keeps
    or as a lower bound ("not before"): the lane may be held longer, a chat may keep computing,
    the other lower class may be due first."""
    now, klass = s.now, job.klass
    limit = s.policy.starvation[klass]
    since = starved_since(s, klass)
    beside = s.interactive_active(now)
    guard = ""
    if limit > 0 and since is not None:
        own_due = since + limit
        due = lane_due_at(s, since, klass) if beside else own_due
        lane = lane_class(s) if beside else (klass if in_turn(s, klass) else None)
        turns = _model_turns(s, job)
        if lane is not None:
            due = max(due, _next_turn_not_before(s, lane, klass))
            held = (f"the starvation guard lets one lower-class turn run at a time, and a {lane} turn has the lane"
                    if beside else f"a {klass} turn of the starvation guard runs")
            if now >= own_due:
                return WaitReason.GUARD_SHARE, f"{held}; the next: not before {_clock(s, due)}{turns}"
        elif now >= due:
            first = guard_turn(s, now)
            if first is not None and first != klass:
                return WaitReason.GUARD_SHARE, (f"a {first} turn of the starvation guard was due first; "
                                                f"its own is next{turns}")
            until = due + s.policy.guard_gap_wait
            return WaitReason.GUARD_SHARE, (f"its starvation guard turn is due and waits for a moment no interactive "
                                            f"step computes, until {_clock(s, until)} at the latest{turns}")
        them = "it" if not beside else "them" if s.running_by_class[RequestClass.INTERACTIVE] else "chats"
        guard = f"; the starvation guard lets one step through beside {them}, not before {_clock(s, due)}{turns}"
    if beside:
        if s.running_by_class[RequestClass.INTERACTIVE]:
            cause = f"{s.running_by_class[RequestClass.INTERACTIVE]} interactive step(s) running"
        elif s.queues[RequestClass.INTERACTIVE].size:
            cause = f"{s.queues[RequestClass.INTERACTIVE].size} interactive step(s) waiting"
        else:
            until = s.last_interactive_end + s.policy.interactive_window
            cause = f"the interactive window is open until {_clock(s, until)}"
        return WaitReason.INTERACTIVE_WINDOW, cause + guard
    higher = [k for k in job.klass.higher if s.running_by_class[k] or s.queues[k].size]
    return WaitReason.HIGHER_CLASS, f"{' and '.join(higher)} work goes first{guard}"


def _model_turns(s: CoreState, job: Job) -> str:
    """Which models' lines the guard's next turns of *job*'s class go to before its own
    (guard.turn_order, round-robin among the models that wait), in words; "" if its own is next."""
    order = [h.model for h in turn_order(s, job.klass, s.now)]
    if job.model not in order or order[0] == job.model:
        return ""
    first, mine = order[0], job.model
    last = s.turns.last_turn[job.klass]
    if left_to_gaps(s, s.queues[job.klass].line(mine)[0], s.now):
        because = f"{mine}'s steps are short: the gaps between chats serve them first"
    elif last.get(first, 0) == last.get(mine, 0):
        because = f"the request for {first} is older"
    else:
        because = f"{mine} had the last" if last.get(mine) == s.turns.turn_count else f"{mine} had one since {first}"
    ahead = ", then to ".join(order[:order.index(mine)])
    return (f"; the guard's next {job.klass} turn goes to {ahead} ({because}; the turns go round-robin among "
            f"the models that wait), then to {mine}")


def _next_turn_not_before(s: CoreState, lane: RequestClass, klass: RequestClass) -> float:
    """A lower bound for the next guard turn of *klass* while a turn of *lane* runs: the turn
    ends no sooner than now, and the lane then rests guard_share's part of it; a turn of
    *klass* itself is progress, so its clock starts again when it ends."""
    now, share = s.now, s.policy.guard_share
    pending = s.turns.step[lane] is not None and s.turns.step[lane] in s.waiting  # its engine still loads
    started = now if pending else s.turns.started[lane]
    not_before = now + (now - started) * (1 - share) / share if s.interactive_active(now) else now
    return max(not_before, now + s.policy.starvation[klass]) if lane == klass else not_before


def _engine_wait(s: CoreState, job: Job, engine: EngineState) -> tuple[WaitReason, str]:
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
        claim = s.turns.claim
        turn = ("" if claim is None or claim.klass != job.klass or name not in claim.engines
                else f"; its starvation guard turn is due and takes the next one{_usually(s, (name,))}")
        return WaitReason.NO_SLOT, f"all {engine.profile.slots} slot(s) of {name} are busy{turn}"
    if engine.status is EngineStatus.FAILED:
        return WaitReason.ENGINE_FAILED, (f"{name} failed {engine.failures} time(s) in a row; it restarts not "
                                          f"before {_clock(s, engine.retry_at)}")
    if engine.draining:
        return WaitReason.UNLOADING, (f"{name} is being unloaded ({engine.in_flight} step(s) finishing); "
                                      f"it loads again once it is gone")
    if s.ledger.releasing(name):
        return WaitReason.FREEING, f"the memory of {name}'s last process is not yet seen free"
    wanted = _earlier_demand(s)
    option = place(s, engine, now, {}, wanted, (job.klass.rank, job.seq), idle_only=False)
    if option is None:
        return WaitReason.NO_ROOM, f"needs {format_size(engine.profile.memory)}, more than its devices hold"
    placement = option.placement
    where = "" if not placement.chosen else (
        f" on device{'s' if placement.split else ''} {', '.join(map(str, placement.devices))}")
    need = f"needs {format_size(sum(option.needs.values()))}{where}"
    free = format_size(max(0, sum(s.ledger.free_on(d) for d in option.needs)))
    if option.fits:
        return WaitReason.PROMISED, f"{need}; it is free, but earlier requests wait for that memory"
    if (hold := swap_hold(s, job, option, now)) is not None:
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


def _earlier_demand(s: CoreState) -> dict[str, Demand]:
    wanted: dict[str, Demand] = {}
    for klass in ALL_CLASSES:
        for head in s.queues[klass].heads():
            if head.model is not None:
                demand = (klass.rank, head.seq)
                wanted[head.model] = min(wanted.get(head.model, demand), demand)
    return wanted


def _blockers(s: CoreState, engine: EngineState, job: Job, needs: dict[int, int], wanted: dict[str, Demand]) -> str:
    """The engines holding the memory it needs, and why none may be evicted for it now."""
    now = s.now
    interactive = job.klass is RequestClass.INTERACTIVE
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
        elif other.name in wanted and wanted[other.name] < (job.klass.rank, job.seq):
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


def _clock(s: CoreState, at: float) -> str:
    """A time of the core's clock as the wall clock reads it (HH:MM:SS, local time)."""
    return time.strftime("%H:%M:%S", time.localtime(at + s.wall_offset))
