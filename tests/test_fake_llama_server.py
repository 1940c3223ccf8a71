"""Tests of the fake llama-server itself (the fakes.llama_server package), run as a real subprocess."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import h11
import httpx
import pytest

from fakes import simgpu
from tests.fake_processes import FakeProcess, fake_launcher, wait_until

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow  # every test here starts the fake as a real process


@attrs.define
class Fake(FakeProcess):
    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10)


@pytest.fixture
def start_fake(tmp_path: Path) -> Iterator[Callable[..., Fake]]:
    """Start ``python -m fakes.llama_server`` (waiting for /health 200 unless wait=False)."""
    for launcher in fake_launcher(tmp_path):
        yield lambda *args, wait=True, port=None: launcher.launch(
            Fake, "fakes.llama_server", list(args), ready_path="/health", wait=wait, port=port)


def chat_body(text: str = "hello there", **extra: object) -> dict[str, object]:
    return {"model": "x", "messages": [{"role": "user", "content": text}], **extra}


def sse_blocks(text: str) -> list[str]:
    """The SSE events of a finished stream, comments (pings) dropped."""
    return [b for b in text.split("\n\n") if b and not b.startswith(":")]


def sse_json(blocks: list[str]) -> list[dict[str, object]]:
    return [json.loads(b.removeprefix("data: ")) for b in blocks if b != "data: [DONE]"]


# --------------------------------------------------------------------------- lifecycle


def test_503_while_loading_then_ok(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake("--load-time", "1s", wait=False)
    wait_until(lambda: _connects(fake.port))
    for path in ("/health", "/v1/models", "/fake/stats", "/no/such/path"):
        r = httpx.get(fake.url + path)
        assert r.status_code == 503
        assert r.json() == {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
        assert r.headers["connection"] == "close"
    wait_until(fake.answers, timeout=5)
    r = httpx.get(fake.url + "/v1/health")
    assert (r.status_code, r.json()) == (200, {"status": "ok"})
    assert "main: server is listening on http://127.0.0.1:" in fake.log()


def _connects(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def test_port_taken_exits_1(start_fake: Callable[..., Fake]) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        fake = start_fake(port=blocker.getsockname()[1], wait=False)
        assert fake.proc.wait(timeout=10) == 1
    assert "couldn't bind" in fake.log()


def assert_freed_after_linger(gpu: Path, nbytes: int) -> None:
    """Like NVML: gone from the process list at once, still counted in the total for a while."""
    device = simgpu.SimulatedDevice(gpu)
    first = device.read(time.monotonic())
    assert first.processes == {} and first.used_bytes == nbytes
    time.sleep(0.35)  # the default linger is 0.3 s
    assert device.read(time.monotonic()).used_bytes == 0
    assert not list(gpu.glob("proc-*.json"))


def test_sigterm_exits_0_promptly_and_unregisters(start_fake: Callable[..., Fake], tmp_path: Path) -> None:
    gpu = simgpu.create_device(tmp_path / "gpu", total_bytes=8 << 30)
    fake = start_fake("--sim-gpu", str(gpu), "--memory", "1GiB", "--tokens-per-second", "5")
    assert simgpu.SimulatedDevice(gpu).read(time.monotonic()).processes == {fake.proc.pid: 1 << 30}
    with fake.client() as client, client.stream("POST", "/v1/chat/completions",
                                                json=chat_body(stream=True, max_tokens=1000)) as r:
        next(r.iter_bytes())  # a stream is open
        t0 = time.monotonic()
        fake.proc.send_signal(signal.SIGTERM)
        assert fake.proc.wait(timeout=5) == 0
        assert time.monotonic() - t0 < 3.0  # not the 200 s the stream would take
    assert_freed_after_linger(gpu, 1 << 30)


def test_fail_load_exits_1_and_frees_memory(start_fake: Callable[..., Fake], tmp_path: Path) -> None:
    gpu = simgpu.create_device(tmp_path / "gpu", total_bytes=8 << 30)
    fake = start_fake("--sim-gpu", str(gpu), "--memory", "1GB", "--load-time", "200ms",
                      "--fail-load", "out of memory", wait=False)
    assert fake.proc.wait(timeout=10) == 1
    assert "error loading model: out of memory" in fake.log()
    assert_freed_after_linger(gpu, 1_000_000_000)


def test_crash_hook_aborts_and_leaves_memory_behind(start_fake: Callable[..., Fake], tmp_path: Path) -> None:
    gpu = simgpu.create_device(tmp_path / "gpu", total_bytes=8 << 30)
    fake = start_fake("--sim-gpu", str(gpu), "--memory", "1GB", "--tokens-per-second", "200")
    with pytest.raises(httpx.TransportError):
        httpx.post(fake.url + "/v1/chat/completions", json=chat_body("FAKE_CRASH now", stream=True), timeout=5)
    assert fake.proc.wait(timeout=5) == 134
    assert list(gpu.glob("proc-*.json"))  # like SIGKILL: the reader's linger cleans up


# --------------------------------------------------------------------------- shapes


def test_chat_non_stream_shape(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake("-m", "models/x.gguf", "-a", "tiny", "--tokens-per-second", "200")
    r = httpx.post(fake.url + "/v1/chat/completions", json=chat_body("one two three", max_tokens=3))
    assert r.status_code == 200
    assert r.headers["keep-alive"] == "timeout=5, max=5"
    body = r.json()
    assert re.fullmatch(r"chatcmpl-[A-Za-z0-9]{32}", body["id"])
    assert body["object"] == "chat.completion" and body["model"] == "tiny"
    assert isinstance(body["created"], int) and body["system_fingerprint"]
    assert body["choices"] == [{"finish_reason": "length", "index": 0,
                                "message": {"role": "assistant", "content": " the quick brown"}}]
    # the chat template's default system prompt and turns around the three words
    assert body["usage"] == {"completion_tokens": 3, "prompt_tokens": 31, "total_tokens": 34,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    assert body["timings"]["predicted_n"] == 3 and body["timings"]["prompt_n"] == 31


def test_chat_stream_shape_with_usage(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake("--tokens-per-second", "200")
    with fake.client() as client:
        r = client.post("/chat/completions", json=chat_body(
            stream=True, max_completion_tokens=2, stream_options={"include_usage": True}))
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/event-stream"
    assert r.headers["transfer-encoding"] == "chunked"
    blocks = sse_blocks(r.text)
    assert blocks[-1] == "data: [DONE]"
    role, first, second, finish, usage = sse_json(blocks)
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert [c["choices"][0]["delta"] for c in (first, second)] == [{"content": " the"}, {"content": " quick"}]
    assert finish["choices"] == [{"finish_reason": "length", "index": 0, "delta": {}}]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 2
    assert "timings" in usage and "timings" not in finish
    assert {c["object"] for c in (role, first, finish, usage)} == {"chat.completion.chunk"}
    assert len({c["id"] for c in (role, first, finish, usage)}) == 1


def test_a_first_token_that_is_half_a_character_means_no_role_chunk(start_fake: Callable[..., Fake]) -> None:
    """Seen on the real llama-server (a random tiny model): the role chunk comes only with a
    first token that is whole UTF-8; otherwise the stream starts with content."""
    fake = start_fake("--tokens-per-second", "0")
    r = httpx.post(fake.url + "/v1/chat/completions",
                   json=chat_body("FAKE_SPLIT_UTF8", stream=True, max_tokens=3))
    chunks = sse_json(sse_blocks(r.text))
    assert [c["choices"][0]["delta"] for c in chunks] == [{"content": "é"}, {"content": " brown"}, {}]
    whole = httpx.post(fake.url + "/v1/chat/completions", json=chat_body("FAKE_SPLIT_UTF8", max_tokens=3)).json()
    assert whole["choices"][0]["message"]["content"] == "é brown"
    assert whole["usage"]["completion_tokens"] == 3


def test_stream_without_usage_ends_with_finish_chunk_and_timings(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake("--tokens-per-second", "0")
    r = httpx.post(fake.url + "/v1/chat/completions", json=chat_body(stream=True, max_tokens=1))
    chunks = sse_json(sse_blocks(r.text))
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and "timings" in chunks[-1]
    assert all("usage" not in c for c in chunks)


def test_completions_oai_and_native(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake("--tokens-per-second", "0", "--max-tokens-default", "2")
    with fake.client() as client:
        oai = client.post("/v1/completions", json={"prompt": "a b c"}).json()
        assert oai["object"] == "text_completion"
        assert oai["choices"][0]["text"] == " the quick" and oai["usage"]["prompt_tokens"] == 3
        stream = client.post("/v1/completions", json={"prompt": "a", "stream": True}).text
        assert sse_blocks(stream)[-1] == "data: [DONE]"
        last = sse_json(sse_blocks(stream))[-1]  # no budget: two words, then the model's end-of-generation token
        assert last["usage"]["completion_tokens"] == 3 and last["choices"][0]["finish_reason"] == "stop"
        native = client.post("/completion", json={"prompt": "a", "n_predict": 1}).json()
        assert native["content"] == " the" and native["stop"] is True and native["tokens_evaluated"] == 1
        native_stream = sse_blocks(client.post("/completions", json={"prompt": "a", "stream": True}).text)
        assert "data: [DONE]" not in native_stream and sse_json(native_stream)[-1]["stop"] is True


def test_models_props_slots_metrics(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake("-m", "/models/m.gguf", "-c", "1000", "-np", "2", "--metrics")
    with fake.client() as client:
        models = client.get("/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["/models/m.gguf"] and len(models["models"]) == 1
        props = client.get("/props").json()
        assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 500
        slots = client.get("/slots").json()
        assert [(s["id"], s["n_ctx"], s["is_processing"]) for s in slots] == [(0, 500, False), (1, 500, False)]
        client.post("/v1/messages", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        # the params of each slot's last task: Claude Code's max_tokens show here
        assert sorted(s["params"]["n_predict"] for s in client.get("/slots").json()) == [-1, 3]
        metrics = client.get("/metrics").text
        assert "llamacpp:requests_processing 0" in metrics and "llamacpp:requests_deferred 0" in metrics


def test_disabled_endpoints_answer_501(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake("--no-slots")
    with fake.client() as client:
        for method, path in (("GET", "/slots"), ("GET", "/metrics"), ("POST", "/v1/embeddings")):
            r = client.request(method, path, json={"input": "x"})
            assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
            assert r.headers["connection"] == "close"
        assert client.post("/v1/embeddings", json={"input": "x"}).json()["error"]["message"] == (
            "This server does not support embeddings. Start it with `--embeddings`")


def test_embeddings_shape(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake("--embeddings", "--embedding-dim", "8", "-a", "emb")
    with fake.client() as client:
        body = client.post("/v1/embeddings", json={"input": ["hello world", "x"], "model": "emb"}).json()
        again = client.post("/v1/embeddings", json={"input": "hello world"}).json()
    assert body["object"] == "list" and body["model"] == "emb"
    assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    assert [(d["index"], d["object"], len(d["embedding"])) for d in body["data"]] == [
        (0, "embedding", 8), (1, "embedding", 8)]
    assert abs(sum(v * v for v in body["data"][0]["embedding"]) - 1.0) < 1e-9
    assert again["data"][0]["embedding"] == body["data"][0]["embedding"]  # deterministic


# --------------------------------------------------------------------------- errors


def test_context_overflow_is_plain_400_even_when_streaming(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake("-c", "64", "-np", "2")  # 32 tokens per slot
    # 28 tokens of template (system prompt, turns) and 4 words: 32
    r = httpx.post(fake.url + "/v1/chat/completions", json=chat_body(" ".join(["w"] * 4), stream=True))
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    assert r.headers["connection"] == "close"
    assert r.json() == {"error": {
        "code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": 32, "n_ctx": 32,
        "message": "request (32 tokens) exceeds the available context size (32 tokens), try increasing it"}}


def test_errors_close_the_connection(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake()
    with fake.client() as client:
        r = client.get("/nope")
        assert r.status_code == 404 and r.headers["connection"] == "close"
        assert r.json() == {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}
        r = client.post("/v1/chat/completions", content=b"{not json")
        assert r.status_code == 400 and r.headers["connection"] == "close"
        assert r.json()["error"]["type"] == "invalid_request_error" and r.json()["error"]["code"] == 400
    # The server really closes: a raw socket sees EOF after the error response.
    with RawClient(fake.port) as raw:
        response, _ = raw.request("GET", "/nope")
        assert response.status_code == 404
        assert raw.at_eof(timeout=2)


def test_midstream_error_event_without_done(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake("--tokens-per-second", "200")
    r = httpx.post(fake.url + "/v1/chat/completions", json=chat_body("please FAKE_ERROR_MIDSTREAM", stream=True))
    assert r.status_code == 200
    blocks = sse_blocks(r.text)
    assert "data: [DONE]" not in blocks
    assert json.loads(blocks[-1].removeprefix("data: ")) == {
        "error": {"code": 500, "message": "fake mid-stream failure", "type": "server_error"}}
    assert [c["choices"][0]["delta"].get("content") for c in sse_json(blocks[:-1])] == [None, " the", " quick"]


# --------------------------------------------------------------------------- connections


class RawClient:
    """One TCP connection driven by h11, to see exactly when the server closes it."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.conn = h11.Connection(h11.CLIENT)

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def request(self, method: str, path: str) -> tuple[h11.Response, bytes]:
        if self.conn.our_state is h11.DONE:
            self.conn.start_next_cycle()
        req = h11.Request(method=method, target=path, headers=[("Host", "fake")])
        self.sock.sendall(self.conn.send(req) + self.conn.send(h11.EndOfMessage()))
        response, body = None, b""
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(self.sock.recv(65536))
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert response is not None
                return response, body
            else:
                raise AssertionError(f"unexpected {event!r}")

    def at_eof(self, timeout: float) -> bool:
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False


def test_keepalive_connection_closed_after_5_requests(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake()
    with RawClient(fake.port) as raw:
        for i in range(1, 6):
            response, _ = raw.request("GET", "/health")
            headers = dict(response.headers)
            assert response.status_code == 200
            if i < 5:
                assert headers[b"keep-alive"] == b"timeout=5, max=5" and b"connection" not in headers
            else:
                assert headers[b"connection"] == b"close"
        assert raw.at_eof(timeout=2)
    assert fake.stats()["connections"] >= 2


def test_idle_keepalive_connection_closed(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake("--keepalive-timeout", "300ms")
    with RawClient(fake.port) as raw:
        raw.request("GET", "/health")
        t0 = time.monotonic()
        assert raw.at_eof(timeout=3)
        assert 0.2 < time.monotonic() - t0 < 2


def test_requests_beyond_slots_are_deferred(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake("-np", "2", "--tokens-per-second", "20", "--metrics")
    # Two streams hold both slots until this test lets go of them, however slow the machine.
    with fake.client() as first, fake.client() as second, \
            first.stream("POST", "/v1/chat/completions", json=chat_body(stream=True, max_tokens=10_000)) as a, \
            second.stream("POST", "/v1/chat/completions", json=chat_body(stream=True, max_tokens=10_000)) as b:
        assert (a.status_code, b.status_code) == (200, 200)
        wait_until(lambda: fake.stats()["active"] == 2)
        results: list[int] = []

        def one() -> None:
            r = httpx.post(fake.url + "/v1/chat/completions", json=chat_body(max_tokens=8), timeout=30)
            results.append(r.status_code)

        threads = [threading.Thread(target=one) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            wait_until(lambda: fake.stats()["deferred"] == 3, timeout=30)
            stats = fake.stats()
            assert (stats["active"], stats["started"]) == (2, 2)
            assert [s["is_processing"] for s in httpx.get(fake.url + "/slots").json()] == [True, True]
            assert "llamacpp:requests_deferred 3" in httpx.get(fake.url + "/metrics").text
        finally:
            a.close()
            b.close()  # the slots free up: the three deferred requests run
            for t in threads:
                t.join(timeout=30)
    assert results == [200] * 3
    wait_until(lambda: fake.stats()["active"] == 0)
    stats = fake.stats()
    assert (stats["started"], stats["completed"], stats["cancelled"], stats["deferred"]) == (5, 3, 2, 0)


def test_client_disconnect_cancels_generation(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake("-np", "1", "--tokens-per-second", "50")
    with fake.client() as client, client.stream("POST", "/v1/chat/completions",
                                                json=chat_body(stream=True, max_tokens=10_000)) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    wait_until(lambda: fake.stats()["cancelled"] == 1)
    stats = fake.stats()
    assert (stats["started"], stats["completed"], stats["active"]) == (1, 0, 0)
    # The slot is free again: the next request runs at once.
    r = httpx.post(fake.url + "/v1/chat/completions", json=chat_body(max_tokens=1), timeout=5)
    assert r.status_code == 200


def test_unknown_llama_server_flags_are_ignored(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake("-m", "/m/model.gguf", "-ngl", "99", "-t", "8", "--mlock", "-fa", "on", "-ctk", "q8_0",
                      "-md", "/m/draft.gguf", "--temp", "0.7", "--jinja", "-np", "3", "-c", "3000")
    with fake.client() as client:
        assert client.get("/v1/models").json()["data"][0]["id"] == "/m/model.gguf"
        assert [s["n_ctx"] for s in client.get("/slots").json()] == [1000, 1000, 1000]


def test_api_key(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake("--api-key", "sekrit")
    with fake.client() as client:
        assert client.get("/health").status_code == 200
        r = client.post("/v1/chat/completions", json=chat_body(max_tokens=1))
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        r = client.post("/v1/chat/completions", json=chat_body(max_tokens=1),
                        headers={"Authorization": "Bearer sekrit"})
        assert r.status_code == 200


def test_module_help_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "fakes.llama_server", "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "--keepalive-max" in out.stdout
