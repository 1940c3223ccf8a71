"""Requests for models this steward does not run itself: to a node, by the front door's rules.

A front door's OpenAI listener serves the union of its nodes' models (and its capabilities).
A request for one is routed (``supervisor.nodes.routing``): a node where the model is
resident, else one where it fits without evicting hot work, else the least loaded. If only
a sleeping node serves it, the node is woken and the request waits for it, bounded by the
node's ``wake.timeout`` and the class's queue timeout (then 503 with ``Retry-After``). The
request goes to the node with the node's key, its class and the caller's key name; the
node's own scheduler keeps priorities there. A node that cannot be reached is reported
gone and the request is routed again (nothing was sent yet); a node that breaks off
mid-answer ends that answer with a clean error in its stream's framing. The answer names
the model that served it, in its ``model`` field (``supervisor.gateway.relay.answer_model``) and
its ``x-steward-model`` header.

While a request waits for a node to wake it is in ``held`` (``supervisor.nodes.held``), which
with the directory's reports makes the fleet view (``fleet``: /admin/state, /healthz,
/metrics, ``steward top``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import httpx
import trio

from supervisor.address import Address
from supervisor.observe.events import EventLog
from supervisor.gateway.relay.answer import AnswerTap
from supervisor.gateway.relay.answer_model import ModelHeader, ModelNamed
from supervisor.gateway.http.asgi import Scope, Send, send_error
from supervisor.gateway.door import Exchange
from supervisor.gateway.relay.proxy import UpstreamRequest, relay
from supervisor.gateway.routed import RoutedRequest
from supervisor.gateway.relay.upstream import Timeouts
from supervisor.nodes.directory import NodeDirectory
from supervisor.nodes.fleet import FleetSnapshot
from supervisor.nodes.held import HeldRequest, HeldRequests, HoldBound
from supervisor.nodes.peek import PeekRefused, peek_admin_state
from supervisor.nodes.routing import NoRoute, Route, Wake, choose_node, resolve_capability
from supervisor.request_class import RequestClass

NODE_ENGINE_PREFIX = "node:"  # how a node is named as the engine of a request in the usage log
_FORWARDED = frozenset({b"accept"})
WAKE_RETRY_AFTER = 30.0


@attrs.define(eq=False)
class NodeRouter:
    directory: NodeDirectory
    capabilities: Mapping[str, Sequence[str]]
    events: EventLog
    queue_timeout: Mapping[str, float]  # per class: how long a request may wait for a node to wake
    wake_timeout: Mapping[str, float]  # per node
    timeouts: Timeouts
    http: httpx.AsyncClient | None = None  # reads a node's own /admin/state for a person (peek)
    held: HeldRequests = attrs.Factory(HeldRequests)

    def fleet(self) -> FleetSnapshot:
        """The nodes and the requests held for them, now."""
        return FleetSnapshot(tuple(self.directory.reports()), self.held.entries(), trio.current_time())

    async def peek(self, node: str) -> dict[str, Any]:
        """The node's own /admin/state, read with its key (PeekRefused: why not)."""
        try:
            url, key = self.directory.url(node), self.directory.key(node)
        except KeyError as exc:
            raise PeekRefused(404, "node_not_found", str(exc.args[0])) from None
        if self.http is None:
            raise PeekRefused(503, "node_unavailable", "this front door reads no node's state")
        return await peek_admin_state(node, url, key, self.http)

    def serves(self, name: str) -> bool:
        return name in self.capabilities or any(name in view.serves for view in self.directory.views())

    def model_entries(self, created: int) -> list[dict[str, Any]]:
        """The nodes' models and the capabilities, as /v1/models lists them."""
        entries: dict[str, dict[str, Any]] = {}
        for view in self.directory.views():
            for name in sorted(view.serves):
                entry = entries.setdefault(name, {"id": name, "object": "model", "created": created,
                                                  "owned_by": "steward", "steward": {"nodes": []}})
                entry["steward"]["nodes"].append(view.name)
        for name, models in self.capabilities.items():
            entries[name] = {"id": name, "object": "model", "created": created, "owned_by": "steward",
                             "steward": {"capability": list(models)}}
        return list(entries.values())

    async def serve(self, scope: Scope, routed: RoutedRequest, exchange: Exchange, send: Send) -> None:
        requested, klass, shape = routed.name, routed.klass, routed.route.error_shape
        model = resolve_capability(requested, self.capabilities, self.directory.views()) or requested
        if model != requested:
            self.events.emit("capability", "info", capability=requested, model=model,
                             request_id=exchange.request_id)
        exchange.model = model
        body = routed.body_naming(model)
        deadline = trio.current_time() + self.queue_timeout[klass]
        while True:
            decision = choose_node(model, self.directory.views())
            if isinstance(decision, Route):
                await self._send_to(decision, scope, body, routed, exchange, send)
                return
            if isinstance(decision, NoRoute):
                await self._no_route(decision, send, routed)
                return
            if not await self._wait_for(decision, klass, deadline, exchange):
                exchange.error = "node_asleep"
                await send_error(send, 503, f"node {decision.node!r}, the only one that serves {model!r}, did not "
                                 f"wake in time", shape=shape, code="node_asleep", retry_after=WAKE_RETRY_AFTER)
                return

    async def _wait_for(self, wake: Wake, klass: RequestClass, deadline: float, exchange: Exchange) -> bool:
        if not wake.already:
            self.directory.wake(wake.node)
        self.events.emit("route_wait", "info", node=wake.node, model=wake.model, **{"class": klass},
                         request_id=exchange.request_id)
        started = trio.current_time()
        woken_by = started + self.wake_timeout.get(wake.node, 0.0)
        bound = HoldBound.QUEUE_TIMEOUT if deadline < woken_by else HoldBound.WAKE_TIMEOUT
        until = min(deadline, woken_by)
        held = HeldRequest(exchange.request_id, wake.node, wake.model, klass, started, until, bound)
        with self.held.hold(held):
            awake = await self.directory.wait_until_awake(wake.node, until)
        exchange.waited(trio.current_time() - started)
        return awake

    async def _send_to(self, route: Route, scope: Scope, body: bytes, routed: RoutedRequest, exchange: Exchange,
                       send: Send) -> None:
        tried = {route.node}

        async def elsewhere(detail: str) -> tuple[UpstreamRequest, str] | None:
            # Nothing reached the node: tell the directory, and route again among the others.
            node = exchange.engine.removeprefix(NODE_ENGINE_PREFIX) if exchange.engine else route.node
            self.directory.report_gone(node, detail)
            again = choose_node(route.model, [v for v in self.directory.views() if v.name not in tried])
            if not isinstance(again, Route):
                return None
            tried.add(again.node)
            return self._request(again, scope, body, routed, exchange), f"node {again.node!r}"

        def on_status(status: int) -> None:
            exchange.status = status

        # The node's engine names itself in the answer; the client is told steward's name for it, and
        # which model served it (a capability's included).
        answer = AnswerTap(send, [ModelNamed(route.model), ModelHeader(route.model)])
        await relay(answer, self._request(route, scope, body, routed, exchange),
                    what=f"node {route.node!r}", on_status=on_status, timeouts=self.timeouts, reroute=elsewhere,
                    error_shape=routed.route.error_shape, stream_error=routed.route.stream_error)
        await answer.end()

    def _request(self, route: Route, scope: Scope, body: bytes, routed: RoutedRequest,
                 exchange: Exchange) -> UpstreamRequest:
        klass = routed.klass
        self.events.emit("route", "info", node=route.node, model=route.model, reason=route.reason.value,
                         **{"class": klass}, request_id=exchange.request_id)
        exchange.engine = f"{NODE_ENGINE_PREFIX}{route.node}"
        address = Address.parse(self.directory.url(route.node).removeprefix("http://"))
        headers = [(b"content-type", routed.content_type), (b"x-steward-class", klass.encode())]
        headers += [(k, v) for k, v in scope["headers"] if k in _FORWARDED | routed.route.forwarded]
        if (key := self.directory.key(route.node)) is not None:
            headers.append((b"authorization", f"Bearer {key}".encode()))
        if exchange.key is not None:
            headers.append((b"x-steward-caller", exchange.key.name.encode()))
        return UpstreamRequest(address.host, address.port, b"POST", scope["raw_path"] or scope["path"].encode(),
                               headers, body)

    async def _no_route(self, decision: NoRoute, send: Send, routed: RoutedRequest) -> None:
        shape = routed.route.error_shape
        if any(decision.model in view.serves for view in self.directory.views()):
            await send_error(send, 503, decision.message, shape=shape, code="node_unavailable", retry_after=5.0)
        else:
            await send_error(send, 404, f"The model '{decision.model}' does not exist.", shape=shape, param="model",
                             code="model_not_found")
