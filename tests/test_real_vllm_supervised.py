"""Steward supervising a real vLLM (runtime openai, `command` with ${PORT}).

One steward serves the module; it starts vLLM itself (about a minute) and, after the
kill -9 test, once more. On this CPU-only host the ledger measures RSS: vLLM's memory is in
its child processes (engine core, worker), so only the sum over its process tree is right.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from fakes.tiny_hf import write_tiny_model
from supervisor.engines.process_tree import alive, read_parents, rss_bytes, stat_fields, tree_rss
from tests.conftest import MODULE_SCOPED, RunningSteward, launch_steward
from tests.vllm_server import START_TIMEOUT_S, require_vllm_python, vllm_command, vllm_env

pytestmark = pytest.mark.slow

NAME = "tiny"
# What the test servers need beyond steward's own environment (tests/vllm_server.py).
ENV_KEYS = ("VLLM_CPU_KVCACHE_SPACE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS",
            "DO_NOT_TRACK", "VLLM_SERVER_DEV_MODE", "VLLM_CPU_OMP_THREADS_BIND")


@pytest.fixture(scope="module")
def steward(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSteward]:
    require_vllm_python()
    env = vllm_env()
    command = vllm_command(write_tiny_model(), "${PORT}", NAME)  # type: ignore[arg-type]
    started: list[RunningSteward] = []
    running = launch_steward(tmp_path_factory.mktemp("steward"), {
        NAME: {"runtime": "openai", "command": command, "env": {k: env[k] for k in ENV_KEYS},
               "memory": "4GiB", "parallel": 2, "always_on": True}},
        started, gpu={"probe": "host", "budget": "16GiB", "poll_interval": "0.5s"},
        engines={"stop_grace": "20s", "restart_backoff": "0.2s", "start_timeout": f"{START_TIMEOUT_S:g}s"})
    MODULE_SCOPED.add(running.process.pid)
    try:
        running.wait_event("ready", engine=NAME, timeout=START_TIMEOUT_S)
        yield running
    finally:
        running.stop(timeout=60)
        MODULE_SCOPED.discard(running.process.pid)


def client(steward: RunningSteward) -> openai.OpenAI:
    return openai.OpenAI(base_url=steward.base_url, api_key="x", max_retries=0, timeout=120)


def test_steward_starts_it_on_the_port_it_picked_and_it_answers(steward: RunningSteward) -> None:
    spawn = steward.events("spawn")[-1]
    assert "${PORT}" not in " ".join(spawn["argv"]) and str(spawn["port"]) in spawn["argv"]
    reply = client(steward).chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=4, extra_body={"ignore_eos": True})
    assert reply.usage is not None and reply.usage.completion_tokens == 4


def test_its_memory_is_measured_over_its_whole_process_tree(steward: RunningSteward) -> None:
    pid = steward.engine_pid(NAME)
    deadline = time.monotonic() + 60
    while (measured := steward.health()["engines"][NAME]["measured"]) == 0:
        assert time.monotonic() < deadline, "no measurement reached /healthz"
        time.sleep(0.2)
    own = rss_bytes(pid)
    tree = tree_rss(pid, read_parents())
    assert own is not None and tree is not None
    # The engine core and the worker hold most of it (the KV cache alone is 1 GiB).
    assert measured > 2 * own and measured > 1024**3
    assert abs(measured - tree) < tree // 2  # the same tree, read at another moment


def test_kill_9_of_its_whole_tree_gives_a_clean_error_a_restart_and_no_process_left(
        steward: RunningSteward) -> None:
    pid = steward.engine_pid(NAME)
    group = {p for p in read_parents() if (stat := stat_fields(p)) is not None and int(stat[2]) == pid}
    assert len(group) >= 3  # the API server, its engine core and its worker
    # Asleep, vLLM holds the request (its /health stays 200): it is surely in flight, inside
    # vLLM, when the tree is killed; a stream may otherwise end before the kill lands.
    endpoint = steward.engine_endpoint(NAME)
    assert httpx.post(f"{endpoint}/sleep", params={"level": 1}, timeout=60).status_code == 200
    answers: list[httpx.Response] = []
    body = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "ignore_eos": True}
    asking = threading.Thread(target=lambda: answers.append(
        httpx.post(f"{steward.base_url}/chat/completions", json=body, timeout=120)))
    dispatched = len(steward.events("dispatch"))
    asking.start()
    deadline = time.monotonic() + 60
    while len(steward.events("dispatch")) == dispatched:
        assert time.monotonic() < deadline, "the request was never dispatched"
        time.sleep(0.02)
    os.killpg(pid, signal.SIGKILL)
    asking.join(120)
    assert answers and answers[0].status_code == 502  # a clean error, in the OpenAI shape
    assert answers[0].json()["error"]["code"] == "engine_error"
    crash = steward.wait_event("crash", engine=NAME, timeout=60)
    assert "SIGKILL" in crash["detail"]
    steward.wait_event("restart", engine=NAME, timeout=60)
    deadline = time.monotonic() + START_TIMEOUT_S
    while len(steward.events("ready")) < 2:
        assert time.monotonic() < deadline, "vLLM was not restarted"
        time.sleep(0.5)
    assert not [p for p in group if alive(p)]  # the whole old tree is gone
    reply = client(steward).chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=4, extra_body={"ignore_eos": True})
    assert reply.choices[0].finish_reason == "length"

