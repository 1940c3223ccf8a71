"""Each listener's share of ``limits.max_connections``, and health probes answered at the cap.

One pool for all listeners let 300 uploads trickling into the ComfyUI listener fill it: chat
and ``/livez`` on the OpenAI listener answered 503 for as long as they lasted (issue 26,
defect 2). The budget's arithmetic is tested on its own; the rest against the listeners'
server in-process, on raw sockets.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from supervisor.address import Address
from supervisor.observe.events import EventLog
from supervisor.gateway.http.asgi import BodyLimits, open_streamed_body, send_whole
from supervisor.gateway.http.connection_budget import HEALTH_SEATS, ConnectionBudget, Seat
from supervisor.gateway.errors import anthropic_error_body, comfy_error_body, error_body
from supervisor.gateway.http.server import Listener, serve_http

# ---- the budget's arithmetic -------------------------------------------------------------------


def test_each_listener_keeps_a_reserve_and_the_rest_is_shared() -> None:
    budget = ConnectionBudget.split(1000, ["openai", "ollama", "comfyui", "openai"])
    assert (budget.reserve, budget.shared, budget.capacity) == (166, 502, 1000)
    # One listener takes all it can: its reserve and the shared part; then only health seats.
    seats = [budget.take("comfyui") for _ in range(166 + 502 + HEALTH_SEATS + 1)]
    assert seats.count(Seat.ANY) == 668 and seats.count(Seat.HEALTH) == HEALTH_SEATS and seats[-1] is None
    # The others still have their reserves, and no more.
    for name in ("openai", "ollama"):
        assert [budget.take(name) for _ in range(166)] == [Seat.ANY] * 166
        assert budget.take(name) is Seat.HEALTH
    assert budget.open == 1000 + 3 * HEALTH_SEATS - 2 * (HEALTH_SEATS - 1)


def test_a_small_cap_is_all_shared() -> None:
    budget = ConnectionBudget.split(3, ["openai", "ollama", "comfyui"])
    assert (budget.reserve, budget.shared) == (0, 3)
    assert [budget.take("ollama") for _ in range(3)] == [Seat.ANY] * 3
    assert budget.take("openai") is Seat.HEALTH


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.booleans()), max_size=300),
       st.integers(min_value=1, max_value=40))
def test_the_budget_never_exceeds_the_cap_and_never_takes_a_reserve(ops: list[tuple[str, bool]],
                                                                     capacity: int) -> None:
    budget = ConnectionBudget.split(capacity, ["a", "b", "c"])
    held: dict[str, list[Seat]] = {"a": [], "b": [], "c": []}
    for name, opening in ops:
        if opening or not held[name]:
            within = sum(seat is Seat.ANY for seat in held[name])
            seat = budget.take(name)
            if within < budget.reserve:
                assert seat is Seat.ANY  # a listener's reserve is its own, whatever the others hold
            if seat is not None:
                held[name].append(seat)
        else:
            budget.give_back(name, held[name].pop(0))
        anywhere = sum(seat is Seat.ANY for seats in held.values() for seat in seats)
        assert anywhere <= capacity
        assert all(sum(seat is Seat.HEALTH for seat in seats) <= HEALTH_SEATS for seats in held.values())
        assert budget.open == sum(len(seats) for seats in held.values())
    for name, seats in held.items():
        for seat in seats:
            budget.give_back(name, seat)
    assert budget.open == 0
    alone = capacity - 2 * budget.reserve  # all given back: "a" has its reserve and the shared part again
    assert [budget.take("a") for _ in range(alone)] == [Seat.ANY] * alone


# ---- the listeners' server ----------------------------------------------------------------------


@attrs.define
class Uploads:
    """An upload route that reads its body as ComfyUI's pass-through does, and holds it."""

    held: int = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await _lifespan(scope, receive, send):
            return
        if scope["path"] in ("/livez", "/healthz", "/healthz/models/chat"):
            await _ok(send)
            return
        self.held += 1
        try:
            body = await open_streamed_body(scope, receive, BodyLimits(10**9, 3600.0))
            async for _ in body.chunks():
                pass
            await _ok(send)
        finally:
            self.held -= 1


async def answering(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Chat, /livez and /healthz: each answered at once."""
    if not await _lifespan(scope, receive, send):
        await _ok(send)


async def _lifespan(scope: dict[str, Any], receive: Any, send: Any) -> bool:
    if scope["type"] != "lifespan":
        return False
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})
    return True


async def _ok(send: Any) -> None:
    await send_whole(send, 200, [(b"content-type", b"application/json")], b'{"status": "ok"}')


@asynccontextmanager
async def open_listeners(listeners: list[Listener], max_connections: int
                         ) -> AsyncIterator[tuple[dict[str, tuple[str, int]], EventLog]]:
    channel, _ = trio.open_memory_channel[Any](math.inf)
    events = EventLog(channel, recent_max=1000)
    async with trio.open_nursery() as nursery:
        running = await nursery.start(serve_http, listeners, max_connections, events)
        addresses = {}
        for name, urls in running.urls.items():
            host, port = urls[0].removeprefix("http://").rsplit(":", 1)
            addresses[name] = (host, int(port))
        yield addresses, events
        nursery.cancel_scope.cancel()


async def ask(address: tuple[str, int], request: bytes) -> tuple[bytes, bool]:
    """*request* on a fresh connection: the answer, and whether the server closed the connection."""
    stream = await trio.open_tcp_stream(*address)
    async with stream:
        await stream.send_all(request)
        received = b""
        with trio.move_on_after(10) as waiting:
            try:
                while chunk := await stream.receive_some():
                    received += chunk
            except trio.BrokenResourceError:
                pass
        return received, not waiting.cancelled_caught


def get(path: str) -> bytes:
    return b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" % path.encode()


def post(path: str) -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}" % path.encode()


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def error_of(answer: bytes) -> Any:
    return json.loads(answer.split(b"\r\n\r\n", 1)[1])


def head_of(answer: bytes) -> list[bytes]:
    return answer.split(b"\r\n\r\n", 1)[0].lower().split(b"\r\n")


async def wait_for(state: Callable[[], bool]) -> None:
    with trio.fail_after(20):
        while not state():
            await trio.sleep(0.01)


@attrs.define
class Trickles:
    """Uploads that send one byte each 50 ms for as long as the server lets them."""

    address: tuple[str, int]
    answers: list[bytes] = attrs.Factory(list)

    async def upload(self) -> None:
        stream = await trio.open_tcp_stream(*self.address)
        async with stream, trio.open_nursery() as nursery:
            await stream.send_all(b"POST /upload/image HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\n"
                                  b"Content-Length: 1000000\r\n\r\nx")
            nursery.start_soon(self._trickle, stream)
            received = b""
            try:
                while chunk := await stream.receive_some():
                    received += chunk
            except trio.BrokenResourceError:
                pass
            self.answers.append(received)
            nursery.cancel_scope.cancel()

    @staticmethod
    async def _trickle(stream: trio.SocketStream) -> None:
        while True:
            await trio.sleep(0.05)
            try:
                await stream.send_all(b"x")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return


async def test_trickling_uploads_to_one_listener_do_not_stop_chat_or_livez_on_another() -> None:
    # Before: the 12 connections the cap allows all went to the uploads, and chat and /livez
    # on the OpenAI listener were answered 503 for as long as the trickle lasted.
    uploads = Uploads()
    listeners = [Listener("openai", answering, Address("127.0.0.1", 0), error_body),
                 Listener("comfyui", uploads, Address("127.0.0.1", 0), comfy_error_body)]
    async with open_listeners(listeners, max_connections=12) as (addresses, events):
        trickles = Trickles(addresses["comfyui"])
        async with trio.open_nursery() as nursery:
            for _ in range(20):
                nursery.start_soon(trickles.upload)
            await wait_for(lambda: uploads.held + len(trickles.answers) == 20)  # each held, or refused
            for request in (get("/livez"), get("/healthz"), post("/v1/chat/completions")):
                answer, _ = await ask(addresses["openai"], request)
                assert status_of(answer) == 200, answer
            # The uploads had the ComfyUI listener's reserve (3) and the shared part (6); the
            # OpenAI listener's reserve (3) stayed its own.
            assert uploads.held == 9
            assert all(status_of(answer) == 503 for answer in trickles.answers)
            assert {error_of(answer)["error"]["type"] for answer in trickles.answers} == {"too_many_connections"}
            nursery.cancel_scope.cancel()
    refused = [event.fields for event in events.recent if event.name == "connection_refused"]
    assert len(refused) == 11 and {(f["listener"], f["reason"]) for f in refused} == {("comfyui", "max_connections")}


async def test_livez_and_healthz_are_answered_at_the_cap_and_nothing_else_is() -> None:
    # Before: at the cap every connection was refused, probes too: a health check that
    # restarts what does not answer would restart a steward that was only busy.
    uploads = Uploads()
    listener = Listener("openai", uploads, Address("127.0.0.1", 0), error_body)
    async with open_listeners([listener], max_connections=2) as (addresses, events):
        trickles = Trickles(addresses["openai"])
        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(trickles.upload)
            await wait_for(lambda: uploads.held == 2)
            for path in ("/livez", "/healthz", "/healthz/models/chat"):  # a cluster's readiness probe too
                answer, closed = await ask(addresses["openai"], get(path).replace(b"Connection: close\r\n", b""))
                assert status_of(answer) == 200, answer
                assert b"connection: close" in head_of(answer) and closed  # a health seat serves one request
            answer, closed = await ask(addresses["openai"], post("/v1/chat/completions"))
            assert status_of(answer) == 503 and closed
            assert error_of(answer)["error"]["code"] == "too_many_connections"
            assert b"connection: close" in head_of(answer) and b"retry-after: 1" in head_of(answer)
            websocket, _ = await ask(addresses["openai"], b"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                                          b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
                                                          b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                                                          b"Sec-WebSocket-Version: 13\r\n\r\n")
            assert status_of(websocket) == 503 and error_of(websocket)["error"]["code"] == "too_many_connections"
            assert uploads.held == 2
            nursery.cancel_scope.cancel()
    refused = [event.fields for event in events.recent if event.name == "connection_refused"]
    assert [(f["listener"], f["reason"]) for f in refused] == [("openai", "max_connections")] * 2


async def test_a_refusal_on_a_health_seat_is_in_the_routes_own_shape() -> None:
    uploads = Uploads()
    listener = Listener("openai", uploads, Address("127.0.0.1", 0), error_body,
                        lambda scope: anthropic_error_body if scope["path"] == "/v1/messages" else error_body)
    async with open_listeners([listener], max_connections=1) as (addresses, _events):
        trickles = Trickles(addresses["openai"])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trickles.upload)
            await wait_for(lambda: uploads.held == 1)
            answer, _ = await ask(addresses["openai"], post("/v1/messages"))
            assert status_of(answer) == 503
            error = error_of(answer)
            assert error["type"] == "error" and error["error"]["type"] == "overloaded_error"  # Anthropic's
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("seat", [Seat.ANY, Seat.HEALTH])
async def test_a_connection_that_leaves_gives_its_seat_back(seat: Seat) -> None:
    uploads = Uploads()
    listener = Listener("comfyui", uploads, Address("127.0.0.1", 0), comfy_error_body)
    async with open_listeners([listener], max_connections=1) as (addresses, _events):
        trickles = Trickles(addresses["comfyui"])
        async with trio.open_nursery() as holding:
            holding.start_soon(trickles.upload)
            await wait_for(lambda: uploads.held == 1)
            if seat is Seat.ANY:
                holding.cancel_scope.cancel()
                request = post("/upload/image")  # needs the seat within the cap
            else:  # every health seat, each asked nothing and left
                for _ in range(HEALTH_SEATS):
                    await (await trio.open_tcp_stream(*addresses["comfyui"])).aclose()
                request = get("/livez")  # needs a health seat: the upload still holds the cap
            with trio.fail_after(20):
                while True:  # the server gives a seat back once it notices the close
                    answer, _ = await ask(addresses["comfyui"], request)
                    if status_of(answer) == 200:
                        break
                    await trio.sleep(0.01)
            holding.cancel_scope.cancel()
