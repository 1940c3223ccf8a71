"""The videos of ``POST /v1/videos`` on disk: one JSON file per video beside its content.

``videos.dir`` holds, per video, ``ID.json`` (what ``GET /v1/videos/ID`` answers, the key
that made it, where its files are) and, once made, ``ID.video.EXT`` (what the workflow saved)
and ``ID.thumbnail.EXT``. Each change is written whole to a temporary file and renamed, so a
steward killed mid-write leaves the old file or the new one. On start the folder is read
again: a video that was queued or being made when steward stopped is failed (its ComfyUI
prompt is gone with the job), and what is past ``videos.keep`` or over ``videos.max_bytes``
(oldest first) is deleted. A file that does not read as a video's is left alone.

Only the video service's owner task calls these methods (supervisor/videos/service.py); they
are synchronous, so each change is whole before another task runs. Times are the caller's
(wall clock seconds), so that expiry is tested without waiting.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import re
import secrets
from pathlib import Path
from typing import Any

import attrs

ID_PATTERN = re.compile(r"video_[0-9a-f]{32}")
META_SUFFIX = ".json"
PART_SUFFIX = ".part"  # a file still arriving from ComfyUI; one left by a stop is deleted at start
# What a saved file's name says it is: the Content-Type it is served with.
CONTENT_TYPES = {".webp": "image/webp", ".png": "image/png", ".gif": "image/gif", ".mp4": "video/mp4",
                 ".webm": "video/webm", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}
INTERRUPTED = "Steward stopped before the video was made; create it again."


class VideoStatus(enum.Enum):
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"

    @property
    def ended(self) -> bool:
        return self in (VideoStatus.COMPLETED, VideoStatus.FAILED)


class Variant(enum.Enum):
    VIDEO = "video"
    THUMBNAIL = "thumbnail"
    SPRITESHEET = "spritesheet"


def new_video_id() -> str:
    return f"video_{secrets.token_hex(16)}"


def is_video_id(text: str) -> bool:
    """Whether *text* (from a URL path) is one of steward's video ids: nothing else names a file."""
    return ID_PATTERN.fullmatch(text) is not None


def content_type_of(filename: str) -> str:
    return CONTENT_TYPES.get(Path(filename).suffix.lower(), "application/octet-stream")


@attrs.define(eq=False)
class Video:
    """One video job, as kept in its JSON file."""

    id: str
    owner: str | None  # the key's name that made it (None: made without a key); another key never sees it
    model: str
    prompt: str
    seconds: str
    size: str
    created_at: int
    status: VideoStatus = VideoStatus.QUEUED
    progress: int = 0
    completed_at: int | None = None
    error: dict[str, str] | None = None  # OpenAI's {code, message}
    files: dict[str, str] = attrs.Factory(dict)  # Variant value -> the file's name in the folder
    size_bytes: int = 0
    seed: int = 0
    prompt_ids: list[str] = attrs.Factory(list)

    def resource(self, keep: float) -> dict[str, Any]:
        """OpenAI's VideoResource, with steward's own object beside it."""
        expires = None if self.completed_at is None else int(self.completed_at + keep)
        return {"id": self.id, "object": "video", "model": self.model, "status": self.status.value,
                "progress": self.progress, "created_at": self.created_at, "completed_at": self.completed_at,
                "expires_at": expires, "prompt": self.prompt, "size": self.size, "seconds": self.seconds,
                "remixed_from_video_id": None, "error": self.error,
                "steward": {"seed": self.seed, "prompt_ids": self.prompt_ids,
                            "content_type": content_type_of(self.files[Variant.VIDEO.value])
                            if Variant.VIDEO.value in self.files else None,
                            "thumbnail": Variant.THUMBNAIL.value in self.files}}

    def to_json(self) -> dict[str, Any]:
        return {**attrs.asdict(self, recurse=False), "status": self.status.value}

    @classmethod
    def from_json(cls, data: Any) -> Video | None:
        """The video in a JSON file's contents, or None where they are not one of steward's."""
        try:
            video = cls(**{**data, "status": VideoStatus(data["status"])})
        except (TypeError, KeyError, ValueError):
            return None
        strings = (video.id, video.model, video.prompt, video.seconds, video.size)
        numbers = (video.created_at, video.progress, video.size_bytes, video.seed)
        if not is_video_id(video.id) or not all(isinstance(s, str) for s in strings) \
                or not all(_count(n) for n in numbers) \
                or not (video.completed_at is None or _count(video.completed_at)) \
                or not (video.owner is None or isinstance(video.owner, str)) \
                or not (video.error is None or (isinstance(video.error, dict)
                                                and all(isinstance(v, str) for v in video.error.values()))) \
                or not (isinstance(video.prompt_ids, list) and all(isinstance(p, str) for p in video.prompt_ids)) \
                or not isinstance(video.files, dict) \
                or not all(isinstance(name, str) and name.startswith(video.id + ".") and "/" not in name
                           for name in video.files.values()):
            return None  # a file changed by hand (or by anything else): not one of steward's
        return video

    def fail(self, code: str, message: str) -> None:
        """Failed: no assets; kept (and expired by keep) from its creation."""
        self.status, self.error = VideoStatus.FAILED, {"code": code, "message": message}


def _count(value: Any) -> bool:
    """A whole number from a file steward wrote: not a bool, a float or a string; 0 or more, below 2**63."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


@attrs.define(eq=False)
class VideoStore:
    folder: Path
    max_bytes: int
    keep: float
    videos: dict[str, Video] = attrs.Factory(dict)  # by id, oldest first

    def load(self, now: float) -> tuple[list[Video], list[Video]]:
        """Read the folder: the videos it holds. Returns those failed because
        steward stopped while they were queued or being made, and those deleted as too old or
        over the size cap."""
        found = []  # a missing folder is made by the first video
        for path in self.folder.glob(f"video_*{PART_SUFFIX}"):
            path.unlink(missing_ok=True)
        for path in self.folder.glob(f"video_*{META_SUFFIX}"):
            try:
                video = Video.from_json(json.loads(path.read_bytes()))
            except (OSError, ValueError, RecursionError):
                continue
            if video is not None and path.name == video.id + META_SUFFIX:
                found.append(video)
        self.videos = {video.id: video for video in sorted(found, key=lambda v: (v.created_at, v.id))}
        interrupted = [video for video in self.videos.values() if not video.status.ended]
        for video in interrupted:
            video.fail("interrupted", INTERRUPTED)
            self.save(video)
        return interrupted, self.prune(now)

    def add(self, video: Video) -> None:
        self.save(video)  # first: a video that cannot be kept is not one (OSError to the caller)
        self.videos[video.id] = video

    def save(self, video: Video) -> None:
        _write(self.folder / (video.id + META_SUFFIX), json.dumps(video.to_json()).encode())

    def path(self, video: Video, variant: Variant) -> Path | None:
        name = video.files.get(variant.value)
        return None if name is None else self.folder / name

    def part(self, video: Video, variant: Variant, suffix: str) -> Path:
        """Where a file of *video* is written as it arrives, until ``complete`` keeps it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        return self.folder / f"{video.id}.{variant.value}{suffix}{PART_SUFFIX}"

    def complete(self, video: Video, parts: dict[Variant, Path], now: float) -> list[Video]:
        """Keep what the workflow made (*parts*, written whole); returns the videos deleted to
        stay under max_bytes."""
        for variant, part in parts.items():
            kept = part.with_name(part.name.removesuffix(PART_SUFFIX))
            os.replace(part, kept)
            video.files[variant.value] = kept.name
        video.size_bytes = sum((self.folder / name).stat().st_size for name in video.files.values())
        video.status, video.progress, video.completed_at = VideoStatus.COMPLETED, 100, int(now)
        self.save(video)
        return self.prune(now, spare=video.id)

    def delete(self, video: Video) -> None:
        """Forget *video* and delete its files; a file that cannot be deleted (a folder made
        read-only by hand) stays behind, never in the way of the rest."""
        for name in [*video.files.values(), video.id + META_SUFFIX]:
            with contextlib.suppress(OSError):
                (self.folder / name).unlink(missing_ok=True)
        self.videos.pop(video.id, None)

    def prune(self, now: float, spare: str | None = None) -> list[Video]:
        """Delete the ended videos past keep, then the oldest until max_bytes holds (never the
        one just made, *spare*: a cap smaller than one video still hands that one out)."""
        gone = [video for video in self.videos.values()
                if video.status.ended and (video.completed_at or video.created_at) + self.keep <= now]
        total = sum(video.size_bytes for video in self.videos.values() if video not in gone)
        for video in self.videos.values():
            if total <= self.max_bytes:
                break
            if video.status.ended and video.size_bytes and video not in gone and video.id != spare:
                gone.append(video)
                total -= video.size_bytes
        for video in gone:
            self.delete(video)
        return gone

    def visible(self, owner: str | None) -> list[Video]:
        """The videos the key named *owner* may see: its own; without keys in force (None), all."""
        return [video for video in self.videos.values() if owner is None or video.owner == owner]

    def find(self, video_id: str, owner: str | None) -> Video | None:
        """The video *video_id* (from a URL: checked here) if *owner* may see it."""
        video = self.videos.get(video_id) if is_video_id(video_id) else None
        return video if video is not None and (owner is None or video.owner == owner) else None


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as file:
        file.write(data)
    os.replace(temporary, path)
