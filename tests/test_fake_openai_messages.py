"""The fake vLLM's Anthropic Messages API (``/v1/messages``), asked by the official ``anthropic`` client.

Shapes follow vLLM 0.32's own answers (captured from the real server): Anthropic's events each
with an ``event:`` line and no ``[DONE]``; validation errors in vLLM's shape, the handler's in
Anthropic's. Every test waits for states, never for fixed times.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import anthropic
import attrs
import httpx
import pytest

from tests.fake_processes import FakeLauncher, FakeProcess, fake_launcher, wait_until

pytestmark = pytest.mark.slow  # every test here starts the fake as a real process

MODEL = "tiny"
HELLO: list[anthropic.types.MessageParam] = [{"role": "user", "content": "hello there"}]
HELLO_TOKENS = 30  # 2 words in the chat template (its default system prompt, the turns)


@attrs.define
class Fake(FakeProcess):
    def client(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.url, api_key="none", timeout=20, max_retries=0)


@pytest.fixture
def start_fake(tmp_path: Path) -> Iterator[Callable[..., Fake]]:
    """``python -m fakes.openai_server --served-model-name tiny ARGS``, once /health answers."""
    for launcher in fake_launcher(tmp_path):
        def start(*args: str, launcher: FakeLauncher = launcher) -> Fake:
            return launcher.launch(Fake, "fakes.openai_server", ["--served-model-name", MODEL, *args],
                                   ready_path="/health")

        yield start


def sse_events(text: str) -> list[tuple[str, dict[str, object]]]:
    """(event name, data) of each SSE event; fails on an event without both lines."""
    events = []
    for block in text.split("\n\n")[:-1]:
        event, data = block.split("\n")
        events.append((event.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def test_whole_answer_and_count_tokens(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake()
    with fake.client() as client:
        message = client.messages.create(model=MODEL, max_tokens=3, messages=HELLO)
        counted = client.messages.count_tokens(model=MODEL, messages=HELLO)
        with_system = client.messages.create(model=MODEL, max_tokens=1, system="be brief", messages=HELLO)
    assert message.id.startswith("chatcmpl-")  # vLLM keeps the chat completion's id
    assert (message.type, message.role, message.model) == ("message", "assistant", MODEL)
    assert [(block.type, block.text) for block in message.content] == [("text", " the quick brown")]
    assert (message.stop_reason, message.stop_sequence) == ("max_tokens", None)
    assert (message.usage.input_tokens, message.usage.output_tokens) == (HELLO_TOKENS, 3)
    assert counted.input_tokens == HELLO_TOKENS
    assert with_system.usage.input_tokens == 19  # the system field takes the template's default one's place
    raw = fake.post("/v1/messages", {"model": MODEL, "max_tokens": 1, "messages": HELLO}).json()
    assert "stop_sequence" not in raw  # exclude_none, as vLLM dumps it


def test_stream_one_delta_per_token_then_stop(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake()
    with fake.client() as client:
        raw_events = list(client.messages.create(model=MODEL, max_tokens=4, messages=HELLO, stream=True))
        with client.messages.stream(model=MODEL, max_tokens=4, messages=HELLO) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
    assert [event.type for event in raw_events] == [
        "message_start", "content_block_start", *["content_block_delta"] * 4, "content_block_stop",
        "message_delta", "message_stop"]
    assert text == " the quick brown fox" and final.stop_reason == "max_tokens"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (HELLO_TOKENS, 4)
    r = fake.post("/v1/messages", {"model": MODEL, "max_tokens": 2, "messages": HELLO, "stream": True})
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    events = sse_events(r.text)  # every event named, no data: [DONE]
    assert all(name == data["type"] for name, data in events)
    start, delta, usage = events[0][1], events[2][1], events[-2][1]
    assert start["message"]["usage"] == {"input_tokens": HELLO_TOKENS, "output_tokens": 0}
    assert delta == {"type": "content_block_delta", "delta": {"type": "text_delta", "text": " the"}, "index": 0}
    assert usage == {"type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                     "usage": {"input_tokens": HELLO_TOKENS, "output_tokens": 2}}


def test_stream_is_paced_and_a_client_that_leaves_aborts_it(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake("--tokens-per-second", "5")
    body = {"model": MODEL, "max_tokens": 1000, "messages": HELLO, "stream": True}  # 200 s if it ran out
    with httpx.stream("POST", fake.url + "/v1/messages", json=body, timeout=20) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: ") and "text_delta" in line)
        assert fake.stats()["running"] == 1  # the first token is out, the stream is not over
    wait_until(lambda: fake.stats()["running"] == 0, timeout=20)


def test_unknown_model_is_404_in_anthropic_shape(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake()
    expected = {"type": "error", "error": {"type": "NotFoundError",
                                           "message": "The model `nope` does not exist. Valid aliases: tiny."}}
    for stream in (False, True):  # checked before a stream starts
        r = fake.post("/v1/messages", {"model": "nope", "max_tokens": 1, "messages": HELLO, "stream": stream})
        assert (r.status_code, r.headers["content-type"], r.json()) == (404, "application/json", expected)
    with fake.client() as client, pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model="nope", max_tokens=1, messages=HELLO)
    assert "does not exist" in str(caught.value)
    assert fake.stats()["started"] == 0  # refused before the engine


def test_bad_requests(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake("--max-model-len", "64")
    r = fake.post("/v1/messages", {"model": MODEL, "messages": [{"role": "tool", "content": "hi"}]})
    error = r.json()["error"]  # validation: vLLM's own shape, every problem named
    assert (r.status_code, error["type"], error["param"], error["code"]) == (400, "Bad Request",
                                                                             "body.messages.0.role", 400)
    assert error["message"].startswith("2 validation errors:\n  {'type': 'literal_error', 'loc': 'body.messages.0.")
    assert "'loc': 'body.max_tokens', 'msg': 'Field required'" in error["message"]
    r = fake.post("/v1/messages", {"model": 5, "messages": "x", "max_tokens": "--5", "stream": "maybe"})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("4 validation errors:")
    r = fake.post("/v1/messages", content=b"{}", headers={"content-type": "text/plain"})
    assert r.json()["error"]["message"] == ("1 validation error:\n  Unsupported Media Type: Only "
                                            "'application/json' is allowed")
    r = fake.post("/v1/messages", {"model": MODEL, "max_tokens": "2", "stream": "yes", "messages": HELLO})
    assert r.status_code == 200 and r.text.count("event: content_block_delta") == 2  # pydantic's lax types
    r = fake.post("/v1/messages", {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user",
                                                                                  "content": "word " * 100}]})
    assert r.status_code == 400 and r.json()["type"] == "error"  # past validation: Anthropic's shape
    assert "maximum context length is 64 tokens" in r.json()["error"]["message"]
    with fake.client() as client, pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL, max_tokens=0, messages=HELLO)
