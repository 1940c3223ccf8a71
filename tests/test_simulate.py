"""steward simulate: the processor-sharing GPU, the replay, the baselines, the report.

Work and times in the small cases are exact binary fractions, so most assertions are
equalities.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
import yaml

from supervisor.cli import main
from supervisor.config import ConfigError
from supervisor.scheduler.types import Fail, Grant
from supervisor.tools.simulate import default_scenario, simulate
from supervisor.tools.simulate.gpu import CardState, SimulatedGpu
from supervisor.tools.simulate.policies import DEFAULT_POLICIES, make_policy
from supervisor.tools.simulate.runner import Replay, replay
from supervisor.tools.simulate.scenario import Scenario, parse_scenario
from supervisor.tools.simulate.sharing import SharingModel

GIB = 1024**3


# ---- the processor-sharing model ------------------------------------------------------

def ready_gpu(sharing: SharingModel, *names: str) -> SimulatedGpu:
    gpu = SimulatedGpu.create(16 * GIB, sharing, dict.fromkeys(names, GIB))
    for name in names:
        gpu.begin_load(name, 1, 0.0)
        gpu.finish_load(name, 0.0)
    return gpu


def finish_all(gpu: SimulatedGpu) -> dict[int, float]:
    done = {}
    while (when := gpu.next_completion()) is not None:
        done.update(dict.fromkeys(gpu.complete_due(when), when))
    return done


def test_a_step_alone_takes_exactly_its_work() -> None:
    gpu = ready_gpu(SharingModel(), "a")
    gpu.start_step(1, "a", 2.0, 0.0)
    assert finish_all(gpu) == {1: 2.0}


def test_two_engines_computing_at_once_each_run_at_half_speed() -> None:
    gpu = ready_gpu(SharingModel(alpha=1.0), "a", "b")
    gpu.start_step(1, "a", 1.0, 0.0)
    gpu.start_step(2, "b", 1.0, 0.0)
    assert finish_all(gpu) == {1: 2.0, 2: 2.0}


def test_rates_are_recomputed_when_a_step_joins_and_when_it_leaves() -> None:
    gpu = ready_gpu(SharingModel(alpha=1.0), "a", "b")
    gpu.start_step(1, "a", 2.0, 0.0)  # alone until 0.5: 1.5 left
    gpu.start_step(2, "b", 1.0, 0.5)  # both at half speed: b done at 2.5, a has 0.5 left
    assert finish_all(gpu) == {2: 2.5, 1: 3.0}  # then a alone again


@pytest.mark.parametrize(("gain", "done"), [(0.0, 3.0), (0.5, 2.0), (1.0, 1.5)])
def test_slots_of_one_engine_share_its_speed_with_the_batching_gain(gain: float, done: float) -> None:
    gpu = ready_gpu(SharingModel(batching_gain=gain), "a")
    gpu.start_step(1, "a", 1.5, 0.0)
    gpu.start_step(2, "a", 1.5, 0.0)  # together (1 + gain) x the speed alone, split evenly
    assert finish_all(gpu) == {1: done, 2: done}


def test_slots_reading_prompts_batch_by_their_own_gain_then_decode_by_decodings() -> None:
    gpu = ready_gpu(SharingModel(alpha=0.0, batching_gain=1.0, prefill_batching_gain=0.0), "a")
    gpu.start_step(1, "a", 2.0, 0.0, prefill=1.0)
    gpu.start_step(2, "a", 2.0, 0.0, prefill=1.0)
    # Reading: gain 0, each at half speed, prompts read by 2.0; then gain 1, each at full speed.
    assert gpu.next_completion() == 2.0
    assert gpu.complete_due(2.0) == [] and [s.rate for s in gpu.steps.values()] == [1.0, 1.0]
    assert finish_all(gpu) == {1: 3.0, 2: 3.0}


def test_a_slot_decoding_waits_in_the_batches_of_one_reading_its_prompt() -> None:
    gpu = ready_gpu(SharingModel(alpha=0.0, batching_gain=1.0, prefill_batching_gain=0.0), "a")
    gpu.start_step(1, "a", 1.0, 0.0)  # decoding only
    gpu.start_step(2, "a", 3.0, 0.0, prefill=2.0)  # both at 0.5 until 1 is done at 2.0
    assert finish_all(gpu) == {1: 2.0, 2: 4.0}  # 2 read 1.0 by then: 1.0 more reading, 1.0 decoding


def test_engines_reading_prompts_at_once_contend_by_prefill_alpha() -> None:
    gpu = ready_gpu(SharingModel(alpha=0.0, prefill_alpha=1.0), "a", "b")
    gpu.start_step(1, "a", 1.0, 0.0, prefill=1.0)  # embeddings: only reading
    gpu.start_step(2, "b", 1.0, 0.0, prefill=1.0)
    assert finish_all(gpu) == {1: 2.0, 2: 2.0}
    gpu.start_step(3, "a", 1.0, 2.0)  # decoding: alpha 0
    gpu.start_step(4, "b", 1.0, 2.0)
    assert finish_all(gpu) == {3: 3.0, 4: 3.0}


def test_without_prefill_figures_reading_shares_as_decoding_does() -> None:
    gpu = ready_gpu(SharingModel(batching_gain=0.5), "a")
    gpu.start_step(1, "a", 1.5, 0.0, prefill=1.0)
    gpu.start_step(2, "a", 1.5, 0.0, prefill=1.5)
    assert finish_all(gpu) == {1: 2.0, 2: 2.0}  # as test_slots_of_one_engine_share_its_speed_with_the_batching_gain


def test_a_load_in_progress_slows_the_engines_computing() -> None:
    gpu = SimulatedGpu.create(16 * GIB, SharingModel(load_weight=1.0), {"a": GIB, "b": GIB})
    gpu.begin_load("a", 1, 0.0)
    gpu.finish_load("a", 0.0)
    gpu.start_step(1, "a", 2.0, 0.0)
    gpu.begin_load("b", 1, 0.0)  # counts as one more engine: a at half speed
    gpu.finish_load("b", 1.0)  # a did 0.5; 1.5 left alone
    assert finish_all(gpu) == {1: 2.5}


def test_the_sharing_exponent() -> None:
    assert SharingModel(alpha=1.0).engine_share(4, 0) == 0.25
    assert SharingModel(alpha=0.5).engine_share(4, 0) == 0.5
    assert SharingModel(alpha=0.0).engine_share(4, 2) == 1.0  # a GPU that never saturates
    assert SharingModel(alpha=1.0, load_weight=0.5).engine_share(1, 2) == 0.5


# ---- small scenarios -----------------------------------------------------------------

def tiny(engines: dict[str, dict[str, object]], clients: dict[str, dict[str, object]], **top: object) -> Scenario:
    raw = {"gpu": {"memory": "16GiB"}, "duration": "60s", "engines": engines, "clients": clients} | top
    return parse_scenario(raw, "tiny")


def engine(gib: float = 4, **fields: object) -> dict[str, object]:
    # 8 tokens/s and 64 prompt tokens/s: a client's 64 + 8 tokens are 2 s of work alone.
    return {"memory": f"{gib}GiB", "speed": 8, "prompt_speed": 64, "load_time": "2s", "stop_time": "0.5s"} | fields


def client(model: str, klass: str = "interactive", **fields: object) -> dict[str, object]:
    return {"model": model, "class": klass, "think": "1s", "prompt_tokens": 64, "output_tokens": 8} | fields


def watched(scenario: Scenario, policy: str, check: Callable[[Replay], None]) -> Replay:
    run = Replay.create(scenario, make_policy(policy, scenario), watch=check)
    run.run()
    return run


def resident(run: Replay) -> list[str]:
    return [name for name, e in run.gpu.engines.items() if e.state is not CardState.STOPPED]


def test_a_lone_client_waits_for_the_load_once_then_gets_its_work_alone() -> None:
    scenario = tiny({"m": engine()}, {"chat": client("m")}, duration="20s")
    outcome = replay(scenario, make_policy("steward", scenario))
    latencies = [r.latency for r in outcome.records]
    assert latencies[0] == pytest.approx(2.0 + 2.0)  # load, then 2 s of work
    assert latencies[1:] == pytest.approx([2.0] * len(latencies[1:]))
    assert len(latencies) == 6  # 20 s: 4 + 1 think, then 2 + 1 per request
    assert (outcome.loads, outcome.unnecessary_loads, outcome.peak_memory) == (1, 0, 4 * GIB)


def test_an_embeddings_request_is_one_step_per_chunk_and_its_later_steps_keep_its_place() -> None:
    scenario = tiny({"embed": engine(1, pinned=True, prompt_speed=32)},
                    {"indexer": client("embed", "background", count=2, inputs=70, chunk=32, prompt_tokens=1,
                                       output_tokens=0)}, duration="10s")
    first, second = replay(scenario, make_policy("steward", scenario)).records[:2]
    # Both ask before the pinned engine is ready at 2 s; one slot. 32 + 32 + 6 inputs of
    # one token at 32 tokens/s: 1 + 1 + 0.1875 s, and the second request waits for all of it.
    assert first.arrival + first.latency == 2.0 + 2.1875
    assert second.arrival + second.latency == 2.0 + 2 * 2.1875


def test_the_same_seed_gives_the_same_result_and_another_seed_another() -> None:
    scenario = default_scenario()
    first = simulate(scenario, ["steward", "keepalive"]).as_json()
    assert simulate(scenario, ["steward", "keepalive"]).as_json() == first
    other = attrs.evolve(scenario, seed=99)
    assert simulate(other, ["steward", "keepalive"]).as_json() != first


def test_with_the_guard_off_the_chats_see_exactly_what_they_saw_alone() -> None:
    # Continuous chat keeps the window open: without the starvation guard nothing runs
    # beside it, and each client's requests are the same as when it runs alone.
    scenario = tiny({"chat": engine(), "agent": engine()},
                    {"chat": client("chat", think="0s", count=2), "agent": client("agent", "background")},
                    scheduler={"background_max_starvation": "0s"})
    report = simulate(scenario, ["steward"])
    interactive = report.policies["steward"].classes["interactive"]
    assert (interactive.p50_s, interactive.p95_s) == (report.interactive_alone.p50_s, report.interactive_alone.p95_s)
    assert report.policies["steward"].classes["background"].completed == 0


# ---- the baselines ---------------------------------------------------------------------

THREE_MODELS = {"a": engine(), "b": engine(), "c": engine()}  # 12 of 16 GiB: all fit at once
ROUND_ROBIN = {"a": client("a"), "b": client("b", "background"), "c": client("c", "batch")}


def test_swap_never_has_two_models_loaded_and_its_swaps_are_unnecessary_when_all_would_fit() -> None:
    seen: list[int] = []
    run = watched(tiny(THREE_MODELS, ROUND_ROBIN), "swap", lambda r: seen.append(len(resident(r))))
    assert max(seen) == 1
    assert run.loads > 6
    assert run.unnecessary_loads == run.loads - 3  # only each model's first load was needed


def test_lru_count_never_keeps_more_than_models_max() -> None:
    seen: list[int] = []
    run = watched(tiny(THREE_MODELS, ROUND_ROBIN, baselines={"models_max": 2}), "lru-count",
                  lambda r: seen.append(len(resident(r))))
    assert max(seen) == 2
    assert run.unnecessary_loads > 0  # evicted by count although memory was free


def test_lru_count_cuts_off_requests_in_flight_when_it_evicts_a_busy_model() -> None:
    scenario = tiny(THREE_MODELS, {"a": client("a", think="0s"), "b": client("b", think="0s"),
                                   "c": client("c", think="0s")}, baselines={"models_max": 2})
    killing = replay(scenario, make_policy("lru-count", scenario))
    assert sum(r.latency is None for r in killing.records) > 0
    draining = tiny(THREE_MODELS, {"a": client("a", think="0s"), "b": client("b", think="0s")},
                    baselines={"models_max": 2, "kill_in_flight": False})
    assert all(r.latency is not None for r in replay(draining, make_policy("lru-count", draining)).records)


def test_lru_count_does_not_count_memory_so_a_load_that_does_not_fit_fails() -> None:
    scenario = tiny({"a": engine(10), "b": engine(10)}, {"a": client("a"), "b": client("b")})
    outcome = replay(scenario, make_policy("lru-count", scenario))
    assert sum(r.latency is None for r in outcome.records) > 0  # out of memory, as the router's 500
    assert outcome.peak_memory == 10 * GIB  # the failed load never held memory
    steward = replay(scenario, make_policy("steward", scenario))
    assert all(r.latency is not None for r in steward.records)  # evicts first, then loads


def test_keepalive_unloads_a_model_keep_alive_after_its_last_request() -> None:
    stops: list[float] = []

    def record_stops(run: Replay) -> None:
        if run.gpu.engines["m"].state is CardState.STOPPING and run.now not in stops:
            stops.append(run.now)

    scenario = tiny({"m": engine()}, {"sometimes": client("m", think="50s")}, duration="200s",
                    baselines={"keep_alive": "10s"})
    run = watched(scenario, "keepalive", record_stops)
    finished = [r.arrival + r.latency for r in run.records if r.latency is not None]
    assert len(finished) >= 3
    assert stops[:len(finished)] == pytest.approx([t + 10.0 for t in finished])
    assert run.unnecessary_loads == run.loads - 1  # every reload follows a timer's eviction


def test_keepalive_loads_one_model_at_a_time_and_evicts_past_max_loaded() -> None:
    loading: list[int] = []
    run = watched(tiny(THREE_MODELS, ROUND_ROBIN, baselines={"max_loaded": 2}), "keepalive",
                  lambda r: loading.append(sum(e.state is CardState.LOADING for e in r.gpu.engines.values())))
    assert max(loading) == 1
    assert run.unnecessary_loads > 0


def test_fifo_serves_in_arrival_order_where_steward_serves_interactive_first() -> None:
    scenario = tiny({"m": engine(pinned=True)}, {"chat": client("m")})
    orders = {}
    for name in ("fifo", "steward"):
        policy = make_policy(name, scenario)
        policy.start(0.0)
        policy.submit(1, "m", "batch", 0.5)
        policy.submit(2, "m", "interactive", 1.0)
        effects = policy.engine_ready("m", 1, "sim://m", 2.0)
        effects += policy.finish(next(e.job_id for e in effects if isinstance(e, Grant)), 3.0)
        effects += policy.tick(5.0)  # steward: the interactive window closes 2 s after the chat
        orders[name] = [e.job_id for e in effects if isinstance(e, Grant)]
    assert orders == {"fifo": [1, 2], "steward": [2, 1]}


def test_baselines_time_out_waiting_requests_with_the_class_patience() -> None:
    scenario = tiny({"m": engine()}, {"chat": client("m")}, classes={"interactive": {"queue_timeout": "5s"}})
    policy = make_policy("swap", scenario)
    policy.submit(1, "m", "interactive", 0.0)  # loading: ready at 2, but nobody says so
    assert policy.next_wakeup() == 5.0
    assert [e.code for e in policy.tick(5.0) if isinstance(e, Fail)] == ["queue_timeout"]


# ---- the default scenario and the report -----------------------------------------------

def test_default_scenario_steward_completes_every_class_without_errors_or_unnecessary_loads() -> None:
    report = simulate(default_scenario(), ["steward"])
    steward = report.policies["steward"]
    assert all(stats.completed > 0 for stats in steward.classes.values())
    assert steward.errors == 0
    assert steward.unnecessary_loads == 0
    assert steward.peak_memory_bytes <= default_scenario().gpu.memory
    assert report.wall_s < 5.0  # five virtual minutes, all per step: well under a second in practice


def test_json_output_is_one_object_of_the_documented_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"scenario", "seed", "policies", "interactive_alone", "targets"}
    assert (report["scenario"], report["seed"]) == ("gridcore", 1)
    assert list(report["policies"]) == list(DEFAULT_POLICIES)
    for result in report["policies"].values():
        assert set(result) == {"classes", "loads", "unnecessary_loads", "peak_memory_bytes", "loads_per_100",
                               "busy_share", "fallbacks"}
        assert list(result["classes"]) == ["interactive", "background", "batch"]
        for stats in result["classes"].values():
            assert set(stats) == {"completed", "p50_s", "p95_s", "max_s", "errors", "wait_p50_s", "wait_p95_s",
                                  "wait_max_s", "overtake_max_s"}
    assert set(report["interactive_alone"]) == {"p50_s", "p95_s", "idle_s", "lower_room"}
    assert all(set(t) == {"what", "verdict", "detail"} and t["verdict"] in ("PASS", "MISS", "SKIP")
               for t in report["targets"])


def test_table_output_names_each_policy_and_the_targets(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--policies", "steward,swap"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[2].split() == ["steward", "swap"]  # the policies side by side
    assert "interactive alone" in out
    assert "zero unnecessary loads" in out and ("PASS" in out or "MISS" in out)


def test_cli_refuses_unknown_policies_and_names_the_key_of_a_bad_scenario(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--policies", "steward,random"]) == 2
    assert "unknown random" in capsys.readouterr().err
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"gpu": {"memory": "16GiB"}, "engines": {"m": engine(sped=3)},
                                    "clients": {"chat": client("x", think={"min": "3s", "max": "1s"})}}))
    assert main(["simulate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "engines.m.sped: unknown key" in err
    assert "clients.chat.think: must have min <= max" in err


def test_scenario_problems_name_their_key_path() -> None:
    with pytest.raises(ConfigError) as caught:
        tiny({"m": engine(20)}, {"chat": client("x", "urgent"), "docs": client("m", inputs=8, output_tokens=5)})
    problems = "\n".join(caught.value.problems)
    assert "clients.chat.class: must be one of" in problems
    with pytest.raises(ConfigError) as caught:
        tiny({"m": engine(20)}, {"chat": client("x"), "docs": client("m", inputs=8, output_tokens=5)},
             gpu={"memory": "16GiB", "sharing": {"batching_gain": 2}})
    assert caught.value.problems == [
        "gpu.sharing.batching_gain: must be between 0 and 1, got 2.0",
        "engines.m.memory: 21474836480 bytes is more than gpu.memory (17179869184 bytes); it could never load",
        "clients.chat.model: 'x' is not under engines",
        "clients.docs.output_tokens: an embeddings client (inputs set) generates no tokens",
    ]


def test_lower_class_generations_are_cut_into_step_tokens_steps_as_the_gateway_cuts_them() -> None:
    """scheduler.step_tokens: a background or batch generation is steps of N tokens out, the
    prompt read in the first (the later ones continue from the cached prompt); chats never."""
    from supervisor.tools.simulate.workload import StepWork, make_clients
    clients = {"chat": client("m", output_tokens=20), "agent": client("m", "background", output_tokens=20)}
    # 64 prompt tokens at 64/s: 1 s, read in the first step; 20 tokens out at 8/s: 2.5 s
    for step_tokens, agent_steps in [(0, [StepWork(1 + 2.5, 1)]),
                                     (8, [StepWork(1 + 1, 1), StepWork(1), StepWork(0.5)]),
                                     (20, [StepWork(1 + 2.5, 1)])]:
        scenario = tiny({"m": engine()}, clients, scheduler={"step_tokens": step_tokens})
        chat, agent = make_clients(scenario)
        assert chat.draw_steps() == [StepWork(1 + 2.5, 1)]
        assert agent.draw_steps() == agent_steps
    # A prompt's first tokens still cached in the slot are not read again: 16 of 64.
    scenario = tiny({"m": engine()}, {"chat": client("m", output_tokens=20, cached_prompt_tokens=16)})
    [chat] = make_clients(scenario)
    assert chat.draw_steps() == [StepWork(0.75 + 2.5, 0.75)]
    with pytest.raises(ConfigError) as caught:
        tiny({"m": engine()}, {"chat": client("m", cached_prompt_tokens=-1)})
    assert caught.value.problems == ["clients.chat.cached_prompt_tokens: must not be negative, got -1"]


def test_each_token_costs_more_the_deeper_it_sits_in_the_context() -> None:
    """An engine's context costs (steward calibrate): reading a prompt's token at position x
    costs 1/prompt_speed + prompt_context_cost * x, decoding one at context x 1/speed +
    decode_context_cost * x; an embeddings input reads at embedding_speed."""
    from supervisor.tools.simulate.workload import StepWork, make_clients
    costly = engine(prompt_context_cost=1 / 2048, decode_context_cost=1 / 1480, embedding_speed=128)
    clients = {"chat": client("m", output_tokens=20), "agent": client("m", "background", output_tokens=20),
               "docs": client("m", "batch", inputs=3, chunk=2, output_tokens=0)}
    # Reading 64 tokens: 1 s + (1/2048) * 64**2 / 2 = 2 s. Decoding 20 after 64: 2.5 s +
    # (1/1480) * (84**2 - 64**2) / 2 = 3.5 s.
    chat, agent, docs = make_clients(tiny({"m": costly}, clients, scheduler={"step_tokens": 8}))
    assert chat.draw_steps() == [StepWork(pytest.approx(2 + 3.5), pytest.approx(2))]
    # Cut into 8 + 8 + 4 tokens out, each at its own depth: the same 3.5 s in all.
    steps = agent.draw_steps()
    assert [s.seconds for s in steps] == pytest.approx([2 + 1 + 544 / 1480, 1 + 608 / 1480, 0.5 + 328 / 1480])
    assert docs.draw_steps() == [StepWork(1.0, 1.0), StepWork(0.5, 0.5)]  # 64 tokens an input at 128/s
    # The first 16 tokens cached: reading from 16 to 64, 0.75 s + (64**2 - 16**2) / 4096.
    [cached] = make_clients(tiny({"m": costly}, {"chat": client("m", output_tokens=20, cached_prompt_tokens=16)}))
    assert cached.draw_steps()[0].prefill == pytest.approx(0.75 + 3840 / 4096)
    with pytest.raises(ConfigError) as caught:
        tiny({"m": engine(decode_context_cost=-1)}, {"chat": client("m")})
    assert caught.value.problems == ["engines.m.decode_context_cost: must not be negative, got -1.0"]


def test_a_calibration_carries_how_prompts_share_into_the_scenario(tmp_path: Path) -> None:
    import json

    from supervisor.engines.measurements import HOST_KEY
    from supervisor.tools.simulate.scenario import Calibration

    inline = tiny({"m": engine()}, {"chat": client("m")},
                  calibration={"alpha": 0.0, "prefill_alpha": 0.5, "prefill_batching_gain": 0.0})
    sharing = inline.gpu.sharing
    assert (sharing.alpha, sharing.batching_gain, sharing.prefill_alpha, sharing.prefill_batching_gain) == (
        0.0, 0.5, 0.5, 0.0)  # the decoding gain kept
    state = tmp_path / "state.json"
    state.write_text(json.dumps({HOST_KEY: {"alpha": 0.0, "batching_gain": 0.5, "cores": 2, "prefill_alpha": 0.3,
                                            "prefill_batching_gain": 0.05}}))
    calibration = Calibration.from_state_file(state)
    assert (calibration.prefill_alpha, calibration.prefill_batching_gain) == (0.3, 0.05)
    assert "prompts: alpha 0.3; prompts: batching gain 0.05" in calibration.describe()
    with pytest.raises(ConfigError) as caught:
        tiny({"m": engine()}, {"chat": client("m")}, calibration={"prefill_batching_gain": 2})
    assert "calibration.prefill_batching_gain: must be between 0 and 1, got 2.0" in caught.value.problems
