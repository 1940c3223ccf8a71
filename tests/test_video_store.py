"""The video store, the request reader, the progress meter and the thumbnail cut, without
processes: the store's expiry and size cap with an injected wall clock, a reload after a stop,
ids from outside checked before they name a file, 400s naming the parameter, and the first
frame of an animated WEBP taken out as a still that Pillow reads."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from PIL import Image

from supervisor.config import ImageModelConfig, ImageSize, PositiveInt, VideoSpec
from supervisor.gateway.catalog import ImageModel
from supervisor.gateway.comfy.workflow import Workflow
from supervisor.gateway.http.asgi import RequestError
from supervisor.observe.events import Event, EventLog
from supervisor.request_class import RequestClass
from supervisor.videos.request import read_video_request
from supervisor.videos.service import ProgressMeter, VideoService, serve_videos
from supervisor.videos.stills import first_webp_frame
from supervisor.videos.store import INTERRUPTED, Variant, Video, VideoStatus, VideoStore, is_video_id, new_video_id

DAY = 86400.0


def video(created: int, owner: str | None = None, status: VideoStatus = VideoStatus.QUEUED) -> Video:
    return Video(new_video_id(), owner, "clip", "a fox", "4", "720x1280", created, status=status)


def parts(store: VideoStore, clip: Video, size: int, thumbnail: bool = True) -> dict[Variant, Path]:
    written = {Variant.VIDEO: store.part(clip, Variant.VIDEO, ".webp")}
    written[Variant.VIDEO].write_bytes(b"v" * size)
    if thumbnail:
        written[Variant.THUMBNAIL] = store.part(clip, Variant.THUMBNAIL, ".webp")
        written[Variant.THUMBNAIL].write_bytes(b"t")
    return written


def made(store: VideoStore, created: int, size: int, owner: str | None = None) -> Video:
    clip = video(created, owner)
    store.add(clip)
    store.complete(clip, parts(store, clip, size), created + 1)
    return clip


def test_a_made_video_is_kept_beside_its_json_and_expires_after_keep(tmp_path: Path) -> None:
    store = VideoStore(tmp_path / "videos", max_bytes=10**9, keep=DAY)
    clip = made(store, 1000, 10)
    assert sorted(p.name for p in store.folder.iterdir()) == sorted(
        [f"{clip.id}.json", f"{clip.id}.video.webp", f"{clip.id}.thumbnail.webp"])
    assert clip.status is VideoStatus.COMPLETED and clip.progress == 100 and clip.size_bytes == 11
    resource = clip.resource(store.keep)
    assert resource["expires_at"] == 1001 + DAY and resource["completed_at"] == 1001
    assert store.prune(1001 + DAY - 1) == [] and store.path(clip, Variant.VIDEO) is not None
    assert store.prune(1001 + DAY) == [clip]
    assert list(store.folder.iterdir()) == [] and store.videos == {}


def test_over_max_bytes_the_oldest_go_first_but_never_the_one_just_made(tmp_path: Path) -> None:
    store = VideoStore(tmp_path, max_bytes=25, keep=DAY)
    first, second = made(store, 1, 9), made(store, 2, 9)  # 10 bytes each with its thumbnail
    assert set(store.videos) == {first.id, second.id}
    third = video(3)
    store.add(third)
    assert store.complete(third, parts(store, third, 9), 4) == [first]
    huge = video(5)
    store.add(huge)
    assert store.complete(huge, parts(store, huge, 100, thumbnail=False), 6) == [second, third]  # a cap below one
    assert list(store.videos) == [huge.id]  # still hands that one out


def test_a_reload_fails_what_was_running_and_skips_what_is_not_a_video(tmp_path: Path) -> None:
    store = VideoStore(tmp_path, max_bytes=10**9, keep=DAY)
    kept = made(store, 100, 5)
    queued, running = video(101), video(102, status=VideoStatus.IN_PROGRESS)
    store.add(queued)
    store.add(running)
    (tmp_path / "video_junk.json").write_text("{not json")
    left = store.part(queued, Variant.VIDEO, ".webp")
    left.write_bytes(b"half a video")  # steward stopped while it arrived
    evil = video(103)
    evil.files = {"video": "../../etc/passwd"}
    (tmp_path / f"{evil.id}.json").write_text(json.dumps(evil.to_json()))
    for number, (field, value) in enumerate([("created_at", "yesterday"), ("size_bytes", -1), ("progress", True),
                                             ("completed_at", 1e300), ("owner", 7), ("error", {"code": 1}),
                                             ("prompt_ids", "p1"), ("seed", 2**70)], start=104):
        edited = video(number).to_json() | {field: value}  # by hand: the load (and its sort) must not fail
        (tmp_path / f"{edited['id']}.json").write_text(json.dumps(edited))
    again = VideoStore(tmp_path, max_bytes=10**9, keep=DAY)
    interrupted, gone = again.load(200)
    assert sorted(v.id for v in interrupted) == sorted([queued.id, running.id]) and gone == []
    assert list(again.videos) == [kept.id, queued.id, running.id]  # oldest first; the evil and edited left out
    assert again.videos[running.id].error == {"code": "interrupted", "message": INTERRUPTED}
    assert again.videos[kept.id].status is VideoStatus.COMPLETED and not left.exists()
    assert VideoStore(tmp_path, 10**9, DAY).load(300)[0] == []  # written back: failed once, not again
    assert VideoStore(tmp_path / "none", 10**9, DAY).load(0) == ([], [])  # no folder yet: nothing made


def test_ids_from_outside_and_owners(tmp_path: Path) -> None:
    store = VideoStore(tmp_path, max_bytes=10**9, keep=DAY)
    alice, nobody = made(store, 1, 1, owner="alice"), made(store, 2, 1)
    assert store.find(alice.id, "alice") is alice and store.find(alice.id, "bob") is None
    assert store.find(alice.id, None) is alice  # no keys in force: everything
    assert store.visible("alice") == [alice] and store.visible(None) == [alice, nobody]
    for text in ["../x", "video_" + "0" * 31, alice.id + "/", alice.id.upper(), ""]:
        assert not is_video_id(text) and store.find(text, None) is None


def clip_model(**video: Any) -> dict[str, ImageModel]:
    workflow = Workflow.parse(json.dumps({"1": {"class_type": "EmptyImage", "inputs": {
        "batch_size": "{{frames}}", "width": "{{width}}", "height": "{{height}}"}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "{{prompt}}"}}}))
    spec = VideoSpec(**video)
    model = ImageModel("clip", ImageModelConfig("comfyui", "clip.json", video=spec), workflow)
    return {"clip": model, "sora-2": model}


def read(body: dict[str, Any] | bytes, content_type: str = "application/json", **video: Any) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    scope = {"type": "http", "headers": [(b"content-type", content_type.encode())]}
    return read_video_request(scope, raw, clip_model(**video), {"chat": "chat"},
                              default_class=RequestClass.INTERACTIVE, random_seed=lambda: 7)


def test_the_request_fills_frames_from_seconds_and_fps() -> None:
    request = read({"prompt": "a fox", "seconds": "8", "size": "1280x720"}, fps=PositiveInt(3))
    assert (request.model, request.seconds, request.size) == ("clip", "8", "1280x720")
    assert (request.params.frames, request.params.width, request.params.height, request.params.seed) == (
        24, 1280, 720, 7)
    defaults = read({"prompt": "a fox"})
    assert (defaults.seconds, defaults.size, defaults.params.frames) == ("4", "720x1280", 32)
    form = (b'--b\r\nContent-Disposition: form-data; name="prompt"\r\n\r\na fox\r\n'
            b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nsora-2@batch\r\n--b--\r\n')
    multipart = read(form, "multipart/form-data; boundary=b")
    assert multipart.model == "clip" and multipart.klass is RequestClass.BATCH


@pytest.mark.parametrize(("body", "param", "status"), [
    ({"prompt": "x", "seconds": "5"}, "seconds", 400),
    ({"prompt": "x", "seconds": 4.5}, "seconds", 400),
    ({"prompt": "x", "size": "64x64"}, "size", 400),
    ({"prompt": "x", "size": ["720x1280"]}, "size", 400),
    ({"prompt": ""}, "prompt", 400),
    ({"prompt": "x", "model": "chat"}, "model", 400),
    ({"prompt": "x", "model": "nope"}, "model", 404),
    ({"prompt": "x", "seed": -1}, "seed", 400),
    ({"prompt": "x", "input_reference": {"file_id": "file-1"}}, "input_reference", 400),
    ({"prompt": "x", "input_reference": {"image_url": "data:image/png;base64,iVBO"}}, "input_reference", 400),
])
def test_bad_input_names_its_parameter(body: dict[str, Any], param: str, status: int) -> None:
    with pytest.raises(RequestError) as refused:
        read(body, sizes=[ImageSize("720x1280")])
    assert (refused.value.status, refused.value.param) == (status, param)


def test_progress_counts_nodes_done_and_a_sampler_s_steps() -> None:
    meter = ProgressMeter(nodes=4)
    steps = [({"type": "execution_start", "data": {}}, 0),
             ({"type": "execution_cached", "data": {"nodes": ["1"]}}, 25),
             ({"type": "executing", "data": {"node": "2"}}, 25),
             ({"type": "progress", "data": {"value": 2, "max": 4, "node": "2"}}, 37),
             ({"type": "executing", "data": {"node": "3"}}, 50),
             ({"type": "executing", "data": {"node": "4"}}, 75),
             ({"type": "executing", "data": {"node": None}}, 99)]  # done, but the files are not kept yet
    assert [meter.read(json.dumps(message)) for message, _ in steps] == [want for _, want in steps]
    for junk in ["", "[]", '{"type": "progress", "data": {"value": "a", "max": 0}}', '{"type": 1, "data": 2}']:
        ProgressMeter(2).read(junk)  # no exception


@pytest.mark.parametrize("lossless", [True, False])
@pytest.mark.parametrize("mode", ["RGB", "RGBA"])
def test_the_thumbnail_is_the_animation_s_first_frame(lossless: bool, mode: str) -> None:
    frames = [Image.new(mode, (48, 32), (40 * i, 90, 200, 255)[:len(mode)]) for i in range(4)]
    out = io.BytesIO()
    frames[0].save(out, "WEBP", save_all=True, append_images=frames[1:], duration=100, lossless=lossless)
    still = first_webp_frame(io.BytesIO(out.getvalue()))
    assert still is not None
    image = Image.open(io.BytesIO(still))
    assert getattr(image, "n_frames", 1) == 1 and image.size == (48, 32)
    assert abs(image.convert("RGB").getpixel((4, 4))[0] - 0) <= 4  # the first frame's red, not a later one's
    single = io.BytesIO()
    frames[0].save(single, "PNG")
    assert first_webp_frame(io.BytesIO(single.getvalue())) is None
    assert first_webp_frame(io.BytesIO(b"RIFF\x00\x00\x00\x00WEBP")) is None


@pytest.fixture
def virtual_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def test_the_service_expires_videos_as_time_passes(tmp_path: Path, virtual_clock: trio.testing.MockClock
                                                         ) -> None:
    wall = [950.0]
    store = VideoStore(tmp_path, max_bytes=10**9, keep=60.0)
    clip = made(store, 900, 3)
    send, receive = trio.open_memory_channel[Event](math.inf)
    events = EventLog(send, recent_max=100)
    async with trio.open_nursery() as nursery:
        service = await nursery.start(serve_videos, VideoService(VideoStore(tmp_path, 10**9, 60.0), None, events,  # type: ignore[arg-type]
                                                                 now=lambda: wall[0]))
        assert list(service.store.videos) == [clip.id]  # made at 901, kept until 961
        wall[0] = 962.0
        await trio.sleep(31)  # one sweep: keep / 2
        assert service.store.videos == {}
        assert [e.fields["status"] for e in events.recent if e.name == "video_deleted"] == ["expired"]
        nursery.cancel_scope.cancel()
    del receive
