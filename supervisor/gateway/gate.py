"""The gateway's door: counts requests in flight and closes for shutdown.

Graceful shutdown waits for requests, not connections: an idle keep-alive
connection a client never closes must not hold steward open.
"""

from __future__ import annotations

import attrs
import trio


@attrs.define(eq=False)
class RequestGate:
    in_flight: int = 0
    closing: bool = False
    _idle: trio.Event = attrs.Factory(trio.Event)

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
        self.closing = True
        if self.in_flight == 0:
            self._idle.set()

    async def wait_drained(self) -> None:
        await self._idle.wait()
