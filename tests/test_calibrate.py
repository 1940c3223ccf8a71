"""`steward calibrate`: its arithmetic exactly, its plumbing against the fake llama-server
(fakes do not slow each other: alpha near 0), and briefly against the real one with SmolLM2."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from supervisor.tools.calibrate import (
    Calibration,
    EngineCalibration,
    PairCalibration,
    Timing,
    batching_gain,
    context_cost,
    decode_rate,
    format_calibration,
    prompt_rate,
    prompts_at_once_rate,
    sharing_alpha,
)
from supervisor.cli import main
from supervisor.config import load_config
from supervisor.observe.events import read_event_log
from supervisor.engines.measurements import HOST_KEY, ContextCost, EngineSpeed, HostSharing, MeasurementStore, measurement_key
from tests.conftest import fake_model

# ---- the arithmetic ---------------------------------------------------------------------


def test_timings_are_read_from_an_answer_and_added_up() -> None:
    answer = {"timings": {"prompt_n": 250, "prompt_ms": 1000.0, "predicted_n": 64, "predicted_ms": 800.0,
                          "predicted_per_second": 80.0}}
    timing = Timing.of(answer)
    assert timing == Timing(250, 1000.0, 64, 800.0)
    assert timing.decode_tps == 80.0 and timing.prompt_tps == 250.0
    assert Timing.of({"choices": []}) is None
    assert Timing.of({"timings": {"prompt_n": 1}}) is None
    other = Timing(150, 1000.0, 64, 1800.0)
    assert decode_rate([timing, other]) == 128 / 2600 * 1000
    assert prompt_rate([timing, other]) == 200.0
    assert decode_rate([Timing(0, 0.0, 0, 0.0)]) is None


def test_batching_gain_and_alpha_from_figures() -> None:
    assert batching_gain(50.0, 80.0) == pytest.approx(0.6)
    assert batching_gain(50.0, 50.0) == 0.0
    assert batching_gain(50.0, 40.0) == 0.0  # a second slot that slows the first: no gain, not a negative one
    assert batching_gain(50.0, 120.0) == 1.0
    assert sharing_alpha(80.0, 40.0) == 1.0  # an even split
    assert sharing_alpha(80.0, 20.0) == 2.0  # each at a quarter: they fight over the cores
    assert sharing_alpha(80.0, 80.0) == 0.0
    assert sharing_alpha(80.0, 100.0) == 0.0
    pair = PairCalibration(("a", "b"), (80.0, 60.0), (20.0, 30.0))
    assert pair.alpha == 1.5 and pair.prefill_alpha is None  # prompts not measured
    reading = attrs.evolve(pair, alone_prompt_tps=(300.0, 200.0), together_prompt_tps=(150.0, 50.0))
    assert reading.prefill_alpha == 1.5  # 1 (half the speed alone) and 2 (a quarter)
    assert reading.alpha == 1.5


def test_the_context_cost_from_a_long_prompt_against_short_ones() -> None:
    # Short: 250 prompt tokens read at 250 tok/s (1 s), 64 decoded at 64 tok/s (at 282 on average).
    short = [Timing(250, 1000.0, 64, 1000.0)] * 2
    # Long: 1,000 tokens read in 5 s (200 tok/s), 64 decoded in 1.6 s (40 tok/s, at 1,032).
    cost = context_cost(short, Timing(1000, 5000.0, 64, 1600.0))
    assert cost == ContextCost(pytest.approx(2 * (1 / 200 - 1 / 250) / 750), pytest.approx((1 / 40 - 1 / 64) / 750),
                               250.0, 282.0)
    speed = EngineSpeed(64.0, 250.0, context_cost=cost)
    assert speed.decode_tps_at(282.0) == pytest.approx(64.0)
    assert speed.decode_tps_at(1032.0) == pytest.approx(40.0)
    decode, prompt = speed.at_no_context()
    # At no context: each decoded token 282 x cost faster; a prompt read at its mean position 125 x cost.
    assert 1 / decode == pytest.approx(1 / 64 - 282 * cost.decode_s)
    assert prompt is not None and 1 / prompt == pytest.approx(1 / 250 - cost.prompt_s * 125)
    assert EngineSpeed(64.0).decode_tps_at(5000.0) == 64.0 and EngineSpeed(64.0, 250.0).at_no_context() == (64.0, 250.0)
    # A rate that rose with the context (noise) is no cost; a long prompt cut short measures nothing.
    assert context_cost(short, Timing(1000, 3000.0, 64, 900.0)) == ContextCost(0.0, 0.0, 250.0, 282.0)
    assert context_cost(short, Timing(300, 1200.0, 64, 1000.0)) is None


def test_two_slots_reading_prompts_count_the_time_both_took() -> None:
    # Read in the same batches: each prompt_ms covers both reads, the span a little more (HTTP).
    batched = [Timing(250, 2000.0, 1, 0.001), Timing(240, 1990.0, 1, 0.001)]
    assert prompts_at_once_rate(batched, 2000.0) == 490 / 2000 * 1000
    assert prompts_at_once_rate(batched, 2010.0) == 490 / 2010 * 1000
    # The second taken up only after the first's batch: each prompt_ms is one read alone, the
    # longer would say 500 tok/s (gain 1) where the two took as long as one after the other.
    queued = [Timing(250, 1000.0, 1, 0.001), Timing(250, 1000.0, 1, 0.001)]
    assert prompts_at_once_rate(queued, 2000.0) == 250.0
    assert batching_gain(250.0, 250.0) == 0.0
    # Timings that were not slept (a fake's): the longer prompt_ms still bounds the time.
    assert prompts_at_once_rate(queued, 10.0) == 500.0
    assert prompts_at_once_rate([Timing(0, 0.0, 1, 1.0)], 10.0) is None
    speed = EngineSpeed(80.0, 250.0, 120.0, two_slots_prompt_tps=300.0)
    assert EngineCalibration("chat", "k", 0.5, speed, 2).prefill_batching_gain == pytest.approx(0.2)
    assert EngineCalibration("chat", "k", 0.5, attrs.evolve(speed, prompt_tps=None), 2).prefill_batching_gain is None
    assert EngineCalibration("chat", "k", 0.5, EngineSpeed(80.0, 250.0), 1).prefill_batching_gain is None


# 10 µs more per decoded token for each token of context, measured at 282: at 1,000 tokens
# a token takes 1/80 + 718e-5 s (50.8 tok/s).
COST = ContextCost(2e-6, 1e-5, 250.0, 282.0)


def _calibration(**changes: Any) -> Calibration:
    engines = (EngineCalibration("chat", "k1", 0.5, EngineSpeed(80.0, 300.0, 120.0, 360.0, COST), 2),
               EngineCalibration("embed", "k2", 0.25, EngineSpeed(40.0, 200.0, embedding_tps=150.0), 1))
    pair = PairCalibration(("chat", "embed"), (80.0, 40.0), (20.0, 10.0), alone_prompt_tps=(300.0, 200.0),
                           together_prompt_tps=(150.0, 100.0))
    return Calibration(engines, pair, 2, 12.5, "/state.json", **changes)


def test_the_host_figures_and_the_table() -> None:
    calibration = _calibration()
    assert calibration.batching_gain == 0.5  # only the engine with two slots says
    assert calibration.prefill_batching_gain == pytest.approx(0.2)
    assert calibration.sharing() == HostSharing(2.0, 0.5, 2, 1.0, pytest.approx(0.2))
    assert format_calibration(calibration).splitlines() == [
        "engine              load decode tok/s 2 slots tok/s  gain prompt tok/s 2 slots prompt tok/s  gain "
        "decode at 1k context embed tok/s",
        "chat               0.50s         80.0         120.0  0.50        300.0                360.0  0.20 "
        "                50.8           -",
        "embed              0.25s         40.0             -     -        200.0                    -     - "
        "                   -       150.0",
        "two engines at once (chat + embed): 20.0 / 10.0 tok/s, alone 80.0 / 40.0: alpha 2.00",
        "  reading prompts at once: 150.0 / 100.0 tok/s, alone 300.0 / 200.0: prefill alpha 1.00",
        "host: 2 cores; decode: alpha 2.00, batching gain 0.50; prompts: alpha 1.00, batching gain 0.20 "
        "(the simulator's assumptions: 1.0 and 0.5, the same for prompts)",
        "written to /state.json (took 12.5s)",
    ]
    one_slot = Calibration(calibration.engines[1:], calibration.pair, 2, 1.0, None)
    assert one_slot.sharing() == HostSharing(2.0, 0.0, 2, 1.0, None)
    # The gains kept, not measured now; the prefill alpha measured now.
    assert one_slot.sharing(HostSharing(1.0, 0.3, 8, 0.4, 0.1)) == HostSharing(2.0, 0.3, 2, 1.0, 0.1)
    no_prompts = attrs.evolve(one_slot, pair=attrs.evolve(calibration.pair, alone_prompt_tps=None))
    assert no_prompts.sharing(HostSharing(1.0, 0.3, 8, 0.4, 0.1)) == HostSharing(2.0, 0.3, 2, 0.4, 0.1)
    assert no_prompts.sharing(HostSharing(1.0, 0.3, 8)) == HostSharing(2.0, 0.3, 2)
    assert "  reading prompts at once: not measured" in format_calibration(no_prompts).splitlines()
    assert "prompts: alpha -, batching gain - " in format_calibration(no_prompts)
    assert Calibration((), None, 2, 1.0, None).sharing() is None
    figures = calibration.to_json()
    assert (figures["alpha"], figures["prefill_alpha"], figures["prefill_batching_gain"]) == (2.0, 1.0, 0.2)
    assert figures["engines"]["chat"]["two_slots_prompt_tps"] == 360.0
    assert figures["engines"]["chat"]["prefill_batching_gain"] == 0.2
    assert figures["engines"]["embed"]["prefill_batching_gain"] is None
    assert "two_slots_prompt_tps" not in figures["engines"]["embed"]  # one slot: not measured
    assert (figures["pair"]["alone_prompt_tps"], figures["pair"]["together_prompt_tps"]) == ([300.0, 200.0],
                                                                                             [150.0, 100.0])
    assert no_prompts.to_json()["pair"]["alone_prompt_tps"] is None


def test_the_prompt_figures_go_to_the_state_file(tmp_path: Path) -> None:
    """What calibrate writes (record_speed, record_sharing) is what the scheduler and the simulator read."""
    calibration = _calibration()
    store = MeasurementStore.open(tmp_path / "state.json")
    assert store.record_speed("k1", "chat", calibration.engines[0].speed) is None
    sharing = calibration.sharing()
    assert sharing is not None and store.record_sharing(sharing) is None
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["k1"]["two_slots_prompt_tps"] == 360.0
    assert (state[HOST_KEY]["prefill_alpha"], state[HOST_KEY]["prefill_batching_gain"]) == (1.0, 0.2)
    reopened = MeasurementStore.open(tmp_path / "state.json")
    assert reopened.speed("k1") == EngineSpeed(80.0, 300.0, 120.0, 360.0, COST)
    assert (state["k1"]["context_decode_s"], state["k1"]["decode_context"]) == (1e-5, 282.0)
    assert reopened.sharing() == HostSharing(2.0, 0.5, 2, 1.0, 0.2)


# ---- against the fake llama-server ------------------------------------------------------


def _write_config(tmp_path: Path, models: dict[str, Any]) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"listen": "127.0.0.1:0", "models": models,
                                    "gpu": {"probe": "host", "budget": "3GiB"},
                                    "engines": {"stop_grace": "3s"}}))
    return path


@pytest.mark.slow
def test_calibrate_measures_fake_engines_into_the_state_file(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = _write_config(tmp_path, {"fast": fake_model(tps=200, load_time="0.3s"),
                                    "slow": fake_model(tps=100, parallel=1, load_time="0.1s")})
    assert main(["calibrate", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["engine", "load", "decode", "tok/s", "2", "slots", "tok/s", "gain", "prompt", "tok/s",
                              "2", "slots", "prompt", "tok/s", "gain", "decode", "at", "1k", "context", "embed",
                              "tok/s"]
    assert [line.split()[0] for line in out[1:3]] == ["fast", "slow"]
    assert out[3].startswith("two engines at once (fast + slow): ")
    assert out[4].startswith("  reading prompts at once: ") and out[4].endswith("prefill alpha 0.00")
    assert out[5].startswith("host: ") and "; prompts: alpha 0.00, batching gain " in out[5]
    assert out[-1].startswith(f"written to {tmp_path / 'steward-state.json'} (took ")

    config = load_config(path)
    store = MeasurementStore.open(config.state_file)
    fast = store.speed(measurement_key(config.models["fast"]))
    slow = store.speed(measurement_key(config.models["slow"]))
    assert fast is not None and slow is not None
    # The fake sleeps between tokens: on a busy machine a token comes late, never early.
    assert 100 <= fast.decode_tps <= 201 and 50 <= slow.decode_tps <= 101
    assert fast.two_slots_tps is not None and fast.two_slots_tps > fast.decode_tps  # its slots run side by side
    assert slow.two_slots_tps is None  # one slot
    # The fake reports every prompt read at one fixed speed, whatever reads beside it: its
    # slots and its processes read side by side (a gain near 1, a prefill alpha of 0).
    assert fast.prompt_tps is not None and fast.two_slots_prompt_tps is not None
    assert fast.two_slots_prompt_tps > 1.5 * fast.prompt_tps
    assert slow.two_slots_prompt_tps is None
    load = store.load_time(measurement_key(config.models["fast"]))
    assert load is not None and load >= 0.3
    sharing = store.sharing()
    assert sharing is not None and sharing.alpha < 0.5  # two fakes do not slow each other
    assert sharing.batching_gain > 0.5 and sharing.cores >= 1
    assert sharing.prefill_alpha == pytest.approx(0.0, abs=0.01)
    assert sharing.prefill_batching_gain is not None and sharing.prefill_batching_gain > 0.5
    [event] = [r for r in read_event_log(Path(config.log.file or "")) if r["event"] == "calibrated"]
    assert set(event["engines"]) == {"fast", "slow"} and event["pair"]["engines"] == ["fast", "slow"]
    assert event["alpha"] == round(sharing.alpha, 3) and event["write_problem"] is None
    assert event["prefill_alpha"] == round(sharing.prefill_alpha, 3)
    assert event["prefill_batching_gain"] == round(sharing.prefill_batching_gain, 3)
    assert event["engines"]["fast"]["two_slots_prompt_tps"] == round(fast.two_slots_prompt_tps, 3)
    assert len(event["pair"]["alone_prompt_tps"]) == len(event["pair"]["together_prompt_tps"]) == 2


@pytest.mark.slow
def test_one_engine_is_paired_with_a_copy_of_itself(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write_config(tmp_path, {"one": fake_model(tps=200), "other": fake_model(tps=200)})
    assert main(["calibrate", str(path), "--engine", "one", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert list(result["engines"]) == ["one"]
    assert result["pair"]["engines"] == ["one", "one"] and result["pair"]["copy"] is True
    state = json.loads((tmp_path / "steward-state.json").read_text())
    assert {entry["engine"] for entry in state.values()} == {"one", ""}  # "": the host's entry
    assert HOST_KEY in state


@pytest.mark.slow
def test_an_unknown_engine_or_one_that_fails_to_start_is_said(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = _write_config(tmp_path, {"one": fake_model()})
    assert main(["calibrate", str(path), "--engine", "two"]) == 2
    assert "--engine two: not in models (calibrate measures one)" in capsys.readouterr().err
    broken = _write_config(tmp_path, {"one": fake_model(extra=["--fail-load", "no weights"])})
    assert main(["calibrate", str(broken)]) == 1
    out = capsys.readouterr().out
    assert "note: one: exited before it was ready" in out and "not measured" in out
    assert "state_file" not in out


@pytest.mark.slow
def test_calibrate_cut_short_leaves_no_process_behind(tmp_path: Path) -> None:
    import functools

    import trio

    from supervisor.tools.calibrate import calibrate
    from tests.conftest import descendants

    config = load_config(_write_config(tmp_path, {"slow": fake_model(tps=5)}))  # 64 tokens: 13 s
    said: list[str] = []

    async def cut_short() -> None:
        with trio.move_on_after(20) as waiting:  # as Ctrl-C would: cancelled while an engine computes
            async with trio.open_nursery() as nursery:
                nursery.start_soon(functools.partial(calibrate, config, ["slow"], say=said.append))
                while not any("measuring" in line for line in said):
                    await trio.sleep(0.05)
                nursery.cancel_scope.cancel()
        assert not waiting.cancelled_caught

    trio.run(cut_short)
    assert [cmd for _, cmd in descendants() if "fakes.llama_server" in cmd] == []  # stopped, not left to the fixture
    assert not (tmp_path / "steward-state.json").exists()


# ---- the real llama-server --------------------------------------------------------------


@pytest.mark.slow
def test_calibrate_on_the_real_llama_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The plumbing on the real binary: its timings read, the state file written. A tiny model
    (fakes/tiny_gguf.py) keeps it short on a busy machine; SmolLM2's figures are the real load
    test's (supervisor/tools/loadtest_real.py)."""
    from fakes.llama_binary import llama_server_path
    from fakes.tiny_gguf import write_tiny_model

    try:
        binary = llama_server_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    gguf = write_tiny_model(tmp_path / "tiny-llama.gguf", "llama").path
    path = _write_config(tmp_path, {"tiny": {"command": [str(binary)], "model": str(gguf),
                                             "memory": "1GiB", "parallel": 2, "args": ["-c", "8192"]}})
    assert main(["calibrate", str(path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    tiny = result["engines"]["tiny"]
    assert tiny["decode_tps"] > 0 and tiny["prompt_tps"] > 0 and tiny["two_slots_tps"] > 0 and tiny["load_s"] > 0
    assert result["alpha"] >= 0 and 0 <= result["batching_gain"] <= 1
    assert tiny["two_slots_prompt_tps"] > 0 and 0 <= tiny["prefill_batching_gain"] <= 1
    # The long prompt read beside the short ones: each token's cost by its context.
    assert tiny["context_decode_s"] >= 0 and tiny["context_prompt_s"] >= 0 and tiny["decode_context"] > 250
    assert result["prefill_alpha"] >= 0 and 0 <= result["prefill_batching_gain"] <= 1
    store = MeasurementStore.open(tmp_path / "steward-state.json")
    sharing = store.sharing()
    assert sharing is not None and not math.isnan(sharing.alpha)
    assert sharing.prefill_alpha is not None and sharing.prefill_batching_gain is not None


# ---- the simulator with a calibration ---------------------------------------------------


def _state_file(path: Path) -> Path:
    """A state file as calibrate writes it: two engines (the older figure of one replaced) and the host."""
    path.write_text(json.dumps({
        "k-old": {"engine": "gemma4-12b", "decode_tps": 10.0, "measured_at": 1.0},
        "k-new": {"engine": "gemma4-12b", "decode_tps": 25.0, "prompt_tps": 300.0, "load_s": 2.5, "measured_at": 2.0},
        "k-other": {"engine": "not-in-the-scenario", "decode_tps": 99.0, "measured_at": 2.0},
        "k-memory-only": {"engine": "gemma4-e4b", "bytes": 123, "measured_at": 3.0},
        HOST_KEY: {"engine": "", "alpha": 2.5, "batching_gain": 0.2, "cores": 2, "measured_at": 2.0},
    }))
    return path


def _gridcore_raw() -> dict[str, Any]:
    from importlib.resources import files

    return yaml.safe_load(files("supervisor.tools.simulate").joinpath("gridcore.yaml").read_text())


def test_a_scenario_names_a_state_file_as_its_calibration(tmp_path: Path) -> None:
    from supervisor.tools.simulate.scenario import EngineFigures, builtin_scenario, load_scenario

    _state_file(tmp_path / "state.json")
    (tmp_path / "gridcore-here.yaml").write_text(yaml.safe_dump(_gridcore_raw() | {"calibration": "state.json"}))
    scenario = load_scenario(tmp_path / "gridcore-here.yaml")  # the path is relative to the scenario file
    plain = builtin_scenario("gridcore")
    assert (scenario.gpu.sharing.alpha, scenario.gpu.sharing.batching_gain) == (2.5, 0.2)
    assert scenario.gpu.sharing.load_weight == plain.gpu.sharing.load_weight
    chat = scenario.engines["gemma4-12b"]
    assert (chat.speed, chat.prompt_speed, chat.load_time) == (25.0, 300.0, 2.5)  # the newest figure
    assert scenario.engines["gemma4-e4b"] == plain.engines["gemma4-e4b"]  # memory only: nothing to apply
    assert scenario.calibration is not None
    assert scenario.calibration.engines == {"gemma4-12b": EngineFigures(25.0, 300.0, 2.5)}
    assert scenario.calibration.describe() == (f"calibration from {tmp_path / 'state.json'}: alpha 2.5; "
                                               "batching gain 0.2; engines gemma4-12b")


def test_a_calibrated_context_cost_reaches_the_simulated_engine(tmp_path: Path) -> None:
    """The state file's speeds were measured at some context: the simulator takes them to an
    empty one and adds each token's cost by its position (workload.py)."""
    from supervisor.tools.simulate.scenario import Calibration as Figures, EngineFigures, builtin_scenario

    store = MeasurementStore.open(tmp_path / "state.json")
    speed = EngineSpeed(64.0, 250.0, context_cost=COST, embedding_tps=150.0)
    assert store.record_speed("k", "gemma4-12b", speed) is None
    figures = Figures.from_state_file(tmp_path / "state.json").engines["gemma4-12b"]
    decode, prompt = speed.at_no_context()
    assert figures == EngineFigures(pytest.approx(decode), pytest.approx(prompt), None, 2e-6, 1e-5, 150.0)
    assert decode > 64.0 and prompt is not None and prompt > 250.0
    chat = Figures(engines={"gemma4-12b": figures}).apply(builtin_scenario("gridcore")).engines["gemma4-12b"]
    # 64 tokens decoded after 250: at their mean context 282 the speed calibrate measured.
    assert 64 / chat.decode_seconds(250, 64) == pytest.approx(64.0)
    assert chat.embed_seconds(150) == 1.0


def test_inline_calibration_figures_and_their_errors() -> None:
    from supervisor.config import ConfigError
    from supervisor.tools.simulate.scenario import parse_scenario

    inline = {"alpha": 0.0, "engines": {"gemma4-e2b": {"speed": 60, "load_time": "1.5s"}}}
    scenario = parse_scenario(_gridcore_raw() | {"calibration": inline})
    assert scenario.gpu.sharing.alpha == 0.0 and scenario.gpu.sharing.batching_gain == 0.7  # the gain kept
    assert (scenario.engines["gemma4-e2b"].speed, scenario.engines["gemma4-e2b"].load_time) == (60.0, 1.5)
    for bad, problem in [
        ({"alpha": "much"}, "calibration.alpha: must be a number, got 'much'"),
        ({"alpha": -1}, "calibration.alpha: must not be negative, got -1.0"),
        ({"batching_gain": 2}, "calibration.batching_gain: must be between 0 and 1, got 2.0"),
        ({"engines": {"gemma4-e2b": {"speed": 0}}}, "calibration.engines.gemma4-e2b.speed: must be a positive number"),
        ({"engines": {"nope": {"speed": 1}}}, "calibration.engines.nope: not under engines"),
        ({"speed": 1}, "calibration.speed: unknown key"),
        ([1], "calibration: must be the path of a steward state file or a mapping"),
        ("/no/such/state.json", "calibration: cannot read the state file /no/such/state.json"),
    ]:
        with pytest.raises(ConfigError) as caught:
            parse_scenario(_gridcore_raw() | {"calibration": bad})
        assert any(p.startswith(problem) for p in caught.value.problems), caught.value.problems


def test_simulate_takes_a_calibration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = _state_file(tmp_path / "state.json")
    assert main(["simulate", "--policies", "steward", "--calibration", str(state)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == f"calibration from {state}: alpha 2.5; batching gain 0.2; engines gemma4-12b"
    assert main(["simulate", "--policies", "steward", "--calibration", str(state), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["calibration"] == lines[1]
    (tmp_path / "empty.json").write_text("{}")
    assert main(["simulate", "--calibration", str(tmp_path / "empty.json")]) == 2
    assert "--calibration: " in capsys.readouterr().err
