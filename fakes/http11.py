"""A small HTTP/1.1 server layer (h11 over trio) for the fake runtimes.

It knows nothing of any runtime's API: a fake gives it a handler (one call per request,
with an :class:`Exchange` to answer through) and a :class:`ConnectionPolicy` that says
which connection habits of the imitated server's HTTP library to copy (keep-alive limits,
a close after an error, the ``Server`` header). What it does for every fake:

* requests read in full (``100 Continue`` when asked), an unparseable one answered with a
  bare 400 and a close;
* keep-alive as the client and the policy allow, an idle close after ``idle_timeout``;
* responses with a length, or streamed chunked (SSE events, NDJSON lines, raw bytes);
* :meth:`Exchange.run_until_client_leaves`: work cancelled the moment the client goes away;
* ``HEAD`` answered with the headers of the ``GET`` answer and no body;
* :meth:`Exchange.accept_websocket`: the RFC 6455 upgrade, then a :class:`WebSocket` (wsproto)
  that owns the connection until the handler returns;
* :func:`watch_signals`: SIGTERM/SIGINT cancel a scope, for a fake's ``main``.
"""

from __future__ import annotations

import http
import itertools
import json
import signal
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl

import attrs
import h11
import trio
import wsproto
import wsproto.events as ws_events
from wsproto.utilities import generate_accept_token

RECV_BYTES = 65536
READ_TIMEOUT_S = 600.0        # once a request has started arriving
JSON_TYPE = b"application/json; charset=utf-8"


def dump_json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


@attrs.frozen
class ConnectionPolicy:
    """The connection habits of the HTTP library a fake imitates."""

    server: bytes                        # the Server header of every response (b"": none, like Go)
    idle_timeout: float = 5.0            # close a kept-alive connection idle this long
    max_requests: int | None = None      # the max_requests-th response says "Connection: close"
    close_after_error: bool = False      # no reuse after a response >= 400 (cpp-httplib)
    keep_alive_header: bool = False      # announce "Keep-Alive: timeout=.., max=.." (cpp-httplib)
    read_timeout: float = READ_TIMEOUT_S  # for the rest of a request once it has started arriving

    @property
    def keep_alive_value(self) -> bytes:
        value = f"timeout={self.idle_timeout:g}"
        if self.max_requests is not None:
            value += f", max={self.max_requests}"
        return value.encode()


@attrs.frozen
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    client: str
    keep_alive: bool  # what the client allows

    @classmethod
    def from_h11(cls, head: h11.Request, body: bytes, client: str) -> Request:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in head.headers}
        target = head.target.decode("latin-1")
        path, _, query = target.partition("?")
        tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        # h11 never keeps an HTTP/1.0 connection alive, so neither do we.
        keep_alive = head.http_version == b"1.1" and "close" not in tokens
        return cls(head.method.decode(), path, query, headers, body, client, keep_alive)

    @property
    def query_params(self) -> dict[str, str]:
        """The query string as a dict (the last value of a repeated name wins)."""
        return dict(parse_qsl(self.query, keep_blank_values=True))

    @property
    def websocket_key(self) -> str | None:
        """``Sec-WebSocket-Key`` of a websocket upgrade request, else None."""
        if self.method != "GET" or self.headers.get("upgrade", "").lower() != "websocket":
            return None
        return self.headers.get("sec-websocket-key") or None


@attrs.define(eq=False)
class HttpConnection:
    stream: trio.SocketStream
    client: str
    policy: ConnectionPolicy
    h11: h11.Connection = attrs.field(factory=lambda: h11.Connection(h11.SERVER))

    async def send(self, *events: h11.Event) -> None:
        await self.stream.send_all(b"".join(self.h11.send(e) or b"" for e in events))

    async def _receive(self) -> bytes:
        try:
            return await self.stream.receive_some(RECV_BYTES)
        except trio.BrokenResourceError:
            return b""  # reset by peer reads as EOF

    async def read_request(self) -> Request | None:
        """The next full request, or None when the client closed or stayed idle too long."""
        head: h11.Request | None = None
        body: list[bytes] = []
        deadline = trio.current_time() + self.policy.idle_timeout
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                if self.h11.they_are_waiting_for_100_continue:
                    await self.send(h11.InformationalResponse(status_code=100, headers=[]))
                with trio.move_on_at(deadline):
                    self.h11.receive_data(await self._receive())
                    continue
                return None  # idle keep-alive timeout (or a stalled upload): just close
            if isinstance(event, h11.Request):
                head, deadline = event, trio.current_time() + self.policy.read_timeout
            elif isinstance(event, h11.Data):
                body.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                return Request.from_h11(head, b"".join(body), self.client)
            else:  # ConnectionClosed
                return None

    async def wait_peer_closed(self) -> None:
        """Return once the client has closed (or reset) its end of the connection."""
        while data := await self._receive():
            self.h11.receive_data(data)  # a pipelined request: h11 keeps it for the next cycle

    async def send_bad_request(self) -> None:
        try:
            await self.send(h11.Response(status_code=400, headers=[(b"server", self.policy.server),
                                                                   (b"content-length", b"0"),
                                                                   (b"connection", b"close")]),
                            h11.EndOfMessage())
        except (h11.LocalProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    @property
    def reusable(self) -> bool:
        return self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE


@attrs.define(eq=False)
class Exchange:
    """One request and its response, with the policy's rules for the connection."""

    conn: HttpConnection
    request: Request
    keep_alive: bool
    status: int = 0
    last_send: float = 0.0
    headers: list[tuple[bytes, bytes]] = attrs.field(factory=list)  # extra headers for the response head

    def _connection_headers(self, status: int) -> list[tuple[bytes, bytes]]:
        policy = self.conn.policy
        if status >= 400 and policy.close_after_error:
            self.keep_alive = False
        if not self.keep_alive:
            return [(b"connection", b"close")]
        return [(b"keep-alive", policy.keep_alive_value)] if policy.keep_alive_header else []

    def _server_header(self) -> list[tuple[bytes, bytes]]:
        server = self.conn.policy.server
        return [(b"server", server)] if server else []

    def _head(self, status: int, content_type: bytes, length: int | None) -> h11.Response:
        self.status = status
        headers = [(b"content-type", content_type)] + self._server_header()
        if length is not None:
            headers.append((b"content-length", str(length).encode()))
        headers += self._connection_headers(status) + self.headers
        return h11.Response(status_code=status, headers=headers, reason=http.HTTPStatus(status).phrase.encode())

    async def respond(self, status: int, body: bytes, content_type: bytes = JSON_TYPE) -> None:
        events: list[h11.Event] = [self._head(status, content_type, len(body))]
        if body and self.request.method != "HEAD":  # HEAD: GET's headers, no body
            events.append(h11.Data(data=body))
        await self.conn.send(*events, h11.EndOfMessage())

    async def respond_json(self, status: int, value: object) -> None:
        await self.respond(status, dump_json(value))

    async def start_stream(self, content_type: bytes = b"text/event-stream") -> None:
        await self.conn.send(self._head(200, content_type, None))  # h11 picks chunked
        self.last_send = trio.current_time()

    async def send_raw(self, data: bytes) -> None:
        await self.conn.send(h11.Data(data=data))
        self.last_send = trio.current_time()

    async def send_event(self, value: object) -> None:
        """One SSE ``data:`` event."""
        await self.send_raw(b"data: " + dump_json(value) + b"\n\n")

    async def send_json_line(self, value: object) -> None:
        """One NDJSON line."""
        await self.send_raw(dump_json(value) + b"\n")

    async def end_stream(self) -> None:
        await self.conn.send(h11.EndOfMessage())

    async def accept_websocket(self, extra_headers: list[tuple[bytes, bytes]] | None = None) -> WebSocket:
        """Answer ``101 Switching Protocols``; the connection is the returned websocket's from now on.

        Only for a request whose :attr:`Request.websocket_key` is set. The connection closes
        when the handler returns.
        """
        key = self.request.websocket_key
        if key is None:
            raise ValueError("not a websocket upgrade request")
        headers = [(b"upgrade", b"websocket"), (b"connection", b"Upgrade"),
                   (b"sec-websocket-accept", generate_accept_token(key.encode("latin-1"))),
                   *self._server_header(), *self.headers, *(extra_headers or [])]
        await self.conn.send(h11.InformationalResponse(status_code=101, headers=headers))
        self.status, self.keep_alive = 101, False
        trailing, _closed = self.conn.h11.trailing_data
        return WebSocket(self.conn.stream, trailing)

    async def run_until_client_leaves(self, work: Callable[[], Awaitable[None]]) -> bool:
        """Run *work*, cancelling it as soon as the client disconnects. True if it did."""
        gone = False
        async with trio.open_nursery() as nursery:
            async def watch() -> None:
                nonlocal gone
                await self.conn.wait_peer_closed()
                gone = True
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            try:
                await work()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                gone = True
            nursery.cancel_scope.cancel()
        if gone:
            self.keep_alive = False
        return gone


@attrs.define(eq=False)
class WebSocket:
    """The server end of an accepted websocket: messages in and out, pings answered.

    One task may :meth:`receive` while others send (sends are serialized). A peer that
    closes or drops the connection makes :meth:`receive` return None and sends raise
    ``trio.BrokenResourceError``/``trio.ClosedResourceError``.
    """

    stream: trio.abc.Stream
    initial: bytes = b""
    _ws: wsproto.connection.Connection = attrs.field(init=False)
    _send_lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    _eof: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        self._ws = wsproto.connection.Connection(wsproto.ConnectionType.SERVER)
        if self.initial:
            self._ws.receive_data(self.initial)

    @property
    def open(self) -> bool:
        return not self._eof and self._ws.state is wsproto.connection.ConnectionState.OPEN

    async def _send(self, event: ws_events.Event) -> None:
        async with self._send_lock:
            try:
                data = self._ws.send(event)
            except wsproto.utilities.LocalProtocolError:
                raise trio.ClosedResourceError("websocket is closing") from None
            await self.stream.send_all(data)

    async def send_text(self, text: str) -> None:
        await self._send(ws_events.TextMessage(data=text))

    async def send_bytes(self, data: bytes) -> None:
        await self._send(ws_events.BytesMessage(data=data))

    async def send_json(self, value: object) -> None:
        await self.send_text(dump_json(value).decode())

    async def receive(self) -> str | bytes | None:
        """The next whole message, or None once the peer has closed (or dropped) the connection."""
        parts: list[str | bytes] = []
        while not self._eof:
            for event in self._ws.events():
                if isinstance(event, ws_events.Ping):
                    await self._reply(event.response())
                elif isinstance(event, ws_events.CloseConnection):
                    if self._ws.state is wsproto.connection.ConnectionState.REMOTE_CLOSING:
                        await self._reply(event.response())
                    self._eof = True
                    return None
                elif isinstance(event, ws_events.Message):
                    parts.append(event.data)
                    if event.message_finished:
                        return "".join(parts) if isinstance(event, ws_events.TextMessage) else b"".join(parts)
            try:
                data = await self.stream.receive_some(RECV_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                self._eof = True
                return None
            self._ws.receive_data(data)
        return None

    async def _reply(self, event: ws_events.Event) -> None:
        try:
            await self._send(event)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._eof = True

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Send a close frame (if still open); the handler returning closes the TCP connection."""
        if self.open:
            await self._reply(ws_events.CloseConnection(code=code, reason=reason))


Handler = Callable[[Exchange], Awaitable[None]]


def _ignore_failure(client: str, exc: Exception) -> None:
    pass


@attrs.define(eq=False)
class HttpServer:
    """Serves *handler*, one trio task per connection, requests in turn on each."""

    handler: Handler
    policy: ConnectionPolicy
    on_failure: Callable[[str, Exception], None] = _ignore_failure  # a handler bug: (client, exception)
    connections: int = 0  # TCP connections accepted

    async def serve(self, host: str, port: int, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
                    ) -> None:
        """Bind, hand the bound port to ``task_status``, then serve until cancelled.

        A bind failure raises its OSError before ``started``, so ``nursery.start`` raises it.
        """
        listeners = await trio.open_tcp_listeners(port, host=host)
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(self.serve_connection, listeners)

    async def serve_connection(self, stream: trio.SocketStream | trio.SSLStream[trio.SocketStream]) -> None:
        self.connections += 1
        try:
            sock = stream.transport_stream.socket if isinstance(stream, trio.SSLStream) else stream.socket
            client = sock.getpeername()[0]
        except OSError:
            client = "?"
        conn = HttpConnection(stream, client, self.policy)
        try:
            await self._serve_requests(conn)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away mid-response
        except Exception as exc:  # a bug here must not take the whole server down
            self.on_failure(client, exc)
        finally:
            await trio.aclose_forcefully(stream)

    async def _serve_requests(self, conn: HttpConnection) -> None:
        limit = self.policy.max_requests
        for served in itertools.count(1):
            try:
                request = await conn.read_request()
            except h11.RemoteProtocolError:
                await conn.send_bad_request()
                return
            if request is None:
                return
            ex = Exchange(conn, request, keep_alive=request.keep_alive and (limit is None or served < limit))
            await self.handler(ex)
            if not (ex.keep_alive and conn.reusable):
                return
            conn.h11.start_next_cycle()



async def watch_signals(cancel_scope: trio.CancelScope, on_signal: Callable[[int], None] | None = None, *,
                        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Cancel *cancel_scope* at the first SIGTERM or SIGINT (after calling ``on_signal(signum)``)."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for signum in signals:
            if on_signal is not None:
                on_signal(signum)
            cancel_scope.cancel()
            return
