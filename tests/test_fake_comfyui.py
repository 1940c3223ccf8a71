"""Tests of the fake ComfyUI (fakes.comfyui), run as a real subprocess; websockets through wsproto on trio."""

from __future__ import annotations

import contextlib
import io
import json
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
from PIL import Image
from wsproto import ConnectionType, WSConnection
from wsproto.utilities import LocalProtocolError
from wsproto.events import (AcceptConnection, CloseConnection, Message, Ping, Pong, RejectConnection, Request,
                            TextMessage)

from fakes import simgpu
from tests.fake_processes import FakeProcess, fake_launcher, wait_until

REPO = Path(__file__).resolve().parent.parent
RECORDED = json.loads((Path(__file__).parent / "data" / "comfy_object_info.json").read_text())
pytestmark = pytest.mark.slow  # every test here starts the fake as a real process
GiB = 1024**3


async def await_until(predicate: Callable[[], object], timeout: float = 15.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.02)


@attrs.define
class Fake(FakeProcess):
    def submit(self, prompt: dict[str, Any], **extra: Any) -> str:
        r = self.post("/prompt", {"prompt": prompt, **extra})
        assert r.status_code == 200, r.text
        return r.json()["prompt_id"]

    def history(self, prompt_id: str) -> dict[str, Any]:
        return self.get(f"/history/{prompt_id}").json()

    def wait_done(self, prompt_id: str, timeout: float = 5.0) -> dict[str, Any]:
        wait_until(lambda: self.history(prompt_id), timeout=timeout)
        return self.history(prompt_id)[prompt_id]

    def vram_free(self) -> int:
        return self.get("/system_stats").json()["devices"][0]["vram_free"]



@pytest.fixture
def start_comfy(tmp_path: Path) -> Iterator[Callable[..., Fake]]:
    """Start ``python -m fakes.comfyui``; always stopped and reaped."""
    for launcher in fake_launcher(tmp_path):
        yield lambda *args: launcher.launch(Fake, "fakes.comfyui", list(args), ready_path="/system_stats")


def workflow(steps: int = 3, seconds: float | None = None, *, sampler_class: str = "KSampler",
             output: str = "SaveImage") -> dict[str, Any]:
    sampler: dict[str, Any] = {"model": ["4", 0], "steps": steps}
    if seconds is not None:
        sampler["fake_seconds"] = seconds
    return {"4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "x.safetensors"}},
            "3": {"class_type": sampler_class, "inputs": sampler},
            "9": {"class_type": output, "inputs": {"images": ["3", 0], "filename_prefix": "fake"}}}


# --------------------------------------------------------------------------- a websocket client


@attrs.define(eq=False)
class WsClient:
    stream: trio.SocketStream
    conn: WSConnection
    pending: list[Any] = attrs.field(factory=list)

    async def _fill(self) -> None:
        data = await self.stream.receive_some(65536)
        self.conn.receive_data(data or None)
        for event in self.conn.events():
            if isinstance(event, Ping):
                await self.stream.send_all(self.conn.send(event.response()))
            self.pending.append(event)
        if not data and not self.pending:
            raise EOFError

    async def event(self) -> Any:
        while not self.pending:
            await self._fill()
        return self.pending.pop(0)

    async def receive_json(self, timeout: float = 20.0) -> dict[str, Any]:
        parts = []
        with trio.fail_after(timeout):
            while True:
                event = await self.event()
                if isinstance(event, CloseConnection):
                    raise EOFError(f"closed: {event.code}")
                if isinstance(event, Message):
                    parts.append(event.data)
                    if event.message_finished:
                        assert isinstance(event, TextMessage)
                        return json.loads("".join(parts))

    async def send_json(self, value: object) -> None:
        await self.stream.send_all(self.conn.send(TextMessage(data=json.dumps(value))))

    async def until(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 30.0) -> list[dict[str, Any]]:
        """Messages up to and including the first that matches."""
        seen = []
        with trio.fail_after(timeout):
            while True:
                seen.append(await self.receive_json())
                if predicate(seen[-1]):
                    return seen


async def ws_handshake(port: int, target: str, headers: list[tuple[bytes, bytes]] | None = None,
                       ) -> tuple[WsClient, Any]:
    """The client and the handshake's answer; messages that came in the same read stay pending."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    conn = WSConnection(ConnectionType.CLIENT)
    await stream.send_all(conn.send(Request(host=f"127.0.0.1:{port}", target=target, extra_headers=headers or [])))
    client = WsClient(stream, conn)
    return client, await client.event()


@asynccontextmanager
async def connect_ws(port: int, target: str = "/ws?clientId=test") -> AsyncIterator[WsClient]:
    client, event = await ws_handshake(port, target)
    assert isinstance(event, AcceptConnection), event
    try:
        yield client
    finally:
        with trio.move_on_after(1), contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError,
                                                        LocalProtocolError):
            await client.stream.send_all(client.conn.send(CloseConnection(code=1000)))
        await client.stream.aclose()


def is_done(prompt_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda m: m["type"] == "executing" and m["data"]["node"] is None and m["data"]["prompt_id"] == prompt_id


# --------------------------------------------------------------------------- prompts and history


def test_prompt_to_history(start_comfy: Callable[..., Fake]) -> None:
    fake = start_comfy("--job-time", "2s")  # still running after the four requests below, even beside busy loops
    r = fake.post("/prompt", {"prompt": workflow(), "client_id": "me"})
    body = r.json()
    assert r.status_code == 200 and set(body) == {"prompt_id", "number", "node_errors"}
    assert (body["number"], body["node_errors"]) == (0, {})
    pid = body["prompt_id"]
    assert fake.history(pid) == {}  # running
    queue = fake.get("/queue").json()
    assert queue["queue_pending"] == [] and queue["queue_running"][0][:2] == [0, pid]
    assert queue["queue_running"][0][4] == ["9"] and queue["queue_running"][0][3]["client_id"] == "me"
    assert fake.get("/prompt").json() == {"exec_info": {"queue_remaining": 1}}

    entry = fake.wait_done(pid)
    assert entry["status"]["status_str"] == "success" and entry["status"]["completed"] is True
    assert [m[0] for m in entry["status"]["messages"]] == ["execution_start", "execution_cached", "execution_success"]
    assert entry["outputs"] == {"9": {"images": [{"filename": "fake_00001_.png", "subfolder": "", "type": "output"}]}}
    assert entry["prompt"][1] == pid and entry["meta"]["9"]["node_id"] == "9"
    assert fake.get("/queue").json() == {"queue_running": [], "queue_pending": []}
    image = fake.get("/view", params={"filename": "fake_00001_.png", "type": "output"})
    assert image.content.startswith(b"\x89PNG") and 'filename="fake_00001_.png"' in image.headers["content-disposition"]
    assert fake.get("/view", params={"filename": "other.png"}).status_code == 404
    assert fake.get("/view", params={"filename": "../x.png"}).status_code == 400
    assert list(fake.get("/history").json()) == [pid]
    assert fake.history("unknown") == {}

    # jobs run one at a time, lowest number first; "front" jumps the queue
    first = fake.submit(workflow(seconds=600))  # runs until interrupted: the queue is read while it runs
    wait_until(lambda: fake.stats()["running"] == first)
    second = fake.submit(workflow(seconds=0.1))
    third = fake.submit(workflow(seconds=0.1), front=True)
    assert [i[1] for i in fake.get("/queue").json()["queue_pending"]] == [second, third]
    assert fake.post("/interrupt", content=b"").status_code == 200
    fake.wait_done(second)
    order = list(fake.get("/history").json())
    assert order == [pid, first, third, second]
    assert list(fake.get("/history", params={"max_items": 2}).json()) == [third, second]


def test_validation_errors(start_comfy: Callable[..., Fake]) -> None:
    fake = start_comfy()
    r = fake.post("/prompt", {"client_id": "x"})
    assert (r.status_code, r.json()) == (400, {"error": {"type": "no_prompt", "message": "No prompt provided",
                                                         "details": "No prompt provided", "extra_info": {}},
                                               "node_errors": {}})
    bad = {"1": {"class_type": "FAKE_INVALID", "inputs": {}},
           "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0]}}}
    r = fake.post("/prompt", {"prompt": bad})
    body = r.json()
    assert r.status_code == 400 and body["error"]["type"] == "prompt_outputs_failed_validation"
    assert body["error"]["message"] == "Prompt outputs failed validation"
    assert body["error"]["details"] == ""  # as ComfyUI's: only the outputs' own errors, and SaveImage has none
    assert body["node_errors"]["1"]["dependent_outputs"] == ["2"]
    assert body["node_errors"]["1"]["class_type"] == "FAKE_INVALID"
    assert body["node_errors"]["1"]["errors"][0]["type"] == "value_not_in_list"

    # one output fails, another passes: 200 with node_errors, only the good output runs
    mixed = {**workflow(seconds=0), **bad}
    r = fake.post("/prompt", {"prompt": mixed})
    assert r.status_code == 200 and "1" in r.json()["node_errors"]
    assert fake.wait_done(r.json()["prompt_id"])["prompt"][4] == ["9"]

    r = fake.post("/prompt", {"prompt": {"1": {"class_type": "KSampler", "inputs": {}}}})
    assert (r.status_code, r.json()["error"]["type"]) == (400, "prompt_no_outputs")
    r = fake.post("/prompt", {"prompt": {"1": {"inputs": {}}}})
    assert (r.status_code, r.json()["error"]["type"]) == (400, "invalid_prompt")
    r = fake.post("/prompt", content=b"not json")
    assert r.status_code == 500
    assert fake.stats()["prompts_queued"] == 1


# What the fake validates as ComfyUI does (the recording's cases of those checks on its real nodes).
FAKE_CHECKS = ("below min", "above max", "an INT that is no number", "an INT that is null", "an INT that is NaN",
               "an INT that is an object", "a wrapped value below min", "a float truncated below min",
               "a required input missing", "the failing output of partial targets", "one output of two fails",
               "numbers as strings, a bool, a float and a wrapped value")


def test_the_real_weight_free_nodes_save_what_their_chain_makes(start_comfy: Callable[..., Fake]) -> None:
    fake = start_comfy("--job-time", "0s")
    info = fake.get("/object_info").json()
    for name in ("EmptyImage", "ImageInvert", "PreviewImage"):
        assert info[name] == RECORDED["object_info"][name]  # ComfyUI 0.3.64's own entries
    stand_in = info["KSampler"]  # the real shapes, every input optional, a custom node's module
    assert stand_in["python_module"] == "custom_nodes.fakes_comfyui" and not stand_in["input"]["required"]
    assert stand_in["input"]["optional"]["steps"] == ["INT", {"default": 20, "min": 1, "max": 10000}]
    prompt = {"1": {"class_type": "EmptyImage", "inputs": {"width": 5, "height": 3, "batch_size": 2,
                                                           "color": 0xFEFD80}},
              "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
              "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "chain/inv"}},
              "4": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}}}
    outputs = fake.wait_done(fake.submit(prompt))["outputs"]
    saved, previews = outputs["3"]["images"], outputs["4"]["images"]
    assert [(i["filename"], i["subfolder"], i["type"]) for i in saved] == [
        ("inv_00001_.png", "chain", "output"), ("inv_00002_.png", "chain", "output")]  # one per image of the batch
    assert [i["type"] for i in previews] == ["temp", "temp"]
    # 1 - c in float32, then 255 * that truncated, as ComfyUI does: 0xFE -> 0, 0xFD -> 1, 0x80 -> 126.
    for images, pixel in ((saved, (0, 1, 126)), (previews, (0xFE, 0xFD, 0x80))):
        for image in images:
            png = Image.open(io.BytesIO(fake.get("/view", params=image).content))
            assert (png.mode, png.size, png.getcolors()) == ("RGB", (5, 3), [(15, pixel)])
    assert fake.get("/view", params={**saved[0], "type": "temp"}).status_code == 404


def test_inputs_are_validated_as_comfyui_validates_them(start_comfy: Callable[..., Fake]) -> None:
    fake = start_comfy("--job-time", "0s")
    for answer in (a for a in RECORDED["answers"] if a["case"] in FAKE_CHECKS):
        queued = fake.stats()["prompts_queued"]
        r = fake.post("/prompt", content=json.dumps(answer["request"]).encode())  # NaN as Python's json writes it
        assert r.status_code == answer["status"], answer["case"]
        if answer["status"] == 400:
            assert r.content == json.dumps(answer["body"]).encode(), answer["case"]  # byte for byte, as aiohttp's
        assert fake.stats()["prompts_queued"] - queued == (answer["status"] == 200)


def test_free_drops_memory_later(start_comfy: Callable[..., Fake], tmp_path: Path) -> None:
    gpu = simgpu.create_device(tmp_path / "gpu", total_bytes=16 * GiB, linger_s=0.1)
    fake = start_comfy("--sim-gpu", str(gpu), "--model-memory", "6GiB", "--job-time", "0.3s", "--free-delay", "0.6s")
    device = simgpu.SimulatedDevice(gpu)
    stats = fake.get("/system_stats").json()["devices"][0]
    assert (stats["vram_total"], stats["vram_free"]) == (16 * GiB, 16 * GiB)

    pid = fake.submit(workflow())
    wait_until(lambda: fake.vram_free() == 10 * GiB)  # the job loads the models
    assert device.read(time.monotonic()).used_bytes == 6 * GiB
    fake.wait_done(pid)
    assert fake.vram_free() == 10 * GiB  # models stay cached after the job

    t0 = time.monotonic()
    r = fake.post("/free", {"unload_models": True, "free_memory": True})
    assert (r.status_code, r.content) == (200, b"") and time.monotonic() - t0 < 0.5  # answered at once
    assert fake.vram_free() == 10 * GiB  # ... but the memory is still held
    wait_until(lambda: fake.vram_free() == 16 * GiB, timeout=3)
    assert time.monotonic() - t0 > 0.5
    assert device.read(time.monotonic()).used_bytes == 0

    # /free while a prompt runs: acted on after it
    pid = fake.submit(workflow(seconds=0.6))
    wait_until(lambda: fake.vram_free() == 10 * GiB)
    fake.post("/free", {"unload_models": True, "free_memory": True})
    fake.wait_done(pid)
    assert fake.vram_free() == 10 * GiB
    wait_until(lambda: fake.vram_free() == 16 * GiB, timeout=3)
    stats = fake.stats()
    assert (stats["loads"], stats["unloads"], stats["free_calls"]) == (2, 2, 2)
    assert fake.post("/free", content=b"").status_code == 500  # the body must be JSON


def test_interrupt(start_comfy: Callable[..., Fake]) -> None:
    fake = start_comfy()
    pid = fake.submit(workflow(seconds=5))
    waiting = fake.submit(workflow(seconds=0.1))
    wait_until(lambda: fake.stats()["running"] == pid)
    assert fake.post("/interrupt", {"prompt_id": waiting}).status_code == 200  # not running: nothing happens
    time.sleep(0.1)
    assert fake.stats()["running"] == pid
    t0 = time.monotonic()
    r = fake.post("/interrupt", content=b"")  # no body: global
    assert (r.status_code, r.content) == (200, b"")
    entry = fake.wait_done(pid, timeout=2)
    assert time.monotonic() - t0 < 1
    assert entry["status"]["status_str"] == "error" and entry["status"]["completed"] is False
    last = entry["status"]["messages"][-1]
    assert last[0] == "execution_interrupted" and last[1]["node_id"] == "3" and last[1]["node_type"] == "KSampler"
    assert last[1]["executed"] == ["4"]
    assert fake.wait_done(waiting)["status"]["status_str"] == "success"  # the next one runs

    failing = fake.submit({**workflow(seconds=0.1), "5": {"class_type": "FAKE_ERROR", "inputs": {}},
                           "9": {"class_type": "SaveImage", "inputs": {"images": ["5", 0]}}})
    entry = fake.wait_done(failing)
    assert entry["status"]["messages"][-1][0] == "execution_error" and entry["status"]["status_str"] == "error"


def test_queue_delete_and_clear(start_comfy: Callable[..., Fake]) -> None:
    fake = start_comfy("--job-time", "2s")
    running = fake.submit(workflow())
    ids = [fake.submit(workflow()) for _ in range(3)]
    wait_until(lambda: fake.stats()["running"] == running)
    assert fake.post("/queue", {"delete": [ids[0]]}).status_code == 200
    assert sorted(i[1] for i in fake.get("/queue").json()["queue_pending"]) == sorted(ids[1:])
    fake.post("/api/queue", {"clear": True})
    queue = fake.get("/queue").json()
    assert queue["queue_pending"] == [] and queue["queue_running"][0][1] == running  # the running one stays
    fake.post("/interrupt")
    fake.wait_done(running)
    fake.post("/history", {"delete": [running]})
    assert fake.get("/history").json() == {}


def test_dropped_prompt_never_reaches_history(start_comfy: Callable[..., Fake]) -> None:
    fake = start_comfy()
    running = fake.submit(workflow(seconds=5))
    pending = fake.submit(workflow(seconds=0.1))
    wait_until(lambda: fake.stats()["running"] == running)
    assert fake.post("/fake/drop", {"prompt_id": pending}).json() == {"dropped": [pending]}
    assert fake.post("/fake/drop", {"prompt_id": running}).json() == {"dropped": [running]}
    wait_until(lambda: fake.get("/queue").json() == {"queue_running": [], "queue_pending": []})
    time.sleep(0.2)
    assert fake.history(running) == {} and fake.history(pending) == {} and fake.get("/history").json() == {}
    assert fake.stats()["prompts_dropped"] == 2
    after = fake.submit(workflow(seconds=0.1))
    assert fake.wait_done(after)["status"]["completed"] is True


# --------------------------------------------------------------------------- websocket


async def test_websocket_message_sequence(start_comfy: Callable[..., Fake]) -> None:
    fake = start_comfy("--job-time", "0.3s")
    async with connect_ws(fake.port, "/ws?clientId=me") as ws, \
            httpx.AsyncClient(base_url=fake.url, timeout=10) as http:
        hello = await ws.receive_json()
        assert hello == {"type": "status", "data": {"status": {"exec_info": {"queue_remaining": 0}}, "sid": "me"}}
        await ws.stream.send_all(ws.conn.send(Ping(b"alive?")))
        with trio.fail_after(15):
            while not isinstance(pong := await ws.event(), Pong):
                pass
        assert pong.payload == b"alive?"
        await ws.send_json({"type": "feature_flags", "data": {"supports_preview_metadata": True}})
        flags = await ws.receive_json()
        assert flags["type"] == "feature_flags" and flags["data"]["supports_preview_metadata"] is True

        r = await http.post("/prompt", json={"prompt": workflow(steps=3), "client_id": "me"})
        pid = r.json()["prompt_id"]
        messages = await ws.until(is_done(pid))
        types = [m["type"] for m in messages]
        assert types == ["status", "status", "execution_start", "execution_cached", "executing", "executing",
                         "progress", "progress", "progress", "executing", "executed", "execution_success",
                         "status", "executing"]
        assert [m["data"]["node"] for m in messages if m["type"] == "executing"] == ["4", "3", "9", None]
        assert [(m["data"]["value"], m["data"]["max"]) for m in messages if m["type"] == "progress"] == \
            [(1, 3), (2, 3), (3, 3)]
        assert [m["data"]["status"]["exec_info"]["queue_remaining"] for m in messages[:2]] == [1, 1]  # put, get
        assert messages[-2]["data"]["status"]["exec_info"]["queue_remaining"] == 0
        executed = messages[types.index("executed")]["data"]
        assert executed["node"] == "9" and executed["output"]["images"][0]["type"] == "output"
        assert all(m["data"].get("prompt_id") == pid for m in messages if m["type"] not in ("status",))
        assert (await http.get(f"/history/{pid}")).json()[pid]["status"]["completed"] is True


async def test_websocket_routing_and_interrupt(start_comfy: Callable[..., Fake]) -> None:
    """A prompt's messages go to its client only; without a client_id, progress and
    execution_interrupted go to every socket (``add_message(broadcast=True)``) and the rest nowhere."""
    fake = start_comfy()
    async with connect_ws(fake.port, "/api/ws?clientId=owner") as owner, \
            connect_ws(fake.port, "/ws") as other, httpx.AsyncClient(base_url=fake.url, timeout=10) as http:
        hello = await other.receive_json()
        assert len(hello["data"]["sid"]) == 32  # no clientId: the server picks one
        await owner.receive_json()
        pid = (await http.post("/api/prompt", json={"prompt": workflow(seconds=5), "client_id": "owner"})).json()[
            "prompt_id"]
        await owner.until(lambda m: m["type"] == "executing" and m["data"]["node"] == "3")
        await http.post("/api/interrupt", json={"prompt_id": pid})
        seen = await owner.until(is_done(pid))
        assert [m["type"] for m in seen][-3:] == ["execution_interrupted", "status", "executing"]

        anonymous = (await http.post("/prompt", json={"prompt": workflow(steps=50, seconds=5)})).json()["prompt_id"]
        others = await other.until(lambda m: m["type"] == "progress")
        await http.post("/interrupt")
        others += await other.until(lambda m: m["type"] == "execution_interrupted")
        assert {m["type"] for m in others} == {"status", "progress", "execution_interrupted"}
        assert others[-1]["data"]["prompt_id"] == anonymous
        assert all(m["data"].get("prompt_id") != pid for m in others)  # nothing of the owner's prompt


async def test_websocket_drop_and_restart(start_comfy: Callable[..., Fake]) -> None:
    fake = start_comfy()
    async with connect_ws(fake.port, "/ws?clientId=me") as ws, httpx.AsyncClient(base_url=fake.url, timeout=10) as http:
        await ws.receive_json()
        pid = (await http.post("/prompt", json={"prompt": workflow(seconds=5), "client_id": "me"})).json()["prompt_id"]
        await ws.until(lambda m: m["type"] == "executing")
        await http.post("/fake/drop")
        await await_until(lambda: fake.stats()["running"] is None)
        with trio.move_on_after(0.3) as quiet:
            extra = await ws.until(lambda m: is_done(pid)(m) or m["type"].startswith("execution_"))
        assert quiet.cancelled_caught, extra  # no completion message ever comes
        assert (await http.get(f"/history/{pid}")).json() == {}
        await http.post("/fake/restart")
        with pytest.raises(EOFError):
            await ws.until(lambda m: False, timeout=15)  # the restart closed the socket


async def test_websocket_origin_check(start_comfy: Callable[..., Fake]) -> None:
    fake = start_comfy()
    client, event = await ws_handshake(fake.port, "/ws", [(b"origin", b"http://evil.example")])
    await client.stream.aclose()
    assert isinstance(event, RejectConnection) and event.status_code == 403
    same_origin = f"http://127.0.0.1:{fake.port}".encode()
    client, event = await ws_handshake(fake.port, "/ws", [(b"origin", same_origin)])
    await client.stream.aclose()
    assert isinstance(event, AcceptConnection)


# --------------------------------------------------------------------------- origin, prefix, misc


def test_origin_check_and_api_prefix(start_comfy: Callable[..., Fake]) -> None:
    fake = start_comfy("--job-time", "0.1s")
    r = fake.post("/prompt", {"prompt": workflow()}, headers={"Origin": "http://evil.example:8188"})
    assert (r.status_code, r.content) == (403, b"")
    r = fake.get("/system_stats", headers={"Origin": "http://localhost:1234"})
    assert r.status_code == 403
    same = {"Origin": f"http://127.0.0.1:{fake.port}"}
    assert fake.get("/system_stats", headers=same).status_code == 200
    assert fake.get("/system_stats", headers={"Origin": "http://127.0.0.1"}).status_code == 200  # no port: host only
    assert fake.get("/system_stats", headers={"Host": "comfy.lan", "Origin": "http://x.org"}).status_code == 200
    assert fake.stats()["prompts_queued"] == 0

    pid = fake.post("/api/prompt", {"prompt": workflow()}).json()["prompt_id"]
    wait_until(lambda: fake.get(f"/api/history/{pid}").json())
    assert fake.get("/api/queue").json() == {"queue_running": [], "queue_pending": []}
    assert "devices" in fake.get("/api/system_stats").json()
    assert "KSampler" in fake.get("/api/object_info").json()
    assert fake.get("/object_info/KSampler").json()["KSampler"]["category"] == "sampling"
    assert fake.get("/object_info/Nope").json() == {}
    assert fake.get("/api/features").json()["supports_preview_metadata"] is True
    assert (fake.get("/nope").status_code, fake.get("/prompt", params={}).status_code) == (404, 200)
    assert fake.get("/interrupt").status_code == 405
    assert fake.get("/ws").status_code == 400  # no upgrade

    cors = start_comfy("--enable-cors-header")
    r = cors.get("/system_stats", headers={"Origin": "http://evil.example"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"


def test_sigterm_exits_0_and_unregisters(start_comfy: Callable[..., Fake], tmp_path: Path) -> None:
    gpu = simgpu.create_device(tmp_path / "gpu", total_bytes=16 * GiB, linger_s=0.1)
    fake = start_comfy("--sim-gpu", str(gpu), "--model-memory", "2GiB")
    fake.submit(workflow(seconds=5))
    wait_until(lambda: fake.vram_free() == 14 * GiB)
    t0 = time.monotonic()
    fake.proc.send_signal(signal.SIGTERM)
    assert fake.proc.wait(timeout=5) == 0 and time.monotonic() - t0 < 2
    assert json.loads(next(gpu.glob("proc-*.json")).read_text())["exited"] is True
