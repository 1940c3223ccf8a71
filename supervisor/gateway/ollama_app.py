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
from quart import Response
from quart_trio import QuartTrio

from supervisor.config import OLLAMA_ENGINE, OllamaConfig
from supervisor.events import EventLog
from supervisor.gateway.errors import error_body, error_headers, ollama_error_body
from supervisor.gateway.gate import RequestGate, gated
from supervisor.gateway.inference import (
    CLASS_HEADER,
    Receive,
    RequestError,
    Scope,
    Send,
    cancel_on_disconnect,
    header_value,
    read_body,
    send_error,
)
from supervisor.gateway.relay import HOP_BY_HOP, Backoff, ErrorShape, UpstreamRequest, relay
from supervisor.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from supervisor.metrics import StewardMetrics
from supervisor.scheduler.actor import JobFailed, SchedulerClient
from supervisor.scheduler.types import CLASSES

INFERENCE_PATHS = frozenset({
    "/api/generate", "/api/chat", "/api/embed", "/api/embeddings",
    "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
})


@attrs.frozen
class OllamaRoute:
    klass: str
    body: bytes


def route_ollama_request(scope: Scope, body: bytes, default_class: str) -> OllamaRoute:
    """The class (header, `steward.class` field or `model@class` suffix), steward's own bits removed."""
    klass = header_value(scope, CLASS_HEADER)
    try:
        payload = json.loads(body) if body else None
    except ValueError:
        payload = None  # Ollama answers malformed JSON itself
    if isinstance(payload, dict):
        changed = False
        extra = payload.pop("steward", None)
        if extra is not None:
            changed = True
            if isinstance(extra, dict) and "class" in extra:
                klass = extra["class"]
        model = payload.get("model")
        if isinstance(model, str) and "@" in model:
            payload["model"], _, klass = model.rpartition("@")
            changed = True
        if changed:
            body = json.dumps(payload).encode()
    klass = klass or default_class
    if klass not in CLASSES:
        raise RequestError(400, f"Unknown class {klass!r}: use one of {', '.join(CLASSES)}.", code="invalid_class")
    return OllamaRoute(klass, body)


@attrs.define(eq=False)
class OllamaListener:
    config: OllamaConfig
    scheduler: SchedulerClient
    events: EventLog
    max_body_size: int
    shutting_down: trio.Event  # ends the retries of an unreachable Ollama
    host: str = attrs.field(init=False)
    port: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        host, _, port = self.config.upstream.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)

    @property
    def backoff(self) -> Backoff:
        return Backoff(self.config.retry_initial, self.config.retry_max, self.shutting_down)

    async def inference(self, scope: Scope, receive: Receive, send: Send) -> None:
        native = scope["path"].startswith("/api/")
        try:
            body = await read_body(scope, receive, self.max_body_size)
            if body is None:
                return
            route = route_ollama_request(scope, body, self.config.default_class)
        except RequestError as exc:
            await _send_refusal(send, native, exc.status, exc.message, code=exc.code)
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_on_disconnect, receive, nursery.cancel_scope)
            try:
                async with self.scheduler.open_grant(OLLAMA_ENGINE, route.klass) as lease:

                    def on_status(status: int) -> None:
                        lease.status = status

                    await relay(send, self._request(scope, route.body), what="Ollama", on_status=on_status,
                                retry=self.backoff, on_retry=self._log_retry, error_shape=_error_shape(native))
            except JobFailed as exc:
                failure = exc.failure
                await _send_refusal(send, native, failure.status, failure.message, code=failure.code,
                                    retry_after=failure.retry_after)
            nursery.cancel_scope.cancel(reason="request finished")

    async def passthrough(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await read_body(scope, receive, self.max_body_size)
        if body is None:
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_on_disconnect, receive, nursery.cancel_scope)
            await relay(send, self._request(scope, body), what="Ollama", on_status=lambda status: None,
                        retry=self.backoff, on_retry=self._log_retry,
                        error_shape=_error_shape(scope["path"].startswith("/api/")))
            nursery.cancel_scope.cancel(reason="request finished")

    def _request(self, scope: Scope, body: bytes) -> UpstreamRequest:
        target = scope["raw_path"] or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        headers = [(k, v) for k, v in scope["headers"] if k not in HOP_BY_HOP and k != CLASS_HEADER]
        return UpstreamRequest(self.host, self.port, scope["method"].encode(), target, headers, body)

    def _log_retry(self, delay: float, detail: str) -> None:
        self.events.emit("upstream_retry", "warning", service="ollama", detail=detail, retry_in_s=delay)


def _error_shape(native: bool) -> ErrorShape:
    return ollama_error_body if native else error_body


async def _send_refusal(send: Send, native: bool, status: int, message: str, *, code: str | None = None,
                        retry_after: float | None = None) -> None:
    if not native:
        await send_error(send, status, message, code=code, retry_after=retry_after)
        return
    body = ollama_error_body(status, message)
    headers = error_headers(body, retry_after)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def create_ollama_app(config: OllamaConfig, scheduler: SchedulerClient, events: EventLog, gate: RequestGate,
                      max_body_size: int, metrics: StewardMetrics) -> QuartTrio:
    app = QuartTrio("steward-ollama")
    listener = OllamaListener(config, scheduler, events, max_body_size, gate.closed)
    quart_asgi = app.asgi_app

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] in ("/healthz", "/metrics"):
            await quart_asgi(scope, receive, send)
        elif scope["method"] == "POST" and scope["path"] in INFERENCE_PATHS:
            await listener.inference(scope, receive, send)
        else:
            await listener.passthrough(scope, receive, send)

    app.asgi_app = gated(gate, route, quart_asgi)  # type: ignore[method-assign]

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return turnstile_health(scheduler)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), content_type=METRICS_CONTENT_TYPE)

    return app


def turnstile_health(scheduler: SchedulerClient) -> dict[str, Any]:
    """gpu-turnstile's health shape: state idle | llm | image, LLM requests in flight, image pending."""
    snapshot = scheduler.snapshot()
    llm = sum(e.in_flight for e in snapshot.engines)
    state = "image" if snapshot.mode == "exclusive" else ("llm" if llm else "idle")
    return {"state": state, "llm_inflight": llm, "image_pending": snapshot.exclusive_waiting > 0,
            "mode": snapshot.mode, "queued": snapshot.queued}

