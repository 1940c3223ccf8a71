"""Websockets passed through unbuffered (ComfyUI's /ws progress messages).

Never takes the GPU: a websocket is long-lived and only reports. Each message is
forwarded as it arrives, both ways; when either side closes, so does the other. When
steward stops, the client is told so (close code 1001, going away): a websocket must not
hold a shutdown open.
"""

from __future__ import annotations

from typing import Any

import trio
import trio_websocket

from supervisor.gateway.openai.inference import Receive, Scope, Send

# ComfyUI's previews can be large binary frames.
MAX_MESSAGE = 64 * 1024 * 1024


async def proxy_websocket(scope: Scope, receive: Receive, send: Send, host: str, port: int,
                          extra_headers: list[tuple[bytes, bytes]], stopping: trio.Event) -> None:
    if (await receive())["type"] != "websocket.connect":
        return
    resource = (scope["raw_path"] or scope["path"].encode()).decode("latin-1")
    if scope.get("query_string"):
        resource += "?" + scope["query_string"].decode("latin-1")
    try:
        async with trio_websocket.open_websocket(host, port, resource, use_ssl=False, extra_headers=extra_headers,
                                                 max_message_size=MAX_MESSAGE, connect_timeout=10,
                                                 disconnect_timeout=2) as upstream:
            await send({"type": "websocket.accept"})
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_client_to_upstream, receive, upstream, nursery.cancel_scope)
                nursery.start_soon(_upstream_to_client, upstream, send, nursery.cancel_scope)
                nursery.start_soon(_close_when_stopping, stopping, send, nursery.cancel_scope)
    except (trio_websocket.HandshakeError, OSError, trio.TooSlowError):
        await send({"type": "websocket.close", "code": 1011})


async def _client_to_upstream(receive: Receive, upstream: trio_websocket.WebSocketConnection,
                              done: trio.CancelScope) -> None:
    while True:
        message: dict[str, Any] = await receive()
        if message["type"] != "websocket.receive":
            break  # the client went away
        data = message.get("text") if message.get("text") is not None else message.get("bytes")
        try:
            await upstream.send_message(data)
        except trio_websocket.ConnectionClosed:
            break
    done.cancel(reason="client closed")


async def _upstream_to_client(upstream: trio_websocket.WebSocketConnection, send: Send,
                              done: trio.CancelScope) -> None:
    try:
        while True:
            data = await upstream.get_message()
            await send({"type": "websocket.send", **({"text": data} if isinstance(data, str) else {"bytes": data})})
    except trio_websocket.ConnectionClosed:
        await send({"type": "websocket.close", "code": 1000})
    done.cancel(reason="upstream closed")


async def _close_when_stopping(stopping: trio.Event, send: Send, done: trio.CancelScope) -> None:
    await stopping.wait()
    await send({"type": "websocket.close", "code": 1001, "reason": "steward is stopping"})
    done.cancel(reason="steward is stopping")
