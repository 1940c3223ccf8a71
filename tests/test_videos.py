"""OpenAI's Videos API through steward (POST/GET/DELETE /v1/videos, the content), with the
official `openai` client, in front of a fake ComfyUI (a real process) on the simulated GPU: the
job is queued at once, runs as one exclusive job through the turnstile, its progress read from
ComfyUI's websocket, its animated WEBP and thumbnail kept in videos.dir; a key sees its own
videos only; a DELETE cancels a running job and frees the GPU; a restart fails what was running."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from PIL import Image

from supervisor.auth.keys import add_key
from tests import test_comfy_listener
from tests.conftest import RunningSteward, StewardFactory, fake_model, wait_usage_rows
from tests.spec_check import check as assert_matches
from tests.test_comfy_listener import names

# The openai SDK warns that OpenAI's own Sora API shuts down: steward's videos are its own.
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")]

comfy = test_comfy_listener.comfy  # the fake ComfyUI, a fixture


def clip(seconds: float = 0.5) -> dict[str, Any]:
    """A weight-free animation workflow: EmptyImage's batch of {{frames}} into SaveAnimatedWEBP.
    (The fake reports `steps` progress from the node with a steps input, and waits fake_seconds.)"""
    return {
        "1": {"class_type": "EmptyImage", "inputs": {"width": "{{width}}", "height": "{{height}}",
                                                     "batch_size": "{{frames}}", "color": 0x3060C0}},
        "2": {"class_type": "SaveAnimatedWEBP", "inputs": {"images": ["1", 0], "filename_prefix": "steward/clip",
                                                           "fps": "{{fps}}", "steps": 4, "fake_seconds": seconds}},
        "9": {"class_type": "CLIPTextEncode", "inputs": {"text": "{{prompt}}"}},  # not linked: never runs
    }


def video_model(tmp_path: Path, workflow: dict[str, Any] | None = None, **video: Any) -> dict[str, Any]:
    path = tmp_path / "clip.json"
    path.write_text(json.dumps(workflow or clip()))
    return {"runtime": "comfyui", "workflow": str(path), "aliases": ["sora-2"],
            "video": {"seconds": [4, 8], "sizes": ["720x1280", "1280x720"], "fps": 2, **video}}


def with_videos(start_steward: StewardFactory, comfy_port: int, gpu: Path, tmp_path: Path, workflow: Any = None,
                **sections: Any) -> tuple[RunningSteward, openai.OpenAI]:
    """Steward with a chat model and the video model; *sections*: more of its config (auth, videos)."""
    steward = start_steward({"chat": fake_model("8GiB", gpu_dir=gpu), "clip": video_model(tmp_path, workflow)},
                            comfyui={"upstream": f"127.0.0.1:{comfy_port}", "listen": None, "history_poll": "0.1s",
                                     "free_timeout": "5s", "job_timeout": "90s"},
                            gpu={"probe": "simulated", "simulated_dir": str(gpu), "poll_interval": "0.1s"},
                            **sections)
    steward.wait_event("listening")
    return steward, openai.OpenAI(base_url=steward.base_url, api_key="unused", max_retries=0)


def wait_status(client: openai.OpenAI, video_id: str, *wanted: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        video = client.videos.retrieve(video_id)
        if video.status in wanted:
            return video
        assert time.monotonic() < deadline, f"video {video_id} still {video.status}"
        time.sleep(0.05)


def test_a_video_is_queued_made_through_the_turnstile_and_handed_out(  # type: ignore[no-untyped-def]
        start_steward: StewardFactory, comfy, tmp_path: Path) -> None:
    port, gpu = comfy()
    steward, client = with_videos(start_steward, port, gpu, tmp_path)
    client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}])  # chat is loaded
    created = client.videos.create(model="sora-2", prompt="a fox running", seconds="4", size="1280x720")
    assert created.status == "queued" and created.id.startswith("video_") and created.progress == 0
    raw = httpx.get(f"{steward.url}/v1/videos/{created.id}", timeout=10).json()
    assert_matches(raw, "VideoResource")
    done = wait_status(client, created.id, "completed")  # in_progress between: the events below
    assert done.progress == 100 and done.error is None
    assert done.seconds == "4" and done.size == "1280x720" and done.model == "clip"
    assert done.completed_at is not None and done.expires_at == done.completed_at + 7 * 86400
    assert_matches(httpx.get(f"{steward.url}/v1/videos/{created.id}", timeout=10).json(), "VideoResource")
    # The turnstile: the chat engine was evicted for the job, the GPU freed after.
    assert names(steward, "video_queued", "image_granted", "video_started", "image_freed", "image_released",
                 "video_completed") == ["video_queued", "image_granted", "video_started", "image_freed",
                                        "image_released", "video_completed"]
    assert [e["engine"] for e in steward.events("evict")] == ["chat"]
    content = client.videos.download_content(created.id)
    animation = Image.open(io.BytesIO(content.content))
    assert animation.format == "WEBP" and animation.size == (1280, 720) and animation.n_frames == 8  # 4 s * 2 fps
    thumbnail = Image.open(io.BytesIO(client.videos.download_content(created.id, variant="thumbnail").content))
    assert thumbnail.format == "WEBP" and getattr(thumbnail, "n_frames", 1) == 1 and thumbnail.size == (1280, 720)
    assert thumbnail.convert("RGB").getpixel((5, 5)) == animation.convert("RGB").getpixel((5, 5))
    listed = client.videos.list()
    assert [v.id for v in listed.data] == [created.id]
    assert_matches(httpx.get(f"{steward.url}/v1/videos", timeout=10).json(), "VideoListResource")
    deleted = client.videos.delete(created.id)
    assert deleted.deleted is True and deleted.id == created.id
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(created.id)
    assert client.videos.list().data == []
    # The chat comes back after the job.
    assert client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}]).choices
    metrics = httpx.get(f"{steward.url}/metrics", timeout=10).text
    assert 'steward_videos_total{model="clip",status="completed"} 1.0' in metrics
    assert 'steward_videos_total{model="clip",status="deleted"} 1.0' in metrics
    models = {m["id"]: m for m in httpx.get(f"{steward.url}/v1/models", timeout=10).json()["data"]}
    assert models["clip"]["steward"]["kind"] == "video" and models["clip"]["steward"]["seconds"] == ["4", "8"]


def test_progress_follows_the_websocket_and_delete_cancels_the_running_job(  # type: ignore[no-untyped-def]
        start_steward: StewardFactory, comfy, tmp_path: Path) -> None:
    port, gpu = comfy()
    steward, client = with_videos(start_steward, port, gpu, tmp_path, clip(seconds=30))
    created = client.videos.create(model="clip", prompt="a slow one")
    deadline = time.monotonic() + 20
    while (video := client.videos.retrieve(created.id)).progress == 0:  # the fake's steps, read from /ws
        assert time.monotonic() < deadline and video.status in ("queued", "in_progress")
        time.sleep(0.05)
    assert video.status == "in_progress" and 0 < video.progress < 100
    [shown] = httpx.get(f"{steward.url}/admin/state", timeout=10).json()["videos"]  # steward top's VIDEO JOB rows
    assert (shown["id"], shown["model"], shown["status"]) == (created.id, "clip", "in_progress")
    client.videos.delete(created.id)
    steward.wait_event("image_abandoned", timeout=10)
    steward.wait_event("image_released", timeout=10)
    freed = steward.wait_event("image_freed", timeout=10)
    assert freed["observed_free"] is True
    history = httpx.get(f"http://127.0.0.1:{port}/history", timeout=10).json()
    assert all(entry["status"]["status_str"] == "error" for entry in history.values())  # interrupted
    assert steward.wait_event("video_deleted")["cancelled"] is True
    job = next(row for row in wait_usage_rows(steward.usage_db, 1, where=lambda row: row["request_id"] == created.id)
               if row["request_id"] == created.id)
    assert (job["status"], job["error"], job["engine"]) == (499, "deleted", "comfyui") and job["gpu_s"] > 0


def test_bad_input_is_a_400_naming_the_parameter(  # type: ignore[no-untyped-def]
        start_steward: StewardFactory, comfy, tmp_path: Path) -> None:
    port, gpu = comfy()
    steward, client = with_videos(start_steward, port, gpu, tmp_path)
    for kwargs, param in [({"seconds": "12"}, "seconds"), ({"size": "1024x1792"}, "size"),
                          ({"model": "chat"}, "model")]:
        with pytest.raises(openai.BadRequestError) as refused:
            client.videos.create(prompt="x", **kwargs)  # type: ignore[arg-type]
        assert refused.value.body["param"] == param, kwargs  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as refused:
        client.videos.create(prompt="x", input_reference=("ref.png", b"\x89PNG...", "image/png"))
    assert refused.value.body["param"] == "input_reference"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.videos.create(model="nope", prompt="x")
    for path in ["/v1/videos/../../etc/passwd", "/v1/videos/video_zz", "/v1/videos/%2e%2e/content"]:
        assert httpx.get(f"{steward.url}{path}", timeout=10).status_code == 404
    assert httpx.get(f"{steward.url}/v1/videos?limit=0", timeout=10).json()["error"]["param"] == "limit"
    assert names(steward, "image_queued") == []  # nothing reached the GPU


def test_a_videos_dir_steward_cannot_write_is_a_507_and_steward_serves_on(  # type: ignore[no-untyped-def]
        start_steward: StewardFactory, comfy, tmp_path: Path) -> None:
    port, gpu = comfy()
    (tmp_path / "a-file").write_text("not a folder")
    steward, client = with_videos(start_steward, port, gpu, tmp_path, videos={"dir": str(tmp_path / "a-file" / "v")})
    refused = httpx.post(f"{steward.base_url}/videos", timeout=10, json={"model": "clip", "prompt": "x"})
    assert refused.status_code == 507 and refused.json()["error"]["code"] == "storage_error"
    assert "videos.dir" in refused.json()["error"]["message"]
    assert client.videos.list().data == [] and names(steward, "image_queued") == []  # nothing queued
    assert client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}]).choices


def test_a_key_sees_only_its_own_videos(  # type: ignore[no-untyped-def]
        start_steward: StewardFactory, comfy, tmp_path: Path) -> None:
    port, gpu = comfy()
    keys = tmp_path / "keys.json"
    alice, bob = add_key(keys, "alice"), add_key(keys, "bob")
    steward, _ = with_videos(start_steward, port, gpu, tmp_path, auth={"keys_file": str(keys)})
    as_alice = openai.OpenAI(base_url=steward.base_url, api_key=alice, max_retries=0)
    as_bob = openai.OpenAI(base_url=steward.base_url, api_key=bob, max_retries=0)
    made = as_alice.videos.create(prompt="alice's")
    wait_status(as_alice, made.id, "completed")
    assert as_bob.videos.list().data == [] and [v.id for v in as_alice.videos.list().data] == [made.id]
    for call in (lambda: as_bob.videos.retrieve(made.id), lambda: as_bob.videos.download_content(made.id),
                 lambda: as_bob.videos.delete(made.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert as_alice.videos.retrieve(made.id).status == "completed"
    # The POST held nothing; the job has a row of its own: alice's GPU time, one request of her day.
    rows = wait_usage_rows(steward.usage_db, 1, where=lambda row: row["request_id"] == made.id)
    job = next(row for row in rows if row["request_id"] == made.id)
    assert (job["key"], job["route"], job["model"], job["engine"], job["status"]) == (
        "alice", "/v1/videos", "clip", "comfyui", 200)
    assert job["gpu_s"] > 0 and job["queued_s"] is not None and job["response_bytes"] > 0
    posted = next(row for row in rows if row["method"] == "POST" and row["request_id"] != made.id)
    assert (posted["key"], posted["route"], posted["engine"], posted["gpu_s"]) == ("alice", "/v1/videos", None, None)


def test_a_restart_keeps_made_videos_and_fails_the_running_one(  # type: ignore[no-untyped-def]
        start_steward: StewardFactory, comfy, tmp_path: Path) -> None:
    port, gpu = comfy()
    folder = tmp_path / "videos"
    steward, client = with_videos(start_steward, port, gpu, tmp_path, videos={"dir": str(folder)})
    made = client.videos.create(prompt="kept")
    wait_status(client, made.id, "completed")
    content = client.videos.download_content(made.id).content
    (tmp_path / "clip.json").write_text(json.dumps(clip(seconds=60)))
    steward.stop()
    steward, client = with_videos(start_steward, port, gpu, tmp_path, clip(seconds=60), videos={"dir": str(folder)})
    running = client.videos.create(prompt="cut short")
    wait_status(client, running.id, "in_progress")
    steward.stop()
    steward, client = with_videos(start_steward, port, gpu, tmp_path, videos={"dir": str(folder)})
    assert client.videos.download_content(made.id).content == content
    failed = client.videos.retrieve(running.id)
    assert failed.status == "failed" and failed.error is not None and failed.error.code == "interrupted"
    assert_matches(httpx.get(f"{steward.url}/v1/videos/{running.id}", timeout=10).json(), "VideoResource")
