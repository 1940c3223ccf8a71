"""Serving the listeners: HTTP/1.1 on hypercorn's protocol code, each connection in its own guard.

Why not ``hypercorn.trio.serve``: an exception in one connection's protocol code escapes
there into the nursery that runs every listener, and stops steward (hypercorn's HTTP/2
code raised ``KeyError`` when a response ended before the request body had arrived).
Here whatever goes wrong in a connection ends that connection, is logged as
``connection_error``, and touches nothing else.

Steward speaks HTTP/1.1 only: the clients of these APIs do, and every protocol served is
attack surface. HTTP/2 with prior knowledge is refused with 505; ``Upgrade: h2c`` is
ignored and the request answered in HTTP/1.1 (RFC 9110 §7.8 lets a server ignore Upgrade).

Also bounded here: open connections over all listeners (more are answered 503 and closed,
before file descriptors run out), how long a client may leave a response unread, and the
close itself, which runs shielded (hypercorn runs it in the handler's task, and a handler
cancelled at its end used to leave ``Connection: close`` and HTTP/1.0 answers open).
"""

from __future__ import annotations

import logging
import resource
import socket
from typing import Any

import attrs
import h11
import hypercorn.config
import trio
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.task_group import TaskGroup
from hypercorn.trio.worker_context import TrioSingleTask, WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import parse_socket_addr, wrap_app

from supervisor.events import EventLog
from supervisor.gateway.errors import ErrorShape
from supervisor.address import Address

_RECEIVE_SIZE = 65536
# A client that has not taken a single byte of its answer for this long is gone.
SEND_TIMEOUT_S = 120.0
# File descriptors kept out of the connection cap: engines' pipes, the event log, upstream sockets.
_FD_RESERVE = 256


class ListenError(Exception):
    """A listener's address cannot be bound (in use, not ours, no such interface)."""

    def __init__(self, name: str, address: Address, detail: str) -> None:
        super().__init__(f"cannot listen on {address} ({name} listener): {detail}")
        self.name, self.address, self.detail = name, address, detail


@attrs.frozen
class Listener:
    name: str  # openai, ollama, comfyui
    app: Any  # an ASGI app
    address: Address
    error_shape: ErrorShape  # for refusals written before any route is known


class _Http2Refused(Exception):
    """The client opened with HTTP/2's preface (``PRI * HTTP/2.0``)."""


class Http11Protocol(H11Protocol):
    """Hypercorn's HTTP/1.1 protocol without its switches to HTTP/2."""

    async def _check_protocol(self, event: h11.Request) -> None:
        if event.method == b"PRI" and event.target == b"*":
            raise _Http2Refused()
        # `Upgrade: h2c` is not acted on: the request is served in HTTP/1.1.


def connection_capacity(configured: int) -> int:
    """The connection cap, within the file descriptors this process may open (raised to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # not allowed here: the cap stays within the soft limit we have
    return max(1, min(configured, soft - _FD_RESERVE))


def hypercorn_settings(events: EventLog) -> hypercorn.config.Config:
    settings = hypercorn.config.Config()
    settings.accesslog = None
    # Hypercorn reports a failing ASGI app through its error log: make that an event.
    settings.errorlog = event_logger("steward.http", events)
    return settings


def event_logger(name: str, events: EventLog) -> logging.Logger:
    """A logging.Logger whose records become ``internal_error`` events (libraries log there)."""
    logger = logging.getLogger(name)
    logger.handlers = [_EventHandler(events)]
    logger.propagate = False
    logger.setLevel(logging.WARNING)
    return logger


class _EventHandler(logging.Handler):
    def __init__(self, events: EventLog) -> None:
        super().__init__()
        self.events = events

    def emit(self, record: logging.LogRecord) -> None:
        fields: dict[str, Any] = {"source": record.name, "detail": record.getMessage()}
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            fields["error"] = f"{type(exc).__name__}: {exc}"
            fields["traceback"] = logging.Formatter().formatException(record.exc_info)
        self.events.emit("internal_error", "error", **fields)


@attrs.define(eq=False)
class HttpServer:
    """The running listeners: where they are, and a switch to stop accepting."""

    urls: dict[str, list[str]]
    context: WorkerContext
    _listeners: list[trio.SocketListener]
    connections: trio.CapacityLimiter

    async def stop_accepting(self) -> None:
        """No new connections; idle keep-alive connections close, answers in progress go on."""
        for listener in self._listeners:
            await listener.aclose()
        await self.context.terminated.set()


async def serve_http(listeners: list[Listener], max_connections: int, events: EventLog, *,
                     task_status: trio.TaskStatus[HttpServer] = trio.TASK_STATUS_IGNORED) -> None:
    """Bind every listener, then serve connections until cancelled."""
    settings = hypercorn_settings(events)
    context = WorkerContext(None)
    capacity = trio.CapacityLimiter(connection_capacity(max_connections))
    bound = [(listener, _bind(listener), wrap_app(listener.app, settings.wsgi_max_body_size, "asgi"))
             for listener in listeners]
    async with trio.open_nursery() as nursery:
        for _, _, app in bound:
            lifespan = Lifespan(app, settings, {})
            await nursery.start(lifespan.handle_lifespan)
            await lifespan.wait_for_startup()
        sockets = []
        urls: dict[str, list[str]] = {}
        async with trio.open_nursery() as connections:
            for listener, sock, app in bound:
                serving = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
                sockets.append(serving)
                host, port = sock.getsockname()[:2]
                urls.setdefault(listener.name, []).append(f"http://{Address(host, port)}")
                handler = _ConnectionHandler(app, listener, settings, context, capacity, events)
                nursery.start_soon(_accept_forever, serving, handler, connections)
            task_status.started(HttpServer(urls, context, sockets, capacity))
            await trio.sleep_forever()


def _bind(listener: Listener) -> socket.socket:
    address = listener.address
    family = socket.AF_INET6 if address.is_ipv6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((address.host, address.port))
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        raise ListenError(listener.name, address, exc.strerror or str(exc)) from None
    sock.setblocking(False)
    return sock


async def _accept_forever(listener: trio.SocketListener, handler: _ConnectionHandler, nursery: trio.Nursery) -> None:
    while True:
        try:
            stream = await listener.accept()
        except trio.ClosedResourceError:
            return  # stop_accepting
        except OSError as exc:
            # Out of descriptors or buffers: the connections we have go on; try again shortly.
            handler.events.emit("accept_error", "warning", listener=handler.listener.name, detail=str(exc))
            await trio.sleep(0.1)
            continue
        nursery.start_soon(handler, stream)


@attrs.define(eq=False)
class _ConnectionHandler:
    app: Any
    listener: Listener
    settings: hypercorn.config.Config
    context: WorkerContext
    capacity: trio.CapacityLimiter
    events: EventLog

    async def __call__(self, stream: trio.SocketStream) -> None:
        try:
            self.capacity.acquire_on_behalf_of_nowait(stream)
        except trio.WouldBlock:
            self.events.emit("connection_refused", "debug", listener=self.listener.name, reason="max_connections",
                             open=self.capacity.borrowed_tokens)
            await _refuse(stream, 503, "Service Unavailable", self.listener.error_shape(
                503, "steward has too many open connections; try again shortly.", code="too_many_connections"),
                retry_after=1)
            return
        connection = _Connection(self.app, self.settings, self.context, stream)
        try:
            await connection.serve()
        except* _Http2Refused:
            self.events.emit("connection_refused", "debug", listener=self.listener.name, reason="http2",
                             open=self.capacity.borrowed_tokens)
            await _refuse(stream, 505, "HTTP Version Not Supported", self.listener.error_shape(
                505, "steward speaks HTTP/1.1 only.", code="http_version_not_supported"))
        except* Exception as group:
            error = group.exceptions[0]
            self.events.emit("connection_error", "warning", listener=self.listener.name,
                             client=connection.client, error=f"{type(error).__name__}: {error}")
        finally:
            self.capacity.release_on_behalf_of(stream)
            with trio.CancelScope(shield=True):
                await stream.aclose()


async def _refuse(stream: trio.SocketStream, status: int, reason: str, body: bytes,
                  retry_after: int | None = None) -> None:
    """A whole HTTP/1.1 answer written before any request was read, then close."""
    head = [f"HTTP/1.1 {status} {reason}", "content-type: application/json", f"content-length: {len(body)}",
            "connection: close"]
    if retry_after is not None:
        head.append(f"retry-after: {retry_after}")
    with trio.move_on_after(5.0), trio.CancelScope(shield=True):
        try:
            await stream.send_all(("\r\n".join(head) + "\r\n\r\n").encode() + body)
            await stream.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
            pass
        await stream.aclose()


@attrs.define(eq=False)
class _Connection:
    """One client connection: read, hand bytes to the protocol, write what it sends."""

    app: Any
    settings: hypercorn.config.Config
    context: WorkerContext
    stream: trio.SocketStream
    protocol: Http11Protocol | None = None
    client: str | None = None
    _send_lock: trio.Lock = attrs.Factory(trio.Lock)
    _idle: TrioSingleTask = attrs.Factory(TrioSingleTask)
    _task_group: TaskGroup | None = None

    async def serve(self) -> None:
        sock = self.stream.socket
        try:
            client = parse_socket_addr(sock.family, sock.getpeername())
            server = parse_socket_addr(sock.family, sock.getsockname())
        except OSError:
            return  # gone before we looked
        self.client = f"{client[0]}:{client[1]}" if client else None
        async with TaskGroup() as task_group:
            self._task_group = task_group
            self.protocol = Http11Protocol(self.app, self.settings, self.context, task_group, ConnectionState({}),
                                           False, client, server, self._protocol_send)
            await self.protocol.initiate()
            await self._idle.restart(task_group, self._close_when_idle)
            await self._read()

    async def _read(self) -> None:
        assert self.protocol is not None
        while True:
            try:
                data = await self.stream.receive_some(_RECEIVE_SIZE)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                break
            await self.protocol.handle(RawData(bytes(data)))
            if not data:
                break
        await self.protocol.handle(Closed())

    async def _protocol_send(self, event: Event) -> None:
        assert self.protocol is not None and self._task_group is not None
        if isinstance(event, RawData):
            gone = False
            async with self._send_lock:
                with trio.CancelScope(shield=True):
                    with trio.move_on_after(SEND_TIMEOUT_S) as sending:
                        try:
                            await self.stream.send_all(event.data)
                        except (trio.BrokenResourceError, trio.ClosedResourceError):
                            gone = True
                    if gone or sending.cancelled_caught:  # gone, or not reading: give up on it
                        gone = True
                        await self._close()
            if gone:
                await self.protocol.handle(Closed())
        elif isinstance(event, Closed):
            with trio.CancelScope(shield=True):
                await self._close()
            await self.protocol.handle(Closed())
        elif isinstance(event, Updated):
            if event.idle:
                await self._idle.restart(self._task_group, self._close_when_idle)
            else:
                await self._idle.stop()

    async def _close(self) -> None:
        try:
            await self.stream.send_eof()
        except (trio.BrokenResourceError, trio.BusyResourceError, trio.ClosedResourceError):
            pass
        await self.stream.aclose()

    async def _close_when_idle(self) -> None:
        """An idle keep-alive connection, or one whose request head never completed, closes
        after keep_alive_timeout (5 s), or at once when steward stops accepting."""
        with trio.move_on_after(self.settings.keep_alive_timeout):
            await self.context.terminated.wait()
        with trio.CancelScope(shield=True):
            assert self.protocol is not None
            await self.protocol.handle(Closed())
            await self.stream.aclose()
