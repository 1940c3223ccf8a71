"""A simulated GPU that fake engines register their memory with: the writing side.

The "device" is a directory. ``gpu.json`` holds its size; each process that holds
memory writes ``proc-<pid>.json`` with its byte count (atomically, so a reader never
sees half a file). The format and its reader are steward's (``supervisor/engines/simulated_gpu.py``,
read through the same probe interface as NVML, ``supervisor.engines.probes.SimulatedGpuProbe``);
they are re-exported here (``SimulatedDevice``, ``device_dirs``, ...) for the fakes and tests.

Like the real driver, the simulated one lies a little: memory of a process that
has exited (cleanly or killed) is still counted in the device total for
``linger_s`` after the reader first notices the exit, although the process is
already gone from the per-process list. That is exactly the inconsistency NVML
shows between ``nvmlDeviceGetMemoryInfo`` and ``nvmlDeviceGetComputeRunningProcesses``.

Several devices (``create_devices``) are a directory of such device directories,
``gpu0``, ``gpu1``, ..., each usable alone, and ``devices.json`` listing them in index
order (``device_dirs``). A process on several devices writes its ``proc-<pid>.json`` on
each, with the bytes it holds there. ``visible_devices`` is what a CUDA process sees of
them under ``CUDA_VISIBLE_DEVICES``; how much goes where is the fake engine's business
(``fakes.llama_server.placement``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from supervisor.engines.simulated_gpu import (
    DEVICES_FILE,
    GPU_FILE,
    PROC_PREFIX,
    SimReading,
    SimulatedDevice,
    device_dirs,
    is_multi_device,
    read_meta,
)

__all__ = ["DEVICES_FILE", "GPU_FILE", "PROC_PREFIX", "SimReading", "SimulatedDevice", "create_device",
           "create_devices", "device_dirs", "device_total", "is_multi_device", "register", "unregister",
           "visible_devices"]


def create_device(directory: str | os.PathLike[str], *, total_bytes: int, name: str = "Simulated GPU",
                  linger_s: float = 0.3) -> Path:
    """Make (or reset) a simulated device in *directory* and return its path."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob(f"{PROC_PREFIX}*.json"):
        stale.unlink(missing_ok=True)
    _write_json(path / GPU_FILE, {"name": name, "total_bytes": total_bytes, "linger_s": linger_s})
    return path


def create_devices(directory: str | os.PathLike[str], totals: Sequence[int], *, name: str = "Simulated GPU",
                   linger_s: float = 0.3) -> Path:
    """Make (or reset) one device per entry of *totals*, ``directory/gpu<i>`` named "<name> <i>"."""
    if not totals:
        raise ValueError("create_devices: at least one device is needed")
    path = Path(directory)
    for index, total in enumerate(totals):
        create_device(path / f"gpu{index}", total_bytes=total, name=f"{name} {index}", linger_s=linger_s)
    _write_json(path / DEVICES_FILE, {"devices": [f"gpu{index}" for index in range(len(totals))]})
    return path


def visible_devices(directory: str | os.PathLike[str], cuda_visible_devices: str | None) -> list[Path]:
    """The devices a CUDA process sees, in its own order (``CUDA0`` first), under *cuda_visible_devices*.

    Like CUDA: unset means all of them; otherwise the comma list of indexes is read up to the
    first entry that is not a device's index (not a number, out of range, repeated), so ""
    and "-1" hide every device and "1,0" swaps them.
    """
    devices = device_dirs(directory)
    if cuda_visible_devices is None:
        return devices
    chosen: list[int] = []
    for entry in cuda_visible_devices.split(","):
        entry = entry.strip()
        if not entry.isdigit() or int(entry) >= len(devices) or int(entry) in chosen:
            break
        chosen.append(int(entry))
    return [devices[index] for index in chosen]


def device_total(directory: str | os.PathLike[str]) -> int:
    """The size of one device."""
    return int(read_meta(Path(directory))["total_bytes"])


def register(directory: str | os.PathLike[str], nbytes: int, *, pid: int | None = None, label: str = "") -> None:
    """Record that process *pid* (default: this one) now holds *nbytes* on the device."""
    pid = os.getpid() if pid is None else pid
    _write_json(Path(directory) / f"{PROC_PREFIX}{pid}.json", {"pid": pid, "bytes": nbytes, "label": label})


def unregister(directory: str | os.PathLike[str], *, pid: int | None = None) -> None:
    """A clean exit: the process leaves the list, its memory is freed after the linger.

    Given several devices, it leaves each of them (the fakes' exit path knows only --sim-gpu).
    """
    pid = os.getpid() if pid is None else pid
    try:
        devices = device_dirs(directory)
    except ValueError:
        return  # a broken list: nothing to find; a dead process's memory is reclaimed anyway
    for device in devices:
        _mark_exited(device / f"{PROC_PREFIX}{pid}.json")


def _mark_exited(path: Path) -> None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    _write_json(path, {**record, "exited": True})


def _write_json(path: Path, value: object) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)
