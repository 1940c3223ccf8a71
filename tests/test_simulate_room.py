"""room.py: how many lower-class requests the chats' idle time could hold, and where the
report shows it. Work and rates are exact binary fractions, so the assertions are equalities."""

from __future__ import annotations

import json

import attrs
import pytest

from supervisor.cli import main
from supervisor.tools.simulate import simulate
from supervisor.tools.simulate.policies import make_policy
from supervisor.tools.simulate.room import lower_rate, lower_room, mean_work
from supervisor.tools.simulate.runner import replay
from supervisor.tools.simulate.scenario import builtin_scenario
from supervisor.tools.simulate.targets import GRIDCORE_BASE, GRIDCORE_GAIN
from tests.test_simulate import client, engine, tiny


def test_a_request_s_mean_work_is_its_mean_prompt_and_output_at_the_engine_s_speeds() -> None:
    scenario = tiny({"m": engine()}, {"agent": client("m", "background", prompt_tokens={"min": 32, "max": 96},
                                                       output_tokens={"min": 4, "max": 12})})
    # 64 prompt tokens at 64/s and 8 output tokens at 8/s.
    assert mean_work(scenario.clients["agent"], scenario.engines["m"]) == 2.0


def test_an_embeddings_request_s_mean_work_is_all_its_inputs_prompts() -> None:
    index = client("e", "background", inputs=8, prompt_tokens=16)
    del index["output_tokens"]
    scenario = tiny({"e": engine()}, {"index": index})
    assert mean_work(scenario.clients["index"], scenario.engines["e"]) == 8 * 16 / 64


def test_the_rate_is_the_best_engine_with_all_its_slots_batched_on_an_even_split_card() -> None:
    engines = {"chat": engine(), "a": engine(slots=2), "b": engine()}
    clients = {"chat": client("chat"), "agent": client("a", "background"), "job": client("b", "batch")}
    scenario = tiny(engines, clients, gpu={"memory": "16GiB", "sharing": {"alpha": 1.0, "batching_gain": 0.5}})
    # a: two slots do 1.5 x one slot's work, of 2 s requests; both engines at once get half the card each.
    assert lower_rate(scenario) == 1.5 / 2
    overlapping = tiny(engines, clients, gpu={"memory": "16GiB", "sharing": {"alpha": 0.0, "batching_gain": 0.5}})
    assert lower_rate(overlapping) == 1.5 / 2 + 1 / 2  # alpha 0: engines at once lose nothing
    assert lower_room(scenario, 8.0) == 6.0


def test_no_lower_class_client_means_no_room_to_tell() -> None:
    scenario = tiny({"m": engine()}, {"chat": client("m")})
    assert lower_room(scenario, 10.0) is None
    assert simulate(scenario, ["steward"]).interactive_alone.lower_room is None


def test_the_report_measures_the_idle_time_from_the_chats_replayed_alone() -> None:
    scenario = tiny({"chat": engine(), "a": engine(slots=2)},
                    {"chat": client("chat", think="3s"), "agent": client("a", "background")}, duration="40s")
    alone = replay(scenario.only("interactive"), make_policy("steward", scenario))
    idle = round(scenario.duration * (1 - alone.busy_share), 3)
    assert 0 < idle < scenario.duration
    report = simulate(scenario, ["steward"])
    assert report.interactive_alone.idle_s == idle
    assert report.interactive_alone.lower_room == round(idle * lower_rate(scenario), 1)


def test_the_table_and_the_json_show_the_room(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--policies", "steward"]) == 0
    out = capsys.readouterr().out
    assert "the GPU idle beside them" in out and "lower-class requests that slow no chat" in out
    assert main(["simulate", "--policies", "steward", "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)["interactive_alone"]
    assert set(alone) == {"p50_s", "p95_s", "idle_s", "lower_room"} and alone["lower_room"] > 0
    assert main(["simulate", "--policies", "steward", "--seeds", "1-2"]) == 0
    header = capsys.readouterr().out.splitlines()[3].split()
    assert header[4:6] == ["idle", "s"] and header[6] == "room"


@pytest.mark.parametrize("seed", sorted(GRIDCORE_BASE))
def test_gridcore_s_chats_leave_room_for_fewer_lower_requests_than_its_throughput_targets_ask(seed: int) -> None:
    # The reason the two throughput targets are missed on every seed (docs/simulator.md): no
    # scheduler meets them without slowing the chats.
    report = simulate(attrs.evolve(builtin_scenario("gridcore"), seed=seed), ["steward"])
    room = report.interactive_alone.lower_room
    assert room is not None and room < GRIDCORE_GAIN * sum(GRIDCORE_BASE[seed])
    detail = next(t.detail for t in report.targets() if t.what.startswith("background completed"))
    assert f"room for at most {room:.0f} lower-class requests" in detail
