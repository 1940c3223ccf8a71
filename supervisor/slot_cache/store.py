"""The cache folder: ``kv_cache.dir/<model>/`` holds one model's saved slots and ``manifest.json``.

The manifest is written last (through a temporary file and a rename), so a folder holds either
the previous complete save or the new one; a file the manifest does not list (a save cut short,
a slot that held too little) is deleted at the next save. One engine task owns each model's
folder; pruning for the total cap (``kv_cache.max_bytes``) may delete another model's set, which
is never being written then: a save is written only by its own engine's task, and a set listed
in a manifest is complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.parse
from pathlib import Path
from typing import Any

import attrs

MANIFEST = "manifest.json"


@attrs.frozen
class SavedSlot:
    file: str  # its name in the model's folder
    tokens: int  # cached tokens it holds (llama-server's n_saved)
    nbytes: int  # the file's size (n_written)


@attrs.frozen
class SavedSet:
    """One eviction's save of one model: what it was saved from, when, and its files."""

    fingerprint: dict[str, Any]
    saved_at: float  # wall time (time.time()): the cache outlives steward's process
    slots: tuple[SavedSlot, ...]

    @property
    def nbytes(self) -> int:
        return sum(slot.nbytes for slot in self.slots)

    @property
    def tokens(self) -> int:
        return sum(slot.tokens for slot in self.slots)

    def to_json(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "saved_at": self.saved_at,
                "slots": [attrs.asdict(slot) for slot in self.slots]}

    @classmethod
    def from_json(cls, data: Any) -> SavedSet:
        """Raises ValueError for anything that is not a manifest steward wrote."""
        try:
            slots = tuple(SavedSlot(str(s["file"]), int(s["tokens"]), int(s["nbytes"])) for s in data["slots"])
            if any(Path(s.file).name != s.file or not s.file.endswith(".bin") for s in slots):
                raise ValueError("a file name that is not a plain name")
            return cls(dict(data["fingerprint"]), float(data["saved_at"]), slots)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a manifest: {exc!r}") from exc


@attrs.frozen
class Pruned:
    model: str
    why: str  # "expired" or "cap"
    nbytes: int


@attrs.frozen
class CacheFolder:
    root: Path

    def model_dir(self, model: str) -> Path:
        """A model name may hold '/' and ':' (the config allows them): quoted into one folder name."""
        return self.root / urllib.parse.quote(model, safe="")

    def read(self, model: str) -> SavedSet | None:
        """The model's last save; None when there is none, or its manifest cannot be read."""
        try:
            return SavedSet.from_json(json.loads((self.model_dir(model) / MANIFEST).read_text()))
        except (OSError, ValueError):
            return None

    def prepare(self, model: str) -> Path:
        """The model's folder, created, emptied of files its manifest does not list (leftovers of a
        save that was cut short)."""
        folder = self.model_dir(model)
        folder.mkdir(parents=True, exist_ok=True)
        current = self.read(model)
        keep = {MANIFEST} | {slot.file for slot in current.slots} if current is not None else {MANIFEST}
        for path in folder.iterdir():
            if path.name not in keep:
                _unlink(path)
        return folder

    def write(self, model: str, saved: SavedSet) -> None:
        """Make *saved* the model's set; the files of the set it replaces go."""
        folder = self.model_dir(model)
        old = self.read(model)
        temporary = folder / f".{MANIFEST}.tmp"
        temporary.write_text(json.dumps(saved.to_json()))
        os.replace(temporary, folder / MANIFEST)
        listed = {slot.file for slot in saved.slots}
        for slot in old.slots if old is not None else ():
            if slot.file not in listed:
                _unlink(folder / slot.file)

    def discard(self, model: str) -> int:
        """Delete the model's set; the bytes it held."""
        saved = self.read(model)
        folder = self.model_dir(model)
        _unlink(folder / MANIFEST)
        for slot in saved.slots if saved is not None else ():
            _unlink(folder / slot.file)
        return saved.nbytes if saved is not None else 0

    def sets(self) -> dict[str, SavedSet]:
        """Every model's set in the folder, by model name."""
        found = {}
        with contextlib.suppress(OSError):
            for folder in self.root.iterdir():
                if folder.is_dir() and (saved := self.read(name := urllib.parse.unquote(folder.name))) is not None:
                    found[name] = saved
        return found

    def prune(self, keep_s: float, max_bytes: int, now: float | None = None) -> list[Pruned]:
        """Delete the sets older than *keep_s*, then the oldest until all hold at most *max_bytes*."""
        now = time.time() if now is None else now
        pruned = []
        sets = self.sets()
        for model, saved in sorted(sets.items(), key=lambda item: item[1].saved_at):
            if now - saved.saved_at > keep_s:
                pruned.append(Pruned(model, "expired", self.discard(model)))
                del sets[model]
        total = sum(saved.nbytes for saved in sets.values())
        for model, saved in sorted(sets.items(), key=lambda item: item[1].saved_at):
            if total <= max_bytes:
                break
            pruned.append(Pruned(model, "cap", self.discard(model)))
            total -= saved.nbytes
        return pruned


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
