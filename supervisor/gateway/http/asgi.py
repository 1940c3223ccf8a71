"""ASGI plumbing every listener shares: bodies read within bounds, JSON parsed safely,
errors in the listener's own shape, the client's disconnect.

A request steward refuses is a ``RequestError`` until it reaches the edge of a route,
where it becomes the error object the route's clients expect (OpenAI's, Ollama's or
ComfyUI's); nothing a client sends may turn into a 500.

Every body is read against one deadline: ``limits.body_timeout`` after the request's headers
were in (``body_deadline``), however the body is read (whole, streamed on, or dropped). A
deadline per chunk would let a client that sends one byte a second hold its connection for
ever; the whole body's deadline bounds how long any request may hold one before its answer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from supervisor.gateway.errors import ErrorShape, error_body, error_headers
from supervisor.safe_text import lone_surrogate

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGI = Callable[[Scope, Receive, Send], Awaitable[None]]


class RequestError(Exception):
    """A request steward refuses before queueing it; becomes the route's error object."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 close: bool = False, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.close = close  # the rest of the request was not read: the connection must go
        self.retry_after = retry_after


# Where the server notes, in the ASGI scope, when the request's headers were in (trio's clock).
HEADERS_IN = "steward.headers_in"


@attrs.frozen
class BodyLimits:
    max_size: int
    timeout: float  # the whole body, once the headers are in


def body_deadline(scope: Scope, limits: BodyLimits) -> float:
    """When the whole body must be in: ``limits.timeout`` after the headers were (as the server
    noted them; an app called without steward's server counts from its first look here)."""
    return scope.setdefault(HEADERS_IN, trio.current_time()) + limits.timeout


def _late(limits: BodyLimits) -> RequestError:
    return RequestError(408, f"The request body did not arrive within {limits.timeout:g}s of its headers.",
                        code="request_timeout", close=True)


async def read_body(scope: Scope, receive: Receive, limits: BodyLimits) -> bytes | None:
    """The whole request body, or None if the client left while sending it.

    Raises RequestError: 413 past ``max_size``, 408 if it is not in by ``body_deadline``
    (a client that sends headers and then trickles or stops must not hold a connection)."""
    declared = header_value(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_size:
        raise RequestError(413, f"Request body of {declared} bytes is larger than the limit of {limits.max_size} "
                                f"bytes.", code="request_too_large", close=True)
    chunks = []
    size = 0
    with trio.move_on_at(body_deadline(scope, limits)):
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limits.max_size:
                raise RequestError(413, f"Request body is larger than the limit of {limits.max_size} bytes.",
                                   code="request_too_large", close=True)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)
    raise _late(limits)


class ClientLeft(Exception):
    """The client went away while it sent its body."""


@attrs.define(eq=False)
class StreamedRequestBody:
    """A request body read as it arrives (an upload sent on as it comes), within the limits:
    413 past ``max_size``, 408 when it is not all in by *deadline* (``body_deadline``).
    Once it ended, ``receive_after`` hands on what follows (the client's disconnect)."""

    receive: Receive
    limits: BodyLimits
    length: int | None  # the client's Content-Length
    deadline: float  # trio's clock
    ended: trio.Event = attrs.Factory(trio.Event)

    async def chunks(self) -> AsyncIterator[bytes]:
        size = 0
        while True:
            with trio.move_on_at(self.deadline) as waiting:
                message = await self.receive()
            if waiting.cancelled_caught:
                raise _late(self.limits)
            if message["type"] == "http.disconnect":
                raise ClientLeft()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limits.max_size:
                raise RequestError(413, f"Request body is larger than the limit of {self.limits.max_size} bytes.",
                                   code="request_too_large", close=True)
            yield chunk
            if not message.get("more_body", False):
                self.ended.set()
                return

    async def receive_after(self) -> dict[str, Any]:
        await self.ended.wait()
        return await self.receive()


async def open_streamed_body(scope: Scope, receive: Receive, limits: BodyLimits) -> StreamedRequestBody:
    """The body to stream on; a declared length past the limit is a 413 now, once the body
    was read and dropped (a client still sending would never read an answer sent before)."""
    declared = header_value(scope, b"content-length")
    length = int(declared) if declared is not None and declared.isdigit() else None
    deadline = body_deadline(scope, limits)
    if length is not None and length > limits.max_size:
        whole = await discard_body(receive, deadline, cap=2 * limits.max_size)
        raise RequestError(413, f"Request body of {length} bytes is larger than the limit of {limits.max_size} "
                                f"bytes.", code="request_too_large", close=not whole)
    return StreamedRequestBody(receive, limits, length, deadline)


async def discard_body(receive: Receive, deadline: float, *, cap: int) -> bool:
    """Read and drop the body, at most *cap* bytes and until *deadline*; whether it ended."""
    size = 0
    while size <= cap:
        with trio.move_on_at(deadline) as waiting:
            message = await receive()
        if waiting.cancelled_caught or message["type"] == "http.disconnect":
            return False
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            return True
    return False


def parse_json(body: bytes) -> Any:
    """The JSON value of a body; RequestError(400) for anything that is not (too deep included),
    or that holds text no engine can read (a lone surrogate: safe_text.py)."""
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise RequestError(400, "We could not parse the JSON body of your request. The body must be valid "
                                "JSON.") from None
    except RecursionError:
        raise RequestError(400, "The JSON body of your request is nested too deeply.") from None
    refuse_lone_surrogates(body, value)
    return value


def refuse_lone_surrogates(body: bytes, value: Any) -> None:
    """RequestError(400) if a string in *value*, parsed from *body*, holds a lone UTF-16 surrogate."""
    where = lone_surrogate(body, value)
    if where is not None:
        raise RequestError(400, f"The JSON body of your request is not valid Unicode: {where} holds a lone "
                                f"UTF-16 surrogate (\\ud800-\\udfff without its pair).",
                           param=where if where != "(the body)" else None, code="invalid_unicode")


def dump_json(payload: Any) -> bytes:
    """The body to forward after steward removed its own fields (what parsed also dumps,
    unless it is so deep that only the parser's C stack coped)."""
    try:
        return json.dumps(payload).encode()
    except (RecursionError, ValueError):
        raise RequestError(400, "The JSON body of your request is nested too deeply.") from None


def header_value(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


async def send_whole(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    """A whole answer at once, with its Content-Length (any given in *headers* is replaced)."""
    headers = [(k, v) for k, v in headers if k != b"content-length"]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_error(send: Send, status: int, message: str, *, shape: ErrorShape = error_body,
                     param: str | None = None, code: str | None = None, retry_after: float | None = None,
                     close: bool = False) -> None:
    body = shape(status, message, param=param, code=code)
    headers = error_headers(body, retry_after, shape=shape)
    if close:
        headers.append((b"connection", b"close"))
    await send_whole(send, status, headers, body)


async def send_refusal(send: Send, exc: RequestError, shape: ErrorShape = error_body) -> None:
    await send_error(send, exc.status, exc.message, shape=shape, param=exc.param, code=exc.code, close=exc.close,
                     retry_after=exc.retry_after)


async def refuse_websocket(scope: Scope, send: Send, shape: ErrorShape, status: int, message: str,
                           code: str | None = None, retry_after: float | None = None) -> None:
    """A websocket handshake answered with an HTTP error (ASGI's denial response), or, where the
    server cannot send one, closed before it was accepted (the server answers 403)."""
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008})
        return
    body = shape(status, message, code=code)
    await send({"type": "websocket.http.response.start", "status": status,
                "headers": [*error_headers(body, retry_after, shape=shape), (b"connection", b"close")]})
    await send({"type": "websocket.http.response.body", "body": body, "more_body": False})


@attrs.define(eq=False)
class TrackedSend:
    """A send that knows when the client was handed its whole answer (the server's notice of
    the disconnect that follows may cancel the handler before its last send returns)."""

    send: Send
    started: bool = False
    complete: bool = False

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.complete = True
        await self.send(message)


@attrs.define(eq=False)
class Disconnect:
    """Watches for the client leaving and cancels *scope* when it does."""

    scope: trio.CancelScope
    happened: bool = False

    async def watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.happened = True
        self.scope.cancel(reason="client disconnected")


@asynccontextmanager
async def open_disconnect_watch(receive: Receive) -> AsyncIterator[Disconnect]:
    """The body of the ``async with`` is cancelled if the client leaves; ``happened`` says whether it did."""
    async with trio.open_nursery() as nursery:
        disconnect = Disconnect(nursery.cancel_scope)
        nursery.start_soon(disconnect.watch, receive)
        yield disconnect
        nursery.cancel_scope.cancel(reason="request finished")
