"""What OpenAI's spec requires of an answer, put in where the engine left it out, on the way
through (supervisor/gateway/relay/conforming.py, responses_events.py). Pure: an engine's ASGI
messages in, in pieces cut anywhere, what reaches the client out, checked against the spec
(tests/spec_check.py; skipped where it is absent) and by the official SDKs' own types."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from openai.types.chat import ChatCompletion

from supervisor.gateway.door import Exchange
from supervisor.gateway.openai.api_routes import API_ROUTES
from supervisor.gateway.relay.conforming import (
    AnswerConformed,
    chunks_conformed,
    conformed_chat,
    conformed_completion,
    conformed_error,
)
from supervisor.gateway.relay.reshaped import reading_answer
from supervisor.gateway.relay.responses_events import response_events_conformed
from supervisor.gateway.relay.sse import WholeEvents
from supervisor.gateway.relay.stream_errors import Failure
from tests.spec_check import COMPLETION_CHUNK, SpecViolation, check, check_event, need_spec, stream_events
from tests.tapped import fed, fed_tap

SSE = [(b"content-type", b"text/event-stream")]
MSG = "msg_1"


def sse(data: dict[str, Any], name: str | None = None) -> bytes:
    return (f"event: {name}\n" if name else "").encode() + b"data: " + json.dumps(data).encode() + b"\n\n"


def named(kind: str, **fields: Any) -> bytes:
    return sse({"type": kind, **fields}, kind)


def through(reader: Any, status: int, headers: list[tuple[bytes, bytes]], *pieces: bytes) -> tuple[
        dict[str, Any], bytes]:
    """*pieces* of an answer through *reader*: the start message the client got, and the body."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def main() -> None:
        tap = fed(send, reader)
        await tap({"type": "http.response.start", "status": status, "headers": headers})
        for i, piece in enumerate(pieces):
            await tap({"type": "http.response.body", "body": piece, "more_body": i < len(pieces) - 1})

    trio.run(main)
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def in_pieces(stream: bytes, size: int) -> list[bytes]:
    return [stream[i:i + size] for i in range(0, len(stream), size)] or [b""]


# A Responses stream as the real llama-server sends one whose first token is half a character (0.3.36).
STATUS = {"id": "resp_1", "object": "response", "status": "in_progress"}
TEXT = {"type": "output_text", "annotations": [], "logprobs": [], "text": "くわ"}
ITEM = {"type": "message", "status": "completed", "id": MSG, "content": [TEXT], "role": "assistant"}
LLAMA_RESPONSES = b"".join([
    named("response.created", response=STATUS), named("response.in_progress", response=STATUS),
    named("response.output_item.added", item={"content": [], "id": MSG, "role": "assistant",
                                              "status": "in_progress", "type": "message"}),
    named("response.content_part.added", item_id=MSG, part={"type": "output_text", "text": ""}),
    named("response.output_text.delta", item_id=MSG, delta="く"),
    named("response.created", response=STATUS), named("response.in_progress", response=STATUS),
    named("response.output_text.delta", item_id=MSG, delta="わ"),
    named("response.output_text.done", item_id=MSG, text="くわ"),
    named("response.content_part.done", item_id=MSG, part=TEXT),
    named("response.output_item.done", item=ITEM),
    named("response.completed", response={
        "id": "resp_1", "object": "response", "created_at": 1700000000, "status": "completed", "model": "chat",
        "output": [ITEM], "usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7,
                                    "input_tokens_details": {"cached_tokens": 0}}}, timings={"predicted_n": 2}),
])


@pytest.mark.parametrize("size", [1, 7, 100, len(LLAMA_RESPONSES)])
def test_a_llama_server_responses_stream_comes_out_as_the_spec_requires(size: int) -> None:
    need_spec()
    _, stream = through(response_events_conformed("chat"), 200, SSE, *in_pieces(LLAMA_RESPONSES, size))
    events = [(name, json.loads(data)) for name, data in stream_events(stream)]
    for name, event in events:
        check_event(event)
        assert name == event["type"]
    assert [event["type"] for _, event in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]  # opened once
    assert [event["sequence_number"] for _, event in events] == list(range(10))
    assert {(event.get("output_index"), event.get("content_index")) for _, event in events[3:8]} == {(0, 0)}
    created, completed = events[0][1]["response"], events[-1][1]["response"]
    assert created["model"] == "chat" and created["tools"] == [] and created["error"] is None
    assert completed["usage"]["output_tokens_details"] == {"reasoning_tokens": 0}
    assert events[-1][1]["timings"] == {"predicted_n": 2}  # what the engine sent is kept


def test_indexes_follow_the_items_and_parts_and_the_engine_s_own_are_kept() -> None:
    reasoning = {"id": "rs_1", "type": "reasoning", "content": [], "status": "in_progress"}
    stream = b"".join([
        named("response.created", response=STATUS),
        named("response.output_item.added", item=reasoning),
        named("response.reasoning_text.delta", item_id="rs_1", delta="hm"),
        named("response.output_item.added", item={"id": MSG, "type": "message", "role": "assistant",
                                                  "content": [], "status": "in_progress"}),
        named("response.content_part.added", item_id=MSG, part={"type": "output_text", "text": ""}),
        named("response.content_part.added", item_id=MSG, part={"type": "refusal", "refusal": ""}),
        named("response.refusal.delta", item_id=MSG, delta="no"),
        named("response.output_item.done", item={**reasoning, "status": "completed"}),
        named("response.output_item.added", output_index=7, item={"type": "function_call", "call_id": "c",
                                                                  "name": "f", "arguments": ""}),
        named("response.function_call_arguments.delta", item_id="c", delta="{}"),
    ])
    _, out = through(response_events_conformed("chat"), 200, SSE, stream)
    placed = [(e["type"].removeprefix("response."), e.get("output_index"), e.get("content_index"))
              for e in (json.loads(data) for _, data in stream_events(out))]
    assert placed == [("created", None, None), ("output_item.added", 0, None), ("reasoning_text.delta", 0, 0),
                      ("output_item.added", 1, None), ("content_part.added", 1, 0), ("content_part.added", 1, 1),
                      ("refusal.delta", 1, 1), ("output_item.done", 0, None), ("output_item.added", 7, None),
                      ("function_call_arguments.delta", 7, None)]


def test_one_response_id_and_steward_s_own_events_numbered_on() -> None:
    opening = named("response.created", response={"id": "resp_steward", "object": "response",
                                                  "status": "in_progress"})
    failed = named("response.failed", sequence_number=0, response={"id": "resp_engine", "status": "failed"})
    _, out = through(response_events_conformed("chat"), 200, SSE, opening, b": ping\n\n", failed)
    events = [json.loads(data) for _, data in stream_events(out)]
    assert [(e["sequence_number"], e["response"]["id"]) for e in events] == [(0, "resp_steward"),
                                                                             (1, "resp_steward")]
    assert b": ping\n\n" in out  # a comment goes as it came


def test_a_stream_of_announced_length_and_an_error_answer_go_as_they_came() -> None:
    stream = named("response.created", response=STATUS)
    headers = [*SSE, (b"content-length", str(len(stream)).encode())]
    assert through(response_events_conformed("chat"), 200, headers, stream)[1] == stream
    error = b'{"error":{"code":400,"message":"m","type":"t"}}'
    assert through(response_events_conformed("chat"), 400, [(b"content-type", b"application/json")], error)[1] == error


LLAMA_CHAT = {"choices": [{"finish_reason": "length", "index": 0, "message": {"role": "assistant", "content": "hi"}}],
              "created": 1, "model": "chat", "system_fingerprint": "b1", "object": "chat.completion",
              "usage": {"completion_tokens": 1, "prompt_tokens": 2, "total_tokens": 3}, "id": "chatcmpl-1"}
VLLM_CHAT = {"id": "c", "object": "chat.completion", "created": 1, "model": "m", "system_fingerprint": None,
             "choices": [{"index": 0, "logprobs": None, "finish_reason": "stop", "message": {
                 "role": "assistant", "content": "hi", "refusal": None, "annotations": None, "function_call": None,
                 "tool_calls": [], "reasoning_content": None}}],
             "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2, "prompt_tokens_details": None}}


@pytest.mark.parametrize("answer", [LLAMA_CHAT, VLLM_CHAT], ids=["llama-server", "vLLM"])
def test_a_whole_chat_completion_gets_what_the_spec_requires_and_its_new_length(answer: dict[str, Any]) -> None:
    need_spec()
    body = json.dumps(answer).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    start, out = through(AnswerConformed(conformed_chat), 200, headers, body[:9], body[9:])
    check(json.loads(out), "CreateChatCompletionResponse")
    ChatCompletion.model_validate_json(out)
    assert dict(start["headers"])[b"content-length"] == str(len(out)).encode()
    again = json.dumps(json.loads(out)).encode()
    assert through(AnswerConformed(conformed_chat), 200, headers, again)[1] == again  # conforming: its own bytes


def test_an_engine_s_error_in_openai_s_shape_and_noted_as_the_engine_said_it() -> None:
    need_spec()
    noted: list[Failure] = []
    llama = b'{"error":{"code":400,"message":"too long","type":"exceed_context_size_error","n_ctx":8}}'
    _, out = through(AnswerConformed(None, noted.append), 400, [(b"content-type", b"application/json")], llama)
    check(json.loads(out), "ErrorResponse")
    assert json.loads(out)["error"] == {"code": None, "message": "too long", "type": "exceed_context_size_error",
                                        "n_ctx": 8, "param": None}
    assert noted == [Failure(400, "exceed_context_size_error", "too long")]
    for other, status in [({"error": "model 'x' not found"}, 404), ({"object": "error", "message": "bad", "code": 400,
                                                                     "type": "BadRequestError"}, 400),
                          ({"detail": "Not Found"}, 404)]:
        fixed = conformed_error(other, status)
        assert fixed is not None
        check(fixed, "ErrorResponse")
    assert conformed_error({"error": {"message": "m", "type": "t", "param": None, "code": None}}, 400) is None


def test_fastapi_s_details_are_read_into_openai_s_fields() -> None:
    """Kokoro-FastAPI's HTTPException(detail={...}) and pydantic's 422 list: words, not a JSON dump."""
    need_spec()
    kokoro = {"detail": {"error": "validation_error", "message": "Voice 'x' not found", "type": "invalid_request_error"}}
    assert conformed_error(kokoro, 400) == {"error": {"message": "Voice 'x' not found", "type": "invalid_request_error",
                                                      "code": "validation_error", "param": None}}
    one = {"detail": [{"type": "less_than_equal", "loc": ["body", "speed"], "msg": "Input should be at most 4.0"}]}
    assert conformed_error(one, 422)["error"] | {} == {  # type: ignore[index]
        "message": "speed: Input should be at most 4.0", "param": "speed", "type": "invalid_request_error",
        "code": None}
    two = {"detail": [{"loc": ["body", "input"], "msg": "Field required"}, {"loc": ["body"], "msg": "bad"}]}
    assert conformed_error(two, 422)["error"]["message"] == "input: Field required; bad"  # type: ignore[index]
    for odd in ({"detail": [1, 2]}, {"detail": {"no": "message"}}, {"detail": None}):
        fixed = conformed_error(odd, 500)
        assert fixed is not None and isinstance(fixed["error"]["message"], str)
        check(fixed, "ErrorResponse")
    ok = b'{"text": "hi"}'  # a 200 of a route with nothing to put right: not even held
    assert through(AnswerConformed(None), 200, [(b"content-type", b"application/json")], ok)[1] == ok


def test_stream_chunks_an_error_event_cut_in_two_and_a_completion_chunk_without_logprobs() -> None:
    need_spec()
    noted: list[Failure] = []
    chunk = {"id": "c", "object": "text_completion", "created": 1, "model": "m",
             "choices": [{"text": " the", "index": 0, "finish_reason": None}]}
    error = sse({"error": {"code": 500, "message": "boom", "type": "server_error"}})
    stream = sse(chunk) + error
    cut = len(stream) - 20
    _, out = through(chunks_conformed(conformed_completion, noted.append), 200, SSE, stream[:cut], stream[cut:])
    first, last = (json.loads(data) for _, data in stream_events(out))
    check(first, COMPLETION_CHUNK)
    check(last, "ErrorResponse")
    assert noted == [Failure(500, "server_error", "boom")]
    content = sse({"choices": [{"index": 0, "delta": {"content": '{"error": "x"}'}, "finish_reason": None}]})
    assert through(chunks_conformed(None), 200, SSE, content, b"data: [DONE]\n\n")[1] == content + b"data: [DONE]\n\n"


def test_the_routes_put_it_right_on_every_listener() -> None:
    """``reading_answer`` puts the readers on: a Responses stream numbered, a chat answer completed."""
    need_spec()
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def main() -> None:
        exchange = Exchange("r", "openai", "POST", "/v1/responses", 0.0, 0.0)
        tap = fed_tap(reading_answer(send, API_ROUTES["/v1/responses"], exchange, keep_usage_chunk=False,
                                     stream=True, model="chat"))
        await tap({"type": "http.response.start", "status": 200, "headers": SSE})
        await tap({"type": "http.response.body", "body": LLAMA_RESPONSES, "more_body": False})

    trio.run(main)
    stream = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    for _, data in stream_events(stream):
        check_event(json.loads(data))


def test_whole_events_holds_only_the_event_whose_end_is_to_come() -> None:
    events = WholeEvents(limit=64)
    assert events.whole(b"data: 1\n\ndata: 2", True) == b"data: 1\n\n"
    assert events.whole(b"2\r", True) == b""
    assert events.whole(b"\n\r\ndata: 3", True) == b"data: 22\r\n\r\n"
    assert events.whole(b"", False) == b"data: 3"  # the stream's end: what is held goes as it came
    assert WholeEvents(limit=4).whole(b"data: a long one", True) == b"data: a long one"  # too long to hold


def test_the_checker_is_strict_on_what_the_spec_requires() -> None:
    need_spec()
    check({"error": {"message": "m", "type": "t", "param": None, "code": None}}, "ErrorResponse")
    for bad in ({"error": {"message": "m", "type": "t", "code": None}},  # param missing
                {"error": {"message": "m", "type": "t", "param": None, "code": 400}},  # code: a string or null
                {"error": {"message": None, "type": "t", "param": None, "code": None}}):
        with pytest.raises(SpecViolation):
            check(bad, "ErrorResponse")
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]}
    check(chunk, "CreateChatCompletionStreamResponse")  # null where the spec says nullable (OpenAPI 3.0's word)
    with pytest.raises(SpecViolation):
        check({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "tired"}]},
              "CreateChatCompletionStreamResponse")
    with pytest.raises(SpecViolation):
        check({**chunk, "created": 1.5}, "CreateChatCompletionStreamResponse")  # an integer
    with pytest.raises(SpecViolation):
        check_event({"type": "response.output_text.delta", "item_id": "m", "delta": "x", "sequence_number": 0,
                     "logprobs": [], "content_index": 0})  # no output_index


def test_a_response_repeats_its_requests_settings_and_keeps_its_usage_last() -> None:
    from supervisor.gateway.relay.responses_events import conformed_response, request_echo

    tools = [{"type": "function", "name": f"tool_{n}", "parameters": {"type": "object", "properties": {}},
              "description": "x" * 500} for n in range(40)]  # an agent's: ~25 KB, past the usage log's tail
    request = {"model": "m", "input": "hi", "tools": tools, "tool_choice": "none", "temperature": 0.2,
               "top_p": None, "stream": True}
    response = {"id": "resp_1", "object": "response", "status": "completed", "temperature": None,
                "usage": {"input_tokens": 7, "output_tokens": 2, "total_tokens": 9}, "output": []}
    assert conformed_response(response, model="m", created_at=1, echo=request_echo(request))
    assert response["tools"] == [{"strict": None, **tool} for tool in tools]  # strict: required in a response
    assert (response["tool_choice"], response["temperature"], response["top_p"]) == ("none", 0.2, None)
    assert list(response)[-1] == "usage" and response["usage"]["input_tokens"] == 7
    written = json.dumps(response)
    assert len(written) > 8192 and written.rfind('"input_tokens"') > len(written) - 300
