"""A simulated GPU that fake engines register their memory with.

The "device" is a directory. ``gpu.json`` holds its size; each process that holds
memory writes ``proc-<pid>.json`` with its byte count (atomically, so a reader never
sees half a file). Steward reads it through the same probe interface as NVML
(``supervisor.probes.SimulatedGpuProbe``).

Like the real driver, the simulated one lies a little: memory of a process that
has exited (cleanly or killed) is still counted in the device total for
``linger_s`` after the reader first notices the exit, although the process is
already gone from the per-process list. That is exactly the inconsistency NVML
shows between ``nvmlDeviceGetMemoryInfo`` and ``nvmlDeviceGetComputeRunningProcesses``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import attrs

GPU_FILE = "gpu.json"
PROC_PREFIX = "proc-"


def create_device(directory: str | os.PathLike[str], *, total_bytes: int, name: str = "Simulated GPU",
                  linger_s: float = 0.3) -> Path:
    """Make (or reset) a simulated device in *directory* and return its path."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob(f"{PROC_PREFIX}*.json"):
        stale.unlink(missing_ok=True)
    _write_json(path / GPU_FILE, {"name": name, "total_bytes": total_bytes, "linger_s": linger_s})
    return path


def register(directory: str | os.PathLike[str], nbytes: int, *, pid: int | None = None, label: str = "") -> None:
    """Record that process *pid* (default: this one) now holds *nbytes* on the device."""
    pid = os.getpid() if pid is None else pid
    _write_json(Path(directory) / f"{PROC_PREFIX}{pid}.json", {"pid": pid, "bytes": nbytes, "label": label})


def unregister(directory: str | os.PathLike[str], *, pid: int | None = None) -> None:
    """A clean exit: the process leaves the list, its memory is freed after the linger."""
    pid = os.getpid() if pid is None else pid
    path = Path(directory) / f"{PROC_PREFIX}{pid}.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    _write_json(path, {**record, "exited": True})


@attrs.frozen
class SimReading:
    name: str
    total_bytes: int
    used_bytes: int
    processes: dict[int, int]  # pid -> bytes, live processes only


@attrs.define(eq=False)
class SimulatedDevice:
    """Reader side. Keeps when each dead process was first seen dead, for the linger."""

    directory: Path = attrs.field(converter=Path)
    _dead_since: dict[int, float] = attrs.field(factory=dict, init=False)

    def read(self, now: float) -> SimReading:
        meta = json.loads((self.directory / GPU_FILE).read_text())
        linger = float(meta.get("linger_s", 0.3))
        used = 0
        live: dict[int, int] = {}
        for entry in self.directory.glob(f"{PROC_PREFIX}*.json"):
            try:
                record = json.loads(entry.read_text())
            except (OSError, ValueError):
                continue  # removed or replaced between glob and read
            pid, nbytes = int(record["pid"]), int(record["bytes"])
            if _alive(pid) and not record.get("exited"):
                self._dead_since.pop(pid, None)
                live[pid] = nbytes
                used += nbytes
                continue
            first_seen_dead = self._dead_since.setdefault(pid, now)
            if now - first_seen_dead < linger:
                used += nbytes  # the driver has not reclaimed it yet
            else:
                entry.unlink(missing_ok=True)
                self._dead_since.pop(pid, None)
        return SimReading(name=str(meta.get("name", "Simulated GPU")), total_bytes=int(meta["total_bytes"]),
                          used_bytes=used, processes=live)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); its memory is gone all the same.
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def _write_json(path: Path, value: object) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)
