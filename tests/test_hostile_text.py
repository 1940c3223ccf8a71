"""Text no engine can read, sent to every listener (issue 26, defect 1): a 400 in the route's shape,
and steward stays up.

Before: one keyless request on the default loopback set-up stopped steward. A lone UTF-16
surrogate in a JSON string (``"\\ud800"``: valid JSON, not encodable as UTF-8) in ``model``
on the Ollama listener reached the usage writer, whose ``UnicodeEncodeError`` ended the
process (``/livez`` refused after it); in an image prompt it was a 500. Now such a body is
refused at the edge of every JSON route (``safe_text.py``), and whatever is only recorded is
escaped, so the usage row of the refusal is written too.

One real steward for the module (slow): a fake llama-server, an image model, a supervised
fake Ollama and a supervised fake ComfyUI.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import attrs
import httpx
import pytest

from fakes import simgpu
from supervisor.units import parse_size
from tests.conftest import RunningSteward, fake_model, free_port, launch_steward
from tests.fake_processes import wait_until

SURROGATE = "\\ud800"  # as JSON writes it: six ASCII characters
OLLAMA_MODEL = "gemma3:4b,size=2GiB,load=0.1s,tps=200"
GRAPH = {"3": {"class_type": "KSampler", "inputs": {"seed": "{{seed}}", "steps": 1, "fake_seconds": 0.05}},
         "9": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "{{prompt}}"}}}


@attrs.frozen
class Listeners:
    steward: RunningSteward
    openai: str
    ollama: str
    usage_db: Path


@pytest.fixture(scope="module")
def listeners(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Listeners]:
    run_dir = tmp_path_factory.mktemp("hostile-text")
    gpu = simgpu.create_device(run_dir / "gpu", total_bytes=parse_size("16GiB"), linger_s=0.05)
    workflow = run_dir / "sketch.json"
    workflow.write_text(json.dumps(GRAPH))
    comfy_port, ollama_port = free_port(), free_port()
    registry: list[RunningSteward] = []
    launch_steward(
        run_dir, {"chat": fake_model("2GiB", gpu_dir=gpu),
                  "sketch": {"runtime": "comfyui", "workflow": str(workflow), "size": "32x32"}}, registry,
        gpu={"probe": "simulated", "simulated_dir": str(gpu), "poll_interval": "0.1s"},
        usage={"db": str(run_dir / "usage.db")},
        ollama={"upstream": f"127.0.0.1:{ollama_port}", "listen": f"127.0.0.1:{free_port()}", "memory": "2GiB",
                "ps_poll": "0.2s", "retry_initial": "0.1s", "retry_max": "0.5s",
                "command": [sys.executable, "-m", "fakes.ollama", "--port", str(ollama_port), "--model",
                            OLLAMA_MODEL, "--sim-gpu", str(gpu)]},
        comfyui={"upstream": f"127.0.0.1:{comfy_port}", "history_poll": "0.1s", "free_timeout": "5s",
                 "retry_initial": "0.1s", "retry_max": "0.5s",
                 "command": [sys.executable, "-m", "fakes.comfyui", "--port", str(comfy_port), "--sim-gpu",
                             str(gpu), "--model-memory", "4GiB", "--job-time", "0.1s", "--free-delay", "0.05s"]})
    steward = registry[0]
    try:
        listening = steward.wait_event("listening")
        found = Listeners(steward, listening["urls"][0], listening["ollama"][0], run_dir / "usage.db")
        wait_until(lambda: _answers(f"{found.ollama}/api/version"), timeout=60)
        yield found
    finally:
        assert steward.stop() == 0


@pytest.fixture(autouse=True)
def no_leaked_children() -> Iterator[None]:
    yield  # the module's steward lives across tests (conftest's per-test check would kill it); it stops cleanly


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def post_raw(url: str, text: str) -> httpx.Response:
    """*text* is the body as it goes on the wire (JSON escapes and all)."""
    return httpx.post(url, content=text.encode(), headers={"content-type": "application/json"}, timeout=30)


def still_up(found: Listeners) -> None:
    assert found.steward.process.poll() is None, "steward exited"
    assert httpx.get(f"{found.openai}/livez", timeout=10).status_code == 200
    assert httpx.get(f"{found.ollama}/livez", timeout=10).status_code == 200


@pytest.mark.slow
@pytest.mark.parametrize(("path", "body"), [
    ("/api/chat", '{"model": "x%s", "messages": []}'),
    ("/api/embed", '{"model": "x%s", "input": "hi"}'),
    ("/api/generate", '{"model": "gemma3:4b", "prompt": "hi %s"}'),
])
def test_a_lone_surrogate_on_ollamas_own_routes_is_a_400_in_ollamas_shape(listeners: Listeners, path: str,
                                                                         body: str) -> None:
    answer = post_raw(listeners.ollama + path, body % SURROGATE)
    assert answer.status_code == 400, answer.text
    assert set(answer.json()) == {"error"} and "lone UTF-16 surrogate" in answer.json()["error"]
    still_up(listeners)


@pytest.mark.slow
@pytest.mark.parametrize(("listener", "path", "body", "param"), [
    ("ollama", "/v1/chat/completions", '{"model": "x%s", "messages": []}', "model"),
    ("openai", "/v1/chat/completions", '{"model": "chat", "messages": [{"role": "user", "content": "a%sb"}]}',
     "messages.0.content"),
    ("openai", "/v1/embeddings", '{"model": "chat", "input": ["ok", "%s"]}', "input.1"),
    ("openai", "/v1/images/generations", '{"model": "sketch", "prompt": "a cat %s"}', "prompt"),
])
def test_a_lone_surrogate_on_an_openai_route_is_a_400_in_openais_shape(listeners: Listeners, listener: str,
                                                                      path: str, body: str, param: str) -> None:
    base = listeners.ollama if listener == "ollama" else listeners.openai
    answer = post_raw(base + path, body % SURROGATE)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["param"], error["type"]) == ("invalid_unicode", param, "invalid_request_error")
    still_up(listeners)


@pytest.mark.slow
def test_a_surrogate_pair_is_text_like_any_other(listeners: Listeners) -> None:
    answer = post_raw(f"{listeners.openai}/v1/chat/completions",
                      '{"model": "chat", "max_tokens": 2, "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}')
    assert answer.status_code == 200, answer.text


@pytest.mark.slow
def test_every_refusal_of_hostile_text_has_its_usage_row(listeners: Listeners) -> None:
    before = len(_rows(listeners.usage_db))
    answer = post_raw(f"{listeners.ollama}/api/chat", '{"model": "x%s", "messages": []}' % SURROGATE)
    assert answer.status_code == 400

    def ours() -> list[tuple[str, int, str | None]]:  # the earlier tests' rows may still be on their way
        return [row for row in _rows(listeners.usage_db)[before:] if row[0] == "/api/chat"]

    wait_until(ours, timeout=30)
    assert ours() == [("/api/chat", 400, "invalid_unicode")]
    still_up(listeners)


def _rows(path: Path) -> list[tuple[str, int, str | None]]:
    if not path.exists():
        return []
    with closing(sqlite3.connect(path)) as connection:
        return connection.execute("SELECT route, status, error FROM requests ORDER BY rowid").fetchall()
