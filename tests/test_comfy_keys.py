"""Keys on the ComfyUI listener (issue 26, defect 3), and steward's own errors there.

A key made with ``--models gemma4-e2b`` got 403 for an image model on
``/v1/images/generations`` but 200 for ``POST /prompt`` on the ComfyUI listener, which
evicts every engine. A workflow can run any model, so the ComfyUI listener has a scope of
its own in a key's models, ``comfyui`` (docs/keys.md): without it a key with a models list
is refused on every ComfyUI route and on ``/ws``; with it, a prompt and an upload are
admitted as requests (class, rate, concurrency), the page's polling is not counted.

The pure parts (the key, ``steward keys``, the config's reserved name) run here without
sockets; the listeners' view runs against one real steward for the module (slow): a fake
llama-server named ``gemma4-e2b``, an image model, a supervised fake Ollama and a
supervised fake ComfyUI.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import yaml

from fakes import simgpu
from supervisor.auth.commands import add_keys_parser, format_key_table, run_keys
from supervisor.auth.keys import KEY_PREFIX, ApiKey, add_key, key_digest, list_keys
from supervisor.config import ConfigError, parse_config
from supervisor.units import parse_size
from tests.conftest import RunningSteward, fake_model, free_port, launch_steward
from tests.fake_processes import wait_until

COMFY_JSON = "application/json; charset=utf-8"  # what ComfyUI's aiohttp says on its JSON answers
WORKFLOW = {"prompt": {"3": {"class_type": "KSampler", "inputs": {"steps": 1, "fake_seconds": 0.05}},
                       "9": {"class_type": "SaveImage", "inputs": {"images": ["3", 0]}}}}
IMAGE_GRAPH = {"3": {"class_type": "KSampler", "inputs": {"seed": "{{seed}}", "steps": 1, "fake_seconds": 0.05}},
               "9": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "{{prompt}}"}}}
OLLAMA_MODEL = "gemma3:4b,size=2GiB,load=0.1s,tps=200"
WHEN = datetime(2026, 1, 1, tzinfo=UTC)


# --- the key, `steward keys`, the config: pure -------------------------------------------------------------


def make_key(models: tuple[str, ...] | None) -> ApiKey:
    return ApiKey(name="k", hash=key_digest(f"{KEY_PREFIX}k"), models=models, created=WHEN)  # type: ignore[arg-type]


def test_a_key_reaches_the_comfyui_listener_with_all_models_or_the_scope_named() -> None:
    assert make_key(None).reaches_comfyui
    assert make_key(("gemma4-e2b", "comfyui")).reaches_comfyui and make_key(("comfyui",)).reaches_comfyui
    assert not make_key(("gemma4-e2b",)).reaches_comfyui
    assert not make_key(("sketch",)).reaches_comfyui  # an image model is one workflow, not ComfyUI itself
    assert not make_key(("comfyui",)).may_use("sketch")  # and the scope opens no image model


def keys_command(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="steward")
    add_keys_parser(parser.add_subparsers(dest="command", required=True))
    return run_keys(parser.parse_args(["keys", *argv]))


def write_config(tmp_path: Path, *, comfyui: bool) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "gpu": {"probe": "none", "budget": "16GiB"}, "auth": {"keys_file": str(tmp_path / "keys.json")},
        "models": {"gemma4-e2b": {"command": "llama-server", "memory": "1GiB"}},
        **({"comfyui": {"upstream": "127.0.0.1:8189"}} if comfyui else {})}))
    return str(path)


def test_keys_add_takes_the_comfyui_scope_and_keys_list_says_what_it_means(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path, comfyui=True)
    assert keys_command("add", "artist", "--config", config, "--models", "gemma4-e2b,comfyui") == 0
    assert keys_command("add", "chatty", "--config", config, "--models", "gemma4-e2b") == 0
    capsys.readouterr()
    assert [key.models for key in list_keys(tmp_path / "keys.json")] == [("gemma4-e2b", "comfyui"), ("gemma4-e2b",)]
    assert keys_command("list", "--config", config) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].split()[:2] == ["artist", "gemma4-e2b,comfyui"]
    assert "comfyui in MODELS: the key may use the ComfyUI listener (any workflow)" in out
    assert "comfyui in MODELS" not in format_key_table(list_keys(tmp_path / "keys.json")[1:])  # said when used


def test_keys_add_refuses_the_scope_without_a_comfyui_section(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert keys_command("add", "artist", "--config", write_config(tmp_path, comfyui=False), "--models", "comfyui") == 2
    assert capsys.readouterr().err == ("steward: --models: not a model or alias in the config: 'comfyui' (known: "
                                       "gemma4-e2b; comfyui, the ComfyUI listener, needs a comfyui section)\n")


@pytest.mark.parametrize(("section", "where"), [
    ({"models": {"comfyui": {"command": "llama-server", "memory": "1GiB"}}}, "models.comfyui"),
    ({"models": {"chat": {"command": "llama-server", "memory": "1GiB", "aliases": ["comfyui"]}}},
     "models.chat.aliases"),
    ({"models": {"chat": {"command": "llama-server", "memory": "1GiB"}}, "aliases": {"comfyui": "chat"}},
     "aliases.comfyui"),
])
def test_with_a_comfyui_section_no_model_or_alias_takes_the_scope_s_name(section: dict[str, Any], where: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config({**section, "comfyui": {"upstream": "127.0.0.1:8189"}})
    assert refused.value.problems == [f"{where}: the name 'comfyui' is taken by the ComfyUI listener (in a key's "
                                     f"models, it lets the key reach that listener); rename it"]
    parse_config(section)  # without a ComfyUI listener the name means nothing else


# --- the three listeners' view of the same keys: one real steward (slow) -----------------------------------


@attrs.frozen
class Door:
    steward: RunningSteward
    ollama: str
    comfy: str
    comfy_upstream: int  # the fake ComfyUI's own port
    keys: dict[str, str]  # name -> key text

    def auth(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[name]}"}


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    run_dir = tmp_path_factory.mktemp("comfy-keys")
    gpu = simgpu.create_device(run_dir / "gpu", total_bytes=parse_size("16GiB"), linger_s=0.05)
    keys_file = run_dir / "keys.json"
    known = ["gemma4-e2b", "sketch", "comfyui"]
    keys = {"chatty": add_key(keys_file, "chatty", models=["gemma4-e2b"], known_models=known),
            "artist": add_key(keys_file, "artist", models=["comfyui"], rpm=2, known_models=known),
            "family": add_key(keys_file, "family")}
    workflow = run_dir / "sketch.json"
    workflow.write_text(json.dumps(IMAGE_GRAPH))
    comfy_port, ollama_port = free_port(), free_port()
    registry: list[RunningSteward] = []
    launch_steward(
        run_dir, {"gemma4-e2b": fake_model("2GiB", tps=200, gpu_dir=gpu),
                  "sketch": {"runtime": "comfyui", "workflow": str(workflow), "size": "32x32"}}, registry,
        auth={"keys_file": str(keys_file)},
        gpu={"probe": "simulated", "simulated_dir": str(gpu), "poll_interval": "0.1s"},
        ollama={"upstream": f"127.0.0.1:{ollama_port}", "listen": f"127.0.0.1:{free_port()}", "memory": "2GiB",
                "ps_poll": "0.2s", "retry_initial": "0.1s", "retry_max": "0.5s",
                "command": [sys.executable, "-m", "fakes.ollama", "--port", str(ollama_port), "--model",
                            OLLAMA_MODEL, "--sim-gpu", str(gpu)]},
        comfyui={"upstream": f"127.0.0.1:{comfy_port}", "listen": f"127.0.0.1:{free_port()}", "history_poll": "0.1s",
                 "free_timeout": "5s", "retry_initial": "0.1s", "retry_max": "0.5s", "max_body_size": "64KiB",
                 "command": [sys.executable, "-m", "fakes.comfyui", "--port", str(comfy_port), "--sim-gpu",
                             str(gpu), "--model-memory", "4GiB", "--job-time", "0.1s", "--free-delay", "0.05s"]})
    steward = registry[0]
    try:
        listening = steward.wait_event("listening")
        door = Door(steward, listening["ollama"][0], listening["comfyui"][0], comfy_port, keys)
        family = door.auth("family")
        wait_until(lambda: _answers(f"{door.comfy}/system_stats", family)
                   and _answers(f"{door.ollama}/api/version", family), timeout=60)
        yield door
    finally:
        assert steward.stop() == 0


@pytest.fixture(autouse=True)
def no_leaked_children() -> Iterator[None]:
    yield  # the module's steward lives across tests (conftest's per-test check would kill it); it stops cleanly


def _answers(url: str, headers: dict[str, str]) -> bool:
    try:
        return httpx.get(url, headers=headers, timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def websocket_handshake(door: Door, name: str) -> bytes:
    """The first line of the answer to a /ws upgrade with the key *name*."""
    port = int(door.comfy.rsplit(":", 1)[1])
    request = (b"GET /ws?clientId=t HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
               b"Authorization: Bearer %s\r\n\r\n" % (port, door.keys[name].encode()))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        received = b""
        while b"\r\n" not in received and (chunk := sock.recv(4096)):
            received += chunk
    return received.split(b"\r\n", 1)[0]


def comfy_refusal(answer: httpx.Response, status: int, kind: str) -> str:
    """The message of an error steward wrote in ComfyUI's shape, with ComfyUI's Content-Type."""
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == COMFY_JSON
    body = answer.json()
    assert set(body) == {"error", "node_errors"} and set(body["error"]) == {"type", "message", "details", "extra_info"}
    assert body["error"]["type"] == kind
    return body["error"]["message"]  # type: ignore[no-any-return]


def upload(door: Door, name: str) -> httpx.Response:
    return httpx.post(f"{door.comfy}/upload/image", headers=door.auth(name), timeout=30,
                      files={"image": (f"{name}.png", b"\x89PNG fake", "image/png")}, data={"overwrite": "true"})


@pytest.mark.slow
def test_a_model_limited_key_is_refused_on_every_comfyui_route_and_unloads_nothing(door: Door) -> None:
    steward, chatty = door.steward, door.auth("chatty")
    before = {name: len(steward.events(name)) for name in ("image_queued", "image_forwarded", "evict")}
    for path in ("/prompt", "/api/prompt"):
        answer = httpx.post(f"{door.comfy}{path}", json=WORKFLOW, headers=chatty, timeout=30)
        message = comfy_refusal(answer, 403, "comfyui_not_allowed")
        assert "'chatty'" in message and "'comfyui'" in message and "gemma4-e2b" in message
    comfy_refusal(upload(door, "chatty"), 403, "comfyui_not_allowed")
    for path in ("/history", "/queue", "/system_stats", "/object_info"):
        comfy_refusal(httpx.get(f"{door.comfy}{path}", headers=chatty, timeout=30), 403, "comfyui_not_allowed")
    assert websocket_handshake(door, "chatty").startswith(b"HTTP/1.1 403 ")
    assert {name: len(steward.events(name)) for name in before} == before  # nothing queued, sent or evicted
    steward.wait_event("refused", route="/ws", key="chatty")  # the log is written a moment after the answer
    refused = [e for e in steward.events("refused") if e["key"] == "chatty" and e["listener"] == "comfyui"]
    assert {e["route"] for e in refused} == {"/prompt", "/api/prompt", "/upload/image", "/history", "/queue",
                                            "/system_stats", "/object_info", "/ws"}
    assert {e["reason"] for e in refused} == {"comfyui_not_allowed"}
    rows = [e for e in steward.events("request") if e["key"] == "chatty" and e["route"] == "/upload/image"]
    assert [(row["status"], row["error"]) for row in rows] == [(403, "comfyui_not_allowed")]


@pytest.mark.slow
def test_the_same_key_on_the_other_listeners(door: Door) -> None:
    chatty = door.auth("chatty")
    chat = httpx.post(f"{door.steward.base_url}/chat/completions", headers=chatty, timeout=30,
                      json={"model": "gemma4-e2b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    assert chat.status_code == 200, chat.text
    image = httpx.post(f"{door.steward.base_url}/images/generations", headers=chatty, timeout=30,
                       json={"model": "sketch", "prompt": "a fox"})
    assert image.status_code == 403 and image.json()["error"]["code"] == "model_not_allowed"
    ollama = httpx.post(f"{door.ollama}/api/chat", headers=chatty, timeout=30,
                        json={"model": "gemma3:4b", "messages": [{"role": "user", "content": "hi"}]})
    assert ollama.status_code == 403 and "may not use the model 'gemma3:4b'" in ollama.json()["error"]


@pytest.mark.slow
def test_the_scope_opens_the_listener_and_its_rate_counts_prompts_and_uploads_not_the_page_s_polling(
        door: Door) -> None:
    steward, artist = door.steward, door.auth("artist")  # --models comfyui --rpm 2
    image = httpx.post(f"{door.steward.base_url}/images/generations", headers=artist, timeout=30,
                       json={"model": "sketch", "prompt": "a fox"})  # the scope is not an image model
    assert image.status_code == 403 and image.json()["error"]["code"] == "model_not_allowed"
    for _ in range(5):  # ComfyUI's page polls these every few seconds
        for path in ("/history", "/queue"):
            assert httpx.get(f"{door.comfy}{path}", headers=artist, timeout=30).status_code == 200
    assert websocket_handshake(door, "artist").startswith(b"HTTP/1.1 101 ")
    first = httpx.post(f"{door.comfy}/prompt", json=WORKFLOW, headers=artist, timeout=30)
    assert first.status_code == 200, first.text
    steward.wait_event("image_released", timeout=30, prompt_id=first.json()["prompt_id"])
    stored = upload(door, "artist")
    assert stored.status_code == 200 and stored.json()["name"] == "artist.png"
    third = httpx.post(f"{door.comfy}/api/prompt", json=WORKFLOW, headers=artist, timeout=30)
    message = comfy_refusal(third, 429, "rate_limited")
    assert "'artist' is limited to 2 requests per minute" in message and int(third.headers["retry-after"]) >= 1
    comfy_refusal(upload(door, "artist"), 429, "rate_limited")
    assert httpx.get(f"{door.comfy}/queue", headers=artist, timeout=30).status_code == 200  # still not counted
    reasons = [e["reason"] for e in steward.events("refused") if e["key"] == "artist" and e["listener"] == "comfyui"]
    assert reasons == ["rate_limited", "rate_limited"]


@pytest.mark.slow
def test_steward_s_own_errors_on_the_comfyui_listener_say_what_comfyui_says(door: Door) -> None:
    """Issue 26: ComfyUI's aiohttp writes ``application/json; charset=utf-8``; steward's own
    errors there said ``application/json``."""
    family = door.auth("family")
    unknown_node = {"prompt": {"1": {"class_type": "NoSuchNode", "inputs": {}}}}
    direct = httpx.post(f"http://127.0.0.1:{door.comfy_upstream}/prompt", json=unknown_node, timeout=10)
    assert direct.status_code == 400 and direct.headers["content-type"] == COMFY_JSON  # ComfyUI's own
    comfy_refusal(httpx.post(f"{door.comfy}/prompt", json=unknown_node, headers=family, timeout=10), 400,
                  "invalid_prompt")  # steward's refusal before the GPU is taken
    comfy_refusal(httpx.post(f"{door.comfy}/prompt", json=WORKFLOW, timeout=10), 401, "invalid_api_key")  # the door
    comfy_refusal(httpx.delete(f"{door.comfy}/healthz", timeout=10), 405, "method_not_allowed")  # Quart's
    comfy_refusal(httpx.post(f"{door.comfy}/upload/image", headers=family, timeout=30,
                             files={"image": ("big.png", b"x" * 70_000, "image/png")}), 413, "request_too_large")
    openai = httpx.get(f"{door.steward.base_url}/models", timeout=10)  # the other listeners keep theirs
    assert openai.status_code == 401 and openai.headers["content-type"] == "application/json"
