"""The listeners' server in-process: every connection in its own guard, HTTP/1.1 only."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio

from supervisor.address import Address
from supervisor.events import EventLog
from supervisor.gateway import server
from supervisor.gateway.connection_budget import HEALTH_SEATS
from supervisor.gateway.errors import error_body
from supervisor.gateway.server import HttpServer, Listener, serve_http


async def hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
    await send({"type": "http.response.body", "body": b"hello"})


@asynccontextmanager
async def open_server(max_connections: int = 100) -> AsyncIterator[tuple[HttpServer, EventLog]]:
    send, _receive = trio.open_memory_channel[Any](math.inf)
    events = EventLog(send, recent_max=1000)
    async with trio.open_nursery() as nursery:
        listener = Listener("openai", hello, Address("127.0.0.1", 0), error_body)
        running = await nursery.start(serve_http, [listener], max_connections, events)
        yield running, events
        nursery.cancel_scope.cancel()


async def test_an_error_in_one_connection_ends_that_connection_only(monkeypatch: pytest.MonkeyPatch) -> None:
    serve = server._Connection.serve
    calls = 0

    async def fails_once(self: server._Connection) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise KeyError(1)  # what hypercorn's HTTP/2 code raised
        await serve(self)

    monkeypatch.setattr(server._Connection, "serve", fails_once)
    async with open_server() as (running, events), httpx.AsyncClient() as client:
        url = running.urls["openai"][0]
        with pytest.raises(httpx.TransportError):
            await client.get(url)
        assert (await client.get(url)).text == "hello"
        errors = [e.fields for e in events.recent if e.name == "connection_error"]
        assert errors == [{"listener": "openai", "client": errors[0]["client"], "error": "KeyError: 1"}]


async def test_connections_beyond_the_cap_get_503_and_the_cap_frees_when_they_close() -> None:
    async with open_server(max_connections=2) as (running, events):
        address = running.urls["openai"][0].removeprefix("http://").rsplit(":", 1)
        # The cap, then the health seats beyond it (connection_budget.py)
        held = [await trio.open_tcp_stream(address[0], int(address[1])) for _ in range(2 + HEALTH_SEATS)]
        extra = await trio.open_tcp_stream(address[0], int(address[1]))
        answer = b""
        while chunk := await extra.receive_some():
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 503 ") and b"too_many_connections" in answer
        for stream in held:
            await stream.aclose()
        async with httpx.AsyncClient() as client:
            while True:  # the held connections are released as the server notices them close
                try:
                    if (await client.get(running.urls["openai"][0])).status_code == 200:
                        break
                except httpx.TransportError:
                    await trio.sleep(0.05)
        assert any(e.name == "connection_refused" for e in events.recent)


async def test_stop_accepting_closes_the_listening_socket() -> None:
    async with open_server() as (running, _events), httpx.AsyncClient() as client:
        url = running.urls["openai"][0]
        assert (await client.get(url)).status_code == 200
        await running.stop_accepting()
        async with httpx.AsyncClient() as fresh:
            with pytest.raises(httpx.ConnectError):
                await fresh.get(url)


def test_the_connection_cap_stays_within_the_file_descriptor_limit() -> None:
    import resource

    capacity = server.connection_capacity(10**9)
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert 1 <= capacity <= soft - 256
    assert server.connection_capacity(5) == 5
