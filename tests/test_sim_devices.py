"""Several simulated GPUs (fakes.simgpu.create_devices), the probe that reads them, and the
fake llama-server placing its memory on them like llama.cpp (fakes.llama_server.placement)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path

import pytest

from fakes import simgpu
from fakes.llama_server.cli import parse_config
from fakes.llama_server.placement import PlacementError, PlacementFlags, SplitMode, split
from supervisor.engines.probes import GpuReading, ProbeUnavailable, SimulatedGpuProbe
from tests.fake_processes import FakeProcess, fake_launcher, wait_until

GiB = 1 << 30


def used(probe: SimulatedGpuProbe) -> list[int]:
    return [reading.used_bytes for reading in probe.read()]


def processes(probe: SimulatedGpuProbe) -> list[dict[int, int]]:
    return [reading.processes for reading in probe.read()]


# --------------------------------------------------------------------------- devices and the probe


def test_probe_reads_every_device(tmp_path: Path) -> None:
    gpus = simgpu.create_devices(tmp_path / "gpus", [24 * GiB, 8 * GiB])
    assert simgpu.device_dirs(gpus) == [gpus / "gpu0", gpus / "gpu1"]
    assert SimulatedGpuProbe(str(gpus)).read() == [GpuReading("gpu0", "Simulated GPU 0", 24 * GiB, 0, {}),
                                                   GpuReading("gpu1", "Simulated GPU 1", 8 * GiB, 0, {})]
    named = simgpu.create_devices(tmp_path / "named", [GiB], name="RTX")
    assert [r.name for r in SimulatedGpuProbe(str(named)).read()] == ["RTX 0"]


def test_each_device_can_be_used_alone_and_a_single_one_reads_as_before(tmp_path: Path) -> None:
    gpus = simgpu.create_devices(tmp_path / "gpus", [24 * GiB, 8 * GiB])
    assert SimulatedGpuProbe(str(gpus / "gpu1")).read() == [GpuReading("gpu0", "Simulated GPU 1", 8 * GiB, 0, {})]
    single = simgpu.create_device(tmp_path / "gpu", total_bytes=16 * GiB)
    assert simgpu.device_dirs(single) == [single]
    simgpu.register(single, GiB)
    assert SimulatedGpuProbe(str(single)).read() == [GpuReading("gpu0", "Simulated GPU", 16 * GiB, GiB,
                                                                {os.getpid(): GiB})]


def test_a_process_on_gpu1_shows_on_gpu1_only(tmp_path: Path) -> None:
    gpus = simgpu.create_devices(tmp_path / "gpus", [8 * GiB, 8 * GiB])
    simgpu.register(gpus / "gpu1", 2 * GiB)
    probe = SimulatedGpuProbe(str(gpus))
    assert used(probe) == [0, 2 * GiB]
    assert processes(probe) == [{}, {os.getpid(): 2 * GiB}]


def test_linger_is_per_device(tmp_path: Path) -> None:
    gpus = simgpu.create_devices(tmp_path / "gpus", [8 * GiB, 8 * GiB], linger_s=0.5)
    gpu0, gpu1 = (simgpu.SimulatedDevice(d) for d in simgpu.device_dirs(gpus))
    simgpu.register(gpus / "gpu0", GiB)
    simgpu.register(gpus / "gpu1", 3 * GiB)
    simgpu.unregister(gpus)  # the fakes' exit path: given the set, it leaves every device
    first1 = gpu1.read(now=100.0)
    assert (first1.processes, first1.used_bytes) == ({}, 3 * GiB)
    assert gpu0.read(now=100.25).used_bytes == GiB  # gpu0 first sees the exit now: its own linger starts
    assert gpu1.read(now=100.5).used_bytes == 0
    assert gpu0.read(now=100.5).used_bytes == GiB
    assert gpu0.read(now=100.75).used_bytes == 0
    assert not list(gpus.glob("gpu*/proc-*.json"))


@pytest.mark.parametrize(("marker", "complaint"), [
    ("{not json", "unreadable device list"),
    ('{"devices": []}', "non-empty list"),
    ('{"devices": "gpu0"}', "non-empty list"),
])
def test_a_broken_device_list_is_a_clear_probe_error(tmp_path: Path, marker: str, complaint: str) -> None:
    gpus = simgpu.create_devices(tmp_path / "gpus", [GiB])
    (gpus / simgpu.DEVICES_FILE).write_text(marker)
    with pytest.raises(ProbeUnavailable, match=complaint):
        SimulatedGpuProbe(str(gpus))


def test_a_listed_device_without_gpu_json_is_a_clear_probe_error(tmp_path: Path) -> None:
    gpus = simgpu.create_devices(tmp_path / "gpus", [GiB, GiB])
    (gpus / "gpu1" / simgpu.GPU_FILE).unlink()
    with pytest.raises(ProbeUnavailable, match=r"gpu1 \(gpu.json missing\)"):
        SimulatedGpuProbe(str(gpus))


@pytest.mark.parametrize(("value", "visible"), [
    (None, [0, 1, 2]), ("1", [1]), ("2,0", [2, 0]), ("", []), ("-1", []),
    ("0,7,1", [0]),  # CUDA stops at the first entry that names no device
    ("1,1", [1]), (" 1 , 2", [1, 2]),
])
def test_cuda_visible_devices(tmp_path: Path, value: str | None, visible: list[int]) -> None:
    gpus = simgpu.create_devices(tmp_path / "gpus", [GiB, GiB, GiB])
    assert simgpu.visible_devices(gpus, value) == [gpus / f"gpu{i}" for i in visible]


# --------------------------------------------------------------------------- the split (pure)


flags = PlacementFlags


def ts(*shares: float) -> tuple[Fraction, ...]:
    return tuple(Fraction(str(share)) for share in shares)


@pytest.mark.parametrize(("totals", "placement", "expected"), [
    ([24, 8], flags(), [(0, 3), (1, 1)]),  # layer split by device size
    ([8, 8], flags(tensor_split=ts(3, 1)), [(0, 3), (1, 1)]),
    ([8, 8], flags(tensor_split=ts(0.75, 0.25)), [(0, 3), (1, 1)]),
    ([8, 8], flags(tensor_split=ts(0, 1)), [(0, 0), (1, 4)]),  # still a device it uses
    ([8, 8], flags(tensor_split=ts(0, 0)), [(0, 2), (1, 2)]),  # all zero: as if not given
    ([8, 8, 8], flags(tensor_split=ts(1)), [(0, 4), (1, 0), (2, 0)]),  # missing entries are 0
    ([8, 8], flags(tensor_split=ts(1, 1, 5)), [(0, 2), (1, 2)]),  # extra entries ignored
    ([8, 8], flags(split_mode=SplitMode.NONE), [(0, 4)]),
    ([8, 8], flags(split_mode=SplitMode.NONE, main_gpu=1, tensor_split=ts(1, 0)), [(1, 4)]),  # -ts ignored
    ([8, 8], flags(split_mode=SplitMode.NONE, main_gpu=-1), []),
    ([8, 8], flags(main_gpu=1), [(0, 2), (1, 2)]),  # -mg only matters with -sm none
    ([8, 8], flags(devices=("CUDA1",)), [(1, 4)]),
    ([8, 24], flags(devices=("cuda1", "CUDA0"), tensor_split=ts(3, 1)), [(1, 3), (0, 1)]),  # -ts in -dev order
    ([8, 8], flags(devices=("CUDA1", "CUDA0"), split_mode=SplitMode.NONE), [(1, 4)]),
    ([8, 8], flags(devices=()), []),  # --device none
    ([], flags(), []),  # nothing visible
    ([8], flags(split_mode=SplitMode.ROW), [(0, 4)]),
])
def test_split(totals: list[int], placement: PlacementFlags, expected: list[tuple[int, int]]) -> None:
    assert split(4 * GiB, [t * GiB for t in totals], placement) == [(i, n * GiB) for i, n in expected]


def test_split_shares_add_up_exactly() -> None:
    assert split(10, [1, 1, 1], flags()) == [(0, 3), (1, 3), (2, 4)]
    assert split(0, [1, 1], flags()) == [(0, 0), (1, 0)]
    assert split(7, [0, 0], flags()) == [(0, 3), (1, 4)]  # devices of size 0: an even split


@pytest.mark.parametrize(("totals", "placement", "message"), [
    ([8, 8], flags(devices=("CUDA2",)), "invalid device: CUDA2"),
    ([8, 8], flags(devices=("Vulkan0",)), "invalid device: Vulkan0"),
    ([8, 8], flags(devices=("CUDA0", "cuda0")), "a device twice"),
    ([8, 8], flags(split_mode=SplitMode.NONE, main_gpu=2), r"invalid value for main_gpu: 2 \(available devices: 2\)"),
    ([], flags(split_mode=SplitMode.NONE), r"invalid value for main_gpu: 0 \(available devices: 0\)"),
])
def test_split_refuses_what_llama_cpp_refuses(totals: list[int], placement: PlacementFlags, message: str) -> None:
    with pytest.raises(PlacementError, match=message):
        split(GiB, [t * GiB for t in totals], placement)


def test_the_placement_flags() -> None:
    given = parse_config(["--port", "1", "-dev", "CUDA1, CUDA0", "-sm", "none", "-ts", "3/1", "-mg", "1"])
    assert given.placement == PlacementFlags(("CUDA1", "CUDA0"), SplitMode.NONE, ts(3, 1), 1)
    assert parse_config(["--port", "1", "--device", "none", "--split-mode", "row"]).placement == PlacementFlags(
        (), SplitMode.ROW)
    assert parse_config(["--port", "1"]).placement == PlacementFlags()


@pytest.mark.parametrize(("args", "complaint"), [
    (["-ts", "3,x"], "expected non-negative proportions like 3,1, got '3,x'"),
    (["-ts", "1,-1"], "expected non-negative proportions"),
    (["-dev", "CUDA0,"], "expected device names like CUDA0,CUDA1 or none"),
    (["-sm", "graph"], "invalid choice: 'graph'"),
    (["-mg", "x"], "invalid int value"),
])
def test_bad_placement_flags_are_usage_errors(capsys: pytest.CaptureFixture[str], args: list[str],
                                              complaint: str) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_config(["--port", "1", *args])
    assert exited.value.code == 2
    assert complaint in capsys.readouterr().err


# --------------------------------------------------------------------------- the fake llama-server, for real


@pytest.fixture
def start_fake(tmp_path: Path) -> Iterator[Callable[..., FakeProcess]]:
    for launcher in fake_launcher(tmp_path):
        yield lambda *args, wait=True: launcher.launch(FakeProcess, "fakes.llama_server", list(args),
                                                       ready_path="/health", wait=wait)


def stop(fake: FakeProcess) -> None:
    fake.proc.send_signal(signal.SIGTERM)
    assert fake.proc.wait(timeout=10) == 0


@pytest.mark.slow
@pytest.mark.parametrize(("cuda_visible", "args", "totals", "expected"), [
    ("1", [], [8, 8], [0, 4]),
    (None, ["-ts", "3,1"], [8, 8], [3, 1]),
    (None, ["-sm", "none", "-mg", "1"], [8, 8], [0, 4]),
    (None, [], [24, 8], [3, 1]),
    ("1,0", ["--device", "CUDA1", "--split-mode", "none"], [8, 8], [4, 0]),  # CUDA1 is gpu0 here
], ids=["CUDA_VISIBLE_DEVICES=1", "-ts 3,1", "-sm none -mg 1", "by device size", "visible 1,0 -dev CUDA1"])
def test_fake_llama_server_places_its_memory(start_fake: Callable[..., FakeProcess], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch, cuda_visible: str | None,
                                             args: list[str], totals: list[int], expected: list[int]) -> None:
    if cuda_visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cuda_visible)
    gpus = simgpu.create_devices(tmp_path / "gpus", [t * GiB for t in totals], linger_s=0.2)
    probe = SimulatedGpuProbe(str(gpus))
    fake = start_fake("--sim-gpu", str(gpus), "--memory", "4GiB", *args)
    # Registered before /health answers: no waiting needed.
    assert used(probe) == [n * GiB for n in expected]
    pid = fake.proc.pid
    assert processes(probe) == [{pid: n * GiB} if n else {} for n in expected]
    stop(fake)
    # Like NVML: gone from the process lists at once, counted in the totals until the linger is over
    # (which starts at this first read after the exit, so one read sees both).
    after_exit = probe.read()
    assert [(r.processes, r.used_bytes) for r in after_exit] == [({}, n * GiB) for n in expected]
    wait_until(lambda: used(probe) == [0, 0], timeout=10)
    assert not list(gpus.glob("gpu*/proc-*.json"))


@pytest.mark.slow
def test_fake_llama_server_with_no_visible_device_is_a_cpu_run(start_fake: Callable[..., FakeProcess],
                                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    gpus = simgpu.create_devices(tmp_path / "gpus", [8 * GiB, 8 * GiB])
    fake = start_fake("--sim-gpu", str(gpus), "--memory", "4GiB")
    assert used(SimulatedGpuProbe(str(gpus))) == [0, 0]
    assert "a CPU run" in fake.log()
    stop(fake)


@pytest.mark.slow
def test_fake_llama_server_fails_its_load_on_a_bad_main_gpu(start_fake: Callable[..., FakeProcess], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = simgpu.create_devices(tmp_path / "gpus", [8 * GiB, 8 * GiB])
    fake = start_fake("--sim-gpu", str(gpus), "--memory", "4GiB", "-sm", "none", "-mg", "2", wait=False)
    assert fake.proc.wait(timeout=10) == 1
    assert "invalid value for main_gpu: 2 (available devices: 2)" in fake.log()
    assert "main: exiting due to model loading error" in fake.log()
    assert used(SimulatedGpuProbe(str(gpus))) == [0, 0]


@pytest.mark.slow
def test_fake_llama_server_on_a_single_device_ignores_cuda_visible_devices(
        start_fake: Callable[..., FakeProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    gpu = simgpu.create_device(tmp_path / "gpu", total_bytes=8 * GiB)
    fake = start_fake("--sim-gpu", str(gpu), "--memory", "1GiB", "-sm", "none", "-mg", "3")
    assert processes(SimulatedGpuProbe(str(gpu))) == [{fake.proc.pid: GiB}]
    stop(fake)
