"""Errors inside streams (issue 26, defects 5 and 6, and two pieces of item 7).

A stream's 200 goes out before its engine fails, so the failure is an error event at the
stream's end: the usage row and the ``request`` event must record it (its status, its code),
and a Messages or Responses client must get it in its own API's event, which its SDK reads.

Tiers: the door's row, fed the bytes a client got (``Exchange``); the route's readers
(``reading_answer``) behind the real ``front_door``, fed an engine's ASGI messages; and a real
steward in front of the fake llama-server and the fake Ollama (slow), with the official clients.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import anthropic
import httpx
import openai
import pytest
from anthropic.types.shared import ErrorResponse
from openai.types.responses import ResponseErrorEvent, ResponseFailedEvent

from supervisor.auth.keys import add_key
from supervisor.gateway.openai.api_routes import API_ROUTES
from supervisor.gateway.door import Exchange, front_door
from supervisor.gateway.errors import anthropic_stream_error, error_body, error_in_stream, responses_stream_error
from supervisor.gateway.relay.reshaped import reading_answer
from supervisor.usage.row import UsageRow
from tests.conftest import RunningSteward, fake_model, free_port, launch_steward
from tests.test_door import make_door, make_key
from tests.tapped import fed_tap
from tests.test_ollama_listener import ollama_section

SSE = b"text/event-stream"
NDJSON = b"application/x-ndjson"
LLAMA_ERROR = {"code": 500, "message": "fake mid-stream failure", "type": "server_error"}


def sse(data: object, name: str | None = None) -> bytes:
    return (f"event: {name}\n" if name else "").encode() + b"data: " + json.dumps(data).encode() + b"\n\n"


def events_of(body: bytes) -> list[tuple[str | None, Any]]:
    """(name, data) of each event of an SSE body."""
    events = []
    for block in body.decode().split("\n\n"):
        lines = block.splitlines()
        name = next((line[6:].strip() for line in lines if line.startswith("event:")), None)
        data = "\n".join(line[5:].strip() for line in lines if line.startswith("data:"))
        if data:
            events.append((name, json.loads(data) if data != "[DONE]" else data))
    return events


def streamed(content_type: bytes, *chunks: bytes) -> Exchange:
    """An Exchange that saw a 200 answer of *content_type* in *chunks* go to its client, to the end."""
    exchange = Exchange("r", "openai", "POST", "/v1/chat/completions", 0.0, 0.0)
    exchange.saw_start(200, [(b"content-type", content_type)])
    for chunk in chunks:
        exchange.saw_body(chunk, 0.1)
    exchange.complete = True
    return exchange


CONTENT = sse({"choices": [{"index": 0, "delta": {"content": " hello"}}]})
CHAT_ENDS = {
    "llama-server's error event": (sse({"error": LLAMA_ERROR}), (500, "server_error")),
    "llama-server's context overflow": (sse({"error": {"code": 400, "message": "too long",
                                                       "type": "exceed_context_size_error"}}),
                                        (400, "exceed_context_size_error")),
    "vLLM's error, then [DONE]": (sse({"error": {"message": "bad", "type": "BadRequestError", "param": None,
                                                 "code": 400}}) + b"data: [DONE]\n\n", (400, "BadRequestError")),
    "an engine error without a status": (sse({"error": {"message": "boom", "type": "server_error"}}),
                                         (502, "server_error")),
    "steward: the engine crashed": (error_in_stream(SSE, "engine 'chat' failed", code="engine_error"),
                                    (502, "engine_error")),
    "steward: a chunk timeout": (error_in_stream(SSE, "engine 'chat' stalled", code="engine_timeout"),
                                 (504, "engine_timeout")),
    "steward: cut at shutdown": (error_in_stream(SSE, "steward stopped", code="shutting_down"),
                                 (503, "shutting_down")),
    "steward on Messages: a chunk timeout": (anthropic_stream_error(SSE, "stalled", code="engine_timeout"),
                                             (504, "timeout_error")),
    "steward on Responses: an unhealthy engine": (responses_stream_error(SSE, "gone", code="engine_unhealthy"),
                                                  (502, "engine_unhealthy")),
    "llama-server's Messages error event": (sse(LLAMA_ERROR, "error"), (500, "server_error")),
    "the Responses API's failed end": (sse({"type": "response.failed", "sequence_number": 9, "response": {
        "id": "resp_1", "status": "failed", "error": {"code": "server_error", "message": "m"}}},
        "response.failed"), (502, "server_error")),
}


@pytest.mark.parametrize("case", list(CHAT_ENDS))
async def test_a_stream_that_ends_in_an_error_is_a_failed_row_and_request_event(case: str) -> None:
    last, (status, code) = CHAT_ENDS[case]
    door, rows, events = make_door()
    exchange = streamed(SSE, CONTENT, CONTENT, last)
    door.record(exchange)
    assert (rows[-1].status, rows[-1].error) == (status, code)
    request = [event for event in events.recent if event.name == "request"][-1]
    assert (request.fields["status"], request.fields["error"]) == (status, code)


@pytest.mark.parametrize(("last", "expected"), [
    (b'{"error":"an error was encountered while running the model: boom"}\n', (502, "engine_error")),
    (error_in_stream(NDJSON, "Ollama stalled", code="engine_timeout"), (502, "engine_error")),
])
def test_an_ndjson_stream_that_ends_in_ollamas_error_line_is_a_failed_row(last: bytes,
                                                                           expected: tuple[int, str]) -> None:
    # Ollama's error line has only a message: any failure it ends on is the engine's, 502.
    exchange = streamed(NDJSON, b'{"message":{"content":"hi"},"done":false}\n', last)
    assert (exchange.row(0.2).status, exchange.row(0.2).error) == expected


@pytest.mark.parametrize(("content_type", "chunks"), [
    (SSE, [sse({"choices": [{"delta": {"content": '{"error": {"code": 500, "type": "server_error"}}'}}]}),
           b"data: [DONE]\n\n"]),
    (SSE, [sse({"type": "response.completed", "response": {"id": "r", "status": "completed", "error": None}},
               "response.completed")]),
    (SSE, [b'data: {"choices":[{"delta":{"content":"error"}}],"x":"\\"error\\": 1"}\n\n']),
    (NDJSON, [b'{"message":{"content":"{\\"error\\": \\"no\\"}"},"done":false}\n',
              b'{"message":{"content":""},"done":true,"eval_count":2}\n']),
])
def test_a_model_that_writes_error_in_its_answer_has_not_failed(content_type: bytes, chunks: list[bytes]) -> None:
    row = streamed(content_type, *chunks).row(0.2)
    assert (row.status, row.error) == (200, None)


def test_a_client_that_left_before_the_error_came_is_still_499() -> None:
    exchange = streamed(SSE, CONTENT, sse({"error": LLAMA_ERROR}))
    exchange.complete, exchange.client_left = False, True
    assert (exchange.row(0.2).status, exchange.row(0.2).error) == (499, "client_left")


# An engine's answers, as ASGI messages, relayed through a route's wrappers behind the door.


def start(status: int = 200, content_type: bytes = SSE) -> dict[str, Any]:
    return {"type": "http.response.start", "status": status, "headers": [(b"content-type", content_type)]}


def body(chunk: bytes, more: bool = True) -> dict[str, Any]:
    return {"type": "http.response.body", "body": chunk, "more_body": more}


class Through(NamedTuple):
    status: int  # what the client got
    answer: bytes
    row: UsageRow | None
    request: dict[str, Any] | None  # the `request` event's fields
    bodies: list[bytes]  # the answer's body messages, as they were sent


async def through_the_door(path: str, engine: list[dict[str, Any]], *, stream: bool = True,
                           headers: list[tuple[bytes, bytes]] | None = None, method: str = "POST") -> Through:
    """*engine*'s messages, through *path*'s wrappers and the door (keys in force)."""
    door, rows, events = make_door(make_key("agent", "sk-agent"))

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if path not in API_ROUTES:
            await send(start(200, b"text/plain"))
            await send(body(b"", more=False))
            return
        reading = fed_tap(reading_answer(send, API_ROUTES[path], scope["steward.exchange"], keep_usage_chunk=False,
                                         stream=stream, model="chat"))
        for message in engine:
            await reading(message)

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    scope = {"type": "http", "method": method, "path": path,
             "headers": [(b"x-api-key", b"sk-agent")] if headers is None else headers}
    await front_door(app, door, "openai", lambda scope: error_body)(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    bodies = [m.get("body", b"") for m in sent if m["type"] == "http.response.body"]
    requests = [event.fields for event in events.recent if event.name == "request"]
    return Through(status, b"".join(bodies), rows[-1] if rows else None, requests[-1] if requests else None, bodies)


MESSAGE_START = sse({"type": "message_start", "message": {
    "id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "chat", "stop_reason": None,
    "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 0}}}, "message_start")
BLOCK = (sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
             "content_block_start")
         + sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " hi"}},
               "content_block_delta"))


@pytest.mark.parametrize("engine_error", [sse(LLAMA_ERROR, "error"), sse({"error": LLAMA_ERROR})],
                         ids=["llama-server's Messages event", "OpenAI's data event"])
async def test_an_engine_error_in_a_messages_stream_becomes_anthropics_error_event(engine_error: bytes) -> None:
    status, answer, row, request, _ = await through_the_door("/v1/messages", [
        start(), body(MESSAGE_START), body(BLOCK), body(engine_error), body(b"", more=False)])
    assert answer.startswith(MESSAGE_START + BLOCK)  # what came before goes as it came
    name, data = events_of(answer)[-1]
    assert name == "error"
    assert data == {"type": "error", "error": {"type": "api_error", "message": "fake mid-stream failure"}}
    ErrorResponse.model_validate(data)  # the anthropic SDK's own type for it
    # The row has the engine's status and code, not the type the client got.
    assert (status, row.status, row.error) == (200, 500, "server_error")
    assert (request["status"], request["error"]) == (500, "server_error")


def responses_event(kind: str, number: int, **fields: Any) -> bytes:
    return sse({"type": kind, "sequence_number": number, **fields}, kind)


RESPONSES_OPENING = (responses_event("response.created", 0, response={"id": "resp_1", "status": "in_progress"})
                     + responses_event("response.in_progress", 1, response={"id": "resp_1", "status": "in_progress"})
                     + responses_event("response.output_text.delta", 2, item_id="m", output_index=0,
                                       content_index=0, delta=" hi"))


async def test_an_engine_error_in_a_responses_stream_becomes_the_responses_error_event() -> None:
    status, answer, row, request, _ = await through_the_door("/v1/responses", [
        start(), body(RESPONSES_OPENING), body(sse({"error": LLAMA_ERROR})), body(b"", more=False)])
    events = events_of(answer)
    assert [name for name, _ in events[:3]] == ["response.created", "response.in_progress",
                                                "response.output_text.delta"]
    assert events[2][1]["delta"] == " hi"  # what came before goes on (the response given its required keys)
    (name, data), (failed_name, failed) = events[-2:]
    assert name == "error"
    assert data == {"type": "error", "code": "server_error", "message": "fake mid-stream failure", "param": None,
                    "sequence_number": 3}  # the one after the stream's last
    ResponseErrorEvent.model_validate(data)  # the openai SDK's own type for it
    # Then the response itself fails: Codex CLI reads a failed stream's message there only.
    assert (failed_name, failed["type"], failed["sequence_number"]) == ("response.failed", "response.failed", 4)
    assert {key: failed["response"][key] for key in ("id", "status", "error")} == {
        "id": "resp_1", "status": "failed", "error": {
            "code": "server_error", "message": "fake mid-stream failure"}}  # the stream's own response, failed
    ResponseFailedEvent.model_validate(failed)
    assert (status, row.status, row.error) == (200, 500, "server_error")
    assert (request["status"], request["error"]) == (500, "server_error")


async def test_a_responses_stream_that_fails_at_once_is_opened_before_its_error() -> None:
    # The openai SDK's stream helper reads no event before response.created.
    _, answer, row, _, _ = await through_the_door("/v1/responses", [
        start(), body(sse({"error": LLAMA_ERROR})), body(b"", more=False)])
    events = events_of(answer)
    assert [name for name, _ in events] == ["response.created", "response.in_progress", "error", "response.failed"]
    failed = ResponseFailedEvent.model_validate(events[-1][1])  # a whole response: none came from the engine
    assert failed.response.id == events[0][1]["response"]["id"]  # one response, from its opening to its end
    assert failed.response.error is not None and failed.response.error.message == "fake mid-stream failure"
    assert (row.status, row.error) == (500, "server_error")


async def test_steward_s_own_stream_errors_keep_their_api_s_shape() -> None:
    # As the relay ends a stream whose engine stalled: through the same wrappers.
    _, answer, row, _, _ = await through_the_door("/v1/responses", [
        start(), body(RESPONSES_OPENING), body(responses_stream_error(SSE, "engine 'chat' stalled",
                                                                      code="engine_timeout"), more=False)])
    (name, data), (failed, _) = events_of(answer)[-2:]
    assert (name, data["code"], data["sequence_number"], failed) == ("error", "engine_timeout", 3, "response.failed")
    ResponseErrorEvent.model_validate(data)
    assert (row.status, row.error) == (504, "engine_timeout")
    own = anthropic_stream_error(SSE, "engine 'chat' stalled", code="engine_timeout")
    _, answer, row, _, _ = await through_the_door("/v1/messages", [
        start(), body(MESSAGE_START), body(own, more=False)])
    assert answer == MESSAGE_START + own  # Anthropic's event already: as it came
    assert events_of(own)[0][1]["error"]["type"] == "timeout_error"  # the status it stands for, 504
    assert (row.status, row.error) == (504, "timeout_error")


@pytest.mark.parametrize(("path", "opening", "last"), [
    ("/v1/messages", MESSAGE_START + BLOCK, "message_stop"),
    ("/v1/responses", RESPONSES_OPENING, "response.completed"),
])
async def test_a_stream_that_ends_before_its_last_event_ends_with_an_error(path: str, opening: bytes,
                                                                           last: str) -> None:
    # Ollama's /v1/messages and /v1/responses just end when the model fails mid-answer.
    _, answer, row, _, _ = await through_the_door(path, [start(), body(opening), body(b"", more=False)])
    data = next(data for name, data in events_of(answer) if name == "error")
    assert f"no {last}" in json.dumps(data)
    assert (row.status, row.error) == (502, "engine_error")


async def test_an_error_event_split_across_messages_is_read_and_content_passes_as_it_came() -> None:
    says_error = sse({"type": "content_block_delta", "index": 0, "delta": {
        "type": "text_delta", "text": 'data: {"error": {"code": 500}}\n\nevent: error'}}, "content_block_delta")
    error = sse(LLAMA_ERROR, "error")
    _, answer, row, _, bodies = await through_the_door("/v1/messages", [
        start(), body(MESSAGE_START + says_error[:30]), body(says_error[30:] + error[:20]), body(error[20:]),
        body(b"", more=False)])
    assert answer.startswith(MESSAGE_START + says_error)
    assert [name for name, _ in events_of(answer)] == ["message_start", "content_block_delta", "error"]
    assert (row.status, row.error) == (500, "server_error")
    assert all(chunk.endswith(b"\n\n") for chunk in bodies if chunk)  # an event goes out once it is whole
    whole = MESSAGE_START + says_error + sse({"type": "message_stop"}, "message_stop")
    _, answer, row, _, bodies = await through_the_door("/v1/messages", [
        start(), body(whole[:50]), body(whole[50:]), body(b"", more=False)])
    assert answer == whole and (row.status, row.error) == (200, None)
    assert bodies == [whole, b""]  # the first 50 bytes, no whole event, were held for the rest


async def test_a_messages_error_answer_records_the_engine_s_code_not_anthropic_s_type() -> None:
    engine = json.dumps({"error": LLAMA_ERROR}).encode()
    status, answer, row, request, _ = await through_the_door("/v1/messages", [
        start(500, b"application/json"), body(engine, more=False)], stream=False)
    assert status == 500 and json.loads(answer)["error"]["type"] == "api_error"  # the client: Anthropic's words
    assert (row.status, row.error) == (500, "server_error")  # the row: the engine's code
    assert request["error"] == "server_error"


async def test_head_slash_is_a_probe_answered_without_a_key_and_without_a_row() -> None:
    status, _, row, request, _ = await through_the_door("/", [], method="HEAD", headers=[])
    assert (status, row, request) == (200, None, None)
    status, _, row, _, _ = await through_the_door("/", [], method="GET", headers=[])  # only the probe is open
    assert (status, row.status, row.error) == (401, 401, "invalid_api_key")


# A real steward: the official clients, both listeners (slow).


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningSteward, str]]:
    run_dir = tmp_path_factory.mktemp("stream-errors")
    keys_file = run_dir / "keys.json"
    key = add_key(keys_file, "agent", known_models=["chat"], ollama=True)
    registry: list[RunningSteward] = []
    launch_steward(run_dir, {"chat": fake_model("1GiB", tps=200)}, registry,
                   gpu={"probe": "none", "budget": "16GiB"}, auth={"keys_file": str(keys_file)},
                   ollama=ollama_section(free_port()))
    yield registry[0], key
    assert registry[0].stop() == 0


@pytest.fixture(autouse=True)
def no_leaked_children() -> Iterator[None]:
    yield  # the module's steward lives across its slow tests


def request_event(steward: RunningSteward, route: str, listener: str, before: int) -> dict[str, Any]:
    """The `request` event after the first *before* on *route*: written once the answer ended."""
    deadline = time.monotonic() + 10
    while True:
        rows = [r for r in steward.events("request") if r["route"] == route and r["listener"] == listener]
        if len(rows) > before:
            return rows[before]
        assert time.monotonic() < deadline, f"no request event for {route} on {listener}"
        time.sleep(0.02)


def count_requests(steward: RunningSteward, route: str, listener: str = "openai") -> int:
    return len([r for r in steward.events("request") if r["route"] == route and r["listener"] == listener])


HOOK = [{"role": "user", "content": "FAKE_ERROR_MIDSTREAM"}]


@pytest.mark.slow
def test_the_official_clients_read_an_engines_mid_stream_error(keyed: tuple[RunningSteward, str]) -> None:
    steward, key = keyed
    claude = anthropic.Anthropic(base_url=steward.url, api_key=key, max_retries=0, timeout=30)
    before = count_requests(steward, "/v1/messages")
    with pytest.raises(anthropic.APIStatusError) as failed:
        with claude.messages.stream(model="chat", max_tokens=9, messages=HOOK) as stream:
            list(stream)
    assert failed.value.body == {"type": "error", "error": {"type": "api_error",
                                                            "message": "fake mid-stream failure"}}
    row = request_event(steward, "/v1/messages", "openai", before)
    assert (row["status"], row["error"]) == (500, "server_error")

    oai = openai.OpenAI(base_url=steward.base_url, api_key=key, max_retries=0, timeout=30)
    before = count_requests(steward, "/v1/responses")
    # The plain stream, as Codex CLI reads it (the SDK's responses.stream() helper: test_spec_conformance.py).
    events = list(oai.responses.create(model="chat", input="FAKE_ERROR_MIDSTREAM", max_output_tokens=9, stream=True))
    assert [e.type for e in events[-2:]] == ["error", "response.failed"] and events[0].type == "response.created"
    assert (events[-2].message, events[-2].code) == ("fake mid-stream failure", "server_error")
    # What Codex CLI reads: the response's own error, in the response.failed that ends the stream.
    assert events[-1].response.id == events[0].response.id and events[-1].response.status == "failed"
    assert events[-1].response.error.message == "fake mid-stream failure"
    row = request_event(steward, "/v1/responses", "openai", before)
    assert (row["status"], row["error"]) == (500, "server_error")

    before = count_requests(steward, "/v1/chat/completions")
    with pytest.raises(openai.APIError, match="fake mid-stream failure"):
        list(oai.chat.completions.create(model="chat", messages=HOOK, stream=True))  # type: ignore[arg-type]
    row = request_event(steward, "/v1/chat/completions", "openai", before)
    assert (row["status"], row["error"]) == (500, "server_error")


@pytest.mark.slow
def test_the_ollama_listeners_streams_that_fail_are_failed_rows(keyed: tuple[RunningSteward, str]) -> None:
    steward, key = keyed
    ollama_url = steward.wait_event("listening")["ollama"][0]
    before = count_requests(steward, "/api/chat", "ollama")
    lines = httpx.post(f"{ollama_url}/api/chat", headers={"authorization": f"Bearer {key}"}, timeout=30,
                       json={"model": "gemma3:4b", "messages": HOOK}).text.splitlines()
    assert "FAKE_ERROR_MIDSTREAM" in json.loads(lines[-1])["error"]
    row = request_event(steward, "/api/chat", "ollama", before)
    assert (row["status"], row["error"]) == (502, "engine_error")

    # Ollama's own /v1/messages stream just ends when the model fails: the client gets an error event.
    claude = anthropic.Anthropic(base_url=ollama_url, api_key=key, max_retries=0, timeout=30)
    before = count_requests(steward, "/v1/messages", "ollama")
    with pytest.raises(anthropic.APIStatusError, match="no message_stop"):
        with claude.messages.stream(model="gemma3:4b", max_tokens=9, messages=HOOK) as stream:
            list(stream)
    row = request_event(steward, "/v1/messages", "ollama", before)
    assert (row["status"], row["error"]) == (502, "engine_error")

    oai = openai.OpenAI(base_url=f"{ollama_url}/v1", api_key=key, max_retries=0, timeout=30)
    before = count_requests(steward, "/v1/responses", "ollama")
    with oai.responses.stream(model="gemma3:4b", input="FAKE_ERROR_MIDSTREAM", max_output_tokens=9) as stream:
        events = list(stream)
    assert [e.type for e in events[-2:]] == ["error", "response.failed"] and events[0].type == "response.created"
    assert "no response.completed" in events[-2].message
    assert events[-1].sequence_number == events[-2].sequence_number + 1 == events[-3].sequence_number + 2
    assert "no response.completed" in events[-1].response.error.message
    row = request_event(steward, "/v1/responses", "ollama", before)
    assert (row["status"], row["error"]) == (502, "engine_error")


@pytest.mark.slow
def test_claude_codes_probe_is_answered_and_not_logged(keyed: tuple[RunningSteward, str]) -> None:
    steward, _ = keyed
    before = count_requests(steward, "/v1/models")
    probe = httpx.head(f"{steward.url}/", timeout=10)  # no key: Claude Code's preflight sends none
    assert (probe.status_code, probe.content) == (200, b"")
    marker = httpx.get(f"{steward.url}/v1/models", timeout=10)  # a request logged after it (401: no key)
    assert marker.status_code == 401
    request_event(steward, "/v1/models", "openai", before)
    assert not [r for r in steward.events("request") if r["route"] == "/"]
