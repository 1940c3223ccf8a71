"""Shared fixtures: a real steward process with fake engines, and a leak check.

pytest makes itself a child subreaper, so a process orphaned by a killed steward is
re-parented here, and the per-test leak check sees every descendant that outlived
its test.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import yaml

from fakes import simgpu
from supervisor.tools import chaos
from supervisor.engines.process import become_subreaper
from tests.vllm_server import long_lived_pids

ROOT = Path(__file__).resolve().parent.parent
become_subreaper()


def descendants(pid: int | None = None) -> list[tuple[int, str]]:
    """Live (non-zombie) descendants of *pid* (default: this process), with their command lines."""
    return chaos.descendants(os.getpid() if pid is None else pid)


# Roots of process trees that outlive single tests on purpose: a server started once for a
# whole test module (vLLM takes a minute to start). The per-test leak check spares them and
# what they started; the module's own teardown must leave nothing, which the session's
# last check sees.
MODULE_SCOPED: set[int] = set()


def spared() -> set[int]:
    """The processes of the module-scoped trees (and the vLLM servers' process groups)."""
    pids = set(long_lived_pids())
    for root in MODULE_SCOPED:
        pids.add(root)
        pids.update(pid for pid, _ in descendants(root))
    return pids


def kill_leftovers(grace: float = 5.0, *, spare: Callable[[], set[int]] = set) -> list[tuple[int, str]]:
    """Give this process's descendants *grace* seconds to go, SIGKILL the rest; those that were left."""
    deadline = time.monotonic() + grace
    while (left := [d for d in descendants() if d[0] not in spare()]) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


@pytest.fixture(autouse=True)
def no_leaked_children() -> Iterator[None]:
    yield
    left = kill_leftovers(spare=spared)
    assert not left, f"processes outlived the test: {left}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds; always reaped."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait()


def fake_model(memory: str = "1GiB", *, parallel: int = 2, load_time: str = "0.2s", tps: float = 200,
               gpu_dir: Path | None = None, extra: list[str] | None = None, **config: Any) -> dict[str, Any]:
    """A model entry whose engine is the fake llama-server."""
    args = ["--memory", memory, "--load-time", load_time, "--tokens-per-second", str(tps), *(extra or [])]
    if gpu_dir is not None:
        args += ["--sim-gpu", str(gpu_dir)]
    return {"command": [sys.executable, "-m", "fakes.llama_server"], "memory": memory, "parallel": parallel,
            "args": args, **config}


class EventTail:
    """The records of a running steward's event log, read as they are appended.

    Each look reads only the bytes written since the last one (whole lines; a line steward is
    still writing waits for the next look), so a test that waits for an event pays for the new
    lines, not for the whole log every 20 ms. The tail holds the file open (its inode cannot be
    reused while held) and starts over from the first line when the path names another file (a
    rotation, a log deleted and created again) or the file shrank, so it always answers what
    ``read_event_log`` would: the records of the current file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._records: list[dict[str, Any]] = []
        self._partial = b""
        self._read = 0  # bytes of the file read so far (whole lines and the partial one)
        self.generation = 0  # counts the starts over: a reader's index into records() is void after one

    def records(self) -> list[dict[str, Any]]:
        """Every whole record of the current file, in order (the same list, grown, between starts over)."""
        now = os.stat(self.path)  # FileNotFoundError, as read_event_log, when there is no log
        if self._fd is None or not os.path.samestat(os.fstat(self._fd), now) or now.st_size < self._read:
            self.close()
            self._fd = os.open(self.path, os.O_RDONLY)
            self._records, self._partial, self._read = [], b"", 0
            self.generation += 1
        while chunk := os.read(self._fd, 1 << 20):
            self._read += len(chunk)
            lines = (self._partial + chunk).split(b"\n")
            self._partial = lines.pop()
            self._records.extend(json.loads(line) for line in lines if line.strip())
        return self._records

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@attrs.define
class RunningSteward:
    process: subprocess.Popen[bytes]
    url: str
    events_path: Path
    stderr_path: Path
    tail: EventTail = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.tail = EventTail(self.events_path)

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The current log file's records (named *name*): copies, which a test may change freely."""
        return [dict(r) for r in self.tail.records() if name is None or r["event"] == name]

    def wait_event(self, name: str, timeout: float = 10.0, **match: Any) -> dict[str, Any]:
        """The first record of the current log named *name* whose fields equal *match*, waiting
        up to *timeout* seconds for it; each look checks only the records new since the last."""
        deadline = time.monotonic() + timeout
        checked, generation = 0, self.tail.generation
        while time.monotonic() < deadline:
            records = self.tail.records()
            if self.tail.generation != generation:
                checked, generation = 0, self.tail.generation
            for record in records[checked:]:
                if record["event"] == name and all(record.get(k) == v for k, v in match.items()):
                    return dict(record)
            checked = len(records)
            time.sleep(0.02)
        raise AssertionError(f"no {name!r} event matching {match} within {timeout}s; "
                             f"log tail: {[e['event'] for e in self.events()[-15:]]}")

    def health(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/healthz", timeout=5).json()

    def engine_endpoint(self, engine: str) -> str:
        return [e for e in self.events("ready") if e["engine"] == engine][-1]["endpoint"]

    def engine_pid(self, engine: str) -> int:
        return [e for e in self.events("spawn") if e["engine"] == engine][-1]["pid"]

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        finally:
            self.tail.close()  # a later look opens the finished log again


StewardFactory = Callable[..., RunningSteward]


@pytest.fixture
def start_steward(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[StewardFactory]:
    """Start ``steward run`` on a config built from keyword sections; stopped after the test."""
    if request.node.get_closest_marker("slow") is None:
        pytest.fail("this test starts steward: mark it slow (the fast tier, -m 'not slow', starts no process)",
                    pytrace=False)
    started: list[RunningSteward] = []

    def start(models: dict[str, Any], **sections: Any) -> RunningSteward:
        run_dir = tmp_path / f"steward{len(started)}"
        run_dir.mkdir()
        return launch_steward(run_dir, models, started, **sections)

    yield start
    for steward in started:
        steward.stop()


def launch_steward(run_dir: Path, models: dict[str, Any], registry: list[RunningSteward],
                   **sections: Any) -> RunningSteward:
    events_path = run_dir / "events.jsonl"
    config = {"listen": f"127.0.0.1:{free_port()}", "models": models,
              "log": {"file": str(events_path), "terminal": "debug"},
              "engines": {"stop_grace": "3s", "restart_backoff": "0.2s"},
              "state_file": str(run_dir / "state.json"), **sections}
    config_path = run_dir / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    stderr_path = run_dir / "stderr.log"
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "run", str(config_path)],
                                   stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr, cwd=ROOT)
    steward = RunningSteward(process, f"http://{config['listen']}", events_path, stderr_path)
    registry.append(steward)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"steward exited {process.returncode}: {stderr_path.read_text()[-2000:]}")
        if events_path.exists() and steward.events("listening"):
            return steward
        time.sleep(0.02)
    raise AssertionError(f"steward did not start: {stderr_path.read_text()[-2000:]}")


@pytest.fixture
def sim_gpu(tmp_path: Path) -> Callable[[str], Path]:
    def make(total: str) -> Path:
        from supervisor.units import parse_size

        return simgpu.create_device(tmp_path / "gpu", total_bytes=parse_size(total), linger_s=0.2)

    return make


# What outlived the session of each pytest-xdist worker, as the workers report it (controller only).
LEFT_IN_WORKERS: list[str] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No child process may survive the suite, whichever test (or fixture) started it.

    Under pytest-xdist each worker checks its own descendants and hands what it found to the
    controller (a worker's exit status does not reach it), which fails the run.
    """
    left = [f"{pid} {cmd}" for pid, cmd in kill_leftovers()]
    workeroutput = getattr(session.config, "workeroutput", None)
    if left and workeroutput is not None:
        workeroutput["leftovers"] = left
    left += LEFT_IN_WORKERS
    if left:
        print(f"\nprocesses outlived the test suite (killed now): {left}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """pytest-xdist (controller): a worker finished; keep what outlived its session."""
    LEFT_IN_WORKERS.extend(f"[{node.gateway.id}] {line}"
                           for line in getattr(node, "workeroutput", {}).get("leftovers", []))

