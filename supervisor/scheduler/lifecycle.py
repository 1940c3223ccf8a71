"""An engine's life as the core sees it: started, ready, sick, asleep, gone (rule 6's end).

What an engine's task reports (its process spawned, ready, exited, put to sleep, its own
queue, a health check, a stalled request) moves its ``EngineState``; and in every decision
the engines that should go are told to: one unhealthy past ``recover_timeout`` (restarted),
one idle past its ``idle_unload``, a drain whose reason is gone is undone. A crash backs
off (``policy.backoff``) and answers the steps waiting for a start that failed. An admin's
load, unload, pin or unpin goes by the same rules (``control``).

The reports return whether they were news: False for a stale one (another generation,
or a state it no longer is in), after which the core decides nothing.
"""

from __future__ import annotations

import attrs

from supervisor.address import Address
from supervisor.scheduler import fallback
from supervisor.scheduler.eviction import admin_option, evict
from supervisor.scheduler.state import CoreState, rounded
from supervisor.request_class import ALL_CLASSES
from supervisor.scheduler.types import CheckEngine, EngineAction, EngineState, EngineStatus, Revoke, WarmCause
from supervisor.units import format_size


def engine_spawned(s: CoreState, name: str, generation: int, pid: int) -> None:
    """The engine's process exists: its memory in GPU readings is its own, not outside use."""
    engine = s.engines[name]
    if generation == engine.generation and engine.status is EngineStatus.STARTING:
        engine.pid = pid


def engine_ready(s: CoreState, name: str, generation: int, endpoint: Address, now: float,
                 pid: int | None) -> bool:
    engine = s.engines[name]
    if generation != engine.generation or engine.status is not EngineStatus.STARTING:
        return False
    engine.status = EngineStatus.READY
    engine.requested = False
    engine.endpoint = endpoint
    engine.pid = pid if pid is not None else engine.pid
    engine.ready_at = now
    engine.last_used = now
    load_s = now - engine.start_decided_at
    if not engine.waking:  # a wake is quicker than the load an eviction costs
        engine.load_s = load_s  # kept in the state file, from this event
    s.emit("ready", "info", engine=name, load_s=rounded(load_s),
           endpoint=endpoint.url if isinstance(endpoint, Address) else endpoint, wake=engine.waking)
    return True


def engine_exited(s: CoreState, name: str, generation: int, now: float, detail: str) -> bool:
    engine = s.engines[name]
    if generation != engine.generation or engine.status in (EngineStatus.STOPPED, EngineStatus.FAILED):
        return False
    # A sleeping engine's kept process that went away had been unloaded already.
    expected = (engine.status is EngineStatus.STOPPING and not engine.restarting_unhealthy
                or engine.status is EngineStatus.SLEEPING)
    if engine.restarting_unhealthy:
        detail = f"restarted because it stopped answering its health checks ({detail})"
    was_starting = engine.status is EngineStatus.STARTING
    engine.requested = False  # an admin's load that failed is not tried again
    engine.stop_serving()
    if s.observe_memory and engine.pid is not None:
        s.ledger.await_free(name, now + s.policy.release_timeout)
        if engine.outside_baseline is None:
            engine.outside_baseline = s.outside_memory
        released = 0
    else:
        released = s.release(engine)
    if expected:
        engine.status = EngineStatus.STOPPED
        s.emit("stopped", "info", engine=name, released=released, free=s.ledger.free)
        return True
    # Unexpected: a crash, or a start that never became ready.
    if engine.ready_at is not None and now - engine.ready_at >= s.policy.backoff.maximum:
        engine.failures = 0  # it ran long enough that this is a new failure, not a loop
    engine.failures += 1
    delay = s.policy.backoff.delay(engine.failures)
    engine.status = EngineStatus.FAILED
    engine.retry_at = now + delay
    s.emit("crash", "error", engine=name, during_start=was_starting, detail=detail,
           released=released, failures=engine.failures, restart_in_s=delay)
    if was_starting:
        # Steps waiting for this start go along their model's chain (`failed`), or get a clean
        # error now rather than a hang.
        for klass in ALL_CLASSES:
            for job in list(s.queues[klass].line(name)):
                if fallback.take(s, job, now):
                    continue
                s.unqueue(job)
                s.fail(job, 503, "engine_start_failed", f"engine {name!r} failed to start: {detail}",
                       retry_after=delay, reason="engine_start_failed")
    return True


def engine_asleep(s: CoreState, name: str, generation: int, now: float, detail: str) -> bool:
    """An engine told to stop was put to sleep instead: its process stays, holding less.

    Its reservation becomes ``sleep_memory`` when set, else what is measured while it
    sleeps (the full reservation until a reading says so)."""
    engine = s.engines[name]
    if generation != engine.generation or engine.status is not EngineStatus.STOPPING:
        return False
    if engine.restarting_unhealthy:  # a restart was asked for, not a sleep
        return engine_exited(s, name, generation, now, f"put to sleep, not restarted ({detail})")
    engine.status = EngineStatus.SLEEPING
    engine.stop_serving()
    engine.measured = 0
    reserved = s.ledger.held(name)
    if engine.profile.sleep_memory is not None and s.ledger.holds(name):
        s.ledger.rescale(name, min(engine.profile.sleep_memory, reserved))
    s.emit("asleep", "info", engine=name, detail=detail, reserved=s.ledger.held(name),
           released=reserved - s.ledger.held(name), free=s.ledger.free)
    return True


def engine_cache_saved(s: CoreState, name: str, generation: int, seconds: float) -> None:
    """Its slots' save before its stop (keep_cache) took *seconds*: the next eviction of it is
    expected to wait as long (ReloadCost.save_s). Kept for the run only, not in the state file."""
    engine = s.engines.get(name)
    if engine is not None and generation == engine.generation:
        engine.save_s = seconds


def engine_load(s: CoreState, name: str, generation: int, running: int | None, waiting: int | None,
                kv_usage: float | None = None) -> None:
    """The engine's own account of its queue and KV cache: kept for the snapshot, decides nothing."""
    engine = s.engines[name]
    if generation == engine.generation and engine.serving:
        engine.reported_running, engine.reported_waiting = running, waiting
        engine.reported_kv_usage = kv_usage


def engine_checked(s: CoreState, name: str, generation: int, now: float, problem: str | None) -> bool:
    """The result of one health check of a ready engine: *problem* None if it answered.

    After ``unhealthy_after`` failures in a row the engine gets no new work and the steps
    running on it are revoked (their clients get a clean error now, not at their own
    timeout); if it does not answer again within ``recover_timeout`` it is restarted.
    """
    engine = s.engines[name]
    if generation != engine.generation or not engine.serving:
        return False
    if problem is None:
        engine.check_failures = 0
        if engine.unhealthy_since is not None:
            s.emit("engine_recovered", "info", engine=name, unhealthy_s=rounded(now - engine.unhealthy_since))
            engine.unhealthy_since = None
        return True
    engine.check_failures += 1
    s.emit("health_check_failed", "warning", engine=name, failures=engine.check_failures, detail=problem)
    if not engine.unhealthy and engine.check_failures >= s.policy.unhealthy_after:
        engine.unhealthy_since = now
        running = [job for job in s.running.values()
                   if job.model == name and job.engine_generation == engine.generation]
        s.emit("engine_unhealthy", "error", engine=name, failures=engine.check_failures, detail=problem,
               revoked=len(running), restart_in_s=s.policy.recover_timeout)
        for job in running:
            s.effects.append(Revoke(job.id, f"stopped answering its health checks ({problem})"))
    return True


def engine_stalled(s: CoreState, name: str, generation: int, detail: str) -> None:
    """A request on the engine got no byte within its timeout: check the engine now."""
    engine = s.engines[name]
    if generation == engine.generation and engine.serving:
        s.emit("engine_stalled", "warning", engine=name, detail=detail)
        s.effects.append(CheckEngine(name, generation))


def control(s: CoreState, name: str, action: EngineAction, now: float) -> str | None:
    """An admin's load, unload, pin or unpin of engine *name*: None, or why it cannot be done now.

    It goes by the same rules as everything else: a load takes free memory or evicts only idle
    cold engines (never work in flight, never a hot one), an unload drains the engine first,
    pinning loads it at once (as at start), unpinning leaves it loaded and evictable."""
    engine = s.engines[name]
    problem = None
    if action is EngineAction.PIN or action is EngineAction.UNPIN:
        engine.profile = attrs.evolve(engine.profile, pinned=action is EngineAction.PIN)
    elif action is EngineAction.UNLOAD:
        engine.requested = False
        if engine.profile.pinned:
            problem = f"{name} is pinned: unpin it first"
        elif engine.status is not EngineStatus.READY:
            problem = f"{name} is {engine.status.value}, not loaded"
        else:
            evict(s, engine, now, for_what="admin", need=0, free=s.ledger.free)
    elif engine.status in (EngineStatus.STARTING, EngineStatus.READY):
        problem = None  # loaded (or loading) already
        engine.warm_generation = None  # a warm load an admin asks for is one someone wants
    elif not s.may_start(engine, now):
        problem = f"{name} is {engine.status.value}; try again once it is stopped"
    elif admin_option(s, engine, now, {}) is None:
        problem = f"{name} needs {format_size(engine.profile.memory)} and nothing idle and cold may be evicted for it"
    else:
        engine.requested = True  # loaded in this decision, or once its victims are gone
    s.emit("admin", "info", engine=name, action=action.value, done=problem is None, detail=problem)
    return problem


# ---- in every decision -----------------------------------------------------------------


def undo_stale_drains(s: CoreState) -> None:
    """A drain whose reason is gone is undone while the engine still serves (rule 8: a
    client that leaves while waiting never causes an unload)."""
    for engine in s.engines.values():
        cause = engine.drained_for
        if engine.status is not EngineStatus.DRAINING or cause is None:
            continue
        if isinstance(cause, int):
            stale = cause not in s.waiting and cause not in s.running
            gone = f"exclusive job {cause} no longer waits"
        else:
            target = s.engines.get(cause)
            stale = target is None or (target.status is not EngineStatus.STARTING and not target.requested
                                       and not any(s.queues[klass].count(cause) for klass in ALL_CLASSES))
            gone = f"nobody waits for {cause!r} any more"
        if stale:
            engine.status, engine.drained_for = EngineStatus.READY, None
            s.emit("evict_undone", "info", engine=engine.name, in_flight=engine.in_flight, why=gone)


def restart_unhealthy(s: CoreState, now: float) -> None:
    for engine in s.engines.values():
        if (engine.serving and engine.unhealthy_since is not None
                and now >= engine.unhealthy_since + s.policy.recover_timeout):
            s.emit("engine_restart", "error", engine=engine.name, reason="unhealthy",
                   unhealthy_s=rounded(now - engine.unhealthy_since), in_flight=engine.in_flight)
            engine.restarting_unhealthy = True
            s.stop(engine)


def may_idle_unload(s: CoreState, engine: EngineState) -> bool:
    """Ready, idle, unloadable when idle, and nothing waits for it (then it is not idle)."""
    return (engine.profile.idle_unload is not None and not engine.profile.pinned
            and engine.status is EngineStatus.READY and engine.in_flight == 0
            and not s.queued_for(engine.name))


def unload_idle(s: CoreState, now: float) -> None:
    # Decided here, in the actor, like every other stop: a request that arrives first
    # keeps the engine; one that arrives after waits for the stop and loads it again.
    for engine in s.engines.values():
        if may_idle_unload(s, engine) and now >= engine.last_used + engine.profile.idle_unload:  # type: ignore[operator]
            s.emit("idle_unload", "info", engine=engine.name, idle_s=rounded(now - engine.last_used),
                   idle_unload_s=engine.profile.idle_unload)
            s.stop(engine)
            engine.idle_unloaded_at = now
            s.warm_cause = WarmCause.IDLE_UNLOAD
