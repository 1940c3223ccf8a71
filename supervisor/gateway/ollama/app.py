"""The Ollama-compatible listener: Ollama's clients point here instead of at Ollama.

Inference routes (native and OpenAI-compatible) go through steward's scheduler as work
on the `ollama` engine, with classes like everything else; every other route passes
through untouched. Streams (NDJSON, SSE) are relayed unbuffered. An upstream that
refuses connections (down, restarting) is retried with backoff until it answers or the
client goes.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import trio
from quart_trio import QuartTrio

from supervisor.backoff import Backoff
from supervisor.config import OLLAMA_ENGINE, OllamaConfig
from supervisor.observe.events import EventLog
from supervisor.gateway.openai.api_routes import API_ROUTES, error_shape_for, stream_error_for
from supervisor.gateway.http.asgi import (
    BodyLimits,
    Receive,
    RequestError,
    Scope,
    Send,
    dump_json,
    open_disconnect_watch,
    read_body,
    refuse_lone_surrogates,
    send_refusal,
)
from supervisor.gateway.classes import CLASS_HEADER, choose_class
from supervisor.gateway.door import MONITORING_PATHS, FrontDoor, exchange_of
from supervisor.gateway.errors import ErrorShape, ollama_error_body
from supervisor.gateway.http.gate import gated
from supervisor.gateway.granted import serve_granted
from supervisor.gateway.http.quart_app import add_health_routes, new_quart_app
from supervisor.gateway.relay.answer import AnswerTap
from supervisor.gateway.relay.proxy import REQUEST_FRAMING, UpstreamRequest, relay
from supervisor.gateway.relay.reshaped import reading_answer
from supervisor.gateway.relay.stream_usage import ask_for_usage
from supervisor.gateway.relay.upstream import Timeouts
from supervisor.gateway.services import Services
from supervisor.request_class import RequestClass
from supervisor.scheduler.actor import Lease, SchedulerClient
from supervisor.scheduler.types import GpuMode

INFERENCE_PATHS = frozenset({
    "/api/generate", "/api/chat", "/api/embed", "/api/embeddings",
    "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/messages",
})
# What changes the models Ollama has, not what it answers: an admin key's business.
ADMIN_PATHS = frozenset({"/api/pull", "/api/push", "/api/delete", "/api/create", "/api/copy"})


def is_admin_route(scope: Scope) -> bool:
    return scope["path"] in ADMIN_PATHS or scope["path"].startswith("/api/blobs/")


@attrs.frozen
class OllamaRoute:
    klass: RequestClass
    body: bytes
    model: str | None = None  # as Ollama knows it, steward's class suffix removed
    # Steward asked its OpenAI-style stream for the usage chunk, which the client did not ask for.
    keep_usage_chunk: bool = False
    stream: bool = False


def route_ollama_request(scope: Scope, body: bytes, default_class: RequestClass) -> OllamaRoute:
    """The class (header, `steward.class` field or `model@class` suffix), steward's own bits removed.

    A body that is not a JSON object goes to Ollama as it is: Ollama answers it in its own words.
    RequestError(400) for text no one can read (a lone surrogate), as on every listener."""
    try:
        payload = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        payload = None
    if not isinstance(payload, dict):
        return OllamaRoute(choose_class(scope, {}, default_class).klass, body)
    refuse_lone_surrogates(body, payload)
    choice = choose_class(scope, payload, default_class)
    model = payload.get("model")
    route = API_ROUTES.get(scope.get("path", ""))
    keep_usage_chunk = route is not None and route.asks_usage and ask_for_usage(payload)
    return OllamaRoute(choice.klass, dump_json(payload) if choice.changed or keep_usage_chunk else body,
                       model if isinstance(model, str) else None, keep_usage_chunk, payload.get("stream") is True)


def error_shape(scope: Scope) -> ErrorShape:
    """Ollama's own shape on its native /api routes; on its /v1 routes the API's (OpenAI's, Anthropic's)."""
    return ollama_error_body if scope["path"].startswith("/api/") else error_shape_for(scope)


@attrs.define(eq=False)
class OllamaListener:
    config: OllamaConfig
    scheduler: SchedulerClient
    events: EventLog
    body_limits: BodyLimits
    shutting_down: trio.Event  # ends the retries of an unreachable Ollama
    door: FrontDoor
    host: str = attrs.field(init=False)
    port: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.host, self.port = self.config.upstream.host, self.config.upstream.port

    @property
    def backoff(self) -> Backoff:
        return Backoff(self.config.retry_initial, self.config.retry_max, self.shutting_down)

    @property
    def timeouts(self) -> Timeouts:
        return Timeouts(self.config.first_byte_timeout, self.config.chunk_timeout)

    async def inference(self, scope: Scope, receive: Receive, send: Send) -> None:
        shape = error_shape(scope)
        exchange = exchange_of(scope)
        try:
            body = await read_body(scope, receive, self.body_limits)
            if body is None:
                return
            route = route_ollama_request(scope, body, self.door.default_class(exchange, self.config.default_class))
            exchange.model, exchange.klass = route.model, route.klass
            with self.door.admit(exchange, model=route.model, klass=route.klass):
                await self._serve(scope, receive, send, route, shape)
        except RequestError as exc:
            exchange.error = exchange.error or exc.code  # Ollama's own shape has no code: the usage row keeps it
            await send_refusal(send, exc, shape)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, route: OllamaRoute, shape: ErrorShape) -> None:
        exchange = exchange_of(scope)

        async def answering(lease: Lease, tracked: Send) -> None:
            exchange.engine = OLLAMA_ENGINE

            def on_status(status: int) -> None:
                lease.status = status

            await relay(self._reading(scope, tracked, route), self._request(scope, route.body),
                        what="Ollama", on_status=on_status, retry=self.backoff, on_retry=self._log_retry,
                        error_shape=shape, stream_error=stream_error_for(scope), timeouts=self.timeouts,
                        abort=lease.abort)

        async with open_disconnect_watch(receive) as disconnect:
            await serve_granted(self.scheduler, exchange, send, disconnect, model=OLLAMA_ENGINE, klass=route.klass,
                                shape=shape, answering=answering)

    def _reading(self, scope: Scope, send: Send, route: OllamaRoute) -> AnswerTap:
        """Its /v1 routes' answers are read as on the OpenAI listener; the native ones go as they come."""
        api_route = API_ROUTES.get(scope["path"])
        if api_route is None:
            return AnswerTap(send)
        return reading_answer(send, api_route, exchange_of(scope),
                              keep_usage_chunk=route.keep_usage_chunk, stream=route.stream, model=route.model)

    async def passthrough(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Not timed: a pull or a push may rightly take an hour.
        shape = error_shape(scope)
        try:
            body = await read_body(scope, receive, self.body_limits)
        except RequestError as exc:
            await send_refusal(send, exc, shape)
            return
        if body is None:
            return
        async with open_disconnect_watch(receive):
            await relay(send, self._request(scope, body), what="Ollama", on_status=lambda status: None,
                        retry=self.backoff, on_retry=self._log_retry, error_shape=shape)

    def _request(self, scope: Scope, body: bytes) -> UpstreamRequest:
        target = scope["raw_path"] or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        headers = self.door.forwardable("ollama", [(k, v) for k, v in scope["headers"]
                                                   if k not in REQUEST_FRAMING and k != CLASS_HEADER])
        return UpstreamRequest(self.host, self.port, scope["method"].encode(), target, headers, body)

    def _log_retry(self, delay: float, detail: str) -> None:
        self.events.emit("upstream_retry", "warning", service="ollama", detail=detail, retry_in_s=delay)


def create_ollama_app(config: OllamaConfig, services: Services) -> QuartTrio:
    events, gate = services.events, services.gate
    app = new_quart_app("steward-ollama", ollama_error_body, events)
    listener = OllamaListener(config, services.scheduler, events, services.body_limits, gate.closed, services.door)
    quart_asgi = app.asgi_app

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] in MONITORING_PATHS:
            await quart_asgi(scope, receive, send)
        elif scope["method"] == "POST" and scope["path"] in INFERENCE_PATHS:
            await listener.inference(scope, receive, send)
        else:
            await listener.passthrough(scope, receive, send)

    app.asgi_app = gated(gate, route, quart_asgi)  # type: ignore[method-assign]

    add_health_routes(app, services.health, services.metrics, lambda: turnstile_health(services.scheduler))
    return app


def turnstile_health(scheduler: SchedulerClient) -> dict[str, Any]:
    """gpu-turnstile's health shape: state idle | llm | image, LLM requests in flight, image pending."""
    snapshot = scheduler.snapshot()
    llm = sum(e.in_flight for e in snapshot.engines)
    state = "image" if snapshot.mode is GpuMode.EXCLUSIVE else ("llm" if llm else "idle")
    return {"state": state, "llm_inflight": llm, "image_pending": snapshot.exclusive_waiting > 0,
            "mode": snapshot.mode, "queued": snapshot.queued}

