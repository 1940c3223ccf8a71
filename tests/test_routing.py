"""The front door's routing rules and a node's state document: pure, no network."""

from __future__ import annotations

import pytest

from supervisor.observe.health import Health, HealthStatus
from supervisor.nodes.routing import (
    Availability,
    NodeView,
    NoRoute,
    Route,
    RouteReason,
    Wake,
    choose_node,
    resolve_capability,
)
from supervisor.nodes.state import (
    DeviceState,
    ModelState,
    NodeState,
    NodeStateError,
    node_state,
    parse_node_state,
    state_to_json,
)
from supervisor.scheduler.core import Scheduler
from supervisor.scheduler.types import EngineProfile

GIB = 1024**3


def model(name: str, status: str = "stopped", memory: float = 8, *, hot: bool = False, in_flight: int = 0,
          pinned: bool = False) -> ModelState:
    return ModelState(name, status, int(memory * GIB), 2, in_flight, 0, pinned, hot)


def node(name: str, *models: ModelState, free: float = 0, budget: float = 24, queued: int = 0,
         availability: Availability = Availability.AWAKE) -> NodeView:
    reserved = int((budget - free) * GIB)
    state = NodeState(1, name, models, (DeviceState("gpu0", int(budget * GIB), reserved, 0),),
                      {"interactive": queued, "background": 0, "batch": 0}, "ok")
    return NodeView(name, availability, frozenset(m.name for m in models),
                    state if availability is Availability.AWAKE else None)


def test_a_node_where_the_model_is_resident_comes_first() -> None:
    nodes = [node("big", model("qwen"), free=20), node("small", model("qwen", "ready"), free=0, queued=5)]
    assert choose_node("qwen", nodes) == Route("small", "qwen", RouteReason.RESIDENT)


def test_then_one_where_it_fits_without_evicting_hot_work() -> None:
    hot_full = node("big", model("qwen"), model("chat", "ready", 16, hot=True), free=8 - 1)
    cold_full = node("small", model("qwen"), model("old", "ready", 16), free=0, queued=3)
    assert choose_node("qwen", [hot_full, cold_full]) == Route("small", "qwen", RouteReason.FITS)
    busy_cold = node("small", model("qwen"), model("old", "ready", 16, in_flight=1), free=0)
    assert choose_node("qwen", [hot_full, busy_cold]).reason is RouteReason.LEAST_LOADED  # type: ignore[union-attr]


def test_then_the_least_loaded_and_ties_go_to_the_first_in_the_config() -> None:
    a = node("a", model("qwen"), queued=4)
    b = node("b", model("qwen"), queued=1)
    c = node("c", model("qwen"), queued=1)
    assert choose_node("qwen", [a, b, c]) == Route("b", "qwen", RouteReason.LEAST_LOADED)
    both = [node("x", model("qwen", "ready")), node("y", model("qwen", "ready"))]
    assert choose_node("qwen", both) == Route("x", "qwen", RouteReason.RESIDENT)


def test_a_sleeping_node_is_woken_only_when_no_awake_node_serves_the_model() -> None:
    asleep = node("big", model("qwen"), availability=Availability.ASLEEP)
    awake = node("small", model("qwen"))
    assert choose_node("qwen", [asleep, awake]) == Route("small", "qwen", RouteReason.LEAST_LOADED)
    assert choose_node("qwen", [asleep, node("small", model("chat"))]) == Wake("big", "qwen", already=False)
    waking = node("big", model("qwen"), availability=Availability.WAKING)
    assert choose_node("qwen", [waking]) == Wake("big", "qwen", already=True)
    down = node("big", model("qwen"), availability=Availability.DOWN)
    assert isinstance(choose_node("qwen", [down]), NoRoute)
    assert choose_node("nope", [awake]) == NoRoute("nope", "no node serves the model 'nope'")


def test_a_capability_is_its_first_resident_model_then_the_first_that_fits_then_the_first() -> None:
    capabilities = {"reasoning": ["qwen3-32b", "qwen3-8b"]}
    resident_second = [node("a", model("qwen3-32b", memory=20), model("qwen3-8b", "ready"), free=0)]
    assert resolve_capability("reasoning", capabilities, resident_second) == "qwen3-8b"
    # The first cannot fit (a hot model holds the card); the second can: its second choice serves.
    hot = [node("a", model("qwen3-32b", memory=20), model("qwen3-8b", memory=6),
                model("chat", "ready", 14, hot=True), free=10)]
    assert resolve_capability("reasoning", capabilities, hot) == "qwen3-8b"
    nothing_fits = [node("a", model("qwen3-32b", memory=30), model("qwen3-8b", memory=30), free=10)]
    assert resolve_capability("reasoning", capabilities, nothing_fits) == "qwen3-32b"
    assert resolve_capability("qwen3-8b", capabilities, hot) is None  # a model name is no capability


async def test_a_node_describes_itself_and_a_front_door_reads_it_back() -> None:
    core = Scheduler.create(24 * GIB, [EngineProfile("chat", 8 * GIB, slots=2, pinned=True),
                                       EngineProfile("embed", GIB, slots=4)])
    health = Health(HealthStatus.DEGRADED, ("engine 'x' crashed 1 time(s) in the last 5m",), {}, {}, {})
    state = node_state(core.snapshot(), health, {"chat": "chat", "gpt-4o": "chat", "embed": "embed"}, "gpu", "lab")
    assert state.model("gpt-4o") == state.model("chat")
    assert state.devices == (DeviceState("gpu0", 24 * GIB, 0, 0),) and state.free == 24 * GIB
    assert (state.health, state.node) == ("degraded", "lab")
    assert parse_node_state(state_to_json(state)) == state
    newer = {**state_to_json(state), "gpus_sold": 3}  # a newer node says more: read what we know
    assert parse_node_state(newer) == state


@pytest.mark.parametrize(("raw", "problem"), [
    ([], "not a JSON object"),
    ({"version": 2}, "schema version 2"),
    ({"version": 1, "node": "x"}, "models"),
])
def test_a_state_steward_cannot_read_is_one_line_that_says_why(raw: object, problem: str) -> None:
    with pytest.raises(NodeStateError) as caught:
        parse_node_state(raw)
    assert problem in str(caught.value) and "\n" not in str(caught.value)
