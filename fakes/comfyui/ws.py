"""The websocket clients (``/ws?clientId=``): JSON text frames ``{"type", "data"}``, to one sid or all.

Each client has an outbox drained by its own task, so a slow client never stalls the worker;
one that falls ``OUTBOX`` messages behind is disconnected. Reconnecting with the same
clientId replaces the old socket (which is closed).
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import trio

from fakes.http11 import Exchange, WebSocket, dump_json

OUTBOX = 1000


@attrs.define(eq=False)
class Client:
    sid: str
    ws: WebSocket
    outbox: trio.MemorySendChannel[str]
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)

    def push(self, text: str) -> None:
        try:
            self.outbox.send_nowait(text)
        except trio.WouldBlock:
            self.scope.cancel()  # too far behind: drop it
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass


@attrs.define(eq=False)
class Hub:
    features: dict[str, Any]
    clients: dict[str, Client] = attrs.field(factory=dict)

    def send(self, event: str, data: dict[str, Any], sid: str | None = None) -> None:
        """To the client *sid* (nothing if it is not connected), or to everyone when sid is None."""
        text = dump_json({"type": event, "data": data}).decode()
        if sid is None:
            for client in list(self.clients.values()):
                client.push(text)
        elif (client := self.clients.get(sid)) is not None:
            client.push(text)

    def close_all(self) -> None:
        for client in list(self.clients.values()):
            client.scope.cancel()

    async def serve(self, ex: Exchange, sid: str, hello: list[tuple[str, dict[str, Any]]]) -> None:
        """Accept the upgrade and serve the socket until it closes; *hello* goes out first."""
        ws = await ex.accept_websocket()
        send, receive = trio.open_memory_channel[str](OUTBOX)
        client = Client(sid, ws, send)
        if (old := self.clients.get(sid)) is not None:
            old.scope.cancel()
        self.clients[sid] = client
        for event, data in hello:
            client.push(dump_json({"type": event, "data": data}).decode())
        try:
            with client.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump, client, receive)
                    await self._read(client)
                    nursery.cancel_scope.cancel()
        finally:
            if self.clients.get(sid) is client:
                del self.clients[sid]
            send.close()
            with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                await ws.close()

    async def _pump(self, client: Client, receive: trio.MemoryReceiveChannel[str]) -> None:
        try:
            async for text in receive:
                await client.ws.send_text(text)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            client.scope.cancel()

    async def _read(self, client: Client) -> None:
        """Until the peer closes: answer ``feature_flags``, ignore anything else."""
        while (message := await client.ws.receive()) is not None:
            if not isinstance(message, str):
                continue
            try:
                value = json.loads(message)
            except ValueError:
                continue
            if isinstance(value, dict) and value.get("type") == "feature_flags":
                client.push(dump_json({"type": "feature_flags", "data": self.features}).decode())
