"""The simulated GPU as steward reads it (``gpu.probe: simulated``): a directory of files.

The "device" is a directory. ``gpu.json`` holds its size; each process that holds
memory writes ``proc-<pid>.json`` with its byte count. Several devices are a directory
of such device directories with ``devices.json`` listing them in index order. The
format is steward's, as NVML's interface is NVIDIA's: the fake engines write it
(``fakes/simgpu.py`` creates devices and registers their memory), steward only reads it
(``supervisor.engines.probes.SimulatedGpuProbe``), so the service needs nothing of the fakes.

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
from typing import Any

import attrs

GPU_FILE = "gpu.json"
DEVICES_FILE = "devices.json"
PROC_PREFIX = "proc-"


def is_multi_device(directory: str | os.PathLike[str]) -> bool:
    return (Path(directory) / DEVICES_FILE).exists()


def device_dirs(directory: str | os.PathLike[str]) -> list[Path]:
    """The devices of *directory* in index order: those ``devices.json`` lists, else the directory itself."""
    path = Path(directory)
    if not is_multi_device(path):
        return [path]
    try:
        names = json.loads((path / DEVICES_FILE).read_text())["devices"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path / DEVICES_FILE}: unreadable device list ({exc})") from None
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"{path / DEVICES_FILE}: 'devices' must be a non-empty list of directory names")
    return [path / n for n in names]


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
        meta = read_meta(self.directory)
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


def read_meta(directory: Path) -> dict[str, Any]:
    """A device's ``gpu.json``: its name, size and linger."""
    meta: dict[str, Any] = json.loads((directory / GPU_FILE).read_text())
    return meta
