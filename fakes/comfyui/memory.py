"""The process's GPU memory: models loaded by a job stay (ComfyUI's model cache) until freed.

With ``--sim-gpu`` the process registers what it holds with ``fakes.simgpu`` and reads the
device back for ``/system_stats`` (so ``vram_free`` also drops for other processes' memory,
as the driver's number does); without it the device is ``--vram`` bytes used by this process only.
"""

from __future__ import annotations

import time
from pathlib import Path

import attrs
import trio

from fakes import simgpu
from fakes.comfyui.cli import Config


@attrs.define(eq=False)
class Gpu:
    cfg: Config
    held: int = 0
    loads: int = 0
    unloads: int = 0
    _device: simgpu.SimulatedDevice | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        if self.cfg.sim_gpu:
            self._device = simgpu.SimulatedDevice(self.cfg.sim_gpu)

    @property
    def loaded(self) -> bool:
        return self.held > 0

    async def ensure_loaded(self) -> None:
        """A job needs the models: "load" them (memory is taken when the load starts)."""
        if self.loaded or self.cfg.model_memory <= 0:
            return
        self._set(self.cfg.model_memory)
        self.loads += 1
        await trio.sleep(self.cfg.load_time)

    async def unload(self, delay: float) -> None:
        """``unload_all_models`` + ``soft_empty_cache``: the memory goes back *delay* later."""
        if not self.loaded:
            return
        await trio.sleep(delay)
        self.drop()

    def drop(self) -> None:
        if self.loaded:
            self._set(0)
            self.unloads += 1

    def _set(self, nbytes: int) -> None:
        self.held = nbytes
        if self.cfg.sim_gpu:
            simgpu.register(self.cfg.sim_gpu, nbytes, label="comfyui")

    def device(self) -> tuple[str, int, int]:
        """(name, vram_total, vram_free) as the driver reports them."""
        if self._device is None:
            return "Simulated GPU", self.cfg.vram, max(0, self.cfg.vram - self.held)
        reading = self._device.read(time.monotonic())
        return reading.name, reading.total_bytes, max(0, reading.total_bytes - reading.used_bytes)

    def ram(self) -> tuple[int, int]:
        try:
            info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
            return int(info["MemTotal"].split()[0]) * 1024, int(info["MemAvailable"].split()[0]) * 1024
        except (OSError, KeyError, ValueError):
            return 0, 0

