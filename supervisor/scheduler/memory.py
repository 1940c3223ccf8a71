"""Memory readings: what the devices hold, measured, and when a reservation is released (rule 6).

A reading of every device (its total use and its per-process list) says what each engine's
process holds (the most it held replaces the estimate once it differs by 1 %), what a
sleeping engine holds, and what processes that are not engines use (outside use, taken
from what the ledger hands out). Phantom guard: while an engine stops, and for
``settle_polls`` readings after, the outside estimate stays frozen. An exited engine's
reservation is released once its process is gone from every list and the unattributed
memory is back to that estimate, or after ``release_timeout``. A service's own account
(Ollama's /api/ps) only ever grows its reservation.

A kept service's process (a sleep-capable vLLM) runs before its engine is first loaded, and
again after a failed start: what it holds then is reserved for its engine, as a sleeping
engine's is. Other loads cannot take it, and the engine's own load counts it as its own;
before, it was outside use, and that load waited for room its own process held.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from supervisor.scheduler.state import CoreState
from supervisor.scheduler.types import DEFAULT_DEVICE, DeviceUse, EngineState, EngineStatus, Measured


def observe_devices(s: CoreState, now: float, readings: Sequence[DeviceUse]) -> None:
    """A memory reading of every device: its total use, and the per-process list (taken separately).

    Memory not attributed to a live engine is outside use and is subtracted from what
    the ledger can hand out on that device. Phantom guard: while an engine stops, and for
    ``settle_polls`` readings after, that estimate stays frozen, because a process that
    exited between the two NVML calls is gone from the list while its memory still
    counts, and would look like outside use (GridCore evicted a healthy model over it).
    An exited engine's reservation is released once its process is gone from every
    device's list and the unattributed memory of each is back to the frozen estimate.
    """
    readings = readings[: len(s.ledger.budgets)]
    live = {e.pid: e for e in s.engines.values()
            if e.pid is not None and e.status in (EngineStatus.STARTING, EngineStatus.READY, EngineStatus.DRAINING,
                                                  EngineStatus.STOPPING, EngineStatus.SLEEPING)}
    unloaded = {e.kept_pid: e for e in s.engines.values()
                if e.kept_pid is not None and e.status in (EngineStatus.STOPPED, EngineStatus.FAILED)}
    ours = live.keys() | unloaded.keys()
    # What a service says it holds is on the device its reservation is on.
    external = dict.fromkeys(range(len(readings)), 0)
    for engine in s.engines.values():
        if engine.serving and engine.external:
            device = min(s.ledger.shares.get(engine.name) or {DEFAULT_DEVICE: 0})
            external[device] = external.get(device, 0) + engine.external
    unattributed = tuple(
        reading.used - sum(nbytes for pid, nbytes in reading.processes.items() if pid in ours) - external[device]
        for device, reading in enumerate(readings))
    if s.ledger.awaiting_free or any(e.status is EngineStatus.STOPPING for e in s.engines.values()):
        s.settle_polls_left = s.policy.settle_polls
    elif s.settle_polls_left > 0:
        s.settle_polls_left -= 1
    else:
        s.outside_memory = tuple(max(0, nbytes) for nbytes in unattributed)
        s.ledger.outside_by_device[: len(readings)] = s.outside_memory
    listed = {pid for reading in readings for pid in reading.processes}
    for engine in s.engines.values():
        if s.ledger.releasing(engine.name) and engine.pid not in listed:
            baseline = engine.outside_baseline if engine.outside_baseline is not None else unattributed
            if all(now_ <= then + s.policy.release_tolerance for now_, then in zip(unattributed, baseline)):
                released = s.release(engine)
                s.emit("released", "info", engine=engine.name, released=released, free=s.ledger.free)
    for pid, engine in live.items():
        share = _share_of(pid, readings)
        if engine.serving and share:
            _measure(s, engine, share)
        elif engine.status is EngineStatus.SLEEPING and share:
            _measure_asleep(s, engine, share)
    for pid, engine in unloaded.items():
        share = _share_of(pid, readings)
        if share and not s.ledger.releasing(engine.name):
            _reserve_unloaded(s, engine, share)


def _share_of(pid: int, readings: Sequence[DeviceUse]) -> dict[int, int]:
    """What process *pid* holds on each device it is listed on."""
    return {device: reading.processes[pid] for device, reading in enumerate(readings) if pid in reading.processes}


def _reserve_unloaded(s: CoreState, engine: EngineState, share: dict[int, int]) -> None:
    """What a kept process holds while its engine is not loaded is reserved for that engine."""
    nbytes = sum(share.values())
    reserved = s.ledger.held(engine.name)
    if s.ledger.holds(engine.name) and abs(nbytes - reserved) <= reserved // 100:
        return
    s.ledger.resize(engine.name, share)
    s.emit("measured", "info", engine=engine.name, measured=nbytes, estimate=reserved, free=s.ledger.free,
           loaded=False)


def _measure_asleep(s: CoreState, engine: EngineState, share: dict[int, int]) -> None:
    """What a sleeping engine holds becomes its reservation, unless set by hand."""
    nbytes = sum(share.values())
    reserved = s.ledger.held(engine.name)
    if (engine.profile.sleep_memory is not None or not s.ledger.holds(engine.name)
            or abs(nbytes - reserved) <= reserved // 100):
        return
    s.ledger.resize(engine.name, share)
    s.emit("measured", "info", engine=engine.name, measured=nbytes, estimate=reserved, free=s.ledger.free,
           asleep=True)


def _measure(s: CoreState, engine: EngineState, share: dict[int, int]) -> None:
    """Keep the most the process has used; it replaces the estimate once it differs by 1 %."""
    nbytes = sum(share.values())
    if nbytes <= engine.measured:
        return
    engine.measured = nbytes
    reserved = s.ledger.held(engine.name)
    if abs(nbytes - reserved) <= reserved // 100 or engine.profile.fixed_memory:
        return
    previous = s.ledger.resize(engine.name, share)
    engine.profile = attrs.evolve(engine.profile, memory=nbytes)
    s.emit("measured", "info", engine=engine.name, measured=nbytes, estimate=previous, free=s.ledger.free)
    s.effects.append(Measured(engine.name, nbytes))


def kept_process(s: CoreState, name: str, pid: int | None, now: float) -> bool:
    """The engine's kept service process started (*pid*) or ended (None); False: nothing to decide.

    One that ends while its engine is not loaded gives back what was reserved for it once
    its memory is seen free (the phantom guard, as for any exited engine)."""
    engine = s.engines[name]
    gone, engine.kept_pid = engine.kept_pid, pid
    if pid is not None or engine.status not in (EngineStatus.STOPPED, EngineStatus.FAILED):
        return False
    if not s.ledger.holds(name) or s.ledger.releasing(name):
        return False
    engine.pid = gone  # what the release waits to see gone from the readings
    if s.observe_memory:
        s.ledger.await_free(name, now + s.policy.release_timeout)
        if engine.outside_baseline is None:
            engine.outside_baseline = s.outside_memory
        return False
    released = s.release(engine)
    s.emit("released", "info", engine=name, released=released, free=s.ledger.free)
    return True


def service_memory(s: CoreState, name: str, generation: int, nbytes: int) -> bool:
    """A service's own account of the memory it holds now (Ollama's /api/ps); False: stale.

    The reservation grows to it when it is more; it never shrinks below the configured
    amount while the service is up, since it may load a model at any request.
    """
    engine = s.engines[name]
    if generation != engine.generation or not engine.serving:
        return False
    engine.external = nbytes
    reserved = s.ledger.held(name)
    if nbytes > reserved:
        s.ledger.rescale(name, nbytes)
        s.emit("measured", "info", engine=name, measured=nbytes, estimate=reserved, free=s.ledger.free)
    return True


def release_overdue(s: CoreState, now: float) -> None:
    """A reservation whose memory was not seen free within ``release_timeout`` is released anyway."""
    for name, deadline in list(s.ledger.awaiting_free.items()):
        if now >= deadline:
            released = s.release(s.engines[name])
            s.emit("release_timeout", "warning", engine=name, released=released,
                   timeout_s=s.policy.release_timeout, free=s.ledger.free)
