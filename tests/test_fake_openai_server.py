"""Tests of the fake vLLM OpenAI server (the fakes.openai_server package), run as a real subprocess.

Every test waits for states (polling with generous timeouts), never for fixed times.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fakes import simgpu
from supervisor.engines.process_tree import alive
from tests.fake_processes import FakeLauncher, FakeProcess, fake_launcher, wait_until

pytestmark = pytest.mark.slow  # every test here starts the fake as a real process

MODEL = "tiny"
GiB = 1 << 30


@attrs.define
class Fake(FakeProcess):
    def metric(self, name: str, **labels: str) -> float:
        for family in text_string_to_metric_families(self.get("/metrics").text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return sample.value
        raise KeyError(name)

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", timeout=20, max_retries=0)


@pytest.fixture
def start_fake(tmp_path: Path) -> Iterator[Callable[..., Fake]]:
    """``python -m fakes.openai_server --served-model-name tiny ARGS`` (waits for /health unless told)."""
    for launcher in fake_launcher(tmp_path):
        def start(*args: str, wait: bool = True, ready_path: str = "/health", port: int | None = None,
                  launcher: FakeLauncher = launcher) -> Fake:
            return launcher.launch(Fake, "fakes.openai_server", ["--served-model-name", MODEL, *args],
                                   ready_path=ready_path, wait=wait, port=port)

        yield start


@pytest.fixture
def dev_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")


@pytest.fixture
def gpu(tmp_path: Path) -> Path:
    return simgpu.create_device(tmp_path / "gpu", total_bytes=16 * GiB)


def registered(gpu: Path) -> dict[int, int]:
    return simgpu.SimulatedDevice(gpu).read(time.monotonic()).processes


def chat_body(**extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], **extra}


def reap(pid: int) -> None:
    """An orphan re-parented to pytest (a subreaper) is ours to reap."""
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def in_thread(fn: Callable[[], httpx.Response]) -> tuple[threading.Thread, list[httpx.Response]]:
    out: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


# --------------------------------------------------------------------------- lifecycle


def test_listens_only_once_ready_then_health_is_empty_200(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake("--start-delay", "1.5s", wait=False)
    wait_until(lambda: "vLLM API server version" in fake.log(), timeout=30)
    assert refused(fake.port)  # bound, not listening: no 503 phase, as with vLLM
    wait_until(fake.answers, timeout=30)
    r = fake.get("/health")
    assert (r.status_code, r.content) == (200, b"")
    assert "content-type" not in r.headers and r.headers["server"] == "uvicorn"
    log = fake.log()
    assert f"INFO:     Started server process [{fake.proc.pid}]" in log
    assert "INFO:     Application startup complete." in log
    assert re.search(r'INFO:     127\.0\.0\.1:\d+ - "GET /health HTTP/1\.1" 200 OK', log)


def test_port_taken_exits_1(start_fake: Callable[..., Fake]) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        fake = start_fake(port=blocker.getsockname()[1], wait=False)
        assert fake.proc.wait(timeout=30) == 1
    assert "Address already in use" in fake.log()


def test_sigterm_exits_0_promptly_and_takes_the_child(start_fake: Callable[..., Fake], gpu: Path) -> None:
    fake = start_fake("--memory", "1GiB", "--simulated-dir", str(gpu), "--memory-in-child",
                      "--tokens-per-second", "5")
    [child] = registered(gpu)
    with httpx.stream("POST", fake.url + "/v1/chat/completions", timeout=20,
                      json=chat_body(stream=True, max_tokens=1000)) as r:
        next(r.iter_bytes())  # a stream is open
        t0 = time.monotonic()
        fake.proc.send_signal(signal.SIGTERM)
        assert fake.proc.wait(timeout=10) == 0
        assert time.monotonic() - t0 < 5.0  # not the 200 s the stream would take
    assert not alive(child)
    assert registered(gpu) == {}
    assert "INFO:     Finished server process" in fake.log()


# --------------------------------------------------------------------------- answers


def test_openai_client_chat_completions_and_streams(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake()
    with fake.client() as client:
        answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=3)
        assert answer.object == "chat.completion" and answer.model == MODEL
        assert answer.id.startswith("chatcmpl-")
        assert answer.choices[0].message.content == " the quick brown"
        assert answer.choices[0].finish_reason == "length"
        # "hi" in the chat template: its default system prompt, the user's turn, the assistant's start
        assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (29, 3)  # type: ignore[union-attr]
        chunks = list(client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True,
            stream_options={"include_usage": True}))
    role, *tokens, usage = chunks
    assert role.choices[0].delta.role == "assistant" and role.choices[0].delta.content == ""
    assert [c.choices[0].delta.content for c in tokens] == [" the", " quick", " brown", " fox"]
    assert [c.choices[0].finish_reason for c in tokens] == [None, None, None, "length"]
    assert usage.choices == [] and usage.usage is not None and usage.usage.completion_tokens == 4
    assert {c.id for c in chunks} == {role.id}
    with fake.client() as client:
        text = client.completions.create(model=MODEL, prompt="once upon a time")
    assert text.object == "text_completion" and text.usage is not None
    assert (text.usage.prompt_tokens, text.usage.completion_tokens) == (4, 16)
    r = fake.post("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2, "stream": True})
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert r.text.endswith("data: [DONE]\n\n")
    blocks = r.text.split("\n\n")[:-1]
    assert all(b.startswith("data: ") for b in blocks)
    chunks = [json.loads(b.removeprefix("data: ")) for b in blocks[:-1]]
    assert [c["choices"][0]["text"] for c in chunks] == [" the", " quick"]
    assert all("usage" not in c for c in chunks)  # no include_usage: no usage chunk


def test_models_and_error_shapes_and_no_sleep_without_dev_mode(start_fake: Callable[..., Fake],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_SERVER_DEV_MODE", raising=False)
    fake = start_fake("--max-model-len", "512")
    models = fake.get("/v1/models").json()
    assert models["object"] == "list"
    [card] = models["data"]
    assert {k: card[k] for k in ("id", "object", "owned_by", "root", "max_model_len")} == {
        "id": MODEL, "object": "model", "owned_by": "vllm", "root": MODEL, "max_model_len": 512}
    assert isinstance(card["created"], int)
    r = fake.post("/v1/chat/completions", chat_body(model="nope"))
    assert (r.status_code, r.json()) == (404, {"error": {"message": "The model `nope` does not exist.",
                                                         "type": "NotFoundError", "param": "model", "code": 404}})
    with fake.client() as client, pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    r = fake.post("/v1/chat/completions", content=b'{"model": ')
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "BadRequestError" and r.json()["error"]["code"] == 400
    r = fake.post("/v1/chat/completions", chat_body(max_tokens=10_000))
    assert r.status_code == 400 and "maximum context length is 512 tokens" in r.json()["error"]["message"]
    assert fake.get("/no/such/route").json() == {"detail": "Not Found"}
    assert fake.get("/v1/chat/completions").status_code == 405
    for method, path in (("POST", "/sleep?level=1"), ("POST", "/wake_up"), ("GET", "/is_sleeping")):
        r = httpx.request(method, fake.url + path, timeout=10)
        assert (r.status_code, r.json()) == (404, {"detail": "Not Found"})
    assert fake.metric("vllm:engine_sleep_state", sleep_state="awake") == 1


# --------------------------------------------------------------------------- engine


def test_max_num_seqs_limits_running_the_rest_wait(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake("--max-num-seqs", "2", "--tokens-per-second", "20")
    # 1.5 s each: all five are sent while the first two run, however busy the machine
    threads = [in_thread(lambda: fake.post("/v1/chat/completions", chat_body(max_tokens=30)))
               for _ in range(5)]
    wait_until(lambda: fake.metric("vllm:num_requests_waiting", model_name=MODEL) > 0, timeout=20)
    assert fake.metric("vllm:num_requests_running", model_name=MODEL) == 2
    for thread, _ in threads:
        thread.join(timeout=30)
    assert [out[0].status_code for _, out in threads] == [200] * 5
    assert fake.metric("fake:max_num_requests_running", model_name=MODEL) == 2
    assert fake.metric("fake:max_num_requests_waiting", model_name=MODEL) >= 1
    assert fake.metric("vllm:request_success_total", finished_reason="length") == 5
    assert fake.metric("vllm:num_requests_running") == 0 and fake.metric("vllm:num_requests_waiting") == 0


def test_kv_cache_usage_is_the_running_requests_blocks_over_the_caches(start_fake: Callable[..., Fake]) -> None:
    """As vLLM's: a request holds a block per --block-size tokens begun; done, its blocks are free."""
    fake = start_fake("--num-gpu-blocks-override", "10", "--block-size", "16", "--tokens-per-second", "0.2")
    assert fake.metric("vllm:kv_cache_usage_perc", model_name=MODEL) == 0.0
    # 5 s for its one token: the 40-token prompt holds 3 blocks of 10 all along, however busy the machine
    body = {"model": MODEL, "prompt": [7] * 40, "max_tokens": 1}
    thread, out = in_thread(lambda: fake.post("/v1/completions", body))
    wait_until(lambda: fake.metric("vllm:num_requests_running", model_name=MODEL) == 1, timeout=20)
    assert fake.metric("vllm:kv_cache_usage_perc", model_name=MODEL) == pytest.approx(0.3)
    thread.join(timeout=30)
    assert out[0].status_code == 200
    assert fake.metric("vllm:kv_cache_usage_perc", model_name=MODEL) == 0.0


@pytest.mark.usefixtures("dev_mode")
def test_sleep_holds_a_request_until_wake_up(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake()
    r = fake.post("/sleep?level=1")
    assert (r.status_code, r.json()) == (200, {"status": "sleeping", "level": 1})
    assert fake.get("/is_sleeping").json() == {"is_sleeping": True}
    assert fake.metric("vllm:engine_sleep_state", sleep_state="awake") == 0
    assert fake.metric("vllm:engine_sleep_state", sleep_state="weights_offloaded") == 1
    thread, out = in_thread(lambda: fake.post("/v1/chat/completions", chat_body(max_tokens=2)))
    wait_until(lambda: fake.metric("vllm:num_requests_waiting") == 1, timeout=20)
    assert fake.get("/health").status_code == 200  # asleep is healthy
    assert thread.is_alive()  # held, not refused
    r = fake.post("/wake_up")
    assert (r.status_code, r.json()) == (200, {"status": "awake"})
    thread.join(timeout=20)
    assert out[0].status_code == 200 and out[0].json()["choices"][0]["message"]["content"] == " the quick"
    assert fake.get("/is_sleeping").json() == {"is_sleeping": False}
    assert fake.metric("vllm:engine_sleep_state", sleep_state="awake") == 1


@pytest.mark.usefixtures("dev_mode")
def test_sleep_frees_simulated_memory_and_wake_brings_it_back(start_fake: Callable[..., Fake], gpu: Path) -> None:
    fake = start_fake("--memory", "2GiB", "--sleep-memory", "100MiB", "--kv-cache-memory-bytes", "1GiB",
                      "--simulated-dir", str(gpu), "--wake-delay", "0.05s")
    pid = fake.proc.pid
    assert registered(gpu) == {pid: 2 * GiB}
    fake.post("/sleep?level=1")
    assert registered(gpu) == {pid: 100 << 20}
    fake.post("/wake_up")
    assert registered(gpu) == {pid: 2 * GiB}
    fake.post("/sleep?level=2")
    assert fake.metric("vllm:engine_sleep_state", sleep_state="discard_all") == 1
    assert registered(gpu) == {pid: 100 << 20}
    fake.post("/sleep?level=1")  # already asleep: vLLM ignores it
    assert fake.metric("vllm:engine_sleep_state", sleep_state="discard_all") == 1
    fake.post("/wake_up?tags=weights")  # a partial wake-up: still asleep
    assert registered(gpu) == {pid: 2 * GiB - GiB}
    assert fake.get("/is_sleeping").json() == {"is_sleeping": True}
    fake.post("/wake_up?tags=kv_cache")
    assert registered(gpu) == {pid: 2 * GiB}
    assert fake.get("/is_sleeping").json() == {"is_sleeping": False}


def test_memory_in_child_dies_with_a_killed_server(start_fake: Callable[..., Fake], gpu: Path) -> None:
    fake = start_fake("--memory", "1GiB", "--simulated-dir", str(gpu), "--memory-in-child")
    [(child, nbytes)] = registered(gpu).items()
    assert child != fake.proc.pid and nbytes == GiB
    assert Path(f"/proc/{child}/comm").read_text().strip() == "VLLM::EngineCor"
    assert int(Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[1]) == fake.proc.pid
    assert fake.get("/fake/stats").json()["holder_pid"] == child
    fake.proc.kill()
    fake.proc.wait()
    wait_until(lambda: not alive(child), timeout=20)
    reap(child)
    assert child not in registered(gpu)


# --------------------------------------------------------------------------- faults


def test_fail_health_after(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake("--fail-health-after", "2", ready_path="/v1/models")
    assert [fake.get("/health").status_code for _ in range(4)] == [200, 200, 500, 500]


def test_crash_after_requests_takes_the_child(start_fake: Callable[..., Fake], gpu: Path) -> None:
    fake = start_fake("--crash-after-requests", "1", "--memory", "1GiB", "--simulated-dir", str(gpu),
                      "--memory-in-child")
    [child] = registered(gpu)
    assert fake.post("/v1/chat/completions", chat_body(max_tokens=1)).status_code == 200
    with pytest.raises(httpx.TransportError):
        fake.post("/v1/chat/completions", chat_body(max_tokens=1))
    assert fake.proc.wait(timeout=10) == 1
    assert not alive(child)
    assert "Engine core proc EngineCore_DP0 died unexpectedly" in fake.log()


def test_hang_after_requests_answers_nothing(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake("--hang-after-requests", "1")
    assert fake.post("/v1/chat/completions", chat_body(max_tokens=1)).status_code == 200
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(fake.url + "/v1/chat/completions", json=chat_body(max_tokens=1), timeout=0.5)
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(fake.url + "/health", timeout=0.5)  # connected, never answered
    assert fake.proc.poll() is None


@pytest.mark.usefixtures("dev_mode")
def test_wake_fails(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake("--wake-fails")
    fake.post("/sleep?level=1")
    r = fake.post("/wake_up")
    assert r.status_code == 500 and r.json()["error"]["code"] == 500
    assert fake.get("/is_sleeping").json() == {"is_sleeping": True}
