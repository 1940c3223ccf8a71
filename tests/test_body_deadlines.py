"""Request bodies: one deadline for the whole body, and HTTP/1.1 framing steward refuses.

``limits.body_timeout`` promises the whole body arrives within it once the headers are in.
The streamed and dropped bodies of the ComfyUI listener's upload and pass-through routes
timed only the gap between two chunks, so a body sent one byte a second was never cut
(issue 26, defect 2). The deadline tests run on MockClock with exact virtual times; the
framing tests against the listeners' server in-process, on raw sockets.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from supervisor.address import Address
from supervisor.observe.events import EventLog
from supervisor.gateway.http import asgi
from supervisor.gateway.http.asgi import BodyLimits, RequestError, open_streamed_body, read_body
from supervisor.gateway.errors import comfy_error_body, error_body
from supervisor.gateway.http.server import Listener, serve_http

LIMITS = BodyLimits(max_size=1000, timeout=10.0)


def trickle(size: int, every: float = 1.0) -> Callable[[], Any]:
    """An ASGI receive that hands on a body of *size* bytes one byte each *every* seconds."""
    sent = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        await trio.sleep(every)
        sent += 1
        return {"type": "http.request", "body": b"x", "more_body": sent < size}

    return receive


def scope_with(length: int | None) -> dict[str, Any]:
    headers = [(b"content-length", str(length).encode())] if length is not None else []
    return {"type": "http", "path": "/upload/image", "headers": headers}


async def test_a_streamed_body_that_trickles_is_cut_at_the_deadline_of_the_whole_body(
        autojump_clock: trio.testing.MockClock) -> None:
    # Before: each byte came within the 10 s gap allowed, and the body's 100 s went through.
    body = await open_streamed_body(scope_with(100), trickle(100), LIMITS)
    with pytest.raises(RequestError) as refused:
        async for _ in body.chunks():
            pass
    assert (refused.value.status, refused.value.code, refused.value.close) == (408, "request_timeout", True)
    assert trio.current_time() == 10.0


async def test_a_chunked_streamed_body_that_trickles_is_cut_too(autojump_clock: trio.testing.MockClock) -> None:
    body = await open_streamed_body(scope_with(None), trickle(100, every=0.5), LIMITS)
    with pytest.raises(RequestError) as refused:
        async for _ in body.chunks():
            pass
    assert refused.value.status == 408 and trio.current_time() == 10.0


async def test_a_streamed_body_in_time_goes_through_whole(autojump_clock: trio.testing.MockClock) -> None:
    body = await open_streamed_body(scope_with(9), trickle(9), LIMITS)
    assert b"".join([chunk async for chunk in body.chunks()]) == b"x" * 9
    assert body.ended.is_set() and trio.current_time() == 9.0


async def test_an_over_limit_body_that_trickles_is_dropped_only_until_the_deadline(
        autojump_clock: trio.testing.MockClock) -> None:
    # Declared past the limit: read and dropped (up to twice the limit) before the 413. Before,
    # dropping went on as long as bytes kept coming: 2,000 s of this trickle.
    with pytest.raises(RequestError) as refused:
        await open_streamed_body(scope_with(5000), trickle(5000), LIMITS)
    assert (refused.value.status, refused.value.close) == (413, True)  # not all read: the connection goes
    assert trio.current_time() == 10.0


async def test_the_deadline_counts_from_when_the_headers_were_in(autojump_clock: trio.testing.MockClock) -> None:
    for read in ("whole", "streamed"):
        scope = {**scope_with(100), asgi.HEADERS_IN: trio.current_time()}
        await trio.sleep(4)  # the route looked at the body only now
        started = trio.current_time()
        with pytest.raises(RequestError) as refused:
            if read == "whole":
                await read_body(scope, trickle(100), LIMITS)
            else:
                async for _ in (await open_streamed_body(scope, trickle(100), LIMITS)).chunks():
                    pass
        assert refused.value.status == 408
        assert trio.current_time() == started + 6.0, read


async def test_a_whole_body_that_trickles_is_cut_at_the_deadline(autojump_clock: trio.testing.MockClock) -> None:
    with pytest.raises(RequestError) as refused:
        await read_body(scope_with(100), trickle(100), LIMITS)
    assert (refused.value.status, refused.value.code) == (408, "request_timeout")
    assert trio.current_time() == 10.0


# ---- framing: raw HTTP/1.1 against the listeners' server ------------------------------------------


async def echo_length(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers what it was told of the body: its Content-Length (if any) and its bytes."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = await read_body(scope, receive, LIMITS)
    answer = json.dumps({"content_length": asgi.header_value(scope, b"content-length"),
                         "body": (body or b"").decode()}).encode()
    await asgi.send_whole(send, 200, [(b"content-type", b"application/json")], answer)


@asynccontextmanager
async def open_listener(shape: Any = error_body) -> AsyncIterator[tuple[str, int, EventLog]]:
    channel, _ = trio.open_memory_channel[Any](math.inf)
    events = EventLog(channel, recent_max=1000)
    async with trio.open_nursery() as nursery:
        listener = Listener("comfyui", echo_length, Address("127.0.0.1", 0), shape)
        running = await nursery.start(serve_http, [listener], 100, events)
        host, port = running.urls["comfyui"][0].removeprefix("http://").rsplit(":", 1)
        yield host, int(port), events
        nursery.cancel_scope.cancel()


async def exchange(host: str, port: int, request: bytes) -> tuple[bytes, bool]:
    """*request* on a fresh connection: what came back, and whether the server closed the connection."""
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        await stream.send_all(request)
        received = b""
        with trio.move_on_after(10) as waiting:
            while chunk := await stream.receive_some():
                received += chunk
        return received, not waiting.cancelled_caught


def split(answer: bytes) -> tuple[list[bytes], Any]:
    head, body = answer.split(b"\r\n\r\n", 1)
    return head.lower().split(b"\r\n"), json.loads(body)


@pytest.mark.parametrize("coding", [b"gzip", b"chunked, gzip", b"gzip, chunked", b"identity"])
async def test_an_unsupported_transfer_encoding_is_a_501_in_the_listeners_shape(coding: bytes) -> None:
    # Before: an empty 501 (hypercorn's), which no client of these APIs can read.
    async with open_listener(comfy_error_body) as (host, port, _events):
        answer, closed = await exchange(host, port, b"POST /upload/image HTTP/1.1\r\nHost: x\r\n"
                                                    b"Transfer-Encoding: " + coding + b"\r\n\r\n0\r\n\r\n")
        head, body = split(answer)
        assert head[0].startswith(b"http/1.1 501 ") and closed
        assert b"connection: close" in head and b"content-type: application/json; charset=utf-8" in head
        assert body["error"]["type"] == "unsupported_transfer_encoding" and body["node_errors"] == {}


async def test_a_request_head_h11_cannot_parse_is_a_400_in_the_listeners_shape() -> None:
    async with open_listener() as (host, port, _events):
        answer, closed = await exchange(host, port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                                    b"Content-Length: 1, 2\r\n\r\n")
        head, body = split(answer)
        assert head[0].startswith(b"http/1.1 400 ") and closed
        assert set(body["error"]) == {"message", "type", "param", "code"}


async def test_a_request_with_content_length_and_chunked_is_read_chunked_and_its_connection_closed() -> None:
    # RFC 9112 §6.1: the server MUST close the connection after responding to such a request.
    # Before: the connection stayed open for the next request (a smuggling vector).
    async with open_listener() as (host, port, _events):
        request = (b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
                   b"5\r\nhello\r\n0\r\n\r\n")
        answer, closed = await exchange(host, port, request)
        head, body = split(answer)
        assert head[0].startswith(b"http/1.1 200 ") and b"connection: close" in head
        assert closed, "the server must close the connection after the answer"
        assert body == {"content_length": None, "body": "hello"}  # the app never saw the other length
        # The same request framed one way keeps its connection.
        plain, closed = await exchange(host, port, b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n"
                                                   b"hello" + b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                                   b"Content-Length: 0\r\n\r\n")
        assert plain.count(b"HTTP/1.1 200 ") == 2 and closed
