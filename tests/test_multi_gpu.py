"""Several GPUs in one host, end to end: a real steward on a simulated host with two devices,
fake llama-servers that place their memory as llama.cpp does (CUDA_VISIBLE_DEVICES,
--tensor-split), and the official OpenAI client as the caller."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from fakes import simgpu
from supervisor.engines.probes import SimulatedGpuProbe
from tests.conftest import StewardFactory, fake_model
from tests.fake_processes import wait_until

pytestmark = pytest.mark.slow  # every test here starts steward as a real process

GiB = 1 << 30


@pytest.fixture
def gpus(tmp_path: Path) -> Path:
    return simgpu.create_devices(tmp_path / "gpus", [24 * GiB, 12 * GiB], linger_s=0.1)


def gpu_section(gpus: Path) -> dict[str, str]:
    return {"probe": "simulated", "simulated_dir": str(gpus), "poll_interval": "0.1s"}


def on_devices(gpus: Path, pid: int) -> list[int]:
    """What the process holds on each simulated device."""
    return [reading.processes.get(pid, 0) for reading in SimulatedGpuProbe(str(gpus)).read()]


def ask(client: openai.OpenAI, model: str) -> str:
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    return reply.choices[0].message.content or ""


def test_models_are_placed_per_device_split_when_none_holds_them_and_shown_per_device(
        start_steward: StewardFactory, gpus: Path) -> None:
    steward = start_steward({"big": fake_model("20GiB", gpu_dir=gpus), "small": fake_model("8GiB", gpu_dir=gpus),
                             "huge": fake_model("30GiB", gpu_dir=gpus)}, gpu=gpu_section(gpus))
    client = openai.OpenAI(base_url=steward.base_url, api_key="none", max_retries=0)
    ask(client, "big")
    ask(client, "small")  # device 0 has 4 GiB left: device 1, nothing evicted
    assert steward.wait_event("spawn", engine="big")["devices"] == "0"
    assert steward.wait_event("spawn", engine="small")["devices"] == "1"
    assert steward.events("evict") == []
    assert on_devices(gpus, steward.engine_pid("big")) == [20 * GiB, 0]
    assert on_devices(gpus, steward.engine_pid("small")) == [0, 8 * GiB]
    devices = steward.health()["devices"]
    assert [(d["device"], d["budget"], d["reserved"]) for d in devices] == [("gpu0", 24 * GiB, 20 * GiB),
                                                                             ("gpu1", 12 * GiB, 8 * GiB)]
    assert steward.health()["engines"]["small"]["devices"] == ["gpu1"]
    metrics = httpx.get(f"{steward.url}/metrics").text
    assert re.search(r'steward_device_reserved_bytes\{device="gpu1"\} 8\.589934592e\+09', metrics)
    assert re.search(r'steward_device_free_bytes\{device="gpu0"\} 4\.294967296e\+09', metrics)
    # No single device holds 30 GiB: split 20 + 10 over both (in proportion to their budgets),
    # each device's engine evicted for its share.
    ask(client, "huge")
    assert sorted(e["engine"] for e in steward.events("evict")) == ["big", "small"]
    spawn = steward.wait_event("spawn", engine="huge")
    assert spawn["devices"] == "0,1"
    assert spawn["argv"][-4:] == ["--split-mode", "layer", "--tensor-split", "20480,10240"]
    assert on_devices(gpus, spawn["pid"]) == [20 * GiB, 10 * GiB]
    load = steward.wait_event("load", engine="huge")
    assert load["devices"] == [0, 1] and load["per_device"] == [20 * GiB, 10 * GiB]


def test_eviction_on_one_device_leaves_the_other_devices_engines_serving(
        start_steward: StewardFactory, tmp_path: Path) -> None:
    gpus = simgpu.create_devices(tmp_path / "two", [16 * GiB, 8 * GiB], linger_s=0.1)
    steward = start_steward({"a": fake_model("12GiB", gpu_dir=gpus), "b": fake_model("6GiB", gpu_dir=gpus),
                             "c": fake_model("10GiB", gpu_dir=gpus)}, gpu=gpu_section(gpus))
    client = openai.OpenAI(base_url=steward.base_url, api_key="none", max_retries=0)
    ask(client, "a")
    ask(client, "b")
    ask(client, "a")  # b is the least recently used now
    ask(client, "c")  # fits only device 0: a goes, b (on device 1) stays
    assert [e["engine"] for e in steward.events("evict")] == ["a"]
    assert steward.wait_event("spawn", engine="c")["devices"] == "0"
    engines = steward.health()["engines"]
    assert engines["b"]["status"] == "ready" and engines["b"]["devices"] == ["gpu1"]
    wait_until(lambda: on_devices(gpus, steward.engine_pid("c")) == [10 * GiB, 0])


def test_a_pinned_device_and_steward_check_show_memory_per_device(
        start_steward: StewardFactory, gpus: Path, tmp_path: Path) -> None:
    steward = start_steward({"chat": fake_model("4GiB", gpu_dir=gpus, devices=[1])},
                            gpu={**gpu_section(gpus), "devices": {1: {"budget": "10GiB"}}})
    client = openai.OpenAI(base_url=steward.base_url, api_key="none", max_retries=0)
    ask(client, "chat")
    assert steward.wait_event("spawn", engine="chat")["devices"] == "1"
    assert [d["budget"] for d in steward.health()["devices"]] == [24 * GiB, 10 * GiB]
    check = subprocess.run([sys.executable, "-m", "supervisor.cli", "check", str(steward.events_path.parent /
                            "config.yaml")], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    assert "budget   34.0 GiB over 2 devices" in check.stdout
    assert "  device 0  24.0 GiB (25769803776 bytes) from gpu0 total (Simulated GPU 0)" in check.stdout
    assert "  device 1  10.0 GiB (10737418240 bytes) from gpu.devices.1.budget" in check.stdout
    assert "  devices  1\n" in check.stdout
