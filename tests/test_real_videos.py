"""OpenAI's Videos API through steward in front of the real ComfyUI (0.3.64 on CPU): weight-free
workflows make short animations, an animated WEBP (SaveAnimatedWEBP) and an MP4 (CreateVideo ->
SaveVideo, h264 through PyAV, which ComfyUI's install has), with the `openai` SDK's
``videos.create``, ``retrieve``, ``download_content``, ``list`` and ``delete``. The job is
queued, then in progress (held by the test's StewardSteps node, whose progress messages steward
reads from ComfyUI's websocket), then completed; the frames are counted by decoders (Pillow for
the WEBP, PyAV in ComfyUI's own Python for the MP4); the chat engine is evicted for the job and
answers after it; a DELETE of a held job interrupts its prompt and frees the GPU.

ComfyUI is conftest's ``comfy_server``: one process for this module and test_real_comfyui.py, run one
after the other on one worker."""

from __future__ import annotations

import io
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from fakes.comfyui_env import comfyui_install
from tests.conftest import RunningSteward, StewardFactory, fake_model
from tests.fake_processes import wait_until
from tests.spec_check import check
from tests.test_real_comfyui import Comfy, names

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")]

FPS = 2
SECONDS = 4  # 8 frames


def clip_workflow(saver: str, hold: Path) -> dict[str, Any]:
    """EmptyImage's {{frames}} -> StewardSteps (4 steps, held until *hold* exists) -> noise of
    {{seed}} (every frame differs, so no encoder merges two) -> the animation, and the first frame
    saved as a still by the MP4 workflow (its thumbnail)."""
    nodes: dict[str, Any] = {
        "1": {"class_type": "EmptyImage", "inputs": {"width": "{{width}}", "height": "{{height}}",
                                                     "batch_size": "{{frames}}", "color": 0x204080}},
        "2": {"class_type": "StewardSteps", "inputs": {"image": ["1", 0], "steps": 4, "step_seconds": 0.05,
                                                       "fail_at": -1, "hold": str(hold)}},
        "3": {"class_type": "ImageAddNoise", "inputs": {"image": ["2", 0], "seed": "{{seed}}", "strength": 0.3}},
        "8": {"class_type": "CLIPTextEncode", "inputs": {"text": "{{prompt}}"}},  # not linked: never runs
    }
    if saver == "webp":
        nodes["4"] = {"class_type": "SaveAnimatedWEBP", "inputs": {
            "images": ["3", 0], "filename_prefix": "steward/clip", "fps": "{{fps}}", "lossless": False,
            "quality": 60, "method": "fastest"}}
    else:
        nodes["4"] = {"class_type": "CreateVideo", "inputs": {"images": ["3", 0], "fps": "{{fps}}"}}
        nodes["5"] = {"class_type": "SaveVideo", "inputs": {"video": ["4", 0], "filename_prefix": "steward/clip",
                                                            "format": "mp4", "codec": "h264"}}
        nodes["6"] = {"class_type": "ImageFromBatch", "inputs": {"image": ["3", 0], "batch_index": 0, "length": 1}}
        nodes["7"] = {"class_type": "SaveImage", "inputs": {"images": ["6", 0], "filename_prefix": "steward/still"}}
    return nodes


def with_video_models(start_steward: StewardFactory, comfy: Comfy, tmp_path: Path, hold: Path
                      ) -> tuple[RunningSteward, Any]:
    import openai

    models: dict[str, Any] = {"chat": fake_model("2GiB")}
    for saver in ("webp", "mp4"):
        path = tmp_path / f"{saver}.json"
        path.write_text(json.dumps(clip_workflow(saver, hold)))
        models[f"clip-{saver}"] = {"runtime": "comfyui", "workflow": str(path),
                                   "video": {"seconds": [SECONDS], "sizes": ["1280x720", "720x1280"], "fps": FPS}}
    steward = start_steward(models, gpu={"probe": "none", "budget": "16GiB"}, videos={"dir": str(tmp_path / "videos")},
                            comfyui={"upstream": f"127.0.0.1:{comfy.port}", "listen": None, "history_poll": "0.1s",
                                     "free_timeout": "2s", "job_timeout": "120s"})
    steward.wait_event("listening")
    return steward, openai.OpenAI(base_url=steward.base_url, api_key="unused", max_retries=0)


def mp4_frames(content: bytes, tmp_path: Path) -> tuple[int, str, tuple[int, int]]:
    """The frames PyAV decodes from *content* (in ComfyUI's Python, which has it), its codec and size."""
    path = tmp_path / "decoded.mp4"
    path.write_bytes(content)
    script = ("import av, json, sys\ncontainer = av.open(sys.argv[1])\nstream = container.streams.video[0]\n"
              "frames = sum(1 for _ in container.decode(stream))\n"
              "print(json.dumps([frames, stream.codec_context.name, [stream.width, stream.height]]))")
    out = subprocess.run([str(comfyui_install().python), "-c", script, str(path)], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    frames, codec, size = json.loads(out)
    return frames, codec, tuple(size)


@pytest.mark.parametrize("saver", ["webp", "mp4"])
def test_videos_are_made_by_the_real_comfyui_through_the_turnstile(
        start_steward: StewardFactory, comfy: Comfy, tmp_path: Path, saver: str) -> None:
    hold = comfy.hold(f"video-{saver}")
    steward, client = with_video_models(start_steward, comfy, tmp_path, hold)
    client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "x"}], max_tokens=1)
    created = client.videos.create(model=f"clip-{saver}", prompt="a fox", seconds=str(SECONDS), size="1280x720")
    assert created.status == "queued" and created.progress == 0
    # Held in StewardSteps: in progress, with its steps read from ComfyUI's websocket.
    wait_until(lambda: client.videos.retrieve(created.id).progress > 0, timeout=60)
    running = client.videos.retrieve(created.id)
    assert running.status == "in_progress" and 0 < running.progress < 100
    check(httpx.get(f"{steward.url}/v1/videos/{created.id}", timeout=10).json(), "VideoResource")
    hold.touch()
    wait_until(lambda: client.videos.retrieve(created.id).status in ("completed", "failed"), timeout=120)
    done = client.videos.retrieve(created.id)
    assert done.status == "completed" and done.progress == 100, done.error
    check(httpx.get(f"{steward.url}/v1/videos/{created.id}", timeout=10).json(), "VideoResource")
    content = client.videos.download_content(created.id)
    thumbnail = Image.open(io.BytesIO(client.videos.download_content(created.id, variant="thumbnail").content))
    assert thumbnail.size == (1280, 720) and getattr(thumbnail, "n_frames", 1) == 1
    if saver == "webp":
        assert content.response.headers["content-type"] == "image/webp"
        animation = Image.open(io.BytesIO(content.content))
        assert animation.n_frames == SECONDS * FPS and animation.size == (1280, 720)
        assert thumbnail.format == "WEBP"  # its first frame, cut out by steward
    else:
        assert content.response.headers["content-type"] == "video/mp4"
        assert mp4_frames(content.content, tmp_path) == (SECONDS * FPS, "h264", (1280, 720))
        assert thumbnail.format == "PNG"  # the still the workflow saved
    assert [v.id for v in client.videos.list().data] == [created.id]
    # The turnstile: the chat engine was evicted, ComfyUI freed, and the chat answers after.
    assert [e["engine"] for e in steward.events("evict")] == ["chat"]
    assert names(steward, "video_queued", "video_started", "image_freed", "image_released", "video_completed") == [
        "video_queued", "video_started", "image_freed", "image_released", "video_completed"]
    assert client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "x"}],
                                          max_tokens=1).choices
    assert client.videos.delete(created.id).deleted is True
    assert client.videos.list().data == []


def test_deleting_a_running_video_interrupts_its_prompt_and_frees_the_gpu(
        start_steward: StewardFactory, comfy: Comfy, tmp_path: Path) -> None:
    hold = comfy.hold("video-deleted")
    steward, client = with_video_models(start_steward, comfy, tmp_path, hold)
    created = client.videos.create(model="clip-webp", prompt="never finished", seconds=str(SECONDS))
    wait_until(lambda: client.videos.retrieve(created.id).status == "in_progress", timeout=60)
    prompt_id = steward.wait_event("image_forwarded", timeout=30)["prompt_id"]
    started = time.monotonic()
    client.videos.delete(created.id)
    entry = comfy.wait_done(prompt_id, timeout=30)  # interrupted, though its hold never came
    assert entry["status"]["status_str"] == "error"
    assert any(message[0] == "execution_interrupted" for message in entry["status"]["messages"])
    steward.wait_event("image_released", timeout=30)
    assert names(steward, "image_abandoned", "image_freed", "image_released") == [
        "image_abandoned", "image_freed", "image_released"]
    assert time.monotonic() - started < 30
    assert comfy.running() == []


def test_an_input_reference_is_uploaded_and_animated_by_the_real_comfyui(
        start_steward: StewardFactory, comfy: Comfy, tmp_path: Path) -> None:
    import openai

    workflow = tmp_path / "reference.json"
    workflow.write_text(json.dumps({
        "1": {"class_type": "LoadImage", "inputs": {"image": "{{input_reference}}"}},
        "2": {"class_type": "RepeatImageBatch", "inputs": {"image": ["1", 0], "amount": "{{frames}}"}},
        "3": {"class_type": "ImageAddNoise", "inputs": {"image": ["2", 0], "seed": "{{seed}}", "strength": 0.05}},
        "4": {"class_type": "SaveAnimatedWEBP", "inputs": {"images": ["3", 0], "filename_prefix": "steward/ref",
                                                           "fps": "{{fps}}", "lossless": True, "quality": 80,
                                                           "method": "fastest"}},
        "8": {"class_type": "CLIPTextEncode", "inputs": {"text": "{{prompt}}"}}}))
    steward = start_steward({"animate": {"runtime": "comfyui", "workflow": str(workflow),
                                         "video": {"seconds": [SECONDS], "sizes": ["720x1280"], "fps": FPS}}},
                            gpu={"probe": "none", "budget": "16GiB"}, videos={"dir": str(tmp_path / "videos")},
                            comfyui={"upstream": f"127.0.0.1:{comfy.port}", "listen": None, "history_poll": "0.1s"})
    steward.wait_event("listening")
    client = openai.OpenAI(base_url=steward.base_url, api_key="unused", max_retries=0)
    reference = io.BytesIO()
    Image.new("RGB", (72, 128), (200, 30, 30)).save(reference, "PNG")
    created = client.videos.create(model="animate", prompt="bring it to life",
                                   input_reference=("still.png", reference.getvalue(), "image/png"))
    wait_until(lambda: client.videos.retrieve(created.id).status in ("completed", "failed"), timeout=120)
    done = client.videos.retrieve(created.id)
    assert done.status == "completed", done.error
    animation = Image.open(io.BytesIO(client.videos.download_content(created.id).content))
    assert animation.n_frames == SECONDS * FPS and animation.size == (72, 128)  # the reference's own size
    red, green, blue = animation.convert("RGB").getpixel((36, 64))
    assert abs(red - 200) < 40 and abs(green - 30) < 40 and abs(blue - 30) < 40
    assert (comfy.base / "input" / f"{created.id}_steward_reference.png").is_file()  # uploaded under its name
