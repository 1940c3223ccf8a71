"""Reloading a running steward's config (SIGHUP, `steward reload`, POST /admin/reload) with
requests in flight: real steward, fake llama-servers, the official OpenAI client."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from supervisor.observe.events import read_event_log
from tests.conftest import ROOT, RunningSteward, StewardFactory, fake_model, free_port
from tests.fake_processes import wait_until

pytestmark = pytest.mark.slow  # every test here starts steward as a real process

CHAT = {"messages": [{"role": "user", "content": "hello"}]}


def config_path(steward: RunningSteward) -> Path:
    return steward.events_path.parent / "config.yaml"


def rewrite(steward: RunningSteward, change: Any) -> None:
    path = config_path(steward)
    raw = yaml.safe_load(path.read_text())
    change(raw)
    path.write_text(yaml.safe_dump(raw))


def reload(steward: RunningSteward) -> httpx.Response:
    return httpx.post(f"{steward.url}/admin/reload", timeout=60)


def stream_in_thread(steward: RunningSteward, model: str, into: list[str], started: threading.Event) -> threading.Thread:
    def run() -> None:
        client = openai.OpenAI(base_url=steward.base_url, api_key="none", max_retries=0)
        for chunk in client.chat.completions.create(model=model, max_tokens=60, stream=True, **CHAT):
            started.set()
            if chunk.choices and chunk.choices[0].delta.content:
                into.append(chunk.choices[0].delta.content)
        into.append("<end>")

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def spawned(steward: RunningSteward, engine: str) -> list[list[str]]:
    return [e["argv"] for e in steward.events("spawn") if e["engine"] == engine]


def test_a_stream_keeps_streaming_across_a_reload_of_its_siblings(start_steward: StewardFactory) -> None:
    steward = start_steward({"a": fake_model("2GiB", tps=30), "b": fake_model("2GiB")},
                            gpu={"probe": "none", "budget": "16GiB"})
    client = openai.OpenAI(base_url=steward.base_url, api_key="none", max_retries=0)
    client.chat.completions.create(model="b", max_tokens=2, **CHAT)  # b is loaded
    words: list[str] = []
    started = threading.Event()
    streaming = stream_in_thread(steward, "a", words, started)
    assert started.wait(30)

    def change(raw: dict[str, Any]) -> None:
        raw["models"]["b"] = fake_model("3GiB")  # changed: drained and restarted with the new args
        raw["models"]["c"] = fake_model("1GiB", aliases=["sea"])  # added
    rewrite(steward, change)
    outcome = reload(steward)
    assert outcome.status_code == 200, outcome.text
    assert (outcome.json()["added"], outcome.json()["changed"], outcome.json()["unchanged"]) == (["c"], ["b"], ["a"])
    assert words[-1:] != ["<end>"]  # still streaming while the reload happened
    assert client.chat.completions.create(model="sea", max_tokens=2, **CHAT).choices[0].message.content
    assert client.chat.completions.create(model="b", max_tokens=2, **CHAT).choices[0].message.content
    assert ["--memory", "3GiB"] == spawned(steward, "b")[-1][spawned(steward, "b")[-1].index("--memory"):][:2]
    streaming.join(60)
    assert words[-1] == "<end>" and len(words) > 40  # the whole answer, not cut
    assert [e["engine"] for e in steward.events("spawn")].count("a") == 1  # a was never restarted


def test_a_reload_that_changes_a_models_own_engine_drains_it_first(start_steward: StewardFactory) -> None:
    steward = start_steward({"a": fake_model("2GiB", tps=30)}, gpu={"probe": "none", "budget": "16GiB"})
    words: list[str] = []
    started = threading.Event()
    streaming = stream_in_thread(steward, "a", words, started)
    assert started.wait(30)
    rewrite(steward, lambda raw: raw["models"].update(a=fake_model("3GiB", tps=30)))
    outcome = reload(steward).json()
    assert outcome["changed"] == ["a"]
    # What changed, per model, in the answer and in the event.
    assert outcome["changes"] == {"a": [
        "memory: 2.0 GiB -> 3.0 GiB",
        'args: ["--memory", "2GiB", "--load-time", "0.2s", "--tokens-per-second", "30"] -> '
        '["--memory", "3GiB", "--load-time", "0.2s", "--tokens-per-second", "30"]']}
    assert steward.wait_event("reload")["changes"] == outcome["changes"]
    # A request sent while the old engine drains waits for the new one.
    later = httpx.post(f"{steward.base_url}/chat/completions", json={"model": "a", "max_tokens": 2, **CHAT},
                       timeout=60)
    streaming.join(60)
    assert words[-1] == "<end>" and len(words) > 40  # the stream in flight finished on the old engine
    assert later.status_code == 200
    first, second = spawned(steward, "a")
    assert "2GiB" in first and "3GiB" in second
    stopped = steward.wait_event("stopped", engine="a")
    new_spawn = [e for e in steward.events("spawn") if e["engine"] == "a"][-1]
    assert stopped["mono"] < new_spawn["mono"]  # the old one stopped before the new one started


def test_a_removed_model_is_gone_and_a_bad_config_is_refused_with_the_old_one_kept(
        start_steward: StewardFactory) -> None:
    steward = start_steward({"a": fake_model("2GiB"), "gone": fake_model("2GiB")},
                            gpu={"probe": "none", "budget": "16GiB"})
    path = config_path(steward)
    good = path.read_text()
    rewrite(steward, lambda raw: raw["models"]["a"].update(memory="lots"))
    refused = subprocess.run([sys.executable, "-m", "supervisor.cli", "reload", str(path)], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    problem = "models.a.memory: must be a size like 16GiB or 8.3GB, got 'lots'"
    assert refused.returncode == 2 and problem in refused.stderr, refused.stderr  # `check`'s words
    told = reload(steward)  # the running steward refuses it the same way
    assert told.status_code == 422 and told.json()["problems"] == [problem]
    assert steward.wait_event("reload_refused")["problems"] == [problem]
    path.write_text(good)
    rewrite(steward, lambda raw: raw.update(listen="127.0.0.1:1"))
    assert reload(steward).json()["problems"][0].startswith("listen: changed, and it needs a restart")
    path.write_text(good)
    rewrite(steward, lambda raw: raw["models"].pop("gone"))
    steward.process.send_signal(signal.SIGHUP)  # no terminal: SIGHUP is a reload
    assert steward.wait_event("reload")["removed"] == ["gone"]
    wait_until(lambda: "gone" not in [m["id"] for m in httpx.get(f"{steward.base_url}/models").json()["data"]])
    missing = httpx.post(f"{steward.base_url}/chat/completions", json={"model": "gone", **CHAT}, timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    answered = httpx.post(f"{steward.base_url}/chat/completions", json={"model": "a", "max_tokens": 2, **CHAT},
                          timeout=30)
    assert answered.status_code == 200  # the old config's model, unchanged, still served
    assert steward.process.poll() is None


def test_the_hangup_of_its_own_terminal_stops_steward_with_a_drain(tmp_path: Path) -> None:
    """tmux kill-session sends SIGHUP as the pane's terminal goes: that is a stop, not a reload."""
    events_path = tmp_path / "events.jsonl"
    port = free_port()
    config = {"listen": f"127.0.0.1:{port}", "models": {"a": fake_model("1GiB")},
              "gpu": {"probe": "none", "budget": "4GiB"}, "log": {"file": str(events_path)},
              "state_file": str(tmp_path / "state.json")}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    tmux = ["tmux", "-L", f"hangup-{os.getpid()}"]
    command = f"{sys.executable} -m supervisor.cli run {tmp_path / 'config.yaml'}"
    subprocess.run([*tmux, "new-session", "-d", "-s", "steward", "-x", "120", "-y", "30", "-c", str(ROOT), command],
                   check=True, timeout=30)
    try:
        wait_until(lambda: events_path.exists() and any(e["event"] == "listening" for e in read_event_log(events_path)),
                   timeout=30)
        assert httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"model": "a", "max_tokens": 2, **CHAT},
                          timeout=30).status_code == 200
        pid = [e for e in read_event_log(events_path) if e["event"] == "spawn"][-1]["pid"]
        subprocess.run([*tmux, "kill-session", "-t", "steward"], check=True, timeout=30)
        wait_until(lambda: any(e["event"] == "shutdown_complete" for e in read_event_log(events_path)), timeout=60)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=30)
    names = [e["event"] for e in read_event_log(events_path)]
    assert "shutdown" in names and "reload" not in names  # drained, not reloaded
    assert [e for e in read_event_log(events_path) if e["event"] == "exit"][-1]["requested"] is True
    wait_until(lambda: not Path(f"/proc/{pid}").exists())  # its engine stopped with it
