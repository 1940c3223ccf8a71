"""Every answer through steward as OpenAI's OpenAPI spec requires it, and Anthropic's as the
``anthropic`` SDK's types do: one steward in front of the fake llama-server, vLLM, Ollama and
ComfyUI (real processes), asked on each route, streamed and not, and refused or failed in each
way steward knows; each answer, each stream event and each error is checked (spec_check.py).

What is checked is what the spec requires (its required keys, types and enums: what clients'
SDKs read), on the raw bytes a client gets, not on what an SDK made of them. The official
clients' stream helpers (``responses.stream()``, ``messages.stream()``) run too: they are what
breaks on a stream that lacks what the spec requires.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import anthropic
import anthropic.types
import attrs
import httpx
import openai
import pydantic
import pytest

from fakes import simgpu
from supervisor.auth.keys import add_key
from supervisor.units import parse_size
from tests.conftest import RunningSteward, fake_model, free_port, launch_steward
from tests.fake_processes import FakeLauncher, FakeProcess
from tests.spec_check import COMPLETION_CHUNK, check, check_event, need_spec, stream_events
from tests.test_image_generations import image_model
from tests.test_ollama_listener import CHAT as OLLAMA_MODELS
from tests.test_ollama_listener import EMBED as OLLAMA_EMBED_MODEL
from tests.test_ollama_listener import ollama_section

pytestmark = pytest.mark.slow
OLLAMA_CHAT, OLLAMA_EMBED = OLLAMA_MODELS.partition(",")[0], OLLAMA_EMBED_MODEL.partition(",")[0]
MESSAGE = anthropic.types.Message
MESSAGES_EVENT = pydantic.TypeAdapter(anthropic.types.RawMessageStreamEvent)
ANTHROPIC_ERROR = anthropic.types.ErrorResponse


@attrs.frozen
class Door:
    """The steward under test, its listeners and keys."""

    steward: RunningSteward
    ollama: str  # the Ollama listener's URL: Ollama's /v1 routes
    key: str
    limited: str  # a key of one request a minute

    def url(self, engine: str) -> str:
        return f"{self.ollama}/v1" if engine == "ollama" else self.steward.base_url

    def post(self, engine: str, path: str, *, key: str | None = "", **kwargs: Any) -> httpx.Response:
        key = self.key if key == "" else key
        headers = {"authorization": f"Bearer {key}"} if key is not None else {}
        return httpx.post(self.url(engine) + path, headers=headers, timeout=30, **kwargs)


# Each engine's name for its generating model on steward's OpenAI listener (Ollama: its own listener).
CHAT_MODEL = {"llama": "chat", "vllm": "vllm", "ollama": OLLAMA_CHAT}


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    need_spec()
    run_dir = tmp_path_factory.mktemp("spec")
    gpu = simgpu.create_device(run_dir / "gpu", total_bytes=parse_size("64GiB"), linger_s=0.1)
    launcher = FakeLauncher(run_dir)
    registry: list[RunningSteward] = []
    try:
        comfy = launcher.launch(FakeProcess, "fakes.comfyui", ["--sim-gpu", str(gpu), "--model-memory", "4GiB",
                                                               "--free-delay", "0.1s", "--job-time", "0.1s"],
                                ready_path="/system_stats")
        models = {
            "chat": fake_model("1GiB", gpu_dir=gpu, extra=["-c", "1024", "--mmproj", "/models/mmproj.gguf",
                                                           "--max-tokens-default", "6"]),
            "embed": fake_model("0.5GiB", gpu_dir=gpu, extra=["--embeddings"]),
            "vllm": {"runtime": "openai", "memory": "2GiB", "parallel": 4, "command": [
                sys.executable, "-m", "fakes.openai_server", "--port", "${PORT}", "--served-model-name", "vllm",
                "--memory", "2GiB", "--sim-gpu", str(gpu)]},
            "broken": {"command": str(run_dir / "no-such-llama-server"), "memory": "1GiB"},  # a 503
            "sketch": image_model(run_dir),
        }
        keys_file = run_dir / "keys.json"
        known = [*models, "comfyui"]
        key = add_key(keys_file, "agent", known_models=known, ollama=True)
        limited = add_key(keys_file, "limited", known_models=known, ollama=True, rpm=1)
        steward = launch_steward(run_dir, models, registry, auth={"keys_file": str(keys_file)},
                                 ollama=ollama_section(free_port()),
                                 comfyui={"upstream": f"127.0.0.1:{comfy.port}", "listen": None,
                                          "history_poll": "0.1s", "free_timeout": "5s"},
                                 gpu={"probe": "simulated", "simulated_dir": str(gpu), "poll_interval": "0.1s"})
        yield Door(steward, steward.wait_event("listening")["ollama"][0], key, limited)
        assert steward.stop() == 0
    finally:
        for steward in registry:
            steward.stop()
        launcher.stop_all()


@pytest.fixture(autouse=True)
def no_leaked_children() -> Iterator[None]:
    yield  # the module's steward and fakes live across tests


def events_of(answer: httpx.Response) -> list[tuple[str | None, Any]]:
    """An SSE answer's events as (name, parsed data); ``[DONE]`` left out."""
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/event-stream"), answer.headers
    return [(name, json.loads(data)) for name, data in stream_events(answer.content) if data != b"[DONE]"]


def check_stream(answer: httpx.Response, schema: str) -> list[Any]:
    """Each chunk of an OpenAI stream as *schema* (an error event, as ``ErrorResponse``)."""
    chunks = [data for _, data in events_of(answer)]
    assert chunks
    for chunk in chunks:
        check(chunk, "ErrorResponse" if "error" in chunk else schema)
    return chunks


def check_responses_stream(answer: httpx.Response) -> list[dict[str, Any]]:
    """A Responses stream: each event as its schema, named as its type, numbered from 0, opened once."""
    events = events_of(answer)
    for name, event in events:
        check_event(event)
        assert name == event["type"], (name, event)
    kinds = [event["type"] for _, event in events]
    assert [event["sequence_number"] for _, event in events] == list(range(len(events))), kinds
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    assert kinds.count("response.created") == kinds.count("response.in_progress") == 1, kinds
    assert len({event["response"]["id"] for _, event in events if "response" in event}) == 1
    return [event for _, event in events]


def check_error(answer: httpx.Response, status: int, *, anthropic_shape: bool = False) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    body = answer.json()
    if anthropic_shape:
        ANTHROPIC_ERROR.model_validate(body)
    else:
        check(body, "ErrorResponse")
    return body  # type: ignore[no-any-return]


def chat_body(model: str, stream: bool, text: str = "hi") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 4, "stream": stream}


STREAMED = pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
ENGINES = pytest.mark.parametrize("engine", ["llama", "vllm", "ollama"])


@ENGINES
@STREAMED
def test_chat_completions(door: Door, engine: str, stream: bool) -> None:
    answer = door.post(engine, "/chat/completions", json=chat_body(CHAT_MODEL[engine], stream))
    if stream:
        check_stream(answer, "CreateChatCompletionStreamResponse")
    else:
        assert answer.status_code == 200, answer.text
        check(answer.json(), "CreateChatCompletionResponse")


@ENGINES
@STREAMED
def test_completions(door: Door, engine: str, stream: bool) -> None:
    body = {"model": CHAT_MODEL[engine], "prompt": "Once upon", "max_tokens": 4, "stream": stream}
    answer = door.post(engine, "/completions", json=body)
    if stream:
        check_stream(answer, COMPLETION_CHUNK)
    else:
        assert answer.status_code == 200, answer.text
        check(answer.json(), "CreateCompletionResponse")


@pytest.mark.parametrize("engine", ["llama", "ollama"])
def test_embeddings(door: Door, engine: str) -> None:
    model = "embed" if engine == "llama" else OLLAMA_EMBED
    answer = door.post(engine, "/embeddings", json={"model": model, "input": ["one", "two"]})
    assert answer.status_code == 200, answer.text
    check(answer.json(), "CreateEmbeddingResponse")


@pytest.mark.parametrize("engine", ["llama", "ollama"])
@STREAMED
def test_responses(door: Door, engine: str, stream: bool) -> None:
    tool = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
    settings = {"instructions": "be brief", "max_output_tokens": 4, "temperature": 0.25, "top_p": 0.5,
                "tools": [tool], "tool_choice": "none", "metadata": {"run": "7"}}
    answer = door.post(engine, "/responses", json={"model": CHAT_MODEL[engine], "input": "hi", "stream": stream,
                                                   **settings})
    if stream:
        events = check_responses_stream(answer)
        assert events[-1]["type"] == "response.completed"
        responses = [event["response"] for event in events if "response" in event]
    else:
        assert answer.status_code == 200, answer.text
        check(answer.json(), "Response")
        responses = [answer.json()]
    # The settings it was made with, as OpenAI's own answers repeat them: llama-server leaves every
    # one out; Ollama says its own tool_choice, metadata and tools (kept: the engine's word).
    repeated = ({**settings, "tools": [{**tool, "strict": None}]} if engine == "llama"
                else {key: settings[key] for key in ("temperature", "top_p")})
    for response in responses:
        assert {key: response[key] for key in repeated} == repeated, response


@pytest.mark.parametrize("hook", ["FAKE_SPLIT_UTF8", "FAKE_ERROR_MIDSTREAM"])
def test_responses_streams_llama_server_leaves_broken(door: Door, hook: str) -> None:
    """Half a character first: llama-server announces the response again with every token;
    an error mid-answer: steward's error event and response.failed, numbered on."""
    events = check_responses_stream(door.post("llama", "/responses", json={
        "model": "chat", "input": hook, "max_output_tokens": 4, "stream": True}))
    last = ["response.completed"] if hook == "FAKE_SPLIT_UTF8" else ["error", "response.failed"]
    assert [event["type"] for event in events[-len(last):]] == last


@pytest.mark.parametrize("engine", ["llama", "ollama"])
def test_the_openai_sdk_responses_stream_helper(door: Door, engine: str) -> None:
    client = openai.OpenAI(base_url=door.url(engine), api_key=door.key, max_retries=0, timeout=30)
    with client.responses.stream(model=CHAT_MODEL[engine], input="hi", max_output_tokens=4) as stream:
        deltas = "".join(event.delta for event in stream if event.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text == deltas != ""


@ENGINES
@STREAMED
def test_messages(door: Door, engine: str, stream: bool) -> None:
    url = door.ollama if engine == "ollama" else door.steward.url
    body = {"model": CHAT_MODEL[engine], "max_tokens": 4, "stream": stream,
            "messages": [{"role": "user", "content": "hi"}]}
    answer = httpx.post(f"{url}/v1/messages", json=body, headers={"x-api-key": door.key}, timeout=30)
    if not stream:
        assert answer.status_code == 200, answer.text
        MESSAGE.model_validate(answer.json())
        return
    events = events_of(answer)
    for name, event in events:
        MESSAGES_EVENT.validate_python(event)
        assert name == event["type"]
    assert events[0][1]["type"] == "message_start" and events[-1][1]["type"] == "message_stop"
    client = anthropic.Anthropic(base_url=url, api_key=door.key, max_retries=0, timeout=30)
    with client.messages.stream(model=CHAT_MODEL[engine], max_tokens=4,
                                messages=[{"role": "user", "content": "hi"}]) as helper:
        final = helper.get_final_message()
    assert final.content and final.usage.output_tokens > 0


@pytest.mark.parametrize("response_format", ["b64_json", "url"])
def test_images(door: Door, response_format: str) -> None:
    answer = door.post("llama", "/images/generations", json={
        "model": "sketch", "prompt": "a lighthouse", "size": "32x32", "response_format": response_format})
    assert answer.status_code == 200, answer.text
    check(answer.json(), "ImagesResponse")


def test_transcriptions(door: Door) -> None:
    answer = door.post("llama", "/audio/transcriptions", data={"model": "chat"},
                       files={"file": ("talk.wav", b"RIFF" + bytes(256), "audio/wav")})
    assert answer.status_code == 200, answer.text
    check(answer.json(), "CreateTranscriptionResponseJson")


def test_steward_s_own_errors(door: Door) -> None:
    chat = chat_body("chat", False)
    check_error(door.post("llama", "/chat/completions", content=b"{not json"), 400)
    check_error(door.post("llama", "/responses", json={"input": "hi"}), 400)  # no model
    check_error(door.post("llama", "/chat/completions", json=chat, key=None), 401)
    check_error(door.post("llama", "/chat/completions", json=chat, key="sk-steward-unknown"), 401)
    check_error(door.post("llama", "/embeddings", json={"model": "nope", "input": "x"}), 404)
    check_error(door.post("llama", "/no/such/route", json=chat), 404)
    check_error(door.post("llama", "/chat/completions", json=chat_body("broken", True)), 503)
    check_error(door.post("ollama", "/chat/completions", content=b"[", key=None), 401)
    assert door.post("llama", "/chat/completions", json=chat, key=door.limited).status_code == 200
    check_error(door.post("llama", "/chat/completions", json=chat, key=door.limited), 429)
    check_error(door.post("llama", "/images/generations", json={"model": "sketch"}), 400)  # no prompt
    for status, kwargs in [(400, {"content": b"{not json"}), (401, {"key": None}),
                           (404, {"json": {"model": "nope", "max_tokens": 1, "messages": []}})]:
        check_error(door.post("llama", "/messages", **kwargs), status, anthropic_shape=True)


def test_engines_own_errors(door: Door) -> None:
    long = " ".join(["word"] * 1200)  # past a slot of the fake llama-server's -c 1024
    check_error(door.post("llama", "/chat/completions", json=chat_body("chat", True, long)), 400)
    check_error(door.post("llama", "/responses", json={"model": "chat", "input": long}), 400)
    check_error(door.post("llama", "/completions", json={"model": "embed", "prompt": "x"}), 400)
    check_error(door.post("vllm", "/chat/completions", json={**chat_body("vllm", False), "max_tokens": -1}), 400)
    check_error(door.post("vllm", "/completions", json={"model": "vllm"}), 400)  # no prompt
    check_error(door.post("ollama", "/chat/completions", json=chat_body("not-pulled:1b", False)), 404)
    check_error(door.post("ollama", "/responses", json={"model": OLLAMA_CHAT, "input": 5}), 400)
    check_error(door.post("llama", "/messages", json={"model": "chat", "max_tokens": 1, "messages": [
        {"role": "user", "content": long}]}), 400, anthropic_shape=True)


def test_an_engine_s_error_mid_stream(door: Door) -> None:
    chunks = check_stream(door.post("llama", "/chat/completions", json=chat_body("chat", True,
                                                                                  "FAKE_ERROR_MIDSTREAM")),
                          "CreateChatCompletionStreamResponse")
    assert "error" in chunks[-1]

