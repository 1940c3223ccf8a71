"""steward simulate and swaps (issue 16): the collate baseline, the wait, overtake, loads
per 100 requests and GPU-busy metrics, the built-in scenarios, the targets and --seeds.

The small scenarios use work and load times that are exact binary fractions, so the
virtual times asserted are equalities.
"""

from __future__ import annotations

import json
import types

import attrs
import pytest

from supervisor.cli import main
from supervisor.scheduler.types import StopEngine
from supervisor.tools.simulate import BUILTIN_SCENARIOS, builtin_scenario, parse_seeds, simulate
from supervisor.tools.simulate.gpu import CardState
from supervisor.tools.simulate.metrics import PolicyResult, largest_overtake
from supervisor.tools.simulate.policies import DEFAULT_POLICIES, make_policy, strict_arrival_order
from supervisor.tools.simulate.runner import Outcome, Record, Replay, Wait, replay
from supervisor.tools.simulate.scenario import Scenario, format_seeds, parse_scenario
from supervisor.tools.simulate.targets import Target, Verdict, targets_for, worst_case

GIB = 1024**3


def engine(gib: float) -> dict[str, object]:
    # 8 tokens/s and 64 prompt tokens/s: a request of 64 + 8 tokens is 2 s of work alone.
    return {"memory": f"{gib}GiB", "speed": 8, "prompt_speed": 64, "load_time": "2s", "stop_time": "0.5s"}


def once_at(model: str, start: str) -> dict[str, object]:
    """One client that asks once at *start* and not again within the run."""
    return {"model": model, "class": "background", "start": start, "think": "1000s", "prompt_tokens": 64,
            "output_tokens": 8}


def interleaved() -> Scenario:
    """A B C A B C, a tenth of a second apart, for three models of which only one fits."""
    models = "abcabc"
    clients = {f"{m}{i}": once_at(m, f"{i / 10}s") for i, m in enumerate(models)}
    raw = {"gpu": {"memory": "16GiB"}, "duration": "60s", "clients": clients,
           "engines": {m: engine(10) | {"slots": 1} for m in "abc"}}
    return parse_scenario(raw, "interleaved")


# ---- the collate baseline ----------------------------------------------------------------

def test_collate_serves_a_b_c_a_b_c_as_a_a_b_b_c_c() -> None:
    outcome = replay(interleaved(), make_policy("collate", interleaved()))
    # Request ids are in arrival order: 1 a, 2 b, 3 c, 4 a, 5 b, 6 c. a loads 0-2; a a run
    # 2-4-6; a is idle, so it stops (6-6.5); b loads 6.5-8.5, b b run 8.5-10.5-12.5; then c.
    started = {w.request: w.started for w in outcome.waits}
    assert started == {1: 2.0, 4: 4.0, 2: 8.5, 5: 10.5, 3: 15.0, 6: 17.0}
    assert outcome.loads == 3
    finished = sorted(r.arrival + r.latency for r in outcome.records if r.latency is not None)
    assert finished == [4.0, 6.0, 10.5, 12.5, 17.0, 19.0]


def test_collate_never_evicts_a_model_with_requests_in_flight() -> None:
    scenario = interleaved()
    policy = make_policy("collate", scenario)
    policy.start(0.0)
    policy.submit(1, "a", "background", 0.0)
    policy.engine_ready("a", 1, "sim://a", 2.0)  # 1 runs on a
    policy.submit(2, "b", "background", 2.5)
    assert policy.tick(100.0) == []  # b waits as long as a is busy: nothing to stop
    assert [e.engine for e in policy.finish(1, 101.0) if isinstance(e, StopEngine)] == ["a"]


def test_collate_keeps_models_together_while_they_fit() -> None:
    scenario = attrs.evolve(interleaved(), engines={m: attrs.evolve(e, memory=4 * GIB)
                                                    for m, e in interleaved().engines.items()})
    loading: list[int] = []

    def count_loads(run: Replay) -> None:
        loading.append(sum(e.state is CardState.LOADING for e in run.gpu.engines.values()))

    run = Replay.create(scenario, make_policy("collate", scenario), watch=count_loads)
    outcome = run.run()
    assert (outcome.loads, max(loading)) == (3, 1)  # one swap at a time
    assert all(e.state is CardState.READY for e in run.gpu.engines.values())  # none evicted
    started = {w.request: w.started for w in outcome.waits}
    assert [started[r] for r in (1, 2, 3)] == [2.0, 4.0, 6.0]  # a loads 0-2, b 2-4, c 4-6


# ---- the metrics -------------------------------------------------------------------------

def wait(request: int, arrival: float, started: float | None, until: float | None = None,
         klass: str = "background", load_decided: float | None = None) -> Wait:
    return Wait(request, klass, arrival, started, started if until is None else until, load_decided)


def test_the_largest_overtake_is_the_longest_wait_after_a_younger_request_started() -> None:
    # No load decided for any of them (their models were ready or loading when they came).
    waits = [
        wait(1, 0.0, 10.0),  # 2 started at 2 while 1 waited until 10: 8 s
        wait(2, 1.0, 2.0),  # the younger 3 started after it: not overtaken
        wait(3, 3.0, 4.0),
        wait(4, 5.0, None, until=20.0),  # never started (failed at 20); 5 started at 7: 13 s
        wait(5, 6.0, 7.0),
    ]
    assert largest_overtake(waits) == 13.0
    assert largest_overtake(waits[:3]) == 8.0
    assert largest_overtake([wait(1, 0.0, 1.0), wait(2, 0.5, 1.5)]) == 0.0  # arrival order kept
    assert largest_overtake([]) is None


def test_the_load_decision_ends_the_overtake() -> None:
    # 1 came with its model off the card; 2 (loaded model) started at 2; 1's load was
    # decided at 5 (the hold ended), then the drain, stop and load until 10 are not counted.
    assert largest_overtake([wait(1, 0.0, 10.0, load_decided=5.0), wait(2, 1.0, 2.0)]) == 3.0
    # Decided before any younger start: it was never held back, whatever the swap took.
    assert largest_overtake([wait(1, 0.0, 10.0, load_decided=0.5), wait(2, 1.0, 2.0)]) == 0.0
    # Never started (failed at 20) and its load decided at 12: held back from 2 until 12.
    assert largest_overtake([wait(1, 0.0, None, until=20.0, load_decided=12.0), wait(2, 1.0, 2.0)]) == 10.0
    # The decision only ends the overtake: a start before it still ends it first.
    assert largest_overtake([wait(1, 0.0, 4.0, load_decided=9.0), wait(2, 1.0, 2.0)]) == 2.0


@pytest.mark.parametrize(("policy", "decided"), [
    # collate says nothing about its evictions: a's stop at 6 is room for b (the oldest
    # request held), b's stop at 12.5 room for c.
    ("collate", {1: 0.0, 2: 6.0, 3: 12.5, 4: None, 5: 6.0, 6: 12.5}),
    # fifo (the core in strict order) names the load each eviction is for: b's for c at
    # 6.5, when b took its one request and began to drain (stopped at 8.5).
    ("fifo", {1: 0.0, 2: 2.0, 3: 6.5, 4: None, 5: 2.0, 6: 6.5}),
])
def test_a_replay_records_when_the_load_of_each_held_back_request_was_decided(
        policy: str, decided: dict[int, float | None]) -> None:
    outcome = replay(interleaved(), make_policy(policy, interleaved()))
    # 4 came for a while a was loading: never held back by a swap.
    assert {w.request: w.load_decided for w in outcome.waits} == decided


def test_only_a_younger_request_of_the_same_class_overtakes() -> None:
    records = (Record("background", 0.0, 12.0), Record("interactive", 1.0, 2.0), Record("background", 2.0, 1.0))
    waits = (wait(1, 0.0, 10.0), wait(2, 1.0, 1.5, klass="interactive"), wait(3, 2.0, 2.5))
    result = PolicyResult.of(Outcome(records, waits, loads=3, unnecessary_loads=0, peak_memory=0, busy_share=0.5))
    background, interactive = result.classes["background"], result.classes["interactive"]
    assert background.overtake_max_s == 7.5  # by 3 at 2.5, not by the interactive 2 at 1.5
    assert interactive.overtake_max_s == 0.0
    assert (background.wait_p50_s, background.wait_p95_s, background.wait_max_s) == (0.5, 10.0, 10.0)
    assert result.loads_per_100 == 100.0  # 3 loads, 3 requests completed
    assert result.classes["batch"].overtake_max_s is None


def test_loads_per_100_requests_and_gpu_busy_share_of_a_replay() -> None:
    outcome = replay(interleaved(), make_policy("collate", interleaved()))
    result = PolicyResult.of(outcome)
    assert result.loads_per_100 == 50.0  # 3 loads for 6 requests
    assert result.busy_share == 12.0 / 60.0  # six steps of 2 s each in 60 s; loads and stops are not busy
    stats = result.classes["background"]
    # The second c waited longest (0.5 to 17); the first c was overtaken longest: from 4,
    # when the second a started, until 12.5, when b's stop made room for c.
    assert (stats.wait_max_s, stats.overtake_max_s) == (16.5, 8.5)


def test_waits_count_requests_that_never_started() -> None:
    scenario = attrs.evolve(interleaved(), duration=9.0)  # b's first step would start at 8.5, c's never
    outcome = replay(scenario, make_policy("collate", scenario))
    assert {w.request: (w.started, w.until) for w in outcome.waits} == {
        1: (2.0, 2.0), 2: (8.5, 8.5), 3: (None, 9.0), 4: (4.0, 4.0), 5: (None, 9.0), 6: (None, 9.0)}


# ---- the built-in scenarios and the targets ------------------------------------------------

def test_the_built_in_scenarios_have_the_room_they_promise() -> None:
    thrash, family = builtin_scenario("thrash"), builtin_scenario("family")
    sizes = sorted(e.memory for e in thrash.engines.values())
    assert len(sizes) == 3 and sum(sizes[-2:]) <= thrash.gpu.memory < sum(sizes)  # any two, never three
    assert {c.model for c in thrash.clients.values()} == set(thrash.engines)  # each agent its own model
    assert len({c.klass for c in thrash.clients.values()}) == 1
    large = max(family.engines.values(), key=lambda e: e.memory)
    assert large.memory + max(e.memory for e in family.engines.values() if e is not large) <= family.gpu.memory
    assert sum(e.memory for e in family.engines.values()) > family.gpu.memory
    assert builtin_scenario("gridcore") == builtin_scenario(BUILTIN_SCENARIOS[0])


def test_fifo_is_strict_arrival_order_where_the_config_has_swap_aware_order() -> None:
    strict = strict_arrival_order(builtin_scenario("thrash").scheduler)
    assert getattr(strict, "swap_hold", 0.0) == 0.0


def test_thrash_targets_compare_with_fifo_and_collate_and_need_a_swap_hold() -> None:
    report = simulate(builtin_scenario("thrash"))
    whats = [t.what for t in report.targets()]
    assert whats == ["loads per 100 requests <= 0.5 x fifo's", "loads per 100 requests <= collate's",
                     "background p95 wait <= collate's", "no request overtaken longer than scheduler.swap_hold"]
    unconfigured = attrs.evolve(report, scenario=attrs.evolve(report.scenario, scheduler=types.SimpleNamespace()))
    hold = targets_for(unconfigured)[-1]
    assert hold.verdict is Verdict.MISS and hold.detail.startswith("swap_hold not configured")
    alone = simulate(builtin_scenario("thrash"), ["steward"])
    assert [t.verdict for t in alone.targets()][:3] == [Verdict.SKIP] * 3  # fifo and collate not replayed


def test_family_and_gridcore_targets() -> None:
    family = simulate(attrs.evolve(builtin_scenario("family"), duration=60.0))
    assert [t.what for t in family.targets()] == [
        "interactive p95 <= 1.3 x alone", "loads per 100 requests < fifo's", "loads per 100 requests < lru-count's"]
    gridcore = simulate(attrs.evolve(builtin_scenario("gridcore"), duration=60.0, seed=9), ["steward"])
    background = next(t for t in gridcore.targets() if t.what == "background completed >= 2x BASE")
    assert "at least 24" in background.detail and "seed 9 was not measured" in background.detail


def test_a_target_over_several_seeds_is_met_only_if_met_on_every_seed() -> None:
    def bound(verdict: Verdict, shortfall: float = 0.0) -> list[Target]:
        return [Target("p95 bound", verdict, f"short by {shortfall}", shortfall)]
    combined = worst_case([bound(Verdict.PASS), bound(Verdict.MISS, 0.1), bound(Verdict.MISS, 0.3)], [1, 2, 3])
    assert combined == [Target("p95 bound", Verdict.MISS,
                               "missed on 2 of 3 seeds (2-3); worst, seed 3: short by 0.3", 0.3)]
    assert worst_case([bound(Verdict.PASS)] * 2, [1, 2])[0].detail == "met on every seed (1-2)"
    assert worst_case([bound(Verdict.SKIP)] * 2, [1, 2])[0].verdict is Verdict.SKIP


def test_seeds_are_parsed_and_formatted_as_ranges() -> None:
    assert parse_seeds("1-8") == [1, 2, 3, 4, 5, 6, 7, 8]
    assert parse_seeds("3, 1,2-4") == [3, 1, 2, 4]
    assert format_seeds([1, 2, 3, 5, 7, 8]) == "1-3, 5, 7-8"
    for bad in ("", "one", "8-1", "1-"):
        with pytest.raises(ValueError):
            parse_seeds(bad)


# ---- the command ---------------------------------------------------------------------------

def test_simulate_thrash_json_has_every_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--scenario", "thrash", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["scenario"], list(report["policies"])) == ("thrash", list(DEFAULT_POLICIES))
    assert "collate" in report["policies"]
    for result in report["policies"].values():
        assert 0.0 <= result["busy_share"] <= 1.0
        assert result["classes"]["background"]["wait_p95_s"] is not None
    assert len(report["targets"]) == 4


def test_simulate_all_runs_the_built_in_scenarios_one_after_another(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--scenario", "all", "--json", "--policies", "steward,fifo"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["scenario"] for r in report["scenarios"]] == list(BUILTIN_SCENARIOS)
    assert main(["simulate", "--scenario", "all", "--policies", "steward"]) == 0
    out = capsys.readouterr().out
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("scenario ")] == [
        "scenario gridcore", "scenario thrash", "scenario family", "scenario pressure"]


def test_seeds_print_one_row_per_seed_and_the_targets_on_every_seed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--scenario", "thrash", "--seeds", "1-2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("scenario thrash, seeds 1-2: 600 s of virtual time each")
    assert [line.split()[0] for line in lines[4:6]] == ["1", "2"]
    assert "steward targets on every seed" in lines
    assert main(["simulate", "--scenario", "thrash", "--seeds", "1-2", "--json"]) == 0
    sweep = json.loads(capsys.readouterr().out)
    assert (sweep["seeds"], [r["seed"] for r in sweep["runs"]]) == ([1, 2], [1, 2])
    assert len(sweep["targets"]) == 4


@pytest.mark.parametrize(("argv", "message"), [
    (["--scenario", "thrashing"], "steward: --scenario: no built-in scenario 'thrashing'; choose from gridcore, "
                                  "thrash, family, pressure or all"),
    (["some.yaml", "--scenario", "thrash"], "steward: simulate takes a scenario file or --scenario NAME, not both"),
    (["--seeds", "8-1"], "steward: --seeds: '8-1' counts down; write the smaller seed first"),
    (["--seeds", "all"], "steward: --seeds: expected seeds like 1-8 or 1,3,5, got 'all'"),
])
def test_bad_scenario_names_and_seeds_get_a_clear_error(argv: list[str], message: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(message) and captured.out == ""
