"""Runtime openai through a real steward, against the fake vLLM (fakes/openai_server): what the
CPU build of vLLM cannot show — sleep that frees GPU memory, memory held in a child process,
a wake that fails — plus attaching, always-on, ${PORT}, idle unload and the engine's own load.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from fakes import simgpu
from tests.conftest import StewardFactory, fake_model, free_port, stop_process

pytestmark = pytest.mark.slow  # every test here starts steward as a real process

GIB = 1024**3


def fake_vllm(name: str, gpu: Path, memory: str = "6GiB", *extra: str) -> list[str]:
    return [sys.executable, "-m", "fakes.openai_server", "--port", "${PORT}", "--served-model-name", name,
            "--memory", memory, "--sim-gpu", str(gpu), "--memory-in-child", "--wake-delay", "0.1", *extra]


def shared(gpu: Path, *extra: str, **config: Any) -> dict[str, Any]:
    return {"runtime": "openai", "command": fake_vllm("shared", gpu, "6GiB", *extra), "memory": "6GiB",
            "parallel": 4, "env": {"VLLM_SERVER_DEV_MODE": "1"}, **config}


def ask(url: str, model: str, max_tokens: int = 4) -> httpx.Response:
    return httpx.post(f"{url}/chat/completions", timeout=60,
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens})


def held(gpu: Path) -> dict[int, int]:
    return simgpu.SimulatedDevice(gpu).read(time.monotonic()).processes


def wait_until(check: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what} within {timeout:g}s"
        time.sleep(0.05)
    return value


def test_memory_held_in_a_child_process_is_the_engines(start_steward: StewardFactory, sim_gpu: Any) -> None:
    gpu = sim_gpu("16GiB")
    steward = start_steward({"shared": shared(gpu, always_on=True)},
                            gpu={"probe": "simulated", "simulated_dir": str(gpu), "poll_interval": "0.1s"})
    ready = steward.wait_event("ready", engine="shared")
    pid = steward.engine_pid("shared")
    assert str(free_port()) and ready["endpoint"].startswith("http://127.0.0.1:")
    holders = wait_until(lambda: held(gpu), "the fake registered its memory")
    assert pid not in holders  # the memory is in its child, as vLLM's is
    engine = wait_until(lambda: (e := steward.health()["engines"]["shared"])["measured"] and e,
                        "a measurement over the process tree")
    assert engine["measured"] == 6 * GIB and steward.health()["reserved"] == 6 * GIB
    assert not steward.events("evict")  # not mistaken for outside use
    assert steward.health()["engines"]["shared"]["pinned"] is True


def test_evicting_a_sleeping_engine_puts_it_to_sleep_and_the_next_request_wakes_it(
        start_steward: StewardFactory, sim_gpu: Any) -> None:
    gpu = sim_gpu("10GiB")
    steward = start_steward(
        {"shared": shared(gpu, "--sleep-memory", "0.5GiB", sleep={"level": 1}),
         "chat": fake_model("6GiB", gpu_dir=gpu)},
        gpu={"probe": "simulated", "simulated_dir": str(gpu), "poll_interval": "0.1s"}, scheduler={"hot_window": "0s"})
    # Its kept process holds its 6 GiB from the start: reserved for it, not outside use (which
    # made its own first load wait for room its process held, until the request timed out).
    unloaded = steward.wait_event("measured", engine="shared")
    assert unloaded["loaded"] is False and unloaded["measured"] == 6 * GIB
    assert ask(steward.base_url, "shared").status_code == 200
    process_pid = steward.engine_pid("shared")
    assert ask(steward.base_url, "chat").status_code == 200  # 6 + 6 > 10: shared must make room
    asleep = steward.wait_event("asleep", engine="shared")
    assert asleep["detail"] == "asleep (level 1)"
    # What it holds asleep is measured and becomes its reservation (no sleep.memory set).
    wait_until(lambda: steward.health()["engines"]["shared"]["reserved"] == GIB // 2, "the sleeping reservation")
    assert steward.health()["engines"]["shared"]["status"] == "sleeping"
    assert [e["engine"] for e in steward.events("spawn")].count("shared") == 1  # its process stayed
    assert ask(steward.base_url, "shared").status_code == 200  # woken (chat evicted for the rest)
    steward.wait_event("woken", engine="shared")
    assert steward.wait_event("wake", engine="shared")["memory"] == 6 * GIB
    assert steward.engine_pid("shared") == process_pid and sum(held(gpu).values()) <= 10 * GIB


def test_a_wake_that_fails_is_reported_and_the_engine_is_restarted(start_steward: StewardFactory,
                                                                   sim_gpu: Any) -> None:
    gpu = sim_gpu("10GiB")
    steward = start_steward(
        {"shared": shared(gpu, "--wake-fails", sleep={"level": 2, "memory": "0.5GiB"}),
         "chat": fake_model("6GiB", gpu_dir=gpu)},
        gpu={"probe": "simulated", "simulated_dir": str(gpu), "poll_interval": "0.1s"}, scheduler={"hot_window": "0s"})
    assert ask(steward.base_url, "shared").status_code == 200
    first = steward.engine_pid("shared")
    assert ask(steward.base_url, "chat").status_code == 200
    steward.wait_event("asleep", engine="shared")
    refused = ask(steward.base_url, "shared")  # like any failed start: a clean error, not a hang
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_start_failed"
    failed = steward.wait_event("wake_failed", engine="shared")
    assert "500" in failed["detail"]
    assert steward.wait_event("crash", engine="shared")["detail"].startswith("its process could not be woken")
    assert ask(steward.base_url, "shared").status_code == 200  # a fresh process, awake
    assert steward.engine_pid("shared") != first


def test_steward_attaches_to_a_server_it_does_not_run_and_shows_its_own_queue(
        start_steward: StewardFactory, tmp_path: Path) -> None:
    import subprocess

    port = free_port()
    with open(tmp_path / "server.log", "wb") as log:
        server = subprocess.Popen([sys.executable, "-m", "fakes.openai_server", "--port", str(port),
                                   "--served-model-name", "shared", "--max-num-seqs", "1",
                                   "--tokens-per-second", "50"], stdout=log, stderr=log)
    try:
        steward = start_steward({"shared": {"runtime": "openai", "upstream": f"127.0.0.1:{port}", "memory": "2GiB",
                                            "parallel": 3}}, gpu={"probe": "none", "budget": "16GiB"})
        steward.wait_event("ready", engine="shared", timeout=30)  # always on: loaded at start, once it answers
        threads = [threading.Thread(target=ask, args=(steward.base_url, "shared", 100)) for _ in range(3)]
        for thread in threads:
            thread.start()
        # Steward sends 3 (its parallel); the server runs 1 and queues 2: that overload shows in steward.
        wait_until(lambda: (steward.health()["engines"]["shared"]["engine_load"] or {}).get("waiting", 0) >= 1,
                   "the engine's own queue in /healthz")
        # Its own KV-cache use (vllm:kv_cache_usage_perc: the running request's tokens) is the cluster's gauge.
        said = wait_until(lambda: (steward.health()["engines"]["shared"]["engine_load"] or {}).get("kv_usage"),
                          "the engine's own KV-cache use in /healthz")
        assert 0 < said < 1
        for thread in threads:
            thread.join(60)
        free = 'vllm:kv_cache_usage_perc{model_name="shared"} 0.0'
        wait_until(lambda: free in httpx.get(f"{steward.url}/metrics").text
                   and steward.health()["engines"]["shared"]["engine_load"]["kv_usage"] == 0.0,
                   "its KV cache free again once its requests are done")
        assert 'steward_engine_reported_running{engine="shared"}' in httpx.get(f"{steward.url}/metrics").text
        assert not steward.events("spawn")  # someone else's server: steward ran nothing
    finally:
        stop_process(server)


def test_an_attached_server_that_is_down_is_waited_for(start_steward: StewardFactory, tmp_path: Path) -> None:
    import subprocess

    port = free_port()
    steward = start_steward({"shared": {"runtime": "openai", "upstream": f"127.0.0.1:{port}", "memory": "2GiB"}},
                            gpu={"probe": "none", "budget": "16GiB"}, engines={"restart_backoff": "0.2s"})
    steward.wait_event("upstream_retry", service="shared")
    with open(tmp_path / "server.log", "wb") as log:
        server = subprocess.Popen([sys.executable, "-m", "fakes.openai_server", "--port", str(port),
                                   "--served-model-name", "shared"], stdout=log, stderr=log)
    try:
        steward.wait_event("ready", engine="shared", timeout=30)
        assert ask(steward.base_url, "shared").status_code == 200
    finally:
        stop_process(server)


def test_an_idle_engine_is_unloaded_and_loaded_again_on_the_next_request(start_steward: StewardFactory) -> None:
    steward = start_steward({"chat": fake_model("1GiB", idle_unload="1s")}, gpu={"probe": "none", "budget": "4GiB"})
    assert ask(steward.base_url, "chat").status_code == 200
    idle = steward.wait_event("idle_unload", engine="chat")
    assert idle["idle_s"] >= 1.0 and idle["idle_unload_s"] == 1.0
    steward.wait_event("stopped", engine="chat")
    assert ask(steward.base_url, "chat").status_code == 200
    assert [e["engine"] for e in steward.events("load")] == ["chat", "chat"]


@pytest.mark.parametrize("sleeps", [False, True])
def test_a_server_that_fails_its_health_checks_is_cut_off_and_restarted(start_steward: StewardFactory,
                                                                         sim_gpu: Any, sleeps: bool) -> None:
    gpu = sim_gpu("16GiB")
    command = fake_vllm("shared", gpu, "2GiB", "--fail-health-after", "3")
    # With sleep its process is kept between loads; a restart still replaces it (not a sleep).
    sleep = {"sleep": {"level": 1}, "env": {"VLLM_SERVER_DEV_MODE": "1"}} if sleeps else {}
    steward = start_steward({"shared": {"runtime": "openai", "command": command, "memory": "2GiB",
                                        "always_on": True, **sleep}},
                            gpu={"probe": "simulated", "simulated_dir": str(gpu), "poll_interval": "0.1s"},
                            engines={"health_check_interval": "0.2s", "recover_timeout": "1s",
                                     "restart_backoff": "0.2s", "stop_grace": "3s"})
    first = steward.wait_event("ready", engine="shared")
    unhealthy = steward.wait_event("engine_unhealthy", engine="shared")
    assert "/health answered 500" in unhealthy["detail"]
    steward.wait_event("engine_restart", engine="shared", timeout=20)
    deadline = time.monotonic() + 30
    while len(steward.events("ready")) < 2:
        assert time.monotonic() < deadline, "not restarted"
        time.sleep(0.05)
    assert steward.events("ready")[-1]["mono"] > first["mono"]
    assert len({e["pid"] for e in steward.events("spawn")}) >= 2  # a fresh process
    assert not steward.events("asleep")


def test_an_alias_reaches_the_server_as_the_name_it_serves(start_steward: StewardFactory, tmp_path: Path) -> None:
    import subprocess

    port = free_port()
    with open(tmp_path / "server.log", "wb") as log:  # vLLM refuses a name it does not serve (404)
        server = subprocess.Popen([sys.executable, "-m", "fakes.openai_server", "--port", str(port),
                                   "--served-model-name", "qwen3-8b"], stdout=log, stderr=log)
    try:
        steward = start_steward({"shared": {"runtime": "openai", "upstream": f"127.0.0.1:{port}", "memory": "2GiB",
                                            "served_name": "qwen3-8b", "aliases": ["agents"]}},
                                gpu={"probe": "none", "budget": "16GiB"})
        steward.wait_event("ready", engine="shared", timeout=30)
        for name in ("shared", "agents", "agents@batch"):
            reply = ask(steward.base_url, name)
            assert reply.status_code == 200 and reply.json()["model"] == "qwen3-8b", (name, reply.text)
    finally:
        stop_process(server)
