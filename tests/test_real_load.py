"""What breaks on real processes: steward in front of real llama-server engines (CPU,
tiny models written here), called with the official openai SDK, under faults and load."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from fakes.llama_binary import llama_server_path
from fakes.tiny_gguf import write_tiny_model
from tests.conftest import RunningSteward, StewardFactory, descendants, free_port, launch_steward

pytestmark = pytest.mark.slow  # every test here starts steward and llama-server as real processes


@pytest.fixture(scope="module")
def binary() -> str:
    return str(llama_server_path())  # fails (never skips) with the build command when missing


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("models")
    return {arch: write_tiny_model(folder / f"{arch}.gguf", arch).path for arch in ("llama", "gemma3", "bert")}


def engine(binary: str, model: Path, *args: str, **config: object) -> dict[str, object]:
    return {"command": binary, "model": str(model), "args": [*args, "--threads", "1"], **config}


def sdk(steward: RunningSteward) -> openai.OpenAI:
    return openai.OpenAI(base_url=steward.base_url, api_key="x", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def steward(binary: str, models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory,
            ) -> Iterator[RunningSteward]:
    registry: list[RunningSteward] = []
    launch_steward(tmp_path_factory.mktemp("real"), {
        "chat": engine(binary, models["llama"], "-c", "512", parallel=2, aliases=["gpt-4o"]),
        "embed": engine(binary, models["bert"], "-c", "512", "--embeddings", parallel=2),
    }, registry, gpu={"probe": "host", "budget": "2GiB"}, scheduler={"embedding_chunk": 4})
    yield registry[0]
    assert registry[0].stop() == 0


@pytest.fixture(autouse=True)
def no_leaked_children() -> Iterator[None]:
    yield  # the module's steward lives across tests; the session check still runs


def test_chat_streaming_completions_and_model_list(steward: RunningSteward) -> None:
    client = sdk(steward)
    reply = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=8)
    assert reply.object == "chat.completion" and reply.usage.completion_tokens <= 8
    chunks = list(client.chat.completions.create(model="chat", stream=True, max_tokens=8,
                                                 extra_body={"ignore_eos": True},
                                                 messages=[{"role": "user", "content": "hi"}]))
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 1
    assert chunks[-1].choices[0].finish_reason == "length"
    # On the wire, event by event as llama-server wrote them, [DONE] last. llama-server sends
    # the role chunk only when the first token is whole UTF-8 (n_decoded == 1 in
    # server-task.cpp); a random tiny model often starts mid-character, so it is not asserted.
    with httpx.stream("POST", f"{steward.base_url}/chat/completions", timeout=60, json={
            "model": "chat", "stream": True, "max_tokens": 4, "ignore_eos": True,
            "messages": [{"role": "user", "content": "hi"}]}) as r:
        events = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    parsed = [json.loads(event) for event in events[:-1]]
    assert {chunk["object"] for chunk in parsed} == {"chat.completion.chunk"}
    assert parsed[-1]["choices"][0]["finish_reason"] == "length"
    roles = [i for i, chunk in enumerate(parsed) if "role" in chunk["choices"][0]["delta"]]
    assert roles in ([], [0])
    text = client.completions.create(model="chat", prompt="once upon", max_tokens=5)
    assert text.object == "text_completion"
    assert {m.id for m in client.models.list()} == {"chat", "gpt-4o", "embed"}


def test_a_large_embeddings_request_runs_in_steps_and_matches_the_engine(steward: RunningSteward) -> None:
    texts = [f"document number {i} about things" for i in range(10)]
    through = sdk(steward).embeddings.create(model="embed", input=texts, encoding_format="float")
    direct = httpx.post(steward.engine_endpoint("embed") + "/v1/embeddings",
                        json={"input": texts, "encoding_format": "float"}, timeout=60).json()
    assert [d.index for d in through.data] == list(range(10))
    for ours, theirs in zip(through.data, direct["data"], strict=True):
        assert ours.embedding == pytest.approx(theirs["embedding"], abs=1e-5)
    assert through.usage.prompt_tokens == direct["usage"]["prompt_tokens"]
    assert [d["step"] for d in steward.events("dispatch") if d["model"] == "embed"][-3:] == ["1/3", "2/3", "3/3"]


@pytest.mark.parametrize("how", ["header", "body", "suffix"])
def test_class_given_three_ways(steward: RunningSteward, how: str) -> None:
    kwargs: dict = {"model": "chat", "messages": [{"role": "user", "content": how}], "max_tokens": 1}
    if how == "header":
        kwargs["extra_headers"] = {"X-Steward-Class": "batch"}
    elif how == "body":
        kwargs["extra_body"] = {"steward": {"class": "batch"}}
    else:
        kwargs["model"] = "chat@batch"
    before = len(steward.events("dispatch"))
    sdk(steward).chat.completions.create(**kwargs)
    assert [d["class"] for d in steward.events("dispatch")[before:]] == ["batch"]


def test_context_overflow_names_the_model_its_slot_and_the_keys_to_change(steward: RunningSteward) -> None:
    """The real llama-server's refusal (n_prompt_tokens, n_ctx), in steward's words on OpenAI's
    and Anthropic's routes, streaming or not (every route: tests/test_context_refusal.py)."""
    prompt = "word " * 600  # more than the 256-token slot context (-c 512, two slots)
    for stream in (False, True):
        response = httpx.post(f"{steward.base_url}/chat/completions", timeout=60, json={
            "model": "chat", "stream": stream, "messages": [{"role": "user", "content": prompt}]})
        direct = httpx.post(steward.engine_endpoint("chat") + "/v1/chat/completions", timeout=60, json={
            "stream": stream, "messages": [{"role": "user", "content": prompt}]})
        assert response.status_code == direct.status_code == 400
        error, theirs = response.json()["error"], direct.json()["error"]
        assert theirs["type"] == "exceed_context_size_error" and theirs["n_ctx"] == 256
        n = theirs["n_prompt_tokens"]
        assert error == {"message": f"prompt is too long: model 'chat' took {n:,} prompt tokens; a slot of it holds "
                                    "256 (--ctx-size 512 / parallel 2 in its config); raise --ctx-size in "
                                    "models.chat.args, lower models.chat.parallel, or shorten the prompt",
                         "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded",
                         "n_prompt_tokens": n, "n_ctx": 256}
        messages = httpx.post(f"{steward.base_url}/messages", timeout=60, json={
            "model": "chat", "stream": stream, "max_tokens": 8, "messages": [{"role": "user", "content": prompt}]})
        assert messages.status_code == 400
        assert messages.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                              "message": error["message"]}}


def test_hundreds_of_requests_over_fresh_connections_give_no_502(steward: RunningSteward) -> None:
    statuses: list[int] = []
    body = {"model": "chat", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    with httpx.Client(base_url=steward.base_url, timeout=60) as client:  # keep-alive to steward
        statuses += [client.post("/chat/completions", json=body).status_code for _ in range(200)]

    def worker() -> None:
        with httpx.Client(base_url=steward.base_url, timeout=60) as client:
            for _ in range(25):
                statuses.append(client.post("/chat/completions", json=body).status_code)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(statuses) == 400 and set(statuses) == {200}


# ---- faults ---------------------------------------------------------------------------

def test_kill_9_of_a_real_engine_mid_stream(start_steward: StewardFactory, binary: str,
                                            models: dict[str, Path]) -> None:
    steward = start_steward({"chat": engine(binary, models["llama"], "-c", "4096", parallel=1)},
                            gpu={"probe": "host", "budget": "2GiB"})
    client = sdk(steward)
    client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "warm"}], max_tokens=1)
    stream = client.chat.completions.create(model="chat", stream=True, max_tokens=4000,
                                            extra_body={"ignore_eos": True},
                                            messages=[{"role": "user", "content": "long"}])
    killed = False
    with pytest.raises(openai.APIError) as caught:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content and not killed:
                os.kill(steward.engine_pid("chat"), signal.SIGKILL)
                killed = True
    assert "engine 'chat' failed during the request" in str(caught.value)
    assert "SIGKILL" in steward.wait_event("crash", engine="chat")["detail"]
    again = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=2)
    assert again.choices[0].message.content is not None
    health = steward.health()["engines"]["chat"]
    assert health["status"] == "ready" and health["in_flight"] == 0 and health["failures"] == 1


def test_wrong_model_path_and_wrong_binary_give_clear_errors_and_backoff(start_steward: StewardFactory,
                                                                       binary: str, tmp_path: Path) -> None:
    steward = start_steward({
        "nofile": engine(binary, tmp_path / "missing.gguf", memory="64MiB"),
        "nobinary": {"command": str(tmp_path / "llama-server"), "memory": "64MiB"},
    }, gpu={"probe": "host", "budget": "2GiB"})
    client = sdk(steward)
    for model, words in (("nofile", "missing.gguf"), ("nobinary", "No such file or directory")):
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}])
        assert caught.value.status_code == 503 and caught.value.body["code"] == "engine_start_failed"
        assert words in caught.value.body["message"]
        assert int(caught.value.response.headers["retry-after"]) >= 1
    crashes = [e for e in steward.events("crash") if e["engine"] == "nofile"]
    assert crashes and "missing.gguf" in crashes[0]["detail"]


def test_a_port_already_taken_fails_the_start_cleanly_and_the_next_try_succeeds(
        start_steward: StewardFactory, binary: str, models: dict[str, Path]) -> None:
    port = free_port()
    steward = start_steward({"chat": engine(binary, models["llama"], "-c", "512", port=port)},
                            gpu={"probe": "host", "budget": "2GiB"})
    client = sdk(steward)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "x"}])
        assert caught.value.body["code"] == "engine_start_failed"
    time.sleep(0.5)  # past the restart backoff (0.2 s)
    reply = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "x"}], max_tokens=1)
    assert reply.choices[0].message.content is not None


def test_sigterm_during_streams_lets_them_finish_then_reaps_every_engine(start_steward: StewardFactory,
                                                                         binary: str, models: dict[str, Path]) -> None:
    steward = start_steward({"chat": engine(binary, models["llama"], "-c", "4096", parallel=2)},
                            gpu={"probe": "host", "budget": "2GiB"})
    client = sdk(steward)
    client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "warm"}], max_tokens=1)
    engine_pid = steward.engine_pid("chat")
    counts: list[int] = []
    started = threading.Barrier(3)

    def stream() -> None:
        chunks = client.chat.completions.create(model="chat", stream=True, max_tokens=1500,
                                                extra_body={"ignore_eos": True},
                                                stream_options={"include_usage": True},
                                                messages=[{"role": "user", "content": "go"}])
        first = True
        for chunk in chunks:
            if first and chunk.choices and chunk.choices[0].delta.content:
                first = False
                started.wait(30)
            if chunk.usage is not None:
                counts.append(chunk.usage.completion_tokens)  # the last chunk: the whole answer

    threads = [threading.Thread(target=stream) for _ in range(2)]
    for thread in threads:
        thread.start()
    started.wait(30)
    steward.process.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(60)
    assert counts == [1500, 1500]  # every token generated and delivered, nothing cut
    assert steward.process.wait(30) == 0
    assert engine_pid not in [pid for pid, _ in descendants()]


def test_sigkill_of_steward_leaves_no_llama_server(start_steward: StewardFactory, binary: str,
                                                   models: dict[str, Path]) -> None:
    steward = start_steward({"a": engine(binary, models["llama"], "-c", "512"),
                             "b": engine(binary, models["gemma3"], "-c", "512", pinned=True)},
                            gpu={"probe": "host", "budget": "2GiB"})
    sdk(steward).chat.completions.create(model="a", messages=[{"role": "user", "content": "x"}], max_tokens=1)
    steward.wait_event("ready", engine="b")
    pids = {steward.engine_pid("a"), steward.engine_pid("b")}
    steward.process.kill()
    steward.process.wait()
    deadline = time.monotonic() + 5
    while pids & {pid for pid, _ in descendants()} and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pids & {pid for pid, _ in descendants()}


# ---- memory on a CPU-only host ---------------------------------------------------------

def test_a_budget_for_two_of_three_models_evicts_and_reloads_correctly(start_steward: StewardFactory,
                                                                       binary: str, tmp_path: Path) -> None:
    paths = {name: write_tiny_model(tmp_path / f"{name}.gguf", "llama", seed=i).path
             for i, name in enumerate(("a", "b", "c"))}
    state = tmp_path / "state.json"
    config = {"gpu": {"probe": "host", "budget": "1GiB", "poll_interval": "0.2s"}, "state_file": str(state)}
    models = {name: engine(binary, path, "-c", "512") for name, path in paths.items()}
    # First run: every model's RSS is measured and kept.
    first = start_steward(models, **config)
    for name in paths:
        sdk(first).chat.completions.create(model=name, messages=[{"role": "user", "content": "x"}], max_tokens=1)
        first.wait_event("measured", engine=name)
    measured = {e["engine"]: e["measured"] for e in first.events("measured")}
    assert first.stop() == 0
    # Second run: a budget that holds two of the three measured engines, not three.
    two = sorted(measured.values())[-2:]
    budget = sum(two) + min(measured.values()) // 2
    steward = start_steward(models, **{**config, "gpu": {**config["gpu"], "budget": budget}})
    assert {e["engine"]: e["source"] for e in steward.events("memory_plan")} == dict.fromkeys(paths, "measured")
    client = sdk(steward)
    for name in ["a", "b", "c", "a", "b", "c", "a"]:
        reply = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "x"}], max_tokens=1)
        assert reply.choices[0].message.content is not None
    loads = steward.events("load")
    evictions = steward.events("evict")
    assert [e["engine"] for e in loads] == ["a", "b", "c", "a", "b", "c", "a"]  # two fit, so every switch loads
    assert all(e["reserved"] <= budget for e in loads)  # never more than the budget reserved
    assert [e["engine"] for e in evictions] == ["a", "b", "c", "a", "b"]  # least recently used each time
    health = steward.health()
    assert health["reserved"] <= budget and sum(e["reserved"] for e in health["engines"].values()) == health["reserved"]
