"""Memory probes: what the device says it has and who uses it.

One interface for NVML, the simulated GPU and host RAM (CPU-only hosts, where the
ledger accounts RAM with the engines' measured RSS). The gateway process only ever
talks to NVML (never CUDA), so it creates no context and holds no GPU memory itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Protocol

import attrs

from supervisor.config import GpuConfig
from supervisor.engines.process_tree import read_parents, tree_rss
from supervisor.engines.simulated_gpu import GPU_FILE, SimulatedDevice, device_dirs


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
    """The simulated GPU (supervisor/engines/simulated_gpu.py): one device directory, or a directory of them."""

    directory: str
    kind: str = "simulated"
    _devices: list[SimulatedDevice] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        try:
            dirs = device_dirs(self.directory)
        except ValueError as exc:
            raise ProbeUnavailable(f"no simulated GPU in {self.directory}: {exc}") from None
        for device in dirs:
            if not (device / GPU_FILE).exists():
                raise ProbeUnavailable(f"no simulated GPU in {device} (gpu.json missing)")
        self._devices = [SimulatedDevice(device) for device in dirs]

    def read(self) -> list[GpuReading]:
        now = time.monotonic()
        readings = []
        for index, device in enumerate(self._devices):
            reading = device.read(now)
            readings.append(GpuReading(f"gpu{index}", reading.name, reading.total_bytes, reading.used_bytes,
                                       reading.processes))
        return readings


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


@attrs.define(eq=False)
class HostMemoryProbe:
    """Host RAM: the total, and the resident set of each engine's process tree (VmRSS)."""

    engine_pids: Callable[[], Iterable[int]]
    kind: str = "host"

    def read(self) -> list[GpuReading]:
        parents = read_parents()
        processes = {pid: rss for pid in self.engine_pids() if (rss := tree_rss(pid, parents)) is not None}
        # Other processes' use of RAM is not the ledger's to count: gpu.budget is the share
        # the engines may have, so only the engines' own memory is "used".
        return [GpuReading("host", "host RAM", host_memory_total(), sum(processes.values()), processes)]


def open_probe(config: GpuConfig, engine_pids: Callable[[], Iterable[int]] = tuple) -> tuple[GpuProbe | None, str]:
    """The configured probe, or None; the second value says what was chosen and why.

    ``auto``: the simulated GPU if configured, else NVML, else host RAM (said once).
    """
    if config.probe == "none":
        return None, "gpu.probe is 'none'"
    if config.probe == "simulated" or (config.probe == "auto" and config.simulated_dir):
        assert config.simulated_dir is not None
        return SimulatedGpuProbe(config.simulated_dir), f"simulated GPU in {config.simulated_dir}"
    if config.probe == "host":
        return HostMemoryProbe(engine_pids), "host RAM (gpu.probe is 'host'): engines measured by RSS"
    try:
        probe = NvmlProbe()
    except ProbeUnavailable as exc:
        if config.probe == "nvml":
            raise
        return HostMemoryProbe(engine_pids), f"no NVIDIA GPU ({exc}); accounting host RAM, engines measured by RSS"
    return probe, f"NVML, {len(probe._handles)} device(s)"


def host_memory_total() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise ProbeUnavailable("MemTotal missing from /proc/meminfo")
