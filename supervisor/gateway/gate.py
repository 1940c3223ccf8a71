"""The gateway's door: counts requests in flight and closes for shutdown.

Graceful shutdown waits for requests, not connections: an idle keep-alive
connection a client never closes must not hold steward open.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from supervisor.gateway.errors import error_body, error_headers

ASGI = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]], Callable[[dict[str, Any]], Awaitable[None]]],
                Awaitable[None]]


@attrs.define(eq=False)
class RequestGate:
    in_flight: int = 0
    closed: trio.Event = attrs.Factory(trio.Event)  # set once shutdown begins
    _idle: trio.Event = attrs.Factory(trio.Event)

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


def gated(gate: RequestGate, route: ASGI, other: ASGI) -> ASGI:
    """An ASGI app that counts each HTTP request through *gate* and sends it to *route*;
    other scopes (lifespan, websockets) go to *other*. A closing gate answers 503."""

    async def app(scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
                  send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await other(scope, receive, send)
            return
        if not gate.enter():
            body = error_body(503, "steward is shutting down.", code="shutting_down")
            await send({"type": "http.response.start", "status": 503,
                        "headers": [*error_headers(body, 5), (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        try:
            await route(scope, receive, send)
        finally:
            gate.leave()

    return app
