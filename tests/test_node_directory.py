"""The front door's directory of nodes, against real nodes: tiny h11 servers on loopback.

Each fake node answers ``GET /steward/state`` with a real state document; a test switches
it off (listener and connections closed: connection refused, as from a host that went to
sleep) and on again at the same port, changes its models, holds its answers at a gate, or
has it answer 401. Wake-on-LAN packets go to a UDP socket of the test on 127.0.0.1.

Most tests run on the real clock with short poll intervals and wait for states (an event,
a view, a count of requests), never for a time. The tests of deadlines (a wake that times
out, a node that never answers) run on ``MockClock(autojump_threshold=0)`` with exact
assertions: there, every node is unreachable, so skipping ahead while bytes are in flight
changes nothing (every way of failing is the same silence).
"""

from __future__ import annotations

import contextlib
import functools
import json
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import attrs
import h11
import httpx
import pytest
import trio
import trio.testing

from fakes.webhook import Received, read_request
from supervisor.config import WakeConfig
from supervisor.observe.events import Event, EventLog
from supervisor.nodes.directory import POLL_TIMEOUT, NodeDirectory, NodeSpec, serve_node_directory
from supervisor.nodes.routing import Availability
from supervisor.nodes.state import DeviceState, ModelState, NodeState, parse_node_state, state_to_json
from supervisor.nodes.wake import MacAddress, magic_packet
from tests.conftest import free_port

GIB = 1024**3
MAC = MacAddress.parse("aa:bb:cc:dd:ee:ff")
WAIT_LIMIT = 60.0  # seconds (virtual ones on the autojump clock): a test that hangs fails instead
POLL = 0.05


def node_state(*models: str | tuple[str, ...]) -> NodeState:
    """A node's state serving *models*; a tuple is a model and its aliases."""
    states = tuple(ModelState(name, "ready", GIB, 2, 0, 0, False, False, tuple(aliases))
                   for name, *aliases in ((m,) if isinstance(m, str) else m for m in models))
    return NodeState(1, "fake", states, (DeviceState("gpu0", 24 * GIB, len(states) * GIB, 0),),
                     {"interactive": 0, "background": 0, "batch": 0}, "ok")


@attrs.define(eq=False)
class FakeNode:
    """A node's steward, as far as ``/steward/state`` goes."""

    state: NodeState = attrs.Factory(lambda: node_state("qwen"))
    status: int = 200
    body: bytes | None = None  # answered instead of the state
    port: int = 0
    requests: list[Received] = attrs.Factory(list)
    gate: trio.Event | None = None  # while set to an event, answers wait for it
    _arrived: trio.Event = attrs.Factory(trio.Event)
    _scope: trio.CancelScope | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    async def switch_on(self, nursery: trio.Nursery) -> None:
        self._scope = await nursery.start(self._serve)

    def switch_off(self) -> None:
        assert self._scope is not None
        self._scope.cancel()

    async def wait_requests(self, count: int) -> None:
        with trio.fail_after(WAIT_LIMIT):
            while len(self.requests) < count:
                await self._arrived.wait()

    async def _serve(self, *, task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        with trio.CancelScope() as scope:
            listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
            self.port = listeners[0].socket.getsockname()[1]
            task_status.started(scope)
            await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            while (received := await read_request(conn, stream)) is not None:
                self.requests.append(received)
                self._arrived.set()
                self._arrived = trio.Event()
                if self.gate is not None:
                    await self.gate.wait()
                body = self.body or json.dumps(state_to_json(self.state) if self.status == 200 else {"e": 1}).encode()
                response = h11.Response(status_code=self.status, headers=[
                    ("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
                await stream.send_all(conn.send(response) + conn.send(h11.Data(data=body))
                                      + conn.send(h11.EndOfMessage()))
                if conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()


async def switched_on(nursery: trio.Nursery, **fields: Any) -> FakeNode:
    node = FakeNode(**fields)
    await node.switch_on(nursery)
    return node


def open_event_log() -> EventLog:
    send, _ = trio.open_memory_channel[Event](float("inf"))
    return EventLog(send, recent_max=10_000)


def matching(events: EventLog, name: str, **match: object) -> list[Event]:
    return [e for e in events.recent if e.name == name and all(e.fields.get(k) == v for k, v in match.items())]


def fields_of(events: EventLog, name: str, **match: object) -> list[dict[str, object]]:
    return [e.fields for e in matching(events, name, **match)]


async def wait_events(events: EventLog, name: str, count: int = 1, **match: object) -> list[Event]:
    """The first *count* events called *name* with the fields in *match*, once they were emitted."""
    arrived = [trio.Event()]

    def listener(event: Event) -> None:
        arrived[0].set()

    events.listeners.append(listener)
    try:
        with trio.fail_after(WAIT_LIMIT):
            while len(found := matching(events, name, **match)) < count:
                await arrived[0].wait()
                arrived[0] = trio.Event()
        return found[:count]
    finally:
        events.listeners.remove(listener)


async def wait_event(events: EventLog, name: str, **match: object) -> Event:
    return (await wait_events(events, name, **match))[0]


@contextlib.asynccontextmanager
async def open_directory(*nodes: NodeSpec,
                         remembered: Path | None = None) -> AsyncIterator[tuple[NodeDirectory, EventLog]]:
    events = open_event_log()
    async with httpx.AsyncClient(trust_env=False) as http, trio.open_nursery() as nursery:
        directory = await nursery.start(functools.partial(serve_node_directory, nodes, http, events,
                                                          remembered=remembered))
        yield directory, events
        nursery.cancel_scope.cancel()


@pytest.fixture
def wol_listener() -> Iterator[socket.socket]:
    """Where the magic packets go: a UDP socket on loopback, read without waiting."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        yield sock


def received_packets(sock: socket.socket) -> list[bytes]:
    """The datagrams already there (loopback delivers them before ``sendto`` returns)."""
    packets = []
    with contextlib.suppress(BlockingIOError):
        while True:
            packets.append(sock.recv(2048))
    return packets


def waking(sock: socket.socket, timeout: float = 60.0) -> WakeConfig:
    return WakeConfig(MAC, "127.0.0.1", sock.getsockname()[1], timeout)


# --- polling ---

async def test_a_node_that_answers_is_awake_with_its_models_and_aliases(nursery: trio.Nursery) -> None:
    fake = await switched_on(nursery, state=node_state(("qwen", "qwen3"), "chat"))
    closed = free_port()
    async with open_directory(NodeSpec("big", fake.url, key="secret", poll=POLL),
                              NodeSpec("gone", f"http://127.0.0.1:{closed}", poll=POLL)) as (directory, events):
        big, gone = directory.views()
        assert (big.name, big.availability, big.serves) == ("big", Availability.AWAKE, {"qwen", "qwen3", "chat"})
        assert big.state == fake.state
        assert (gone.name, gone.availability, gone.serves, gone.state) == ("gone", Availability.DOWN, frozenset(),
                                                                           None)
        assert (directory.url("big"), directory.key("big"), directory.key("gone")) == (
            fake.url.rstrip("/"), "secret", None)
        assert fields_of(events, "node_state", node="big") == [
            {"node": "big", "availability": "awake", "previous": None, "models": 2, "detail": "answered"}]
        assert fields_of(events, "node_state", node="gone")[0]["availability"] == "down"
        with pytest.raises(KeyError, match="no node called 'small' \\(nodes: big, gone\\)"):
            directory.view("small")
    assert fake.requests[0].target == "/steward/state"
    assert fake.requests[0].headers["authorization"] == "Bearer secret"


async def test_a_node_that_stops_answering_is_asleep_with_wake_and_down_without(
        nursery: trio.Nursery, wol_listener: socket.socket) -> None:
    big, small = await switched_on(nursery), await switched_on(nursery, state=node_state("chat"))
    async with open_directory(NodeSpec("big", big.url, wake=waking(wol_listener), poll=POLL),
                              NodeSpec("small", small.url, poll=POLL)) as (directory, events):
        assert [v.availability for v in directory.views()] == [Availability.AWAKE, Availability.AWAKE]
        big.switch_off()
        small.switch_off()
        asleep = await wait_event(events, "node_state", node="big", availability="asleep")
        down = await wait_event(events, "node_state", node="small", availability="down")
        assert (asleep.fields["previous"], asleep.fields["models"]) == ("awake", 1)
        assert (down.fields["previous"], down.fields["models"]) == ("awake", 1)
        assert "ConnectError" in str(down.fields["detail"])
        views = directory.views()
        assert [v.availability for v in views] == [Availability.ASLEEP, Availability.DOWN]
        # What it served while awake it still serves: routing may wake it for that.
        assert [v.serves for v in views] == [{"qwen"}, {"chat"}]
        assert received_packets(wol_listener) == []  # nobody asked for it


@pytest.mark.parametrize(("status", "key", "detail"), [
    (401, "wrong", "the node refuses the key (HTTP 401): waking it will not help"),
    (403, None, "the node wants a key and none is set (HTTP 403): waking it will not help"),
])
async def test_a_node_that_refuses_the_key_is_down_and_says_so_once(
        nursery: trio.Nursery, wol_listener: socket.socket, status: int, key: str | None, detail: str) -> None:
    fake = await switched_on(nursery, status=status)
    async with open_directory(NodeSpec("big", fake.url, key=key, wake=waking(wol_listener), poll=POLL)) as (
            directory, events):
        assert directory.view("big").availability is Availability.DOWN
        directory.wake("big")  # waking would not help: nothing is sent
        assert directory.view("big").availability is Availability.DOWN
        await fake.wait_requests(len(fake.requests) + 3)
    assert fields_of(events, "node_state") == [
        {"node": "big", "availability": "down", "previous": None, "models": 0, "detail": detail}]
    assert fake.requests[0].headers.get("authorization") == (f"Bearer {key}" if key else None)
    assert received_packets(wol_listener) == []
    assert fields_of(events, "node_wake") == []


@pytest.mark.parametrize(("status", "body", "detail"), [
    (500, None, "answered HTTP 500"),
    (200, b"<html>", "its state is not JSON: Expecting value: line 1 column 1 (char 0)"),
    (200, b'{"version": 2}', "its state cannot be read: schema version 2, this steward reads 1"),
])
async def test_a_node_whose_answer_is_no_state_is_down(nursery: trio.Nursery, status: int, body: bytes | None,
                                                       detail: str) -> None:
    fake = await switched_on(nursery, status=status, body=body)
    async with open_directory(NodeSpec("big", fake.url, poll=POLL)) as (directory, events):
        assert directory.view("big").availability is Availability.DOWN
    assert fields_of(events, "node_state")[0]["detail"] == detail


# --- what a sleeping node serves ---

async def test_configured_models_win_over_remembered_ones(tmp_path: Path) -> None:
    memory = tmp_path / "nodes.json"
    memory.write_text(json.dumps({"big": state_to_json(node_state("old")),
                                  "small": state_to_json(node_state(("old", "older")))}))
    url = f"http://127.0.0.1:{free_port()}"
    wake = WakeConfig(MAC, "127.0.0.1", 9)
    async with open_directory(NodeSpec("big", url, wake=wake, models=("configured", "other")),
                              NodeSpec("small", url, wake=wake), NodeSpec("never", url),
                              remembered=memory) as (directory, events):
        big, small, never = directory.views()
    assert [(v.availability, v.serves, v.state) for v in (big, small, never)] == [
        (Availability.ASLEEP, {"configured", "other"}, None),
        (Availability.ASLEEP, {"old", "older"}, None),
        (Availability.DOWN, frozenset(), None)]
    assert {e["node"]: e["models"] for e in fields_of(events, "node_state")} == {"big": 2, "small": 1, "never": 0}


async def test_what_a_node_served_survives_a_restart_and_is_written_when_it_changes(
        nursery: trio.Nursery, tmp_path: Path, wol_listener: socket.socket) -> None:
    memory = tmp_path / "nodes.json"
    fake = await switched_on(nursery)
    spec = NodeSpec("big", fake.url, wake=waking(wol_listener), poll=POLL)
    async with open_directory(spec, remembered=memory) as (directory, events):
        await wait_event(events, "nodes_remembered")
        fake.state = node_state("qwen", "chat")
        await wait_events(events, "nodes_remembered", 2)
        assert directory.view("big").serves == {"qwen", "chat"}
        polls = len(fake.requests)
        await fake.wait_requests(polls + 5)
        # Once when first seen and once when its models changed, not at every poll.
        assert len(fields_of(events, "nodes_remembered")) == 2
    assert fields_of(events, "nodes_remembered")[-1] == {"path": str(memory), "nodes": ["big"]}
    assert [m.name for m in parse_node_state(json.loads(memory.read_text())["big"]).models] == ["qwen", "chat"]
    fake.switch_off()
    async with open_directory(spec, remembered=memory) as (directory, events):
        view = directory.view("big")
    assert (view.availability, view.serves, view.state) == (Availability.ASLEEP, {"qwen", "chat"}, None)
    assert fields_of(events, "node_state")[0]["models"] == 2


@pytest.mark.parametrize(("content", "detail", "small_serves"), [
    ("{not json", "not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
     frozenset()),
    ("[]", "not a JSON object of node names", frozenset()),
    (None, "Is a directory", frozenset()),
    (json.dumps({"big": {"version": 7}, "small": state_to_json(node_state("chat"))}),
     "node big: schema version 7, this steward reads 1", {"chat"}),  # what can be read is kept
])
async def test_an_unreadable_memory_is_an_event_and_forgets_what_it_cannot_read(
        tmp_path: Path, content: str | None, detail: str, small_serves: frozenset[str]) -> None:
    memory = tmp_path / "nodes.json"
    if content is None:
        memory.mkdir()
    else:
        memory.write_text(content)
    url = f"http://127.0.0.1:{free_port()}"
    async with open_directory(NodeSpec("big", url), NodeSpec("small", url), remembered=memory) as (directory, events):
        assert fields_of(events, "nodes_remembered_unreadable") == [{"path": str(memory), "detail": detail}]
        assert [v.serves for v in directory.views()] == [frozenset(), small_serves]


async def test_a_missing_memory_is_a_first_start_and_an_unwritable_one_an_event(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    memory = tmp_path / "no such dir" / "nodes.json"
    fake = await switched_on(nursery)
    async with open_directory(NodeSpec("big", fake.url, poll=POLL), remembered=memory) as (directory, events):
        failed = await wait_event(events, "nodes_remembered_unwritable")
        assert directory.view("big").availability is Availability.AWAKE
    assert failed.fields == {"path": str(memory), "detail": "No such file or directory"}
    assert fields_of(events, "nodes_remembered_unreadable") == []


# --- requests that find a node gone ---

async def test_report_gone_takes_effect_at_once_and_an_answer_asked_before_it_is_stale(
        nursery: trio.Nursery, wol_listener: socket.socket) -> None:
    big, small = await switched_on(nursery), await switched_on(nursery)
    async with open_directory(NodeSpec("big", big.url, wake=waking(wol_listener), poll=POLL),
                              NodeSpec("small", small.url, poll=600)) as (directory, events):
        big.gate = trio.Event()
        asked = len(big.requests)
        await big.wait_requests(asked + 1)  # a poll is on its way, held by the node
        directory.report_gone("big", "ReadError: connection reset by peer")
        directory.report_gone("small", "ConnectError: connection refused")
        assert [v.availability for v in directory.views()] == [Availability.ASLEEP, Availability.DOWN]
        assert fields_of(events, "node_state", node="big")[-1] == {
            "node": "big", "availability": "asleep", "previous": "awake", "models": 1,
            "detail": "ReadError: connection reset by peer"}
        held, big.gate = big.gate, trio.Event()
        held.set()
        # The poller asks again at once; by then it has had the held answer, and ignored it.
        await big.wait_requests(asked + 2)
        assert directory.view("big").availability is Availability.ASLEEP
        big.gate.set()
        big.gate = None
        now = trio.current_time()
        assert await directory.wait_until_awake("big", now + WAIT_LIMIT)
        # Polled every 10 minutes, it is asked again at once: a request's report is checked.
        assert await directory.wait_until_awake("small", now + WAIT_LIMIT)


# --- waking ---

async def test_wake_sends_one_burst_and_a_woken_node_is_used_as_soon_as_it_answers(
        nursery: trio.Nursery, wol_listener: socket.socket) -> None:
    fake = await switched_on(nursery)
    async with open_directory(NodeSpec("big", fake.url, wake=waking(wol_listener), poll=POLL)) as (directory, events):
        fake.switch_off()
        await wait_event(events, "node_state", node="big", availability="asleep")
        directory.wake("big")
        assert directory.view("big").availability is Availability.WAKING
        directory.wake("big")  # a second request while it wakes: no second burst
        sent = await wait_event(events, "node_wake")
        assert sent.fields == {"node": "big", "mac": "aa:bb:cc:dd:ee:ff", "broadcast": "127.0.0.1"}
        assert received_packets(wol_listener) == [magic_packet(MAC)] * 3
        answers: list[bool] = []

        async def wait_for_it() -> None:
            answers.append(await directory.wait_until_awake("big", trio.current_time() + WAIT_LIMIT))

        async with trio.open_nursery() as waiting:
            waiting.start_soon(wait_for_it)
            directory.wake("big")
            await fake.switch_on(nursery)
        assert answers == [True]
        assert directory.view("big").availability is Availability.AWAKE
        woken = fields_of(events, "node_woken")
        assert len(woken) == 1 and float(woken[0]["after_s"]) > 0  # type: ignore[arg-type]
        assert [e["availability"] for e in fields_of(events, "node_state")] == ["awake", "asleep", "waking", "awake"]
    assert len(fields_of(events, "node_wake")) == 1
    assert received_packets(wol_listener) == []


async def test_a_wake_that_times_out_is_asleep_again(autojump_clock: trio.testing.MockClock,
                                                      wol_listener: socket.socket) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with open_directory(NodeSpec("big", url, wake=waking(wol_listener, timeout=30.1))) as (directory, events):
        assert directory.view("big").availability is Availability.ASLEEP
        woken_at = trio.current_time()
        directory.wake("big")
        assert not await directory.wait_until_awake("big", woken_at + 10)
        assert trio.current_time() == woken_at + 10
        timeout = await wait_event(events, "node_wake_timeout")
        assert timeout.mono == woken_at + 30.1  # not at the next poll after it
        assert timeout.fields == {"node": "big", "timeout_s": 30.1}
        assert fields_of(events, "node_state")[-1] == {
            "node": "big", "availability": "asleep", "previous": "waking", "models": 0,
            "detail": "no answer within 30.1s of its Wake-on-LAN packet"}
        assert received_packets(wol_listener) == [magic_packet(MAC)] * 3
        # Asleep again, it can be woken again: another burst.
        directory.wake("big")
        assert directory.view("big").availability is Availability.WAKING
        await wait_events(events, "node_wake", 2)
        assert received_packets(wol_listener) == [magic_packet(MAC)] * 3


async def test_a_packet_that_cannot_be_sent_is_an_event_and_asleep_again(autojump_clock: trio.testing.MockClock) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    wake = WakeConfig(MAC, "255.255.255.255", 0)  # port 0: refused by send_magic_packet
    async with open_directory(NodeSpec("big", url, wake=wake)) as (directory, events):
        directory.wake("big")
        failed = await wait_event(events, "node_wake_failed")
        assert failed.fields["node"] == "big"
        assert "the port must be 1 to 65535" in str(failed.fields["detail"])
        assert directory.view("big").availability is Availability.ASLEEP


async def test_a_node_that_never_answers_holds_the_start_one_poll_timeout(
        autojump_clock: trio.testing.MockClock) -> None:
    # Listening, never accepting: the connection is made, the answer never comes.
    with socket.socket() as first, socket.socket() as second:
        for sock in (first, second):
            sock.bind(("127.0.0.1", 0))
            sock.listen(8)
        started = trio.current_time()
        async with open_directory(*(NodeSpec(name, f"http://127.0.0.1:{sock.getsockname()[1]}") for name, sock in
                                    (("big", first), ("small", second)))) as (directory, events):
            assert trio.current_time() == started + POLL_TIMEOUT  # side by side, not one after the other
            assert [v.availability for v in directory.views()] == [Availability.DOWN] * 2
            assert [e["detail"] for e in fields_of(events, "node_state")] == ["no answer within 2s"] * 2


# --- supervision (issue 26)

async def test_a_node_poller_that_fails_is_restarted_on_its_own_tracker_and_the_others_poll_on(
        nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch) -> None:
    from supervisor.backoff import Backoff
    from supervisor.nodes import directory as directory_module
    from supervisor.supervise import Supervision

    big = await switched_on(nursery, state=node_state(("qwen",), "chat"))
    small = await switched_on(nursery, state=node_state(("gemma",), "chat"))
    poll = directory_module._poll
    failures = ["big"]

    async def failing_once(node: Any, *args: Any) -> None:
        if node.spec.name in failures and node.view.availability is Availability.AWAKE:
            failures.remove(node.spec.name)
            raise RuntimeError("a poller's bug")
        await poll(node, *args)

    monkeypatch.setattr(directory_module, "_poll", failing_once)
    events = open_event_log()
    supervision = Supervision(events, Backoff(0.05, 0.05))
    async with httpx.AsyncClient(trust_env=False) as http, trio.open_nursery() as serving:
        directory = await serving.start(functools.partial(
            serve_node_directory, (NodeSpec("big", big.url, poll=POLL), NodeSpec("small", small.url, poll=POLL)),
            http, events, supervision=supervision))
        restarted = await wait_event(events, "task_restarted", task="node poller big")
        assert restarted.fields["failures"] == 1
        [failed] = fields_of(events, "task_failed", task="node poller big")
        assert failed["error"] == "RuntimeError: a poller's bug" and failed["fatal"] is False
        assert fields_of(events, "task_failed", task="node poller small") == []
        assert [view.availability for view in directory.views()] == [Availability.AWAKE, Availability.AWAKE]
        assert set(supervision.tasks) == {"node poller big", "node poller small", "node memory writer"}
        serving.cancel_scope.cancel()
