"""The front door's directory of nodes: what each node is now, and waking the sleeping ones.

One poller task per node asks it for its state (``GET /steward/state``) every ``poll``
seconds and is the only task that learns what the node says. What a node *is* lives in one
``NodeTracker`` per node: its view (the ``NodeView`` routing decides on), changed only by
the tracker's transitions. Each transition is synchronous, so under trio it is atomic, and
is told the time, so the rules are plain code:

* it answered: AWAKE with its state;
* it did not (refused, timed out, an HTTP error, a state we cannot read): ASLEEP if it has
  ``wake``, else DOWN. While WAKING, not answering is expected until ``wake.timeout``
  has passed; then it is ASLEEP again. A 401/403 is DOWN whatever: the node is up and
  refuses our key, and no magic packet mends that;
* ``wake`` (a request needs it): ASLEEP becomes WAKING at once and the node's packet task
  sends one burst; the caller never waits for the network, and a second request while it
  wakes sends nothing more;
* ``report_gone`` (a request found it unreachable): no longer AWAKE at once, so new requests
  go elsewhere before the next poll. An answer to a poll asked before that report is stale
  and ignored.

The tracker also keeps what a person watching the fleet asks (``report``: /admin/state,
/healthz, /metrics, ``steward top``): since when the node is in its state, and when it was
last polled and what came of it.

A transition that comes from outside the poller nudges it: it polls again at once, and
every 0.25 s while the node wakes, so a woken node is used as soon as it answers. Waiters
(``wait_until_awake``) park on a ``trio.Event`` that is replaced at every change of
availability; nothing polls but the pollers.

What a node serves while it sleeps: ``models`` from the config if given, else what it said
when last awake. That is kept in a small JSON file (node name -> its last state), read at
start and rewritten atomically by one writer task when a node's models change, not at
every poll. A file that cannot be read or written is an event, never a crash.
"""

from __future__ import annotations

import enum
import functools
import json
import math
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import attrs
import httpx
import trio

from supervisor.config import WakeConfig
from supervisor.observe.events import EventLog
from supervisor.nodes.fleet import NodeReport, PollOutcome
from supervisor.nodes.routing import Availability, NodeView
from supervisor.nodes.spec import NodeSpec
from supervisor.nodes.state import STATE_PATH, NodeState, NodeStateError, parse_node_state, state_to_json
from supervisor.nodes.wake import WakeError, send_magic_packet
from supervisor.supervise import Supervision, supervise

POLL_TIMEOUT = 2.0  # a node on the LAN answers in milliseconds; longer is as good as asleep
WAKING_POLL = 0.25  # while a node wakes: how soon after it answers a waiting request is sent


class Trouble(enum.Enum):
    """Why a node gave no state."""

    NO_STATE = "no_state"  # no answer, an HTTP error, a state we cannot read: asleep, off or broken
    KEY_REFUSED = "key_refused"  # 401/403: it is up and refuses our key; waking it will not help


@attrs.frozen
class Silence:
    trouble: Trouble
    detail: str


@attrs.define(eq=False)
class NodeTracker:
    """One node's view and the transitions that change it (see the module docstring)."""

    spec: NodeSpec
    events: EventLog
    remembered: NodeState | None = None  # what it served when it last answered (from the memory file at first)
    view: NodeView = attrs.field(init=False)
    trouble: Trouble | None = attrs.field(default=None, init=False)  # None while awake
    detail: str = attrs.field(default="not asked yet", init=False)  # why it is what it is, in words
    waking_since: float = attrs.field(default=math.nan, init=False)
    gone_reports: int = attrs.field(default=0, init=False)  # report_gone calls: a stale answer is told by it
    polled: bool = attrs.field(default=False, init=False)
    since: float = attrs.field(default=math.nan, init=False)  # when its availability last changed (trio's clock)
    last_poll: PollOutcome | None = attrs.field(default=None, init=False)
    answered_at: float = attrs.field(default=math.nan, init=False)  # its state (view.state) is as of then
    # Set at a change of availability, then replaced: what waiters park on.
    changed: trio.Event = attrs.field(factory=trio.Event, init=False)
    # Set by a transition from outside the poller: poll again now.
    nudged: trio.Event = attrs.field(factory=trio.Event, init=False)
    # Set by wake: the packet task sends a burst.
    packet_wanted: trio.Event = attrs.field(factory=trio.Event, init=False)

    def __attrs_post_init__(self) -> None:
        self.view = NodeView(self.spec.name, self._resting(Trouble.NO_STATE), self._serves(None))

    @property
    def wake_deadline(self) -> float:
        if self.view.availability is not Availability.WAKING or self.spec.wake is None:
            return math.inf
        return self.waking_since + self.spec.wake.timeout

    def answered(self, state: NodeState, reports_when_asked: int, now: float) -> bool:
        """It answered a poll; True if what it serves changed from what is remembered."""
        self.last_poll = PollOutcome(now, True, "answered")
        if reports_when_asked != self.gone_reports:
            return False  # asked before a request found it gone: that request knows better
        self.answered_at = now
        if self.view.availability is Availability.WAKING:
            self.events.emit("node_woken", "info", node=self.spec.name, after_s=round(now - self.waking_since, 3))
        changed = self.remembered is None or _names(self.remembered) != _names(state)
        if changed:
            self.remembered = state
        self._become(Availability.AWAKE, state, None, "answered", now)
        return changed

    def silent(self, silence: Silence, now: float) -> None:
        """It gave no state to a poll."""
        detail = silence.detail
        self.last_poll = PollOutcome(now, False, detail)
        if self.view.availability is Availability.WAKING and silence.trouble is Trouble.NO_STATE:
            if now < self.wake_deadline:
                return  # still booting
            assert self.spec.wake is not None
            self.events.emit("node_wake_timeout", "warning", node=self.spec.name, timeout_s=self.spec.wake.timeout)
            detail = f"no answer within {self.spec.wake.timeout:g}s of its Wake-on-LAN packet"
        self._become(self._resting(silence.trouble), self.view.state, silence.trouble, detail, now)

    def wake(self, now: float) -> None:
        if self.view.availability is not Availability.ASLEEP:
            return  # awake, already waking, or down (no wake, or it refuses our key)
        self.waking_since = now
        self._become(Availability.WAKING, self.view.state, self.trouble, "woken for a request", now)
        self.packet_wanted.set()
        self.nudged.set()

    def wake_failed(self, detail: str, now: float) -> None:
        self.events.emit("node_wake_failed", "warning", node=self.spec.name, detail=detail)
        if self.view.availability is Availability.WAKING:
            self._become(Availability.ASLEEP, self.view.state, self.trouble, detail, now)

    def gone(self, detail: str, now: float) -> None:
        self.gone_reports += 1
        if self.view.availability is Availability.AWAKE:
            self._become(self._resting(Trouble.NO_STATE), self.view.state, Trouble.NO_STATE, detail, now)
            self.nudged.set()

    def report(self) -> NodeReport:
        """What a person watching the fleet is shown of this node now."""
        wake = self.spec.wake
        return NodeReport(self.view, self.spec.url, self.detail, self.since, self.last_poll, self.answered_at,
                          key_known=self.spec.key is not None, wake_timeout=None if wake is None else wake.timeout,
                          waking_until=self.wake_deadline)

    def _resting(self, trouble: Trouble) -> Availability:
        woken = self.spec.wake is not None and trouble is Trouble.NO_STATE
        return Availability.ASLEEP if woken else Availability.DOWN

    def _serves(self, state: NodeState | None) -> frozenset[str]:
        if self.spec.models is not None:
            return frozenset(self.spec.models)
        known = state or self.remembered
        return frozenset() if known is None else _names(known)

    def _become(self, availability: Availability, state: NodeState | None, trouble: Trouble | None,
                detail: str, now: float) -> None:
        previous = self.view.availability if self.polled else None
        # Once per change: a node that refuses every poll the same way says so once.
        if (previous, self.trouble) != (availability, trouble):
            known = state or self.remembered
            count = len(self.spec.models) if self.spec.models is not None else len(known.models) if known else 0
            self.events.emit("node_state", "info", node=self.spec.name, availability=availability.value,
                             previous=None if previous is None else previous.value, models=count, detail=detail)
        self.view = NodeView(self.spec.name, availability, self._serves(state), state)
        self.trouble, self.detail, self.polled = trouble, detail, True
        if previous is not availability:
            self.since = now
            self.changed.set()
            self.changed = trio.Event()


def _names(state: NodeState) -> frozenset[str]:
    return frozenset(name for model in state.models for name in (model.name, *model.aliases))


@attrs.define(eq=False)
class NodeDirectory:
    """The nodes as the front door knows them, in config order; handed out by ``serve_node_directory``."""

    _nodes: dict[str, NodeTracker]

    def views(self) -> list[NodeView]:
        return [node.view for node in self._nodes.values()]

    def reports(self) -> list[NodeReport]:
        return [node.report() for node in self._nodes.values()]

    def view(self, name: str) -> NodeView:
        return self._node(name).view

    def url(self, name: str) -> str:
        return self._node(name).spec.url

    def key(self, name: str) -> str | None:
        return self._node(name).spec.key

    async def wait_until_awake(self, name: str, deadline: float) -> bool:
        """True once the node is AWAKE, False at *deadline* (trio's clock)."""
        node = self._node(name)
        if node.view.awake:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return True
        with trio.move_on_at(deadline):
            while not node.view.awake:
                await node.changed.wait()
            return True
        return False

    def wake(self, name: str) -> None:
        """Wake the node if it sleeps: WAKING at once, its packet sent by its own task. Never blocks."""
        self._node(name).wake(trio.current_time())

    def report_gone(self, name: str, detail: str) -> None:
        """A request found the node unreachable: it is no longer AWAKE, from now."""
        self._node(name).gone(detail, trio.current_time())

    def _node(self, name: str) -> NodeTracker:
        try:
            return self._nodes[name]
        except KeyError:
            raise KeyError(f"no node called {name!r} (nodes: {', '.join(self._nodes)})") from None


@attrs.define(eq=False)
class _Memory:
    """The memory file: node name -> its last state. One writer task; ``remember`` never blocks."""

    path: Path | None
    events: EventLog
    states: dict[str, NodeState]
    _dirty: trio.Event = attrs.field(factory=trio.Event)

    def remember(self, name: str, state: NodeState) -> None:
        self.states[name] = state
        self._dirty.set()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                await self._dirty.wait()
                await self._write()
        finally:
            with trio.CancelScope(shield=True):  # what changed just before shutdown is kept too
                if self._dirty.is_set():
                    await self._write()

    async def _write(self) -> None:
        self._dirty = trio.Event()
        if self.path is None:
            return
        text = json.dumps({name: state_to_json(state) for name, state in self.states.items()}, indent=1)
        try:
            await trio.to_thread.run_sync(_replace_file, self.path, text)
        except OSError as exc:
            self.events.emit("nodes_remembered_unwritable", "warning", path=str(self.path),
                             detail=exc.strerror or str(exc))
        else:
            self.events.emit("nodes_remembered", "debug", path=str(self.path), nodes=sorted(self.states))


def _replace_file(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


async def _read_memory(path: Path | None, events: EventLog) -> dict[str, NodeState]:
    """What the nodes said when last awake; a missing file (the first start) is an empty memory."""
    if path is None:
        return {}

    def unreadable(detail: str) -> None:
        events.emit("nodes_remembered_unreadable", "warning", path=str(path), detail=detail)

    try:
        raw = json.loads(await trio.to_thread.run_sync(path.read_text))
    except FileNotFoundError:
        return {}
    except OSError as exc:
        unreadable(exc.strerror or str(exc))
        return {}
    except ValueError as exc:  # not JSON, or not UTF-8
        unreadable(f"not JSON: {exc}")
        return {}
    if not isinstance(raw, dict):
        unreadable("not a JSON object of node names")
        return {}
    memory = {}
    for name, value in raw.items():
        try:
            memory[name] = parse_node_state(value)
        except NodeStateError as exc:
            unreadable(f"node {name}: {exc}")
    return memory


async def _ask(spec: NodeSpec, http: httpx.AsyncClient, deadline: float) -> NodeState | Silence:
    """One poll of the node's state, over by *deadline* whatever the network does."""
    headers = {"Authorization": f"Bearer {spec.key}"} if spec.key else {}
    no_answer = Silence(Trouble.NO_STATE, f"no answer within {POLL_TIMEOUT:g}s")
    with trio.move_on_at(deadline):
        try:
            response = await http.get(spec.url + STATE_PATH, headers=headers, timeout=POLL_TIMEOUT)
        except httpx.TimeoutException:
            return no_answer
        except Exception as exc:  # whatever the network or the node does is a state, never a crash
            return Silence(Trouble.NO_STATE, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        status = response.status_code
        if status in (401, 403):
            wanted = "refuses the key" if spec.key else "wants a key and none is set"
            return Silence(Trouble.KEY_REFUSED, f"the node {wanted} (HTTP {status}): waking it will not help")
        if status != 200:
            return Silence(Trouble.NO_STATE, f"answered HTTP {status}")
        try:
            raw = response.json()
        except ValueError as exc:  # not JSON, or not UTF-8
            return Silence(Trouble.NO_STATE, f"its state is not JSON: {exc}")
        try:
            return parse_node_state(raw)
        except NodeStateError as exc:
            return Silence(Trouble.NO_STATE, f"its state cannot be read: {exc}")
    return no_answer


async def _serve_node(node: NodeTracker, http: httpx.AsyncClient, memory: _Memory, *,
                      task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Poll one node until cancelled; started once it has been polled once."""
    async with trio.open_nursery() as nursery:
        if node.spec.wake is not None:
            nursery.start_soon(_send_packets, node, node.spec.wake)
        await _poll(node, http, memory)
        task_status.started()
        while True:
            waking = node.view.availability is Availability.WAKING
            pause = WAKING_POLL if waking else node.spec.poll
            with trio.move_on_at(min(trio.current_time() + pause, node.wake_deadline)):
                await node.nudged.wait()
            await _poll(node, http, memory)


async def _poll(node: NodeTracker, http: httpx.AsyncClient, memory: _Memory) -> None:
    asked_at, reports = trio.current_time(), node.gone_reports
    node.nudged = trio.Event()  # a nudge from now on means: something changed since this poll asked
    answer = await _ask(node.spec, http, min(asked_at + POLL_TIMEOUT, node.wake_deadline))
    now = trio.current_time()
    if isinstance(answer, Silence):
        node.silent(answer, now)
    elif node.answered(answer, reports, now):
        memory.remember(node.spec.name, answer)


async def _send_packets(node: NodeTracker, wake: WakeConfig) -> None:
    """One burst of magic packets per ``wake`` transition, sent here so no caller waits for it."""
    while True:
        await node.packet_wanted.wait()
        node.packet_wanted = trio.Event()
        try:
            await send_magic_packet(wake.mac, wake.broadcast, wake.port)
        except WakeError as exc:
            node.wake_failed(str(exc), trio.current_time())
        else:
            node.events.emit("node_wake", "info", node=node.spec.name, mac=str(wake.mac), broadcast=wake.broadcast)


async def serve_node_directory(nodes: Sequence[NodeSpec], http: httpx.AsyncClient, events: EventLog, *,
                               remembered: Path | None = None, supervision: Supervision | None = None,
                               task_status: trio.TaskStatus[NodeDirectory] = trio.TASK_STATUS_IGNORED) -> None:
    """Keep every node's view current until cancelled.

    Started (with the ``NodeDirectory``) once every node has been polled once, which takes
    at most ``POLL_TIMEOUT``: all are polled at the same time. *remembered* is the memory
    file of what the nodes said when last awake (None: nothing is remembered). Under
    *supervision* each node's poller is the task "node poller NAME", restarted on its own
    tracker if it fails, and the memory's writer is "node memory writer".
    """
    names = [spec.name for spec in nodes]
    if len(set(names)) != len(names):
        raise ValueError(f"node names must differ, got {names}")
    memory = _Memory(remembered, events, await _read_memory(remembered, events))
    trackers = {spec.name: NodeTracker(spec, events, memory.states.get(spec.name)) for spec in nodes}
    def supervised(name: str, run: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
        return run if supervision is None else functools.partial(supervise, supervision, name, run)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(supervised("node memory writer", memory.serve))
        async with trio.open_nursery() as starting:  # first polls side by side: the slowest bounds the start
            for name, tracker in trackers.items():
                starting.start_soon(nursery.start, supervised(f"node poller {name}", functools.partial(
                    _serve_node, tracker, http, memory)))
        task_status.started(NodeDirectory(trackers))
