"""The new APIs through steward in front of the REAL llama-server (CPU build, tiny random
models written here): OpenAI's Responses with the `openai` client, Anthropic's Messages and
count_tokens with the `anthropic` client, rerank with a tiny reranker, and what an embedding
model does when asked to chat (steward refuses it; told it serves chat, the engine's own 500
comes back in the route's shape).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from fakes.llama_binary import llama_server_path
from fakes.tiny_gguf import write_tiny_model
from tests.conftest import RunningSteward, launch_steward

pytestmark = pytest.mark.slow
ARGS = ["-c", "512", "--threads", "1"]


@pytest.fixture(scope="module")
def steward(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSteward]:
    binary = str(llama_server_path())  # fails (never skips) with the build command when missing
    folder = tmp_path_factory.mktemp("real-apis")
    chat = write_tiny_model(folder / "llama.gguf", "llama")
    bert = write_tiny_model(folder / "bert.gguf", "bert")
    ranker = write_tiny_model(folder / "ranker.gguf", "bert", reranker=True)

    def model(path: Path, *args: str, **config: object) -> dict[str, object]:
        return {"command": binary, "model": str(path), "args": [*ARGS, *args], "parallel": 1, **config}

    models = {"chat": model(chat.path, "--alias", "chat"), "embed": model(bert.path, "--embeddings"),
              "rank": model(ranker.path, "--reranking"),
              "misled": model(bert.path, "--embeddings", serves=["chat", "messages"])}
    registry: list[RunningSteward] = []
    launch_steward(folder, models, registry, gpu={"probe": "host", "budget": "4GiB"})
    yield registry[0]
    assert registry[0].stop() == 0


@pytest.fixture(autouse=True)
def no_leaked_children() -> Iterator[None]:
    yield  # the module's steward lives across tests


def test_responses_and_messages_with_the_official_clients(steward: RunningSteward) -> None:
    oai = openai.OpenAI(base_url=steward.base_url, api_key="x", max_retries=0, timeout=60)
    answer = oai.responses.create(model="chat", input="hello", max_output_tokens=3)
    assert answer.status == "completed" and answer.model == "chat" and answer.usage is not None
    # Greedy (temperature 0) with the tiny model's fixed weights: the same tokens every run. Sampled, about
    # 1 stream in 20 begins with half a character (a byte token), which llama-server holds back, so its
    # /v1/messages stream has no message_start (steward sends one: stream_start.py) and a stream of no whole
    # character has no response.created either (the fake llama-server does the same: FAKE_SPLIT_UTF8).
    kinds = [event.type for event in oai.responses.create(model="chat", input="hi", max_output_tokens=3,
                                                          stream=True, temperature=0)]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"

    claude = anthropic.Anthropic(base_url=steward.url, api_key="x", max_retries=0, timeout=60)
    message = claude.messages.create(model="chat", max_tokens=3, system="be brief",
                                     messages=[{"role": "user", "content": "hello"}])
    assert message.type == "message" and message.usage.output_tokens <= 3
    with claude.messages.stream(model="chat@background", max_tokens=3, extra_body={"temperature": 0},
                                messages=[{"role": "user", "content": "hi"}]) as stream:
        kinds = [event.type for event in stream]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert claude.messages.count_tokens(model="chat", messages=[{"role": "user", "content": "hi"}]).input_tokens > 0
    deadline = time.monotonic() + 10  # a request's event is written once its answer ended: a moment later
    while len(rows := [r for r in steward.events("request") if r["route"] == "/v1/messages"]) < 2:
        assert time.monotonic() < deadline, rows
        time.sleep(0.02)
    assert [r["status"] for r in rows] == [200, 200]
    assert rows[-1]["class"] == "background" and rows[-1]["completion_tokens"] is not None


def test_rerank_with_a_tiny_reranker(steward: RunningSteward) -> None:
    body = {"model": "rank", "query": "a cat", "documents": ["a dog", "a cat sat", "stocks fell"], "top_n": 2}
    answer = httpx.post(f"{steward.base_url}/rerank", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert len(results) == 2 and results[0]["relevance_score"] >= results[1]["relevance_score"]
    refused = httpx.post(f"{steward.base_url}/rerank", json={**body, "model": "chat"}, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "model_not_supported"


def test_an_embedding_model_asked_to_chat(steward: RunningSteward) -> None:
    oai = openai.OpenAI(base_url=steward.base_url, api_key="x", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as refused:
        oai.chat.completions.create(model="embed", messages=[{"role": "user", "content": "hi"}])
    assert refused.value.code == "model_not_supported"  # steward's 400: the engine never saw it
    # Its config says it serves chat and messages: the real engine answers 500, in each route's shape.
    with pytest.raises(openai.InternalServerError) as failed:
        oai.chat.completions.create(model="misled", messages=[{"role": "user", "content": "hi"}])
    assert "does not support logits computation" in failed.value.message
    claude = anthropic.Anthropic(base_url=steward.url, api_key="x", max_retries=0, timeout=60)
    with pytest.raises(anthropic.InternalServerError) as failed_messages:
        claude.messages.create(model="misled", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert failed_messages.value.body["type"] == "error"
    assert failed_messages.value.body["error"]["type"] == "api_error"
