"""Measured memory per model and arguments, kept across restarts of steward.

After an engine's first load its measured memory (NVML per process, or RSS on a
CPU-only host) replaces the estimate. The key is the model file (path, size, mtime)
and the engine's arguments, so a changed file or changed flags are measured afresh.
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
    """A small JSON file: key -> {"bytes", "engine", "measured_at"}. Written atomically."""

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

    def record(self, key: str, engine: str, nbytes: int) -> str | None:
        """Keep a measurement; returns what failed if the file could not be written (the
        measurement still counts for this run: a read-only disk must not stop steward)."""
        self._entries[key] = {"bytes": nbytes, "engine": engine, "measured_at": round(time.time(), 3)}
        if self.path is None:
            return None
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        try:
            tmp.write_text(json.dumps(self._entries, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError as exc:
            return f"cannot write {self.path}: {exc.strerror or exc}"
        return None
