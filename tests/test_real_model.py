"""A real instruct model speaking through steward: SmolLM2-135M-Instruct (Q4_1) on the REAL
llama-server (CPU build), asked "What is the capital of France?" through every API that
generates text, streamed and not, with the official `openai` and `anthropic` clients.

Greedy decoding (temperature 0) on one thread gives the same tokens every run, so the answer
is asserted by what it says: it names Paris. That shows an answer a person would read survives
the path (class headers, the body steward rewrites, the relay, the readers of each API's
stream), which the tiny random-weight models cannot.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import anthropic.types
import httpx
import openai
import pydantic
import pytest

from fakes.llama_binary import llama_server_path
from fakes.real_model import smollm2_gguf
from tests.conftest import RunningSteward, launch_steward
from tests.spec_check import check_event, need_spec, stream_events

pytestmark = pytest.mark.slow

SYSTEM = "You are a helpful assistant."
QUESTION = "What is the capital of France?"
MAX_TOKENS = 24
GREEDY = {"temperature": 0}  # the anthropic client takes no temperature argument: sent in the body
MESSAGES_EVENT = pydantic.TypeAdapter(anthropic.types.RawMessageStreamEvent)


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


# Its answer begins with half a character (a byte token): llama-server then sends no message_start,
# and response.created and response.in_progress again before almost every delta.
SPLIT_UTF8 = "Write the Japanese word for cat in Japanese script, nothing else."
QUESTIONS = pytest.mark.parametrize("question", [QUESTION, SPLIT_UTF8], ids=["paris", "half-a-character-first"])


@QUESTIONS
def test_the_openai_sdk_responses_stream_helper(steward: RunningSteward, question: str) -> None:
    """openai's ``responses.stream()`` finds the output item and the content part of each event by
    its output_index and content_index, which llama-server leaves out (without steward's repair:
    "TypeError: list indices must be integers or slices, not NoneType"); every event as the spec
    requires it (responses_events.py)."""
    need_spec()
    body = {"model": "gpt-4o-mini", "instructions": SYSTEM, "input": question, "max_output_tokens": MAX_TOKENS,
            "stream": True, **GREEDY}
    raw = httpx.post(f"{steward.base_url}/responses", json=body, timeout=120)
    events = [json.loads(data) for _, data in stream_events(raw.content)]
    for event in events:
        check_event(event)
    kinds = [event["type"] for event in events]
    assert kinds.count("response.created") == 1 and kinds[-1] == "response.completed", kinds
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    with openai_client(steward).responses.stream(model="gpt-4o-mini", instructions=SYSTEM, input=question,
                                                 max_output_tokens=MAX_TOKENS, temperature=0) as stream:
        deltas = "".join(event.delta for event in stream if event.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert final.status == "completed" and final.model == "smollm2" and final.output_text == deltas != ""
    assert says_paris(deltas) or question != QUESTION, deltas


@QUESTIONS
def test_the_anthropic_sdk_messages_stream_helper(steward: RunningSteward, question: str) -> None:
    body = {"model": "claude-3-5-haiku", "system": SYSTEM, "max_tokens": MAX_TOKENS, "stream": True,
            "messages": [{"role": "user", "content": question}], **GREEDY}
    raw = httpx.post(f"{steward.url}/v1/messages", json=body, timeout=120)
    events = [MESSAGES_EVENT.validate_python(json.loads(data)) for _, data in stream_events(raw.content)]
    assert events[0].type == "message_start" and events[-1].type == "message_stop"
    client = anthropic.Anthropic(base_url=steward.url, api_key="x", max_retries=0, timeout=120)
    with client.messages.stream(model="claude-3-5-haiku", system=SYSTEM, max_tokens=MAX_TOKENS, extra_body=GREEDY,
                                messages=[{"role": "user", "content": question}]) as stream:
        final = stream.get_final_message()
    text = "".join(block.text for block in final.content if block.type == "text")
    assert final.model == "smollm2" and final.usage.output_tokens > 0 and text
    assert says_paris(text) or question != QUESTION, text


def test_a_prompt_longer_than_a_slot_names_the_model_its_slot_and_its_trained_context(steward: RunningSteward) -> None:
    """The real llama-server's refusal (-c 2048, one slot), in steward's words: the model's trained
    context (8,192, read from its GGUF) is above the slot, so raising --ctx-size is advised."""
    response = httpx.post(f"{steward.base_url}/chat/completions", timeout=120, json={
        "model": "gpt-4o-mini", "max_tokens": 1, "messages": [{"role": "user", "content": "word " * 3000}]})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["n_ctx"] == 2048
    assert error["message"] == (
        f"prompt is too long: model 'smollm2' took {error['n_prompt_tokens']:,} prompt tokens; a slot of it holds "
        "2,048 (--ctx-size 2048 / parallel 1 in its config); raise --ctx-size in models.smollm2.args, or shorten "
        "the prompt")
    event = steward.wait_event("context_exceeded", request_id=response.headers["x-request-id"])
    assert event["trained"] == 8192 and event["slot_tokens"] == 2048 and event["model"] == "smollm2"
