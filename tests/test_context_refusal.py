"""A prompt too long for a slot: llama-server's 400, said by steward in each API's words.

The message names the model, its slot, the config that sizes it and the keys to change; the
type is one the API's clients know; each refusal is a ``context_exceeded`` event and a count in
/metrics. The pure part (what the message says for each way a config sizes a slot) is tested
alone; the rest through a real steward in front of the fake llama-server, which refuses as the
real one does (tests/test_real_load.py checks steward's words against the real server)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from fakes.tiny_gguf import write_tiny_model
from supervisor.apis import Api
from supervisor.config.schema import ModelConfig
from supervisor.gateway.relay.context_refusal import (
    ParallelSource,
    Refusal,
    SlotConfig,
    refusal_error,
    refusal_message,
    slot_config,
)
from tests.conftest import RunningSteward, fake_model, launch_steward

LLAMA_REFUSAL = {"error": {"code": 400, "message": "request (9512 tokens) exceeds the available context size "
                                                   "(2048 tokens), try increasing it",
                           "type": "exceed_context_size_error", "n_prompt_tokens": 9512, "n_ctx": 2048}}


def test_the_message_names_the_model_its_slot_its_config_and_the_keys_to_change() -> None:
    config = SlotConfig("chat", 8192, 4, ParallelSource.KEY)
    assert refusal_message(config, Refusal(9512, 2048)) == (
        "prompt is too long: model 'chat' took 9,512 prompt tokens; a slot of it holds 2,048 (--ctx-size 8192 / "
        "parallel 4 in its config); raise --ctx-size in models.chat.args, lower models.chat.parallel, or shorten "
        "the prompt")


def test_parallel_in_the_args_is_named_where_it_is_set() -> None:
    config = SlotConfig("coder", 8192, 2, ParallelSource.ARGS)
    assert "lower --parallel in models.coder.args," in refusal_message(config, Refusal(5000, 4096))


def test_llama_servers_default_slots_share_one_context_so_fewer_would_not_help() -> None:
    message = refusal_message(SlotConfig("chat", 8192, 4, ParallelSource.DEFAULT), Refusal(9000, 8192))
    assert "(--ctx-size 8192 in its config, shared by llama-server's 4 default slots)" in message
    assert message.endswith("; raise --ctx-size in models.chat.args, or shorten the prompt")


def test_a_slot_at_the_models_trained_context_can_only_take_a_shorter_prompt() -> None:
    config = SlotConfig("small", None, 1, ParallelSource.KEY, trained=8192)
    assert refusal_message(config, Refusal(9000, 8192)).endswith(
        "(no --ctx-size: the model's trained context / parallel 1 in its config); shorten the prompt (a slot "
        "already holds the model's trained context, 8,192)")


def test_the_slot_config_is_read_from_the_models_config_and_its_gguf(tmp_path: Path) -> None:
    gguf = write_tiny_model(tmp_path / "tiny.gguf", "llama", n_ctx_train=3072).path
    command = ["llama-server"]
    assert slot_config("a", ModelConfig(command=command, model=str(gguf), args=["-c", "4096"], parallel=2)) == \
        SlotConfig("a", 4096, 2, ParallelSource.KEY, trained=3072)
    assert slot_config("b", ModelConfig(command=command, args=["--ctx-size=2048", "-np", "3"])) == \
        SlotConfig("b", 2048, 3, ParallelSource.ARGS)
    assert slot_config("c", ModelConfig(command=command)) == SlotConfig("c", None, 4, ParallelSource.DEFAULT)
    assert slot_config("d", ModelConfig(runtime="openai", upstream=None, command=command)) is None


def test_only_llama_servers_context_refusal_is_explained() -> None:
    assert Refusal.of(400, LLAMA_REFUSAL) == Refusal(9512, 2048)
    assert Refusal.of(500, LLAMA_REFUSAL) is None
    other = {"error": {"code": 400, "message": "bad", "type": "invalid_request_error"}}
    assert Refusal.of(400, other) is None
    no_counts = {"error": {**LLAMA_REFUSAL["error"], "n_ctx": None}}
    assert Refusal.of(400, no_counts) is None


def test_the_openai_error_keeps_llama_servers_counts_beside_openais_fields() -> None:
    error = refusal_error(SlotConfig("chat", 8192, 4, ParallelSource.KEY), Refusal(9512, 2048), Api.RESPONSES)["error"]
    assert {key: error[key] for key in ("type", "param", "code", "n_prompt_tokens", "n_ctx")} == {
        "type": "invalid_request_error", "param": "input", "code": "context_length_exceeded",
        "n_prompt_tokens": 9512, "n_ctx": 2048}


# --- through steward, in front of the fake llama-server -------------------------------------------

LONG = "word " * 400  # the chat model's slot holds 512 / 2 = 256 tokens
SAID = ("prompt is too long: model 'chat' took {n} prompt tokens; a slot of it holds 256 (--ctx-size 512 / parallel 2 "
        "in its config); raise --ctx-size in models.chat.args, lower models.chat.parallel, or shorten the prompt")


@pytest.fixture(scope="module")
def steward(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSteward]:
    registry: list[RunningSteward] = []
    models = {"chat": fake_model("1GiB", parallel=2, extra=["--ctx-size", "512"], aliases=["gpt-4o"])}
    launch_steward(tmp_path_factory.mktemp("context"), models, registry, gpu={"probe": "none", "budget": "8GiB"})
    yield registry[0]
    assert registry[0].stop() == 0


@pytest.fixture(autouse=True)
def no_leaked_children() -> Iterator[None]:
    yield  # the module's steward lives across tests; conftest's per-test check would flag it


def _refusals(steward: RunningSteward) -> int:
    text = httpx.get(f"{steward.url}/metrics").text
    line = next((line for line in text.splitlines() if line.startswith('steward_context_exceeded_total{model="chat"}')),
                None)
    return 0 if line is None else int(float(line.split()[-1]))


def _openai_refused(steward: RunningSteward, path: str, body: dict) -> tuple[dict, str]:
    """The error a refused request got, and its request id (the events': steward's x-request-id)."""
    response = httpx.post(f"{steward.url}{path}", json={"model": "gpt-4o", **body}, timeout=30)
    assert response.status_code == 400, response.text
    return response.json()["error"], response.headers["x-request-id"]


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("api", "path", "body", "param"), [
    ("chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]}, "messages"),
    ("completions", "/v1/completions", {"prompt": LONG}, "prompt"),
    ("responses", "/v1/responses", {"input": LONG}, "input"),
], ids=["chat", "completions", "responses"])
def test_openais_routes_say_it_in_openais_shape(steward: RunningSteward, api: str, path: str, body: dict, param: str,
                                                stream: bool) -> None:
    error, request_id = _openai_refused(steward, path, {**body, "stream": stream})
    prompt_tokens = error["n_prompt_tokens"]
    assert prompt_tokens > 256 and error["n_ctx"] == 256
    assert error == {"message": SAID.format(n=f"{prompt_tokens:,}"), "type": "invalid_request_error", "param": param,
                     "code": "context_length_exceeded", "n_prompt_tokens": prompt_tokens, "n_ctx": 256}
    event = steward.wait_event("context_exceeded", request_id=request_id)
    assert {k: event[k] for k in ("model", "api", "class", "prompt_tokens", "slot_tokens", "ctx_size", "parallel",
                                  "trained")} == {
        "model": "chat", "api": api, "class": "interactive",
        "prompt_tokens": prompt_tokens, "slot_tokens": 256, "ctx_size": 512, "parallel": 2, "trained": None}


@pytest.mark.slow
def test_the_openai_sdk_reads_the_code_agents_compact_on(steward: RunningSteward) -> None:
    client = openai.OpenAI(base_url=steward.base_url, api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="chat", messages=[{"role": "user", "content": LONG}])
    assert caught.value.code == "context_length_exceeded" and caught.value.param == "messages"
    assert "model 'chat'" in caught.value.message and "models.chat.parallel" in caught.value.message


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_anthropics_route_says_it_in_anthropics_shape(steward: RunningSteward, stream: bool) -> None:
    client = anthropic.Anthropic(base_url=steward.url, api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(anthropic.BadRequestError) as caught:
        request = {"model": "chat", "max_tokens": 8, "messages": [{"role": "user", "content": LONG}]}
        if stream:
            with client.messages.stream(**request) as events:
                list(events)
        else:
            client.messages.create(**request)
    body = caught.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    message = body["error"]["message"]
    assert message.startswith("prompt is too long: model 'chat' took ") and "holds 256" in message
    assert message.endswith("raise --ctx-size in models.chat.args, lower models.chat.parallel, or shorten the prompt")


@pytest.mark.slow
def test_each_refusal_is_counted_and_the_usage_row_keeps_the_engines_code(steward: RunningSteward) -> None:
    before = _refusals(steward)
    _openai_refused(steward, "/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]})
    _, request_id = _openai_refused(steward, "/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]})
    steward.wait_event("context_exceeded", request_id=request_id)  # the metrics count the events as they come
    assert _refusals(steward) == before + 2
    request = steward.wait_event("request", request_id=request_id)
    assert request["status"] == 400 and request["error"] == "exceed_context_size_error"


@pytest.mark.slow
def test_a_prompt_that_fits_is_answered(steward: RunningSteward) -> None:
    response = httpx.post(f"{steward.url}/v1/chat/completions", timeout=30, json={
        "model": "chat", "max_tokens": 3, "messages": [{"role": "user", "content": "word " * 100}]})
    assert response.status_code == 200
