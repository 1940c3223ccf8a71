"""The front door in a real steward: keys with the official clients, what a key limits,
keys added and removed while it runs, the refusal to listen beyond loopback without a key,
and one usage row per request, rejected ones included.

Engines are the fake llama-server and the fake Ollama (real processes); the callers are the
official `openai` and `ollama` clients where a client is the point, httpx elsewhere.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest
import yaml

from supervisor.auth.keys import add_key
from supervisor.nodes.state import parse_node_state
from tests.conftest import ROOT, RunningSteward, StewardFactory, fake_model, free_port
from tests.test_ollama_listener import listener as ollama_listener
from tests.test_ollama_listener import ollama_section

pytestmark = pytest.mark.slow
GPU = {"probe": "none", "budget": "16GiB"}
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


def keyed_steward(start_steward: StewardFactory, tmp_path: Path, keys: dict[str, dict[str, Any]],
                  models: dict[str, Any] | None = None, **sections: Any) -> tuple[RunningSteward, dict[str, str]]:
    """A steward whose key file holds *keys* (name -> add_key options); returns the key texts too."""
    keys_file = tmp_path / "keys.json"
    texts = {name: add_key(keys_file, name, known_models=["chat", "small", "gpt-4o"], ollama=True, **options)
             for name, options in keys.items()}
    models = models if models is not None else {"chat": fake_model("1GiB", aliases=["gpt-4o"]),
                                                "small": fake_model("1GiB")}
    steward = start_steward(models, gpu=GPU, auth={"keys_file": str(keys_file), "reload_interval": "0.05s"},
                            usage={"db": str(tmp_path / "usage.db")}, **sections)
    return steward, texts


def usage_rows(db: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(db) as connection:
        connection.row_factory = sqlite3.Row
        return [dict(row) for row in connection.execute("SELECT * FROM requests ORDER BY ts")]


def test_the_official_clients_with_a_key_and_without(start_steward: StewardFactory, tmp_path: Path) -> None:
    steward, keys = keyed_steward(start_steward, tmp_path, {"family": {}},
                                  ollama=ollama_section(free_port()))
    client = openai.OpenAI(base_url=steward.base_url, api_key=keys["family"], max_retries=0)
    assert client.chat.completions.create(**CHAT).choices[0].message.content
    chunks = list(client.chat.completions.create(**CHAT, stream=True))
    assert chunks and all(chunk.choices for chunk in chunks)  # the usage chunk steward asked for is kept
    assert [m.id for m in client.models.list()] == ["chat", "small", "gpt-4o"]
    with pytest.raises(openai.AuthenticationError) as refused:
        openai.OpenAI(base_url=steward.base_url, api_key="sk-steward-not-a-key", max_retries=0).models.list()
    assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
    bare = httpx.post(f"{steward.base_url}/chat/completions", json=CHAT, timeout=30)
    assert bare.status_code == 401 and bare.headers["www-authenticate"].startswith("Bearer")
    assert bare.json()["error"]["code"] == "invalid_api_key"  # OpenAI's error object
    anthropic_style = httpx.post(f"{steward.base_url}/chat/completions", json=CHAT, timeout=30,
                                 headers={"x-api-key": keys["family"]})
    assert anthropic_style.status_code == 200

    url = ollama_listener(steward)
    keyed = ollama.Client(host=url, headers={"Authorization": f"Bearer {keys['family']}"})
    assert keyed.chat(model="gemma3:4b", messages=[{"role": "user", "content": "hi"}]).message.content
    assert keyed.list().models  # passthrough routes need the key too
    with pytest.raises(ollama.ResponseError) as refused_ollama:
        ollama.Client(host=url).chat(model="gemma3:4b", messages=[{"role": "user", "content": "hi"}])
    assert refused_ollama.value.status_code == 401
    with pytest.raises(ollama.ResponseError) as pull:
        keyed.pull("other:1b")  # changes Ollama's models: an admin key's business
    assert pull.value.status_code == 403
    via_v1 = openai.OpenAI(base_url=f"{url}/v1", api_key=keys["family"], max_retries=0)
    streamed = list(via_v1.chat.completions.create(model="gemma3:4b", messages=[{"role": "user", "content": "x"}],
                                                   max_tokens=3, stream=True))
    assert streamed and all(chunk.choices for chunk in streamed)  # Ollama's usage chunk is kept from it too
    assert httpx.get(f"{steward.url}/livez").json() == {"status": "alive"}  # monitors need no key
    assert httpx.get(f"{steward.url}/healthz").json()["status"] == "ok"
    assert httpx.get(f"{steward.url}/metrics").status_code == 401
    metrics = httpx.get(f"{steward.url}/metrics", headers={"authorization": f"Bearer {keys['family']}"}).text
    assert 'steward_requests_total{class="interactive",key="family",listener="openai",status="200"}' in metrics
    assert 'steward_rejected_total{class="",reason="invalid_api_key"}' in metrics  # the door's refusals count
    steward.stop()  # every usage row written
    ollama_rows = [row for row in usage_rows(tmp_path / "usage.db") if row["listener"] == "ollama"]
    assert [(row["route"], row["status"]) for row in ollama_rows] == [
        ("/api/chat", 200), ("/api/tags", 200), ("/api/chat", 401), ("/api/pull", 403), ("/v1/chat/completions", 200)]
    assert ollama_rows[0]["completion_tokens"] and ollama_rows[-1]["completion_tokens"] == 3
    for family in ('steward_waiting{class="interactive",engine="ollama"}', "steward_oldest_wait_seconds",
                   'steward_ledger_bytes{device="cpu",tier="cold"}', 'steward_engine_state{engine="chat",state="ready"} 1.0',
                   'steward_health_status{status="ok"} 1.0', 'steward_tokens_total{kind="completion",model="chat"}',
                   "steward_time_to_first_token_seconds_bucket", "steward_tokens_per_second",
                   'steward_dispatched_total{class="interactive"}', "steward_waited_share"):
        assert family in metrics, family


def test_what_a_key_limits(start_steward: StewardFactory, tmp_path: Path) -> None:
    steward, keys = keyed_steward(start_steward, tmp_path, {
        "agents": {"models": ["gpt-4o"], "classes": ["background", "batch"], "rpm": 3},
        "solo": {"concurrency": 1}})
    agents = openai.OpenAI(base_url=steward.base_url, api_key=keys["agents"], max_retries=0)
    assert [m.id for m in agents.models.list()] == ["chat", "gpt-4o"]  # only what it may use (and aliases)
    assert agents.chat.completions.create(**{**CHAT, "model": "gpt-4o"}).choices  # an alias of an allowed model
    assert steward.events("dispatch")[-1]["class"] == "background"  # the key's default class
    with pytest.raises(openai.PermissionDeniedError) as model_refused:
        agents.chat.completions.create(**{**CHAT, "model": "small"})
    assert model_refused.value.code == "model_not_allowed"
    with pytest.raises(openai.PermissionDeniedError) as class_refused:
        agents.chat.completions.create(**CHAT, extra_headers={"X-Steward-Class": "interactive"})
    assert "background, batch" in class_refused.value.message
    agents.chat.completions.create(**CHAT, extra_body={"steward": {"class": "batch"}})
    agents.chat.completions.create(**CHAT)  # the third it may make within a minute (refused ones do not count)
    with pytest.raises(openai.RateLimitError) as rate:
        agents.chat.completions.create(**CHAT)
    assert rate.value.code == "rate_limited" and int(rate.value.response.headers["retry-after"]) >= 1

    solo = {"authorization": f"Bearer {keys['solo']}"}
    slow = {**CHAT, "max_tokens": 2000, "stream": True}
    with httpx.Client(timeout=30) as http, http.stream("POST", f"{steward.base_url}/chat/completions", json=slow,
                                                        headers=solo) as held:
        assert held.status_code == 200
        chunks = held.iter_bytes()  # kept: a generator dropped would close the stream
        next(chunks)  # its first chunk: it runs
        second = http.post(f"{steward.base_url}/chat/completions", json=CHAT, headers=solo)
        assert second.status_code == 429 and second.json()["error"]["code"] == "concurrency_limited"
    assert httpx.post(f"{steward.base_url}/chat/completions", json=CHAT, headers=solo, timeout=30).status_code == 200
    refused = {(e["reason"], e["key"]) for e in steward.events("refused")}
    assert refused >= {("model_not_allowed", "agents"), ("class_not_allowed", "agents"),
                       ("rate_limited", "agents"), ("concurrency_limited", "solo")}


def steward_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_keys_added_and_removed_while_steward_runs(start_steward: StewardFactory, tmp_path: Path) -> None:
    steward, keys = keyed_steward(start_steward, tmp_path, {"old": {}}, comfyui={
        "upstream": f"127.0.0.1:{free_port()}", "listen": f"127.0.0.1:{free_port()}"})
    config = str(steward.events_path.parent / "config.yaml")
    added = steward_cli("keys", "add", "ops", "--config", config, "--admin")
    assert added.returncode == 0, added.stderr
    new_key = added.stdout.strip()
    steward.wait_event("keys_loaded", added=["ops"])
    ops = {"authorization": f"Bearer {new_key}"}
    assert httpx.post(f"{steward.base_url}/chat/completions", json=CHAT, headers=ops, timeout=30).status_code == 200
    comfy = steward.wait_event("listening")["comfyui"][0]
    old = {"authorization": f"Bearer {keys['old']}"}
    assert httpx.post(f"{comfy}/steward/release", headers=old).status_code == 403  # admin keys alone
    assert httpx.post(f"{comfy}/steward/release", headers=ops).json() == {"released": 0}
    assert httpx.get(f"{steward.url}/steward/state", headers=old).status_code == 403
    assert httpx.get(f"{steward.url}/admin/state", headers=old).status_code == 403
    assert httpx.post(f"{steward.url}/admin/engines/chat/pin", headers=old).status_code == 403
    assert httpx.get(f"{steward.url}/admin/state", headers=ops).json()["version"] == 1
    state = parse_node_state(httpx.get(f"{steward.url}/steward/state", headers=ops).json())  # what a front door reads
    assert {m.name for m in state.models} == {"chat", "small"} and state.model("gpt-4o") == state.model("chat")
    assert state.model("chat").resident and state.health == "ok"  # type: ignore[union-attr]
    removed = steward_cli("keys", "remove", "old", "--config", config)
    assert removed.returncode == 0, removed.stderr
    steward.wait_event("keys_loaded", removed=["old"])
    assert httpx.post(f"{steward.base_url}/chat/completions", json=CHAT, headers=old, timeout=30).status_code == 401
    listed = steward_cli("keys", "list", "--config", config)
    assert "ops" in listed.stdout and "old" not in listed.stdout
    # No key is ever written in clear: not in the event log, the usage log or the terminal.
    steward.stop()
    for path in (steward.events_path, steward.stderr_path, tmp_path / "usage.db", tmp_path / "keys.json"):
        content = path.read_bytes()
        assert new_key.encode() not in content and keys["old"].encode() not in content, path


def exposed_config(tmp_path: Path, port: int, **auth: Any) -> Path:
    config = {"listen": f"0.0.0.0:{port}", "models": {"chat": fake_model("1GiB")}, "gpu": GPU,
              "log": {"file": "events.jsonl"}, "auth": auth}
    path = tmp_path / "exposed.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_listening_beyond_loopback_without_a_key_refuses_to_start(tmp_path: Path) -> None:
    config = exposed_config(tmp_path, free_port())
    for command in ("run", "check"):
        refused = steward_cli(command, str(config))
        assert refused.returncode == 2, refused.stderr
        assert "auth.keys_file" in refused.stderr and "steward keys add" in refused.stderr
        assert "auth.allow_unauthenticated" in refused.stderr


def test_listening_beyond_loopback_with_a_key_or_deliberately_open(tmp_path: Path) -> None:
    port = free_port()
    config = exposed_config(tmp_path, port)
    key = add_key(tmp_path / "steward-keys.json", "lab")  # the default key file, beside the config
    assert steward_cli("check", str(config)).returncode == 0
    process = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "run", str(config)], cwd=ROOT,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_listening(tmp_path / "events.jsonl", process)
        assert httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=30).status_code == 401
        ok = httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=30,
                        headers={"authorization": f"Bearer {key}"})
        assert ok.status_code == 200
    finally:
        process.terminate()
        assert process.wait(30) == 0
    (tmp_path / "steward-keys.json").unlink()
    open_config = exposed_config(tmp_path, free_port(), allow_unauthenticated=True)
    checked = steward_cli("check", str(open_config))
    assert checked.returncode == 0 and "allow_unauthenticated" in checked.stdout


def wait_for_listening(events: Path, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, "steward exited"
        if events.exists() and b'"event":"listening"' in events.read_bytes():
            return
        time.sleep(0.05)
    raise AssertionError("steward did not start")


def test_one_usage_row_per_request_rejected_ones_too(start_steward: StewardFactory, tmp_path: Path) -> None:
    steward, keys = keyed_steward(start_steward, tmp_path, {"family": {}, "agents": {"classes": ["batch"]}})
    family = {"authorization": f"Bearer {keys['family']}"}
    sent: list[int] = []
    with httpx.Client(base_url=steward.base_url, timeout=30) as http:
        sent.append(http.post("/chat/completions", json=CHAT, headers=family).status_code)
        with http.stream("POST", "/chat/completions", json={**CHAT, "stream": True}, headers=family) as stream:
            sent.append(stream.status_code)
            stream.read()
        sent.append(http.post("/chat/completions", json=CHAT).status_code)  # no key
        sent.append(http.post("/chat/completions", json={**CHAT, "model": "nope"}, headers=family).status_code)
        sent.append(http.post("/chat/completions", content=b"{not json", headers=family).status_code)
        sent.append(http.post("/chat/completions", json=CHAT, headers={
            "authorization": f"Bearer {keys['agents']}", "X-Steward-Class": "interactive"}).status_code)
        with http.stream("POST", "/chat/completions", headers=family,
                         json={**CHAT, "max_tokens": 4000, "stream": True}) as left:
            next(left.iter_bytes())  # the client leaves mid-answer
        sent.append(499)
    assert sent == [200, 200, 401, 404, 400, 403, 499]
    steward.stop()  # every row is written by the time steward has exited
    rows = usage_rows(tmp_path / "usage.db")
    assert [row["status"] for row in rows] == sent
    assert [row["key"] for row in rows] == ["family", "family", None, "family", "family", "agents", "family"]
    assert [row["error"] for row in rows] == [None, None, "invalid_api_key", "model_not_found",
                                              "invalid_request_error", "class_not_allowed", "client_left"]
    plain, streamed = rows[0], rows[1]
    assert (plain["prompt_tokens"], plain["completion_tokens"]) == (streamed["prompt_tokens"], 4)
    assert streamed["completion_tokens"] == 4  # from the usage chunk steward asked the stream for
    assert plain["engine"] == "chat" and plain["class"] == "interactive" and plain["queued_s"] >= 0
    assert plain["ttft_s"] <= plain["duration_s"] and plain["response_bytes"] > 0 and plain["request_bytes"] > 0
    assert len({row["request_id"] for row in rows}) == len(rows)
    report = steward_cli("usage", "--db", str(tmp_path / "usage.db"), "--by", "status")
    assert report.returncode == 0 and "499" in report.stdout


def test_a_refusal_sent_before_the_body_arrived_says_the_connection_closes(start_steward: StewardFactory,
                                                                            tmp_path: Path) -> None:
    """Steward answers a request without a key before reading its body; the connection cannot carry
    another request until that body was read, so the answer must say it closes (a client whose
    body went in a second packet reused the closed connection: "Server disconnected", seen in CI)."""
    import socket

    steward, keys = keyed_steward(start_steward, tmp_path, {"family": {}})
    host, _, port = steward.url.removeprefix("http://").rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n".encode())  # the body never comes
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(65536)
    lines = head.split(b"\r\n\r\n")[0].lower().split(b"\r\n")
    assert lines[0].startswith(b"http/1.1 401") and b"connection: close" in lines
    # Without a body the connection stays open for the next request.
    with httpx.Client(base_url=steward.base_url, timeout=30) as http:
        refused = http.get("/models")
        assert refused.status_code == 401 and "close" not in refused.headers.get("connection", "")
        assert http.get("/models", headers={"authorization": f"Bearer {keys['family']}"}).status_code == 200


def test_a_spent_budget_is_refused_until_it_resets_and_across_a_restart(start_steward: StewardFactory,
                                                                         tmp_path: Path) -> None:
    steward, keys = keyed_steward(start_steward, tmp_path, {"capped": {"budgets": {"requests_per_day": 2}}})
    client = openai.OpenAI(base_url=steward.base_url, api_key=keys["capped"], max_retries=0)
    for number in range(1, 3):
        assert client.chat.completions.create(**CHAT).choices
        _wait_requests(steward, number)  # counted when its usage row is recorded, at the answer's end
    with pytest.raises(openai.RateLimitError) as spent:
        client.chat.completions.create(**CHAT)
    assert spent.value.code == "budget_exhausted"
    assert "requests_per_day 2 of key capped used: 2; resets at " in spent.value.message
    assert 1 <= int(spent.value.response.headers["retry-after"]) <= 86400
    messages = httpx.post(f"{steward.base_url}/messages", timeout=30, headers={"x-api-key": keys["capped"]},
                          json={"model": "chat", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    assert messages.status_code == 429 and 1 <= int(messages.headers["retry-after"]) <= 86400
    assert messages.json()["type"] == "error" and messages.json()["error"]["type"] == "rate_limit_error"
    assert "requests_per_day 2 of key capped" in messages.json()["error"]["message"]
    # The event log is written by its own task: the second refusal's line may come a moment after the answer.
    deadline = time.monotonic() + 10
    while len(refusals := [e["reason"] for e in steward.events("refused")]) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert refusals == ["budget_exhausted", "budget_exhausted"]
    metrics = httpx.get(f"{steward.url}/metrics", headers={"authorization": f"Bearer {keys['capped']}"}).text
    assert 'reason="budget_exhausted"} 2.0' in metrics
    steward.stop()

    config = str(steward.events_path.parent / "config.yaml")
    report = steward_cli("usage", "--config", config, "--budgets", "--json")
    assert report.returncode == 0, report.stderr
    (standing,) = json.loads(report.stdout)["budgets"]
    assert (standing["key"], standing["budget"], standing["used"], standing["left"]) == (
        "capped", "requests_per_day", 2, 0)
    # A restart: the new steward reads what the key used today from the usage log.
    again = start_steward({"chat": fake_model("1GiB")}, gpu=GPU, usage={"db": str(tmp_path / "usage.db")},
                          auth={"keys_file": str(tmp_path / "keys.json")})
    refused = httpx.post(f"{again.base_url}/chat/completions", json=CHAT, timeout=30,
                         headers={"authorization": f"Bearer {keys['capped']}"})
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "budget_exhausted"


def _wait_requests(steward: RunningSteward, count: int) -> None:
    """Until *count* served requests were recorded (the request event comes with the usage row)."""
    deadline = time.monotonic() + 10
    while len([e for e in steward.events("request") if e["status"] == 200]) < count:
        assert time.monotonic() < deadline, "the requests were not recorded"
        time.sleep(0.02)
