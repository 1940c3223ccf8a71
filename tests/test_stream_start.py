"""A Messages or Responses stream that began without its opening event (llama-server leaves it
out when its first token ends the answer or is half a character): steward sends it first.
Pure: the ASGI messages in, what reaches the client out."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from supervisor.apis import Api
from supervisor.gateway.door import Exchange
from supervisor.gateway.openai.api_routes import API_ROUTES
from supervisor.gateway.relay.reshaped import reading_answer
from supervisor.gateway.relay.stream_start import MAX_HELD, StreamOpened
from tests.tapped import fed, fed_tap

SSE = [(b"content-type", b"text/event-stream")]


def event(name: str, **data: Any) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()


def through(api: Api, start: dict[str, Any], *bodies: bytes) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def main() -> None:
        opened = fed(send, StreamOpened(api, "chat"))
        await opened(start)
        for i, body in enumerate(bodies):
            await opened({"type": "http.response.body", "body": body, "more_body": i < len(bodies) - 1})

    trio.run(main)
    return sent


def body_of(sent: list[dict[str, Any]]) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def events_of(stream: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in stream.splitlines() if line.startswith(b"data: ")]


OK = {"type": "http.response.start", "status": 200, "headers": SSE}
FINAL = event("message_delta", delta={"stop_reason": "end_turn", "stop_sequence": None},
              usage={"output_tokens": 1}) + event("message_stop")


def test_a_messages_stream_without_message_start_gets_one_first_and_the_rest_as_it_came() -> None:
    sent = through(Api.MESSAGES, OK, FINAL[:20], FINAL[20:])  # the first event cut over two reads
    assert sent[0] == OK
    stream = body_of(sent)
    assert stream.endswith(FINAL)
    [start, *rest] = events_of(stream)
    assert start["type"] == "message_start"
    message = start["message"]
    assert message["id"].startswith("msg_") and message["model"] == "chat" and message["content"] == []
    assert (message["role"], message["stop_reason"], message["usage"]) == (
        "assistant", None, {"input_tokens": 0, "output_tokens": 0})
    assert [e["type"] for e in rest] == ["message_delta", "message_stop"]
    assert stream.startswith(b"event: message_start\ndata: ")


def test_a_stream_that_opens_itself_goes_through_untouched() -> None:
    opened = event("message_start", message={"id": "msg_1"})
    chunks = [b": ping\n\n", opened[:10], opened[10:] + FINAL]
    sent = through(Api.MESSAGES, OK, *chunks)
    assert body_of(sent) == b"".join(chunks)
    created = event("response.created", response={"id": "resp_7"})
    assert body_of(through(Api.RESPONSES, OK, created, FINAL)) == created + FINAL


def test_a_responses_stream_without_response_created_gets_it_with_the_response_s_own_id() -> None:
    completed = event("response.completed", response={"id": "resp_abc", "status": "completed", "output": []})
    stream = body_of(through(Api.RESPONSES, OK, b":\n\n" + completed))
    kinds = [(e["type"], e["response"]["id"], e["response"]["status"]) for e in events_of(stream)]
    assert kinds == [("response.created", "resp_abc", "in_progress"), ("response.in_progress", "resp_abc",
                                                                        "in_progress"),
                     ("response.completed", "resp_abc", "completed")]
    # An event without the response's id: a fresh one.
    delta = event("response.output_text.delta", item_id="msg_1", delta="é")
    [created, _, _] = events_of(body_of(through(Api.RESPONSES, OK, delta)))
    assert created["response"]["id"].startswith("resp_")


def test_errors_and_answers_that_are_not_streams_go_as_they_came() -> None:
    error = event("error", error={"type": "api_error", "message": "boom"})
    assert body_of(through(Api.MESSAGES, OK, error)) == error
    json_answer = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
    assert body_of(through(Api.MESSAGES, json_answer, b'{"type": "message"}')) == b'{"type": "message"}'
    refused = {"type": "http.response.start", "status": 500, "headers": SSE}
    assert body_of(through(Api.RESPONSES, refused, FINAL)) == FINAL
    unreadable = b"event: x\ndata: not json\n\n"
    assert body_of(through(Api.MESSAGES, OK, unreadable)) == unreadable


def test_a_stream_that_never_ends_an_event_is_held_no_longer_than_max_held() -> None:
    endless = b"data: " + b"x" * (MAX_HELD + 1)
    sent = through(Api.MESSAGES, OK, endless, b"more")
    bodies = [m for m in sent if m["type"] == "http.response.body"]
    assert bodies[0] == {"type": "http.response.body", "body": endless, "more_body": True}
    assert body_of(sent) == endless + b"more"


def test_an_opening_event_is_told_by_its_type_and_parsed_once_by_what_reads_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A Messages stream through its route's readers: its message_start (with the input tokens) and
    its message_delta (the output) are parsed once each, by the usage reader; the opener reads the
    type its data begins with. A first event whose type is not first in its data is still parsed."""
    loads = json.loads
    parsed: list[bytes] = []

    def counting(data: Any, *args: Any, **kwargs: Any) -> Any:
        parsed.append(data)
        return loads(data, *args, **kwargs)

    started = event("message_start", message={"id": "msg_1", "usage": {"input_tokens": 7, "output_tokens": 0}})
    final = event("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 3}) \
        + event("message_stop")
    delta = event("content_block_delta", index=0, delta={"type": "text_delta", "text": "hi"})
    exchange = Exchange("r", "openai", "POST", "/v1/messages", 0.0, 0.0)
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def main() -> None:
        reading = fed_tap(reading_answer(send, API_ROUTES["/v1/messages"], exchange, keep_usage_chunk=False,
                                         stream=True, model="chat"))
        await reading(OK)
        for i, body in enumerate((started, delta, final)):
            await reading({"type": "http.response.body", "body": body, "more_body": i < 2})

    monkeypatch.setattr(json, "loads", counting)
    trio.run(main)
    monkeypatch.undo()
    assert body_of(sent) == started + delta + final
    assert (exchange.prompt_tokens, exchange.completion_tokens) == (7, 3)
    assert len(parsed) == 2 and all(b'"usage"' in data for data in parsed)
    late_type = b'event: message_start\ndata: {"message": {"id": "msg_2"}, "type": "message_start"}\n\n'
    assert body_of(through(Api.MESSAGES, OK, late_type + FINAL)) == late_type + FINAL
