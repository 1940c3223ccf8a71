"""The Ollama-compatible listener in front of a fake Ollama (a real process), called with
the official `ollama` client: inference through the scheduler, everything else passed
through, Ollama's memory in the ledger (unloaded when steward needs it), retries while
Ollama is down, streams unbuffered."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import ollama
import pytest


from tests.conftest import ROOT, RunningSteward, StewardFactory, fake_model, free_port

pytestmark = pytest.mark.slow  # every test here starts steward as a real process

CHAT = "gemma3:4b,size=4GiB,load=0.3s,tps=40"
EMBED = "nomic-embed-text,size=0.5GiB,load=0.1s,embed"


def ollama_section(port: int, *, supervised: bool = True, **extra: object) -> dict[str, object]:
    section: dict[str, object] = {"upstream": f"127.0.0.1:{port}", "listen": f"127.0.0.1:{free_port()}",
                                  "memory": "6GiB", "parallel": 2, "ps_poll": "0.2s", "unload_poll": "0.1s",
                                  "unload_timeout": "5s", "retry_initial": "0.2s", "retry_max": "1s", **extra}
    if supervised:
        section["command"] = [sys.executable, "-m", "fakes.ollama", "--port", str(port), "--model", CHAT,
                              "--model", EMBED, "--unload-lag", "0.3s"]
    return section


def listener(steward: RunningSteward) -> str:
    return steward.wait_event("listening")["ollama"][0]


def test_the_official_ollama_client_through_the_listener(start_steward: StewardFactory) -> None:
    steward = start_steward({}, ollama=ollama_section(free_port()), gpu={"probe": "none", "budget": "16GiB"})
    client = ollama.Client(host=listener(steward))
    reply = client.chat(model="gemma3:4b", messages=[{"role": "user", "content": "hello"}])
    assert reply.message.role == "assistant" and reply.message.content
    parts = list(client.chat(model="gemma3:4b", messages=[{"role": "user", "content": "hi"}], stream=True))
    assert len(parts) > 1 and parts[-1].done
    embedded = client.embed(model="nomic-embed-text", input=["one", "two"])
    assert len(embedded.embeddings) == 2
    assert {m.model for m in client.list().models} >= {"gemma3:4b", "nomic-embed-text:latest"}
    assert "gemma3:4b" in {m.model for m in client.ps().models}
    dispatched = [e for e in steward.events("dispatch") if e["model"] == "ollama"]
    assert len(dispatched) == 3  # chat, stream, embed went through the scheduler; list and ps did not


def test_class_by_header_or_model_suffix_and_the_turnstile_health(start_steward: StewardFactory) -> None:
    steward = start_steward({}, ollama=ollama_section(free_port()), gpu={"probe": "none", "budget": "16GiB"})
    url = listener(steward)
    body = {"model": "gemma3:4b@batch", "prompt": "x", "stream": False}
    assert httpx.post(f"{url}/api/generate", json=body, timeout=30).json()["model"] == "gemma3:4b"
    httpx.post(f"{url}/api/generate", json={"model": "gemma3:4b", "prompt": "x", "stream": False},
               headers={"X-Steward-Class": "background"}, timeout=30)
    assert [e["class"] for e in steward.events("dispatch") if e["model"] == "ollama"] == ["batch", "background"]
    bad = httpx.post(f"{url}/api/generate", json={"model": "gemma3:4b@urgent", "prompt": "x"}, timeout=30)
    assert bad.status_code == 400 and "urgent" in bad.json()["error"]  # Ollama's own error shape
    health = httpx.get(f"{url}/healthz").json()
    assert health["state"] == "idle" and health["llm_inflight"] == 0 and health["image_pending"] is False
    metrics = httpx.get(f"{url}/metrics").text  # the turnstile's metrics on the Ollama listener
    assert "gpu_turnstile_llm_inflight 0.0" in metrics
    assert 'gpu_turnstile_lock_wait_seconds_count{kind="llm"} 2.0' in metrics


def test_steward_unloads_ollama_when_its_own_engine_needs_the_memory(start_steward: StewardFactory) -> None:
    port = free_port()
    steward = start_steward({"chat": fake_model("6GiB")}, ollama=ollama_section(port),
                            gpu={"probe": "none", "budget": "10GiB"})
    url = listener(steward)
    httpx.post(f"{url}/api/generate", json={"model": "gemma3:4b", "prompt": "x", "stream": False}, timeout=30)
    assert httpx.get(f"http://127.0.0.1:{port}/api/ps").json()["models"]  # Ollama holds the model
    reply = httpx.post(f"{steward.base_url}/chat/completions", timeout=30,
                       json={"model": "chat", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1})
    assert reply.status_code == 200
    assert [e["engine"] for e in steward.events("evict")] == ["ollama"]
    unload = steward.wait_event("ollama_unload")
    assert unload["complete"] is True and unload["models"] == ["gemma3:4b"]
    assert httpx.get(f"http://127.0.0.1:{port}/api/ps").json()["models"] == []
    # And the other way round: Ollama's next request evicts the idle engine.
    again = httpx.post(f"{url}/api/generate", json={"model": "gemma3:4b", "prompt": "x", "stream": False},
                       timeout=30)
    assert again.status_code == 200
    assert [e["engine"] for e in steward.events("evict")] == ["ollama", "chat"]


def test_shutdown_ends_the_retries_of_an_ollama_that_is_down_with_ollama_shaped_503s(
        start_steward: StewardFactory) -> None:
    steward = start_steward({}, ollama=ollama_section(free_port(), supervised=False, retry_max="30s"),
                            gpu={"probe": "none", "budget": "16GiB"})
    url = listener(steward)
    answers: dict[str, httpx.Response] = {}

    def ask(path: str, body: object = None) -> None:
        answers[path] = httpx.request("POST" if body else "GET", f"{url}{path}", json=body, timeout=60)

    asking = [threading.Thread(target=ask, args=("/api/tags",)),  # passed through: retried
              threading.Thread(target=ask, args=("/api/generate", {"model": "gemma3:4b", "prompt": "x"}))]
    for thread in asking:
        thread.start()
    # Both requests are inside steward: the pass-through one retrying (its retries name no
    # url; those of the service coming up do), the generate waiting for Ollama to come up.
    steward.wait_event("upstream_retry", service="ollama", url=None)
    steward.wait_event("enqueue", model="ollama")
    signalled = time.monotonic()
    steward.process.send_signal(signal.SIGTERM)
    assert steward.process.wait(20) == 0
    assert time.monotonic() - signalled < 5  # not the 30 s drain timeout: nothing was running
    for thread in asking:
        thread.join(10)
    assert {path: r.status_code for path, r in answers.items()} == {"/api/tags": 503, "/api/generate": 503}
    assert set(answers["/api/tags"].json()) == set(answers["/api/generate"].json()) == {"error"}  # Ollama's shape
    assert "shutting down" in answers["/api/tags"].json()["error"]


def test_an_upstream_that_is_down_is_retried_until_it_answers(start_steward: StewardFactory, tmp_path: Path) -> None:
    port = free_port()
    steward = start_steward({}, ollama=ollama_section(port, supervised=False),
                            gpu={"probe": "none", "budget": "16GiB"})
    url = listener(steward)
    answers: list[int] = []
    asking = threading.Thread(target=lambda: answers.append(httpx.get(f"{url}/api/tags", timeout=30).status_code))
    asking.start()
    steward.wait_event("upstream_retry", service="ollama")  # refused meanwhile: retried with backoff
    with open(tmp_path / "ollama.log", "wb") as log:
        late = subprocess.Popen([sys.executable, "-m", "fakes.ollama", "--port", str(port), "--model", CHAT],
                                cwd=ROOT, stdout=log, stderr=log)
    try:
        asking.join(20)
        assert answers == [200]
    finally:
        late.terminate()
        late.wait(10)


def test_ndjson_streams_pass_through_unbuffered(start_steward: StewardFactory) -> None:
    port = free_port()
    section = ollama_section(port)
    section["command"] = [sys.executable, "-m", "fakes.ollama", "--port", str(port),
                          "--model", "slow:1b,size=1GiB,load=0.1s,tps=5", "--num-predict", "10"]
    steward = start_steward({}, ollama=section, gpu={"probe": "none", "budget": "16GiB"})
    url = listener(steward)
    httpx.post(f"{url}/api/generate", json={"model": "slow:1b", "prompt": "", "stream": False}, timeout=30)  # load
    started = time.monotonic()
    arrivals = []
    with httpx.stream("POST", f"{url}/api/generate", json={"model": "slow:1b", "prompt": "go"}, timeout=30) as r:
        for line in r.iter_lines():
            if line:
                arrivals.append(time.monotonic() - started)
    assert len(arrivals) == 11  # ten tokens and the final line
    assert arrivals[0] < arrivals[-1] - 1.0  # the first line came long before the last was written




def test_edge_cases_client_leaving_mid_stream_and_while_waiting_and_sse_on_v1(start_steward: StewardFactory) -> None:
    port = free_port()
    section = ollama_section(port, parallel=1)
    section["command"] = [sys.executable, "-m", "fakes.ollama", "--port", str(port),
                          "--model", "slow:1b,size=1GiB,load=0.1s,tps=10", "--num-predict", "40"]
    steward = start_steward({}, ollama=section, gpu={"probe": "none", "budget": "16GiB"})
    url = listener(steward)
    stats = f"http://127.0.0.1:{port}/fake/stats"
    # Leaving mid-stream: Ollama stops generating, the slot is free again.
    with httpx.stream("POST", f"{url}/api/generate", json={"model": "slow:1b", "prompt": "go"}, timeout=30) as r:
        next(r.iter_lines())
    deadline = time.monotonic() + 5
    while httpx.get(stats).json()["requests_cancelled"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert httpx.get(stats).json()["requests_cancelled"] == 1
    assert httpx.get(f"{url}/healthz").json()["llm_inflight"] == 0
    # Leaving while waiting: the only slot is busy; the second client gives up and is removed.
    busy = threading.Thread(target=lambda: httpx.post(f"{url}/api/generate", timeout=30,
                                                      json={"model": "slow:1b", "prompt": "x", "stream": False}))
    busy.start()
    deadline = time.monotonic() + 10
    while httpx.get(f"{url}/healthz").json()["llm_inflight"] != 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        httpx.post(f"{url}/api/generate", json={"model": "slow:1b", "prompt": "y", "stream": False}, timeout=0.5)
    except httpx.ReadTimeout:
        pass
    assert steward.wait_event("withdraw", model="ollama")["waited_s"] < 5.0  # when it left, not at the 60 s timeout
    busy.join(30)
    # The OpenAI-compatible route streams SSE through, event by event.
    started = time.monotonic()
    arrivals = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=30, json={
            "model": "slow:1b", "stream": True, "max_tokens": 20, "messages": [{"role": "user", "content": "x"}]}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                arrivals.append(time.monotonic() - started)
    assert arrivals[0] < arrivals[-1] - 1.0
