"""Memory the device reports, against the ledger: outside use, the phantom-memory guard,
measurements replacing estimates."""

from __future__ import annotations
import pytest

from supervisor.scheduler.core import Scheduler
from supervisor.scheduler.types import EngineProfile, Measured, SchedulingPolicy, StartEngine, StopEngine
from tests.conftest import StewardFactory, fake_model

GIB = 1024**3


def loaded(budget_gib: int, *names: str, gib: int = 6, measured_gib: int | None = None) -> Scheduler:
    """A core with the named engines loaded (pids 101, 102, ...), idle, and one reading taken."""
    measured = (gib if measured_gib is None else measured_gib) * GIB
    s = Scheduler.create(budget_gib * GIB, [EngineProfile(n, gib * GIB, 1) for n in (*names, "c")],
                         observe_memory=True)
    for i, name in enumerate(names):
        s.submit(i + 1, name, "interactive", float(i))
        s.engine_spawned(name, 1, 101 + i, float(i))
        s.engine_ready(name, 1, f"http://{name}", float(i) + 0.5)
        s.finish(i + 1, float(i) + 0.75)
    s.observe(5.0, used=len(names) * measured, processes={101 + i: measured for i in range(len(names))})
    return s


def actions(effects: list) -> list:
    return [e for e in effects if isinstance(e, StartEngine | StopEngine)]


def test_regression_phantom_memory_never_evicts_a_healthy_engine() -> None:
    s = loaded(16, "a", "b")
    assert s.ledger.outside == 0 and s.ledger.free == 4 * GIB
    assert actions(s.submit(10, "c", "interactive", 10.0)) == [StopEngine("a", 1)]  # LRU, one victim
    s.engine_exited("a", 1, 10.5, "stopped (exited with status 0)")
    # The poll after the exit: a is gone from the process list, but the driver still
    # counts its memory. Read naively, 6 GiB of "outside" use would leave no room for c
    # even after a's release, and b would be evicted too.
    effects = s.observe(10.6, used=12 * GIB, processes={102: 6 * GIB})
    assert actions(effects) == []
    assert s.ledger.outside == 0 and s.ledger.totals == {"a": 6 * GIB, "b": 6 * GIB}
    # The memory is really free now: a's reservation goes, c loads; b was never touched.
    effects = s.observe(10.7, used=6 * GIB, processes={102: 6 * GIB})
    assert actions(effects) == [StartEngine("c", 1)]
    # A late reading that still lags (the two NVML calls disagree once more) moves nothing:
    # the outside estimate stays frozen for two polls after the last stop.
    s.engine_spawned("c", 1, 103, 10.75)
    assert actions(s.observe(10.8, used=18 * GIB, processes={102: 6 * GIB, 103: 6 * GIB})) == []
    assert s.ledger.outside == 0
    assert not s.engines["b"].draining and s.engines["b"].status.value == "ready"


def test_outside_use_is_subtracted_from_what_the_ledger_hands_out() -> None:
    s = loaded(16, "a")
    s.observe(6.0, used=9 * GIB, processes={101: 6 * GIB, 999: 3 * GIB})  # a desktop takes 3 GiB
    assert s.ledger.outside == 3 * GIB and s.ledger.free == 7 * GIB
    s.submit(10, "c", "interactive", 7.0)
    assert s.engines["c"].status.value == "starting"  # 6 GiB still fit
    s.observe(8.0, used=15 * GIB, processes={101: 6 * GIB, 999: 9 * GIB})  # now it takes 9
    assert s.ledger.free == 16 * GIB - 12 * GIB - 9 * GIB  # overcommitted: nothing new loads


def test_a_loading_engine_is_not_mistaken_for_outside_use() -> None:
    s = Scheduler.create(16 * GIB, [EngineProfile("a", 6 * GIB, 1)], observe_memory=True)
    s.submit(1, "a", "interactive", 0.0)
    s.engine_spawned("a", 1, 101, 0.1)
    s.observe(0.5, used=3 * GIB, processes={101: 3 * GIB})  # half loaded
    assert s.ledger.outside == 0 and s.ledger.free == 10 * GIB


def test_the_measurement_replaces_the_estimate() -> None:
    s = Scheduler.create(16 * GIB, [EngineProfile("a", 6 * GIB, 1)], observe_memory=True)
    s.submit(1, "a", "interactive", 0.0)
    s.engine_spawned("a", 1, 101, 0.1)
    s.engine_ready("a", 1, "http://a", 1.0)
    effects = s.observe(2.0, used=5 * GIB, processes={101: 5 * GIB})  # it really takes 5 GiB, not 6
    assert [e for e in effects if isinstance(e, Measured)] == [Measured("a", 5 * GIB)]
    assert s.ledger.totals == {"a": 5 * GIB}
    assert s.engines["a"].profile.memory == 5 * GIB  # the next load reserves the measurement
    # Small wobble (under 1 %) does not rewrite anything.
    assert not [e for e in s.observe(7.0, used=5 * GIB + 1, processes={101: 5 * GIB + 1}) if isinstance(e, Measured)]


def test_settle_polls_are_configurable() -> None:
    s = Scheduler.create(16 * GIB, [EngineProfile("a", 6 * GIB, 1)], SchedulingPolicy(settle_polls=0),
                         observe_memory=True)
    s.observe(0.0, used=GIB, processes={})
    assert s.ledger.outside == GIB


@pytest.mark.slow
def test_regression_phantom_memory_with_real_processes_on_the_simulated_gpu(start_steward: StewardFactory,
                                                                           sim_gpu) -> None:  # type: ignore[no-untyped-def]
    # The simulated driver keeps an exited process's memory for 1 s while the process list
    # no longer shows it, as NVML does; steward polls ten times a second meanwhile.
    from fakes import simgpu
    from supervisor.units import parse_size

    gpu_dir = simgpu.create_device(sim_gpu("16GiB").parent / "gpu-linger", total_bytes=parse_size("16GiB"),
                                   linger_s=1.0)
    steward = start_steward({name: fake_model("6GiB", gpu_dir=gpu_dir, parallel=1) for name in ("a", "b", "c")},
                            gpu={"probe": "simulated", "simulated_dir": str(gpu_dir), "poll_interval": "0.1s"})
    import openai

    client = openai.OpenAI(base_url=steward.base_url, api_key="x", max_retries=0, timeout=30)
    for model in ("a", "b", "c"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    evictions = [e["engine"] for e in steward.events("evict")]
    assert evictions == ["a"]  # one victim; b, healthy, stays
    released = steward.wait_event("released", engine="a")
    ready_c = steward.wait_event("ready", engine="c")
    assert released["mono"] <= ready_c["mono"]
    stopped_a = steward.wait_event("stopped", engine="a")
    assert released["mono"] - stopped_a["mono"] >= 0.9  # it waited out the driver's linger
    assert not [e for e in steward.events("stop") if e["engine"] == "b"]

