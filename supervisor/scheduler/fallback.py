"""Fallback chains (rule 8): a waiting request goes to another model of its model's chain.

A model's chain (``models.NAME.fallback``) is a list of routes, tried in order. A route
serves a request of its classes when one of its ``when`` holds for the request now:

* ``no_room``: its model is not loaded, and loading it would have to evict what its class
  may not evict (a hot engine for lower-class work, a pinned one, one still loading);
* ``wait``: its predicted wait passes the route's ``wait``, else its class's ``slo_wait``:
  what it has waited, plus the load still to come when its model is not loaded yet (its
  measured load time, else 1 s + 1 s per GiB), less what a load under way has done;
* ``failed``: its model's engine failed to start or crashed and waits for its backoff.

and its target may serve it sooner: a model of this steward, not the one asked for, that the
caller's key may use, not failed, not removed, and either loaded (or loading) or loadable
now, into free memory or over engines its class may evict. A target with no room leaves the
request where it is: it waits, as without a chain. A target a cloud serves (runtime: remote)
takes no memory and no slot here, so it may always serve (if the key may send data out): the
request leaves the scheduler with a ``Grant`` marked ``remote``, and the gateway relays it to
the cloud, where it waits for one of the model's places.

A request goes to a fallback once, and a fallback's own chain is not followed: no loop. Only
a request of one step goes (a generation cut into steps, embeddings in chunks, stay with the
model they began on). It keeps its place in line (its arrival), moves to its target's line in
the same class, and a ``fallback`` event says from what, to what, and why. Decided in the
pure core with the ledger and the queues in hand, at every decision and at the moment a
``wait`` bound passes (``next_times``), so it is exact in virtual time.
"""

from __future__ import annotations

from collections.abc import Iterator

from supervisor.scheduler.eviction import place
from supervisor.scheduler.explain import wait_detail
from supervisor.scheduler.state import CoreState, rounded
from supervisor.scheduler.types import (EngineState, EngineStatus, FallbackRoute, FallbackWhen, Grant, Job,
                                       unmeasured_load_s)
from supervisor.units import format_duration, format_elapsed

_NOT_LOADED = (EngineStatus.STOPPED, EngineStatus.SLEEPING, EngineStatus.FAILED)


def reroute(s: CoreState, now: float) -> None:
    """Every waiting request whose model's chain sends it elsewhere now goes there."""
    for job in list(s.waiting.values()):
        take(s, job, now)


def take(s: CoreState, job: Job, now: float) -> bool:
    """Send waiting *job* along its model's chain if a route holds for it now: whether it went."""
    engine = _chained(s, job)
    if engine is None:
        return False
    for route in engine.profile.fallback:
        when = _holds(s, job, engine, route, now)
        if when is not None and _may_serve(s, job, route, now):
            _move(s, job, engine, route, when, now)
            return True
    return False


def next_times(s: CoreState) -> Iterator[float]:
    """When a waiting request's ``wait`` bound passes (the decision must be taken then)."""
    for job in s.waiting.values():
        engine = _chained(s, job)
        if engine is None:
            continue
        for route in engine.profile.fallback:
            if FallbackWhen.WAIT in route.when and route.serves(job.klass):
                yield job.submitted + _bound(s, job, route) - _load_to_come(engine, s.now)


def _chained(s: CoreState, job: Job) -> EngineState | None:
    if job.model is None or job.fallback_from is not None or job.steps != 1:
        return None
    engine = s.engines.get(job.model)
    return engine if engine is not None and engine.profile.fallback else None


def _holds(s: CoreState, job: Job, engine: EngineState, route: FallbackRoute, now: float) -> FallbackWhen | None:
    """Which of the route's reasons holds for *job* now (in the order no_room, wait, failed)."""
    if not route.serves(job.klass):
        return None
    if FallbackWhen.NO_ROOM in route.when and _no_room(s, job, engine, now):
        return FallbackWhen.NO_ROOM
    if FallbackWhen.WAIT in route.when and _predicted_wait(job, engine, now) >= _bound(s, job, route):
        return FallbackWhen.WAIT
    if FallbackWhen.FAILED in route.when and engine.status is EngineStatus.FAILED:
        return FallbackWhen.FAILED
    return None


def _no_room(s: CoreState, job: Job, engine: EngineState, now: float) -> bool:
    if engine.status not in (EngineStatus.STOPPED, EngineStatus.SLEEPING) or not s.may_start(engine, now):
        return False
    option = place(s, engine, now, {}, {}, (job.klass.rank, job.seq), idle_only=False)
    return option is None or (not option.fits and option.victims is None)


def _predicted_wait(job: Job, engine: EngineState, now: float) -> float:
    return now - job.submitted + _load_to_come(engine, now)


def _load_to_come(engine: EngineState, now: float) -> float:
    """The load its request must still wait for: all of it when not loaded, the rest of one under way."""
    load_s = engine.load_s if engine.load_s is not None else unmeasured_load_s(engine.profile.memory)
    if engine.status in _NOT_LOADED:
        return load_s
    if engine.status is EngineStatus.STARTING:
        return max(0.0, load_s - (now - engine.start_decided_at))
    return 0.0


def _bound(s: CoreState, job: Job, route: FallbackRoute) -> float:
    return route.wait if route.wait is not None else s.policy.slo_wait[job.klass]


def _may_serve(s: CoreState, job: Job, route: FallbackRoute, now: float) -> bool:
    target = route.model
    if target == job.model or (job.may_use is not None and target not in job.may_use):
        return False
    if route.remote:
        return job.may_use is not None  # a cloud's: no room to find, no engine to fail; only where a caller said it may
    engine = s.engines.get(target)
    if engine is None or engine.retiring is not None:
        return False
    if engine.status in (EngineStatus.READY, EngineStatus.STARTING):
        return True
    if engine.status not in (EngineStatus.STOPPED, EngineStatus.SLEEPING) or not s.may_start(engine, now):
        return False  # failed, or on its way out: it would have to load again
    option = place(s, engine, now, {}, {}, (job.klass.rank, job.seq), idle_only=False)
    return option is not None and (option.fits or option.victims is not None)


def _move(s: CoreState, job: Job, engine: EngineState, route: FallbackRoute, when: FallbackWhen, now: float) -> None:
    why = _why(s, job, engine, route, when, now)
    s.unqueue(job)
    job.fallback_from, job.model = job.model, route.model
    waited_s = rounded(now - job.submitted)
    s.emit("fallback", "info", job=job.id, request=job.request, model=job.fallback_from, to=route.model,
           **{"class": job.klass}, when=when.value, waited_s=waited_s, remote=route.remote, why=why)
    if route.remote:  # it leaves the scheduler: the gateway relays it to the cloud
        s.effects.append(Grant(job.id, route.model, None, waited_s=waited_s, remote=True))
        return
    job.held_until = None  # a swap hold was for the model it asked for
    s.queues[job.klass].push(job)
    s.waiting[job.id] = job


def _why(s: CoreState, job: Job, engine: EngineState, route: FallbackRoute, when: FallbackWhen, now: float) -> str:
    said = f"{job.klass} request for {engine.name} goes to {route.model}{' (a cloud)' if route.remote else ''}"
    match when:
        case FallbackWhen.NO_ROOM:
            return f"{said}: {wait_detail(s, job)}"
        case FallbackWhen.WAIT:
            bound = _bound(s, job, route)
            source = "the route's wait" if route.wait is not None else f"{job.klass}'s slo_wait"
            return (f"{said}: it would wait {format_elapsed(_predicted_wait(job, engine, now))}, "
                    f"past {format_duration(bound)} ({source})")
        case FallbackWhen.FAILED:
            retry = max(0.0, engine.retry_at - now)
            return f"{said}: {engine.name}'s engine failed; it starts again in {format_elapsed(retry)} at the earliest"
    return said
