"""The front door's fleet view: each node's state and since when, its last poll, and the
requests held while a node wakes, with their deadline and why; in /admin/state, /healthz,
/metrics and ``steward top`` (its fleet and a node's own view, switched by keys).

The holds go through the router's own path (``NodeRouter.serve``) against a real directory.
Deadlines and cancellation run on ``MockClock(autojump_threshold=0)`` with a node that
cannot be reached (as test_node_directory does: every way of failing is the same silence);
a hold that ends because the node wakes runs on the real clock against a fake node on
loopback, switched on while the request is held.
"""

from __future__ import annotations

import contextlib
import functools
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from supervisor.gateway.admin import admin_state
from supervisor.gateway.door import Exchange
from supervisor.gateway.relay.upstream import Timeouts
from supervisor.gateway.remote import NodeRouter
from supervisor.gateway.routed import NotHere, RoutedRequest, route_request
from supervisor.nodes.directory import NodeSpec, serve_node_directory
from supervisor.nodes.fleet import fleet_json
from supervisor.nodes.held import HoldBound
from supervisor.observe.events import EventLog
from supervisor.observe.health import Health, HealthStatus
from supervisor.observe.metrics import StewardMetrics
from supervisor.scheduler.core import Scheduler
from supervisor.top.keys import ESCAPE
from supervisor.top.model import Top
from supervisor.top.view import Frame
from tests.conftest import free_port
from tests.test_node_directory import (GIB, open_event_log, switched_on, wait_event, wait_events, waking,
                                       wol_listener)  # noqa: F401 - a fixture
from tests.test_top import screen

WALL = 1_800_000_000.0
QUEUE_TIMEOUT = {"interactive": 120.0, "background": 600.0, "batch": 3600.0}
SCOPE = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
         "headers": [(b"content-type", b"application/json")]}


def chat_request(model: str = "qwen", klass: str = "interactive") -> RoutedRequest:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}],
                       "steward": {"class": klass}}).encode()
    routed = route_request(SCOPE, body, {})
    assert isinstance(routed, NotHere)
    return routed.request


@contextlib.asynccontextmanager
async def open_router(*nodes: NodeSpec) -> AsyncIterator[tuple[NodeRouter, EventLog]]:
    events = open_event_log()
    async with httpx.AsyncClient(trust_env=False) as http, trio.open_nursery() as nursery:
        directory = await nursery.start(functools.partial(serve_node_directory, nodes, http, events))
        wake_timeout = {spec.name: spec.wake.timeout for spec in nodes if spec.wake is not None}
        yield NodeRouter(directory, {}, events, QUEUE_TIMEOUT, wake_timeout, Timeouts(5.0, 5.0), http=http), events
        nursery.cancel_scope.cancel()


class Answer:
    """What the router sent back for one request."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.body = b""
        self.done = trio.Event()

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        else:
            self.body += message.get("body", b"")
            if not message.get("more_body"):
                self.done.set()


async def ask(router: NodeRouter, answer: Answer, klass: str = "interactive") -> None:
    await router.serve(SCOPE, chat_request(klass=klass), Exchange.arriving(SCOPE, "openai"), answer.send)


def asleep(name: str, wol: socket.socket, timeout: float = 30.0) -> NodeSpec:
    return NodeSpec(name, f"http://127.0.0.1:{free_port()}", wake=waking(wol, timeout), models=("qwen",), poll=2.0)


def metric_values(metrics: StewardMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(metrics.render().decode()) for sample in family.samples}


def front_door_state(router: NodeRouter) -> dict[str, Any]:
    """/admin/state of a front door with no engines of its own, at the router's moment."""
    fleet = router.fleet()
    s = Scheduler.create(GIB, [])
    health = Health(HealthStatus.OK, (), {}, {}, {})
    return json.loads(json.dumps(admin_state(s.snapshot(explained=True), health, [], "gpu", now=fleet.now,
                                             wall=WALL, fleet=fleet)))


async def test_a_held_request_says_its_node_deadline_and_why_until_it_gives_up(
        autojump_clock: trio.testing.MockClock, wol_listener: socket.socket) -> None:  # noqa: F811
    async with open_router(asleep("b", wol_listener, timeout=30.0)) as (router, events):
        metrics = StewardMetrics()
        metrics.watch_fleet(router.fleet)
        events.listeners.append(metrics.observe)
        answer = Answer()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, router, answer)
            await wait_event(events, "route_wait", node="b")
            held_at = trio.current_time()
            await trio.sleep(8.0)  # virtual: eight seconds into the wait
            fleet = router.fleet()
            [held] = fleet.held
            assert (held.node, held.model, held.klass, held.since) == ("b", "qwen", "interactive", held_at)
            assert (held.deadline, held.bound) == (held_at + 30.0, HoldBound.WAKE_TIMEOUT)  # before the queue's 120 s
            shown = fleet_json(fleet, WALL)
            assert shown["held"] == [{
                "request_id": held.request_id, "node": "b", "model": "qwen", "class": "interactive",
                "since": WALL - 8.0, "held_s": 8.0, "deadline": WALL + 22.0, "limit_s": 30.0, "bound": "wake_timeout",
                "why": "interactive request for qwen waits for node b to wake: 8s of 30s (the node's wake.timeout)"}]
            [node] = shown["nodes"]
            assert (node["name"], node["state"], node["since"], node["for_s"]) == ("b", "waking", WALL - 8.0, 8.0)
            assert node["last_poll"]["answered"] is False and node["last_poll"]["age_s"] < 0.5  # polled while waking
            assert (node["serves"], node["models"], node["held"], node["key_known"]) == (["qwen"], [], 1, False)
            assert (node["wake_timeout_s"], node["wake_deadline"]) == (30.0, WALL + 22.0)

            state = front_door_state(router)
            assert state["classes"]["interactive"]["held"] == 1 and state["classes"]["interactive"]["queued"] == 0
            [line] = state["waiting"]
            assert (line["class"], line["model"], line["node"], line["reason"], line["waited_s"]) == (
                "interactive", "qwen", "b", "node_waking", 8.0)
            assert line["why"] == shown["held"][0]["why"]

            values = metric_values(metrics)
            assert values["steward_node_state", (("node", "b"), ("state", "waking"))] == 1.0
            assert values["steward_node_state", (("node", "b"), ("state", "asleep"))] == 0.0
            assert values["steward_held_requests", (("node", "b"),)] == 1.0
            assert values["steward_node_last_poll_age_seconds", (("node", "b"),)] < 0.5
            assert values["steward_route_waits_total", (("node", "b"),)] == 1.0
            assert values["steward_node_wakes_total", (("node", "b"), ("outcome", "sent"))] == 1.0
            assert not [key for key in values if key[0] == "steward_node_free_bytes"]  # no memory read of a sleeper
        # It gave up at its deadline: 503, and nothing is held any more.
        assert answer.status == 503 and json.loads(answer.body)["error"]["code"] == "node_asleep"
        assert trio.current_time() == held_at + 30.0
        assert router.fleet().held == ()
        assert fleet_json(router.fleet(), WALL)["nodes"][0]["held"] == 0
        assert metric_values(metrics)["steward_held_requests", (("node", "b"),)] == 0.0


async def test_the_class_queue_timeout_bounds_a_hold_when_it_comes_first_and_a_cancelled_hold_is_gone(
        autojump_clock: trio.testing.MockClock, wol_listener: socket.socket) -> None:  # noqa: F811
    async with open_router(asleep("b", wol_listener, timeout=900.0)) as (router, events):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, router, Answer(), "background")
            await wait_event(events, "route_wait")
            await trio.sleep(5.0)
            nursery.start_soon(ask, router, Answer(), "background")
            await wait_events(events, "route_wait", 2)
            first, second = router.fleet().held
            assert (first.bound, first.limit, first.klass) == (HoldBound.QUEUE_TIMEOUT, 600.0, "background")
            assert fleet_json(router.fleet(), WALL)["held"][0]["why"].endswith(
                "waits for node b to wake: 5s of 10m (the class's queue timeout)")
            # One line of `waiting` for the two, as a local queue's: its oldest's wait, and how many.
            [line] = front_door_state(router)["waiting"]
            assert (line["waiting"], line["waited_s"], line["model"], line["node"]) == (2, 5.0, "qwen", "b")
            nursery.cancel_scope.cancel()  # the clients left, or steward stops
        assert router.fleet().held == ()


async def test_a_held_request_that_proceeds_is_no_longer_held_and_the_node_is_awake_since_then(
        nursery: trio.Nursery, wol_listener: socket.socket) -> None:  # noqa: F811
    fake = await switched_on(nursery)
    spec = NodeSpec("b", fake.url, key="node-key", wake=waking(wol_listener, 60.0), poll=0.05)
    async with open_router(spec) as (router, events):
        fake.switch_off()
        await wait_event(events, "node_state", node="b", availability="asleep")
        answer = Answer()
        async with trio.open_nursery() as asking:
            asking.start_soon(ask, router, answer)
            await wait_event(events, "route_wait")
            assert [held.node for held in router.fleet().held] == ["b"]
            await fake.switch_on(nursery)
            with trio.fail_after(60):
                await answer.done.wait()
        assert answer.status == 200  # the fake node answers every request with its state
        assert router.fleet().held == ()
        [node] = fleet_json(router.fleet(), WALL)["nodes"]
        woken = await wait_event(events, "node_woken")
        assert node["state"] == "awake" and node["key_known"] is True
        assert node["since"] == pytest.approx(WALL - (router.fleet().now - woken.mono), abs=0.01)
        assert node["models"][0]["name"] == "qwen" and node["devices"][0]["free_text"] == "23.0 GiB"
        assert node["last_poll"]["answered"] is True and node["health"] == "ok"


async def test_a_node_s_own_state_is_read_with_its_key_or_refused_in_a_sentence(nursery: trio.Nursery) -> None:
    fake = await switched_on(nursery)
    closed = free_port()
    async with open_router(NodeSpec("b", fake.url, key="node-key", poll=0.05),
                           NodeSpec("gone", f"http://127.0.0.1:{closed}", poll=0.05)) as (router, _):
        from supervisor.nodes.peek import PeekRefused

        with pytest.raises(PeekRefused) as not_a_state:  # the fake node's answer is a /steward/state document
            await router.peek("b")
        assert not_a_state.value.status == 502 and "not a steward's state" in not_a_state.value.message
        assert fake.requests[-1].headers.get("authorization") == "Bearer node-key"  # the node's key, not the caller's
        fake.status = 401
        with pytest.raises(PeekRefused) as refused:
            await router.peek("b")
        assert refused.value.code == "node_refused" and "refuses the front door's key" in refused.value.message
        with pytest.raises(PeekRefused) as gone:
            await router.peek("gone")
        assert gone.value.status == 503 and "cannot be reached" in gone.value.message
        with pytest.raises(PeekRefused) as unknown:
            await router.peek("nowhere")
        assert unknown.value.status == 404


# --- steward top on a front door ----------------------------------------------------------------

def fleet_state() -> dict[str, Any]:
    """A front door's /admin/state, written by hand: one node awake, one waking with a request held for it."""
    awake = {"name": "a", "url": "http://10.0.0.1:8080", "state": "awake", "since": WALL - 600, "for_s": 600.0,
             "detail": "answered", "last_poll": {"at": WALL - 0.4, "age_s": 0.4, "answered": True, "detail": "answered"},
             "as_of": WALL - 0.4, "serves": ["chat", "embed"],
             "models": [{"name": "chat", "status": "ready", "resident": True, "memory": 8 * GIB},
                        {"name": "embed", "status": "stopped", "resident": False, "memory": GIB}],
             "devices": [{"device": "gpu0", "budget": 24 * GIB, "free": 16 * GIB, "free_text": "16.0 GiB"}],
             "queued": {"interactive": 1, "background": 2, "batch": 0}, "in_flight": 1, "health": "ok",
             "health_reasons": [], "key_known": True, "wake_timeout_s": None, "wake_deadline": None, "held": 0}
    waking_node = {**awake, "name": "b", "state": "waking", "since": WALL - 8, "for_s": 8.0,
                   "last_poll": {"at": WALL - 0.2, "age_s": 0.2, "answered": False, "detail": "ConnectError"},
                   "serves": ["qwen"], "models": [], "devices": [], "queued": None, "in_flight": None, "health": None,
                   "key_known": False, "wake_timeout_s": 120.0, "wake_deadline": WALL + 112, "held": 1}
    why = "interactive request for qwen waits for node b to wake: 8s of 2m (the node's wake.timeout)"
    return {"version": 1, "time": WALL, "mode": "idle", "health": {"status": "ok", "reasons": []},
            "devices": [{"device": "gpu0", "budget": GIB, "reserved": 0, "outside": 0, "free": GIB,
                         "tiers": {"pinned": 0, "hot": 0, "cold": 0, "asleep": 0, "exclusive": 0}}],
            "engines": [],
            "classes": {"interactive": {"queued": 0, "running": 0, "oldest_wait_s": None, "held": 1},
                        "background": {"queued": 0, "running": 0, "oldest_wait_s": None, "held": 0},
                        "batch": {"queued": 0, "running": 0, "oldest_wait_s": None, "held": 0}},
            "waiting": [{"class": "interactive", "model": "qwen", "waiting": 1, "waited_s": 8.0,
                         "reason": "node_waking", "why": why, "node": "b"}],
            "nodes": [awake, waking_node],
            "held": [{"request_id": "r1", "node": "b", "model": "qwen", "class": "interactive", "since": WALL - 8,
                      "held_s": 8.0, "deadline": WALL + 112, "limit_s": 120.0, "bound": "wake_timeout", "why": why}],
            "rejections": [], "events": [{"ts": WALL - 8, "v": 1, "event": "route_wait", "level": "info", "node": "b",
                                          "model": "qwen", "class": "interactive"}]}


def test_top_on_a_front_door_shows_its_nodes_and_the_held_request_not_a_bar_of_its_own_budget() -> None:
    state = fleet_state()
    lines = screen(Frame("http://127.0.0.1:8080", state, state["events"]))
    assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
    assert not any("free of" in line for line in lines)  # no "1.0 GiB free of 1.0 GiB"
    assert lines[1].split() == ["#", "NODE", "STATE", "POLLED", "QUEUE", "RUN", "HEALTH", "FREE", "MODELS", "(*loaded)"]
    assert lines[2].split() == ["1", "a", "awake", "10m", "<1s", "3", "1", "ok", "gpu0", "16.0", "GiB", "chat*,",
                                "embed"]
    assert lines[3].split() == ["2", "b", "waking", "8s", "<1s", "✗", "-", "-", "-", "-", "qwen"]
    at = lines.index("interactive    0 queued    0 running    1 held for a node")
    assert lines[at + 1].startswith("      8s ×1   interactive request for qwen waits for node b to wake: 8s of 2m")
    assert any(line.endswith("1-9 node  p pause  e events  q quit") for line in lines)


def test_top_switches_to_a_node_s_own_view_with_its_key_and_back() -> None:
    top = Top("http://127.0.0.1:8080")
    top.saw_state(fleet_state())
    assert top.state_path() == "/admin/state"
    assert top.press("2") and top.node == "b" and top.state_path() == "/admin/nodes/b/state"
    frame = top.frame()
    assert frame.node == "b" and frame.state is None
    assert frame.problem == "the front door has no key for node b (nodes.b.key_env)"
    top.failed("http://127.0.0.1:8080/admin/nodes/b/state answered 503: node 'b' cannot be reached", node="b")
    top.failed("a failure of the fleet's own poll", node=None)
    assert top.frame().problem == ("http://127.0.0.1:8080/admin/nodes/b/state answered 503: node 'b' cannot be "
                                   "reached (the front door has no key for node b (nodes.b.key_env))")
    lines = screen(top.frame())
    assert lines[0].startswith("steward 127.0.0.1:8080 › node b")
    top.press("1")
    node_state = {**fleet_state(), "nodes": [], "held": [], "engines": [{"name": "chat", "status": "ready"}]}
    top.saw_state(node_state, node="b")  # an answer for the node left behind: not drawn under a's name
    assert top.frame().state is None
    top.saw_state(node_state, node="a")
    assert top.frame().state == node_state and top.frame().problem is None
    assert screen(top.frame(), width=120)[0].endswith("0 fleet  n next  p pause  e events  q quit")
    assert top.press("n") and top.node == "b"
    assert top.press("n") and top.node is None  # past the last: the fleet
    assert top.press("n") and top.node == "a"
    assert top.press(ESCAPE) and top.node is None
    assert top.press("2") and top.press("0") and top.node is None
    assert top.press("9") and top.node is None  # no ninth node
