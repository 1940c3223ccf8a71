"""The video jobs: each runs on its own in the service's nursery, through ComfyUI's turnstile.

``POST /v1/videos`` answers at once (status ``queued``); the job then waits for the GPU as an
exclusive job of its class (the LLM engines drain and unload, as for an image), runs the filled
workflow in ComfyUI, follows it on ComfyUI's websocket (``progress``: the share of the
workflow's nodes done, a sampler's steps counted within its node), fetches what the workflow
saved from ``/view`` into the store (supervisor/videos/store.py), and ``/free``\\ s the GPU.
``DELETE`` of a queued or running video cancels its job: the prompt is taken out of ComfyUI's
queue or interrupted, the GPU freed and released, and its files deleted.

Each job ends with one usage row of its own (the ``POST`` that made it was answered at once, with
no grant): the key that made it, its wait for the GPU, the GPU-seconds it held, and how it ended
(200 completed; the scheduler's or ComfyUI's failure; 499 ``deleted``), so video work is in a
key's GPU time and its requests per day like an image's.

The service's task (``serve_videos``, under the service tree) is the store's one owner: it
reloads the folder at start, expires videos as time passes, and holds the nursery every job runs
in; the routes call its synchronous methods, so each change to the store is whole.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio
import trio_websocket

from supervisor.gateway.comfy.jobs import COMFY_ENGINE
from supervisor.gateway.comfy.workflow import SavedImage
from supervisor.gateway.openai.images import ImageFailed, ImageHandler
from supervisor.observe.events import EventLog
from supervisor.request_class import RequestClass
from supervisor.scheduler.actor import JobFailed
from supervisor.usage.row import UsageRow
from supervisor.usage.writer import UsageLog
from supervisor.videos.request import VIDEOS_PATH, Reference
from supervisor.videos.stills import first_webp_frame
from supervisor.videos.store import Variant, Video, VideoStatus, VideoStore

VIDEO_SUFFIXES = frozenset({".webp", ".gif", ".png", ".mp4", ".webm", ".mov", ".mkv"})
STILL_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp"})
PRUNE_EVERY = 300.0  # seconds between expiry sweeps (at most; a shorter keep sweeps more often)
MAX_MESSAGE = 64 * 1024 * 1024  # ComfyUI's previews can be large binary frames
CHUNK = 1024 * 1024  # bytes of a file in memory at a time, from ComfyUI and to a client


@attrs.define
class JobTime:
    """What a video job's grant cost (the scheduler's StepAccount): its wait for the GPU, and how
    long it held it; None: it never got that far."""

    queued_s: float | None = None
    gpu_s: float | None = None

    def waited(self, seconds: float) -> None:
        self.queued_s = (self.queued_s or 0.0) + seconds

    def held(self, seconds: float) -> None:
        self.gpu_s = (self.gpu_s or 0.0) + seconds


@attrs.frozen
class JobEnd:
    """How a video job ended, for its usage row."""

    status: int
    error: str | None = None


@attrs.define(eq=False)
class VideoService:
    store: VideoStore
    images: ImageHandler  # ComfyUI's turnstile, node catalog and prompt calls, shared with images
    events: EventLog
    now: Callable[[], float] = time.time  # wall clock: created_at, completed_at, expiry
    usage: UsageLog | None = None  # where each job's row goes (None: not recorded)
    running: dict[str, trio.CancelScope] = attrs.Factory(dict)  # video id -> its job
    nursery: trio.Nursery | None = None

    def submit(self, video: Video, graph: dict[str, Any], klass: RequestClass, reference: Reference | None) -> None:
        """Keep *video* (queued) and start its job."""
        assert self.nursery is not None, "serve_videos has not started"
        self.store.add(video)
        self.events.emit("video_queued", "info", video_id=video.id, model=video.model, seconds=video.seconds,
                         size=video.size, klass=klass)
        scope = trio.CancelScope()
        self.running[video.id] = scope
        self.nursery.start_soon(self._job, video, graph, klass, reference, scope)

    def delete(self, video: Video) -> None:
        """Delete *video*: its job, if it is still queued or running, is cancelled first."""
        scope = self.running.pop(video.id, None)
        if scope is not None:
            scope.cancel(reason="the video was deleted")
        status = video.status
        self.store.delete(video)
        self.events.emit("video_deleted", "info", video_id=video.id, model=video.model, status="deleted",
                         was=status.value, reason="client", cancelled=scope is not None)

    def state(self) -> list[dict[str, Any]]:
        """The jobs queued or being made, oldest first, as /admin/state and ``steward top`` show them."""
        return [{"id": video.id, "model": video.model, "status": video.status.value, "progress": video.progress,
                 "owner": video.owner, "created_at": video.created_at}
                for video in self.store.videos.values() if video.id in self.running]

    def prune(self) -> None:
        for video in self.store.prune(self.now()):
            self.expired(video)

    def expired(self, video: Video) -> None:
        self.events.emit("video_deleted", "info", video_id=video.id, model=video.model, status="expired",
                         was=video.status.value, reason="keep or max_bytes", cancelled=False)

    async def _job(self, video: Video, graph: dict[str, Any], klass: RequestClass, reference: Reference | None,
                   scope: trio.CancelScope) -> None:
        started, began = time.monotonic(), self.now()
        spent = JobTime()
        end = JobEnd(499, "deleted")  # unless it ends otherwise: the video was deleted while made
        with scope:
            try:
                await self._make(video, graph, klass, reference, spent)
                if video.status is VideoStatus.COMPLETED:
                    end = JobEnd(200)
                    self.events.emit("video_completed", "info", video_id=video.id, model=video.model,
                                     status=video.status.value, bytes=video.size_bytes,
                                     took_s=round(time.monotonic() - started, 3))
            except JobFailed as exc:
                end = JobEnd(exc.failure.status, exc.failure.code)
                self._fail(video, exc.failure.code, exc.failure.message)
            except ImageFailed as exc:
                end = JobEnd(exc.status, exc.code)
                self._fail(video, exc.code, exc.message)
            except OSError as exc:  # videos.dir full or not writable: this video fails, the service goes on
                end = JobEnd(500, "storage_error")
                self._fail(video, "storage_error", f"Steward could not keep the video in videos.dir: {exc}")
        self.running.pop(video.id, None)
        self._record(video, klass, spent, end, began, time.monotonic() - started)

    def _record(self, video: Video, klass: RequestClass, spent: JobTime, end: JobEnd, began: float,
                took_s: float) -> None:
        """The job's usage row: its own, beside the POST's (which held nothing)."""
        if self.usage is None:
            return
        self.usage.record(UsageRow(
            ts=began, request_id=video.id, key=video.owner, listener="openai", method="POST", route=VIDEOS_PATH,
            model=video.model, engine=COMFY_ENGINE if spent.gpu_s is not None else None, klass=klass.value,
            status=end.status, error=end.error, queued_s=spent.queued_s, ttft_s=None, duration_s=took_s,
            prompt_tokens=None, completion_tokens=None, request_bytes=0,
            response_bytes=video.size_bytes if end.status == 200 else 0, gpu_s=spent.gpu_s))

    def _fail(self, video: Video, code: str, message: str) -> None:
        if video.id not in self.store.videos:
            return  # deleted meanwhile
        video.fail(code, message)
        self.store.save(video)
        self.events.emit("video_failed", "warning", video_id=video.id, model=video.model, status=video.status.value,
                         code=code, detail=message)

    async def _make(self, video: Video, graph: dict[str, Any], klass: RequestClass,
                    reference: Reference | None, spent: JobTime) -> None:
        if reference is not None:
            await self._upload(reference, video)
        async with self.images.turnstile.open_gpu(klass, None, account=spent) as held:
            video.status = VideoStatus.IN_PROGRESS
            self.store.save(video)
            self.events.emit("video_started", "info", video_id=video.id, model=video.model)
            client_id = uuid.uuid4().hex
            failure: ImageFailed | None = None
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(self._follow_progress, video, client_id, len(graph))
                    try:
                        saved = await self.images.run(held, graph, client_id)
                        held.lease.status = 200
                    except ImageFailed as exc:
                        failure = exc  # raised below: from inside the nursery it would come grouped
                    nursery.cancel_scope.cancel()
            finally:
                video.prompt_ids = list(held.prompt_ids)
                with trio.CancelScope(shield=True):
                    await self.images.clean_up(held)
        if held.force_released:
            raise ImageFailed(503, "An operator released the GPU while the video was being made.", "force_released")
        if failure is not None:
            raise failure
        parts = await self._fetch(video, saved)
        if video.id not in self.store.videos:  # deleted while its files arrived
            for part in parts.values():
                part.unlink(missing_ok=True)
            return
        for gone in self.store.complete(video, parts, self.now()):
            self.expired(gone)

    async def _upload(self, reference: Reference, video: Video) -> None:
        """The reference image into ComfyUI's input folder, under the name the workflow was filled with."""
        name = reference_name(video.id, reference)
        try:
            answer = await self.images.http.post(
                f"{self.images.base_url}/upload/image", data={"overwrite": "true", "type": "input"},
                files={"image": (name, reference.data, reference.content_type)}, timeout=60.0)
        except httpx.HTTPError as exc:
            raise ImageFailed(502, f"ComfyUI failed to take the input_reference: {exc}", "engine_error") from None
        if answer.status_code != 200:
            raise ImageFailed(502, f"ComfyUI answered {answer.status_code} to the input_reference upload.",
                              "engine_error")

    async def _follow_progress(self, video: Video, client_id: str, nodes: int, *,
                               task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read the prompt's messages on ComfyUI's websocket into *video*'s progress; contained:
        a websocket that fails leaves the progress where it was (the job goes on)."""
        address = self.images.turnstile.config.upstream
        meter, announced = ProgressMeter(nodes), False
        try:
            async with trio_websocket.open_websocket(address.host, address.port, f"/ws?clientId={client_id}",
                                                     use_ssl=False, max_message_size=MAX_MESSAGE,
                                                     connect_timeout=10, disconnect_timeout=1) as socket:
                task_status.started()
                announced = True
                while True:
                    message = await socket.get_message()
                    if isinstance(message, str) and (percent := meter.read(message)) > video.progress:
                        video.progress = percent
        except (trio_websocket.HandshakeError, trio_websocket.ConnectionClosed, OSError, trio.TooSlowError) as exc:
            self.events.emit("video_progress_lost", "warning", video_id=video.id, detail=str(exc) or type(exc).__name__)
        if not announced:
            task_status.started()  # the job runs without progress but its end

    async def _fetch(self, video: Video, saved: list[SavedImage]) -> dict[Variant, Path]:
        """The video the workflow saved (an animated output, else a file named like a video) and
        its still (one the workflow saved, else the first frame of an animated WEBP), streamed
        from ``/view`` into the store's folder: never held whole in memory."""
        clip = next((image for image in saved if image.animated), None) or next(
            (image for image in saved if _suffix(image) in VIDEO_SUFFIXES - {".png", ".webp"}), None)
        if clip is None:
            raise ImageFailed(502, "The workflow saved no video: does it end in SaveAnimatedWEBP, SaveAnimatedPNG "
                                   "or SaveVideo?", "engine_error")
        still = next((image for image in saved if image is not clip and not image.animated
                      and _suffix(image) in STILL_SUFFIXES), None)
        parts = {Variant.VIDEO: self.store.part(video, Variant.VIDEO, _suffix(clip) or ".bin")}
        try:
            await self._download(clip, parts[Variant.VIDEO])
            if still is not None:
                parts[Variant.THUMBNAIL] = self.store.part(video, Variant.THUMBNAIL, _suffix(still))
                await self._download(still, parts[Variant.THUMBNAIL])
            elif _suffix(clip) == ".webp":
                frame = await trio.to_thread.run_sync(_first_frame, parts[Variant.VIDEO])
                if frame is not None:
                    parts[Variant.THUMBNAIL] = self.store.part(video, Variant.THUMBNAIL, ".webp")
                    await trio.Path(parts[Variant.THUMBNAIL]).write_bytes(frame)
        except BaseException:
            for part in parts.values():
                part.unlink(missing_ok=True)
            raise
        return parts

    async def _download(self, image: SavedImage, path: Path) -> None:
        """One file ComfyUI saved, from ``/view`` to *path*, a chunk at a time."""
        try:
            async with self.images.http.stream("GET", f"{self.images.base_url}/view", params=image.query(),
                                               timeout=60.0) as answer:
                if answer.status_code != 200:
                    raise ImageFailed(502, f"ComfyUI answered {answer.status_code} for {image.filename}.",
                                      "engine_error")
                async with await trio.open_file(path, "wb") as file:
                    async for chunk in answer.aiter_bytes(CHUNK):
                        await file.write(chunk)
        except httpx.HTTPError as exc:
            raise ImageFailed(502, f"ComfyUI failed to hand over {image.filename}: {exc}", "engine_error") from None


def _first_frame(path: Path) -> bytes | None:
    with open(path, "rb") as file:
        return first_webp_frame(file)


@attrs.define
class ProgressMeter:
    """A prompt's progress from ComfyUI's websocket messages: nodes done (run or cached) over the
    workflow's nodes, a running node's own steps (``progress``: value/max) counted as a share of
    it. At most 99 until the job has its files."""

    nodes: int
    done: set[str] = attrs.Factory(set)
    current: str | None = None
    share: float = 0.0

    def read(self, text: str) -> int:
        try:
            message = json.loads(text)
            kind, data = message["type"], message["data"]
        except (ValueError, KeyError, TypeError, RecursionError):
            return 0
        if not isinstance(data, dict):
            return 0
        if kind == "execution_cached" and isinstance(data.get("nodes"), list):
            self.done.update(str(node) for node in data["nodes"])
        elif kind == "executing":
            if self.current is not None:
                self.done.add(self.current)
            self.current, self.share = (str(data["node"]) if data.get("node") is not None else None), 0.0
        elif kind == "progress" and isinstance(data.get("value"), int | float) and isinstance(data.get("max"),
                                                                                             int | float):
            self.share = min(1.0, max(0.0, data["value"] / data["max"])) if data["max"] > 0 else 0.0
        return min(99, int(100 * (len(self.done) + self.share) / max(1, self.nodes)))


def reference_name(video_id: str, reference: Reference) -> str:
    return f"{video_id}_{reference.filename}"


def _suffix(image: SavedImage) -> str:
    return Path(image.filename).suffix.lower()


async def serve_videos(service: VideoService, *, task_status: trio.TaskStatus[VideoService] = trio.TASK_STATUS_IGNORED
                       ) -> None:
    """Own the video store: reload it, run the jobs, expire what is past keep. Supervised: after a
    failure it starts again from the folder, where the jobs it was running are `interrupted`."""
    store = service.store
    service.running.clear()  # a failed run's jobs ended with its nursery
    interrupted, gone = store.load(service.now())
    for video in interrupted:
        service.events.emit("video_failed", "warning", video_id=video.id, model=video.model,
                            status=video.status.value, code="interrupted", detail="steward stopped during the job")
    for video in gone:
        service.expired(video)
    async with trio.open_nursery() as nursery:
        service.nursery = nursery
        task_status.started(service)
        while True:
            await trio.sleep(min(PRUNE_EVERY, store.keep / 2))
            service.prune()
