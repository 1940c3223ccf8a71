"""Steward in front of a real vLLM it attaches to (runtime openai, upstream), and the facts
of vLLM's protocol steward relies on, asked of vLLM directly.

One vLLM server serves the module (it takes about a minute to start); one steward,
attached to it, serves the module too. vLLM runs with --max-num-seqs 4: left to itself it
would run 4 of 6 requests at once and queue 2 inside; behind steward with `parallel: 2` it
never sees more than 2, and the rest wait in steward's queue, in class order.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import attrs
import httpx
import openai
import pytest

from adapters.openai import read_vllm_load
from fakes.tiny_hf import write_tiny_model
from supervisor.engines.process_tree import read_parents, rss_bytes, tree_of
from tests.conftest import MODULE_SCOPED, ROOT, RunningSteward, launch_steward
from tests.vllm_server import require_vllm_python, running_vllm

pytestmark = pytest.mark.slow

NAME = "tiny"  # steward's model name is vLLM's --served-model-name: the body goes through unchanged


@attrs.frozen
class Server:
    process: subprocess.Popen[bytes]
    base_url: str

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="x", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    require_vllm_python()
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with running_vllm(write_tiny_model(), NAME, log=log) as (process, base_url):
        yield Server(process, base_url)


@pytest.fixture(scope="module")
def steward(vllm: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSteward]:
    started: list[RunningSteward] = []
    upstream = vllm.base_url.removeprefix("http://")
    running = launch_steward(tmp_path_factory.mktemp("steward"), {
        NAME: {"runtime": "openai", "upstream": upstream, "memory": "3GiB", "parallel": 2}},
        started, gpu={"probe": "none", "budget": "16GiB"})
    MODULE_SCOPED.add(running.process.pid)
    try:
        running.wait_event("ready", engine=NAME, timeout=30)  # attached: always on, loaded at start
        yield running
    finally:
        running.stop()
        MODULE_SCOPED.discard(running.process.pid)


# vLLM's own sampling parameter: a reply is exactly max_tokens long. Greedy decoding of the
# random tiny model may otherwise meet its end token when the batch (and so the CPU
# kernels' rounding) differs, as it did once on a busy machine after 59 of 200 tokens.
EXACT = {"ignore_eos": True}


def chat(max_tokens: int, **extra: object) -> dict[str, object]:
    return {"model": NAME, "messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens, **EXACT,
            **extra}


def test_the_attached_server_is_listed_always_on_and_ready(steward: RunningSteward) -> None:
    models = httpx.get(f"{steward.base_url}/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [NAME]
    engine = steward.health()["engines"][NAME]
    assert engine["status"] == "ready" and engine["pinned"] is True and engine["slots"] == 2


def test_vllm_never_sees_more_than_parallel_and_the_rest_wait_in_class_order(
        steward: RunningSteward, vllm: Server) -> None:
    # vLLM asleep holds the requests it gets (its /health stays 200): the first two stay
    # inside it while four more arrive, so the order they leave steward in is the queue's.
    assert httpx.post(f"{vllm.base_url}/sleep", params={"level": 1}, timeout=60).status_code == 200
    inside: list[int] = []  # requests inside vLLM (running + waiting), as it reports them
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.01):  # paced: on a refused connection too, it must not spin
            try:
                load = read_vllm_load(httpx.get(f"{vllm.base_url}/metrics", timeout=10).text)
            except httpx.HTTPError:
                continue
            if load is not None:
                inside.append((load.running or 0) + (load.waiting or 0))

    statuses: list[int] = []

    def ask(model: str) -> None:
        # Long enough to be seen: vLLM updates its gauges as its engine steps, not while asleep.
        body = {**chat(400), "model": model}
        statuses.append(httpx.post(f"{steward.base_url}/chat/completions", json=body, timeout=300).status_code)

    def wait_for(event: str, count: int) -> None:
        deadline = time.monotonic() + 120
        while len(steward.events(event)) < count:
            assert time.monotonic() < deadline, f"fewer than {count} {event!r} events"
            time.sleep(0.01)

    dispatched, queued = len(steward.events("dispatch")), len(steward.events("enqueue"))
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    threads = []
    try:
        for i, model in enumerate([f"{NAME}@batch"] * 4 + [NAME] * 2):  # the interactive ones arrive last
            threads.append(threading.Thread(target=ask, args=(model,), daemon=True))
            threads[-1].start()
            wait_for("enqueue", queued + i + 1)
        wait_for("dispatch", dispatched + 2)
        health = steward.health()
        assert health["classes"]["batch"] == {"queued": 2, "running": 2}
        assert health["classes"]["interactive"] == {"queued": 2, "running": 0}
    finally:  # whatever failed above, vLLM is woken for the tests after this one, and the sampler ends
        assert httpx.post(f"{vllm.base_url}/wake_up", timeout=60).status_code == 200
        for thread in threads:
            thread.join(300)
        done.set()
        sampler.join(30)
    assert statuses == [200] * 6
    # vLLM's own gauges never show more than 2 inside it; alone (--max-num-seqs 4) it would
    # have held all 6. (On a machine with busy cores its gauges were once 0 throughout, so
    # that it saw 2 at a time is read from steward's log of what it sent.)
    assert inside and max(inside) <= 2
    assert _most_at_once(steward.events()) == 2
    classes = [e["class"] for e in steward.events("dispatch")[dispatched:]]
    assert classes == ["batch", "batch", "interactive", "interactive", "batch", "batch"]


def _most_at_once(events: list[dict[str, object]]) -> int:
    """The most steps running at once on the engine, from dispatch and complete events."""
    running = most = 0
    for event in events:
        if event.get("model") == NAME and event["event"] in ("dispatch", "complete"):
            running += 1 if event["event"] == "dispatch" else -1
            most = max(most, running)
    return most


def test_a_stream_is_relayed_chunk_by_chunk_with_its_usage(steward: RunningSteward) -> None:
    with httpx.stream("POST", f"{steward.base_url}/chat/completions", timeout=120,
                      json=chat(200, stream=True, stream_options={"include_usage": True})) as response:
        assert response.status_code == 200
        reads = [chunk for chunk in response.iter_raw()]
    assert len(reads) > 1  # what vLLM sent as it went, not one buffered answer
    events = [line.removeprefix("data: ") for line in b"".join(reads).decode().split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 200
    client = openai.OpenAI(base_url=steward.base_url, api_key="x", max_retries=0, timeout=120)
    streamed = list(client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=8, stream=True, extra_body=EXACT,
                                                   stream_options={"include_usage": True}))
    # vLLM merges the tokens a slow reader has not yet taken into one delta (its output collector):
    # on a busy machine 8 tokens may come in fewer than 8 chunks.
    assert sum(1 for c in streamed if c.choices and c.choices[0].delta.content) >= 2
    assert streamed[-1].usage is not None and streamed[-1].usage.completion_tokens == 8


def test_vllm_errors_come_back_in_openais_shape(steward: RunningSteward, vllm: Server) -> None:
    body = chat(4, messages=[{"role": "user", "content": "word " * 2000}])  # past --max-model-len 512
    direct = httpx.post(f"{vllm.base_url}/v1/chat/completions", json=body, timeout=60)
    through = httpx.post(f"{steward.base_url}/chat/completions", json=body, timeout=60)
    assert direct.status_code == 400
    # vLLM's error as it said it, in OpenAI's shape: its HTTP status out of `code` (the spec's is a string).
    theirs = direct.json()["error"]
    assert (through.status_code, through.json()) == (direct.status_code, {"error": {**theirs, "code": None}})
    assert through.json()["error"]["type"] == "BadRequestError"


def test_the_engines_own_queue_shows_in_healthz_and_metrics(steward: RunningSteward) -> None:
    deadline = time.monotonic() + 30
    while (load := steward.health()["engines"][NAME]["engine_load"]) is None:
        assert time.monotonic() < deadline, "vLLM's own load never reached /healthz"
        time.sleep(0.1)
    assert set(load) == {"running", "waiting", "kv_usage"}
    assert load["kv_usage"] is not None and 0.0 <= load["kv_usage"] <= 1.0  # vLLM's own vllm:kv_cache_usage_perc
    metrics = httpx.get(f"{steward.url}/metrics", timeout=10).text
    assert f'steward_engine_reported_waiting{{engine="{NAME}"}}' in metrics


def test_steward_check_shows_the_attached_server(steward: RunningSteward) -> None:
    config = steward.events_path.parent / "config.yaml"
    result = subprocess.run([sys.executable, "-m", "supervisor.cli", "check", str(config)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert f"model {NAME}  (openai, always on)" in result.stdout
    assert "attach   http://127.0.0.1:" in result.stdout


# ---- what steward relies on in vLLM's own answers, asked of vLLM directly ----------------
MAX_TOKENS = 4
CHAT = [{"role": "user", "content": "hello"}]


def test_health_is_200_with_an_empty_body(vllm: Server) -> None:
    reply = httpx.get(f"{vllm.base_url}/health", timeout=10)
    assert reply.status_code == 200
    assert reply.content == b""


def test_models_lists_the_served_name(vllm: Server) -> None:
    models = vllm.client().models.list()
    assert [m.id for m in models.data] == [NAME]
    assert models.data[0].model_extra is not None and models.data[0].model_extra["max_model_len"] == 512


def test_chat_completion(vllm: Server) -> None:
    reply = vllm.client().chat.completions.create(model=NAME, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0,
                                                  extra_body=EXACT)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == MAX_TOKENS
    assert reply.model == NAME


def test_streamed_chat_ends_with_a_usage_chunk_then_done(vllm: Server) -> None:
    body = {"model": NAME, "messages": CHAT, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True, **EXACT,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{vllm.base_url}/v1/chat/completions", json=body, timeout=60) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        events = [line.removeprefix("data: ") for line in reply.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == MAX_TOKENS
    assert all(chunk.get("usage") is None for chunk in chunks[:-1])  # vLLM leaves the key out
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1])
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


def test_streamed_chat_with_the_openai_client(vllm: Server) -> None:
    stream = vllm.client().chat.completions.create(model=NAME, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0,
                                                   stream=True, stream_options={"include_usage": True},
                                                   extra_body=EXACT)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == MAX_TOKENS


def test_unknown_model_is_404_with_the_error_shape(vllm: Server) -> None:
    body = {"model": "nope", "messages": CHAT, "max_tokens": 1}
    reply = httpx.post(f"{vllm.base_url}/v1/chat/completions", json=body, timeout=30)
    assert reply.status_code == 404
    error = reply.json()["error"]
    assert error.keys() >= {"message", "type", "param", "code"}
    assert (error["type"], error["param"], error["code"]) == ("NotFoundError", "model", 404)
    with pytest.raises(openai.NotFoundError):
        vllm.client().chat.completions.create(model="nope", messages=CHAT, max_tokens=1)


def test_metrics_has_the_running_and_waiting_gauges(vllm: Server) -> None:
    reply = httpx.get(f"{vllm.base_url}/metrics", timeout=10)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    lines = reply.text.splitlines()
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert f"# TYPE {gauge} gauge" in lines
        samples = [line for line in lines if line.startswith(f"{gauge}{{")]
        assert samples and all(f'model_name="{NAME}"' in line for line in samples), samples
        assert float(samples[0].rsplit(" ", 1)[1]) == 0  # nothing in flight between tests


def test_the_memory_is_in_child_processes(vllm: Server) -> None:
    own = rss_bytes(vllm.process.pid)
    children = [rss_bytes(pid) or 0 for pid in tree_of(vllm.process.pid, read_parents()) - {vllm.process.pid}]
    assert own is not None and children
    assert sum(children) > own
