"""Placement and eviction: where a load goes and what makes room for it (rules 5 and 6, victims).

A load takes free memory where it can (placing.py lists the candidate placements); else it
waits for memory already on its way out; else it evicts, on the devices short of memory
only: never a pinned engine, nor one still loading, nor one that earlier demand wants; a hot
one only for interactive work and only when cold ones do not free enough. Of the engines
that may go, cold before hot and idle before busy (hard tiers), then the least expected
cost to load again when next needed (``reload_cost``, in whole seconds), least recently used
on a tie. Count first, load second: a load reserves its memory the moment it is decided, an
evicted engine with work in flight is drained, not stopped, and what a load waits for is
promised, so that later (lower) demand in the same decision does not take it.
"""

from __future__ import annotations

import enum
import math

import attrs

from supervisor.scheduler.placing import candidate_placements
from supervisor.scheduler.state import NO_DEMAND, CoreState, Demand, rounded
from supervisor.request_class import RequestClass
from supervisor.scheduler.types import (
    EngineState,
    EngineStatus,
    Job,
    Placement,
    ReloadCost,
    StartEngine,
)
from supervisor.units import format_size


class LoadCause(enum.Enum):
    """The `load` event's `reason`."""

    REQUEST = "request"  # a request waits for it (the event's `job` says which)
    STARVATION_GUARD = "starvation_guard"  # the starvation guard lets a waiting step run on it
    PINNED = "pinned"
    ADMIN = "admin"
    WARM = "warm"


@attrs.frozen
class LoadReason:
    cause: LoadCause
    words: str  # its `why`
    job: int | None = None  # the step it is loaded for

    @classmethod
    def of(cls, job: Job, *, guard: bool = False) -> LoadReason:
        if guard:
            return cls(LoadCause.STARVATION_GUARD, f"the starvation guard lets {job.klass.with_article} step run",
                       job.id)
        return cls(LoadCause.REQUEST, f"{job.klass.with_article} request waits for it", job.id)


PINNED = LoadReason(LoadCause.PINNED, "pinned: always loaded")
ADMIN = LoadReason(LoadCause.ADMIN, "an admin asked for it")


@attrs.frozen
class Option:
    """One way to place a load, and what it would take."""

    placement: Placement
    needs: dict[int, int]  # device -> what the load takes from what is free there
    fits: bool  # in free memory now: it loads at once
    # The engines to evict for it ([]: memory on its way out is enough); None: nothing
    # allowed frees enough now.
    victims: list[EngineState] | None
    hot: bool  # a victim is hot
    last: bool  # where the engine ran last time
    spare: int  # what would be left free on its devices after it


def place(s: CoreState, engine: EngineState, now: float, promised: dict[int, int], wanted: dict[str, Demand],
          demand: Demand, *, idle_only: bool) -> Option | None:
    """The best way to place *engine*: in free memory, then waiting for memory on its way
    out, then over cold engines, then (interactive demand only) over hot ones; on a tie
    the devices it ran on last, then the one left with most free. None: no device may
    ever hold it."""
    kept = engine.placement if engine.status is EngineStatus.SLEEPING else None
    if kept is None and engine.kept_pid is not None and (held := s.ledger.shares.get(engine.name)):
        kept = Placement.of(held, len(s.ledger.budgets))  # where its kept process holds memory already
    options = [_option(s, engine, placement, now, promised, wanted, demand, idle_only=idle_only)
               for placement in candidate_placements(engine.profile, s.ledger, kept)]
    return min(options, default=None, key=lambda o: (
        not o.fits, o.victims is None, bool(o.victims), o.hot, not o.last, -o.spare, o.placement.devices))


def _option(s: CoreState, engine: EngineState, placement: Placement, now: float, promised: dict[int, int],
            wanted: dict[str, Demand], demand: Demand, *, idle_only: bool) -> Option:
    """What loading *engine* with *placement* takes: the victims on each device short of
    memory (never on another), [] if memory on its way out is enough already."""
    needs = {d: nbytes - s.ledger.held_on(engine.name, d) for d, nbytes in placement.share.items()}
    free = {d: s.ledger.free_on(d) - promised.get(d, 0) for d in needs}
    last = engine.placement is not None and engine.placement.devices == placement.devices
    spare = sum(free[d] - needs[d] for d in needs)
    if all(needs[d] <= free[d] for d in needs):
        return Option(placement, needs, True, [], False, last, spare)
    interactive = demand[0] == 0
    hot_window = s.policy.hot_window
    candidates = [e for e in s.engines.values()
                  if e.status is EngineStatus.READY and not e.profile.pinned
                  and e is not engine and wanted.get(e.name, NO_DEMAND) > demand
                  and (interactive or not e.hot(now, hot_window))
                  and not (idle_only and e.in_flight)]
    # Cold before hot, idle before busy (busy ones are only drained), then the cheapest to
    # load again when next needed, least recently used on a tie.
    costs = {e.name: cost_rank(s, e, now) for e in candidates}
    candidates.sort(key=lambda e: (e.hot(now, hot_window), e.in_flight > 0, costs[e.name], e.last_used))
    victims: list[EngineState] | None = []
    for device, need in needs.items():
        # Memory on its way out counts as being freed: no second victim for one need.
        gain = free[device] + s.freeing_on(device) + sum(s.ledger.held_on(v.name, device) for v in victims)
        for candidate in candidates:
            if gain >= need:
                break
            if candidate not in victims and (held := s.ledger.held_on(candidate.name, device)):
                victims.append(candidate)
                gain += held
        if gain < need:
            victims = None
            break
    if idle_only and victims == []:
        victims = None  # it waits for memory on its way out: not a step that can run now
    hot = any(v.hot(now, hot_window) for v in victims or ())
    return Option(placement, needs, False, victims, hot, last, spare)


def admin_option(s: CoreState, engine: EngineState, now: float, promised: dict[int, int]) -> Option | None:
    """How an admin's load goes: into free memory, or over idle cold engines only."""
    option = place(s, engine, now, promised, {}, (RequestClass.BACKGROUND.rank, -1), idle_only=True)
    if option is None or (option.victims is None and not option.fits):
        return None
    return option


def reload_cost(s: CoreState, engine: EngineState, now: float) -> ReloadCost:
    """What evicting *engine* is expected to cost (the module docstring of core.py: Victims)."""
    cost = engine.reload_cost(now, s.policy.hot_window, queued=s.queued_for(engine.name))
    return attrs.evolve(cost, drain_s=_expected_drain(s, engine, now))


def _expected_drain(s: CoreState, engine: EngineState, now: float) -> float | None:
    """How long *engine*'s running steps are expected to take yet: its measured mean step
    less the time the newest of them has run (0: idle; None: busy, never measured)."""
    started = [job.dispatched for job in s.running.values()
               if job.model == engine.name and job.dispatched is not None]
    if not started:
        return 0.0
    mean = s.mean_step(engine.name)
    if mean is None:
        return None
    return max(mean - (now - max(started)), 0.0)  # the newest ends last


def cost_rank(s: CoreState, engine: EngineState, now: float) -> tuple[bool, int]:
    """Its expected cost in whole seconds (an unknown drain last): two models' loads a few
    tenths apart are noise, and then the least recently used goes first."""
    cost = reload_cost(s, engine, now)
    return cost.drain_s is None, math.floor(cost.cost)


def carry_out(s: CoreState, engine: EngineState, option: Option, now: float, promised: dict[int, int],
              reason: LoadReason) -> None:
    """Load *engine* as *option* says: at once when it fits, else evict its victims and
    promise the memory it waits for."""
    if option.fits:
        load(s, engine, option.placement, now, reason)
        return
    need, free = sum(option.needs.values()), sum(s.ledger.free_on(d) - promised.get(d, 0) for d in option.needs)
    for victim in option.victims or ():
        evict(s, victim, now, for_what=engine.name, need=need, free=free)
    promise(option, promised)


def promise(option: Option, promised: dict[int, int]) -> None:
    """Later (lower) demand must not take what this load waits for."""
    for device, nbytes in option.needs.items():
        promised[device] = promised.get(device, 0) + nbytes


def evict(s: CoreState, victim: EngineState, now: float, *, for_what: str, need: int, free: int,
          for_job: int | None = None) -> None:
    """Drain *victim* (stopped at once when idle) for *for_what*: an engine's name,
    'exclusive' (*for_job*), 'reload' or 'admin'."""
    victim.status = EngineStatus.DRAINING
    victim.drained_for = for_job if for_job is not None else for_what if for_what in s.engines else None
    s.emit("evict", "info", engine=victim.name, memory=s.ledger.held(victim.name),
           for_engine=for_what, need=need, free=free, in_flight=victim.in_flight,
           idle_s=rounded(now - victim.last_used), hot=victim.hot(now, s.policy.hot_window),
           devices=list(s.devices_of(victim)), why=_evict_why(for_what, need, free),
           **reload_cost(s, victim, now).fields())
    if victim.in_flight == 0:
        s.stop(victim)


def load(s: CoreState, engine: EngineState, placement: Placement, now: float, reason: LoadReason) -> None:
    """Start (or wake, or restart) *engine* with *placement*: its memory is reserved now."""
    restart = engine.status is EngineStatus.FAILED
    waking = engine.status is EngineStatus.SLEEPING
    if waking or s.ledger.holds(engine.name):  # asleep, or its kept process holds some already
        s.ledger.resize(engine.name, placement.share)  # the rest of its memory
    else:
        s.ledger.reserve(engine.name, placement.share)
    if not waking:  # a waking one keeps its process; a kept one's is known, a spawned one's told later
        engine.pid = engine.kept_pid
    engine.placement = placement
    engine.generation += 1
    engine.status = EngineStatus.STARTING
    engine.start_decided_at = now
    engine.waking = waking
    engine.hot_resumed = False  # its hot time after an exclusive job is kept by this load, or not
    engine.ready_at = None
    engine.measured = 0
    s.emit("restart" if restart else "wake" if waking else "load", "info",
           engine=engine.name, memory=engine.profile.memory,
           reserved=s.ledger.reserved, free=s.ledger.free, reason=reason.cause.value, job=reason.job,
           generation=engine.generation, devices=list(placement.devices),
           per_device=list(placement.share.values()), why=reason.words,
           where=_where(placement))
    s.effects.append(StartEngine(engine.name, engine.generation, placement))


def _where(placement: Placement) -> str | None:
    """Where a load goes, in words, when there was a choice (a host with several devices)."""
    if not placement.chosen:
        return None
    devices = placement.devices
    return f"device {devices[0]}" if len(devices) == 1 else f"devices {', '.join(map(str, devices))} (split)"


def _evict_why(for_what: str, need: int, free: int) -> str:
    if for_what == "exclusive":
        return "an image job needs the GPU"
    if for_what == "reload":
        return "its model was changed or removed in the config"
    if for_what == "admin":
        return "an admin unloaded it"
    return f"to make room for {for_what} (needs {format_size(need)}, {format_size(max(0, free))} free)"
