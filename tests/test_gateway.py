"""The gateway as a client sees it: the official openai SDK against a real steward
process in front of fake llama-servers (real processes, real sockets, real time)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import RunningSteward, fake_model, launch_steward


@pytest.fixture(scope="module")
def steward(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSteward]:
    run_dir = tmp_path_factory.mktemp("api")
    registry: list[RunningSteward] = []
    models = {
        "chat": fake_model("2GiB", parallel=2, tps=25, aliases=["gpt-4o"],
                           extra=["--ctx-size", "512", "--max-tokens-default", "8"]),
        "embed": fake_model("0.5GiB", parallel=2, extra=["--embeddings"], pinned=True),
    }
    launch_steward(run_dir, models, registry, limits={"max_body_size": "64KiB"},
                   classes={"interactive": {"queue_timeout": "20s"}}, scheduler={"embedding_chunk": 4},
                   gpu={"probe": "none", "budget": "8GiB"})
    yield registry[0]
    assert registry[0].stop() == 0


@pytest.fixture(autouse=True)
def no_leaked_children() -> Iterator[None]:
    # The module's steward lives across tests; conftest's per-test check would flag it.
    yield


@pytest.fixture
def client(steward: RunningSteward) -> openai.OpenAI:
    return openai.OpenAI(base_url=steward.base_url, api_key="unused", max_retries=0, timeout=30)


@pytest.mark.slow
def test_chat_completion(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hello there"}],
                                           max_tokens=5)
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant"
    assert len(reply.choices[0].message.content.split()) == 5
    assert reply.usage.completion_tokens == 5


@pytest.mark.slow
def test_streaming_chunks_arrive_while_the_engine_is_still_generating(client: openai.OpenAI,
                                                                        steward: RunningSteward) -> None:
    stats_url = steward.engine_endpoint("chat") + "/fake/stats"
    stream = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "tell me"}],
                                            max_tokens=25, stream=True)  # 25 tokens at 25/s: about 1 s
    pieces = []
    still_generating_at_first_chunk = None
    for chunk in stream:
        content = chunk.choices[0].delta.content if chunk.choices else None
        if content and still_generating_at_first_chunk is None:
            still_generating_at_first_chunk = httpx.get(stats_url).json()["active"] >= 1
        if content:
            pieces.append(content)
    assert still_generating_at_first_chunk is True
    assert len(pieces) == 25


@pytest.mark.slow
def test_a_stream_without_a_role_chunk_passes_through_as_it_is(client: openai.OpenAI,
                                                                steward: RunningSteward) -> None:
    """llama-server skips the role chunk when its first token is half a character (found on the
    real server in CI); steward neither invents one nor chokes on its absence."""
    body = {"model": "chat", "stream": True, "max_tokens": 3,
            "messages": [{"role": "user", "content": "FAKE_SPLIT_UTF8"}]}
    with httpx.stream("POST", f"{steward.base_url}/chat/completions", json=body, timeout=30) as r:
        events = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert [json.loads(e)["choices"][0]["delta"] for e in events[:-1]] == [
        {"content": "é"}, {"content": " brown"}, {}]
    stream = client.chat.completions.create(**body)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "é brown"


@pytest.mark.slow
def test_embeddings(client: openai.OpenAI) -> None:
    result = client.embeddings.create(model="embed", input=["first text", "second text", "third"])
    assert [d.index for d in result.data] == [0, 1, 2]
    assert len({tuple(d.embedding) for d in result.data}) == 3
    assert result.usage.prompt_tokens > 0


@pytest.mark.slow
def test_a_long_embeddings_input_runs_in_steps_and_comes_back_whole(client: openai.OpenAI,
                                                                     steward: RunningSteward) -> None:
    texts = [f"text number {i}" for i in range(10)]  # three steps of at most 4
    before = len(steward.events("dispatch"))
    through_steward = client.embeddings.create(model="embed", input=texts, encoding_format="float")
    direct = httpx.post(steward.engine_endpoint("embed") + "/v1/embeddings",
                        json={"model": "embed", "input": texts}).json()
    assert [d.index for d in through_steward.data] == list(range(10))
    assert [d.embedding for d in through_steward.data] == [d["embedding"] for d in direct["data"]]
    assert through_steward.usage.prompt_tokens == direct["usage"]["prompt_tokens"]
    steps = [d["step"] for d in steward.events("dispatch")[before:]]
    assert steps == ["1/3", "2/3", "3/3"]
    # The SDK's default asks for base64: the steps' strings are passed through and decode the same.
    as_base64 = client.embeddings.create(model="embed", input=texts)
    for ours, theirs in zip(as_base64.data, direct["data"], strict=True):
        assert ours.embedding == pytest.approx(theirs["embedding"], rel=1e-6)


@pytest.mark.slow
def test_model_list_has_models_and_aliases(client: openai.OpenAI) -> None:
    ids = {m.id for m in client.models.list()}
    assert ids == {"chat", "gpt-4o", "embed"}
    assert client.models.retrieve("gpt-4o").id == "gpt-4o"


@pytest.mark.slow
def test_alias_reaches_its_model(client: openai.OpenAI, steward: RunningSteward) -> None:
    reply = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=2)
    assert reply.choices[0].finish_reason == "length"
    assert steward.health()["engines"]["chat"]["status"] == "ready"


@pytest.mark.slow
def test_unknown_model_is_404_in_openai_shape(client: openai.OpenAI, steward: RunningSteward) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    error = caught.value.body
    assert error["code"] == "model_not_found" and error["param"] == "model"
    raw = httpx.post(f"{steward.base_url}/chat/completions", json={"model": "nope", "messages": []}).json()
    assert set(raw["error"]) == {"message", "type", "param", "code"}


@pytest.mark.slow
@pytest.mark.parametrize(("body", "param"), [
    (b"{not json", None),
    (b'{"messages": []}', "model"),
    (b"[1, 2]", None),
])
def test_malformed_requests_are_400_in_openai_shape(steward: RunningSteward, body: bytes, param: str | None) -> None:
    response = httpx.post(f"{steward.base_url}/chat/completions", content=body,
                          headers={"content-type": "application/json"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert set(error) == {"message", "type", "param", "code"}


@pytest.mark.slow
def test_body_over_the_limit_is_413(steward: RunningSteward, client: openai.OpenAI) -> None:
    big = "word " * 20_000  # ~100 KB, over the 64 KiB limit
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="chat", messages=[{"role": "user", "content": big}])
    assert caught.value.status_code == 413
    assert caught.value.body["code"] == "request_too_large"


@pytest.mark.slow
def test_unknown_route_and_wrong_method_are_openai_errors(steward: RunningSteward) -> None:
    response = httpx.get(f"{steward.base_url}/nothing-here")
    assert response.status_code == 404 and set(response.json()["error"]) == {"message", "type", "param", "code"}
    response = httpx.get(f"{steward.base_url}/chat/completions")
    assert response.status_code == 405 and response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.slow
def test_context_overflow_keeps_the_engines_counts_in_steward_words(client: openai.OpenAI) -> None:
    long_prompt = "token " * 400  # the fake's slot context is 512 / 2 = 256 tokens
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            result = client.chat.completions.create(model="chat", stream=stream,
                                                    messages=[{"role": "user", "content": long_prompt}])
            if stream:
                list(result)
        error = caught.value.body  # the message, on each API: tests/test_context_refusal.py
        assert error["type"] == "invalid_request_error" and error["code"] == "context_length_exceeded"
        assert error["n_ctx"] == 256 and error["n_prompt_tokens"] > 256


@pytest.mark.slow
@pytest.mark.parametrize("how", ["header", "body", "suffix"])
def test_class_given_three_ways(client: openai.OpenAI, steward: RunningSteward, how: str) -> None:
    marker = f"class test {how}"
    kwargs: dict = {"model": "chat", "messages": [{"role": "user", "content": marker}], "max_tokens": 1}
    if how == "header":
        kwargs["extra_headers"] = {"X-Steward-Class": "background"}
    elif how == "body":
        kwargs["extra_body"] = {"steward": {"class": "batch"}}
    else:
        kwargs["model"] = "chat@background"
    before = len(steward.events("dispatch"))
    client.chat.completions.create(**kwargs)
    dispatched = steward.events("dispatch")[before:]
    assert [d["class"] for d in dispatched] == ["batch" if how == "body" else "background"]


@pytest.mark.slow
def test_unknown_class_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="chat@urgent", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.body["code"] == "invalid_class"


@pytest.mark.slow
def test_requests_without_a_class_are_interactive(client: openai.OpenAI, steward: RunningSteward) -> None:
    before = len(steward.events("dispatch"))
    client.completions.create(model="chat", prompt="once upon", max_tokens=2)
    assert [d["class"] for d in steward.events("dispatch")[before:]] == ["interactive"]


@pytest.mark.slow
def test_more_concurrent_requests_than_slots_wait_in_steward(client: openai.OpenAI,
                                                            steward: RunningSteward) -> None:
    stats_url = steward.engine_endpoint("chat") + "/fake/stats"
    results: list[str] = []
    peak_deferred = 0

    def one() -> None:
        reply = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "x"}],
                                               max_tokens=10)
        results.append(reply.choices[0].finish_reason)

    threads = [threading.Thread(target=one) for _ in range(6)]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        stats = httpx.get(stats_url).json()
        peak_deferred = max(peak_deferred, stats["deferred"])
        assert stats["active"] <= 2  # the engine's two slots, never more
        time.sleep(0.02)
    assert results == ["length"] * 6
    assert peak_deferred == 0  # everything beyond the slots waited in steward, not in the engine


@pytest.mark.slow
def test_client_disconnect_mid_stream_cancels_the_upstream_request(steward: RunningSteward) -> None:
    stats_url = steward.engine_endpoint("chat") + "/fake/stats"
    cancelled_before = httpx.get(stats_url).json()["cancelled"]
    body = {"model": "chat", "stream": True, "max_tokens": 200, "messages": [{"role": "user", "content": "go"}]}
    with httpx.stream("POST", f"{steward.base_url}/chat/completions", json=body) as response:
        for line in response.iter_lines():
            if '"content":" ' in line.replace(": ", ":"):
                break  # leave after the first token
    deadline = time.monotonic() + 5
    while httpx.get(stats_url).json()["cancelled"] == cancelled_before and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = httpx.get(stats_url).json()
    assert stats["cancelled"] == cancelled_before + 1
    assert steward.health()["engines"]["chat"]["in_flight"] == 0


@pytest.mark.slow
def test_event_log_records_are_json_with_the_common_fields(steward: RunningSteward) -> None:
    records = steward.events()
    assert records, "the event log is empty"
    for record in records:
        assert {"ts", "mono", "event", "level"} <= set(record)
    names = {r["event"] for r in records}
    assert {"probe", "listening", "load", "spawn", "ready", "enqueue", "dispatch", "complete"} <= names


def test_metadata_fields_are_stripped_before_forwarding() -> None:
    from supervisor.gateway.routed import route_request

    scope = {"headers": [(b"x-steward-class", b"batch")]}
    routed = route_request(scope, json.dumps({"model": "gpt-4o@background", "steward": {"class": "batch"},
                                              "messages": []}).encode(), {"gpt-4o": "chat"})
    assert routed.model == "chat" and routed.klass == "background"  # the suffix is the most specific
    assert json.loads(routed.body) == {"model": "gpt-4o", "messages": []}
    untouched = json.dumps({"model": "chat", "messages": []}).encode()
    assert route_request({"headers": []}, untouched, {"chat": "chat"}).body is untouched


@pytest.mark.slow
def test_module_steward_wrote_its_log(steward: RunningSteward) -> None:
    assert Path(steward.events_path).stat().st_size > 0


@pytest.mark.slow
def test_prometheus_metrics_follow_the_events_and_the_scheduler(steward: RunningSteward, client: openai.OpenAI) -> None:
    client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "m"}], max_tokens=1)
    text = httpx.get(f"{steward.url}/metrics").text
    assert 'gpu_turnstile_state{state="idle"} 1.0' in text
    assert 'steward_engine_ready{engine="chat"} 1.0' in text
    assert 'steward_queued{class="interactive"} 0.0' in text
    waits = [line for line in text.splitlines() if line.startswith('steward_wait_seconds_count{class="interactive"}')]
    assert waits and float(waits[0].split()[-1]) >= 1
    assert 'steward_loads_total{engine="chat"} 1.0' in text
