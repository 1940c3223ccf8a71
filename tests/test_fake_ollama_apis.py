"""The fake Ollama's /v1/responses and /v1/messages, run as a real subprocess: the official clients, then the quirks.

Shapes follow ollama/ollama ``openai/responses.go`` + ``middleware/openai.go`` (Responses) and
``anthropic/anthropic.go`` + ``middleware/anthropic.go`` (Anthropic Messages).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.fake_processes import FakeProcess, fake_launcher, wait_until

pytestmark = pytest.mark.slow  # every test here starts the fake as a real process

CHAT = "gemma3:4b,size=4GiB,load=0.2s,tps=200"
EMBED = "nomic-embed-text,size=0.3GiB,load=0.1s,embed"
ANSWER = " the quick brown fox jumps over a lazy"  # --num-predict 8 (the default)
HELLO = [{"role": "user", "content": "hello there"}]  # 2 words + 4 for the message: 6 prompt tokens
RESPONSES_STREAM = ["response.created", "response.in_progress", "response.output_item.added",
                    "response.content_part.added", *["response.output_text.delta"] * 8, "response.output_text.done",
                    "response.content_part.done", "response.output_item.done", "response.completed"]
MESSAGES_STREAM = ["message_start", "content_block_start", *["content_block_delta"] * 8, "content_block_stop",
                   "message_delta", "message_stop"]


@pytest.fixture
def start_ollama(tmp_path: Path) -> Iterator[Callable[..., FakeProcess]]:
    """Start ``python -m fakes.ollama`` with the chat and embedding models; always stopped and reaped."""
    for launcher in fake_launcher(tmp_path):
        yield lambda *args, models=(CHAT, EMBED): launcher.launch(
            FakeProcess, "fakes.ollama", [*(a for spec in models for a in ("--model", spec)), *args],
            ready_path="/api/version")


def sse(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each ``event:``/``data:`` pair."""
    events = []
    for block in response.text.split("\n\n"):
        if block:
            name, data = block.split("\n")
            events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def openai_client(fake: FakeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=fake.url + "/v1", api_key="ollama", max_retries=0)


def anthropic_client(fake: FakeProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=fake.url, api_key="x", max_retries=0)


# --------------------------------------------------------------------------- the official clients


def test_openai_client_responses(start_ollama: Callable[..., FakeProcess]) -> None:
    client = openai_client(start_ollama())

    whole = client.responses.create(model="gemma3:4b", input="hello there")
    assert (whole.object, whole.status, whole.output_text) == ("response", "completed", ANSWER)
    assert whole.id.startswith("resp_") and whole.output[0].type == "message" and whole.model == "gemma3:4b"
    assert whole.usage is not None and (whole.usage.input_tokens, whole.usage.output_tokens,
                                        whole.usage.total_tokens) == (6, 8, 14)
    assert whole.usage.input_tokens_details.cached_tokens == 0 and whole.completed_at is not None

    cut = client.responses.create(model="gemma3:4b", instructions="be brief", input=HELLO, max_output_tokens=3,
                                  temperature=0.5)
    assert cut.output_text == " the quick brown" and cut.status == "completed"  # Ollama: never "incomplete"
    assert (cut.instructions, cut.max_output_tokens, cut.temperature, cut.top_p) == ("be brief", 3, 0.5, 1)
    assert cut.usage is not None and cut.usage.input_tokens == 6 + 6  # the system message and the user's

    events = list(client.responses.create(model="gemma3:4b", input="hello there", stream=True))
    assert [e.type for e in events] == RESPONSES_STREAM
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == ANSWER
    created, completed = events[0], events[-1]
    assert created.response.status == "in_progress" and created.response.usage is None
    assert completed.response.id == created.response.id and completed.response.output_text == ANSWER
    assert completed.response.usage is not None and completed.response.usage.output_tokens == 8

    with client.responses.stream(model="gemma3:4b", input="hello there") as stream:  # the SDK's accumulator
        final = stream.get_final_response()
    assert final.output_text == ANSWER


def test_anthropic_client_messages(start_ollama: Callable[..., FakeProcess]) -> None:
    client = anthropic_client(start_ollama())

    whole = client.messages.create(model="gemma3:4b", max_tokens=100, messages=HELLO)  # type: ignore[arg-type]
    assert (whole.type, whole.role, whole.model, whole.stop_reason) == ("message", "assistant", "gemma3:4b",
                                                                        "end_turn")
    assert whole.id.startswith("msg_") and [b.type for b in whole.content] == ["text"]
    assert whole.content[0].text == ANSWER  # type: ignore[union-attr]
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (6, 8)

    cut = client.messages.create(model="gemma3:4b", max_tokens=3, system="be brief",
                                 messages=HELLO)  # type: ignore[arg-type]
    assert cut.content[0].text == " the quick brown" and cut.stop_reason == "max_tokens"  # type: ignore[union-attr]
    assert cut.usage.input_tokens == 6 + 6  # the system message and the user's
    events = list(client.messages.create(model="gemma3:4b", max_tokens=100, messages=HELLO,  # type: ignore[arg-type]
                                         stream=True))
    assert [e.type for e in events] == MESSAGES_STREAM
    start, delta = events[0], events[-2]
    # message_start has Ollama's estimate: len("user" + "hello there") // 4; message_delta the real counts
    assert start.message.usage.input_tokens == 3 and start.message.content == []  # type: ignore[union-attr]
    assert (delta.usage.input_tokens, delta.usage.output_tokens) == (6, 8)  # type: ignore[union-attr]
    assert delta.delta.stop_reason == "end_turn"  # type: ignore[union-attr]
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == ANSWER  # type: ignore

    with client.messages.stream(model="gemma3:4b", max_tokens=100, messages=HELLO) as stream:  # type: ignore
        final = stream.get_final_message()
    assert final.content[0].text == ANSWER and final.usage.output_tokens == 8  # type: ignore[union-attr]


# --------------------------------------------------------------------------- errors in each route's shape


def test_unknown_model_in_each_shape(start_ollama: Callable[..., FakeProcess]) -> None:
    fake = start_ollama()
    with pytest.raises(openai.NotFoundError) as oai:
        openai_client(fake).responses.create(model="nope", input="hi")
    assert oai.value.status_code == 404
    assert oai.value.body == {"message": "model 'nope' not found", "type": "not_found_error", "param": None,
                              "code": None}
    with pytest.raises(anthropic.NotFoundError) as ant:
        anthropic_client(fake).messages.create(model="nope", max_tokens=10, messages=HELLO)  # type: ignore[arg-type]
    body = ant.value.body
    assert isinstance(body, dict) and set(body) == {"type", "error", "request_id"}
    assert body["type"] == "error" and body["request_id"].startswith("req_")
    assert body["error"] == {"type": "not_found_error", "message": "model 'nope' not found"}

    # asked to stream, still one JSON error: nothing was streamed yet
    r = fake.post("/v1/messages", {"model": "nope", "max_tokens": 5, "messages": HELLO, "stream": True})
    assert r.status_code == 404 and r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["type"] == "not_found_error"
    r = fake.post("/v1/responses", {"model": "nope", "input": "x", "stream": True})
    assert (r.status_code, r.json()["error"]["type"]) == (404, "not_found_error")


def test_bad_requests_in_each_shape(start_ollama: Callable[..., FakeProcess]) -> None:
    fake = start_ollama()

    def anthropic_error(body: object) -> tuple[int, str, str]:
        r = httpx.post(fake.url + "/v1/messages", content=body if isinstance(body, bytes) else json.dumps(body))
        error = r.json()["error"]
        assert r.json()["type"] == "error" and set(error) == {"type", "message"}
        return r.status_code, error["type"], error["message"]

    bad = "invalid_request_error"
    assert anthropic_error({"max_tokens": 5, "messages": HELLO}) == (400, bad, "model is required")
    assert anthropic_error({"model": "gemma3:4b", "messages": HELLO}) == \
        (400, bad, "max_tokens is required and must be positive")
    assert anthropic_error({"model": "gemma3:4b", "max_tokens": 5, "messages": []}) == \
        (400, bad, "messages is required")
    assert anthropic_error({"model": "nomic-embed-text", "max_tokens": 5, "messages": HELLO}) == \
        (400, bad, '"nomic-embed-text" does not support chat')
    status, kind, message = anthropic_error({"model": "gemma3:4b", "max_tokens": "5", "messages": HELLO})
    assert (status, kind) == (400, bad) and "cannot unmarshal string" in message and "max_tokens" in message
    tool_use = [{"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": {}}]}]
    assert anthropic_error({"model": "gemma3:4b", "max_tokens": 5, "messages": tool_use})[2] == \
        "tool_use block missing required 'id' field"
    assert anthropic_error(b"{not json")[:2] == (400, bad)
    assert anthropic_error(b"[1]")[:2] == (400, bad)

    def openai_error(body: object) -> tuple[int, str, str]:
        r = httpx.post(fake.url + "/v1/responses", content=json.dumps(body))
        error = r.json()["error"]
        assert set(r.json()) == {"error"} and set(error) == {"message", "type", "param", "code"}
        return r.status_code, error["type"], error["message"]

    assert openai_error({"input": "x"}) == (400, bad, "model is required")
    assert openai_error({"model": "gemma3:4b", "input": 5})[2].startswith("input must be a string or array")
    assert openai_error({"model": "gemma3:4b", "input": [{"type": "nope"}]})[2] == \
        'input[0]: unknown input item type: "nope"'
    assert openai_error({"model": "gemma3:4b", "input": "x", "reasoning": {"effort": "huge"}})[2] == \
        'invalid reasoning value: "huge" (must be "high", "medium", "low", "max", or "none")'
    assert openai_error({"model": "nomic-embed-text", "input": "x"}) == \
        (400, bad, '"nomic-embed-text" does not support chat')
    assert fake.stats()["requests_started"] == 0


def test_queue_full_in_each_shape(start_ollama: Callable[..., FakeProcess]) -> None:
    fake = start_ollama("--max-queue", "0")  # every request finds the queue full
    with pytest.raises(anthropic.APIStatusError) as ant:
        anthropic_client(fake).messages.create(model="gemma3:4b", max_tokens=5, messages=HELLO)  # type: ignore
    assert ant.value.status_code == 503 and ant.value.body["error"]["type"] == "overloaded_error"  # type: ignore
    with pytest.raises(openai.APIStatusError) as oai:
        openai_client(fake).responses.create(model="gemma3:4b", input="hi")
    assert oai.value.status_code == 503 and oai.value.body["type"] == "api_error"  # type: ignore[index]
    assert fake.stats()["requests_rejected"] == 2


# --------------------------------------------------------------------------- the engine's behaviour, new shapes


def test_midstream_failure_just_ends_the_stream(start_ollama: Callable[..., FakeProcess]) -> None:
    """Ollama's writers read the handler's ``{"error"}`` line as an empty chunk: no event, no closing events."""
    fake = start_ollama()
    hook = [{"role": "user", "content": "FAKE_ERROR_MIDSTREAM"}]
    r = fake.post("/v1/responses", {"model": "gemma3:4b", "input": hook, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
    assert [name for name, _ in sse(r)] == RESPONSES_STREAM[:4] + ["response.output_text.delta"] * 2
    r = fake.post("/v1/messages", {"model": "gemma3:4b", "max_tokens": 50, "messages": hook, "stream": True})
    assert [name for name, _ in sse(r)] == ["message_start", "content_block_start", "content_block_delta",
                                            "content_block_delta"]
    r = fake.post("/v1/messages", {"model": "gemma3:4b", "max_tokens": 50, "messages": hook})
    assert (r.status_code, r.json()["error"]["type"]) == (500, "api_error")
    assert "FAKE_ERROR_MIDSTREAM" in r.json()["error"]["message"]
    r = fake.post("/v1/responses", {"model": "gemma3:4b", "input": hook})
    assert (r.status_code, r.json()["error"]["type"]) == (500, "api_error")
    assert fake.stats()["requests_failed"] == 4


def test_empty_conversation_only_loads(start_ollama: Callable[..., FakeProcess]) -> None:
    """No message reaches the chat handler: it loads the model and answers ``done_reason: "load"``."""
    fake = start_ollama()
    r = fake.post("/v1/responses", {"model": "gemma3:4b", "input": ""})
    body = r.json()
    assert body["output"][0]["content"][0]["text"] == "" and body["usage"]["total_tokens"] == 0
    assert [m["name"] for m in fake.get("/api/ps").json()["models"]] == ["gemma3:4b"]
    r = fake.post("/v1/responses", {"model": "gemma3:4b", "stream": True})
    events = sse(r)
    assert [name for name, _ in events] == ["response.created", "response.in_progress", "response.completed"]
    assert events[-1][1]["response"]["output"] is None  # the converter's nil output list
    r = fake.post("/v1/messages", {"model": "gemma3:4b", "max_tokens": 5, "messages": [{"role": "user",
                                                                                          "content": ""}]})
    assert (r.json()["content"], r.json()["stop_reason"]) == (None, "stop_sequence")  # mapStopReason("load")
    assert fake.stats()["requests_started"] == 0


def test_client_leaving_cancels_generation(start_ollama: Callable[..., FakeProcess]) -> None:
    fake = start_ollama(models=("slow:1b,size=1GiB,load=0s,tps=10",))
    for path, body in (("/v1/messages", {"max_tokens": 50, "messages": HELLO}), ("/v1/responses", {"input": "x"})):
        with httpx.Client(base_url=fake.url, timeout=10) as client, \
                client.stream("POST", path, json={"model": "slow:1b", "stream": True, **body}) as r:
            assert next(r.iter_lines()).startswith("event: ")
    wait_until(lambda: fake.stats()["requests_cancelled"] == 2)
    stats = fake.stats()
    assert (stats["active"], stats["requests_completed"]) == (0, 0)
