"""Steward's ComfyUI listener in front of the real ComfyUI (0.3.64 on CPU; fakes/comfyui_env.py).

One ComfyUI serves the module (and tests/test_real_videos.py after it; conftest's `comfy_server`): started once from the install cache with `--base-directory`
in a temporary folder, so its outputs, uploads, database and custom nodes are the module's
own and the cache stays as installed. A custom node written here, `StewardSteps`, gives
jobs of any length with `progress` messages (one per step), holds a job until a file
exists (so a test decides when it ends, instead of guessing how long it takes), and fails
on demand; the same file records ComfyUI's own view of `POST /free` (the flags it sets,
with ComfyUI's clock) under `/steward_test/flags`. Every job is weight-free and short, and
every prompt differs from the ones before it: ComfyUI answers a repeated prompt from its
cache without running it.

Each test starts its own steward in front of that ComfyUI, with a budget of host memory
(probe `none`) and, where a test needs one, a fake llama-server chat model. What a route
answers through steward is compared with what ComfyUI answers directly. Without
STEWARD_COMFYUI_SRC the module skips, saying what is missing; with it set and no complete
install, it fails with the command that installs it.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
import trio_websocket

from fakes.comfyui_env import ComfyInstall, MissingSource, comfyui_install
from tests.conftest import MODULE_SCOPED, RunningSteward, StewardFactory, fake_model, free_port, stop_process
from tests.fake_processes import wait_until

pytestmark = pytest.mark.slow

# A start takes 13-14 s on a quiet 2-core machine (real_runtimes.md); a busy one, several times that.
START_TIMEOUT_S = 300.0
JOB_TIMEOUT_S = 60.0  # the longest any test waits for a job that is not held
PHASES = ["image_queued", "image_granted", "image_forwarded", "image_finished", "image_freed", "image_released"]
FOREIGN_ORIGIN = "http://evil.example"

TEST_NODES = '''\
"""Written by gpu-steward's tests/test_real_comfyui.py: a job of steps with progress messages,
held until a file exists or failing on demand; and ComfyUI's own record of POST /free."""
import os
import time

from aiohttp import web

import comfy.model_management
import comfy.utils
from server import PromptServer


class StewardSteps:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"image": ("IMAGE",),
                             "steps": ("INT", {"default": 1, "min": 1, "max": 1000000}),
                             "step_seconds": ("FLOAT", {"default": 0.05, "min": 0.0, "max": 10.0, "step": 0.01}),
                             "fail_at": ("INT", {"default": -1, "min": -1, "max": 1000000}),
                             "hold": ("STRING", {"default": ""})}}

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "run"
    CATEGORY = "steward_test"

    def run(self, image, steps, step_seconds, fail_at, hold):
        bar = comfy.utils.ProgressBar(steps)
        step = 0
        while step < steps or (hold and not os.path.exists(hold)):
            if step == fail_at:
                raise RuntimeError(f"StewardSteps fails at step {step}, as asked")
            comfy.model_management.throw_exception_if_processing_interrupted()
            time.sleep(step_seconds)
            step += 1
            bar.update_absolute(min(step, steps))  # one progress message per step
        return (image,)


NODE_CLASS_MAPPINGS = {"StewardSteps": StewardSteps}

FLAGS = []
_queue = PromptServer.instance.prompt_queue
_set_flag = _queue.set_flag


def _recording_set_flag(name, data):
    FLAGS.append({"flag": name, "value": data, "ms": time.time() * 1000})
    _set_flag(name, data)


_queue.set_flag = _recording_set_flag


@PromptServer.instance.routes.get("/steward_test/flags")
async def _flags(request):
    return web.json_response(FLAGS)
'''


@attrs.define
class Comfy:
    """The module's ComfyUI: its process, its folder, the prompts it has been sent."""

    process: subprocess.Popen[bytes]
    port: int
    base: Path
    log: Path
    colors: Iterator[int]  # EmptyImage's color: a fresh one makes every prompt new to ComfyUI's cache
    holds: list[Path] = attrs.Factory(list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", timeout=30, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", timeout=60, **kwargs)

    def prompt(self, *, steps: int = 0, step_seconds: float = 0.05, fail_at: int = -1, hold: Path | None = None,
               client_id: str = "steward-test") -> dict[str, Any]:
        """EmptyImage -> [StewardSteps] -> ImageInvert -> SaveImage, 16x16, weight-free."""
        nodes: dict[str, Any] = {"1": {"class_type": "EmptyImage", "inputs": {
            "width": 16, "height": 16, "batch_size": 1, "color": next(self.colors)}}}
        image = ["1", 0]
        if steps or hold is not None:
            nodes["2"] = {"class_type": "StewardSteps", "inputs": {
                "image": image, "steps": max(steps, 1), "step_seconds": step_seconds, "fail_at": fail_at,
                "hold": str(hold or "")}}
            image = ["2", 0]
        nodes["3"] = {"class_type": "ImageInvert", "inputs": {"image": image}}
        nodes["4"] = {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "steward"}}
        return {"prompt": nodes, "client_id": client_id}

    def hold(self, name: str) -> Path:
        """A path a held job waits for; every hold is let go after its test."""
        path = self.base / "holds" / name
        self.holds.append(path)
        return path

    def history(self, prompt_id: str) -> dict[str, Any] | None:
        return self.get(f"/history/{prompt_id}").json().get(prompt_id)

    def wait_done(self, prompt_id: str, timeout: float = JOB_TIMEOUT_S) -> dict[str, Any]:
        wait_until(lambda: self.history(prompt_id) is not None, timeout=timeout)
        entry = self.history(prompt_id)
        assert entry is not None
        return entry

    def running(self) -> list[str]:
        queue = self.get("/queue").json()
        return [item[1] for item in queue["queue_running"] + queue["queue_pending"]]

    def flags(self) -> list[dict[str, Any]]:
        return self.get("/steward_test/flags").json()

    def settle(self) -> None:
        """Let every held job go and wait until ComfyUI's queue is empty (interrupting what is left)."""
        for path in self.holds:
            path.touch()
        self.holds.clear()
        try:
            wait_until(lambda: not self.running(), timeout=30)
        except AssertionError:
            self.post("/queue", json={"clear": True})
            self.post("/interrupt")
            wait_until(lambda: not self.running(), timeout=30)


def require_comfyui() -> ComfyInstall:
    """The installed ComfyUI; the module skips without STEWARD_COMFYUI_SRC, fails without its install."""
    try:
        return comfyui_install()
    except MissingSource as exc:
        pytest.skip(f"no real ComfyUI: {exc}")
    except FileNotFoundError as exc:
        pytest.fail(str(exc), pytrace=False)


def start_comfyui(install: ComfyInstall, base: Path) -> tuple[subprocess.Popen[bytes], int, Path]:
    for folder in ("custom_nodes", "input", "output", "temp", "user", "models", "holds"):
        (base / folder).mkdir()
    (base / "custom_nodes" / "steward_test_nodes.py").write_text(TEST_NODES)
    port, log = free_port(), base / "comfyui.log"
    argv = [str(install.python), str(install.main), "--cpu", "--listen", "127.0.0.1", "--port", str(port),
            "--base-directory", str(base), "--database-url", f"sqlite:///{base / 'user' / 'comfyui.db'}",
            "--disable-auto-launch"]
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, cwd=install.folder, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT)
    return process, port, log


def wait_ready(process: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"ComfyUI exited {process.returncode} at start:\n{log.read_text()[-3000:]}", pytrace=False)
        try:
            if httpx.get(f"http://127.0.0.1:{port}/system_stats", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    pytest.fail(f"ComfyUI did not answer within {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}", pytrace=False)


def comfy_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Comfy]:
    """The real ComfyUI for the tests, started, and stopped when the generator is closed:
    conftest's ``comfy_server``, which this module and tests/test_real_videos.py share (they run
    on one worker, one after the other: conftest's ONE_WORKER_FIRST), so its start (~15 s of both
    cores) is paid once."""
    install = require_comfyui()
    base = tmp_path_factory.mktemp("comfyui")
    process, port, log = start_comfyui(install, base)
    MODULE_SCOPED.add(process.pid)
    try:
        wait_ready(process, port, log)
        comfy = Comfy(process, port, base, log, iter(range(1, 2**24)))
        # ComfyUI's first /object_info creates input/3d (its Load3D node's folder), so the answers after it
        # list that folder where the first did not: asked once here, every later answer is the same.
        comfy.get("/object_info")
        assert "StewardSteps" in comfy.get("/object_info/StewardSteps").json(), log.read_text()[-3000:]
        yield comfy
    finally:
        stop_process(process, grace=20)
        MODULE_SCOPED.discard(process.pid)


def steward_for(start_steward: StewardFactory, comfy: Comfy, models: dict[str, Any] | None = None,
                **extra: Any) -> tuple[RunningSteward, str]:
    """A steward whose ComfyUI listener stands in front of *comfy*; returns it and the listener's URL."""
    steward = start_steward(models or {}, gpu={"probe": "none", "budget": "16GiB"}, comfyui={
        "upstream": f"127.0.0.1:{comfy.port}", "listen": f"127.0.0.1:{free_port()}", "history_poll": "0.1s",
        "free_timeout": "2s", "job_timeout": "120s", **extra})
    return steward, steward.wait_event("listening")["comfyui"][0]


def names(steward: RunningSteward, *wanted: str) -> list[str]:
    return [e["event"] for e in steward.events() if e["event"] in wanted]


def chat(max_tokens: int = 1) -> dict[str, Any]:
    return {"model": "chat", "messages": [{"role": "user", "content": "x"}], "max_tokens": max_tokens}


def answer_of(response: httpx.Response) -> tuple[int, str | None, bytes]:
    return response.status_code, response.headers.get("content-type"), response.content


def without_volatile(stats: dict[str, Any]) -> dict[str, Any]:
    """/system_stats without what changes from one call to the next (free memory)."""
    system = {k: v for k, v in stats["system"].items() if k != "ram_free"}
    devices = [{k: v for k, v in d.items() if not k.endswith("_free")} for d in stats["devices"]]
    return {**stats, "system": system, "devices": devices}


@contextmanager
def client_that_leaves(url: str, path: str, body: dict[str, Any]) -> Iterator[None]:
    """A client that POSTs *body* and, when the block ends, leaves without reading the answer."""
    host, _, port = url.removeprefix("http://").rpartition(":")
    data = json.dumps(body).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        yield


def in_thread(call: Callable[[], httpx.Response]) -> tuple[threading.Thread, list[httpx.Response]]:
    answers: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: answers.append(call()))
    thread.start()
    return thread, answers


# --- pass-through --------------------------------------------------------------------------

def test_every_passthrough_route_answers_as_comfyui_itself(start_steward: StewardFactory, comfy: Comfy) -> None:
    steward, url = steward_for(start_steward, comfy)
    prompt_id = comfy.post("/prompt", json=comfy.prompt()).json()["prompt_id"]  # an output to view
    image = comfy.wait_done(prompt_id)["outputs"]["4"]["images"][0]
    view = f"/view?filename={image['filename']}&subfolder={image['subfolder']}&type={image['type']}"
    for path in ("/", "/object_info/EmptyImage", "/api/object_info/SaveImage", "/object_info", "/queue", "/prompt",
                 "/api/prompt", "/history", f"/history/{prompt_id}", "/history?max_items=1", "/history/unknown",
                 "/features", "/embeddings", "/extensions", "/models", "/models/checkpoints", view,
                 f"/api{view}&channel=rgb", "/view?filename=missing.png", "/view?filename=../x", "/no/such/route"):
        assert answer_of(httpx.get(f"{url}{path}", timeout=30)) == answer_of(comfy.get(path)), path
    for path in ("/system_stats", "/api/system_stats"):
        relayed, direct = httpx.get(f"{url}{path}", timeout=30), comfy.get(path)
        assert relayed.status_code == direct.status_code == 200
        assert relayed.headers["content-type"] == direct.headers["content-type"]
        assert without_volatile(relayed.json()) == without_volatile(direct.json())
    assert relayed.json()["system"]["comfyui_version"] == "0.3.64"
    # The POSTs that change nothing here (nothing runs, nothing to delete) and a body that is not JSON.
    for path, body in (("/interrupt", b"{}"), ("/queue", b'{"delete": ["unknown"]}'), ("/history", b'{"delete": []}'),
                       ("/free", b'{"unload_models": false}'), ("/queue", b"not json")):
        relayed = httpx.post(f"{url}{path}", content=body, timeout=30)
        assert answer_of(relayed) == answer_of(comfy.post(path, content=body)), (path, body)
    assert answer_of(relayed)[:2] == (500, "text/plain; charset=utf-8")  # ComfyUI's own answer to a bad body
    assert not steward.events("image_queued")  # none of these took the GPU


def test_a_large_upload_and_its_view_are_comfyuis_own(start_steward: StewardFactory, comfy: Comfy) -> None:
    """19 MiB, beyond the 16 MiB chat body limit: streamed on to ComfyUI and answered as it answers."""
    steward, url = steward_for(start_steward, comfy)
    image = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * (19 * 4096)
    form = {"overwrite": "true", "subfolder": "steward"}
    answers = [httpx.post(f"{where}/upload/image", files={"image": ("big.png", image, "image/png")}, data=form,
                          timeout=120) for where in (comfy.url, url)]
    assert answer_of(answers[1]) == answer_of(answers[0])
    assert answers[1].json() == {"name": "big.png", "subfolder": "steward", "type": "input"}
    assert (comfy.base / "input" / "steward" / "big.png").read_bytes() == image
    view = "/view?filename=big.png&subfolder=steward&type=input"
    relayed, direct = httpx.get(f"{url}{view}", timeout=60), comfy.get(view)
    assert answer_of(relayed) == answer_of(direct)
    assert relayed.content == image and relayed.headers["content-type"] == "image/png"
    assert not steward.events("internal_error") and not steward.events("image_queued")


# --- image jobs ----------------------------------------------------------------------------

def test_an_image_job_holds_the_gpu_until_comfyui_was_freed_after_it(start_steward: StewardFactory,
                                                                      comfy: Comfy) -> None:
    steward, url = steward_for(start_steward, comfy)
    flags_before = len(comfy.flags())
    answer = httpx.post(f"{url}/prompt", json=comfy.prompt(), timeout=60)
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/json; charset=utf-8"
    body = answer.json()
    assert set(body) == {"prompt_id", "number", "node_errors"} and body["node_errors"] == {}  # ComfyUI's own
    prompt_id = body["prompt_id"]
    released = steward.wait_event("image_released", prompt_id=prompt_id, timeout=JOB_TIMEOUT_S)
    assert names(steward, *PHASES) == PHASES
    assert steward.wait_event("image_forwarded")["prompt_id"] == prompt_id
    assert steward.wait_event("image_finished")["outcome"] == "success"
    assert released["held_s"] > 0
    entry = httpx.get(f"{url}/history/{prompt_id}", timeout=30).json()[prompt_id]
    assert entry["status"]["status_str"] == "success" and entry["status"]["completed"] is True
    assert [image["type"] for image in entry["outputs"]["4"]["images"]] == ["output"]
    # ComfyUI's side: /free set its two flags once, after the prompt had succeeded (ComfyUI's clock).
    success_ms = dict(entry["status"]["messages"])["execution_success"]["timestamp"]
    flags = comfy.flags()[flags_before:]
    assert [(f["flag"], f["value"]) for f in flags] == [("unload_models", True), ("free_memory", True)]
    assert all(f["ms"] >= success_ms for f in flags)
    assert httpx.get(f"{url}/healthz", timeout=10).json()["state"] == "idle"


def test_a_node_that_fails_ends_the_job_and_the_gpu_is_given_back(start_steward: StewardFactory,
                                                                  comfy: Comfy) -> None:
    steward, url = steward_for(start_steward, comfy)
    prompt_id = httpx.post(f"{url}/prompt", json=comfy.prompt(steps=3, fail_at=1), timeout=60).json()["prompt_id"]
    steward.wait_event("image_released", prompt_id=prompt_id, timeout=JOB_TIMEOUT_S)
    assert names(steward, *PHASES) == PHASES
    assert steward.wait_event("image_finished")["outcome"] == "error"
    entry = comfy.history(prompt_id)
    assert entry is not None and entry["status"]["status_str"] == "error"
    error = dict(entry["status"]["messages"])["execution_error"]
    assert error["exception_message"] == "StewardSteps fails at step 1, as asked\n"  # ComfyUI adds the newline


def test_a_chat_during_an_image_job_waits_until_comfyui_was_freed(start_steward: StewardFactory,
                                                                  comfy: Comfy) -> None:
    steward, url = steward_for(start_steward, comfy, {"chat": fake_model("2GiB")})
    assert httpx.post(f"{steward.base_url}/chat/completions", json=chat(), timeout=30).status_code == 200
    hold = comfy.hold("chat-waits")
    image, image_answer = in_thread(lambda: httpx.post(f"{url}/prompt", json=comfy.prompt(hold=hold), timeout=60))
    prompt_id = steward.wait_event("image_forwarded", timeout=JOB_TIMEOUT_S)["prompt_id"]
    wait_until(lambda: comfy.running() == [prompt_id], timeout=30)  # ComfyUI runs it: held until the file exists
    dispatched = len(steward.events("dispatch"))
    held, held_answer = in_thread(lambda: httpx.post(f"{steward.base_url}/chat/completions", json=chat(),
                                                     timeout=60))
    wait_until(lambda: len([e for e in steward.events("enqueue") if e["model"] == "chat"]) == 2, timeout=30)
    assert len(steward.events("dispatch")) == dispatched  # it waits while the image job runs
    hold.touch()
    for thread in (image, held):
        thread.join(JOB_TIMEOUT_S)
    assert image_answer[0].status_code == 200 and held_answer[0].status_code == 200
    freed = steward.wait_event("image_freed", prompt_id=prompt_id)
    granted = steward.wait_event("image_granted")
    chat_dispatches = [e["mono"] for e in steward.events("dispatch") if e["model"] == "chat"]
    assert chat_dispatches[1] > freed["mono"]  # after ComfyUI was told to free its memory, not before
    evicted = steward.wait_event("evict", engine="chat")
    assert evicted["for_engine"] == "exclusive" and evicted["mono"] < granted["mono"]
    assert [e["engine"] for e in steward.events("load")] == ["chat", "chat"]  # loaded again after the job


def comfyui_only_refusal(comfy: Comfy) -> dict[str, Any]:
    """A prompt only ComfyUI can refuse: a custom node's INT below its minimum (a custom node's
    VALIDATE_INPUTS could allow it, and /object_info cannot say whether it has one)."""
    bad = comfy.prompt(steps=1)
    bad["prompt"]["2"]["inputs"]["steps"] = 0
    return bad


def out_of_range_prompt(comfy: Comfy) -> dict[str, Any]:
    """A prompt steward refuses as ComfyUI would: EmptyImage's width below its minimum."""
    bad = comfy.prompt()
    bad["prompt"]["1"]["inputs"]["width"] = 0
    return bad


def test_a_prompt_only_comfyui_can_refuse_comes_back_unchanged_and_releases_at_once(
        start_steward: StewardFactory, comfy: Comfy) -> None:
    steward, url = steward_for(start_steward, comfy)
    bad = comfyui_only_refusal(comfy)
    relayed, direct = httpx.post(f"{url}/prompt", json=bad, timeout=60), comfy.post("/prompt", json=bad)
    assert answer_of(relayed) == answer_of(direct)
    assert direct.status_code == 400 and direct.json()["error"]["type"] == "prompt_outputs_failed_validation"
    assert direct.json()["node_errors"]["2"]["errors"][0]["type"] == "value_smaller_than_min"
    released = steward.wait_event("image_released", prompt_id=None, timeout=30)
    assert steward.wait_event("image_forwarded")["status"] == 400
    assert names(steward, *PHASES) == ["image_queued", "image_granted", "image_forwarded", "image_released"]
    assert released["held_s"] < 5  # no /history to follow, no /free
    assert comfy.running() == []


def test_a_prompt_only_comfyui_can_refuse_unloads_nothing(start_steward: StewardFactory, comfy: Comfy) -> None:
    steward, url = steward_for(start_steward, comfy, {"chat": fake_model("2GiB")})
    assert httpx.post(f"{steward.base_url}/chat/completions", json=chat(), timeout=30).status_code == 200
    assert httpx.post(f"{url}/prompt", json=out_of_range_prompt(comfy), timeout=60).status_code == 400
    assert steward.wait_event("image_refused")["type"] == "prompt_outputs_failed_validation"
    assert not steward.events("image_queued")  # the GPU was never taken
    assert not steward.events("evict") and not steward.events("stop")  # the chat model stays loaded


# --- ComfyUI's input validation, mirrored (supervisor/gateway/comfy/inputs.py) ---------------------------

RECORDED = json.loads((Path(__file__).parent / "data" / "comfy_object_info.json").read_text())


def without_tracebacks(value: Any) -> Any:
    """An answer as steward can give it: the traceback of an exception names ComfyUI's own files."""
    if isinstance(value, dict):
        return {k: [] if k == "traceback" else without_tracebacks(v) for k, v in value.items()}
    return [without_tracebacks(v) for v in value] if isinstance(value, list) else value


def post_raw(url: str, body: dict[str, Any]) -> httpx.Response:
    """POST /prompt with Python's json (NaN as ComfyUI's json.loads reads it)."""
    return httpx.post(f"{url}/prompt", content=json.dumps(body), headers={"content-type": "application/json"},
                      timeout=60)


def unordered(answer: dict[str, Any]) -> dict[str, Any]:
    """An answer without the orders ComfyUI's sets leave open (a node's errors, the outputs)."""
    error = {**answer["error"], "details": sorted(answer["error"]["details"].splitlines())}
    nodes = {node: {**entry, "errors": sorted(entry["errors"], key=json.dumps),
                    "dependent_outputs": sorted(entry["dependent_outputs"])}
             for node, entry in answer["node_errors"].items()}
    return {"error": error, "node_errors": dict(sorted(nodes.items()))}


def test_the_recorded_answers_are_what_comfyui_answers(comfy: Comfy) -> None:
    """tests/data/comfy_object_info.json, which tests/test_comfy_inputs.py tests steward against, is still true."""
    for name, entry in RECORDED["object_info"].items():
        live = comfy.get(f"/object_info/{name}").json()[name]
        if name == "LoadImage":
            live["input"]["required"]["image"][0] = []  # the files in its input folder: this module uploads some
        assert live == entry, name
    for answer in RECORDED["answers"]:
        direct = post_raw(comfy.url, answer["request"])
        assert direct.status_code == answer["status"], answer["case"]
        if direct.status_code == 400:
            assert without_tracebacks(direct.json()) == answer["body"], answer["case"]


def test_bad_prompts_are_refused_by_steward_before_the_gpu_is_taken_as_comfyui_refuses_them(
        start_steward: StewardFactory, comfy: Comfy) -> None:
    steward, url = steward_for(start_steward, comfy, {"chat": fake_model("2GiB")})
    assert httpx.post(f"{steward.base_url}/chat/completions", json=chat(), timeout=30).status_code == 200
    refused = [a for a in RECORDED["answers"] if a["steward"] == "refuses"]
    for answer in refused:
        relayed, direct = post_raw(url, answer["request"]), post_raw(comfy.url, answer["request"])
        assert relayed.status_code == direct.status_code == 400, answer["case"]
        assert relayed.headers["content-type"] == direct.headers["content-type"], answer["case"]
        traced = b'"traceback": [' in direct.content and b'"traceback": []' not in direct.content
        if traced:  # an exception: all but the traceback
            assert relayed.content == json.dumps(without_tracebacks(direct.json())).encode(), answer["case"]
        else:
            assert relayed.content == direct.content, answer["case"]  # byte for byte
    # Several errors in a node and several failing outputs: ComfyUI's order is its sets', steward's the prompt's.
    many = comfy.prompt()
    many["prompt"]["1"]["inputs"].update(width="wide", height=0, batch_size=5000)
    del many["prompt"]["1"]["inputs"]["color"]
    many["prompt"]["5"] = {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}}
    relayed, direct = httpx.post(f"{url}/prompt", json=many, timeout=60), comfy.post("/prompt", json=many)
    assert relayed.status_code == direct.status_code == 400
    assert unordered(relayed.json()) == unordered(direct.json())
    assert len(steward.events("image_refused")) == len(refused) + 1
    assert not steward.events("image_queued") and not steward.events("evict")  # the chat model never unloaded
    assert comfy.running() == []


def test_a_prompt_whose_outputs_fail_only_in_part_runs_what_passes(start_steward: StewardFactory,
                                                                   comfy: Comfy) -> None:
    steward, url = steward_for(start_steward, comfy)
    mixed = comfy.prompt()
    mixed["prompt"].update({"5": {"class_type": "EmptyImage", "inputs": {"width": 0, "height": 8, "batch_size": 1,
                                                                         "color": next(comfy.colors)}},
                            "6": {"class_type": "SaveImage", "inputs": {"images": ["5", 0], "filename_prefix": "x"}}})
    answer = httpx.post(f"{url}/prompt", json=mixed, timeout=60)
    assert answer.status_code == 200  # ComfyUI's own answer: it runs output 4, and says why not 6
    body = answer.json()
    assert body["node_errors"]["5"]["dependent_outputs"] == ["6"]
    assert body["node_errors"]["5"]["errors"][0]["type"] == "value_smaller_than_min"
    steward.wait_event("image_released", prompt_id=body["prompt_id"], timeout=JOB_TIMEOUT_S)
    assert names(steward, *PHASES) == PHASES and not steward.events("image_refused")
    assert list(comfy.wait_done(body["prompt_id"])["outputs"]) == ["4"]


def test_a_prompt_naming_an_unknown_node_is_refused_as_comfyui_refuses_it_before_the_gpu_is_taken(
        start_steward: StewardFactory, comfy: Comfy) -> None:
    steward, url = steward_for(start_steward, comfy, {"chat": fake_model("2GiB")})
    assert httpx.post(f"{steward.base_url}/chat/completions", json=chat(), timeout=30).status_code == 200
    bad = comfy.prompt()
    bad["prompt"]["3"]["class_type"] = "NoSuchNode"
    relayed, direct = httpx.post(f"{url}/prompt", json=bad, timeout=60), comfy.post("/prompt", json=bad)
    assert relayed.status_code == direct.status_code == 400
    assert answer_of(relayed) == answer_of(direct)  # byte for byte, and its Content-Type (issue 26)
    assert direct.json()["error"]["type"] == "invalid_prompt"
    assert steward.wait_event("image_refused")["type"] == "invalid_prompt"
    assert not steward.events("image_queued") and not steward.events("evict")


# --- clients that leave --------------------------------------------------------------------

def test_a_client_that_leaves_while_its_prompt_waits_behind_another_never_reaches_comfyui(
        start_steward: StewardFactory, comfy: Comfy) -> None:
    steward, url = steward_for(start_steward, comfy)
    hold = comfy.hold("first")
    first, first_answer = in_thread(lambda: httpx.post(f"{url}/prompt", json=comfy.prompt(hold=hold), timeout=60))
    first_id = steward.wait_event("image_forwarded", timeout=JOB_TIMEOUT_S)["prompt_id"]
    left = comfy.prompt()
    with client_that_leaves(url, "/prompt", left):
        wait_until(lambda: len(steward.events("image_queued")) == 2, timeout=30)
    steward.wait_event("image_abandoned", timeout=30)
    hold.touch()
    first.join(JOB_TIMEOUT_S)
    assert first_answer[0].status_code == 200
    steward.wait_event("image_released", prompt_id=first_id, timeout=JOB_TIMEOUT_S)
    assert [e["prompt_id"] for e in steward.events("image_forwarded")] == [first_id]
    assert len(steward.events("image_granted")) == 1  # the one that left never had the GPU
    assert [e["prompt_id"] for e in steward.events("image_released")] == [first_id]
    assert comfy.running() == []  # ComfyUI never saw it
    assert httpx.get(f"{url}/healthz", timeout=10).json()["state"] == "idle"


def test_an_image_whose_client_leaves_while_a_chat_runs_unloads_nothing(start_steward: StewardFactory,
                                                                         comfy: Comfy) -> None:
    """The image job drained the chat model behind a running chat; its client left while it
    waited: the drain is undone, the model keeps serving, the next chat needs no load."""
    steward, url = steward_for(start_steward, comfy, {"chat": fake_model("2GiB", tps=10)})
    running, running_answer = in_thread(lambda: httpx.post(f"{steward.base_url}/chat/completions",
                                                           json=chat(30), timeout=60))  # three seconds
    steward.wait_event("dispatch", model="chat", timeout=30)
    with client_that_leaves(url, "/prompt", comfy.prompt()):
        steward.wait_event("evict", engine="chat", timeout=30)
    undone = steward.wait_event("evict_undone", engine="chat", timeout=30)
    assert undone["why"].startswith("exclusive job")
    running.join(JOB_TIMEOUT_S)
    assert running_answer[0].status_code == 200
    assert httpx.post(f"{steward.base_url}/chat/completions", json=chat(), timeout=30).status_code == 200
    assert [e["engine"] for e in steward.events("load")] == ["chat"]  # never unloaded, never loaded again
    assert not steward.events("stop") and not steward.events("image_forwarded")


# --- the websocket and /interrupt ----------------------------------------------------------

def host_port(url: str) -> tuple[str, int]:
    host, _, port = url.removeprefix("http://").rpartition(":")
    return host, int(port)


async def ws_rejection(url: str, origin: str) -> int | None:
    """The status a websocket upgrade to *url* with *origin* is refused with (None: accepted)."""
    host, port = host_port(url)
    try:
        async with trio_websocket.open_websocket(host, port, "/ws?clientId=refused", use_ssl=False,
                                                 extra_headers=[(b"origin", origin.encode())]):
            return None
    except trio_websocket.ConnectionRejected as exc:
        return exc.status_code


async def messages_of_one_prompt(ws_url: str, prompt_url: str, prompt: dict[str, Any],
                                 origin: str | None) -> list[dict[str, Any]]:
    """Every message a websocket gets for one prompt, from the first `status` to `executing` null."""
    host, port = host_port(ws_url)
    headers = [(b"origin", origin.encode())] if origin else []
    client_id = prompt["client_id"]
    async with trio_websocket.open_websocket(host, port, f"/ws?clientId={client_id}", use_ssl=False,
                                             extra_headers=headers) as ws:
        messages = [json.loads(await ws.get_message())]
        async with httpx.AsyncClient() as http:
            prompt_id = (await http.post(f"{prompt_url}/prompt", json=prompt, timeout=60)).json()["prompt_id"]
        with trio.fail_after(JOB_TIMEOUT_S):
            while not (messages[-1]["type"] == "executing" and messages[-1]["data"].get("node") is None
                       and messages[-1]["data"].get("prompt_id") == prompt_id):
                message = await ws.get_message()
                if isinstance(message, str):
                    messages.append(json.loads(message))
    return messages


def shape(messages: list[dict[str, Any]]) -> list[tuple[str, object]]:
    """Each message's type and what tells it apart, without ids and times."""
    def key(message: dict[str, Any]) -> object:
        data = message["data"]
        if message["type"] == "status":
            return data["status"]["exec_info"]["queue_remaining"]
        if message["type"] == "progress":
            return data["value"], data["max"], data["node"]
        return data.get("node")
    return [(m["type"], key(m)) for m in messages]


async def test_the_websocket_through_steward_is_comfyuis_own_and_a_foreign_origin_is_refused_alike(
        start_steward: StewardFactory, comfy: Comfy) -> None:
    steward, url = steward_for(start_steward, comfy)
    relayed = await messages_of_one_prompt(url, url, comfy.prompt(steps=3, client_id="through"), url)
    direct = await messages_of_one_prompt(comfy.url, comfy.url, comfy.prompt(steps=3, client_id="direct"), None)
    assert relayed[0] == {"type": "status", "data": {"status": {"exec_info": {"queue_remaining": 0}},
                                                     "sid": "through"}}
    assert shape(relayed) == shape(direct)
    assert [m["data"]["value"] for m in relayed if m["type"] == "progress"] == [1, 2, 3]
    assert {"execution_start", "executed", "execution_success"} <= {m["type"] for m in relayed}
    # Without an Origin (any non-browser client) the same.
    without = await messages_of_one_prompt(url, url, comfy.prompt(steps=3, client_id="plain"), None)
    assert shape(without) == shape(direct)
    # A foreign page is refused by steward as by ComfyUI; the listener's own Origin is rewritten for
    # ComfyUI, which would refuse it (its port is not ComfyUI's).
    assert [await ws_rejection(url, FOREIGN_ORIGIN), await ws_rejection(comfy.url, FOREIGN_ORIGIN)] == [403, 403]
    assert await ws_rejection(comfy.url, url) == 403
    refused = httpx.get(f"{url}/queue", headers={"Origin": FOREIGN_ORIGIN}, timeout=10)
    assert refused.status_code == comfy.get("/queue", headers={"Origin": FOREIGN_ORIGIN}).status_code == 403
    assert len(steward.events("image_queued")) == 2  # the prompts took the GPU; the websockets never did


async def test_interrupt_ends_a_long_job_and_steward_gives_the_gpu_back(start_steward: StewardFactory,
                                                                        comfy: Comfy) -> None:
    steward, url = steward_for(start_steward, comfy, {"chat": fake_model("2GiB")})
    host, port = host_port(url)
    prompt = comfy.prompt(hold=comfy.hold("interrupted"), client_id="interrupted")
    async with (trio_websocket.open_websocket(host, port, "/ws?clientId=interrupted", use_ssl=False) as ws,
                httpx.AsyncClient(timeout=60) as http):
        await ws.get_message()  # status
        prompt_id = (await http.post(f"{url}/prompt", json=prompt)).json()["prompt_id"]
        seen: list[str] = []
        with trio.fail_after(JOB_TIMEOUT_S):
            while "execution_interrupted" not in seen:
                message = await ws.get_message()
                if isinstance(message, bytes):
                    continue
                data = json.loads(message)
                if data["data"].get("prompt_id") != prompt_id:
                    continue
                seen.append(data["type"])
                if data["type"] == "progress" and seen.count("progress") == 1:  # the node runs: stop it
                    interrupted = await http.post(f"{url}/interrupt")
                    assert answer_of(interrupted) == (200, None, b"")
    assert "execution_success" not in seen
    finished = await trio.to_thread.run_sync(lambda: steward.wait_event("image_finished", prompt_id=prompt_id,
                                                                        timeout=JOB_TIMEOUT_S))
    assert finished["outcome"] == "error"  # ComfyUI's history says "error" for an interrupted prompt
    await trio.to_thread.run_sync(lambda: steward.wait_event("image_released", prompt_id=prompt_id))
    assert names(steward, *PHASES) == PHASES
    entry = comfy.history(prompt_id)
    assert entry is not None and entry["status"]["completed"] is False
    assert "execution_interrupted" in dict(entry["status"]["messages"])
    assert httpx.get(f"{url}/healthz", timeout=10).json()["state"] == "idle"
    answer = await trio.to_thread.run_sync(lambda: httpx.post(f"{steward.base_url}/chat/completions", json=chat(),
                                                              timeout=30))
    assert answer.status_code == 200  # the GPU is free for chats again


# --- images for OpenAI clients ---------------------------------------------------------------

# EmptyImage's colour is the seed: each image of a request differs, and says which seed made it.
INVERT_WORKFLOW = {
    "1": {"class_type": "EmptyImage", "inputs": {"width": "{{width}}", "height": "{{height}}", "batch_size": 1,
                                                 "color": "{{seed}}"}},
    "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
    "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "steward-{{prompt}}"}},
}


def with_image_model(start_steward: StewardFactory, comfy: Comfy, tmp_path: Path,
                     models: dict[str, Any] | None = None) -> tuple[RunningSteward, Any]:
    import openai

    workflow = tmp_path / "invert.json"
    workflow.write_text(json.dumps(INVERT_WORKFLOW))
    steward, _ = steward_for(start_steward, comfy, {"invert": {"runtime": "comfyui", "workflow": str(workflow)},
                                                    **(models or {})})
    return steward, openai.OpenAI(base_url=steward.base_url, api_key="unused", max_retries=0)


def inverted(seed: int) -> tuple[int, int, int]:
    """The pixel EmptyImage(color=seed) -> ImageInvert -> SaveImage writes: float32 channels, truncated."""
    def f32(value: float) -> float:
        return struct.unpack("f", struct.pack("f", value))[0]  # type: ignore[no-any-return]

    return tuple(int(f32(255.0 * f32(1.0 - f32((seed >> shift & 0xFF) / 0xFF)))) for shift in (16, 8, 0))  # type: ignore[return-value]


def test_images_generate_runs_the_filled_workflow_in_the_real_comfyui(start_steward: StewardFactory, comfy: Comfy,
                                                                      tmp_path: Path) -> None:
    import base64
    import io

    from PIL import Image

    steward, client = with_image_model(start_steward, comfy, tmp_path, {"chat": fake_model("2GiB")})
    client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "x"}], max_tokens=1)
    seed = next(comfy.colors) * 7919 % 2**24  # a colour of three different bytes, new to ComfyUI's cache
    result = client.images.generate(model="invert", prompt="fox", n=2, size="24x16", response_format="b64_json",
                                    extra_body={"seed": seed})
    assert len(result.data) == 2 and result.size is None  # not one of OpenAI's sizes: steward's object says it
    assert result.model_extra["steward"]["size"] == "24x16"  # type: ignore[index]
    for item, used in zip(result.data, (seed, seed + 1), strict=True):
        image = Image.open(io.BytesIO(base64.b64decode(item.b64_json or "")))
        assert image.size == (24, 16) and image.convert("RGB").getpixel((5, 5)) == inverted(used)
    assert names(steward, *PHASES) == ["image_queued", "image_granted", "image_forwarded", "image_finished",
                                       "image_forwarded", "image_finished", "image_freed", "image_released"]
    assert [e["engine"] for e in steward.events("evict")] == ["chat"]  # the GPU was the job's
    assert [e["outcome"] for e in steward.events("image_finished")] == ["success", "success"]
    # As a URL: the bytes ComfyUI's /view gives for the file the prompt saved.
    linked = client.images.generate(model="invert", prompt="owl", size="8x8", extra_body={"seed": seed + 2})
    url = linked.data[0].url
    assert url is not None
    entry = comfy.history(steward.events("image_forwarded")[-1]["prompt_id"])
    assert entry is not None
    saved = entry["outputs"]["3"]["images"][0]
    assert saved["filename"].startswith("steward-owl")
    assert httpx.get(url, timeout=30).content == comfy.get("/view", params=saved).content


def test_an_image_request_the_real_comfyui_would_refuse_is_refused_before_the_gpu_is_taken(
        start_steward: StewardFactory, comfy: Comfy, tmp_path: Path) -> None:
    import openai

    steward, client = with_image_model(start_steward, comfy, tmp_path, {"chat": fake_model("2GiB")})
    client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "x"}], max_tokens=1)
    with pytest.raises(openai.BadRequestError) as caught:
        client.images.generate(model="invert", prompt="fox", size="20000x16", extra_body={"seed": 1})
    message = caught.value.body["message"]  # type: ignore[index]
    assert message.endswith("Prompt outputs failed validation: EmptyImage (node 1): Value 20000 bigger than max of "
                            "16384: width")  # EmptyImage's max, from ComfyUI's /object_info
    assert not steward.events("image_queued") and not steward.events("evict")
