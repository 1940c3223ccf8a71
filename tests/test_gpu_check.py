"""``steward gpu-check`` (supervisor/tools/gpu_check*.py, deploy/gpu-check.sh) without a GPU.

The comparisons and tables are pure and tested on figures made up here, a CUDA log among them.
The whole flow runs with ``--simulated``: the simulated GPU, the real CPU llama-server behind
``fakes/simgpu_engine.py``, SmolLM2 and the tiny models, a kill -9 and steward's release. Without
an NVIDIA driver the plain command says so and exits with ``EXIT_NO_DEVICE``; the CUDA build says
what it lacks.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fakes.tiny_gguf import write_tiny_model
from supervisor.accounting.estimate import DEFAULT_GPU_RESERVE, estimate
from supervisor.accounting.llama_logs import parse_llama_log
from supervisor.cli import main
from supervisor.engines.probes import ProbeUnavailable
from supervisor.exit_status import EXIT_NO_DEVICE
from supervisor.tools import gpu_check, gpu_check_setup
from supervisor.tools.gpu_check_tables import (
    MIB,
    ComponentCheck,
    EngineMemory,
    PhantomRecord,
    ProbeSample,
    compare_components,
    device_buffers,
    format_memory,
    format_phantom,
)
from tests.conftest import ROOT

# ---------------------------------------------------------------------------------------------
# the comparisons (pure)


def test_tolerances_are_the_ones_docs_estimates_states() -> None:
    assert ComponentCheck("gpu0", "weights", 100 * MIB, 101 * MIB).verdict == "PASS"  # 1 %
    assert ComponentCheck("gpu0", "kv", 100 * MIB, round(101.2 * MIB)).verdict == "FAIL"
    assert ComponentCheck("host", "recurrent", 0, round(0.004 * MIB)).verdict == "PASS"  # the log's two decimals
    assert ComponentCheck("gpu0", "compute", 100 * MIB, 119 * MIB).verdict == "PASS"  # 20 %
    assert ComponentCheck("gpu0", "compute", 100 * MIB, 79 * MIB).verdict == "FAIL"
    assert ComponentCheck("host", "output", MIB, 2 * MIB).verdict == ""  # reported, not judged
    assert ComponentCheck("gpu0", "total", MIB, 2 * MIB).verdict == ""
    assert ComponentCheck("gpu0", "compute", 100 * MIB, 110 * MIB).error == pytest.approx(0.10)
    assert ComponentCheck("host", "output", 0, MIB).error is None


def test_a_cuda_log_against_the_gpu_estimate(tmp_path: Path) -> None:
    """Every layer on the GPU: the log's CUDA0 and host buffers against the estimate's gpu0 and host
    columns; gpu0's total leaves out the reserve no log line reports."""
    model = write_tiny_model(tmp_path / "m.gguf", "llama", n_layer=4, n_embd=256, n_head=8, n_head_kv=2, n_ff=768,
                             n_vocab=2048)
    flags = ["-c", "4096", "-np", "4", "-ngl", "99"]
    guess = estimate(model.path, flags, device="gpu")
    gpu, host = guess.devices["gpu0"], guess.host
    log = "\n".join([
        f"load_tensors:   CPU_Mapped model buffer size = {host.weights / MIB:8.2f} MiB",
        f"load_tensors:        CUDA0 model buffer size = {gpu.weights / MIB:8.2f} MiB",
        f"llama_context:  CUDA_Host  output buffer size = {host.output / MIB:8.2f} MiB",
        f"llama_kv_cache:      CUDA0 KV buffer size = {gpu.kv / MIB:8.2f} MiB",
        f"sched_reserve:      CUDA0 compute buffer size = {gpu.compute * 1.3 / MIB:8.2f} MiB",  # 30 % more
        f"sched_reserve:  CUDA_Host compute buffer size = {host.compute / MIB:8.2f} MiB",
    ])
    checks = {(c.device, c.component): c for c in compare_components(guess, parse_llama_log(log).devices())}
    assert set(checks) == {("gpu0", "weights"), ("gpu0", "kv"), ("gpu0", "compute"), ("gpu0", "total"),
                           ("host", "weights"), ("host", "compute"), ("host", "output"), ("host", "total")}
    assert {key: c.verdict for key, c in checks.items() if c.verdict} == {
        ("gpu0", "weights"): "PASS", ("gpu0", "kv"): "PASS", ("gpu0", "compute"): "FAIL",
        ("host", "weights"): "PASS", ("host", "compute"): "PASS"}
    assert checks["gpu0", "total"].estimated == gpu.total - DEFAULT_GPU_RESERVE
    assert checks["gpu0", "compute"].error == pytest.approx(1 / 1.3 - 1, abs=0.001)


def test_what_the_log_puts_on_the_device() -> None:
    cuda = {"gpu0": {"weights": 90, "kv": 40}, "host": {"weights": 30, "output": 1}}
    assert device_buffers(cuda) == 130
    assert device_buffers({"host": {"weights": 30, "kv": 10}}) == 40  # a CPU build: the simulated GPU holds it all


def test_memory_table_names_what_the_log_never_does() -> None:
    rows = [EngineMemory("smollm2", 4242, 580 * MIB, "estimate", 640 * MIB, 640 * MIB, 153 * MIB),
            EngineMemory("tiny", 4243, 420 * MIB, "estimate", 420 * MIB, None, 16 * MIB)]
    table = format_memory(rows, "NVML")
    assert rows[0].unlogged == 487 * MIB and rows[1].unlogged is None
    smollm2, tiny = table.splitlines()[1:3]
    assert smollm2.split() == ["smollm2", "4242", "580.0", "MiB", "(estimate)", "640.0", "MiB", "640.0", "MiB",
                               "+0", "B", "153.0", "MiB", "487.0", "MiB"]
    assert "not listed" in tiny


def phantom(samples: list[tuple[float, bool, int]], events: list[tuple[float, str]]) -> PhantomRecord:
    killed = 1000.0
    return PhantomRecord("smollm2", 4242, killed, 600 * MIB, 2000 * MIB,
                         tuple(ProbeSample(killed + at, listed, used * MIB) for at, listed, used in samples),
                         tuple({"ts": killed + at, "event": name, "level": "info", "engine": "smollm2"}
                               for at, name in events), 10.0)


def test_the_phantom_timeline_in_milliseconds() -> None:
    record = phantom([(0.005, True, 2000), (0.030, False, 2000), (0.800, False, 1400)],
                     [(0.010, "exit"), (0.011, "crash"), (0.950, "released")])
    assert record.moment("gone") == pytest.approx(0.030)
    assert record.moment("freed") == pytest.approx(0.800)
    assert record.moment("released") == pytest.approx(0.950)
    text = format_phantom(record, "NVML")
    assert "+30 ms  NVML: not listed; the device still holds 600.0 MiB of it" in text
    assert "+800 ms  NVML: not listed; its memory is free" in text
    assert "+950 ms  event released (info)" in text
    assert "memory freed at +800 ms (a phantom for 770 ms)" in text
    assert text.endswith("steward released the reservation after the memory was free")


def test_a_release_before_the_memory_is_free_is_said() -> None:
    record = phantom([(0.030, False, 2000), (0.800, False, 1400)], [(0.100, "release_timeout")])
    text = format_phantom(record, "NVML")
    assert "(release_timeout, release_timeout 10s) at +100 ms" in text
    assert text.endswith("700 ms BEFORE the memory was free")
    assert phantom([(0.03, True, 2000)], []).moment("released") is None
    assert "memory freed never seen" in format_phantom(phantom([(0.03, False, 2000)], []), "NVML")


def test_engines_as_the_event_log_tells_them() -> None:
    records: list[dict[str, Any]] = [
        {"event": "memory_plan", "engine": "a", "memory": 5, "source": "estimate"},
        {"event": "spawn", "engine": "a", "pid": 7, "argv": ["llama-server", "-c", "1"]},
        {"event": "ready", "engine": "a", "load_s": 0.5},
        {"event": "buffers", "engine": "a", "devices": {"gpu0": {"weights": 3}}},
        {"event": "crash", "engine": "a", "detail": "later"},  # after ready: not a failed start
        {"event": "spawn_failed", "engine": "b", "detail": "no such file"},
        {"event": "ready", "engine": "other", "load_s": 1.0},
    ]
    runs = gpu_check.engine_runs(records, ["a", "b", "c"])
    assert (runs["a"].pid, runs["a"].planned, runs["a"].load_s, runs["a"].failure) == (7, 5, 0.5, None)
    assert runs["a"].buffers == {"gpu0": {"weights": 3}} and runs["a"].settled
    assert runs["b"].failure == "spawn_failed: no such file" and runs["b"].settled
    assert not runs["c"].settled


# ---------------------------------------------------------------------------------------------
# no driver


def test_without_a_driver_it_says_so(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                     tmp_path: Path) -> None:
    def no_nvml() -> None:
        raise ProbeUnavailable("NVML unavailable: NVML Shared Library Not Found")

    monkeypatch.setattr(gpu_check_setup, "NvmlProbe", no_nvml)
    assert main(["gpu-check", "--save", str(tmp_path)]) == EXIT_NO_DEVICE
    said = capsys.readouterr()
    assert said.out == ""
    assert said.err.strip() == ("steward: gpu-check: no NVIDIA driver (NVML unavailable: NVML Shared Library Not "
                                "Found); nothing to check here. `steward gpu-check --simulated` runs the same steps "
                                "on a simulated GPU")
    assert (tmp_path / "gpu-check-report.txt").read_text().startswith("steward: gpu-check: no NVIDIA driver")


def has_nvml() -> bool:
    try:
        gpu_check_setup.NvmlProbe()
    except (ProbeUnavailable, ImportError):
        return False
    return True


@pytest.mark.slow
def test_the_plain_command_and_its_script_without_a_driver(tmp_path: Path) -> None:
    if has_nvml():
        pytest.skip("this host has an NVIDIA driver: the plain command would run the whole check")
    env = {**os.environ, "STEWARD_PYTHON": sys.executable, "OUT": str(tmp_path / "out")}
    ran = subprocess.run(["sh", str(ROOT / "deploy" / "gpu-check.sh")], env=env, capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    assert ran.returncode == EXIT_NO_DEVICE, ran.stderr
    assert "no NVIDIA driver" in ran.stdout + ran.stderr and "Traceback" not in ran.stdout + ran.stderr
    assert "no NVIDIA driver" in (tmp_path / "out" / "gpu-check.log").read_text()


@pytest.mark.slow
def test_the_cuda_build_says_what_is_missing(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": "/usr/bin:/bin", "CUDA_HOME": str(tmp_path / "no-cuda"),
           "STEWARD_CACHE": str(tmp_path / "cache")}
    env.pop("CUDACXX", None)
    ran = subprocess.run(["sh", str(ROOT / "deploy" / "build-llama-server.sh"), "--cuda"], env=env,
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert ran.returncode == 1 and ran.stdout == ""
    assert "error: nvcc not found" in ran.stderr
    assert not (tmp_path / "cache" / "llama-server-cuda-0.3.36").exists()


# ---------------------------------------------------------------------------------------------
# the whole flow on the simulated GPU


@pytest.mark.slow
def test_the_whole_check_on_the_simulated_gpu(tmp_path: Path) -> None:
    """Real processes: steward, four CPU llama-servers behind fakes/simgpu_engine.py; one killed."""
    report = gpu_check.run_gpu_check(tmp_path, simulated=True)
    text = gpu_check.format_report(report)
    assert report.all_ran, text
    assert [s.title for s in report.sections] == [
        "(a) device", "(b) llama-server", "(c) models", "(c) engines ready", "(c) ledger against the device",
        "(c) estimate against the engines' logs", "(d) phantom-memory guard", "(e) stop"]
    # the ledger: estimated at the load, then what the simulated GPU lists for the engine's pid
    assert {row.engine for row in report.memory} == {"smollm2", "tiny-llama", "tiny-gemma3", "tiny-qwen3moe"}
    for row in report.memory:
        assert row.source == "estimate" and row.used == row.reserved, row
        assert row.unlogged == 256 * MIB  # fakes/simgpu_engine.py's reserve beside the logged buffers
    # the estimate: the CPU build's buffers, every tolerance held (docs/estimates.md's rows)
    assert report.verdicts and set(report.verdicts) == {"PASS"}
    # the phantom guard: gone from the list at once; the memory lingers for the simulated driver's
    # linger, and steward releases the reservation only once it is gone
    record = report.phantom
    assert record is not None and record.engine == "smollm2" and record.release_event == "released"
    gone, freed, released = (record.moment(what) for what in ("gone", "freed", "released"))
    assert gone is not None and freed is not None and released is not None
    linger = gpu_check_setup.SIM_LINGER_S
    assert gone < linger / 2 and freed >= linger and released >= linger, (gone, freed, released)
    assert [e["event"] for e in record.events][:2] == ["exit", "crash"]
    assert report.left_behind == []
    assert "12 PASS, 0 FAIL; every step ran" in text
