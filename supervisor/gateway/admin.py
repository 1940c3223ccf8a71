"""The admin API: the whole picture (``GET /admin/state``, what ``steward top`` draws), the
event log live (``GET /admin/events``, Server-Sent Events), and an admin's hand on the
engines (``POST /admin/engines/NAME/load|unload|pin|unpin``), through the scheduler like
everything else. A front door adds its fleet to the picture (``nodes``, ``held``) and hands
on a node's own picture (``GET /admin/nodes/NAME/state``, read with the node's key).
Admin keys only, once keys are configured (``is_admin_route``).

``admin_state`` is pure: a scheduler snapshot, the health, the recent events, the fleet and
the two clocks in, one JSON document out (its schema: ``STATE_VERSION``, docs/events.md).
"""

from __future__ import annotations

import collections
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import trio
from quart import Response, request
from quart_trio import QuartTrio

from supervisor.observe.engine_logs import MAX_LINES, OutputLine
from supervisor.observe.events import Event, EventLog
from supervisor.gateway.http.asgi import Receive, Scope, Send, open_disconnect_watch, send_error
from supervisor.gateway.door import engine_logs_name
from supervisor.gateway.errors import error_body
from supervisor.gateway.http.gate import RequestGate
from supervisor.gateway.http.quart_app import json_error
from supervisor.observe.health import Health, HealthWatch
from supervisor.observe.history import HISTORY_PATH, History
from supervisor.engines.memory_plan import Device, device_label
from supervisor.nodes.fleet import FleetSnapshot, fleet_json, held_lines
from supervisor.nodes.peek import PeekRefused
from supervisor.observe.metrics import device_tiers
from supervisor.reload import Reload
from supervisor.scheduler.actor import SchedulerClient
from supervisor.request_class import RequestClass
from supervisor.scheduler.types import EngineAction, SchedulerSnapshot

if TYPE_CHECKING:
    from supervisor.gateway.remote import NodeRouter

T = TypeVar("T")
STATE_VERSION = 1
EVENTS_PATH = "/admin/events"
RECENT_EVENTS = 30
RECENT_REJECTIONS = 20
_REJECTIONS = frozenset({"reject", "timeout"})
_QUEUE_SIZE = 1000  # events a slow /admin/events reader may fall behind before some are dropped
_KEEPALIVE_S = 15.0
DEFAULT_LOG_LINES = 100


def admin_state(snapshot: SchedulerSnapshot, health: Health, recent: Sequence[Event], device: Device, *,
                now: float, wall: float, fleet: FleetSnapshot | None = None,
                remote: Sequence[dict[str, Any]] = (), videos: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The picture: memory per device by tier, every engine, the queues and why they wait,
    recent rejections and events, and a front door's *fleet*: its nodes, and the requests held
    for them (among the waiting too). *now*: the scheduler's clock; *wall*: the wall clock."""

    def at(moment: float | None) -> float | None:
        return None if moment is None or not math.isfinite(moment) else round(wall + moment - now, 3)

    devices = [{"device": device_label(device, d.index), "budget": d.budget, "reserved": d.reserved,
                "outside": d.outside, "free": d.free, "tiers": device_tiers(snapshot, d, freeing=True)}
               for d in snapshot.devices]
    oldest = {klass: snapshot.oldest_waiting(klass) for klass in RequestClass}
    held = [] if fleet is None else [request.klass for request in fleet.held]
    return {
        "version": STATE_VERSION, "time": round(wall, 3), "mode": snapshot.mode,
        "health": {"status": health.status.value, "reasons": list(health.reasons)},
        "devices": devices,
        "engines": [{"name": e.name, "status": e.status, "draining": e.draining, "in_flight": e.in_flight,
                     "slots": e.slots, "queued": e.queued, "memory": e.memory, "reserved": e.reserved,
                     "measured": e.measured, "pinned": e.pinned, "hot": e.hot, "hot_until": at(e.hot_until),
                     "idle_s": None if e.in_flight or not math.isfinite(e.last_used) else round(now - e.last_used, 3),
                     "generation": e.generation, "failures": e.failures, "healthy": e.healthy,
                     "devices": [device_label(device, index) for index in e.devices]} for e in snapshot.engines],
        "classes": {klass: {"queued": snapshot.queued_by_class[klass], "running": snapshot.running_by_class[klass],
                            "oldest_wait_s": None if oldest[klass] is None else round(now - oldest[klass], 3),
                            "held": held.count(klass),
                            **_pace(health, klass)}
                    for klass in RequestClass},
        "waiting": waiting_lines(snapshot, now) + ([] if fleet is None else held_lines(fleet)),
        "remote": list(remote),  # the remote models (a cloud's: no memory), gateway/cloud.py
        "videos": list(videos),  # the video jobs queued or being made (supervisor/videos/service.py)
        **(fleet_json(fleet, wall) if fleet is not None else {"nodes": [], "held": []}),
        "rejections": [_event_json(e) for e in _last(recent, RECENT_REJECTIONS, lambda e: e.name in _REJECTIONS)],
        "events": [_event_json(e) for e in _last(recent, RECENT_EVENTS, lambda e: e.level != "debug")],
    }


def _pace(health: Health, klass: RequestClass) -> dict[str, Any]:
    """A class's answers over the health window: how many times slower than alone, time to first token."""
    pace = health.paces.get(klass)
    if pace is None:
        return {}
    return {"slowdown_p50": pace.slowdown_p50, "slowdown_p95": pace.slowdown_p95, "ttft_p50_s": pace.ttft_p50_s,
            "slowed": klass in health.slowed}


def waiting_lines(snapshot: SchedulerSnapshot, now: float) -> list[dict[str, Any]]:
    """The head of every line, oldest first, and why it waits (an explained snapshot's)."""
    return [{"class": line.klass, "model": line.engine, "waiting": line.waiting,
             "waited_s": round(now - line.head_submitted, 3), "reason": line.reason, "why": line.why}
            for line in sorted(snapshot.lines, key=lambda line: line.head_submitted)]


def _last(events: Sequence[Event], count: int, keep: Any) -> list[Event]:
    kept = [event for event in events if keep(event)]
    return kept[-count:]


def _event_json(event: Event) -> dict[str, Any]:
    return json.loads(event.to_json())


@attrs.define(eq=False)
class RecentEvents:
    """The last events at info and above, and the last rejections, kept as they are emitted:
    the event log's own ring is mostly debug lines on a busy steward."""

    told: collections.deque[Event] = attrs.Factory(lambda: collections.deque(maxlen=RECENT_EVENTS))
    rejections: collections.deque[Event] = attrs.Factory(lambda: collections.deque(maxlen=RECENT_REJECTIONS))

    def observe(self, event: Event) -> None:
        if event.level != "debug":
            self.told.append(event)
        if event.name in _REJECTIONS:
            self.rejections.append(event)

    def events(self) -> list[Event]:
        """Both, oldest first, each once."""
        return sorted({id(event): event for event in (*self.rejections, *self.told)}.values(), key=lambda e: e.mono)


def add_admin_routes(app: QuartTrio, scheduler: SchedulerClient, health: HealthWatch, events: EventLog,
                     device: Device, reload: Reload | None = None, nodes: NodeRouter | None = None,
                     history: History | None = None,
                     remote: Callable[[], list[dict[str, Any]]] = list,
                     videos: Callable[[], list[dict[str, Any]]] = list) -> Callable[[], dict[str, Any]]:
    """The admin routes; returns what ``GET /admin/state`` answers, for the page at /ui."""
    recent = RecentEvents()
    events.listeners.append(recent.observe)

    def current_state() -> dict[str, Any]:
        return admin_state(scheduler.snapshot(explained=True), health.assess(), recent.events(), device,
                           now=trio.current_time(), wall=time.time(), fleet=None if nodes is None else nodes.fleet(),
                           remote=remote(), videos=videos())

    @app.post("/admin/reload")
    async def admin_reload() -> Response | dict[str, Any]:
        if reload is None:
            return json_error(error_body, 409, "this steward was not started from a config file", code="no_config_file")
        outcome = await reload()
        if outcome.plan is None:
            body = {**json.loads(error_body(422, "the new config is refused: " + "; ".join(outcome.problems),
                                            code="config_invalid")), **outcome.to_json()}
            return Response(json.dumps(body), status=422, content_type="application/json")
        return outcome.to_json()

    @app.get("/admin/state")
    async def admin_state_route() -> dict[str, Any]:
        return current_state()

    @app.get(HISTORY_PATH)
    async def admin_history() -> dict[str, Any]:
        return (history or History()).to_json()

    @app.get("/admin/nodes/<name>/state")
    async def admin_node_state(name: str) -> Response | dict[str, Any]:
        """A node's own picture, read with the front door's key for it (steward top's node view)."""
        try:
            if nodes is None:
                raise PeekRefused(404, "node_not_found", "this steward is no front door: it has no nodes")
            return await nodes.peek(name)
        except PeekRefused as refused:
            return json_error(error_body, refused.status, refused.message, code=refused.code)

    @app.get("/admin/engines/<name>/logs")
    async def admin_engine_logs(name: str) -> Response | dict[str, Any]:
        """The engine's last ``lines`` lines (100), as JSON, or as plain text with ``format=text``."""
        if name not in {e.name for e in scheduler.snapshot().engines}:
            return json_error(error_body, 404, f"no engine named {name!r}", code="engine_not_found")
        lines = events.engine_logs.last(name, _lines(request.args))
        if request.args.get("format") == "text":
            return Response("".join(line.line + "\n" for line in lines), content_type="text/plain; charset=utf-8")
        return {"engine": name, "lines": [line.to_json() for line in lines]}

    @app.post("/admin/engines/<name>/<action>")
    async def admin_engine_action(name: str, action: str) -> Response | dict[str, Any]:
        engines = {e.name for e in scheduler.snapshot().engines}
        if name not in engines:
            return json_error(error_body, 404, f"no engine named {name!r}", code="engine_not_found")
        try:
            wanted = EngineAction(action)
        except ValueError:
            return json_error(error_body, 404, f"unknown action {action!r}: one of "
                              f"{', '.join(a.value for a in EngineAction)}", code="unknown_action")
        problem = await scheduler.control(name, wanted)
        if problem is not None:
            return json_error(error_body, 409, problem, code="engine_busy")
        engine = next(e for e in scheduler.snapshot().engines if e.name == name)
        return {"engine": name, "action": wanted.value, "status": engine.status, "pinned": engine.pinned,
                "draining": engine.draining}

    return current_state


async def serve_admin_events(scope: Scope, receive: Receive, send: Send, events: EventLog, gate: RequestGate) -> None:
    """``GET /admin/events[?event=a,b]``: each event as it is emitted, as an SSE ``data:`` line,
    until the client leaves or steward begins to shut down (an open stream never holds the drain)."""
    names = _wanted(scope.get("query_string", b"").decode("latin-1"))
    await serve_followed(receive, send, gate, events.listeners, lambda event: json.loads(event.to_json()),
                         banner="steward events", wanted=None if names is None else lambda event: event.name in names)


async def serve_engine_logs_follow(scope: Scope, receive: Receive, send: Send, scheduler: SchedulerClient,
                                   events: EventLog, gate: RequestGate) -> None:
    """``GET /admin/engines/NAME/logs?follow=1[&lines=N]``: the engine's last N lines, then each
    new line as it comes, as SSE ``data:`` lines (``{"seq", "ts", "line"}``), as /admin/events."""
    name = engine_logs_name(scope["path"])
    if name is None or name not in {e.name for e in scheduler.snapshot().engines}:
        await send_error(send, 404, f"no engine named {name!r}", code="engine_not_found")
        return
    logs = events.engine_logs
    await serve_followed(receive, send, gate, logs.followers_of(name), OutputLine.to_json,
                         banner=f"{name} output", backlog=logs.last(name, _lines(_query(scope))))


async def serve_followed(receive: Receive, send: Send, gate: RequestGate, listeners: list[Callable[[T], None]],
                            to_json: Callable[[T], dict[str, Any]], *, banner: str,
                            wanted: Callable[[T], bool] | None = None, backlog: Sequence[T] = ()) -> None:
    """Each item told to *listeners* (and *wanted*) from now on, after *backlog*, as an SSE
    ``data:`` line, until the client leaves or steward begins to shut down. A reader too far
    behind loses items (told as ``events_dropped``), never slows steward down."""
    queue_send, queue = trio.open_memory_channel[T](_QUEUE_SIZE)
    dropped = 0

    def follow(item: T) -> None:
        nonlocal dropped
        if wanted is None or wanted(item):
            try:
                queue_send.send_nowait(item)
            except trio.WouldBlock:
                dropped += 1

    listeners.append(follow)  # before the first checkpoint: nothing told after *backlog* is missed
    try:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        await send({"type": "http.response.body", "body": f": {banner}\n\n".encode(), "more_body": True})
        for item in backlog:
            await send(_sse(to_json(item)))
        async with open_disconnect_watch(receive):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_on, gate.closed, nursery.cancel_scope)
                while True:
                    with trio.move_on_after(_KEEPALIVE_S):
                        item = await queue.receive()
                        lost, dropped = dropped, 0
                        if lost:
                            await send(_sse({"event": "events_dropped", "dropped": lost}))
                        await send(_sse(to_json(item)))
                        continue
                    await send({"type": "http.response.body", "body": b": keep-alive\n\n", "more_body": True})
    finally:
        listeners.remove(follow)
    with trio.CancelScope(shield=True):
        try:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except Exception:  # noqa: BLE001 - the client is gone: nothing to finish
            pass


def is_engine_logs_path(path: str) -> bool:
    return engine_logs_name(path) is not None


def _query(scope: Scope) -> dict[str, str]:
    return dict(part.partition("=")[::2] for part in scope.get("query_string", b"").decode("latin-1").split("&"))


def _lines(query: Mapping[str, str]) -> int:
    """``lines=N`` of a logs request: N within 0..MAX_LINES, else the default."""
    try:
        return max(0, min(MAX_LINES, int(query.get("lines", ""))))
    except ValueError:
        return DEFAULT_LOG_LINES


def wants_follow(scope: Scope) -> bool:
    return _query(scope).get("follow", "") not in ("", "0", "false")


def _wanted(query: str) -> frozenset[str] | None:
    for part in query.split("&"):
        key, _, value = part.partition("=")
        if key == "event" and value:
            return frozenset(filter(None, value.split(",")))
    return None


def _sse(record: dict[str, Any]) -> dict[str, Any]:
    return {"type": "http.response.body", "body": f"data: {json.dumps(record, default=str)}\n\n".encode(),
            "more_body": True}


async def _cancel_on(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel(reason="steward is shutting down")


def is_admin_path(path: str) -> bool:
    return path.startswith("/admin/")

