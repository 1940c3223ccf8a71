"""Config reloads: engines added, changed or removed while steward runs.

An added model's engine is stopped until demand (or a pin) loads it. A removed or changed
one retires: no new work for it, the steps on it finish, then it stops (a load of the old
config still starting stops at once, a sleeping one's kept process goes with its task), and
once stopped its task is told to go (``RetireEngine``). Steps waiting for a removed model
are answered 404; those for a changed one wait for the new engine (``engine_replaced``).
"""

from __future__ import annotations

import attrs

from supervisor.scheduler.eviction import evict
from supervisor.scheduler.state import CoreState
from supervisor.request_class import ALL_CLASSES
from supervisor.scheduler.types import EngineProfile, EngineState, EngineStatus, RetireEngine, Retirement


def add_engine(s: CoreState, profile: EngineProfile, load_s: float | None) -> None:
    s.engines[profile.name] = EngineState(profile, load_s=load_s)
    s.emit("engine_added", "info", engine=profile.name, memory=profile.memory)


def retire_engine(s: CoreState, name: str, replacement: EngineProfile | None) -> None:
    engine = s.engines[name]
    engine.retiring = Retirement(replacement)
    engine.requested = False
    if replacement is None:
        for klass in ALL_CLASSES:
            for job in list(s.queues[klass].line(name)):
                s.unqueue(job)
                s.fail(job, 404, "model_not_found", f"the model '{name}' was removed from steward's config",
                       retry_after=None, reason="model_removed")
    s.emit("engine_retiring", "info", engine=name, removed=replacement is None, status=engine.status.value,
           in_flight=engine.in_flight)


def engine_replaced(s: CoreState, name: str) -> None:
    engine = s.engines[name]
    assert engine.retiring is not None and engine.retiring.replacement is not None
    engine.profile, engine.retiring, engine.placement = engine.retiring.replacement, None, None
    engine.failures = 0
    engine.load_s = None  # another model or other arguments: measured afresh
    s.emit("engine_replaced", "info", engine=name, memory=engine.profile.memory)


def advance_retirements(s: CoreState, now: float) -> None:
    """In every decision: stop the retiring engines that may stop now, announce those stopped,
    and forget the removed ones once their memory is released."""
    for engine in list(s.engines.values()):
        retiring = engine.retiring
        if retiring is None or retiring.announced:
            continue
        if engine.status is EngineStatus.READY:
            evict(s, engine, now, for_what="reload", need=0, free=s.ledger.free)
        elif engine.status is EngineStatus.STARTING:
            s.stop(engine)  # a load of the old config: not finished
        elif engine.status is EngineStatus.SLEEPING:
            # Its kept process goes with its task: the memory is released once seen free.
            engine.status = EngineStatus.STOPPED
            if s.observe_memory and engine.pid is not None:
                s.ledger.await_free(engine.name, now + s.policy.release_timeout)
            else:
                s.release(engine)
        if engine.status in (EngineStatus.STOPPED, EngineStatus.FAILED):
            engine.retiring = attrs.evolve(retiring, announced=True)
            s.effects.append(RetireEngine(engine.name, replaced=retiring.replacement is not None))
    for name in [n for n, e in s.engines.items() if e.retiring is not None and e.retiring.announced
                 and e.retiring.replacement is None and not s.ledger.holds(n)]:
        del s.engines[name]
        s.emit("engine_removed", "info", engine=name)
