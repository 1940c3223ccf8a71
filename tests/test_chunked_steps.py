"""A long lower-class generation cut into steps of N tokens (supervisor/gateway/relay/chunked.py).

Three tiers: which requests are cut and what each step asks (pure); the scheduler's side in
virtual time (a step of unknown count hands its slot on, a chat that arrives waits one step at
most, exactly); and the whole path, the official openai client against a steward in front of
fake llama-servers that continue an assistant prefill as the real one does (its echo included).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import trio
import trio.testing
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from supervisor.apis import Api
from supervisor.config import ConfigError, parse_config
from supervisor.gateway.openai.api_routes import API_ROUTES
from supervisor.gateway.catalog import ModelCatalog
from supervisor.gateway.relay.chunked import Generation, cut_generation, strip_echo
from supervisor.gateway.routed import RoutedRequest
from supervisor.request_class import RequestClass
from supervisor.scheduler.types import EngineProfile
from tests.conftest import RunningSteward, fake_model, launch_steward
from tests.harness import GIB, LOAD_S, start_harness

N = 4  # scheduler.step_tokens of the steward below


def routed(payload: dict[str, Any], klass: str = "background", path: str = "/v1/chat/completions") -> RoutedRequest:
    return RoutedRequest(route=API_ROUTES[path], name="m", model="m", klass=klass, stream=bool(payload.get("stream")),
                         body=json.dumps(payload).encode(), content_type=b"application/json", payload=payload)


ASK = {"model": "m", "messages": [{"role": "user", "content": "tell me a long story"}], "max_tokens": 100}


# ---- which requests are cut, and what each step asks ---------------------------------------------


def test_a_long_lower_class_chat_on_llama_server_is_cut() -> None:
    for klass in ("background", "batch"):
        generation = cut_generation(routed(ASK, klass), 32)
        assert generation is not None and (generation.budget, generation.step_count) == (100, 4)
    unbounded = cut_generation(routed({**ASK, "max_tokens": None}), 32)
    assert unbounded is not None and (unbounded.budget, unbounded.step_count) == (None, None)
    assert cut_generation(routed({**ASK, "max_tokens": -1}), 32).budget is None  # type: ignore[union-attr]
    assert cut_generation(routed({**ASK, "max_completion_tokens": 40, "max_tokens": None}),
                          32).budget == 40  # type: ignore[union-attr]
    assert cut_generation(routed({**ASK, "response_format": {"type": "text"}}), 32) is not None


@pytest.mark.parametrize("change", [
    {"max_tokens": 32},  # not longer than one step
    {"n": 2}, {"tools": [{"type": "function", "function": {"name": "f"}}]}, {"tool_choice": "none"},
    {"response_format": {"type": "json_object"}}, {"grammar": "root ::= \"a\""}, {"json_schema": {"type": "object"}},
    {"stop": ["\n\n"]}, {"logprobs": True}, {"cache_prompt": False}, {"max_tokens": "many"},
    {"reasoning_effort": "low"}, {"chat_template_kwargs": {"enable_thinking": True}},
    {"messages": [{"role": "user", "content": "go on"}, {"role": "assistant", "content": "Once"}]},
])
def test_requests_a_cut_could_change_go_whole(change: dict[str, Any]) -> None:
    assert cut_generation(routed({**ASK, **change}), 32) is None


def test_interactive_requests_other_routes_and_step_tokens_0_are_never_cut() -> None:
    assert cut_generation(routed(ASK, "interactive"), 32) is None
    assert cut_generation(routed({**ASK, "prompt": "x"}, path="/v1/completions"), 32) is None
    assert cut_generation(routed(ASK), 0) is None
    assert API_ROUTES["/v1/chat/completions"].api is Api.CHAT


def test_each_step_asks_for_its_tokens_and_continues_the_text_so_far() -> None:
    generation = Generation({**ASK, "max_completion_tokens": 10, "stream": True}, 4, 10)
    first = json.loads(generation.next_body())
    assert first["max_tokens"] == 4 and "max_completion_tokens" not in first
    assert first["messages"] == ASK["messages"] and first["stream_options"] == {"include_usage": True}
    generation.text, generation.step_completion, generation.finish_reason = " the quick brown fox", 4, "length"
    generation.end_step()
    assert generation.goes_on()
    second = json.loads(generation.next_body())
    assert second["messages"] == [*ASK["messages"], {"role": "assistant", "content": " the quick brown fox"}]
    generation.step_completion, generation.finish_reason = 4, "length"
    generation.end_step()
    third = json.loads(generation.next_body())
    assert third["max_tokens"] == 2  # what is left of the 10
    generation.step_completion, generation.finish_reason = 2, "length"
    generation.end_step()
    assert not generation.goes_on() and generation.completion_tokens == 10 and generation.steps == 3


def test_a_step_without_usage_counts_all_it_was_allowed_so_the_budget_is_never_overrun() -> None:
    generation = Generation(dict(ASK), 4, 6)
    generation.next_body()
    generation.text, generation.finish_reason = "x", "length"
    generation.end_step()
    assert generation.completion_tokens == 4 and generation.left == 2


def test_a_step_that_stops_ends_the_generation() -> None:
    generation = Generation(dict(ASK), 4, None)
    generation.next_body()
    generation.text, generation.finish_reason, generation.step_completion = "done", "stop", 3
    generation.end_step()
    assert not generation.goes_on()


def test_the_echoed_prefill_is_taken_off_whole_or_in_pieces() -> None:
    assert strip_echo("Once upon a time", "Once upon") == (" a time", None)
    assert strip_echo("Once", "Once upon") == ("", " upon")
    assert strip_echo(" a", "Once upon") == (" a", None)  # an engine that does not echo


# ---- the scheduler's side, in virtual time ------------------------------------------------------


async def test_a_cut_generation_computes_beside_a_chat_for_one_step_at_most(
        autojump_clock: trio.testing.MockClock) -> None:
    """Steps of unknown count (a generation until it stops) each hand the slot to the next; a
    chat arriving during step 2 (on its own engine) starts at once, shares the compute with the
    rest of that step only, and the next step waits for the interactive window after it, exactly."""
    log: list[tuple[str, float]] = []
    async with trio.open_nursery() as nursery:
        harness = await start_harness(nursery, 8, EngineProfile("agent", GIB, 1), EngineProfile("chat", GIB, 1,
                                                                                                  pinned=True))
        await trio.sleep(LOAD_S)  # the pinned chat engine is up

        async def generation() -> None:
            async with harness.client.open_request() as request:
                for step in range(1, 5):
                    async with harness.client.open_grant("agent", RequestClass.BACKGROUND, request=request, step=step,
                                                         steps=None):
                        log.append((f"step {step}", trio.current_time()))
                        await trio.sleep(1.0)

        async def chat() -> None:
            await trio.sleep(LOAD_S + 1.5)  # during step 2 (the agent loaded at 2 s, step 1 at 4 s)
            async with harness.client.open_grant("chat", RequestClass.INTERACTIVE):
                log.append(("chat", trio.current_time()))
                await trio.sleep(0.5)

        async with trio.open_nursery() as clients:
            clients.start_soon(generation)
            clients.start_soon(chat)
        nursery.cancel_scope.cancel()
    start = 2 * LOAD_S  # the agent's engine loaded on its first step's demand
    chat_end = start + 1.5 + 0.5
    assert log == [("step 1", start), ("step 2", start + 1), ("chat", start + 1.5), ("step 3", chat_end + 2.0),
                   ("step 4", chat_end + 2.0 + 1)]
    completes = [c for c in harness.names("complete") if c["model"] == "agent"]
    assert [c["step"] for c in completes] == ["1/0", "2/0", "3/0", "4/0"]  # an unknown count reads 0


# ---- the whole path, against fake llama-servers ---------------------------------------------------


@pytest.fixture(scope="module")
def steward(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSteward]:
    run_dir = tmp_path_factory.mktemp("chunked")
    registry: list[RunningSteward] = []
    models = {"agent": fake_model("1GiB", parallel=1, tps=200, extra=["--ctx-size", "64"]),
              "slow": fake_model("1GiB", parallel=1, tps=20)}  # 4 tokens a step: 0.2 s
    launch_steward(run_dir, models, registry, scheduler={"step_tokens": N}, gpu={"probe": "none", "budget": "4GiB"})
    yield registry[0]
    assert registry[0].stop() == 0


@pytest.fixture(autouse=True)
def no_leaked_children() -> Iterator[None]:
    yield  # the module's steward lives across tests; it is stopped (and checked) at the end


@pytest.fixture
def client(steward: RunningSteward) -> openai.OpenAI:
    return openai.OpenAI(base_url=steward.base_url, api_key="unused", max_retries=0, timeout=30)


def fake_words(start: int, count: int) -> str:
    from fakes.llama_server.formats import token_piece

    return "".join(token_piece(i) for i in range(start, start + count))


def sse(steward: RunningSteward, body: dict[str, Any]) -> list[dict[str, Any] | str]:
    with httpx.stream("POST", f"{steward.base_url}/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        lines = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    return [line if line == "[DONE]" else json.loads(line) for line in lines]


def steps_event(steward: RunningSteward, before: int) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = steward.events("generation_steps")[before:]
        if found:
            return found[0]
        time.sleep(0.02)
    raise AssertionError("no generation_steps event")


def request_after(steward: RunningSteward, before: int) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = [r for r in steward.events("request")[before:] if r["route"] == "/v1/chat/completions"]
        if found:
            return found[0]
        time.sleep(0.02)
    raise AssertionError("no request event")


@pytest.mark.slow
def test_a_streamed_generation_is_one_stream_of_its_steps(client: openai.OpenAI, steward: RunningSteward) -> None:
    before, rows = len(steward.events("generation_steps")), len(steward.events("request"))
    stream = client.chat.completions.create(model="agent@background", messages=[{"role": "user", "content": "go"}],
                                            max_tokens=10, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)  # each parsed as the SDK's ChatCompletionChunk
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk.model_dump())
    assert len({(c.id, c.created, c.model) for c in chunks}) == 1  # the first step's, on every chunk
    roles = [c for c in chunks if c.choices and c.choices[0].delta.role]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(roles) == 1 and chunks.index(roles[0]) == 0
    assert finishes == ["length"] and chunks[-2].choices[0].finish_reason == "length"
    assert text == fake_words(0, 10)  # as one uncut generation: the prefill's echo taken off
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    # the first step's prompt: "go" in the fake's chat template (its default system prompt, the turns)
    assert (chunks[-1].usage.completion_tokens, chunks[-1].usage.prompt_tokens) == (10, 29)
    event = steps_event(steward, before)
    assert (event["steps"], event["step_tokens"], event["completion_tokens"], event["finish_reason"]) == (
        3, N, 10, "length")
    row = request_after(steward, rows)
    assert (row["status"], row["class"], row["prompt_tokens"], row["completion_tokens"]) == (200, "background", 29, 10)


@pytest.mark.slow
def test_a_stream_that_did_not_ask_for_usage_gets_none_and_the_row_still_counts(steward: RunningSteward) -> None:
    rows = len(steward.events("request"))
    events = sse(steward, {"model": "agent@batch", "stream": True, "max_tokens": 9,
                           "messages": [{"role": "user", "content": "go"}]})
    assert events[-1] == "[DONE]" and all("usage" not in e for e in events[:-1])
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1]) == fake_words(0, 9)
    row = request_after(steward, rows)
    assert (row["status"], row["completion_tokens"]) == (200, 9)


@pytest.mark.slow
def test_a_whole_answer_joins_its_steps(client: openai.OpenAI, steward: RunningSteward) -> None:
    before = len(steward.events("generation_steps"))
    reply = client.chat.completions.create(model="agent@background", messages=[{"role": "user", "content": "go"}],
                                           max_tokens=11)
    ChatCompletion.model_validate(reply.model_dump())
    assert reply.choices[0].message.content == fake_words(0, 11)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and (reply.usage.completion_tokens, reply.usage.prompt_tokens) == (11, 29)
    assert steps_event(steward, before)["steps"] == 3


@pytest.mark.slow
def test_a_step_that_stops_ends_the_request(client: openai.OpenAI, steward: RunningSteward) -> None:
    # The fake model ends its answer after 6 tokens (and an end-of-generation token, counted).
    before = len(steward.events("generation_steps"))
    messages = [{"role": "user", "content": "FAKE_STOP_AFTER_6"}]
    stream = client.chat.completions.create(model="agent@background", messages=messages, max_tokens=40, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == fake_words(0, 6)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 7
    assert steps_event(steward, before)["steps"] == 2
    whole = client.chat.completions.create(model="agent@background", messages=messages, max_tokens=40)
    assert (whole.choices[0].message.content, whole.choices[0].finish_reason) == (fake_words(0, 6), "stop")


@pytest.mark.slow
def test_until_it_stops_runs_to_the_context_s_end(client: openai.OpenAI, steward: RunningSteward) -> None:
    """No max_tokens: steps go on until the context is full, where the uncut one ends (length)."""
    before = len(steward.events("generation_steps"))
    reply = client.chat.completions.create(model="agent@background", messages=[{"role": "user", "content": "go"}])
    assert reply.choices[0].finish_reason == "length"
    text = reply.choices[0].message.content or ""
    assert text.startswith(fake_words(0, 8)) and reply.usage is not None
    assert reply.usage.completion_tokens == len(text.split())
    event = steps_event(steward, before)
    assert event["steps"] >= 3 and event["ended"] is True  # the last step's prompt no longer fit


@pytest.mark.slow
def test_an_engine_error_in_a_later_step_ends_the_stream_with_it(steward: RunningSteward) -> None:
    rows = len(steward.events("request"))
    events = sse(steward, {"model": "agent@background", "stream": True, "max_tokens": 20,
                           "messages": [{"role": "user", "content": "FAKE_ERROR_CONTINUING"}]})
    assert isinstance(events[-1], dict) and "error" in events[-1]  # no [DONE] after it, as llama-server does
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e.get("choices")) == \
        fake_words(0, N + 2)  # step 1, and step 2's two tokens before it failed
    assert not any(e.get("choices") and e["choices"][0].get("finish_reason") for e in events[:-1])
    row = request_after(steward, rows)
    assert (row["status"], row["error"]) == (500, "server_error")


@pytest.mark.slow
def test_an_engine_error_in_a_later_step_of_a_whole_answer_is_the_answer(steward: RunningSteward) -> None:
    answer = httpx.post(f"{steward.base_url}/chat/completions", timeout=30, json={
        "model": "agent@background", "max_tokens": 20, "messages": [{"role": "user", "content": "FAKE_ERROR_CONTINUING"}]})
    assert answer.status_code == 500 and answer.json()["error"]["message"] == "fake mid-stream failure"


@pytest.mark.slow
def test_a_client_leaving_mid_way_cancels_the_step_and_starts_no_other(client: openai.OpenAI,
                                                                       steward: RunningSteward) -> None:
    client.chat.completions.create(model="slow", messages=[{"role": "user", "content": "up"}], max_tokens=1)
    stats_url = steward.engine_endpoint("slow") + "/fake/stats"
    cancelled = httpx.get(stats_url).json()["cancelled"]
    time.sleep(2.5)  # past the interactive window of that chat
    before, rows = len(steward.events("generation_steps")), len(steward.events("request"))
    body = {"model": "slow@background", "stream": True, "max_tokens": 40, "messages": [{"role": "user",
                                                                                          "content": "go"}]}
    seen = ""
    with httpx.stream("POST", f"{steward.base_url}/chat/completions", json=body, timeout=30) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                seen += json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            if len(seen.split()) > N + 1:
                break  # during step 2
    event = steps_event(steward, before)
    assert 2 <= event["steps"] < 10 and event["completion_tokens"] < 40  # no step after the client left
    assert request_after(steward, rows)["status"] == 499
    deadline = time.monotonic() + 5
    while httpx.get(stats_url).json()["cancelled"] == cancelled and time.monotonic() < deadline:
        time.sleep(0.02)
    assert httpx.get(stats_url).json()["cancelled"] == cancelled + 1
    assert steward.health()["engines"]["slow"]["in_flight"] == 0


@pytest.mark.slow
def test_interactive_and_tool_requests_go_whole(client: openai.OpenAI, steward: RunningSteward) -> None:
    dispatched = len(steward.events("dispatch"))
    reply = client.chat.completions.create(model="agent", messages=[{"role": "user", "content": "go"}], max_tokens=10)
    assert reply.choices[0].message.content == fake_words(0, 10)
    reply = client.chat.completions.create(model="agent@background", messages=[{"role": "user", "content": "go"}],
                                           max_tokens=10, stop=["zzz"])
    assert reply.choices[0].message.content == fake_words(0, 10)
    assert [d["step"] for d in steward.events("dispatch")[dispatched:]] == ["1/1", "1/1"]


@pytest.mark.slow
def test_the_fake_continues_a_prefill_as_llama_server_does(steward: RunningSteward) -> None:
    """Its quirk, seen on llama-server 0.3.36: the answer echoes the prefill (the first content
    delta is the prefill and the first new token); the tokens go on where the prefill stopped."""
    endpoint = steward.engine_endpoint("agent")
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": fake_words(0, 3)}]
    whole = httpx.post(f"{endpoint}/v1/chat/completions", json={"messages": messages, "max_tokens": 2}).json()
    assert whole["choices"][0]["message"]["content"] == fake_words(0, 5)
    with httpx.stream("POST", f"{endpoint}/v1/chat/completions",
                      json={"messages": messages, "max_tokens": 2, "stream": True}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert events[1]["choices"][0]["delta"]["content"] == fake_words(0, 4)
    assert events[2]["choices"][0]["delta"]["content"] == fake_words(4, 1)


@pytest.mark.slow
def test_a_chat_is_served_between_two_steps(client: openai.OpenAI, steward: RunningSteward) -> None:
    """The engine has one slot: a chat arriving while a long generation runs on it gets the slot
    when the current step ends, not when the generation ends."""
    before = len(steward.events("generation_steps"))
    done: list[str] = []

    def agent() -> None:
        client.chat.completions.create(model="slow@background", messages=[{"role": "user", "content": "go"}],
                                       max_tokens=40)
        done.append("agent")

    thread = threading.Thread(target=agent)
    thread.start()
    steward.wait_event("dispatch", model="slow", step="2/10")
    client.chat.completions.create(model="slow", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    done.append("chat")
    thread.join()
    assert done == ["chat", "agent"]
    assert steps_event(steward, before)["steps"] == 10


def test_only_llama_server_models_are_cut_and_a_reload_changes_the_size() -> None:
    """vLLM and the other runtimes do not continue a prefill from their cache: 0, never cut."""
    models = {"chat": {"command": "llama-server", "model": "/m.gguf"},
              "vllm": {"runtime": "openai", "upstream": "127.0.0.1:9000", "memory": "1GiB"}}
    catalog = ModelCatalog.of(parse_config({"models": models, "scheduler": {"step_tokens": 64}}))
    assert catalog.step_tokens == {"chat": 64, "vllm": 0}
    held = catalog.step_tokens  # what the inference handler holds: replaced in place
    catalog.replace(parse_config({"models": models, "scheduler": {"step_tokens": 16}}))
    assert held == {"chat": 16, "vllm": 0}


# ---- the key --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "said"), [
    (-1, "scheduler.step_tokens: must be a whole number, 0 or more"),
    ("64 tokens", "scheduler.step_tokens: must be a whole number"),
])
def test_a_bad_step_tokens_is_refused_naming_the_key(value: object, said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config({"models": {"chat": {"command": "llama-server", "model": "/m.gguf"}},
                      "scheduler": {"step_tokens": value}})
    assert said in str(refused.value)


def test_step_tokens_is_off_by_default_and_0_turns_it_off() -> None:
    config = parse_config({"models": {"chat": {"command": "llama-server", "model": "/m.gguf"}}})
    assert config.scheduler.step_tokens == 0
    on = parse_config({"models": {"chat": {"command": "llama-server", "model": "/m.gguf"}},
                       "scheduler": {"step_tokens": 64}})
    assert on.scheduler.step_tokens == 64 and ModelCatalog.of(config).step_tokens == {"chat": 0}
