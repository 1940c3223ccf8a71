"""A small HTTP/1.1 client over trio sockets (h11), for the proxy's hot path.

One fresh connection per request, closed when the request ends: llama-server drops
pooled keep-alive connections (research/protocols.md §3.8), and closing the socket
is how a client disconnect cancels the generation upstream. A hand-rolled h11
client costs about a third of httpx per request here (research/proxy_overhead.md).
"""

from __future__ import annotations

import math
import socket
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from contextlib import asynccontextmanager

import attrs
import h11
import trio

_RECEIVE_SIZE = 65536


class UpstreamError(Exception):
    """The engine could not be reached, or broke the connection or the protocol."""


class UpstreamUnreachable(UpstreamError):
    """The connection itself failed: no byte of the request was sent, so a retry is safe."""


class UpstreamStalled(UpstreamError):
    """The upstream went silent for longer than its timeout allows (frozen, or overloaded)."""


@attrs.frozen
class Timeouts:
    """How long an upstream may take: to its first response byte, then between two chunks."""

    first_byte: float = math.inf
    chunk: float = math.inf


NO_TIMEOUTS = Timeouts()


@attrs.frozen
class StreamedBody:
    """A request body sent as it arrives from the client (an image upload), not held whole.

    *length* is the client's Content-Length (None: sent chunked). The chunks may raise to
    stop the request (the body went past its limit): the upstream connection is dropped."""

    length: int | None
    chunks: AsyncIterable[bytes]


@attrs.define(eq=False)
class UpstreamResponse:
    status: int
    headers: list[tuple[bytes, bytes]]
    _stream: trio.SocketStream
    _conn: h11.Connection
    _timeouts: Timeouts

    async def iter_body(self) -> AsyncIterator[bytes]:
        """Yield body bytes as they arrive; raises UpstreamError if the body is cut short."""
        while True:
            event = await _next_event(self._conn, self._stream, self._timeouts.chunk, "between two chunks")
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return


@asynccontextmanager
async def open_upstream_request(host: str, port: int, method: bytes, target: bytes,
                                headers: Sequence[tuple[bytes, bytes]], body: bytes | StreamedBody,
                                timeouts: Timeouts = NO_TIMEOUTS) -> AsyncIterator[UpstreamResponse]:
    sock = trio.socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    stream = trio.SocketStream(sock)
    try:
        try:
            await sock.connect((host, port))
        except OSError as exc:
            raise UpstreamUnreachable(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from None
        conn = h11.Connection(h11.CLIENT)
        try:
            await _send_request(stream, conn, f"{host}:{port}", method, target, headers, body)
        except trio.BrokenResourceError as exc:
            raise UpstreamError(f"connection to {host}:{port} broke while sending: {exc}") from None
        with trio.move_on_after(timeouts.first_byte) as waiting:
            event = await _next_event(conn, stream)
            while isinstance(event, h11.InformationalResponse):
                event = await _next_event(conn, stream)
        if waiting.cancelled_caught:
            raise UpstreamStalled(f"no answer within {timeouts.first_byte:g}s")
        if not isinstance(event, h11.Response):
            raise UpstreamError("the engine sent a body without a response")
        yield UpstreamResponse(event.status_code, list(event.headers), stream, conn, timeouts)
    finally:
        with trio.CancelScope(shield=True):
            await stream.aclose()


async def _send_request(stream: trio.SocketStream, conn: h11.Connection, host: str, method: bytes, target: bytes,
                        headers: Sequence[tuple[bytes, bytes]], body: bytes | StreamedBody) -> None:
    length = len(body) if isinstance(body, bytes) else body.length
    framing = (b"content-length", str(length).encode()) if length is not None else (b"transfer-encoding", b"chunked")
    request_headers = [(b"host", host.encode()), framing, (b"connection", b"close"), *headers]
    data = conn.send(h11.Request(method=method, target=target, headers=request_headers))
    if isinstance(body, bytes):
        await stream.send_all(data + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))
        return
    await stream.send_all(data)
    async for chunk in body.chunks:
        if chunk:
            await stream.send_all(conn.send(h11.Data(data=chunk)))
    await stream.send_all(conn.send(h11.EndOfMessage()))


async def _next_event(conn: h11.Connection, stream: trio.SocketStream, timeout: float = math.inf,
                      gap: str = "") -> h11.Event:
    closed_early: str | None = None
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            if closed_early:  # h11 words an early close as a protocol violation; say what happened
                raise UpstreamError(closed_early) from None
            raise UpstreamError(f"engine broke the HTTP protocol: {exc}") from None
        if isinstance(event, h11.ConnectionClosed):
            raise UpstreamError(_closed_early(conn.their_state))
        if event is not h11.NEED_DATA:
            return event
        with trio.move_on_after(timeout) as waiting:
            try:
                data = await stream.receive_some(_RECEIVE_SIZE)
            except trio.BrokenResourceError as exc:
                raise UpstreamError(f"connection reset by the engine: {exc}") from None
        if waiting.cancelled_caught:
            raise UpstreamStalled(f"nothing for {timeout:g}s {gap}".rstrip())
        if not data:
            closed_early = _closed_early(conn.their_state)
        conn.receive_data(data)


def _closed_early(state: object) -> str:
    if state is h11.SEND_RESPONSE:
        return "the engine closed the connection without answering"
    return "the engine closed the connection before the response ended"


async def fetch_upstream(host: str, port: int, method: bytes, target: bytes,
                         headers: Sequence[tuple[bytes, bytes]], body: bytes, timeouts: Timeouts = NO_TIMEOUTS,
                         ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """One whole request and response, for answers steward must read whole (ComfyUI's to a queued prompt)."""
    async with open_upstream_request(host, port, method, target, headers, body, timeouts) as response:
        chunks = [chunk async for chunk in response.iter_body()]
        return response.status, response.headers, b"".join(chunks)
