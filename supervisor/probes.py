"""GPU probes: what the device says it has and who uses it.

One interface for NVML and the simulated GPU. The gateway process only ever talks
to NVML (never CUDA), so it creates no context and holds no GPU memory itself.
"""

from __future__ import annotations

import os
import time
from typing import Protocol

import attrs

from supervisor.config import GpuConfig


@attrs.frozen
class GpuReading:
    device: str  # "gpu0", ...
    name: str
    total_bytes: int
    used_bytes: int
    processes: dict[int, int]  # pid -> bytes, as the per-process list reports them


class GpuProbe(Protocol):
    kind: str

    def read(self) -> list[GpuReading]: ...


class ProbeUnavailable(Exception):
    pass


@attrs.define(eq=False)
class SimulatedGpuProbe:
    directory: str
    kind: str = "simulated"
    _device: object = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        from fakes.simgpu import SimulatedDevice  # the demo and tests only

        if not os.path.exists(os.path.join(self.directory, "gpu.json")):
            raise ProbeUnavailable(f"no simulated GPU in {self.directory} (gpu.json missing)")
        self._device = SimulatedDevice(self.directory)

    def read(self) -> list[GpuReading]:
        reading = self._device.read(time.monotonic())  # type: ignore[attr-defined]
        return [GpuReading("gpu0", reading.name, reading.total_bytes, reading.used_bytes, reading.processes)]


@attrs.define(eq=False)
class NvmlProbe:
    kind: str = "nvml"
    _handles: list[object] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        import pynvml

        try:
            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError as exc:
            raise ProbeUnavailable(f"NVML unavailable: {exc}") from None
        if not self._handles:
            raise ProbeUnavailable("NVML found no GPU")

    def read(self) -> list[GpuReading]:
        import pynvml

        readings = []
        for index, handle in enumerate(self._handles):
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            # A separate call from the totals above: a process may exit in between.
            processes = {p.pid: p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
            name = pynvml.nvmlDeviceGetName(handle)
            readings.append(GpuReading(f"gpu{index}", name if isinstance(name, str) else name.decode(),
                                       memory.total, memory.used, processes))
        return readings


def open_probe(config: GpuConfig) -> tuple[GpuProbe | None, str]:
    """The configured probe, or None; the second value says what was chosen and why."""
    if config.probe == "none":
        return None, "gpu.probe is 'none'"
    if config.probe == "simulated" or (config.probe == "auto" and config.simulated_dir):
        assert config.simulated_dir is not None
        return SimulatedGpuProbe(config.simulated_dir), f"simulated GPU in {config.simulated_dir}"
    try:
        probe = NvmlProbe()
    except ProbeUnavailable as exc:
        if config.probe == "nvml":
            raise
        return None, f"no NVIDIA GPU: {exc}"
    return probe, f"NVML, {len(probe._handles)} device(s)"


def host_memory_total() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise ProbeUnavailable("MemTotal missing from /proc/meminfo")
