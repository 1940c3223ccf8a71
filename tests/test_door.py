"""The front door's pure parts: keys presented, limits applied, usage rows built, usage chunks kept.

Everything here runs without sockets; tests/test_front_door.py runs the door in a real steward.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

import pytest
import trio

from supervisor.auth.keys import ApiKey, KeyFile, KeyTable, key_digest
from supervisor.observe.events import EventLog
from supervisor.gateway.http.asgi import RequestError
from supervisor.gateway import door as door_module
from supervisor.gateway.door import Exchange, FrontDoor, _read_tokens, front_door, presented_key
from supervisor.gateway.errors import error_body
from supervisor.gateway.relay.stream_usage import UsageChunkKept, ask_for_usage
from supervisor.usage.row import UsageRow
from supervisor.usage.writer import UsageLog
from tests.tapped import fed

CREATED = datetime(2026, 12, 1, tzinfo=UTC)


def make_key(name: str, text: str, **limits: object) -> ApiKey:
    return ApiKey(name=name, hash=key_digest(text), created=CREATED, **limits)  # type: ignore[arg-type]


def make_door(*keys: ApiKey, exposed: frozenset[str] = frozenset(),
              aliases: dict[str, str] | None = None) -> tuple[FrontDoor, list[UsageRow], EventLog]:
    send, _ = trio.open_memory_channel(math.inf)
    events = EventLog(send, recent_max=1000)
    rows: list[UsageRow] = []
    usage = UsageLog(None, events, None)
    usage.listeners.append(rows.append)
    door = FrontDoor(events, usage, exposed=exposed, aliases=aliases or {})
    door.replace_keys(KeyTable.from_key_file(KeyFile(keys=keys)))
    return door, rows, events


def scope(path: str = "/v1/chat/completions", headers: list[tuple[bytes, bytes]] | None = None) -> dict[str, object]:
    return {"type": "http", "method": "POST", "path": path, "headers": headers or []}


@pytest.mark.parametrize(("headers", "expected"), [
    ([(b"authorization", b"Bearer sk-1")], "sk-1"),
    ([(b"authorization", b"bearer   sk-1  ")], "sk-1"),
    ([(b"x-api-key", b"sk-2")], "sk-2"),
    ([(b"authorization", b"Basic dXNlcjpwYXNz"), (b"x-api-key", b"sk-3")], "sk-3"),
    ([(b"authorization", b"Bearer ")], None),
    ([(b"x-api-key", b"  ")], None),
    ([], None),
])
def test_the_key_a_client_presents(headers: list[tuple[bytes, bytes]], expected: str | None) -> None:
    assert presented_key(scope(headers=headers)) == expected


async def test_no_keys_on_loopback_lets_everyone_in_but_a_listener_beyond_loopback_needs_one() -> None:
    door, _, _ = make_door()
    assert door.authenticate(scope(), "openai", admin=True) == (None, None)
    door, _, _ = make_door(exposed=frozenset({"openai"}))
    key, refusal = door.authenticate(scope(), "openai", admin=False)
    assert key is None and refusal is not None and refusal.status == 401
    assert "steward keys add" in refusal.message
    assert door.authenticate(scope("/livez"), "openai", admin=False) == (None, None)  # monitors reach it


async def test_a_key_in_force_is_checked_on_every_listener() -> None:
    family = make_key("family", "sk-family")
    ops = make_key("ops", "sk-ops", admin=True)
    door, _, _ = make_door(family, ops)
    for listener in ("openai", "ollama", "comfyui"):
        _, refusal = door.authenticate(scope(), listener, admin=False)
        assert refusal is not None and refusal.status == 401 and refusal.code == "invalid_api_key"
    _, refusal = door.authenticate(scope(headers=[(b"authorization", b"Bearer sk-nope")]), "openai", admin=False)
    assert refusal is not None and "not one steward knows" in refusal.message
    assert door.authenticate(scope(headers=[(b"x-api-key", b"sk-family")]), "ollama", admin=False) == (family, None)
    key, refusal = door.authenticate(scope(headers=[(b"x-api-key", b"sk-family")]), "comfyui", admin=True)
    assert key is family and refusal is not None and refusal.status == 403 and refusal.code == "admin_required"
    assert door.authenticate(scope(headers=[(b"x-api-key", b"sk-ops")]), "comfyui", admin=True) == (ops, None)


async def test_a_key_limited_to_models_and_classes_gets_403_naming_what_it_may_use() -> None:
    agents = make_key("agents", "sk-a", models=("small",), classes=("background", "batch"))
    door, _, events = make_door(agents, aliases={"small": "small", "tiny": "small", "big": "big"})
    exchange = Exchange("r1", "openai", "POST", "/v1/chat/completions", 0.0, 0.0, key=agents)
    assert door.default_class(exchange, "interactive") == "background"
    with door.admit(exchange, model="small", klass="batch"):
        pass
    with pytest.raises(RequestError) as refused, door.admit(exchange, model="big", klass="background"):
        pass
    assert refused.value.status == 403 and refused.value.code == "model_not_allowed"
    assert refused.value.message.endswith("it may use: small.")
    with pytest.raises(RequestError) as refused, door.admit(exchange, model="small", klass="interactive"):
        pass
    assert refused.value.status == 403 and "background, batch" in refused.value.message
    assert [e.fields["reason"] for e in events.recent if e.name == "refused"] == ["model_not_allowed",
                                                                                  "class_not_allowed"]
    assert door.may_use(agents, "small")
    assert not door.may_use(agents, "big")


async def test_rate_and_concurrency_limits_are_429_with_retry_after(autojump_clock: trio.testing.MockClock) -> None:
    key = make_key("bot", "sk-bot", rpm=2, concurrency=1)
    door, _, _ = make_door(key)
    exchange = Exchange("r", "openai", "POST", "/v1/chat/completions", 0.0, 0.0, key=key)
    with door.admit(exchange, model=None, klass="interactive"):
        with pytest.raises(RequestError) as refused, door.admit(exchange, model=None, klass="interactive"):
            pass
        assert refused.value.status == 429 and refused.value.code == "concurrency_limited"
    await trio.sleep(10)
    with door.admit(exchange, model=None, klass="interactive"):
        pass
    with pytest.raises(RequestError) as refused, door.admit(exchange, model=None, klass="interactive"):
        pass
    assert refused.value.code == "rate_limited"
    assert refused.value.retry_after == 50  # the first admission leaves the minute at t=60
    await trio.sleep(50)
    with door.admit(exchange, model=None, klass="interactive"):
        pass


def test_a_usage_row_reads_tokens_and_error_codes_from_what_the_client_got() -> None:
    exchange = Exchange("r", "ollama", "POST", "/api/chat", 1000.0, 10.0)
    exchange.saw_start(200, [(b"content-type", b"application/x-ndjson")])
    exchange.saw_body(b'{"message":{"content":"\\"eval_count\\": 99"},"done":false}\n', 10.5)
    exchange.saw_body(b'{"done":true,"prompt_eval_count":12,"eval_count":7}\n', 11.0)
    exchange.complete = True
    row = exchange.row(12.0)
    assert (row.status, row.prompt_tokens, row.completion_tokens) == (200, 12, 7)  # not the 99 inside a string
    assert (row.ttft_s, row.duration_s, row.error) == (0.5, 2.0, None)

    refused = Exchange("r", "openai", "POST", "/v1/chat/completions", 0.0, 0.0)
    refused.saw_start(429, [(b"content-type", b"application/json")])
    refused.saw_body(error_body(429, "full", code="queue_full"), 0.1)
    refused.complete = True
    assert refused.row(0.2).error == "queue_full"

    llama = Exchange("r", "openai", "POST", "/v1/chat/completions", 0.0, 0.0)
    llama.saw_start(400, [(b"content-type", b"application/json")])
    llama.saw_body(json.dumps({"error": {"code": 400, "message": "too long",
                                         "type": "exceed_context_size_error"}}).encode(), 0.1)
    llama.complete = True
    assert llama.row(0.2).error == "exceed_context_size_error"


def test_the_tokens_at_an_answer_s_end_are_read_once_for_its_pace_and_its_row(
        monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[bytes] = []

    def reading(tail: bytes) -> tuple[int | None, int | None]:
        read.append(tail)
        return _read_tokens(tail)

    monkeypatch.setattr(door_module, "_read_tokens", reading)
    exchange = Exchange("r", "openai", "POST", "/v1/chat/completions", 0.0, 0.0)
    exchange.saw_start(200, [(b"content-type", b"text/event-stream")])
    exchange.saw_body(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n', 1.0)
    exchange.saw_body(b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}\n\n'
                      b'data: [DONE]\n\n', 2.0)
    assert exchange.decoding(2.5) == (2, 1.0, 1.0, 2.0)  # the tokens after the first, as they came
    row = exchange.row(2.5)
    assert (row.prompt_tokens, row.completion_tokens) == (5, 3)
    assert len(read) == 1


def test_a_client_that_left_before_its_answer_ended_is_499() -> None:
    exchange = Exchange("r", "openai", "POST", "/v1/chat/completions", 0.0, 0.0)
    exchange.saw_start(200, [(b"content-type", b"text/event-stream")])
    exchange.saw_body(b"data: {}\n\n", 0.1)
    exchange.client_left = True
    row = exchange.row(0.3)
    assert (row.status, row.error) == (499, "client_left")
    exchange.waited(0.25)
    exchange.waited(0.5)
    assert exchange.row(0.3).queued_s == 0.75  # the steps of a request add up


@pytest.mark.parametrize(("content_type", "last"), [
    (b"text/event-stream", b"data: [DONE]\n\n"), (b"text/event-stream", b"data: [DONE]\r\n\r\n"),
    (b"application/x-ndjson", b'{"model":"m","done":true,"eval_count":3}\n')])
def test_a_client_that_closes_on_the_streams_last_event_was_served_in_full(content_type: bytes, last: bytes) -> None:
    exchange = Exchange("r", "openai", "POST", "/v1/chat/completions", 0.0, 0.0)
    exchange.saw_start(200, [(b"content-type", content_type)])
    exchange.saw_body(b'data: {"choices":[]}\n\n' if content_type == b"text/event-stream" else b'{"done":false}\n',
                      0.1)
    exchange.saw_body(last, 0.2)
    exchange.client_left = True  # before the relay's own end of the body
    assert exchange.row(0.3).status == 200


def test_a_client_that_leaves_on_a_streams_error_event_gets_the_failures_row() -> None:
    """The SDKs raise on an error event and hang up: the row is the failure they read, not 499."""
    exchange = Exchange("r", "openai", "POST", "/v1/chat/completions", 0.0, 0.0)
    exchange.saw_start(200, [(b"content-type", b"text/event-stream")])
    exchange.saw_body(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n', 0.1)
    exchange.saw_body(b'data: {"error":{"code":500,"message":"boom","type":"server_error"}}\n\n', 0.2)
    exchange.leaves()  # before the relay's own end of the body
    row = exchange.row(0.3)
    assert (row.status, row.error) == (500, "server_error")


def test_steward_asks_a_stream_for_its_usage_unless_the_client_said() -> None:
    payload: dict[str, object] = {"stream": True}
    assert ask_for_usage(payload) and payload["stream_options"] == {"include_usage": True}
    said: dict[str, object] = {"stream": True, "stream_options": {"include_usage": False}}
    assert not ask_for_usage(said) and said["stream_options"] == {"include_usage": False}
    assert not ask_for_usage({"stream": False})
    other: dict[str, object] = {"stream": True, "stream_options": {"include_obfuscation": False}}
    assert ask_for_usage(other) and other["stream_options"] == {"include_obfuscation": False, "include_usage": True}


async def test_the_usage_chunk_steward_asked_for_is_kept_from_the_client() -> None:
    sent: list[dict[str, object]] = []
    counted: list[tuple[int | None, int | None]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    kept = fed(send, UsageChunkKept(lambda prompt, completion: counted.append((prompt, completion))))
    await kept({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    content = b'data: {"choices":[{"delta":{"content":"the \\"usage\\""}}]}\n\n'
    await kept({"type": "http.response.body", "body": content, "more_body": True})
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}\n\n'
    await kept({"type": "http.response.body", "body": usage, "more_body": True})
    await kept({"type": "http.response.body", "body": usage + b"data: [DONE]\n\n", "more_body": False})
    bodies = [m["body"] for m in sent if m["type"] == "http.response.body"]
    assert bodies == [content, b"data: [DONE]\n\n"]  # the usage-only message is not sent at all
    assert counted == [(5, 3), (5, 3)]


async def test_the_door_writes_one_row_for_a_refused_request_and_one_for_a_served_one() -> None:
    key = make_key("family", "sk-family")
    door, rows, _ = make_door(key)

    async def app(scope: dict[str, object], receive: object, send: object) -> None:
        await send({"type": "http.response.start", "status": 200,  # type: ignore[operator]
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body",  # type: ignore[operator]
                    "body": b'{"usage":{"prompt_tokens":4,"completion_tokens":2}}'})

    guarded = front_door(app, door, "openai", lambda scope: error_body)
    answers: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        answers.append(message)

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    await guarded(scope(), receive, send)
    await guarded(scope(headers=[(b"authorization", b"Bearer sk-family")]), receive, send)
    await guarded(scope("/healthz"), receive, send)  # monitoring: no row
    assert [(r.status, r.key, r.error) for r in rows] == [(401, None, "invalid_api_key"), (200, "family", None)]
    assert (rows[1].prompt_tokens, rows[1].completion_tokens) == (4, 2)
    starts = [m for m in answers if m["type"] == "http.response.start"]
    assert all(any(k == b"x-request-id" for k, _ in m["headers"]) for m in starts)  # type: ignore[attr-defined]
    assert (b"www-authenticate", b'Bearer realm="steward"') in starts[0]["headers"]  # type: ignore[operator]
