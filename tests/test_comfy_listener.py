"""The ComfyUI-compatible listener in front of a fake ComfyUI (a real process): image jobs
as exclusive GPU jobs in steward's scheduler, and the turnstile spec's lock semantics."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio_websocket

from fakes import simgpu
from supervisor.units import parse_size
from tests.conftest import RunningSteward, StewardFactory, fake_model, free_port
from tests.fake_processes import FakeProcess, fake_launcher, wait_until

pytestmark = pytest.mark.slow  # every test here starts steward (and fake ComfyUI or Ollama) as real processes


def workflow(seconds: float, *, invalid: bool = False) -> dict[str, Any]:
    sampler = "FAKE_INVALID" if invalid else "KSampler"
    return {"prompt": {"4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "x.safetensors"}},
                       "3": {"class_type": sampler, "inputs": {"model": ["4", 0], "steps": 2,
                                                               "fake_seconds": seconds}},
                       "9": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "t"}}},
            "client_id": "test"}


@pytest.fixture
def comfy(tmp_path: Path) -> Iterator[Callable[..., tuple[int, Path]]]:
    """A fake ComfyUI on the simulated GPU; returns (port, gpu dir). Always stopped."""
    for launcher in fake_launcher(tmp_path):
        def start(*args: str) -> tuple[int, Path]:
            gpu = simgpu.create_device(tmp_path / "gpu", total_bytes=parse_size("16GiB"), linger_s=0.1)
            fake = launcher.launch(FakeProcess, "fakes.comfyui",
                                   ["--sim-gpu", str(gpu), "--model-memory", "6GiB", "--free-delay", "0.2s",
                                    "--job-time", "0.5s", *args], ready_path="/system_stats")
            return fake.port, gpu

        yield start


def steward_with(start_steward: StewardFactory, comfy_port: int, gpu: Path, models: dict[str, Any] | None = None,
                 **extra: Any) -> tuple[RunningSteward, str]:
    steward = start_steward(models or {}, comfyui={
        "upstream": f"127.0.0.1:{comfy_port}", "listen": f"127.0.0.1:{free_port()}", "history_poll": "0.1s",
        "free_timeout": "5s", "job_timeout": "30s", **extra},
        gpu={"probe": "simulated", "simulated_dir": str(gpu), "poll_interval": "0.1s"})
    return steward, steward.wait_event("listening")["comfyui"][0]


def names(steward: RunningSteward, *wanted: str) -> list[str]:
    return [e["event"] for e in steward.events() if e["event"] in wanted]


def test_the_call_sequence_of_one_image_job(start_steward: StewardFactory, comfy) -> None:  # type: ignore[no-untyped-def]
    port, gpu = comfy()
    steward, url = steward_with(start_steward, port, gpu)
    answer = httpx.post(f"{url}/prompt", json=workflow(0.5), timeout=30)
    assert answer.status_code == 200 and answer.json()["node_errors"] == {}  # ComfyUI's answer, unchanged
    prompt_id = answer.json()["prompt_id"]
    steward.wait_event("image_released", timeout=20)
    phases = ["image_queued", "image_granted", "image_forwarded", "image_finished", "image_freed", "image_released"]
    assert names(steward, *phases) == phases
    assert steward.wait_event("image_finished")["prompt_id"] == prompt_id
    assert steward.wait_event("image_finished")["outcome"] == "success"
    assert steward.wait_event("image_freed")["observed_free"] is True
    stats = httpx.get(f"http://127.0.0.1:{port}/fake/stats").json()
    assert stats["free_calls"] == 1
    metrics = httpx.get(f"{url}/metrics").text
    assert "gpu_turnstile_image_jobs_total 1.0" in metrics
    assert 'gpu_turnstile_lock_wait_seconds_count{kind="image"} 1.0' in metrics


def test_an_image_waits_for_llm_work_to_drain_and_new_llm_work_waits_behind_it(
        start_steward: StewardFactory, comfy) -> None:  # type: ignore[no-untyped-def]
    port, gpu = comfy()
    steward, url = steward_with(start_steward, port, gpu,
                                {"chat": fake_model("6GiB", tps=20, gpu_dir=gpu)})
    body = {"model": "chat", "messages": [{"role": "user", "content": "x"}], "max_tokens": 20}  # ~1 s
    results: dict[str, float] = {}

    def timed(name: str, call: Callable[[], object]) -> None:
        call()
        results[name] = time.monotonic()

    first_chat = threading.Thread(target=timed, args=("chat1", lambda: httpx.post(
        f"{steward.base_url}/chat/completions", json=body, timeout=60)))
    first_chat.start()
    steward.wait_event("dispatch", model="chat")  # the chat runs
    image = threading.Thread(target=timed, args=("image", lambda: httpx.post(f"{url}/prompt", json=workflow(0.5),
                                                                            timeout=60)))
    image.start()
    steward.wait_event("image_queued")
    second_chat = threading.Thread(target=timed, args=("chat2", lambda: httpx.post(
        f"{steward.base_url}/chat/completions", json={**body, "max_tokens": 1}, timeout=60)))
    second_chat.start()
    for thread in (first_chat, image, second_chat):
        thread.join(60)
    granted = steward.wait_event("image_granted")["mono"]
    chat_dispatches = [e["mono"] for e in steward.events("dispatch") if e["model"] == "chat"]
    freed = steward.wait_event("image_freed")["mono"]
    assert chat_dispatches[0] < granted  # the running chat drained first
    assert chat_dispatches[1] > freed  # the chat that came during the image waited for /free
    assert [e["engine"] for e in steward.events("evict")] == ["chat"]  # the engine was unloaded


def test_a_rejected_prompt_releases_at_once(start_steward: StewardFactory, comfy) -> None:  # type: ignore[no-untyped-def]
    port, gpu = comfy()
    steward, url = steward_with(start_steward, port, gpu)
    answer = httpx.post(f"{url}/api/prompt", json=workflow(0.5, invalid=True), timeout=30)
    assert answer.status_code == 400
    assert answer.json()["error"]["type"] == "prompt_outputs_failed_validation"
    released = steward.wait_event("image_released")
    assert released["prompt_id"] is None
    assert "image_finished" not in names(steward, "image_finished")


def test_a_client_that_leaves_while_waiting_is_removed(start_steward: StewardFactory, comfy) -> None:  # type: ignore[no-untyped-def]
    port, gpu = comfy()
    steward, url = steward_with(start_steward, port, gpu)
    first = httpx.post(f"{url}/prompt", json=workflow(2.0), timeout=60).json()["prompt_id"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/prompt", json=workflow(0.5), timeout=0.5)  # waits behind the first, then leaves
    steward.wait_event("image_abandoned")
    steward.wait_event("image_released", prompt_id=first, timeout=20)
    time.sleep(0.5)
    assert len(steward.events("image_forwarded")) == 1  # the one that left never reached ComfyUI
    assert httpx.get(f"{url}/healthz").json()["state"] == "idle"


def test_an_image_for_a_comfyui_that_is_down_lets_go_of_the_gpu_when_its_client_leaves_or_steward_stops(
        start_steward: StewardFactory) -> None:
    steward = start_steward({"chat": fake_model("1GiB")}, gpu={"probe": "none", "budget": "16GiB"}, comfyui={
        "upstream": f"127.0.0.1:{free_port()}", "listen": f"127.0.0.1:{free_port()}",
        "retry_initial": "0.2s", "retry_max": "30s"})
    url = steward.wait_event("listening")["comfyui"][0]
    with pytest.raises(httpx.ReadTimeout):  # the job holds the GPU and retries; the client gives up
        httpx.post(f"{url}/prompt", json=workflow(0.5), timeout=1.0)
    steward.wait_event("image_abandoned")
    steward.wait_event("image_released")
    chat = {"model": "chat", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    assert httpx.post(f"{steward.base_url}/chat/completions", json=chat, timeout=30).status_code == 200
    # Retrying while steward stops: a clean 503 at once, not a drain held open for 30 s.
    answer: list[httpx.Response] = []
    asking = threading.Thread(target=lambda: answer.append(httpx.post(f"{url}/prompt", json=workflow(0.5),
                                                                       timeout=30)))
    asking.start()
    wait_until(lambda: len(steward.events("image_granted")) == 2)
    steward.process.send_signal(signal.SIGTERM)
    asking.join(10)
    assert answer[0].status_code == 503 and answer[0].json()["error"]["type"] == "shutting_down"
    assert steward.process.wait(10) == 0


def test_a_prompt_that_vanishes_from_comfyui_is_noticed_through_the_queue(
        start_steward: StewardFactory, comfy) -> None:  # type: ignore[no-untyped-def]
    port, gpu = comfy()
    steward, url = steward_with(start_steward, port, gpu, job_timeout="60s")
    prompt_id = httpx.post(f"{url}/prompt", json=workflow(10.0), timeout=30).json()["prompt_id"]
    httpx.post(f"http://127.0.0.1:{port}/fake/drop", json={"prompt_id": prompt_id})
    finished = steward.wait_event("image_finished", timeout=10)
    assert finished["outcome"] == "vanished"  # long before the 60 s job timeout


def test_images_are_served_in_order_and_an_operator_can_force_release(
        start_steward: StewardFactory, comfy) -> None:  # type: ignore[no-untyped-def]
    port, gpu = comfy()
    steward, url = steward_with(start_steward, port, gpu)
    first = httpx.post(f"{url}/prompt", json=workflow(30.0), timeout=30).json()["prompt_id"]
    second_answer: list[str] = []
    second = threading.Thread(target=lambda: second_answer.append(
        httpx.post(f"{url}/prompt", json=workflow(0.2), timeout=60).json()["prompt_id"]))
    second.start()
    wait_until(lambda: httpx.get(f"{url}/healthz").json()["image_pending"] is True)
    assert httpx.post(f"{url}/steward/release").json() == {"released": 1}  # the first job is stuck: let go
    second.join(30)
    forwarded = [e["prompt_id"] for e in steward.events("image_forwarded")]
    assert forwarded == [first, second_answer[0]]  # FIFO


def test_everything_else_passes_through_with_the_origin_comfyui_expects(
        start_steward: StewardFactory, comfy) -> None:  # type: ignore[no-untyped-def]
    port, gpu = comfy()
    steward, url = steward_with(start_steward, port, gpu)
    for path in ("/system_stats", "/api/system_stats", "/queue", "/object_info"):
        response = httpx.get(f"{url}{path}", headers={"Origin": url})
        assert response.status_code == 200, path
    direct = httpx.get(f"http://127.0.0.1:{port}/system_stats", headers={"Origin": url})
    assert direct.status_code == 403  # what ComfyUI itself does with a foreign Origin
    assert not steward.events("image_queued")  # none of these took the GPU


@asynccontextmanager
async def open_progress_socket(url: str) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    """ComfyUI's progress websocket through steward's listener, once ComfyUI's first status is in."""
    host, _, listen_port = url.removeprefix("http://").rpartition(":")
    async with trio_websocket.open_websocket(host, int(listen_port), "/ws?clientId=t1", use_ssl=False,
                                             extra_headers=[(b"origin", url.encode())]) as ws:
        with trio.fail_after(10):
            assert json.loads(await ws.get_message())["type"] == "status"
        yield ws


async def test_websocket_progress_passes_through_without_the_lock(start_steward: StewardFactory, comfy) -> None:  # type: ignore[no-untyped-def]
    port, gpu = comfy()
    steward, url = steward_with(start_steward, port, gpu)
    async with open_progress_socket(url) as ws:
        async with httpx.AsyncClient() as http:
            answer = await http.post(f"{url}/prompt", json={**workflow(0.3), "client_id": "t1"}, timeout=30)
        prompt_id = answer.json()["prompt_id"]
        seen = []
        with trio.fail_after(20):
            while True:
                message = await ws.get_message()
                if isinstance(message, bytes):
                    continue
                data = json.loads(message)
                seen.append(data["type"])
                if data["type"] == "executing" and data["data"].get("node") is None \
                        and data["data"].get("prompt_id") == prompt_id:
                    break
    assert {"execution_start", "progress", "executed"} <= set(seen)
    assert len(steward.events("image_queued")) == 1  # the prompt took the GPU; the websocket never did


async def test_a_websocket_is_told_when_steward_stops_and_does_not_hold_the_stop_open(
        start_steward: StewardFactory, comfy) -> None:  # type: ignore[no-untyped-def]
    port, gpu = comfy()
    steward, url = steward_with(start_steward, port, gpu)
    async with open_progress_socket(url) as ws:
        stopped: list[int] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: trio.to_thread.run_sync(lambda: stopped.append(steward.stop())))
            with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                while True:
                    await ws.get_message()
    assert closed.value.reason.code == 1001  # going away
    assert stopped == [0]


def both_services(start_steward: StewardFactory, gpu_dir: Path, ollama_model: str, comfy_args: list[str],
                  **comfyui: Any) -> tuple[RunningSteward, int]:
    """A steward that supervises a fake Ollama and a fake ComfyUI on one simulated 16 GiB GPU;
    returns it and Ollama's own port."""
    gpu = simgpu.create_device(gpu_dir, total_bytes=parse_size("16GiB"), linger_s=0.1)
    ollama_port, comfy_port = free_port(), free_port()
    steward = start_steward({}, gpu={"probe": "simulated", "simulated_dir": str(gpu), "poll_interval": "0.1s"},
                            ollama={"upstream": f"127.0.0.1:{ollama_port}", "listen": f"127.0.0.1:{free_port()}",
                                    "memory": "4GiB", "ps_poll": "0.2s", "unload_poll": "0.1s",
                                    "command": [sys.executable, "-m", "fakes.ollama", "--port", str(ollama_port),
                                                "--sim-gpu", str(gpu), "--model", ollama_model]},
                            comfyui={"upstream": f"127.0.0.1:{comfy_port}", "listen": f"127.0.0.1:{free_port()}",
                                     "history_poll": "0.1s", "free_timeout": "5s", **comfyui,
                                     "command": [sys.executable, "-m", "fakes.comfyui", "--port", str(comfy_port),
                                                 "--sim-gpu", str(gpu), "--model-memory", "6GiB", *comfy_args]})
    return steward, ollama_port


def test_an_ollama_chat_during_an_image_is_held_until_free_with_both_services_supervised(
        start_steward: StewardFactory, tmp_path: Path) -> None:
    steward, ollama_port = both_services(start_steward, tmp_path / "gpu2", "gemma3:4b,size=4GiB,load=0.2s",
                                         ["--free-delay", "0.3s"], warm_model="gemma3:4b")
    listening = steward.wait_event("listening")
    ollama_url, comfy_url = listening["ollama"][0], listening["comfyui"][0]
    # Both children up. A service steward spawned gets time to bind its port: no warning.
    probes = [steward.wait_event("upstream_probe", service=s, timeout=30) for s in ("ollama", "comfyui")]
    assert [(p["level"], p["status"]) for p in probes] == [("info", 200), ("info", 200)]
    assert all(p["version"] for p in probes)
    chat = {"model": "gemma3:4b", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    assert httpx.post(f"{ollama_url}/api/chat", json=chat, timeout=30).status_code == 200  # Ollama holds 4 GiB
    prompt_id = httpx.post(f"{comfy_url}/prompt", json=workflow(1.0), timeout=30).json()["prompt_id"]
    steward.wait_event("image_forwarded", prompt_id=prompt_id)
    assert httpx.get(f"http://127.0.0.1:{ollama_port}/api/ps").json()["models"] == []  # unloaded first
    held = httpx.post(f"{ollama_url}/api/chat", json=chat, timeout=30)  # arrives during the image
    assert held.status_code == 200
    freed = steward.wait_event("image_freed", prompt_id=prompt_id)["mono"]
    ollama_dispatches = [e["mono"] for e in steward.events("dispatch") if e["model"] == "ollama"]
    assert ollama_dispatches[-1] > freed  # held until /free was called and the memory came back
    assert [e["engine"] for e in steward.events("spawn")] == ["ollama", "comfyui"]
    warmed = steward.wait_event("ollama_warm")  # the chat model, loaded again once the GPU was idle
    assert warmed["model"] == "gemma3:4b" and warmed["status"] == 200
    assert steward.stop() == 0
    exits = {e["engine"]: (e["requested"], e["status"]) for e in steward.events("exit")}
    assert exits == {"ollama": (True, "exited with status 0"), "comfyui": (True, "exited with status 0")}


def test_an_image_proceeds_when_ollama_is_unreachable_and_a_job_past_its_timeout_is_released(
        start_steward: StewardFactory, comfy) -> None:  # type: ignore[no-untyped-def]
    port, gpu = comfy()
    dead = free_port()  # nothing listens there: Ollama is down
    steward = start_steward({}, gpu={"probe": "simulated", "simulated_dir": str(gpu), "poll_interval": "0.1s"},
                            ollama={"upstream": f"127.0.0.1:{dead}", "listen": None, "retry_initial": "0.2s",
                                    "retry_max": "0.5s"},
                            comfyui={"upstream": f"127.0.0.1:{port}", "listen": f"127.0.0.1:{free_port()}",
                                     "history_poll": "0.1s", "job_timeout": "1s", "free_timeout": "3s"})
    url = steward.wait_event("listening")["comfyui"][0]
    answer = httpx.post(f"{url}/prompt", json=workflow(10.0), timeout=30)  # runs longer than the job timeout
    assert answer.status_code == 200
    finished = steward.wait_event("image_finished", timeout=10)
    assert finished["outcome"] == "timeout"  # released by the timeout, logged as a warning
    assert finished["level"] == "warning"
    steward.wait_event("image_released", prompt_id=finished["prompt_id"])
    assert steward.wait_event("upstream_probe")["level"] == "warning"  # Ollama's absence: logged, not fatal


def test_ollama_dying_before_an_image_does_not_block_it(start_steward: StewardFactory, comfy) -> None:  # type: ignore[no-untyped-def]
    import os

    port, gpu = comfy()
    ollama_port = free_port()
    steward = start_steward({}, gpu={"probe": "simulated", "simulated_dir": str(gpu), "poll_interval": "0.1s"},
                            ollama={"upstream": f"127.0.0.1:{ollama_port}", "listen": f"127.0.0.1:{free_port()}",
                                    "memory": "2GiB", "unload_timeout": "2s", "retry_initial": "5s",
                                    "command": [sys.executable, "-m", "fakes.ollama", "--port", str(ollama_port),
                                                "--model", "gemma3:4b,size=2GiB,load=0.1s"]},
                            comfyui={"upstream": f"127.0.0.1:{port}", "listen": f"127.0.0.1:{free_port()}",
                                     "history_poll": "0.1s", "free_timeout": "3s"})
    listening = steward.wait_event("listening")
    ollama_url, comfy_url = listening["ollama"][0], listening["comfyui"][0]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if httpx.post(f"{ollama_url}/api/generate", json={"model": "gemma3:4b", "prompt": "x", "stream": False},
                          timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    os.kill(steward.wait_event("spawn", engine="ollama")["pid"], signal.SIGKILL)  # Ollama dies, still "loaded"
    answer = httpx.post(f"{comfy_url}/prompt", json=workflow(0.3), timeout=30)
    assert answer.status_code == 200
    # Its death is noticed (its process is steward's): nothing left to unload, and the image went on.
    crash = steward.wait_event("crash", engine="ollama")
    assert "killed by SIGKILL" in crash["detail"]
    steward.wait_event("image_released", prompt_id=answer.json()["prompt_id"], timeout=15)


def test_an_image_whose_client_leaves_while_a_chat_runs_unloads_nothing(start_steward: StewardFactory,
                                                                         tmp_path: Path) -> None:
    """Issue 15: the image job drained Ollama behind a running chat; its client left while it
    waited: when the chat ends, Ollama keeps its model (no keep_alive: 0), the next chat needs no load."""
    steward, ollama_port = both_services(start_steward, tmp_path / "gpu3", "gemma3:4b,size=4GiB,load=0.2s,tps=10",
                                         [], memory="14GiB")
    listening = steward.wait_event("listening")
    ollama_url, comfy_url = listening["ollama"][0], listening["comfyui"][0]
    for service in ("ollama", "comfyui"):
        steward.wait_event("upstream_probe", service=service, timeout=30)
    chat = {"model": "gemma3:4b", "messages": [{"role": "user", "content": "hi"}], "stream": False,
            "options": {"num_predict": 30}}  # three seconds at 10 tokens/s
    answers: list[int] = []
    running = threading.Thread(target=lambda: answers.append(
        httpx.post(f"{ollama_url}/api/chat", json=chat, timeout=60).status_code))
    running.start()
    wait_until(lambda: any(e["model"] == "ollama" for e in steward.events("dispatch")))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{comfy_url}/prompt", json=workflow(0.5), timeout=0.5)  # waits behind the chat, then leaves
    steward.wait_event("evict", engine="ollama")
    undone = steward.wait_event("evict_undone", engine="ollama")
    assert undone["why"].startswith("exclusive job")
    running.join()
    assert answers == [200]
    assert [m["name"] for m in httpx.get(f"http://127.0.0.1:{ollama_port}/api/ps").json()["models"]] == ["gemma3:4b"]
    assert not steward.events("ollama_unload") and not steward.events("image_forwarded")
    quick = {**chat, "options": {"num_predict": 1}}
    assert httpx.post(f"{ollama_url}/api/chat", json=quick, timeout=30).status_code == 200
    assert not steward.events("ollama_unload")


def test_an_image_upload_larger_than_the_chat_body_limit_streams_through(start_steward: StewardFactory,
                                                                         comfy) -> None:  # type: ignore[no-untyped-def]
    """Issue 15: a 19 MiB upload got no answer (the listener took the 16 MiB chat limit). The
    ComfyUI listener has its own limit, streams the body on, and refuses beyond it in ComfyUI's shape."""
    port, gpu = comfy()
    steward, url = steward_with(start_steward, port, gpu, max_body_size="24MiB")
    image = bytes(range(256)) * (19 * 4096)  # 19 MiB
    stored = httpx.post(f"{url}/upload/image", files={"image": ("big.png", image, "image/png")},
                        data={"overwrite": "true"}, timeout=60)
    assert stored.status_code == 200, stored.text
    assert stored.json() == {"name": "big.png", "subfolder": "", "type": "input"}
    viewed = httpx.get(f"{url}/view", params={"filename": "big.png", "type": "input"}, timeout=60)
    assert viewed.status_code == 200 and viewed.content == image
    too_big = httpx.post(f"{url}/upload/image", files={"image": ("huge.png", image + image[: 6 * 2**20])},
                         timeout=60)
    assert too_big.status_code == 413
    assert too_big.json()["error"]["type"] == "request_too_large" and "node_errors" in too_big.json()
    assert not steward.events("internal_error")


def test_a_value_out_of_range_is_refused_as_comfyui_refuses_it_before_anything_is_unloaded(
        start_steward: StewardFactory, comfy) -> None:  # type: ignore[no-untyped-def]
    port, gpu = comfy()
    steward, url = steward_with(start_steward, port, gpu, {"chat": fake_model("6GiB", gpu_dir=gpu)})
    chat = {"model": "chat", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    assert httpx.post(f"{steward.base_url}/chat/completions", json=chat, timeout=30).status_code == 200
    bad = {"prompt": {"1": {"class_type": "EmptyImage", "inputs": {"width": 0, "height": 8, "batch_size": 1,
                                                                    "color": 0}},
                      "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "t"}}}}
    refused = httpx.post(f"{url}/prompt", json=bad, timeout=30)
    direct = httpx.post(f"http://127.0.0.1:{port}/prompt", json=bad, timeout=30)  # the fake's own validation
    assert refused.status_code == direct.status_code == 400
    assert refused.content == direct.content  # byte for byte
    assert refused.json()["node_errors"]["1"]["errors"][0]["type"] == "value_smaller_than_min"
    assert steward.wait_event("image_refused")["type"] == "prompt_outputs_failed_validation"
    assert not steward.events("image_queued") and not steward.events("evict")  # the chat model stays loaded
    assert httpx.get(f"http://127.0.0.1:{port}/fake/stats").json()["prompts_queued"] == 0
