"""What a careless or hostile client can send, against one real steward with all three
listeners (fake llama-servers, a supervised fake Ollama, a supervised fake ComfyUI).

Each test is the regression test of a defect found by trying: one HTTP/2 request stopped
steward; slow bodies held connections forever; cross-site requests reached every listener;
a malformed /prompt unloaded the GPU; HTTP/1.0 answers never closed; deep JSON, over-limit
bodies on pass-through routes and ``//v1/...`` were 500s. After every test the module's
steward must still answer (``steward_is_up``).
"""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest

from fakes import simgpu
from supervisor.units import parse_size
from tests.conftest import RunningSteward, fake_model, free_port, launch_steward
from tests.fake_processes import wait_until

pytestmark = pytest.mark.slow  # every test here talks to the module's steward, a real process

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
OLLAMA_MODEL = "gemma3:4b,size=2GiB,load=0.1s,tps=200"
WORKFLOW = {"prompt": {"3": {"class_type": "KSampler", "inputs": {"steps": 1, "fake_seconds": 0.1}},
                       "9": {"class_type": "SaveImage", "inputs": {"images": ["3", 0]}}}}


@attrs.frozen
class Door:
    """The module's steward and its three listeners."""

    steward: RunningSteward
    url: str
    ollama: str
    comfy: str

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    run_dir = tmp_path_factory.mktemp("hostile")
    gpu = simgpu.create_device(run_dir / "gpu", total_bytes=parse_size("16GiB"), linger_s=0.05)
    registry: list[RunningSteward] = []
    comfy_port, ollama_port = free_port(), free_port()
    models = {"chat": fake_model("2GiB", parallel=2, tps=200, gpu_dir=gpu),
              "pinned": fake_model("1GiB", parallel=1, tps=200, gpu_dir=gpu, pinned=True)}
    launch_steward(
        run_dir, models, registry,
        limits={"max_body_size": "64KiB", "body_timeout": "1s", "max_connections": 40},
        security={"allowed_origins": ["http://friend.example:3000"]},
        gpu={"probe": "simulated", "simulated_dir": str(gpu), "poll_interval": "0.1s"},
        ollama={"upstream": f"127.0.0.1:{ollama_port}", "listen": f"127.0.0.1:{free_port()}", "memory": "2GiB",
                "ps_poll": "0.2s", "retry_initial": "0.1s", "retry_max": "0.5s",
                "command": [sys.executable, "-m", "fakes.ollama", "--port", str(ollama_port), "--model",
                            OLLAMA_MODEL, "--sim-gpu", str(gpu)]},
        comfyui={"upstream": f"127.0.0.1:{comfy_port}", "listen": f"127.0.0.1:{free_port()}",
                 "history_poll": "0.1s", "free_timeout": "5s", "retry_initial": "0.1s", "retry_max": "0.5s",
                 "max_body_size": "64KiB",
                 "command": [sys.executable, "-m", "fakes.comfyui", "--port", str(comfy_port), "--sim-gpu",
                             str(gpu), "--model-memory", "4GiB", "--job-time", "0.1s", "--free-delay", "0.05s"]})
    steward = registry[0]
    listening = steward.wait_event("listening")
    door = Door(steward, steward.url, listening["ollama"][0], listening["comfyui"][0])
    wait_until(lambda: _answers(f"{door.comfy}/system_stats") and _answers(f"{door.ollama}/api/version"),
               timeout=60)
    steward.wait_event("ready", timeout=60, engine="pinned")
    yield door
    assert steward.stop() == 0


@pytest.fixture
def steward(door: Door) -> RunningSteward:
    return door.steward


@pytest.fixture(autouse=True)
def no_leaked_children() -> Iterator[None]:
    yield  # the module's steward lives across tests; conftest's per-test check would flag it


@pytest.fixture(autouse=True)
def steward_is_up(door: Door) -> Iterator[None]:
    """Whatever a test sent, steward answers a good request afterwards."""
    yield
    steward = door.steward
    assert steward.process.poll() is None, f"steward exited: {steward.stderr_path.read_text()[-3000:]}"
    wait_until(lambda: httpx.post(f"{steward.base_url}/chat/completions", json=CHAT, timeout=30).status_code == 200,
               timeout=30)
    assert not steward.events("internal_error"), steward.events("internal_error")


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def _raw(port: int, data: bytes, *, timeout: float = 10.0) -> tuple[bytes, bool]:
    """Send *data* on a fresh connection; what came back, and whether the server closed it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            return received, False
        return received, True


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _shape_openai(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


# ---- 1. HTTP/2 -----------------------------------------------------------------------------


def test_an_http2_request_with_a_body_the_answer_does_not_wait_for_does_not_stop_steward(
        steward: RunningSteward) -> None:
    # Before: hypercorn's h2 code raised KeyError into steward's nursery and steward exited 1.
    for path in ("/nope", "/v1/chat/completions", "/steward/release"):
        with httpx.Client(http1=False, http2=True, timeout=10) as h2:
            with pytest.raises(httpx.HTTPError):  # refused: steward speaks HTTP/1.1 only
                h2.post(steward.url + path, content=b"x" * 70000)


def test_http2_prior_knowledge_is_refused_with_505_and_h2c_upgrade_is_served_in_http11(
        steward: RunningSteward) -> None:
    answer, closed = _raw(_port(steward.url), b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 505 ") and closed
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "http_version_not_supported"
    upgrade = (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade, HTTP2-Settings, close\r\n"
               b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n")
    answer, closed = _raw(_port(steward.url), upgrade)
    assert answer.startswith(b"HTTP/1.1 200 ") and closed


# ---- 3. slow bodies ------------------------------------------------------------------------


def test_connections_that_never_finish_their_body_get_408_and_are_closed(steward: RunningSteward) -> None:
    # Before: each stayed open for ever, one fd each. body_timeout is 1 s in this module.
    # 25: within the 28 connections the OpenAI listener may hold (its reserve and the shared part).
    port = _port(steward.url)
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{")
    sockets = []
    for _ in range(25):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.sendall(head)
        sockets.append(sock)
    try:
        assert _answers(f"{steward.url}/healthz")  # answered beside them
        for sock in sockets:
            received = b""
            while chunk := sock.recv(65536):  # until steward closes it (the socket timeout is 30 s)
                received += chunk
            assert received.startswith(b"HTTP/1.1 408 ")
            assert json.loads(received.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
    finally:
        for sock in sockets:
            sock.close()


def test_a_body_that_stops_coming_on_a_pass_through_route_is_a_408_in_the_listeners_shape(
        door: Door, steward: RunningSteward) -> None:
    head = b"POST /api/pull HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{"
    answer, closed = _raw(_port(door.ollama), head, timeout=30)  
    assert answer.startswith(b"HTTP/1.1 408 ") and closed
    assert isinstance(json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"], str)  # Ollama's own shape


@pytest.mark.slow
def test_a_listener_full_of_connections_leaves_the_others_their_share(door: Door, steward: RunningSteward) -> None:
    # Websockets hold their connections for as long as the client likes. Before: 40 of them on
    # the ComfyUI listener filled the cap all listeners shared, and chat and /healthz on the
    # OpenAI listener were refused. Now each of the three listeners keeps 6 (40 // 6) of its
    # own and 22 are shared: the ComfyUI listener holds 28; more are refused; the other
    # listeners serve, and /livez and /healthz answer even on the full one.
    port = _port(door.comfy)
    handshake = (b"GET /ws?clientId=cap%d HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\n"
                 b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                 b"Sec-WebSocket-Version: 13\r\n\r\n")
    holders, refused = [], []
    try:
        for number in range(40):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(handshake % (number, port))
            answer = sock.recv(65536)
            if answer.startswith(b"HTTP/1.1 101 "):
                holders.append(sock)
                continue
            with sock:
                while chunk := sock.recv(65536):  # until steward closes it
                    answer += chunk
            refused.append(answer)
        for path in (b"/healthz", b"/livez"):
            answer, _ = _raw(_port(steward.url), b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                             % path)
            assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
        assert httpx.post(f"{steward.base_url}/chat/completions", json=CHAT, timeout=30).status_code == 200
        assert _answers(f"{door.ollama}/api/version")
        assert len(holders) == 28 and len(refused) == 12
        for answer in refused:
            assert answer.startswith(b"HTTP/1.1 503 ") and b"connection: close" in answer.lower()
            assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["type"] == "too_many_connections"
        wait_until(lambda: _answers(f"{door.comfy}/livez"), timeout=30)  # on a health seat, once one is free
        steward.wait_event("connection_refused", listener="comfyui", reason="max_connections")
    finally:
        for sock in holders:
            sock.close()
    wait_until(lambda: _answers(f"{door.comfy}/system_stats"), timeout=30)


@pytest.mark.slow
def test_an_upload_that_trickles_is_cut_at_body_timeout(door: Door, steward: RunningSteward) -> None:
    # Before: a pass-through body timed only the gap between two chunks, so one byte every
    # 0.2 s was never cut (body_timeout is 1 s in this module).
    with socket.create_connection(("127.0.0.1", _port(door.comfy)), timeout=0.2) as sock:
        sock.sendall(b"POST /upload/image HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\n"
                     b"Content-Length: 1000\r\n\r\n")
        started = time.monotonic()
        answer = b""
        while time.monotonic() - started < 15:  # 75 of the 1,000 bytes
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                try:
                    sock.sendall(b"x")
                except OSError:
                    break
                continue
            except ConnectionResetError:
                break
            if not chunk:
                break  # closed by steward
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:300]
    body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["type"] == "request_timeout" and body["node_errors"] == {}  # ComfyUI's shape
    assert time.monotonic() - started < 10


@pytest.mark.slow
@pytest.mark.parametrize(("listener", "path"), [("url", "/v1/chat/completions"), ("url", "/v1/messages"),
                                                ("url", "/nope"), ("ollama", "/api/chat"), ("comfy", "/queue")])
def test_a_websocket_to_a_route_that_serves_none_is_refused_in_the_listeners_shape(
        door: Door, steward: RunningSteward, listener: str, path: str) -> None:
    # Before: a 500 with a traceback on the OpenAI listener (Quart's error handler read the
    # request's path in a websocket's context). steward_is_up checks no internal_error came.
    port = _port(getattr(door, listener))
    answer, closed = _raw(port, b"GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\n"
                                b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                                b"Sec-WebSocket-Version: 13\r\n\r\n" % (path.encode(), port), timeout=5)
    assert answer.startswith(b"HTTP/1.1 404 ") and closed, answer[:300]
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    if path == "/v1/messages":
        assert error["type"] == "error" and error["error"]["type"] == "not_found_error"
    elif listener == "ollama":
        assert isinstance(error["error"], str)
    elif listener == "comfy":
        assert error["error"]["type"] == "not_found" and error["node_errors"] == {}
    else:
        assert set(error["error"]) == {"message", "type", "param", "code"}


@pytest.mark.slow
@pytest.mark.parametrize("listener", ["url", "ollama", "comfy"])
def test_framing_steward_does_not_read_is_refused_in_the_listeners_shape(door: Door, steward: RunningSteward,
                                                                         listener: str) -> None:
    port = _port(getattr(door, listener))
    path = {"url": b"/v1/chat/completions", "ollama": b"/api/chat", "comfy": b"/upload/image"}[listener]
    answer, closed = _raw(port, b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: gzip\r\n\r\n" % path)
    assert answer.startswith(b"HTTP/1.1 501 ") and closed, answer[:300]  # before: an empty 501
    assert b"connection: close" in answer.lower()
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    if listener == "ollama":
        assert isinstance(error, str)
    else:
        assert error["type" if listener == "comfy" else "code"] == "unsupported_transfer_encoding"
    # Content-Length and chunked both: answered, then closed (RFC 9112 §6.1).
    answer, closed = _raw(port, b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 3\r\n"
                                b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", timeout=5)
    assert answer.startswith(b"HTTP/1.1 200 ") and closed, answer[:300]


# ---- 4. cross-site requests -----------------------------------------------------------------


@pytest.mark.parametrize("listener", ["url", "ollama", "comfy"])
def test_a_foreign_origin_or_host_is_refused_with_403_on_every_listener(door: Door, steward: RunningSteward,
                                                                         listener: str) -> None:
    base = getattr(door, listener)
    path = {"url": "/v1/models", "ollama": "/api/tags", "comfy": "/queue"}[listener]
    foreign = httpx.get(base + path, headers={"Origin": "http://evil.example"}, timeout=10)
    assert foreign.status_code == 403, foreign.text
    assert "cross-site" in foreign.text
    rebound = httpx.get(base + path, headers={"Host": f"evil.example:{_port(base)}"}, timeout=10)
    assert rebound.status_code == 403
    own = httpx.get(base + path, headers={"Origin": base}, timeout=10)
    assert own.status_code == 200
    assert httpx.get(base + path, headers={"Host": f"localhost:{_port(base)}"}, timeout=10).status_code == 200


def test_a_cross_site_simple_post_cannot_release_the_gpu_or_queue_a_prompt(door: Door, steward: RunningSteward) -> None:
    before = len(steward.events("image_force_release"))
    release = httpx.post(f"{door.comfy}/steward/release", headers={"Origin": "http://evil.example"},  
                         timeout=10)
    assert release.status_code == 403 and set(release.json()) == {"error", "node_errors"}
    prompt = httpx.post(f"{door.comfy}/prompt", content=json.dumps(WORKFLOW),  
                        headers={"Origin": "http://evil.example", "Content-Type": "text/plain"}, timeout=10)
    assert prompt.status_code == 403
    assert len(steward.events("image_force_release")) == before


def test_the_comfyui_websocket_refuses_a_foreign_origin(door: Door, steward: RunningSteward) -> None:
    port = _port(door.comfy)  
    handshake = (b"GET /ws?clientId=t HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n" % port)
    foreign, _ = _raw(port, handshake + b"Origin: http://evil.example\r\n\r\n", timeout=5)
    assert foreign.startswith(b"HTTP/1.1 403 ")
    own, _ = _raw(port, handshake + b"Origin: http://127.0.0.1:%d\r\n\r\n" % port, timeout=2)
    assert own.startswith(b"HTTP/1.1 101 ")


def test_an_allowed_origin_gets_cors_headers_and_its_preflight_answered(steward: RunningSteward) -> None:
    origin = "http://friend.example:3000"
    preflight = httpx.options(f"{steward.base_url}/chat/completions", timeout=10, headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization"})
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == origin
    assert "content-type" in preflight.headers["access-control-allow-headers"]
    answer = httpx.post(f"{steward.base_url}/chat/completions", json=CHAT, headers={"Origin": origin}, timeout=30)
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == origin


# ---- 5. a malformed prompt ------------------------------------------------------------------


@pytest.mark.parametrize(("body", "kind"), [
    (b"xxxxx", "invalid_prompt"),
    (b"[]", "invalid_prompt"),
    (b'{"client_id": "x"}', "no_prompt"),
    (b'{"prompt": {}}', "invalid_prompt"),
    (b'{"prompt": {"1": {"inputs": {}}}}', "invalid_prompt"),
    (b'{"prompt": {"1": {"class_type": "NoSuchNode", "inputs": {}}}}', "invalid_prompt"),
    (b'{"prompt": {"1": {"class_type": "KSampler", "inputs": {}}}}', "prompt_no_outputs"),
])
def test_a_prompt_comfyui_would_refuse_is_refused_before_anything_is_unloaded(
        door: Door, steward: RunningSteward, body: bytes, kind: str) -> None:
    before = {name: len(steward.events(name)) for name in ("image_queued", "evict", "stop", "ollama_unload")}
    answer = httpx.post(f"{door.comfy}/prompt", content=body, timeout=10)  
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["type"] == kind and answer.json()["node_errors"] == {}
    assert {name: len(steward.events(name)) for name in before} == before
    assert steward.health()["engines"]["pinned"]["status"] == "ready"


def test_a_good_prompt_still_runs_as_an_exclusive_job(door: Door, steward: RunningSteward) -> None:
    answer = httpx.post(f"{door.comfy}/prompt", json=WORKFLOW, timeout=30)  
    assert answer.status_code == 200 and "prompt_id" in answer.json()
    steward.wait_event("image_released", timeout=30, prompt_id=answer.json()["prompt_id"])


# ---- 6. closing connections, Content-Length --------------------------------------------------


@pytest.mark.parametrize("listener", ["url", "ollama", "comfy"])
def test_http10_and_connection_close_answers_close_the_connection(door: Door, steward: RunningSteward,
                                                                 listener: str) -> None:
    base = getattr(door, listener)
    path = {"url": b"/v1/models", "ollama": b"/api/tags", "comfy": b"/system_stats"}[listener]
    for request in (b"GET %s HTTP/1.0\r\n\r\n" % path,
                    b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" % path):
        answer, closed = _raw(_port(base), request)
        assert answer.startswith(b"HTTP/1.1 200 ") and closed, answer[:200]


def test_a_relayed_answer_keeps_its_content_length_and_http10_gets_it_whole(door: Door,
                                                                           steward: RunningSteward) -> None:
    body = json.dumps(CHAT).encode()
    answer, closed = _raw(_port(steward.url), b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json"
                                              b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    head, content = answer.split(b"\r\n\r\n", 1)
    assert closed and head.startswith(b"HTTP/1.1 200 ")
    length = [line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
    assert length and int(length[0].split(b":")[1]) == len(content)
    assert json.loads(content)["object"] == "chat.completion"
    tags = httpx.get(f"{door.ollama}/api/tags", timeout=10)  
    assert int(tags.headers["content-length"]) == len(tags.content)


# ---- 7, 8, 9. bodies and paths that were 500s -----------------------------------------------


def _deep(levels: int) -> bytes:
    return b'{"model": "chat", "messages": [], "x": ' + b'{"a": ' * levels + b"1" + b"}" * levels + b"}"


@pytest.mark.parametrize("levels", [980, 5000, 9000])  # 9000 levels: 63 KB, under the limit
def test_json_nested_deeply_is_a_400_error_object(door: Door, steward: RunningSteward, levels: int) -> None:
    for path in ("/v1/chat/completions", "/v1/embeddings", "/v1/completions"):
        answer = httpx.post(steward.url + path, content=_deep(levels), timeout=30)
        assert answer.status_code in (200, 400), answer.text  # 200: parsed and served, as the engine could
        if answer.status_code == 400:
            _shape_openai(answer, 400)
    native = httpx.post(f"{door.ollama}/api/chat", content=_deep(levels), timeout=30)  
    assert native.status_code == 400 and isinstance(native.json()["error"], str)
    compatible = httpx.post(f"{door.ollama}/v1/chat/completions", content=_deep(levels),  
                            timeout=30)
    assert compatible.status_code == 400


@pytest.mark.parametrize(("listener", "path"), [("ollama", "/api/pull"), ("ollama", "/api/create"),
                                                ("comfy", "/prompt"), ("comfy", "/upload/image"),
                                                ("url", "/v1/chat/completions")])
def test_an_over_limit_body_is_a_413_in_the_listeners_shape(door: Door, steward: RunningSteward, listener: str,
                                                           path: str) -> None:
    base = getattr(door, listener)
    for body in (b"x" * 70_000, iter([b"x" * 40_000, b"x" * 40_000])):  # declared, and chunked (no length)
        answer = httpx.post(base + path, content=body, timeout=30)
        assert answer.status_code == 413, answer.text
        error = answer.json()["error"]
        if listener == "ollama":
            assert isinstance(error, str)
        elif listener == "comfy":
            assert error["type"] == "request_too_large" and "node_errors" in answer.json()
        else:
            assert error["code"] == "request_too_large"


def test_a_doubled_slash_is_a_404_not_a_500(door: Door, steward: RunningSteward) -> None:
    _shape_openai(httpx.post(f"{steward.url}//v1/chat/completions", json=CHAT, timeout=10), 404)
    assert httpx.post(f"{door.ollama}//api/chat", json={}, timeout=10).status_code < 500  


# ---- 12. the smaller ones ---------------------------------------------------------------------


def test_an_empty_class_header_means_the_default_class_on_every_listener(door: Door, steward: RunningSteward) -> None:
    headers = {"X-Steward-Class": ""}
    assert httpx.post(f"{steward.base_url}/chat/completions", json=CHAT, headers=headers,
                      timeout=30).status_code == 200
    native = httpx.post(f"{door.ollama}/api/chat", headers=headers, timeout=30,  
                        json={"model": "gemma3:4b", "messages": [{"role": "user", "content": "hi"}], "stream": False})
    assert native.status_code == 200
    garbage = {"X-Steward-Class": "urgent"}
    _shape_openai(httpx.post(f"{steward.base_url}/chat/completions", json=CHAT, headers=garbage, timeout=30), 400)
    assert httpx.post(f"{door.ollama}/api/chat", headers=garbage, timeout=30,  
                      json={"model": "gemma3:4b", "messages": []}).status_code == 400


def test_wrong_methods_get_405_in_each_listeners_shape(door: Door, steward: RunningSteward) -> None:
    comfy = httpx.delete(f"{door.comfy}/healthz", timeout=10)  
    assert comfy.status_code == 405 and comfy.json()["error"]["type"] == "method_not_allowed"
    openai_405 = httpx.delete(f"{steward.base_url}/chat/completions", timeout=10)
    _shape_openai(openai_405, 405)


def test_a_client_that_leaves_mid_stream_is_logged_499(steward: RunningSteward) -> None:
    body = {**CHAT, "stream": True, "max_tokens": 5000}
    with httpx.stream("POST", f"{steward.base_url}/chat/completions", json=body, timeout=30) as response:
        for line in response.iter_lines():
            if '"content"' in line:
                break
    complete = steward.wait_event("complete", status=499, model="chat", timeout=30)
    assert complete["status"] == 499


def test_every_answer_steward_writes_has_a_content_length_or_a_stream_type(door: Door, steward: RunningSteward) -> None:
    for response in (httpx.get(f"{steward.url}/healthz", timeout=10),
                     httpx.post(f"{steward.base_url}/chat/completions", content=b"{", timeout=10),
                     httpx.get(f"{door.comfy}/system_stats", timeout=10)):  
        assert int(response.headers["content-length"]) == len(response.content)


def test_slow_clients_do_not_delay_others(steward: RunningSteward) -> None:
    """A connection that sent half a request head is closed after the keep-alive time and
    its grace (7.5 s + 2.5 s); meanwhile the listener serves others."""
    port = _port(steward.url)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 12")
        started = time.monotonic()
        assert _answers(f"{steward.url}/healthz")
        assert sock.recv(100) == b""  # closed by steward, not by our 30 s timeout
        assert time.monotonic() - started < 29


def test_steward_writes_no_internal_error_for_any_of_this(steward: RunningSteward) -> None:
    assert Path(steward.events_path).exists()
    assert not steward.events("internal_error")
    assert not steward.events("connection_error") or all(
        "Http2" not in e.get("error", "") for e in steward.events("connection_error"))
