"""Serving the listeners: HTTP/1.1 on hypercorn's protocol code, each connection in its own guard.

Why not ``hypercorn.trio.serve``: an exception in one connection's protocol code escapes
there into the nursery that runs every listener, and stops steward (hypercorn's HTTP/2
code raised ``KeyError`` when a response ended before the request body had arrived).
Here whatever goes wrong in a connection ends that connection, is logged as
``connection_error``, and touches nothing else.

Steward speaks HTTP/1.1 only: the clients of these APIs do, and every protocol served is
attack surface. HTTP/2 with prior knowledge is refused with 505; ``Upgrade: h2c`` is
ignored and the request answered in HTTP/1.1 (RFC 9110 §7.8 lets a server ignore Upgrade).

Also bounded here: open connections, each listener within its share of the cap
(connection_budget.py: more are answered 503 and closed, before file descriptors run out;
``/livez`` and ``/healthz`` are still answered at the cap), how long a client may leave a
response unread, and the close itself, which runs shielded (hypercorn runs it in the
handler's task, and a handler cancelled at its end used to leave ``Connection: close`` and
HTTP/1.0 answers open). Each request's scope notes when its headers were in: the deadline
of its whole body counts from there (asgi.py ``body_deadline``).

HTTP/1.1 framing a request may not use is answered in the listener's error shape and the
connection closed: a Transfer-Encoding other than ``chunked`` (501), a head h11 cannot
parse (400) or too large (431). A request with both Content-Length and
``Transfer-Encoding: chunked`` is read as chunked, its Content-Length dropped before the app
sees it, and its connection closed after the answer (RFC 9112 §6.1, §6.3: request smuggling).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import resource
import select
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import h11
import hypercorn.config
import trio
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol.events import Event as StreamEvent
from hypercorn.protocol.events import Response
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.task_group import TaskGroup
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import parse_socket_addr, wrap_app

from supervisor.address import Address
from supervisor.observe.events import EventLog
from supervisor.gateway.http.asgi import ASGI, HEADERS_IN, Receive, Scope, Send, refuse_websocket, send_error
from supervisor.gateway.door import READINESS_PREFIX
from supervisor.gateway.http.connection_budget import ConnectionBudget, Seat
from supervisor.gateway.errors import ErrorShape, error_headers

_RECEIVE_SIZE = 65536
# A client that has not taken a single byte of its answer for this long is gone.
SEND_TIMEOUT_S = 120.0
# File descriptors kept out of the connection cap: engines' pipes, the event log, upstream sockets,
# and the health seats beyond the cap (connection_budget.py).
_FD_RESERVE = 256
# What a connection on a health seat may ask: the probes, a model's readiness among them
# (/healthz/models/NAME: a cluster's readiness probe must not fail because steward is busy).
HEALTH_PATHS = frozenset({"/livez", "/healthz"})
_CAPPED = "steward has too many open connections; try again shortly."
# HTTP/1.1 that h11 refuses, by the status it suggests: what the client is told, and the error's code.
_PROTOCOL_ERRORS = {
    400: ("steward could not read this HTTP/1.1 request.", "bad_request"),
    431: ("The request's head is too large.", "request_header_fields_too_large"),
    501: ("steward reads request bodies sent whole (Content-Length) or with Transfer-Encoding: chunked, no other "
          "transfer coding.", "unsupported_transfer_encoding"),
}


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
    shape_for: Callable[[Scope], ErrorShape] | None = None  # once the path is known, where it speaks several

    def shape_of(self, scope: Scope) -> ErrorShape:
        return self.shape_for(scope) if self.shape_for is not None else self.error_shape


class _Http2Refused(Exception):
    """The client opened with HTTP/2's preface (``PRI * HTTP/2.0``)."""


class Http11Protocol(H11Protocol):
    """Hypercorn's HTTP/1.1 protocol without its switches to HTTP/2, its refusals in the
    listener's error shape, and a connection that closes after a request framed two ways."""

    def __init__(self, *args: Any, error_shape: ErrorShape, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.error_shape = error_shape
        self.close_after_answer = False

    async def _check_protocol(self, event: h11.Request) -> None:
        if event.method == b"PRI" and event.target == b"*":
            raise _Http2Refused()
        # `Upgrade: h2c` is not acted on: the request is served in HTTP/1.1.

    async def _create_stream(self, request: h11.Request) -> None:
        # h11 reads the body as chunked when both are given; the app must not see the other length.
        names = [name for name, _ in request.headers]
        if b"transfer-encoding" in names and b"content-length" in names:
            self.close_after_answer = True
            request = h11.Request(method=request.method, target=request.target, http_version=request.http_version,
                                  headers=[(k, v) for k, v in request.headers if k != b"content-length"])
        await super()._create_stream(request)

    async def stream_send(self, event: StreamEvent) -> None:
        # The client learns from the answer that this connection will not take another: when
        # steward is stopping, and when the answer starts before the request's body was read
        # (a refusal decided on the head alone). Hypercorn closes such a connection after the
        # answer; an answer without ``Connection: close`` told the client it could send its next
        # request on it, and a pooled client that did read only "server disconnected".
        if isinstance(event, Response) and event.status_code >= 200 and (
                self.close_after_answer or self.context.terminated.is_set() or self._request_unread()):
            event = dataclasses.replace(event, headers=[*event.headers, (b"connection", b"close")])
        await super().stream_send(event)

    def _request_unread(self) -> bool:
        connection = self.connection
        return isinstance(connection, h11.Connection) and connection.their_state is h11.SEND_BODY

    async def _send_error_response(self, status_code: int) -> None:
        """What h11 refused (a malformed head, an unknown transfer coding), as an error object."""
        message, code = _PROTOCOL_ERRORS.get(status_code, _PROTOCOL_ERRORS[400])
        body = self.error_shape(status_code, message, code=code)
        headers = [*error_headers(body, shape=self.error_shape), (b"connection", b"close"),
                   *self.config.response_headers("h11")]
        await self._send_h11_event(h11.Response(status_code=status_code, headers=headers))
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())


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


# An idle keep-alive connection closes after this. Longer than the 5 s after which httpx (and
# so the openai and anthropic SDKs, LangChain, aider) drops an idle pooled connection: the
# client gives it up first, and never sends a request on one steward is closing. At 5 s
# against 5 s a client under load did ("server disconnected", the request never seen).
KEEP_ALIVE_S = 7.5
# A request whose bytes had come when the idle time ended: at most this long more for the
# reader to take it (a head that never completes still closes).
REQUEST_GRACE_S = 2.5
# When steward stops accepting, an idle kept-alive connection stays open this long: a client
# that had just decided to send its next request on it is answered (503, ``Connection: close``)
# instead of reading "server disconnected" with the request never seen.
STOPPING_GRACE_S = 0.25


def hypercorn_settings(events: EventLog) -> hypercorn.config.Config:
    settings = hypercorn.config.Config()
    settings.keep_alive_timeout = KEEP_ALIVE_S
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
    connections: ConnectionBudget
    # Set once steward has stopped accepting and every connection has closed.
    all_closed: trio.Event = attrs.Factory(trio.Event)

    async def stop_accepting(self) -> None:
        """No new connections; idle keep-alive connections close, answers in progress go on,
        and so do requests already sent on a connection (each answered, then its connection closed)."""
        for listener in self._listeners:
            await listener.aclose()
        await self.context.terminated.set()


async def serve_http(listeners: list[Listener], max_connections: int, events: EventLog, *,
                     task_status: trio.TaskStatus[HttpServer] = trio.TASK_STATUS_IGNORED) -> None:
    """Bind every listener, then serve connections until cancelled (after ``stop_accepting``,
    ``all_closed`` says when the last connection is gone)."""
    settings = hypercorn_settings(events)
    context = WorkerContext(None)
    budget = ConnectionBudget.split(connection_capacity(max_connections), [listener.name for listener in listeners])
    bound = [(listener, _bind(listener), _Apps.of(listener, settings, budget, events)) for listener in listeners]
    async with trio.open_nursery() as nursery:
        for _, _, apps in bound:
            lifespan = Lifespan(apps.any, settings, {})
            await nursery.start(lifespan.handle_lifespan)
            await lifespan.wait_for_startup()
        sockets: list[trio.SocketListener] = []
        server = HttpServer({}, context, sockets, budget)
        async with trio.open_nursery() as connections:
            for listener, sock, apps in bound:
                serving = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
                sockets.append(serving)
                host, port = sock.getsockname()[:2]
                server.urls.setdefault(listener.name, []).append(f"http://{Address(host, port)}")
                handler = _ConnectionHandler(apps, listener, settings, context, budget, events)
                nursery.start_soon(_accept_forever, serving, handler, connections)
            task_status.started(server)
            await context.terminated.wait()
        server.all_closed.set()
        await trio.sleep_forever()


@attrs.frozen
class _Apps:
    """A listener's app as hypercorn calls it: for a connection within the cap, and for one
    on a health seat (only /livez and /healthz, then close)."""

    any: Any
    health: Any

    @classmethod
    def of(cls, listener: Listener, settings: hypercorn.config.Config, budget: ConnectionBudget,
           events: EventLog) -> _Apps:
        noted = _noting_headers_in(listener.app)
        return cls(wrap_app(noted, settings.wsgi_max_body_size, "asgi"),
                   wrap_app(_health_only(noted, listener, budget, events), settings.wsgi_max_body_size, "asgi"))


def _noting_headers_in(app: ASGI) -> ASGI:
    """Each request's scope notes when its headers were in (hypercorn starts the app then)."""

    async def noted(scope: Scope, receive: Receive, send: Send) -> None:
        scope[HEADERS_IN] = trio.current_time()
        await app(scope, receive, send)

    return noted


def _health_only(app: ASGI, listener: Listener, budget: ConnectionBudget, events: EventLog) -> ASGI:
    """*app* on a connection beyond the listener's share: /livez, /healthz and a model's readiness, each answer closing
    its connection; any other request gets the 503 a connection refused at once would have."""

    async def health(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (scope["path"] in HEALTH_PATHS or scope["path"].startswith(READINESS_PREFIX)):
            await app(scope, receive, _closing(send))
        else:
            events.emit("connection_refused", "debug", listener=listener.name, reason="max_connections",
                        open=budget.open)
            shape = listener.shape_of(scope)
            if scope["type"] == "websocket":
                await refuse_websocket(scope, send, shape, 503, _CAPPED, code="too_many_connections", retry_after=1)
            else:
                await send_error(send, 503, _CAPPED, shape=shape, code="too_many_connections", retry_after=1,
                                 close=True)

    return health


def _closing(send: Send) -> Send:
    async def closing(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
        await send(message)

    return closing


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
        # Taken here, in the order the connections came, before the handler's task runs.
        nursery.start_soon(handler, stream, handler.budget.take(handler.listener.name), name=handler.task_name)


@attrs.define(eq=False)
class _ConnectionHandler:
    apps: _Apps
    listener: Listener
    settings: hypercorn.config.Config
    context: WorkerContext
    budget: ConnectionBudget
    events: EventLog

    @property
    def task_name(self) -> str:
        # Short: trio writes the current task's name into every cancel's reason, and would
        # otherwise name the task by this handler's whole repr (its apps, settings, budget).
        return f"steward {self.listener.name} connection"

    async def __call__(self, stream: trio.SocketStream, seat: Seat | None) -> None:
        name = self.listener.name
        if seat is None:
            self.events.emit("connection_refused", "debug", listener=name, reason="max_connections",
                             open=self.budget.open)
            await _refuse(stream, 503, "Service Unavailable", self.listener.error_shape, _CAPPED,
                          "too_many_connections", retry_after=1)
            return
        app = self.apps.any if seat is Seat.ANY else self.apps.health
        connection = _Connection(app, self.settings, self.context, stream, self.listener.error_shape)
        try:
            await connection.serve()
        except* _Http2Refused:
            self.events.emit("connection_refused", "debug", listener=name, reason="http2", open=self.budget.open)
            await _refuse(stream, 505, "HTTP Version Not Supported", self.listener.error_shape,
                          "steward speaks HTTP/1.1 only.", "http_version_not_supported")
        except* Exception as group:
            error = group.exceptions[0]
            self.events.emit("connection_error", "warning", listener=name,
                             client=connection.client, error=f"{type(error).__name__}: {error}")
        finally:
            self.budget.give_back(name, seat)
            with trio.CancelScope(shield=True):
                await stream.aclose()


async def _refuse(stream: trio.SocketStream, status: int, reason: str, shape: ErrorShape, message: str, code: str,
                  retry_after: int | None = None) -> None:
    """A whole HTTP/1.1 answer written before any request was read, then close."""
    body = shape(status, message, code=code)
    headers = [*error_headers(body, retry_after, shape=shape), (b"connection", b"close")]
    head = f"HTTP/1.1 {status} {reason}\r\n".encode() + b"".join(k + b": " + v + b"\r\n" for k, v in headers)
    with trio.move_on_after(5.0), trio.CancelScope(shield=True):
        try:
            await stream.send_all(head + b"\r\n" + body)
            await stream.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
            pass
        await stream.aclose()


@attrs.define(eq=False)
class _IdleTimer:
    """A connection's idle close: one timer task at a time, a restart cancelling the last one.

    Hypercorn's TrioSingleTask does this with a lock and ``nursery.start``; here restarting and
    stopping are synchronous (nothing to lock, no checkpoint), as they run once per request.
    A timer stopped before its task began never runs: its scope is cancelled already."""

    _running: trio.CancelScope | None = None

    def restart(self, task_group: TaskGroup, close_when_idle: Callable[[], Awaitable[None]]) -> None:
        self.stop()
        self._running = trio.CancelScope()
        assert task_group._nursery is not None
        task_group._nursery.start_soon(_run_within, self._running, close_when_idle, name="steward idle timer")

    def stop(self) -> None:
        if self._running is not None:
            self._running.cancel()
            self._running = None


async def _run_within(scope: trio.CancelScope, action: Callable[[], Awaitable[None]]) -> None:
    with scope:
        await action()


@attrs.define(eq=False)
class _Connection:
    """One client connection: read, hand bytes to the protocol, write what it sends."""

    app: Any
    settings: hypercorn.config.Config
    context: WorkerContext
    stream: trio.SocketStream
    error_shape: ErrorShape
    protocol: Http11Protocol | None = None
    client: str | None = None
    _send_lock: trio.Lock = attrs.Factory(trio.Lock)
    _idle: _IdleTimer = attrs.Factory(lambda: _IdleTimer())
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
                                           False, client, server, self._protocol_send, error_shape=self.error_shape)
            await self.protocol.initiate()
            self._idle.restart(task_group, self._close_when_idle)
            await self._read()

    async def _read(self) -> None:
        """Bytes from the client to the protocol. Read without a checkpoint between taking them
        from the socket and handing them over (``receive_some`` has one): a close decided
        meanwhile (``_close_when_idle``) finds them in one place or the other."""
        assert self.protocol is not None
        sock = self.stream.socket
        while sock.fileno() != -1:  # closed meanwhile by the protocol, the idle timer or a failed send
            try:
                await trio.lowlevel.wait_readable(sock)
                # Its descriptor now: one closed while this task waited to run may be another connection's.
                fd = sock.fileno()
                if fd == -1:
                    break
                data = os.read(fd, _RECEIVE_SIZE)
            except BlockingIOError:
                continue  # woken with nothing to read
            except (trio.ClosedResourceError, OSError):
                break
            await self.protocol.handle(RawData(data))
            if not data:
                break
        await self.protocol.handle(Closed())
        self._idle.stop()  # the client went: its seat is free now, not when the idle timer ends

    async def _protocol_send(self, event: Event) -> None:
        assert self.protocol is not None and self._task_group is not None
        if isinstance(event, RawData):
            gone = False
            async with self._sending():
                # Shielded, within its own deadline (one scope: this runs for every chunk of every answer).
                with trio.CancelScope(shield=True, deadline=trio.current_time() + SEND_TIMEOUT_S) as sending:
                    try:
                        taken = self._write_at_once(event.data)
                        if taken < len(event.data):
                            await self.stream.send_all(memoryview(event.data)[taken:])
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        gone = True
                if gone or sending.cancelled_caught:  # gone, or not reading: give up on it
                    gone = True
                    with trio.CancelScope(shield=True):
                        await self._close()
            if gone:
                await self.protocol.handle(Closed())
        elif isinstance(event, Closed):
            with trio.CancelScope(shield=True):
                await self._close()
            await self.protocol.handle(Closed())
        elif isinstance(event, Updated):
            # Shielded: the answer's last send comes from the app's task, which may be cancelled
            # as it ends (the client's disconnect is watched); the timer must start all the same,
            # or an idle keep-alive connection would never close.
            if event.idle:
                self._idle.restart(self._task_group, self._close_when_idle)
            else:
                self._idle.stop()

    @asynccontextmanager
    async def _sending(self) -> AsyncIterator[None]:
        """The send lock; taken without a trip through trio's scheduler when it is free (each
        chunk of every answer takes it), and, as ``Lock.acquire``, not by a cancelled task."""
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self._send_lock.acquire_nowait()
        except trio.WouldBlock:
            await self._send_lock.acquire()
        try:
            yield
        finally:
            self._send_lock.release()

    def _write_at_once(self, data: bytes) -> int:
        """How much of *data* the socket took without waiting (the rest goes by ``send_all``),
        written as ``_read`` reads: no checkpoint when the socket has room, as it almost always
        has. A closed or broken connection raises as ``send_all`` would."""
        sock = self.stream.socket
        if sock.did_shutdown_SHUT_WR or sock.fileno() == -1:
            raise trio.ClosedResourceError("the connection was closed")
        if not data:
            return 0
        try:
            return os.write(sock.fileno(), data)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise trio.BrokenResourceError(f"the connection broke: {exc}") from None

    def _request_begun(self) -> bool:
        """Whether a request is here: unread in the socket, read and not yet a whole head, or
        whole and being answered (the reader then stops this task, at its next checkpoint)."""
        assert self.protocol is not None
        connection = self.protocol.connection
        if not isinstance(connection, h11.Connection) or connection.their_state is not h11.IDLE:
            return True
        if connection.trailing_data[0]:
            return True
        poller = select.poll()
        try:
            poller.register(self.stream.socket.fileno(), select.POLLIN)
        except (OSError, ValueError):
            return False  # closed already
        return bool(poller.poll(0))

    async def _close(self) -> None:
        try:
            await self.stream.send_eof()
        except (trio.BrokenResourceError, trio.BusyResourceError, trio.ClosedResourceError):
            pass
        await self.stream.aclose()

    async def _close_when_idle(self) -> None:
        """An idle keep-alive connection, or one whose request head never completed, closes
        after keep_alive_timeout (KEEP_ALIVE_S), or at once when steward stops accepting. A
        request the client had already sent when that moment came is read and answered first
        (while stopping, with 503 and ``Connection: close``): closing on it would lose it, and
        the client would read only "server disconnected". That grace is REQUEST_GRACE_S at most
        (or keep_alive_timeout where that is shorter), so a head that never completes still closes.
        As steward stops, an idle connection waits STOPPING_GRACE_S first: a request a client
        sends then is answered too (the reader stops this task when it takes one)."""
        with trio.move_on_after(self.settings.keep_alive_timeout):
            await self.context.terminated.wait()
        if self.context.terminated.is_set() and not self._request_begun():
            await trio.sleep(min(self.settings.keep_alive_timeout, STOPPING_GRACE_S))  # a request stops this task
        if self._request_begun():
            with trio.move_on_after(min(self.settings.keep_alive_timeout, REQUEST_GRACE_S)):
                await trio.sleep_forever()  # until the reader takes the request (it stops this task)
        await trio.lowlevel.checkpoint_if_cancelled()  # the reader took a request as the grace ended
        # No checkpoint from the last look at the socket to its close: a request the reader took
        # in between would be lost with the connection, the client reading "server disconnected".
        self.stream.socket.close()
        with trio.CancelScope(shield=True):
            assert self.protocol is not None
            await self.protocol.handle(Closed())
            await self.stream.aclose()
