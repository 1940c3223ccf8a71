"""Engines and steward itself over their lifetimes, with real processes and signals:
load and evict on the simulated GPU, SIGTERM drain, kill -9 of an engine mid-stream,
an engine that cannot start, and SIGKILL of steward."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from fakes.simgpu import SimulatedDevice
from tests.conftest import RunningSteward, StewardFactory, descendants, fake_model

pytestmark = pytest.mark.slow  # every test here starts steward as a real process

GIB = 1024**3


def sdk(steward: RunningSteward) -> openai.OpenAI:
    return openai.OpenAI(base_url=steward.base_url, api_key="unused", max_retries=0, timeout=30)


def chat(steward: RunningSteward, model: str, max_tokens: int = 2) -> str:
    reply = sdk(steward).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens)
    return reply.choices[0].message.content


def gpu_used(gpu_dir: Path) -> int:
    return SimulatedDevice(gpu_dir).read(time.monotonic()).used_bytes


def wait_until(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def refuses_connections(url: str) -> bool:
    try:
        httpx.get(url, timeout=2)
    except httpx.TransportError:
        return True
    return False


def test_load_then_evict_on_the_simulated_gpu_with_reservations_at_each_step(
        start_steward: StewardFactory, sim_gpu) -> None:  # type: ignore[no-untyped-def]
    gpu_dir = sim_gpu("10GiB")
    steward = start_steward(
        {"a": fake_model("4GiB", gpu_dir=gpu_dir), "b": fake_model("4GiB", gpu_dir=gpu_dir),
         "c": fake_model("5GiB", gpu_dir=gpu_dir)},
        gpu={"probe": "simulated", "simulated_dir": str(gpu_dir), "poll_interval": "0.2s"})
    assert steward.wait_event("probe")["budget"] == 10 * GIB  # from the simulated device

    def reserved() -> dict[str, int]:
        return {name: e["reserved"] for name, e in steward.health()["engines"].items() if e["reserved"]}

    chat(steward, "a")
    assert reserved() == {"a": 4 * GIB}
    assert gpu_used(gpu_dir) == 4 * GIB
    chat(steward, "b")
    assert reserved() == {"a": 4 * GIB, "b": 4 * GIB}
    assert gpu_used(gpu_dir) == 8 * GIB
    # c needs 5 GiB, 2 GiB are free: a, the least recently used idle engine, is evicted.
    chat(steward, "c")
    assert reserved() == {"b": 4 * GIB, "c": 5 * GIB}
    evict = steward.wait_event("evict")
    assert evict["engine"] == "a" and evict["for_engine"] == "c"
    names = [e["event"] for e in steward.events() if e["event"] in ("evict", "stopped", "load")
             and e.get("engine") in ("a", "c")]
    # c's load was decided only after a had stopped and its reservation was released.
    assert names[-3:] == ["evict", "stopped", "load"]
    wait_until(lambda: gpu_used(gpu_dir) == 9 * GIB)  # a's memory leaves the device too
    assert len(steward.events("evict")) == 1  # one victim, not two


def test_sigterm_lets_streams_in_flight_finish_then_stops_engines_and_exits_0(
        start_steward: StewardFactory) -> None:
    steward = start_steward({"chat": fake_model("1GiB", tps=20)}, limits={"shutdown_timeout": "20s"})
    engine_pid_holder: list[int] = []
    received: list[str] = []
    first_token = threading.Event()
    failure: list[BaseException] = []

    def stream() -> None:
        try:
            chunks = sdk(steward).chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "long"}], max_tokens=30, stream=True)
            for chunk in chunks:
                if chunk.choices and chunk.choices[0].delta.content:
                    received.append(chunk.choices[0].delta.content)
                    first_token.set()
        except BaseException as exc:  # noqa: BLE001 - reported below
            failure.append(exc)
            first_token.set()

    thread = threading.Thread(target=stream)
    thread.start()
    assert first_token.wait(15)
    engine_pid_holder.append(steward.engine_pid("chat"))
    steward.process.send_signal(signal.SIGTERM)
    # No new work is accepted once the signal has arrived.
    wait_until(lambda: refuses_connections(f"{steward.url}/healthz"))
    thread.join(20)
    assert not failure, failure
    assert len(received) == 30  # the whole answer, not cut short
    assert steward.process.wait(20) == 0
    events = [e["event"] for e in steward.events()]
    assert events.index("shutdown") < events.index("exit") < events.index("shutdown_complete")
    with pytest.raises(ProcessLookupError):
        os.kill(engine_pid_holder[0], 0)


def test_kill_9_of_an_engine_mid_stream_gives_a_clean_error_and_the_next_request_restarts_it(
        start_steward: StewardFactory) -> None:
    steward = start_steward({"chat": fake_model("1GiB", tps=20)})
    chunks = sdk(steward).chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "long"}], max_tokens=100, stream=True)
    with pytest.raises(openai.APIError) as caught:
        for chunk in chunks:
            if chunk.choices and chunk.choices[0].delta.content:
                os.kill(steward.engine_pid("chat"), signal.SIGKILL)
    assert "engine 'chat' failed during the request" in str(caught.value)
    crash = steward.wait_event("crash", engine="chat")
    assert "SIGKILL" in crash["detail"]
    assert chat(steward, "chat")  # restarted on demand
    assert steward.wait_event("restart", engine="chat")["generation"] == 2
    health = steward.health()["engines"]["chat"]
    assert health["status"] == "ready" and health["in_flight"] == 0 and health["reserved"] == GIB


def test_non_streaming_request_to_a_dying_engine_gets_a_502_in_openai_shape(start_steward: StewardFactory) -> None:
    steward = start_steward({"chat": fake_model("1GiB", tps=20)})
    chat(steward, "chat")
    killer = threading.Timer(0.3, lambda: os.kill(steward.engine_pid("chat"), signal.SIGKILL))
    killer.start()
    with pytest.raises(openai.APIStatusError) as caught:
        sdk(steward).chat.completions.create(model="chat", messages=[{"role": "user", "content": "x"}],
                                             max_tokens=50)
    killer.join()
    assert caught.value.status_code == 502
    assert caught.value.body["code"] == "engine_error"


def test_engine_that_cannot_start_gives_a_clean_error_and_is_retried_with_backoff(
        start_steward: StewardFactory, tmp_path: Path) -> None:
    steward = start_steward({
        "missing": {"command": str(tmp_path / "no-such-llama-server"), "memory": "1GiB"},
        "broken": fake_model("1GiB", extra=["--fail-load", "error loading model: tensor 'blk.0' is corrupted"]),
    })
    with pytest.raises(openai.APIStatusError) as caught:
        chat(steward, "missing")
    assert caught.value.status_code == 503
    assert caught.value.body["code"] == "engine_start_failed"
    assert "No such file or directory" in caught.value.body["message"]
    assert int(caught.value.response.headers["retry-after"]) >= 1
    with pytest.raises(openai.APIStatusError) as caught:
        chat(steward, "broken")
    assert "tensor 'blk.0' is corrupted" in caught.value.body["message"]
    # The next demand tries again, after a backoff that doubles.
    with pytest.raises(openai.APIStatusError):
        chat(steward, "broken")
    # The answer may come before the second crash is in the log: wait for it, then read them all.
    steward.wait_event("crash", engine="broken", restart_in_s=0.4)
    crashes = [e for e in steward.events("crash") if e["engine"] == "broken"]
    assert [c["restart_in_s"] for c in crashes] == [0.2, 0.4]
    assert steward.events("restart")[0]["engine"] == "broken"


def test_sigkill_of_steward_takes_its_engines_with_it(start_steward: StewardFactory) -> None:
    steward = start_steward({"a": fake_model("1GiB"), "b": fake_model("1GiB", pinned=True)})
    chat(steward, "a")
    steward.wait_event("ready", engine="b")
    engine_pids = [steward.engine_pid("a"), steward.engine_pid("b")]
    steward.process.kill()
    steward.process.wait()
    wait_until(lambda: not [p for p, _ in descendants() if p in engine_pids], timeout=5)


def test_sigterm_answers_requests_still_waiting_for_their_turn_at_once(start_steward: StewardFactory) -> None:
    steward = start_steward({"chat": fake_model("1GiB", parallel=1, tps=20)}, limits={"shutdown_timeout": "20s"})
    chat(steward, "chat")  # loaded
    finished: dict[str, float] = {}

    def running() -> None:
        chat(steward, "chat", max_tokens=30)  # ~1.5 s on the only slot
        finished["running"] = time.monotonic()

    refused: list[openai.APIStatusError] = []

    def waiting() -> None:
        try:
            chat(steward, "chat")
        except openai.APIStatusError as exc:
            refused.append(exc)
        finished["waiting"] = time.monotonic()

    first = threading.Thread(target=running)
    first.start()
    wait_until(lambda: steward.health()["engines"]["chat"]["in_flight"] == 1)
    second = threading.Thread(target=waiting)
    second.start()
    wait_until(lambda: len(steward.events("enqueue")) == 3)
    steward.process.send_signal(signal.SIGTERM)
    first.join(20)
    second.join(20)
    assert [(e.status_code, e.body["code"], e.response.headers["retry-after"]) for e in refused] == [
        (503, "shutting_down", "5")]
    assert finished["waiting"] < finished["running"]  # answered at once, not after the running one
    assert steward.process.wait(20) == 0
    assert steward.wait_event("reject")["reason"] == "shutting_down"


@pytest.mark.parametrize("how", ["shutdown_timeout", "second_signal"])
def test_requests_still_running_when_the_drain_ends_are_cut_with_an_error_their_clients_can_read(
        start_steward: StewardFactory, how: str) -> None:
    timeout = "1s" if how == "shutdown_timeout" else "60s"
    steward = start_steward({"chat": fake_model("1GiB", parallel=2, tps=5)}, limits={"shutdown_timeout": timeout})
    chat(steward, "chat")  # loaded
    streamed: list[str] = []
    outcomes: dict[str, BaseException] = {}

    def stream() -> None:
        try:
            for chunk in sdk(steward).chat.completions.create(
                    model="chat", messages=[{"role": "user", "content": "long"}], max_tokens=1000, stream=True):
                if chunk.choices and chunk.choices[0].delta.content:
                    streamed.append(chunk.choices[0].delta.content)
        except openai.APIError as exc:
            outcomes["stream"] = exc

    def whole() -> None:
        try:
            chat(steward, "chat", max_tokens=1000)  # 200 s: nothing is sent before it ends
        except openai.APIStatusError as exc:
            outcomes["whole"] = exc

    threads = [threading.Thread(target=stream), threading.Thread(target=whole)]
    for thread in threads:
        thread.start()
    wait_until(lambda: streamed and steward.health()["engines"]["chat"]["in_flight"] == 2)
    signalled = time.monotonic()
    steward.process.send_signal(signal.SIGTERM)
    if how == "second_signal":
        steward.wait_event("shutdown")
        steward.process.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(20)
    assert steward.process.wait(20) == 0
    assert time.monotonic() - signalled < 10  # not the 200 s the answers would take
    assert "steward stopped before the answer was complete" in str(outcomes["stream"])  # an SSE error event
    assert isinstance(outcomes["whole"], openai.APIStatusError)
    assert (outcomes["whole"].status_code, outcomes["whole"].body["code"]) == (503, "shutting_down")
    cut = steward.wait_event("shutdown_cut")
    assert (cut["requests"], cut["reason"]) == (2, how)


def test_queue_timeout_is_a_503_with_retry_after(start_steward: StewardFactory) -> None:
    # Pinned: loaded at start, so that no request here waits for a load (which alone can take
    # longer than the 0.5 s queue timeout on a busy machine).
    steward = start_steward({"slow": fake_model("1GiB", parallel=1, tps=10, pinned=True)},
                            classes={"interactive": {"queue_timeout": "0.5s"}})
    steward.wait_event("ready", timeout=60, engine="slow")
    # Holds the only slot for 6 s: far longer than the timeout, however late the next request comes.
    long_one = threading.Thread(target=lambda: chat(steward, "slow", max_tokens=60))
    long_one.start()
    wait_until(lambda: steward.health()["engines"]["slow"]["in_flight"] == 1)
    with pytest.raises(openai.APIStatusError) as caught:
        chat(steward, "slow")
    long_one.join()
    assert caught.value.status_code == 503
    assert caught.value.body["code"] == "queue_timeout"
    assert caught.value.response.headers["retry-after"] == "1"
    assert steward.wait_event("timeout")["waited_s"] >= 0.5


def test_a_client_that_leaves_while_waiting_leaves_the_queue(start_steward: StewardFactory) -> None:
    steward = start_steward({"slow": fake_model("1GiB", parallel=1, tps=10)})
    chat(steward, "slow")  # loaded
    long_one = threading.Thread(target=lambda: chat(steward, "slow", max_tokens=20))  # holds the slot ~2 s
    long_one.start()
    wait_until(lambda: steward.health()["engines"]["slow"]["in_flight"] == 1)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{steward.base_url}/chat/completions", timeout=0.5,
                   json={"model": "slow", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
    withdrawn = steward.wait_event("withdraw", model="slow")
    assert withdrawn["waited_s"] < 5.0  # when it left (0.5 s), not at the 60 s queue timeout
    long_one.join()
    health = steward.health()
    assert health["queued"] == 0 and health["engines"]["slow"]["in_flight"] == 0
    stats = httpx.get(steward.engine_endpoint("slow") + "/fake/stats").json()
    assert stats["started"] == 2  # the one that left never reached the engine
