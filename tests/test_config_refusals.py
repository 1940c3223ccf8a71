"""A config `steward check` accepts is one `steward run` starts with, and what run refuses at start
check refuses too, in the same words (issue 26, defect 4).

Before: check said nothing of a usage log on a directory, on /dev/null, under /proc or in a
folder that does not exist, nor of an event log there, which run refused at start; it passed a
NUL byte in an engine's arguments, which ended run at the first request (500, and the process
gone); an engines.host that is no address of this machine did the same; a gpu.budget above the
probed device's total went unsaid. Now check opens what run opens, with run's own functions
(supervisor/dry_start.py), and leaves nothing behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from fakes import simgpu
from supervisor.units import parse_size
from tests.conftest import ROOT, descendants, free_port

pytestmark = pytest.mark.slow  # every test here runs `steward check` and `steward run` as real processes

MODEL = {"command": [sys.executable, "-m", "fakes.llama_server"], "memory": "1GiB"}


def config(tmp_path: Path, **sections: Any) -> str:
    raw = {"listen": f"127.0.0.1:{free_port()}", "models": {"chat": MODEL}, "gpu": {"probe": "none", "budget": "8GiB"},
           "log": {"file": None}, "usage": {"db": None}, "state_file": None, **sections}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def check(path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor.cli", "check", path], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


def run(path: str, tmp_path: Path) -> tuple[int | None, str]:
    """`steward run`'s exit status and stderr; None if it started listening instead (then it is stopped)."""
    stderr_path = tmp_path / "run-stderr.log"
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "run", path], stdin=subprocess.DEVNULL,
                                   stdout=stderr, stderr=stderr, cwd=ROOT)
    deadline = time.monotonic() + 60
    try:
        while process.poll() is None and time.monotonic() < deadline:
            if " listening " in stderr_path.read_text(errors="replace"):
                return None, stderr_path.read_text(errors="replace")
            time.sleep(0.05)
        return process.poll(), stderr_path.read_text(errors="replace")
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def refused_alike(path: str, tmp_path: Path, expected: str) -> None:
    """check and run exit 2 with the same line, which starts with *expected*."""
    checked = check(path)
    assert checked.returncode == 2, checked.stdout + checked.stderr
    lines = [line for line in checked.stderr.splitlines() if line.lstrip().startswith(("steward: " + expected,
                                                                                       expected))]
    assert len(lines) == 1, checked.stderr
    status, said = run(path, tmp_path)
    assert status == 2, said
    assert lines[0].lstrip().removeprefix("steward: ") in said, said
    for output in (checked.stderr, said):
        assert "Traceback" not in output
    assert not descendants()


@pytest.mark.parametrize(("key", "where", "why"), [
    ("usage", "{tmp}", "it is a directory"),
    ("usage", "/dev/null", ""),  # SQLite's words for it
    ("usage", "/proc/steward-usage.db", ""),
    ("usage", "{tmp}/missing/usage.db", "no folder '{tmp}/missing'"),
    ("log", "{tmp}", "Is a directory"),
    ("log", "/proc/steward-events.jsonl", "No such file or directory"),
    ("log", "{tmp}/missing/events.jsonl", "No such file or directory"),
])
def test_check_refuses_the_files_run_refuses_in_the_same_words(tmp_path: Path, key: str, where: str,
                                                               why: str) -> None:
    where, why = where.format(tmp=tmp_path), why.format(tmp=tmp_path)
    section = {"usage": {"db": where}} if key == "usage" else {"log": {"file": where}}
    setting = "usage.db" if key == "usage" else "log.file"
    refused_alike(config(tmp_path, **section), tmp_path, f"{setting}: cannot open {where!r}: {why}")


def test_a_nul_in_an_engines_arguments_is_refused_by_check_and_run(tmp_path: Path) -> None:
    path = config(tmp_path, models={"chat": {**MODEL, "args": ["--alias", "chat\0"]}})
    refused_alike(path, tmp_path, "models.chat.args[1]: must not contain a NUL character (an argument, a path or "
                                  "the environment cannot hold one), got 'chat\\x00'")


@pytest.mark.parametrize("where", ["/dev/null", "/dev/stderr", "{tmp}/pipe"])
def test_an_event_log_on_a_device_or_a_pipe_is_accepted(tmp_path: Path, where: str) -> None:
    """Only a regular file is rotated: a device or a named pipe is a log.file that works (events.py).
    check does not open a pipe (that waits for a reader)."""
    os.mkfifo(tmp_path / "pipe")
    checked = check(config(tmp_path, log={"file": where.format(tmp=tmp_path)}))
    assert checked.returncode == 0, checked.stderr


def test_check_leaves_no_file_behind(tmp_path: Path) -> None:
    path = config(tmp_path, log={"file": "events.jsonl"}, usage={"db": "usage.db"})
    before = sorted(os.listdir(tmp_path))
    assert check(path).returncode == 0
    assert sorted(os.listdir(tmp_path)) == before


def test_check_refuses_a_gpu_budget_above_the_devices_total(tmp_path: Path) -> None:
    gpu = simgpu.create_device(tmp_path / "gpu", total_bytes=parse_size("8GiB"))
    path = config(tmp_path, gpu={"probe": "simulated", "simulated_dir": str(gpu), "budget": "12GiB"})
    checked = check(path)
    assert checked.returncode == 2
    assert ("steward: gpu.budget: 12.0 GiB (12884901888 bytes) is more than gpu0 holds, 8.0 GiB (Simulated GPU); "
            "steward would plan with memory the device does not have\n") in checked.stderr
    path = config(tmp_path, gpu={"probe": "simulated", "simulated_dir": str(gpu), "budget": "8GiB"})
    assert check(path).returncode == 0  # all of it is fine


def test_check_refuses_an_engine_host_that_is_no_address_here(tmp_path: Path) -> None:
    """Run starts with it (an address may come up later, a LAN one at boot), and makes each start of an
    engine a failed start (spawn_failed, tests/test_spawn_errors.py); check, run by a person, says it."""
    checked = check(config(tmp_path, engines={"host": "192.0.2.1"}))  # TEST-NET-1: never a local address
    assert checked.returncode == 2
    assert ("steward: engines.host: steward cannot listen on 192.0.2.1 here (Cannot assign requested address): its "
            "engines are started on this machine, at this address\n") in checked.stderr


def test_run_refuses_a_gpu_budget_above_the_devices_total(tmp_path: Path) -> None:
    gpu = simgpu.create_device(tmp_path / "gpu", total_bytes=parse_size("8GiB"))
    refused_alike(config(tmp_path, gpu={"probe": "simulated", "simulated_dir": str(gpu), "budget": "12GiB"}),
                  tmp_path, "gpu.budget: 12.0 GiB (12884901888 bytes) is more than gpu0 holds, 8.0 GiB (Simulated "
                            "GPU); steward would plan with memory the device does not have")

