"""Several devices in one host, in the pure core: placement, splitting, per-device eviction
and per-device memory readings, with exact times."""

from __future__ import annotations

from supervisor.scheduler.core import Scheduler
from supervisor.scheduler.types import (
    DeviceUse,
    Emit,
    EngineProfile,
    EngineStatus,
    Fail,
    Grant,
    Placement,
    SchedulingPolicy,
    StartEngine,
    StopEngine,
)

GIB = 1024**3


def make(*budgets: float, profiles: list[EngineProfile], observe: bool = False) -> Scheduler:
    return Scheduler.create([int(b * GIB) for b in budgets], profiles, SchedulingPolicy(hot_window=300.0),
                            observe_memory=observe)


def model(name: str, gib: float, **kwargs: object) -> EngineProfile:
    return EngineProfile(name, int(gib * GIB), 1, **kwargs)  # type: ignore[arg-type]


def starts(effects: list) -> dict[str, tuple[int, ...]]:
    """Engine -> the devices its start was placed on."""
    return {e.engine: e.placement.devices for e in effects if isinstance(e, StartEngine)}


def stops(effects: list) -> list[str]:
    return [e.engine for e in effects if isinstance(e, StopEngine)]


def emitted(effects: list, event: str) -> list[dict]:
    return [e.fields for e in effects if isinstance(e, Emit) and e.event == event]


def serve(s: Scheduler, job: int, name: str, now: float, klass: str = "interactive", done: float | None = None,
          pid: int | None = None) -> list:
    """Submit one step for *name*, make its engine ready if it starts (process *pid*), finish at *done*."""
    effects = s.submit(job, name, klass, now, timeout=600)
    if s.engines[name].status is EngineStatus.STARTING:
        effects += s.engine_ready(name, s.engines[name].generation, f"http://127.0.0.1:{9000 + job}", now, pid)
    assert any(isinstance(e, Grant) and e.job_id == job for e in effects), effects
    if done is not None:
        effects += s.finish(job, done)
    return effects


def stop_exited(s: Scheduler, name: str, now: float) -> list:
    return s.engine_exited(name, s.engines[name].generation, now, "stopped")


def test_a_model_goes_where_it_fits_without_evicting_and_its_memory_is_that_devices() -> None:
    s = make(24, 12, profiles=[model("big", 20), model("small", 8)])
    assert starts(serve(s, 1, "big", 0.0, done=1.0)) == {"big": (0,)}  # only device 0 holds 20 GiB
    effects = serve(s, 2, "small", 2.0, done=3.0)
    assert starts(effects) == {"small": (1,)}  # device 0 has 4 GiB left: no eviction on device 1
    assert stops(effects) == []
    assert s.ledger.shares == {"big": {0: 20 * GIB}, "small": {1: 8 * GIB}}
    assert [(d.index, d.reserved, d.free) for d in s.snapshot().devices] == [(0, 20 * GIB, 4 * GIB),
                                                                              (1, 8 * GIB, 4 * GIB)]
    load = emitted(effects, "load")[0]
    assert load["devices"] == [1] and load["per_device"] == [8 * GIB]
    engine = {e.name: e for e in s.snapshot().engines}["small"]
    assert engine.devices == (1,) and engine.held == {1: 8 * GIB}


def test_a_load_prefers_the_device_it_ran_on_last_over_more_free_memory() -> None:
    s = make(16, 16, profiles=[model("a", 4, idle_unload=10.0), model("b", 4), model("c", 8)])
    assert starts(serve(s, 1, "b", 0.0, done=0.5)) == {"b": (0,)}  # a tie: the first device
    assert starts(serve(s, 2, "a", 1.0, done=1.5)) == {"a": (1,)}  # the most left free
    assert stops(s.tick(11.5)) == ["a"]  # idle for 10 s
    stop_exited(s, "a", 11.6)
    assert starts(serve(s, 3, "c", 12.0, done=12.5)) == {"c": (1,)}  # 8 GiB would be left there, 4 on device 0
    # Device 0 has 12 GiB free, device 1 has 8: a goes back where it ran.
    assert starts(serve(s, 4, "a", 20.0)) == {"a": (1,)}


def test_eviction_frees_memory_on_the_device_that_needs_it_never_a_victim_elsewhere() -> None:
    s = make(16, 8, profiles=[model("a", 12), model("b", 6), model("c", 10)])
    serve(s, 1, "a", 0.0, done=1.0)  # only device 0 holds 12 GiB
    serve(s, 2, "b", 2.0, done=3.0)  # 4 GiB left on device 0: device 1
    serve(s, 3, "a", 4.0, done=5.0)  # b is now the least recently used
    assert {name: tuple(share) for name, share in s.ledger.shares.items()} == {"a": (0,), "b": (1,)}
    # c (10 GiB) fits only device 0: a is evicted there, though b was used less recently.
    effects = s.submit(4, "c", "interactive", 400.0, timeout=600)
    assert stops(effects) == ["a"]
    assert [e["engine"] for e in emitted(effects, "evict")] == ["a"]
    assert emitted(effects, "evict")[0]["devices"] == [0]
    effects = stop_exited(s, "a", 401.0)
    assert starts(effects) == {"c": (0,)}
    assert s.engines["b"].status is EngineStatus.READY


def test_a_model_no_single_device_holds_is_split_over_them_when_its_runtime_splits() -> None:
    s = make(8, 4, profiles=[model("big", 9, splittable=True), model("vllm", 9), model("both", 6, devices=(0, 1))])
    refused = s.submit(1, "vllm", "interactive", 0.0)
    assert [(e.status, e.code) for e in refused if isinstance(e, Fail)] == [(503, "insufficient_memory")]
    effects = serve(s, 2, "big", 0.0, done=1.0)
    [start] = [e for e in effects if isinstance(e, StartEngine)]
    assert start.placement == Placement((6 * GIB, 3 * GIB)) and start.placement.split  # in proportion to budgets
    assert s.ledger.shares["big"] == {0: 6 * GIB, 1: 3 * GIB}
    # Pinned to several devices: split over them, whatever the runtime.
    effects = s.submit(3, "both", "interactive", 400.0, timeout=600)
    assert stops(effects) == ["big"]  # 4 + 2 GiB needed, 2 + 1 free
    effects = stop_exited(s, "big", 401.0)
    assert [e.placement.shares for e in effects if isinstance(e, StartEngine)] == [(4 * GIB, 2 * GIB)]


def test_hot_work_is_kept_and_a_cold_victim_on_the_other_device_is_chosen() -> None:
    s = make(16, 16, profiles=[model("chat", 12), model("old", 10), model("job", 8)])
    serve(s, 1, "chat", 0.0, done=1.0)  # interactive: hot for 300 s
    serve(s, 2, "old", 10.0, klass="batch", done=11.0)  # batch: cold
    assert {n: tuple(sh) for n, sh in s.ledger.shares.items()} == {"chat": (0,), "old": (1,)}
    effects = s.submit(3, "job", "interactive", 20.0, timeout=600)  # both could go; the cold one goes
    assert stops(effects) == ["old"]
    assert starts(stop_exited(s, "old", 21.0)) == {"job": (1,)}


def test_models_devices_pins_a_model_to_its_device() -> None:
    s = make(16, 16, profiles=[model("a", 4), model("pinned", 4, devices=(1,))])
    serve(s, 1, "a", 0.0, done=1.0)
    assert starts(serve(s, 2, "pinned", 2.0)) == {"pinned": (1,)}
    s = make(16, 16, profiles=[model("pinned", 4, devices=(0,))])
    assert starts(serve(s, 1, "pinned", 0.0)) == {"pinned": (0,)}


def test_outside_use_and_measurements_are_per_device() -> None:
    s = make(16, 16, profiles=[model("big", 20, splittable=True), model("a", 10)], observe=True)
    # Another program holds 10 GiB of device 0: a goes to device 1.
    s.observe_devices(0.0, [DeviceUse(10 * GIB, {}), DeviceUse(0, {})])
    assert [d.outside for d in s.snapshot().devices] == [10 * GIB, 0]
    assert starts(serve(s, 1, "a", 1.0, done=2.0)) == {"a": (1,)}
    # The split engine's measured use replaces its estimate, device by device.
    s = make(16, 16, profiles=[model("big", 20, splittable=True)], observe=True)
    serve(s, 1, "big", 0.0, pid=42)
    assert s.ledger.shares["big"] == {0: 10 * GIB, 1: 10 * GIB}
    effects = s.observe_devices(1.0, [DeviceUse(11 * GIB, {42: 11 * GIB}), DeviceUse(9 * GIB, {42: 9 * GIB})])
    assert s.ledger.shares["big"] == {0: 10 * GIB, 1: 10 * GIB}  # the same total, within 1 %: kept
    effects = s.observe_devices(2.0, [DeviceUse(13 * GIB, {42: 13 * GIB}), DeviceUse(9 * GIB, {42: 9 * GIB})])
    assert s.ledger.shares["big"] == {0: 13 * GIB, 1: 9 * GIB}
    assert emitted(effects, "measured")[0]["measured"] == 22 * GIB


def test_an_engine_leaving_one_device_is_released_once_that_device_shows_it_free() -> None:
    s = make(16, 16, profiles=[model("a", 8, devices=(1,)), model("b", 12, devices=(1,))], observe=True)
    s.observe_devices(0.0, [DeviceUse(GIB, {}), DeviceUse(0, {})])  # 1 GiB outside use on device 0
    serve(s, 1, "a", 0.0, done=1.0, pid=7)
    s.observe_devices(1.0, [DeviceUse(GIB, {}), DeviceUse(8 * GIB, {7: 8 * GIB})])
    effects = s.submit(2, "b", "interactive", 400.0, timeout=600)
    assert stops(effects) == ["a"]
    stop_exited(s, "a", 401.0)
    # Gone from the list, but device 1 still shows its memory (the driver frees it late): held.
    assert starts(s.observe_devices(401.5, [DeviceUse(GIB, {}), DeviceUse(8 * GIB, {})])) == {}
    effects = s.observe_devices(402.0, [DeviceUse(GIB, {}), DeviceUse(0, {})])
    assert [e["engine"] for e in emitted(effects, "released")] == ["a"] and starts(effects) == {"b": (1,)}


def test_a_sleeping_engine_wakes_on_the_device_its_process_is_on() -> None:
    s = make(16, 16, profiles=[model("vllm", 8, sleep_memory=GIB), model("other", 4)])
    assert starts(serve(s, 1, "vllm", 0.0, done=1.0)) == {"vllm": (0,)}
    s.engines["vllm"].status = EngineStatus.STOPPING  # as an eviction leaves it
    s.engine_asleep("vllm", 1, 2.0, "slept")
    assert s.ledger.shares["vllm"] == {0: GIB}
    serve(s, 2, "other", 3.0, done=4.0)  # device 1 had more room
    assert starts(serve(s, 3, "vllm", 5.0)) == {"vllm": (0,)}
    assert s.ledger.shares["vllm"] == {0: 8 * GIB}


def test_an_exclusive_job_takes_device_0_and_evicts_only_engines_there() -> None:
    s = make(16, 16, profiles=[model("a", 8, devices=(0,)), model("b", 8, devices=(1,))])
    serve(s, 1, "a", 0.0, done=1.0)
    serve(s, 2, "b", 0.0, done=1.0)
    effects = s.submit(3, None, "interactive", 10.0, exclusive_memory=12 * GIB, timeout=600)
    assert stops(effects) == ["a"]
    effects = stop_exited(s, "a", 11.0)
    assert [e.job_id for e in effects if isinstance(e, Grant)] == [3]
    assert s.ledger.shares == {"b": {1: 8 * GIB}, "exclusive:3": {0: 12 * GIB}}
