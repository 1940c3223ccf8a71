"""Engines that stop answering without exiting: frozen (SIGSTOP), or too slow to send a byte.

Before, a frozen engine held its clients until their own timeouts, `/healthz` said `ready`,
and new requests were sent to it and hung too. Now: health checks find it, its requests
are cut with a clean error, it gets no new work, and it is restarted unless it recovers;
a response that passes its first-byte or between-chunks timeout is a 504 (or an SSE error
event), and the engine is checked at once.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import openai
import pytest

from tests.conftest import RunningSteward, StewardFactory, fake_model
from tests.fake_processes import wait_until

pytestmark = pytest.mark.slow  # every test here starts steward as a real process

# Quick checks, but far from what a busy machine makes of a healthy fake's /health.
CHECKS = {"stop_grace": "3s", "restart_backoff": "0.2s", "health_check_interval": "0.3s",
          "health_check_timeout": "2s", "unhealthy_after": 2}


def sdk(steward: RunningSteward) -> openai.OpenAI:
    return openai.OpenAI(base_url=steward.base_url, api_key="unused", max_retries=0, timeout=120)


def ask(steward: RunningSteward, **extra: Any) -> Any:
    return sdk(steward).chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}],
                                                **{"max_tokens": 2, **extra})


def in_background(target: Any) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = target()
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def stream_to_the_end(steward: RunningSteward) -> list[Any]:
    return list(ask(steward, stream=True, max_tokens=5000))


def test_a_frozen_engine_is_found_its_requests_get_clean_errors_and_it_is_restarted(
        start_steward: StewardFactory) -> None:
    steward = start_steward({"chat": fake_model("1GiB", parallel=2, tps=50)},
                            engines={**CHECKS, "recover_timeout": "2s"})
    ask(steward)  # loaded
    frozen = steward.engine_pid("chat")
    streaming, streamed = in_background(lambda: stream_to_the_end(steward))
    plain, answered = in_background(lambda: ask(steward, max_tokens=5000))
    wait_until(lambda: steward.health()["engines"]["chat"]["in_flight"] == 2, timeout=30)
    os.kill(frozen, signal.SIGSTOP)
    try:
        unhealthy = steward.wait_event("engine_unhealthy", engine="chat", timeout=60)
        assert unhealthy["revoked"] == 2 and unhealthy["failures"] == 2
        streaming.join(60)
        plain.join(60)
        assert isinstance(streamed.get("error"), openai.APIError)  # an SSE error event ended the stream
        assert "health checks" in str(streamed["error"])
        assert isinstance(answered.get("error"), openai.APIStatusError)
        assert answered["error"].status_code == 502 and answered["error"].body["code"] == "engine_unhealthy"
        restart = steward.wait_event("engine_restart", engine="chat", timeout=30)
        assert restart["reason"] == "unhealthy"
    finally:
        if _alive(frozen):
            os.kill(frozen, signal.SIGCONT)
    crash = steward.wait_event("crash", engine="chat", timeout=30)
    assert "health checks" in crash["detail"]
    assert ask(steward).choices[0].message.content  # served by a new process
    assert steward.engine_pid("chat") != frozen
    steward.wait_event("restart", engine="chat", generation=2, timeout=10)
    names = [e["event"] for e in steward.events()
             if e["event"] in ("health_check_failed", "engine_unhealthy", "engine_restart", "crash", "restart")]
    assert names[:3] == ["health_check_failed", "health_check_failed", "engine_unhealthy"]
    assert names.index("engine_restart") < names.index("crash") < names.index("restart")


def test_no_new_work_goes_to_an_unhealthy_engine_and_it_gets_work_again_when_it_recovers(
        start_steward: StewardFactory) -> None:
    steward = start_steward({"chat": fake_model("1GiB", parallel=2, tps=200)},
                            engines={**CHECKS, "recover_timeout": "10m"})
    ask(steward)
    pid = steward.engine_pid("chat")
    os.kill(pid, signal.SIGSTOP)
    try:
        steward.wait_event("engine_unhealthy", engine="chat", timeout=60)
        health = steward.health()
        assert health["status"] == "degraded" and health["engines"]["chat"]["healthy"] is False
        waiting, answered = in_background(lambda: ask(steward))
        wait_until(lambda: steward.health()["engines"]["chat"]["queued"] == 1, timeout=30)
        assert steward.health()["engines"]["chat"]["in_flight"] == 0  # it waits in steward, not in the engine
    finally:
        os.kill(pid, signal.SIGCONT)
    steward.wait_event("engine_recovered", engine="chat", timeout=60)
    waiting.join(60)
    assert answered["value"].choices[0].message.content
    assert steward.engine_pid("chat") == pid and not steward.events("engine_restart")
    assert steward.health()["engines"]["chat"]["healthy"] is True


def test_an_answer_slower_than_the_first_byte_timeout_is_a_504_and_the_engine_is_checked(
        start_steward: StewardFactory) -> None:
    # 50 tokens at 10 per second: the whole (non-streamed) answer comes after 5 s; the timeout is 1 s.
    steward = start_steward({"chat": fake_model("1GiB", parallel=2, tps=10)},
                            engines={**CHECKS, "health_check_interval": "10m", "first_byte_timeout": "1s"})
    ask(steward)
    with pytest.raises(openai.APIStatusError) as caught:
        ask(steward, max_tokens=50)
    assert caught.value.status_code == 504 and caught.value.body["code"] == "engine_timeout"
    assert "no answer within 1s" in caught.value.body["message"]
    stalled = steward.wait_event("engine_stalled", engine="chat", timeout=10)
    assert "1s" in stalled["detail"]
    steward.wait_event("complete", status=504, timeout=10)
    assert not steward.events("engine_unhealthy")  # it answered the check it was given
    assert ask(steward).choices[0].message.content


def test_a_stream_silent_longer_than_the_chunk_timeout_ends_with_an_error_event(
        start_steward: StewardFactory) -> None:
    # A token every 4 s; the timeout between chunks is 1 s.
    steward = start_steward({"chat": fake_model("1GiB", parallel=2, tps=0.25)},
                            engines={**CHECKS, "health_check_interval": "10m", "chunk_timeout": "1s"})
    with pytest.raises(openai.APIError, match="stalled"):
        list(ask(steward, stream=True, max_tokens=10))
    assert "between two chunks" in steward.wait_event("engine_stalled", engine="chat", timeout=10)["detail"]


def test_an_engine_stopped_for_its_start_timeout_is_logged_as_stopped_by_steward(
        start_steward: StewardFactory) -> None:
    steward = start_steward({"chat": fake_model("1GiB", load_time="60s")},
                            engines={"stop_grace": "3s", "restart_backoff": "0.2s", "start_timeout": "1s"})
    with pytest.raises(openai.APIStatusError) as caught:
        ask(steward)
    assert caught.value.status_code == 503 and caught.value.body["code"] == "engine_start_failed"
    steward.wait_event("start_timeout", engine="chat", timeout=30)
    assert steward.wait_event("exit", engine="chat", timeout=30)["requested"] is True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
