"""A long background generation cut into steps on the real llama-server with a real instruct
model (SmolLM2-135M): a chat that arrives meanwhile is answered within one step, and the cut
answer is the uncut one (each step continues the last from its cached prompt)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from fakes.llama_binary import llama_server_path
from fakes.real_model import smollm2_gguf
from tests.conftest import RunningSteward, launch_steward

pytestmark = pytest.mark.slow

STEP_TOKENS = 32
AGENT_TOKENS = 8 * STEP_TOKENS
STORY = [{"role": "user", "content": "Write a long story about a dragon and a knight who become friends."}]


@pytest.fixture(scope="module")
def steward(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSteward]:
    binary, model = str(llama_server_path()), str(smollm2_gguf())

    def engine(**config: object) -> dict[str, object]:
        return {"command": binary, "model": model, "args": ["-c", "2048", "--threads", "1"], "parallel": 1, **config}

    registry: list[RunningSteward] = []
    launch_steward(tmp_path_factory.mktemp("real_chunked"), {"agent": engine(), "chat": engine(pinned=True)},
                   registry, gpu={"probe": "host", "budget": "3GiB"}, scheduler={"step_tokens": STEP_TOKENS})
    registry[0].wait_event("ready", engine="chat", timeout=120)
    yield registry[0]
    assert registry[0].stop() == 0


@pytest.fixture(autouse=True)
def no_leaked_children() -> Iterator[None]:
    yield  # the module's steward lives across tests; the session check still runs


def agent_steps(steward: RunningSteward) -> int:
    return len([d for d in steward.events("dispatch") if d["model"] == "agent" and d["class"] == "background"])


def stream(steward: RunningSteward, body: dict[str, Any], on_token: Any = None) -> tuple[str, dict[str, Any]]:
    """The text of a streamed answer and its last chunk with choices (its finish) merged with its usage."""
    text, finish, usage = "", None, None
    with httpx.stream("POST", f"{steward.base_url}/chat/completions", json=body, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                piece = choice["delta"].get("content")
                if piece:
                    if not text and on_token is not None:
                        on_token()
                    text += piece
                finish = choice.get("finish_reason") or finish
    return text, {"finish_reason": finish, "usage": usage}


def test_a_chat_arriving_during_a_long_agent_generation_gets_its_first_token_within_one_step(
        steward: RunningSteward) -> None:
    agent: dict[str, Any] = {}
    under_way = threading.Event()

    def generate() -> None:
        body = {"model": "agent@background", "stream": True, "max_tokens": AGENT_TOKENS, "ignore_eos": True,
                "temperature": 0, "messages": STORY, "stream_options": {"include_usage": True}}
        agent["text"], agent["end"] = stream(steward, body, under_way.set)

    thread = threading.Thread(target=generate)
    thread.start()
    try:
        assert under_way.wait(120)
        steward.wait_event("dispatch", timeout=120, model="agent", step=f"2/{AGENT_TOKENS // STEP_TOKENS}")
        sent_at_step = agent_steps(steward)
        seen: list[int] = []
        chat = {"model": "chat", "stream": True, "max_tokens": 16, "temperature": 0,
                "messages": [{"role": "user", "content": "What is the capital of France?"}]}
        text, end = stream(steward, chat, lambda: seen.append(agent_steps(steward)))
        assert text and end["finish_reason"] in ("stop", "length")
        assert seen and seen[0] <= sent_at_step + 1  # the agent started one step more at most meanwhile
    finally:
        thread.join(300)
    assert agent["end"]["finish_reason"] == "length"
    assert agent["end"]["usage"]["completion_tokens"] == AGENT_TOKENS
    steward.wait_event("generation_steps", steps=AGENT_TOKENS // STEP_TOKENS, completion_tokens=AGENT_TOKENS)
    # The same generation uncut (an interactive request is never cut): the steps continued exactly.
    uncut = httpx.post(f"{steward.base_url}/chat/completions", timeout=300, json={
        "model": "agent", "max_tokens": AGENT_TOKENS, "ignore_eos": True, "temperature": 0, "messages": STORY}).json()
    assert agent["text"] == uncut["choices"][0]["message"]["content"]


def test_a_whole_answer_of_steps_is_the_uncut_answer(steward: RunningSteward) -> None:
    body = {"max_tokens": 3 * STEP_TOKENS + 5, "ignore_eos": True, "temperature": 0, "messages": STORY}
    cut = httpx.post(f"{steward.base_url}/chat/completions", json={"model": "agent@batch", **body}, timeout=300).json()
    uncut = httpx.post(f"{steward.base_url}/chat/completions", json={"model": "agent", **body}, timeout=300).json()
    assert cut["choices"][0]["message"]["content"] == uncut["choices"][0]["message"]["content"]
    assert cut["usage"]["completion_tokens"] == uncut["usage"]["completion_tokens"] == 3 * STEP_TOKENS + 5
    assert cut["usage"]["prompt_tokens"] == uncut["usage"]["prompt_tokens"]
    steward.wait_event("generation_steps", steps=4, completion_tokens=3 * STEP_TOKENS + 5, **{"class": "batch"})
