"""OpenAI's Videos API on the OpenAI listener: ``/v1/videos`` over ComfyUI workflows.

``POST /v1/videos`` (the ``openai`` SDK's ``videos.create``) checks the request and the filled
workflow (a workflow ComfyUI would refuse is a 400 now, before anything is unloaded) and
answers at once with the queued video; the job runs in the video service
(supervisor/videos/service.py). ``GET /v1/videos/ID`` (``retrieve``) says how it goes,
``GET /v1/videos/ID/content`` (``download_content``) hands out what the workflow saved
(``?variant=thumbnail``: a still), ``GET /v1/videos`` (``list``) and ``DELETE /v1/videos/ID``
(``delete``: a job still queued or running is cancelled and the GPU freed). A key sees only
the videos it made (another key's are a 404, as if they did not exist). Errors are OpenAI's.
"""

from __future__ import annotations

import os
import secrets
import urllib.parse
from typing import Any

import attrs
import trio

from supervisor.gateway.catalog import ModelCatalog
from supervisor.gateway.door import FrontDoor, exchange_of
from supervisor.gateway.errors import error_body
from supervisor.gateway.http.asgi import (
    BodyLimits,
    Receive,
    RequestError,
    Scope,
    Send,
    dump_json,
    read_body,
    send_refusal,
    send_whole,
)
from supervisor.gateway.openai.images import MAX_SEED
from supervisor.scheduler.actor import JobFailed
from supervisor.videos.request import VIDEOS_PATH, read_video_request
from supervisor.videos.service import CHUNK, VideoService, reference_name
from supervisor.videos.store import Variant, Video, content_type_of, new_video_id

MAX_LIMIT = 100


@attrs.define(eq=False)
class VideoHandler:
    service: VideoService
    catalog: ModelCatalog
    door: FrontDoor
    body_limits: BodyLimits

    @staticmethod
    def serves(scope: Scope) -> bool:
        return scope["path"] == VIDEOS_PATH or scope["path"].startswith(VIDEOS_PATH + "/")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        exchange = exchange_of(scope)
        parts = scope["path"].removeprefix(VIDEOS_PATH).strip("/").split("/") if scope["path"] != VIDEOS_PATH else []
        method = scope["method"]
        try:
            if not parts and method == "POST":
                await self._create(scope, receive, send)
                return
            if not parts and method == "GET":
                answer = self._list(scope)
            elif len(parts) == 1 and method in ("GET", "DELETE"):
                video = self._find(scope, parts[0])
                answer = self._delete(video) if method == "DELETE" else video.resource(self.service.store.keep)
            elif len(parts) == 2 and parts[1] == "content" and method == "GET":
                await self._content(scope, self._find(scope, parts[0]), send)
                return
            elif len(parts) > 2 or (len(parts) == 2 and parts[1] != "content"):
                raise RequestError(404, "Unknown route.", code="not_found")
            else:
                raise RequestError(405, f"{method} is not allowed on {scope['path']}.", code="method_not_allowed")
        except RequestError as exc:
            exchange.error = exchange.error or exc.code
            await send_refusal(send, exc, error_body)
            return
        await send_whole(send, 200, [(b"content-type", b"application/json")], dump_json(answer))

    def _owner(self, scope: Scope) -> str | None:
        key = exchange_of(scope).key
        return key.name if key is not None else None

    def _find(self, scope: Scope, video_id: str) -> Video:
        video = self.service.store.find(video_id, self._owner(scope))
        if video is None:
            raise RequestError(404, f"No video with id {video_id[:80]!r} here.", param="video_id", code="not_found")
        return video

    async def _create(self, scope: Scope, receive: Receive, send: Send) -> None:
        exchange = exchange_of(scope)
        try:
            body = await read_body(scope, receive, self.body_limits)
            if body is None:
                return
            config = self.service.images.turnstile.config
            request = read_video_request(scope, body, self.catalog.videos, self.catalog.aliases,
                                         default_class=self.door.default_class(exchange, config.job_class),
                                         random_seed=lambda: secrets.randbelow(MAX_SEED))
            exchange.model, exchange.klass = request.model, request.klass
            model = self.catalog.videos[request.model]
            video = Video(new_video_id(), self._owner(scope), request.model, request.params.prompt, request.seconds,
                          request.size, int(self.service.now()), seed=request.params.seed)
            params = request.params if request.reference is None else attrs.evolve(
                request.params, input_reference=reference_name(video.id, request.reference))
            graph = model.workflow.filled(params)
            with self.door.admit(exchange, model=request.model, klass=request.klass):
                await self.service.images.check(request.model, [graph])
                self.service.submit(video, graph, request.klass, request.reference)
        except JobFailed as exc:
            exchange.error = exc.failure.code
            await send_refusal(send, RequestError(exc.failure.status, exc.failure.message, code=exc.failure.code),
                               error_body)
            return
        except RequestError as exc:
            exchange.error = exchange.error or exc.code
            await send_refusal(send, exc, error_body)
            return
        except OSError as exc:  # videos.dir full or not writable: said in OpenAI's shape, steward serves on
            exchange.error = "storage_error"
            await send_refusal(send, RequestError(507, f"Steward cannot keep a video in videos.dir: "
                                                       f"{exc.strerror or exc}.", code="storage_error"), error_body)
            return
        await send_whole(send, 200, [(b"content-type", b"application/json")],
                         dump_json(video.resource(self.service.store.keep)))

    def _list(self, scope: Scope) -> dict[str, Any]:
        query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
        order = query.get("order", ["desc"])[0]
        if order not in ("asc", "desc"):
            raise RequestError(400, f"Invalid order {order[:20]!r}: use 'asc' or 'desc'.", param="order")
        limit_text = query.get("limit", ["20"])[0]
        if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_LIMIT:
            raise RequestError(400, f"limit must be an integer from 1 to {MAX_LIMIT}.", param="limit")
        videos = self.service.store.visible(self._owner(scope))
        if order == "desc":
            videos.reverse()
        after = query.get("after", [None])[0]
        if after is not None:
            ids = [video.id for video in videos]
            if after not in ids:
                raise RequestError(400, f"No video with id {after[:80]!r} to list after.", param="after")
            videos = videos[ids.index(after) + 1:]
        page = videos[:int(limit_text)]
        keep = self.service.store.keep
        return {"object": "list", "data": [video.resource(keep) for video in page],
                "first_id": page[0].id if page else None, "last_id": page[-1].id if page else None,
                "has_more": len(videos) > len(page)}

    def _delete(self, video: Video) -> dict[str, Any]:
        self.service.delete(video)
        return {"object": "video.deleted", "deleted": True, "id": video.id}

    async def _content(self, scope: Scope, video: Video, send: Send) -> None:
        query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
        wanted = query.get("variant", [Variant.VIDEO.value])[0]
        try:
            variant = Variant(wanted)
        except ValueError:
            raise RequestError(400, f"Invalid variant {wanted[:20]!r}: use video, thumbnail or spritesheet.",
                               param="variant") from None
        if not video.status.ended or video.error is not None:
            raise RequestError(404, f"The video is {video.status.value}: it has no content"
                                    + (" (it failed)." if video.error is not None else " yet."),
                               param="video_id", code="video_not_ready")
        path = self.service.store.path(video, variant)
        if path is None:
            raise RequestError(404, f"This video has no {variant.value}: its workflow saved none, and "
                                    "steward takes a thumbnail only from an animated WEBP.", param="variant",
                               code="not_found")
        try:
            file = await trio.open_file(path, "rb")
        except OSError:
            raise RequestError(404, "The video's file is gone from videos.dir.", code="not_found") from None
        async with file:
            size = os.fstat(file.fileno()).st_size
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", content_type_of(path.name).encode()), (b"content-length", str(size).encode()),
                (b"content-disposition", f'attachment; filename="{path.name}"'.encode())]})
            left = size  # a file deleted meanwhile (expired) is still read whole: its inode lives while open
            while left > 0:
                chunk = await file.read(min(CHUNK, left))
                if not chunk:
                    break  # shorter than promised (changed by hand): the server cuts the connection
                left -= len(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": left > 0})
