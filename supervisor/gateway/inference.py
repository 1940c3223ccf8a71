"""The inference routes as a lean ASGI handler: validate, queue, proxy.

This is the hot path of every request, so it speaks ASGI directly rather than going
through Quart's request machinery (which costs ~0.7 ms a request on this class of
machine, research/proxy_overhead.md); everything else stays in the Quart app.

Per request: read the body (bounded), find the model (aliases) and the class, strip
steward's own fields, wait for a grant from the scheduler, then stream the engine's
answer through unbuffered over one fresh upstream connection. A client that goes
away cancels all of it: the job leaves the queue, or the upstream request is closed.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import trio

from supervisor.events import EventLog
from supervisor.gateway.errors import error_body, error_headers
from supervisor.gateway.embeddings import EmbeddingsAssembly, split_inputs, step_body
from supervisor.gateway.relay import HOP_BY_HOP, UpstreamRequest, relay
from supervisor.gateway.upstream import UpstreamError, fetch_upstream
from supervisor.scheduler.actor import JobFailed, Lease, Request, SchedulerClient
from supervisor.scheduler.types import CLASSES

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

EMBEDDINGS_PATH = "/v1/embeddings"
INFERENCE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", EMBEDDINGS_PATH})
CLASS_HEADER = b"x-steward-class"
_FORWARDED_REQUEST_HEADERS = frozenset({b"accept", b"authorization", b"x-api-key"})


class RequestError(Exception):
    """A request steward refuses before queueing it; becomes an OpenAI error object."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


@attrs.frozen
class RoutedRequest:
    model: str
    klass: str
    stream: bool
    body: bytes
    payload: dict[str, Any]


@attrs.define(eq=False)
class InferenceHandler:
    scheduler: SchedulerClient
    events: EventLog
    aliases: Mapping[str, str]  # every accepted name -> model
    max_body_size: int
    embedding_chunk: int
    _endpoints: dict[str, tuple[str, int]] = attrs.Factory(dict)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = await read_body(scope, receive, self.max_body_size)
            if body is None:
                return  # the client left while sending
            routed = route_request(scope, body, self.aliases)
        except RequestError as exc:
            self.events.emit("bad_request", "debug", path=scope["path"], status=exc.status, code=exc.code,
                             detail=exc.message)
            await send_error(send, exc.status, exc.message, param=exc.param, code=exc.code)
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_on_disconnect, receive, nursery.cancel_scope)
            await self._serve(scope, routed, send)
            nursery.cancel_scope.cancel(reason="request finished")

    async def _serve(self, scope: Scope, routed: RoutedRequest, send: Send) -> None:
        chunks = None
        if scope["path"] == EMBEDDINGS_PATH:
            chunks = split_inputs(routed.payload, self.embedding_chunk)
        try:
            if chunks is not None:
                await self._serve_embedding_steps(scope, routed, chunks, send)
                return
            async with self.scheduler.open_grant(routed.model, routed.klass) as lease:
                host, port = self._endpoint(lease.grant.endpoint)
                await _proxy(host, port, scope, routed, send, lease)
        except JobFailed as exc:
            failure = exc.failure
            await send_error(send, failure.status, failure.message, code=failure.code,
                             retry_after=failure.retry_after)

    async def _serve_embedding_steps(self, scope: Scope, routed: RoutedRequest, chunks: list[list[Any]],
                                     send: Send) -> None:
        """One step per chunk, in order; a failing step fails the request, no partial answer."""
        async with self.scheduler.open_request() as request:
            await self._run_embedding_steps(scope, routed, chunks, send, request)

    async def _run_embedding_steps(self, scope: Scope, routed: RoutedRequest, chunks: list[list[Any]], send: Send,
                                   request: Request) -> None:
        assembly = EmbeddingsAssembly()
        for step, chunk in enumerate(chunks, 1):
            async with self.scheduler.open_grant(routed.model, routed.klass, request=request, step=step,
                                                 steps=len(chunks)) as lease:
                host, port = self._endpoint(lease.grant.endpoint)
                try:
                    status, headers, body = await fetch_upstream(
                        host, port, b"POST", scope["raw_path"] or scope["path"].encode(),
                        _request_headers(scope), step_body(routed.payload, chunk))
                except UpstreamError as exc:
                    lease.status = 502
                    await send_error(send, 502, f"engine {lease.grant.engine!r} failed during step {step}/"
                                     f"{len(chunks)} of the request: {exc}", code="engine_error")
                    return
                lease.status = status
                if status != 200:
                    # The engine's own error, unchanged, like a single-step request would get it.
                    await _send_whole(send, status, [(k, v) for k, v in headers if k not in HOP_BY_HOP], body)
                    return
                try:
                    assembly.add(json.loads(body))
                except (ValueError, KeyError, TypeError) as exc:
                    lease.status = 502
                    await send_error(send, 502, f"engine {lease.grant.engine!r} answered step {step}/{len(chunks)} "
                                     f"with an unreadable embeddings response: {exc}", code="engine_error")
                    return
        body = assembly.response()
        await _send_whole(send, 200, [(b"content-type", b"application/json")], body)

    def _endpoint(self, endpoint: str) -> tuple[str, int]:
        cached = self._endpoints.get(endpoint)
        if cached is None:
            host, _, port = endpoint.removeprefix("http://").rpartition(":")
            cached = self._endpoints[endpoint] = (host.strip("[]"), int(port))
        return cached


def route_request(scope: Scope, body: bytes, aliases: Mapping[str, str]) -> RoutedRequest:
    """Parse and validate; strip steward's own class field and model suffix. Pure."""
    try:
        payload = json.loads(body)
    except ValueError:
        raise RequestError(400, "We could not parse the JSON body of your request. The body must be valid "
                                "JSON.") from None
    if not isinstance(payload, dict):
        raise RequestError(400, "The request body must be a JSON object.")
    name = payload.get("model")
    if not isinstance(name, str) or not name:
        raise RequestError(400, "You must provide a model parameter.", param="model")
    changed = False
    klass = header_value(scope, CLASS_HEADER)
    source = "header"
    if "steward" in payload:
        extra = payload.pop("steward")
        changed = True
        if not isinstance(extra, dict):
            raise RequestError(400, "'steward' must be an object like {\"class\": \"background\"}.", param="steward")
        if "class" in extra:
            klass, source = extra["class"], "steward.class"
    if "@" in name:
        name, _, klass = name.rpartition("@")
        source = "model"
        payload["model"] = name
        changed = True
    if klass is None:
        klass = "interactive"
    if klass not in CLASSES:
        param = {"header": "X-Steward-Class", "steward.class": "steward.class", "model": "model"}[source]
        raise RequestError(400, f"Unknown class {klass!r}: use one of {', '.join(CLASSES)}.", param=param,
                           code="invalid_class")
    model = aliases.get(name)
    if model is None:
        raise RequestError(404, f"The model '{name}' does not exist.", param="model", code="model_not_found")
    stream = payload.get("stream") is True
    return RoutedRequest(model=model, klass=klass, stream=stream,
                         body=json.dumps(payload).encode() if changed else body, payload=payload)


def _request_headers(scope: Scope) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", b"application/json")]
    return headers + [(k, v) for k, v in scope["headers"] if k in _FORWARDED_REQUEST_HEADERS]


async def _send_whole(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers = [(k, v) for k, v in headers if k != b"content-length"]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _proxy(host: str, port: int, scope: Scope, routed: RoutedRequest, send: Send, lease: Lease) -> None:
    request = UpstreamRequest(host, port, b"POST", scope["raw_path"] or scope["path"].encode(),
                              _request_headers(scope), routed.body)

    def on_status(status: int) -> None:
        lease.status = status

    await relay(send, request, what=f"engine {lease.grant.engine!r}", on_status=on_status)


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes | None:
    declared = header_value(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"Request body of {declared} bytes is larger than the limit of {limit} bytes.",
                           code="request_too_large")
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"Request body is larger than the limit of {limit} bytes.",
                               code="request_too_large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def cancel_on_disconnect(receive: Receive, cancel_scope: trio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    cancel_scope.cancel(reason="client disconnected")


async def send_error(send: Send, status: int, message: str, *, param: str | None = None, code: str | None = None,
                     retry_after: float | None = None) -> None:
    body = error_body(status, message, param=param, code=code)
    await send({"type": "http.response.start", "status": status, "headers": error_headers(body, retry_after)})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def header_value(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None
