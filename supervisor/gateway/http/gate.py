"""The gateway's door: counts requests in flight and closes for shutdown.

Graceful shutdown waits for requests, not for idle connections: an idle keep-alive
connection closes at once (server.py), unless a request had already come on it, which is
answered (503 here, the door being closed) before it closes. Requests still running
when the wait ends (the shutdown timeout, or a second signal) are cut, each with an
answer its client can read: a 503 if nothing was sent yet, else an error in the
stream's own framing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import trio

from supervisor.gateway.openai.api_routes import stream_error_for
from supervisor.gateway.errors import StreamError, error_body, error_headers, error_in_stream

Message = dict[str, Any]
ASGI = Callable[[Message, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

CUT_MESSAGE = "steward stopped before the answer was complete"
# After a cut, how long the last bytes of each answer may take to go out.
CUT_GRACE_S = 2.0


@attrs.define(eq=False)
class RequestGate:
    in_flight: int = 0
    closed: trio.Event = attrs.Factory(trio.Event)  # set once shutdown begins
    _idle: trio.Event = attrs.Factory(trio.Event)
    _running: set[trio.CancelScope] = attrs.Factory(set)

    @property
    def closing(self) -> bool:
        return self.closed.is_set()

    def enter(self) -> bool:
        """Admit one request; False once the gateway is closing."""
        if self.closing:
            return False
        self.in_flight += 1
        return True

    def leave(self) -> None:
        self.in_flight -= 1
        if self.closing and self.in_flight == 0:
            self._idle.set()

    def close(self) -> None:
        self.closed.set()
        if self.in_flight == 0:
            self._idle.set()

    async def wait_drained(self) -> None:
        await self._idle.wait()

    @contextmanager
    def open_cuttable(self) -> Iterator[trio.CancelScope]:
        """A scope around one request's work that ``cut`` cancels."""
        with trio.CancelScope() as scope:
            self._running.add(scope)
            try:
                yield scope
            finally:
                self._running.discard(scope)

    def cut(self) -> int:
        """End every request still running (each answers with an error); how many there were."""
        for scope in self._running:
            scope.cancel(reason="cut at shutdown")
        return len(self._running)


@attrs.define(eq=False)
class _Response:
    """What a handler has sent so far, so that a cut can end it properly."""

    send: Callable[[Message], Awaitable[None]]
    stream_error: StreamError = error_in_stream  # the route's (Anthropic's event on /v1/messages)
    headers: list[tuple[bytes, bytes]] | None = None  # the answer's, once it started
    complete: bool = False

    async def forward(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.headers = message.get("headers", [])  # read only if the answer is cut
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.complete = True
        await self.send(message)

    async def end_with_error(self) -> None:
        if self.complete:
            return
        with trio.move_on_after(CUT_GRACE_S), trio.CancelScope(shield=True):
            try:
                if self.headers is None:
                    body = error_body(503, CUT_MESSAGE, code="shutting_down")
                    await self.send({"type": "http.response.start", "status": 503,
                                     "headers": [*error_headers(body, 5), (b"connection", b"close")]})
                else:
                    content_type = next((v for k, v in self.headers if k.lower() == b"content-type"), b"")
                    body = self.stream_error(content_type, CUT_MESSAGE, code="shutting_down")
                await self.send({"type": "http.response.body", "body": body, "more_body": False})
            except Exception:  # noqa: BLE001 - the connection is already gone: nothing to tell
                pass


def gated(gate: RequestGate, route: ASGI, other: ASGI) -> ASGI:
    """An ASGI app that counts each HTTP request through *gate* and sends it to *route*;
    other scopes (lifespan, websockets) go to *other*. A closing gate answers 503."""

    async def app(scope: Message, receive: Callable[[], Awaitable[Message]],
                  send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await other(scope, receive, send)
            return
        if not gate.enter():
            body = error_body(503, "steward is shutting down.", code="shutting_down")
            await send({"type": "http.response.start", "status": 503,
                        "headers": [*error_headers(body, 5), (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        response = _Response(send, stream_error_for(scope))
        try:
            with gate.open_cuttable() as running:
                await route(scope, receive, response.forward)
            if running.cancelled_caught:
                await response.end_with_error()
        finally:
            gate.leave()

    return app
