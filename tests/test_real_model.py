"""A real instruct model speaking through steward: SmolLM2-135M-Instruct (Q4_1) on the REAL
llama-server (CPU build), asked "What is the capital of France?" through every API that
generates text, streamed and not, with the official `openai` and `anthropic` clients.

Greedy decoding (temperature 0) on one thread gives the same tokens every run, so the answer
is asserted by what it says: it names Paris. That shows an answer a person would read survives
the path (class headers, the body steward rewrites, the relay, the readers of each API's
stream), which the tiny random-weight models cannot.
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest

from fakes.llama_binary import llama_server_path
from fakes.real_model import smollm2_gguf
from tests.conftest import RunningSteward, launch_steward

pytestmark = pytest.mark.slow

SYSTEM = "You are a helpful assistant."
QUESTION = "What is the capital of France?"
MAX_TOKENS = 24
GREEDY = {"temperature": 0}  # the anthropic client takes no temperature argument: sent in the body


@pytest.fixture(scope="module")
def steward(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSteward]:
    binary, model = str(llama_server_path()), str(smollm2_gguf())
    folder = tmp_path_factory.mktemp("real-model")
    models = {"smollm2": {"command": binary, "model": model, "aliases": ["gpt-4o-mini", "claude-3-5-haiku"],
                          "args": ["-c", "2048", "--threads", "1"], "parallel": 1}}
    registry: list[RunningSteward] = []
    launch_steward(folder, models, registry, gpu={"probe": "host", "budget": "4GiB"})
    yield registry[0]
    assert registry[0].stop() == 0


@pytest.fixture(autouse=True)
def no_leaked_children() -> Iterator[None]:
    yield  # the module's steward lives across tests


def openai_client(steward: RunningSteward) -> openai.OpenAI:
    return openai.OpenAI(base_url=steward.base_url, api_key="x", max_retries=0, timeout=120)


def says_paris(text: str) -> bool:
    return "Paris" in text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_completions_name_paris(steward: RunningSteward, stream: bool) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    client = openai_client(steward)
    if stream:
        chunks = client.chat.completions.create(model="gpt-4o-mini", messages=messages,  # type: ignore[arg-type]
                                                temperature=0, max_tokens=MAX_TOKENS, stream=True)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    else:
        answer = client.chat.completions.create(model="gpt-4o-mini", messages=messages,  # type: ignore[arg-type]
                                                max_tokens=MAX_TOKENS, extra_body=GREEDY)
        assert answer.model == "smollm2" and answer.usage is not None and answer.usage.completion_tokens > 0
        text = answer.choices[0].message.content or ""
    assert says_paris(text), text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_completions_name_paris(steward: RunningSteward, stream: bool) -> None:
    client = openai_client(steward)
    prompt = "The capital of France is"
    if stream:
        chunks = client.completions.create(model="smollm2", prompt=prompt, temperature=0, max_tokens=8, stream=True)
        text = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
    else:
        text = client.completions.create(model="smollm2", prompt=prompt, temperature=0, max_tokens=8).choices[0].text
    assert says_paris(text), text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_responses_name_paris(steward: RunningSteward, stream: bool) -> None:
    client = openai_client(steward)
    if stream:
        events = list(client.responses.create(model="gpt-4o-mini", instructions=SYSTEM, input=QUESTION,
                                              temperature=0, max_output_tokens=MAX_TOKENS, stream=True))
        text = "".join(getattr(event, "delta", "") for event in events if event.type == "response.output_text.delta")
        assert events[-1].type == "response.completed"
    else:
        answer = client.responses.create(model="gpt-4o-mini", instructions=SYSTEM, input=QUESTION, temperature=0,
                                         max_output_tokens=MAX_TOKENS)
        assert answer.status == "completed" and answer.model == "smollm2"
        text = answer.output_text
    assert says_paris(text), text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_messages_name_paris(steward: RunningSteward, stream: bool) -> None:
    client = anthropic.Anthropic(base_url=steward.url, api_key="x", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": QUESTION}]
    if stream:
        events = list(client.messages.create(model="claude-3-5-haiku", system=SYSTEM, messages=messages,  # type: ignore[arg-type]
                                             max_tokens=MAX_TOKENS, extra_body=GREEDY, stream=True))
        text = "".join(event.delta.text for event in events
                       if event.type == "content_block_delta" and event.delta.type == "text_delta")
        assert events[0].type == "message_start" and events[-1].type == "message_stop"
    else:
        answer = client.messages.create(model="claude-3-5-haiku", system=SYSTEM, messages=messages,  # type: ignore[arg-type]
                                        max_tokens=MAX_TOKENS, extra_body=GREEDY)
        assert answer.model == "smollm2" and answer.usage.output_tokens > 0
        text = "".join(block.text for block in answer.content if block.type == "text")
    assert says_paris(text), text
