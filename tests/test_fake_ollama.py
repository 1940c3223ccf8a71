"""Tests of the fake Ollama (fakes.ollama), run as a real subprocess: the official clients, then the quirks."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import httpx
import openai
import pytest
import trio

from fakes import simgpu
from tests.fake_processes import FakeProcess, fake_launcher, wait_until

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow  # every test here starts the fake as a real process

CHAT = "gemma3:4b,size=4GiB,load=0.2s,tps=200"
EMBED = "nomic-embed-text,size=0.3GiB,load=0.1s,embed"
ANSWER = " the quick brown fox jumps over a lazy"  # --num-predict 8 (the default)
BUSY = "server busy, please try again.  maximum pending requests exceeded"


@attrs.define
class Fake(FakeProcess):
    def ps_names(self) -> list[str]:
        return [m["name"] for m in self.get("/api/ps").json()["models"]]


@pytest.fixture
def start_ollama(tmp_path: Path) -> Iterator[Callable[..., Fake]]:
    """Start ``python -m fakes.ollama`` with the chat and embedding models; always stopped and reaped."""
    for launcher in fake_launcher(tmp_path):
        yield lambda *args, models=(CHAT, EMBED): launcher.launch(
            Fake, "fakes.ollama", [*(a for spec in models for a in ("--model", spec)), *args],
            ready_path="/api/version")


@pytest.fixture
def gpu_dir(tmp_path: Path) -> Path:
    return simgpu.create_device(tmp_path / "gpu", total_bytes=16 * 1024**3, linger_s=0.1)


def registered(gpu: Path) -> int:
    return simgpu.SimulatedDevice(gpu).read(time.monotonic()).used_bytes


def ndjson(response: httpx.Response) -> list[dict[str, object]]:
    return [json.loads(line) for line in response.text.splitlines() if line]


# --------------------------------------------------------------------------- the official clients


def test_official_ollama_client(start_ollama: Callable[..., Fake]) -> None:
    import ollama  # the official client, a test dependency
    fake = start_ollama()
    client = ollama.Client(host=fake.url)
    messages = [{"role": "user", "content": "hello there"}]

    reply = client.chat(model="gemma3:4b", messages=messages)
    assert reply.message.content == ANSWER
    assert reply.done and reply.done_reason == "stop" and reply.eval_count == 8
    assert reply.load_duration > 0.15e9  # the first request paid for the load

    parts = list(client.chat(model="gemma3:4b", messages=messages, stream=True))
    assert len(parts) == 9 and "".join(p.message.content for p in parts) == ANSWER
    assert [p.done for p in parts] == [False] * 8 + [True]

    gen = client.generate(model="gemma3:4b", prompt="say something", options={"num_predict": 3})
    assert (gen.response, gen.done_reason) == (" the quick brown", "length")

    emb = client.embed(model="nomic-embed-text", input=["a b", "c"])
    assert len(emb.embeddings) == 2 and len(emb.embeddings[0]) == 16
    assert client.embed(model="nomic-embed-text", input="a b").embeddings[0] == emb.embeddings[0]  # deterministic

    assert {m.model for m in client.list().models} == {"gemma3:4b", "nomic-embed-text:latest"}
    ps = {m.model: m for m in client.ps().models}
    assert set(ps) == {"gemma3:4b", "nomic-embed-text:latest"}
    assert ps["gemma3:4b"].size == ps["gemma3:4b"].size_vram == 4 * 1024**3
    assert ps["gemma3:4b"].expires_at is not None and ps["gemma3:4b"].details.family == "llama"
    assert "embedding" in client.show("nomic-embed-text").capabilities

    with pytest.raises(ollama.ResponseError, match="does not support generate") as err:
        client.generate(model="nomic-embed-text", prompt="hi")
    assert err.value.status_code == 400
    with pytest.raises(ollama.ResponseError, match="FAKE_ERROR_MIDSTREAM"):
        list(client.generate(model="gemma3:4b", prompt="FAKE_ERROR_MIDSTREAM now", stream=True))


def test_openai_client_on_v1(start_ollama: Callable[..., Fake]) -> None:
    fake = start_ollama()
    client = openai.OpenAI(base_url=fake.url + "/v1", api_key="ollama", max_retries=0)
    messages = [{"role": "user", "content": "hello"}]

    chat = client.chat.completions.create(model="gemma3:4b", messages=messages)
    assert chat.object == "chat.completion" and chat.system_fingerprint == "fp_ollama"
    assert chat.choices[0].message.content == ANSWER and chat.choices[0].finish_reason == "stop"
    assert chat.usage is not None and chat.usage.completion_tokens == 8

    chunks = list(client.chat.completions.create(model="gemma3:4b", messages=messages, max_tokens=3, stream=True,
                                                 stream_options={"include_usage": True}))
    assert [c.choices[0].delta.content for c in chunks[:3]] == [" the", " quick", " brown"]
    assert chunks[3].choices[0].finish_reason == "length"
    assert chunks[4].choices == [] and chunks[4].usage is not None and chunks[4].usage.completion_tokens == 3
    assert len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1

    text = client.completions.create(model="gemma3:4b", prompt="once upon", max_tokens=2)
    assert (text.object, text.choices[0].text) == ("text_completion", " the quick")

    emb = client.embeddings.create(model="nomic-embed-text", input=["x", "y z"])
    assert [d.index for d in emb.data] == [0, 1] and len(emb.data[0].embedding) == 16
    assert emb.usage.prompt_tokens == 3

    assert {m.id for m in client.models.list()} == {"gemma3:4b", "nomic-embed-text:latest"}
    assert client.models.retrieve("gemma3:4b").owned_by == "library"
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="nope", messages=messages)
    assert missing.value.body["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="does not support chat"):
        client.chat.completions.create(model="nomic-embed-text", messages=messages)


# --------------------------------------------------------------------------- native shapes and quirks


def test_ndjson_stream_and_single_json(start_ollama: Callable[..., Fake]) -> None:
    fake = start_ollama()
    r = fake.post("/api/generate", {"model": "gemma3:4b", "prompt": "one two three"})
    assert r.headers["content-type"] == "application/x-ndjson" and "server" not in r.headers
    lines = ndjson(r)
    assert [line["done"] for line in lines] == [False] * 8 + [True]
    assert all(line["model"] == "gemma3:4b" and line["created_at"].endswith("Z") for line in lines)
    last = lines[-1]
    assert last["response"] == "" and last["done_reason"] == "stop" and last["prompt_eval_count"] == 3
    assert {"total_duration", "load_duration", "eval_count", "eval_duration", "context"} <= set(last)
    assert last["total_duration"] >= last["load_duration"] > 0.15e9  # nanoseconds

    r = fake.post("/api/chat", {"model": "gemma3", "messages": [{"role": "user", "content": "hi"}],
                                "stream": False})  # no tag: ":latest" does not exist
    assert (r.status_code, r.json()) == (404, {"error": "model 'gemma3' not found"})
    r = fake.post("/api/chat", {"model": "gemma3:4b", "messages": [{"role": "user", "content": "hi"}],
                                "stream": False})
    body = r.json()
    assert r.headers["content-type"].startswith("application/json")
    assert body["message"] == {"role": "assistant", "content": ANSWER} and body["done_reason"] == "stop"
    assert "context" not in body


def test_load_unload_keep_alive_zero_and_ps_lag(start_ollama: Callable[..., Fake], gpu_dir: Path) -> None:
    fake = start_ollama("--sim-gpu", str(gpu_dir), "--unload-lag", "0.4s")
    assert fake.get("/api/ps").json() == {"models": []}
    r = fake.post("/api/generate", {"model": "gemma3:4b"})
    assert r.json()["done_reason"] == "load" and r.json()["done"] is True and "eval_count" not in r.json()
    assert fake.ps_names() == ["gemma3:4b"] and registered(gpu_dir) == 4 * 1024**3

    r = fake.post("/api/chat", {"model": "gemma3:4b", "messages": [], "keep_alive": 0})
    assert r.json()["done_reason"] == "unload" and r.json()["message"] == {"role": "assistant", "content": ""}
    t0 = time.monotonic()
    assert fake.ps_names() == ["gemma3:4b"]  # still there while it unloads
    wait_until(lambda: fake.ps_names() == [])
    assert 0.3 < time.monotonic() - t0 < 3.0  # the 0.4 s lag, not at once
    assert registered(gpu_dir) == 0
    stats = fake.stats()
    assert (stats["loads"], stats["unloads"], stats["unload_calls"], stats["loaded"]) == (1, 1, 1, {})

    # keep_alive 0 with a prompt: answered, then unloaded
    r = fake.post("/api/generate", {"model": "gemma3:4b", "prompt": "hi", "stream": False, "keep_alive": 0})
    assert r.json()["response"] == ANSWER
    wait_until(lambda: fake.ps_names() == [])


def test_keep_alive_values(start_ollama: Callable[..., Fake]) -> None:
    fake = start_ollama("--unload-lag", "0.1s")
    fake.post("/api/generate", {"model": "gemma3:4b", "keep_alive": -1})
    assert fake.get("/api/ps").json()["models"][0]["expires_at"][:4] >= "2300"  # forever
    fake.post("/api/embed", {"model": "nomic-embed-text", "keep_alive": "500ms"})
    assert fake.ps_names() == ["gemma3:4b", "nomic-embed-text:latest"]  # sorted by expires_at, latest first
    wait_until(lambda: fake.ps_names() == ["gemma3:4b"], timeout=3)
    r = fake.post("/api/generate", {"model": "gemma3:4b", "keep_alive": "-1"})
    assert (r.status_code, r.json()) == (400, {"error": 'time: missing unit in duration "-1"'})
    r = fake.post("/api/generate", {"model": "gemma3:4b", "keep_alive": 1.5})  # a number is seconds
    entry = fake.get("/api/ps").json()["models"][0]
    assert entry["expires_at"][:4] < "2300"
    wait_until(lambda: fake.ps_names() == [], timeout=4)


def test_embedding_only_model(start_ollama: Callable[..., Fake]) -> None:
    fake = start_ollama()
    for path, body, what in (("/api/generate", {"prompt": "hi"}, "generate"), ("/api/generate", {}, "generate"),
                             ("/api/chat", {"messages": [{"role": "user", "content": "x"}]}, "chat")):
        r = fake.post(path, {"model": "nomic-embed-text", **body})
        assert (r.status_code, r.json()) == (400, {"error": f'"nomic-embed-text" does not support {what}'})
    assert fake.ps_names() == []
    r = fake.post("/api/embed", {"model": "nomic-embed-text"})  # no input: load only
    assert r.json() == {"model": "nomic-embed-text", "embeddings": []}
    assert fake.ps_names() == ["nomic-embed-text:latest"]
    r = fake.post("/api/embed", {"model": "nomic-embed-text", "input": "x"})
    assert len(r.json()["embeddings"]) == 1 and r.json()["prompt_eval_count"] == 1
    assert fake.post("/api/embed", {"model": "nomic-embed-text", "input": [1]}).json() == \
        {"error": "invalid input type"}
    legacy = fake.post("/api/embeddings", {"model": "nomic-embed-text", "prompt": "x"}).json()
    assert legacy["embedding"] == r.json()["embeddings"][0]
    assert fake.post("/api/embeddings", {"model": "nope", "prompt": "x"}).json() == \
        {"error": 'model "nope" not found, try pulling it first'}
    r = fake.post("/api/generate", {"model": "nomic-embed-text", "keep_alive": 0})  # the unload path works
    assert (r.status_code, r.json()["done_reason"]) == (200, "unload")
    wait_until(lambda: fake.ps_names() == [])


def test_midstream_error_line(start_ollama: Callable[..., Fake]) -> None:
    fake = start_ollama()
    hook = [{"role": "user", "content": "FAKE_ERROR_MIDSTREAM"}]
    r = fake.post("/api/chat", {"model": "gemma3:4b", "messages": hook})
    lines = ndjson(r)
    assert r.status_code == 200 and len(lines) == 3
    assert [line["message"]["content"] for line in lines[:2]] == [" the", " quick"]
    assert set(lines[2]) == {"error"} and "FAKE_ERROR_MIDSTREAM" in lines[2]["error"]
    r = fake.post("/api/generate", {"model": "gemma3:4b", "prompt": "FAKE_ERROR_MIDSTREAM", "stream": False})
    assert r.status_code == 500 and set(r.json()) == {"error"}
    r = fake.post("/v1/chat/completions", {"model": "gemma3:4b", "stream": True, "messages": hook})
    events = [e for e in r.text.split("\n\n") if e]
    assert len(events) == 3 and "[DONE]" not in r.text
    assert json.loads(events[2].removeprefix("data: "))["error"]["type"] == "api_error"
    assert fake.stats()["requests_failed"] == 3


async def test_max_queue_503(start_ollama: Callable[..., Fake]) -> None:
    fake = start_ollama("--max-queue", "1", models=("slow:1b,size=1GiB,load=0s,tps=20",))
    results: dict[int, httpx.Response] = {}
    async with httpx.AsyncClient(base_url=fake.url, timeout=10) as client:
        async def ask(i: int) -> None:
            results[i] = await client.post("/api/generate", json={"model": "slow:1b", "prompt": "x", "stream": False})

        async def wait_for(key: str) -> None:
            while (await client.get("/fake/stats")).json()[key] != 1:
                await trio.sleep(0.01)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, 0)
            await wait_for("active")    # 0 generates (0.4 s)
            nursery.start_soon(ask, 1)
            await wait_for("waiting")   # 1 waits for its turn: the queue is full
            nursery.start_soon(ask, 2)
        oai = await client.post("/v1/completions", json={"model": "slow:1b", "prompt": "x"})
    assert results[0].status_code == results[1].status_code == 200
    assert (results[2].status_code, results[2].json()) == (503, {"error": BUSY})
    assert oai.status_code == 200  # the queue drained
    assert fake.stats()["requests_rejected"] == 1


def test_client_leaving_cancels_generation(start_ollama: Callable[..., Fake]) -> None:
    fake = start_ollama(models=("slow:1b,size=1GiB,load=0s,tps=10",))
    with httpx.Client(base_url=fake.url, timeout=10) as client, \
            client.stream("POST", "/api/generate", json={"model": "slow:1b", "prompt": "x"}) as r:
        first = next(r.iter_lines())
        assert json.loads(first)["response"] == " the"
    wait_until(lambda: fake.stats()["requests_cancelled"] == 1)
    stats = fake.stats()
    assert (stats["active"], stats["requests_completed"]) == (0, 0)


def test_max_loaded_models_evicts_idle(start_ollama: Callable[..., Fake], gpu_dir: Path) -> None:
    fake = start_ollama("--max-loaded-models", "1", "--unload-lag", "0.2s", "--sim-gpu", str(gpu_dir))
    fake.post("/api/generate", {"model": "gemma3:4b"})
    r = fake.post("/api/embed", {"model": "nomic-embed-text", "input": "x"})
    assert r.status_code == 200 and r.json()["load_duration"] > 0.25e9  # waited for the eviction, then loaded
    assert fake.ps_names() == ["nomic-embed-text:latest"]
    assert registered(gpu_dir) == int(0.3 * 1024**3)


def test_routes_and_errors(start_ollama: Callable[..., Fake]) -> None:
    fake = start_ollama()
    root = fake.get("/")
    assert (root.status_code, root.text, root.headers["content-type"]) == \
        (200, "Ollama is running", "text/plain; charset=utf-8")
    head = httpx.head(fake.url + "/")
    assert head.status_code == 200 and head.content == b"" and head.headers["content-length"] == "17"
    assert fake.get("/api/version").json() == {"version": "0.12.6"}
    tags = fake.get("/api/tags").json()["models"]
    assert [t["name"] for t in tags] == ["gemma3:4b", "nomic-embed-text:latest"]
    assert {"modified_at", "size", "digest", "details"} <= set(tags[0])
    show = fake.post("/api/show", {"model": "gemma3:4b"}).json()
    assert show["capabilities"] == ["completion"] and show["model_info"]["llama.context_length"] == 4096
    assert fake.post("/api/show", {"model": "nope"}).json() == {"error": "model 'nope' not found"}
    empty = httpx.post(fake.url + "/api/generate")
    assert (empty.status_code, empty.json()) == (400, {"error": "missing request body"})
    assert fake.post("/api/generate", {"prompt": "x"}).json() == {"error": "model is required"}
    assert fake.post("/api/generate", {"model": "gemma3:4b", "prompt": 5}).status_code == 400
    assert (fake.get("/api/nope").status_code, fake.get("/api/nope").text) == (404, "404 page not found")
    assert fake.post("/api/ps", {}).status_code == 405
    oai = fake.post("/v1/chat/completions", {"messages": []})
    assert oai.json() == {"error": {"message": "model is required", "type": "invalid_request_error",
                                    "param": None, "code": None}}


def test_sigterm_exits_0_and_unregisters(start_ollama: Callable[..., Fake], gpu_dir: Path) -> None:
    fake = start_ollama("--sim-gpu", str(gpu_dir))
    fake.post("/api/generate", {"model": "gemma3:4b", "keep_alive": -1})
    fake.post("/api/embed", {"model": "nomic-embed-text"})
    assert registered(gpu_dir) == 4 * 1024**3 + int(0.3 * 1024**3)  # one process, both models
    with httpx.Client(base_url=fake.url, timeout=10) as client, \
            client.stream("POST", "/api/generate", json={"model": "gemma3:4b", "prompt": "x"}) as r:
        next(r.iter_lines())
        t0 = time.monotonic()
        fake.proc.send_signal(signal.SIGTERM)
        assert fake.proc.wait(timeout=5) == 0
    assert time.monotonic() - t0 < 2
    record = json.loads(next(gpu_dir.glob("proc-*.json")).read_text())
    assert record["exited"] is True
