"""An embeddings request cut into steps (relay/embeddings.py), one answer to the client.

The OpenAI listener's handler in front of a scripted engine on a loopback socket, with a
scheduler that grants every step at once: each step's answer is assembled, in order; a step
that fails fails the request and names the step; an engine's error answer goes to the client
as it came; an answer that is no embeddings response is a 502 naming the step. Real time: the
engine is a real socket (no autojump clock with I/O in flight).
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio

from supervisor.address import Address
from supervisor.gateway.door import Exchange, exchange_of
from supervisor.gateway.http.asgi import BodyLimits
from supervisor.gateway.openai.inference import InferenceHandler
from supervisor.gateway.relay.upstream import Timeouts
from supervisor.observe.events import EventLog
from supervisor.scheduler.actor import Abort, Lease
from supervisor.scheduler.types import Grant
from tests.test_door import make_door

CHUNK = 2  # inputs a step
_dumps = json.dumps  # the test's own JSON, not counted where steward's is
Script = Callable[[int, bytes], Awaitable[bytes | None]]  # (step, request body) -> the raw answer, None: close


@attrs.define(eq=False)
class GrantingScheduler:
    """Grants every step at once on one engine; *revoke* at step N ends that step as the
    scheduler does when its engine went bad."""

    endpoint: Address
    revoke_at: int | None = None
    stalls: list[str] = attrs.Factory(list)
    leases: list[Lease] = attrs.Factory(list)

    @asynccontextmanager
    async def open_request(self) -> AsyncIterator[None]:
        yield None

    @asynccontextmanager
    async def open_grant(self, model: str | None, klass: str, **_: Any) -> AsyncIterator[Lease]:
        lease = Lease(Grant(len(self.leases) + 1, "embed", self.endpoint), Abort())
        self.leases.append(lease)
        if len(self.leases) == self.revoke_at:
            lease.abort("stopped answering its health checks (timed out)")
        yield lease

    def report_stall(self, engine: str, generation: int, detail: str) -> None:
        self.stalls.append(detail)


def embeddings(inputs: list[str], offset: int) -> bytes:
    data = [{"object": "embedding", "index": i, "embedding": [float(offset + i)]} for i in range(len(inputs))]
    body = _dumps({"object": "list", "data": data, "model": "embed-gguf",
                       "usage": {"prompt_tokens": len(inputs), "total_tokens": len(inputs)}}).encode()
    return http_answer(200, body)


def http_answer(status: int, body: bytes, content_type: bytes = b"application/json") -> bytes:
    return (b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n" % (status, content_type, len(body))
            + body)


async def serve_engine(script: Script, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    steps = 0

    async def answer(stream: trio.SocketStream) -> None:
        nonlocal steps
        steps += 1
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some()
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(
            b"content-length")))
        while len(body) < length:
            body += await stream.receive_some()
        raw = await script(steps, body)
        if raw is not None:
            await stream.send_all(raw)
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(answer, listeners)


@attrs.frozen
class Answered:
    status: int
    headers: dict[bytes, bytes]
    body: bytes
    scheduler: GrantingScheduler
    exchange: Exchange

    def json(self) -> Any:
        return json.loads(self.body)


async def ask(nursery: trio.Nursery, script: Script | None, inputs: int = 5, *, revoke_at: int | None = None,
              timeouts: Timeouts = Timeouts(), path: str = "/v1/embeddings") -> Answered:
    """*inputs* texts embedded through the handler, in steps of CHUNK, against an engine that answers by *script*
    (None: no engine listens)."""
    port = await nursery.start(serve_engine, script) if script is not None else 1
    scheduler = GrantingScheduler(Address("127.0.0.1", port), revoke_at)
    door, _, _ = make_door()
    send_events, _ = trio.open_memory_channel(math.inf)
    handler = InferenceHandler(scheduler, EventLog(send_events), {"embed": "embed"},  # type: ignore[arg-type]
                               BodyLimits(1 << 20, 10.0), CHUNK, timeouts, door)
    request = _dumps({"model": "embed", "input": [f"text {i}" for i in range(inputs)]}).encode()
    received = [{"type": "http.request", "body": request, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if received:
            return received.pop()
        await trio.sleep_forever()
        raise AssertionError

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(request)).encode())]}
    with trio.fail_after(10):
        await handler(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return Answered(start["status"], dict(start["headers"]), body, scheduler, exchange_of(scope))


async def by_steps(step: int, body: bytes) -> bytes:
    return embeddings(json.loads(body)["input"], 100 * step)


async def test_a_request_in_steps_is_one_answer_of_every_embedding_in_order(nursery: trio.Nursery) -> None:
    answered = await ask(nursery, by_steps)
    assert answered.status == 200
    assert answered.headers[b"content-length"] == str(len(answered.body)).encode()
    value = answered.json()
    assert [(d["index"], d["embedding"]) for d in value["data"]] == [
        (0, [100.0]), (1, [101.0]), (2, [200.0]), (3, [201.0]), (4, [300.0])]
    assert value["usage"] == {"prompt_tokens": 5, "total_tokens": 5} and value["model"] == "embed-gguf"
    assert [lease.status for lease in answered.scheduler.leases] == [200, 200, 200]
    assert (answered.exchange.prompt_tokens, answered.exchange.completion_tokens) == (5, None)  # as the steps came


async def test_an_engine_s_error_answer_to_a_step_goes_to_the_client_as_a_single_step_s_would(
        nursery: trio.Nursery) -> None:
    error = b'{"error":{"code":400,"message":"input is too large","type":"invalid_request_error"}}'

    async def second_refused(step: int, body: bytes) -> bytes:
        return http_answer(400, error) if step == 2 else await by_steps(step, body)

    answered = await ask(nursery, second_refused)
    assert answered.status == 400  # in OpenAI's shape (conforming.py): llama-server's code is the status
    assert answered.json() == {"error": {"code": None, "message": "input is too large",
                                         "type": "invalid_request_error", "param": None}}
    assert answered.headers[b"content-type"] == b"application/json"
    assert [lease.status for lease in answered.scheduler.leases] == [200, 400]  # no third step


async def test_an_answer_that_is_no_embeddings_response_is_a_502_naming_the_step(nursery: trio.Nursery) -> None:
    async def second_unreadable(step: int, body: bytes) -> bytes:
        return http_answer(200, b'{"data": [{"embedding": [1.0]}]}') if step == 2 else await by_steps(step, body)

    answered = await ask(nursery, second_unreadable)
    assert answered.status == 502
    error = answered.json()["error"]
    assert error["code"] == "engine_error"
    assert error["message"].startswith("engine 'embed' answered step 2/3 with an unreadable embeddings response: ")
    assert answered.scheduler.leases[-1].status == 502


async def test_an_unreachable_engine_fails_the_request_naming_the_step(nursery: trio.Nursery) -> None:
    answered = await ask(nursery, None)
    assert answered.status == 502
    error = answered.json()["error"]
    assert error["code"] == "engine_error"
    assert error["message"].startswith("engine 'embed' failed during step 1/3 of the request: cannot connect to "
                                       "127.0.0.1:1")


async def test_an_engine_that_breaks_off_a_step_fails_the_request_naming_the_step(nursery: trio.Nursery) -> None:
    async def second_cut(step: int, body: bytes) -> bytes:
        whole = await by_steps(step, body)
        return whole[:-10] if step == 2 else whole

    answered = await ask(nursery, second_cut)
    assert answered.status == 502
    assert answered.json()["error"] == {
        "message": "engine 'embed' failed during step 2/3 of the request: the engine closed the connection "
                   "before the response ended", "type": "server_error", "param": None, "code": "engine_error"}


async def test_a_stalled_step_is_a_504_naming_the_step_and_reported(nursery: trio.Nursery) -> None:
    async def second_silent(step: int, body: bytes) -> bytes:
        if step == 2:
            await trio.sleep_forever()
        return await by_steps(step, body)

    answered = await ask(nursery, second_silent, timeouts=Timeouts(first_byte=0.2))
    assert answered.status == 504
    error = answered.json()["error"]
    assert (error["code"], error["message"]) == (
        "engine_timeout", "engine 'embed' failed during step 2/3 of the request: no answer within 0.2s")
    assert answered.scheduler.stalls == ["no answer within 0.2s"]
    assert answered.scheduler.leases[-1].status == 504


async def test_a_step_the_scheduler_revokes_names_the_step_and_why(nursery: trio.Nursery) -> None:
    answered = await ask(nursery, by_steps, revoke_at=2)
    assert answered.status == 502
    error = answered.json()["error"]
    assert (error["code"], error["message"]) == (
        "engine_unhealthy", "engine 'embed' failed during step 2/3 of the request: it stopped answering its "
                            "health checks (timed out)")


@pytest.mark.parametrize("inputs", [5, 9])
async def test_json_is_parsed_and_written_once_per_step(nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch,
                                                        inputs: int) -> None:
    """The request is parsed once; each step's body is written once and its answer parsed once;
    the answer is written once: N + 1 parses and N + 1 writes for N steps."""
    answers = {}
    for step in range(1, math.ceil(inputs / CHUNK) + 1):
        texts = [f"text {i}" for i in range((step - 1) * CHUNK, min(step * CHUNK, inputs))]
        answers[step] = embeddings(texts, 100 * step)

    async def scripted(step: int, body: bytes) -> bytes:
        return answers[step]

    counted = {"loads": 0, "dumps": 0}
    loads, dumps = json.loads, json.dumps

    def counting_loads(*args: Any, **kwargs: Any) -> Any:
        counted["loads"] += 1
        return loads(*args, **kwargs)

    def counting_dumps(*args: Any, **kwargs: Any) -> Any:
        counted["dumps"] += 1
        return dumps(*args, **kwargs)

    monkeypatch.setattr(json, "loads", counting_loads)
    monkeypatch.setattr(json, "dumps", counting_dumps)
    answered = await ask(nursery, scripted, inputs)
    monkeypatch.undo()
    steps = len(answers)
    assert answered.status == 200 and len(answered.json()["data"]) == inputs
    assert counted == {"loads": steps + 1, "dumps": steps + 1}
