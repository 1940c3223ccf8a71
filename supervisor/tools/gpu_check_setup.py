"""What ``steward gpu-check`` needs before steward starts: the device, a llama-server, the models, a config.

- The device: NVML (``gpu.probe: nvml``), or with ``--simulated`` a simulated GPU made in the
  check's folder (``fakes/simgpu.py``), whose memory of a dead process lingers as NVML's does.
- The llama-server: the CUDA build (``deploy/build-llama-server.sh --cuda``, built once into the
  cache from the sdist kept there, its time reported), or one given; with ``--simulated`` the
  CPU build, each engine run by ``fakes/simgpu_engine.py``, which registers on the simulated GPU
  what the engine's log says it allocated.
- The models: SmolLM2-135M-Instruct if it is on disk (never fetched: the GPU machine may have no
  network) and three tiny models of other shapes written on the fly (``fakes/tiny_gguf.py``),
  each with the flags of a row of docs/estimates.md and ``-ngl 99``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from supervisor.engines.probes import GpuProbe, NvmlProbe, ProbeUnavailable, SimulatedGpuProbe
from supervisor.units import format_size

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "build-llama-server.sh"
SIM_GPU_BYTES = 16 * 1024**3
SIM_LINGER_S = 1.0  # the simulated driver's phantom: longer than steward's poll, so it shows
POLL_INTERVAL = "0.2s"  # steward's probe readings: the phantom guard's steps
RELEASE_TIMEOUT_S = 10.0  # scheduler.release_timeout (its default, written out so the report can name it)
OFFLOAD = ["-ngl", "99"]  # every layer and the output layer on the GPU

# name: (tiny_gguf architecture, its shape, llama-server flags): rows of docs/estimates.md's table.
TINY_MODELS: dict[str, tuple[str, dict[str, Any], tuple[str, ...]]] = {
    "tiny-llama": ("llama", dict(n_layer=4, n_embd=256, n_head=8, n_head_kv=2, n_ff=768, n_vocab=2048),
                   ("-c", "4096", "-np", "4")),
    "tiny-gemma3": ("gemma3", dict(n_layer=6, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
                                   sliding_window=128, n_vocab=2048), ("-c", "1024", "-np", "1")),
    "tiny-qwen3moe": ("qwen3moe", dict(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
                                       n_expert=8, n_expert_used=2, n_ff_exp=128, n_vocab=2048), ("-c", "4096",)),
}
SMOLLM2 = "smollm2"
SMOLLM2_FLAGS = ("-c", "2048", "-np", "1")


class NoDevice(Exception):
    """No NVIDIA driver: NVML cannot start (or nvidia-ml-py is missing)."""


class StepFailed(Exception):
    """A step that could not run, and what is missing for it."""


@attrs.frozen
class DeviceFound:
    probe: GpuProbe
    name: str
    total: int
    used: int
    driver: str
    gpu_dir: Path | None = None  # the simulated GPU's folder

    def describe(self) -> str:
        return f"{self.name}: {format_size(self.total)}, {format_size(self.used)} in use; {self.driver}"


def find_device(simulated: bool, workdir: Path) -> DeviceFound:
    """The first device and its probe; NoDevice without an NVIDIA driver."""
    if simulated:
        from fakes import simgpu

        gpu_dir = simgpu.create_device(workdir / "gpu", total_bytes=SIM_GPU_BYTES, name="Simulated GPU (gpu-check)",
                                       linger_s=SIM_LINGER_S)
        probe: GpuProbe = SimulatedGpuProbe(str(gpu_dir))
        driver = f"simulated (fakes/simgpu.py): a dead process's memory lingers {SIM_LINGER_S:g}s, as NVML's does"
    else:
        gpu_dir = None
        try:
            probe = NvmlProbe()
        except ImportError:
            raise NoDevice("nvidia-ml-py (pynvml) is not installed") from None
        except ProbeUnavailable as exc:
            raise NoDevice(str(exc)) from None
        driver = _nvml_versions()
    first = probe.read()[0]
    return DeviceFound(probe, first.name, first.total_bytes, first.used_bytes, driver, gpu_dir)


def _nvml_versions() -> str:
    import pynvml

    driver = pynvml.nvmlSystemGetDriverVersion()
    cuda = pynvml.nvmlSystemGetCudaDriverVersion()
    return f"NVML: driver {driver if isinstance(driver, str) else driver.decode()}, CUDA {cuda // 1000}.{cuda % 1000 // 10}"


@attrs.frozen
class LlamaServerFound:
    path: Path
    how: str  # "built in 312 s", "cached", ...
    seconds: float  # finding or building it took


def find_llama_server(simulated: bool, given: Path | None, say: Callable[[str], None]) -> LlamaServerFound:
    """The llama-server the engines run; StepFailed saying what is missing."""
    if given is not None:
        if not (given.is_file() and given.stat().st_mode & 0o111):
            raise StepFailed(f"--llama-server {given}: no executable there")
        return LlamaServerFound(given, "given (--llama-server)", 0.0)
    if simulated:
        from fakes.llama_binary import llama_server_path

        try:
            return LlamaServerFound(llama_server_path(), "the CPU build, cached: --simulated", 0.0)
        except FileNotFoundError as exc:
            raise StepFailed(str(exc)) from None
    if not BUILD_SCRIPT.is_file():
        raise StepFailed(f"no {BUILD_SCRIPT} (an installed copy without the source tree): give --llama-server PATH")
    started = time.monotonic()
    build = subprocess.Popen(["sh", str(BUILD_SCRIPT), "--cuda"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, errors="replace")
    assert build.stderr is not None and build.stdout is not None
    said = []
    for line in build.stderr:  # the script's progress, as it goes (a build takes minutes)
        said.append(line.rstrip())
        say(line.rstrip())
    answer = build.stdout.read().strip().splitlines()
    seconds = time.monotonic() - started
    if build.wait() != 0 or not answer:
        errors = [line for line in said if "error:" in line] or said[-3:]
        raise StepFailed("no CUDA llama-server: " + " / ".join(errors))
    built = any(" built in " in line for line in said)
    return LlamaServerFound(Path(answer[-1]), f"built in {seconds:.0f} s" if built else "cached", seconds)


@attrs.frozen
class CheckModel:
    name: str
    path: Path
    flags: tuple[str, ...]  # llama-server's context and slots (-ngl is added for all)
    what: str


def check_models(workdir: Path) -> tuple[list[CheckModel], list[str]]:
    """SmolLM2 if on disk, and the tiny models, written into *workdir*; and what is missing."""
    from fakes.real_model import FETCH_HINT, cached_smollm2, smollm2_if_present
    from fakes.tiny_gguf import write_tiny_model

    models, missing = [], []
    smollm2 = smollm2_if_present()
    if smollm2 is None:
        missing.append(f"SmolLM2-135M-Instruct: not at {cached_smollm2()} (nor STEWARD_SMOLLM2_GGUF); {FETCH_HINT} "
                       "where there is network, and bring the file")
    else:
        models.append(CheckModel(SMOLLM2, smollm2, SMOLLM2_FLAGS, "SmolLM2-135M-Instruct Q4_1"))
    folder = workdir / "models"
    folder.mkdir(parents=True, exist_ok=True)
    for name, (arch, shape, flags) in TINY_MODELS.items():
        written = write_tiny_model(folder / f"{name}.gguf", arch, **shape)
        models.append(CheckModel(name, written.path, flags, f"tiny {arch}, random weights"))
    return models, missing


def engine_command(binary: Path, device: DeviceFound) -> list[str]:
    """The engines' program: the llama-server itself, or on the simulated GPU the real CPU one run by
    fakes/simgpu_engine.py."""
    if device.gpu_dir is None:
        return [str(binary)]
    return [sys.executable, "-m", "fakes.simgpu_engine", "--sim-gpu", str(device.gpu_dir), "--", str(binary)]


def steward_config(models: list[CheckModel], command: list[str], device: DeviceFound, workdir: Path,
                   ) -> dict[str, Any]:
    """Every model always on (loaded at start), on the probe of *device*; nothing else of steward's."""
    simulated = device.gpu_dir is not None
    gpu: dict[str, Any] = {"probe": "simulated" if simulated else "nvml", "poll_interval": POLL_INTERVAL}
    if simulated:
        gpu["simulated_dir"] = str(device.gpu_dir)
    return {
        "listen": "127.0.0.1:0",
        "models": {m.name: {"command": command, "model": str(m.path), "always_on": True,
                            "args": [*m.flags, *OFFLOAD], **({"threads": 1} if simulated else {})}
                   for m in models},
        "gpu": gpu,
        # The killed engine is not started again while the check watches its memory go.
        "engines": {"stop_grace": "5s", "restart_backoff": "60s"},
        "scheduler": {"release_timeout": f"{RELEASE_TIMEOUT_S:g}s"},
        "state_file": str(workdir / "state.json"),
        "usage": {"db": str(workdir / "usage.db")},
        "auth": {"keys_file": str(workdir / "keys.json")},
    }
