"""An engine behind a wrapper that does not ``exec``: the real server is steward's
grandchild, and it dies with steward all the same, however steward ends, and with
the wrapper when the wrapper is killed."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.conftest import RunningSteward, StewardFactory, descendants, fake_model

pytestmark = pytest.mark.slow  # every test here starts steward as a real process


def wrapped_fake_model(**config: Any) -> dict[str, Any]:
    """The fake llama-server, run by a shell that has more to do after it, so it cannot exec."""
    script = f'{sys.executable} -m fakes.llama_server "$@"; echo bye'
    return {**fake_model("1GiB", **config), "command": ["sh", "-c", script, "sh"]}


def load(steward: RunningSteward, model: str) -> None:
    reply = httpx.post(f"{steward.base_url}/chat/completions", timeout=30,
                       json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert reply.status_code == 200, reply.text


def server_under(wrapper: int) -> int:
    """The fake llama-server the wrapper started."""
    [server] = [pid for pid, cmdline in descendants(wrapper) if "fakes.llama_server" in cmdline]
    return server


def running(pid: int) -> bool:
    return pid in (alive for alive, _ in descendants())


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_sigkill_of_steward_takes_the_server_behind_a_wrapper_with_it(start_steward: StewardFactory) -> None:
    steward = start_steward({"chat": wrapped_fake_model()})
    load(steward, "chat")
    wrapper = steward.engine_pid("chat")
    server = server_under(wrapper)
    steward.process.kill()
    steward.process.wait()
    wait_until(lambda: not running(server) and not running(wrapper))


def test_sigterm_of_steward_stops_the_wrapper_and_its_server(start_steward: StewardFactory) -> None:
    steward = start_steward({"chat": wrapped_fake_model()})
    load(steward, "chat")
    server_under(steward.engine_pid("chat"))
    started = [pid for pid, _ in descendants(steward.process.pid)]  # wrapper, server and reaper
    assert steward.stop(signal.SIGTERM) == 0
    wait_until(lambda: not [pid for pid in started if running(pid)])  # the reaper exits on its own time


def test_kill_9_of_the_wrapper_takes_its_server_with_it_and_the_next_request_restarts_both(
        start_steward: StewardFactory) -> None:
    steward = start_steward({"chat": wrapped_fake_model()})
    load(steward, "chat")
    wrapper = steward.engine_pid("chat")  # the pid steward reports, so the one a person kills
    server = server_under(wrapper)
    os.kill(wrapper, signal.SIGKILL)
    steward.wait_event("crash", engine="chat")
    wait_until(lambda: not running(server))  # it would hold its memory, unaccounted, forever
    load(steward, "chat")
    assert steward.wait_event("restart", engine="chat")["generation"] == 2
    assert running(server_under(steward.engine_pid("chat")))
