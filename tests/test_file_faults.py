"""Files steward cannot write are warnings, never a stop, and their messages name the file.

Before: at the first memory measurement an unwritable state file stopped steward with exit
1 and "cannot listen on 127.0.0.1:PORT: Permission denied".
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from fakes import simgpu
from fakes.tiny_gguf import write_tiny_model
from supervisor.units import parse_size
from tests.conftest import ROOT, StewardFactory, fake_model, free_port, stop_process
from tests.fake_processes import wait_until

pytestmark = pytest.mark.slow  # every test here starts steward as a real process

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_a_state_file_steward_cannot_write_is_a_warning_and_steward_goes_on(start_steward: StewardFactory,
                                                                             tmp_path: Path) -> None:
    gpu = simgpu.create_device(tmp_path / "gpu", total_bytes=parse_size("8GiB"), linger_s=0.05)
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the state file's folder should be")
    model = fake_model("1GiB", gpu_dir=gpu)
    del model["memory"]  # estimated from the file's header, then measured: the measurement is written
    model["model"] = str(write_tiny_model(tmp_path / "tiny.gguf", "llama").path)
    steward = start_steward({"chat": model}, state_file=str(blocker / "state.json"),
                            gpu={"probe": "simulated", "simulated_dir": str(gpu), "poll_interval": "0.1s"})
    assert httpx.post(f"{steward.base_url}/chat/completions", json=CHAT, timeout=30).status_code == 200
    failed = steward.wait_event("state_write_failed", timeout=30)
    assert str(blocker / "state.json") in failed["detail"] and "Not a directory" in failed["detail"]
    assert steward.process.poll() is None
    assert httpx.post(f"{steward.base_url}/chat/completions", json=CHAT, timeout=30).status_code == 200
    assert steward.stop() == 0


def test_an_event_log_that_cannot_be_written_is_said_on_the_terminal_and_steward_goes_on(tmp_path: Path) -> None:
    port = free_port()
    config = {"listen": f"127.0.0.1:{port}", "models": {"chat": fake_model("1GiB")},
              "log": {"file": "/dev/full", "terminal": "info"}, "state_file": None,
              "gpu": {"probe": "none", "budget": "4GiB"}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    stderr = tmp_path / "stderr.log"
    with open(stderr, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "run", str(path)], cwd=ROOT,
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        wait_until(lambda: _answers(f"http://127.0.0.1:{port}/healthz", process), timeout=30)
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=CHAT, timeout=30)
        assert answer.status_code == 200
        text = stderr.read_text()
        assert "event log /dev/full: cannot write: No space left on device" in text
        assert "listening" in text  # its events went to the terminal instead
        assert process.poll() is None
    finally:
        stop_process(process)
    assert process.returncode == 0


def _answers(url: str, process: subprocess.Popen[bytes]) -> bool:
    assert process.poll() is None, "steward exited"
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.TransportError:
        return False
