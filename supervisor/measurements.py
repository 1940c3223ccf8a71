"""Measured memory and load times per model and arguments, kept across restarts of steward.

After an engine's first load its measured memory (NVML per process, or RSS on a
CPU-only host) replaces the estimate, and its load time (decision to ready) tells the
scheduler what evicting it costs. The key is the model file (path, size, mtime) and the
engine's arguments, so a changed file or changed flags are measured afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import attrs

from supervisor.config import ModelConfig


def measurement_key(model: ModelConfig) -> str:
    identity: dict[str, object] = {"command": model.command, "model": model.model, "args": model.args,
                                   "parallel": model.parallel, "runtime": model.runtime}
    if model.model is not None:
        try:
            stat = os.stat(model.model)
            identity["file"] = [stat.st_size, stat.st_mtime_ns]
        except OSError:
            identity["file"] = None
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]


@attrs.define(eq=False)
class MeasurementStore:
    """A small JSON file: key -> {"bytes", "load_s", "engine", "measured_at"} (either figure may
    be missing). Written atomically."""

    path: Path | None
    _entries: dict[str, dict[str, object]] = attrs.Factory(dict)

    @classmethod
    def open(cls, path: str | Path | None) -> MeasurementStore:
        if path is None:
            return cls(None)
        path = Path(path)
        try:
            entries = json.loads(path.read_text())
        except FileNotFoundError:
            entries = {}
        except (OSError, ValueError):
            entries = {}  # unreadable: measure again rather than refuse to start
        return cls(path, entries if isinstance(entries, dict) else {})

    def get(self, key: str) -> int | None:
        entry = self._entries.get(key)
        if isinstance(entry, dict) and isinstance(entry.get("bytes"), int):
            return int(entry["bytes"])  # type: ignore[arg-type]
        return None

    def load_time(self, key: str) -> float | None:
        entry = self._entries.get(key)
        load_s = entry.get("load_s") if isinstance(entry, dict) else None
        if isinstance(load_s, int | float) and not isinstance(load_s, bool) and 0 <= load_s < float("inf"):
            return float(load_s)
        return None

    def record(self, key: str, engine: str, nbytes: int) -> str | None:
        """Keep a measurement of memory; returns what failed if the file could not be written
        (the measurement still counts for this run: a read-only disk must not stop steward)."""
        return self._update(key, engine, bytes=nbytes)

    def record_load_time(self, key: str, engine: str, seconds: float) -> str | None:
        """Keep how long a load took, as ``record`` keeps memory. One within a tenth of the
        figure kept is not written again: the file is not rewritten at every load."""
        kept = self.load_time(key)
        if kept is not None and abs(seconds - kept) <= kept / 10:
            return None
        return self._update(key, engine, load_s=round(seconds, 3))

    def _update(self, key: str, engine: str, **figures: object) -> str | None:
        entry = self._entries.get(key)
        kept = entry if isinstance(entry, dict) else {}
        self._entries[key] = kept | figures | {"engine": engine, "measured_at": round(time.time(), 3)}
        if self.path is None:
            return None
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        try:
            tmp.write_text(json.dumps(self._entries, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError as exc:
            return f"cannot write {self.path}: {exc.strerror or exc}"
        return None
