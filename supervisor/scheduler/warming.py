"""Warming: engines loaded ahead of demand, likeliest needed first (rule 10).

After an exclusive job ends or an idle unload (``CoreState.warm_cause``), in the moments
when nothing waits (no step of any class, no exclusive job), no exclusive job runs, the
interactive window is closed and steward is not closing, ``warm`` loads one stopped engine
at a time ahead of demand: the first, likeliest needed first, that fits in free memory as
it is (a warm load never evicts, nor takes memory promised to a waiting load); the next
once the last is ready, until nothing more fits and no memory is on its way out. Never a
sleeping engine, one in its backoff, or one unloaded for being idle and unused since. A
warm load still starting is stopped (``cancel_warm``) the moment real work needs its memory.
A warmed engine is cold until a step runs on it, except one an exclusive job evicted while
hot: it comes back with the hot time it had left (exclusive.py).

``warm_order`` is the pure part: the core hands over the engines it may warm now and
``scheduler.warm``; it puts them in order and says why. The list comes first because a
person wrote it down; then recent use, since an engine used within hot_window is the
likeliest to be asked for again (ReloadCost.likely, the same figure that chooses victims).
An engine neither listed nor used lately is never warmed: loading it would be a guess.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import attrs

from supervisor.scheduler.eviction import LoadCause, LoadReason, load, place
from supervisor.scheduler.exclusive import exclusive_rank
from supervisor.scheduler.state import NO_DEMAND, CoreState
from supervisor.request_class import RequestClass
from supervisor.scheduler.types import DEFAULT_DEVICE, EngineState, EngineStatus, ReloadCost, WarmCause


@attrs.frozen
class WarmChoice:
    """One engine that may be warmed, and the figures its `warm` event carries."""

    engine: str
    listed: int | None  # its place in scheduler.warm (1: first); None: not listed, used lately
    cost: ReloadCost  # its load time, and how likely it is to be needed soon (nothing is queued)

    def why(self, cause: WarmCause, rank: int) -> str:
        if self.listed is not None:
            because = f"{self.engine} is #{self.listed} in scheduler.warm"
        else:
            because = (f"{self.engine} was used lately ({self.cost.recent_uses:g} weighted steps within hot_window: "
                       f"likely {self.cost.likely:.2f})")
        passed = f"; {rank - 1} likelier did not fit in free memory" if rank > 1 else ""
        return f"{cause.words}: {because}{passed}"

    def fields(self, cause: WarmCause, rank: int) -> dict[str, object]:
        return {"engine": self.engine, "reason": cause.value, "why": self.why(cause, rank), "rank": rank,
                "listed": self.listed, "recent_uses": self.cost.recent_uses, "likely": round(self.cost.likely, 3),
                "load_s": round(self.cost.load_s, 3)}


def warm_order(engines: Iterable[EngineState], warm: Sequence[str], now: float, window: float) -> list[WarmChoice]:
    """*engines* likeliest needed first: those in *warm* in its order, then those used within
    *window* by likelihood (the greater expected load time saved on a tie, then the most
    recently used); the others not at all."""
    by_name = {engine.name: engine for engine in engines}
    listed = [WarmChoice(name, position, by_name[name].reload_cost(now, window, queued=False))
              for position, name in enumerate(warm, 1) if name in by_name]
    used = [WarmChoice(engine.name, None, cost) for engine in by_name.values()
            if engine.name not in warm and (cost := engine.reload_cost(now, window, queued=False)).recent_uses > 0]
    used.sort(key=lambda c: (-c.cost.likely, -c.cost.cost, -by_name[c.engine].last_used, c.engine))
    return listed + used


def warm(s: CoreState, now: float, promised: dict[int, int]) -> None:
    """Load the likeliest needed engine that fits in free memory, while nothing waits."""
    cause = s.warm_cause
    if cause is None:
        return
    if s.closing:
        s.warm_cause = None
        return
    if (s.waiting or s.exclusive_holder is not None or s.window_open(now)
            or any(e.warming for e in s.engines.values())):
        return  # batch work, one load at a time: it goes on in the next idle moment
    may_warm = [e for e in s.engines.values()
                if not e.profile.pinned and not e.requested and e.status is not EngineStatus.SLEEPING
                and not e.idle_since_unload and s.may_start(e, now)]
    for rank, choice in enumerate(warm_order(may_warm, s.policy.warm, now, s.policy.hot_window), 1):
        engine = s.engines[choice.engine]
        option = place(s, engine, now, promised, {}, NO_DEMAND, idle_only=True)
        if option is not None and option.fits:
            s.emit("warm", "info", **choice.fields(cause, rank))
            if not engine.hot_resumed:  # back after an exclusive job, it keeps the hot time it had left
                engine.last_interactive = -math.inf  # loaded for no one: cold until a step runs on it
            load(s, engine, option.placement, now, LoadReason(LoadCause.WARM, choice.why(cause, rank)))
            engine.warm_generation = engine.generation
            return
    if not any(e.draining or s.ledger.releasing(e.name) for e in s.engines.values()):
        s.warm_cause = None  # nothing more fits, and no memory is on its way out to make room


def cancel_warm(s: CoreState, now: float) -> None:
    """A warm load still starting gives way to real work that needs its memory."""
    for engine in s.engines.values():
        if engine.warming and not s.queued_for(engine.name) and (needer := _warm_in_the_way(s, engine, now)):
            what = "an image job" if needer == "exclusive" else repr(needer)
            s.emit("warm_cancelled", "info", engine=engine.name, generation=engine.generation,
                   for_engine=needer, why=f"{what} needs its memory; it was loaded for no one")
            s.stop(engine)


def _warm_in_the_way(s: CoreState, warm_load: EngineState, now: float) -> str | None:
    """What real work needs the memory of the warm load *warm_load*: an engine to load, or
    'exclusive' (a waiting exclusive job); None: nothing."""
    devices = set(s.devices_of(warm_load))
    if (rank := exclusive_rank(s)) is not None and DEFAULT_DEVICE in devices:
        job = s.queues[RequestClass.of_rank(rank)].head()
        unreserved = s.ledger.budgets[DEFAULT_DEVICE] - s.ledger.reserved_on(DEFAULT_DEVICE)
        if job is not None and job.exclusive_memory > unreserved + s.freeing_on(DEFAULT_DEVICE):
            return "exclusive"
    wanted = {head.model for queue in s.queues.values() for head in queue.heads() if head.model is not None}
    wanted |= {e.name for e in s.engines.values() if e.profile.pinned or e.requested}
    for name in sorted(wanted - {warm_load.name}):
        engine = s.engines[name]
        if not s.may_start(engine, now):
            continue  # loaded or loading already, or not yet loadable
        option = place(s, engine, now, {}, {}, NO_DEMAND, idle_only=False)
        # victims == []: memory on its way out is enough for it already.
        if option is not None and not option.fits and option.victims != [] and devices & set(option.needs):
            return name
    return None
