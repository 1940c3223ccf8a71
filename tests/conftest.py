"""Shared fixtures: a real steward process with fake engines, and a leak check.

pytest makes itself a child subreaper, so a process orphaned by a killed steward is
re-parented here, and the per-test leak check sees every descendant that outlived
its test.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
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
    """Live (non-zombie) descendants of *pid* (default: this process), with their command lines;
    the forkserver, part of the test harness, is none of them (it keeps no child of its own: what
    it forks is this process's child)."""
    return [d for d in chaos.descendants(os.getpid() if pid is None else pid) if d[0] != FORKSERVER.pid]


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


def stop_process(proc: subprocess.Popen[bytes] | ForkedProcess, grace: float = 5.0) -> None:
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


class ForkedProcess:
    """What the tests use of subprocess.Popen, for a process that this one adopted rather than
    spawned: forked by tests/forkserver.py and re-parented here (a subreaper).
    Only this process reaps it, so its pid is not reused while `returncode` is None."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid, self.args = pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)  # -N for a signal, as Popen's
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is None:
            if timeout is not None:
                pidfd = os.pidfd_open(self.pid)  # readable once it has exited
                try:
                    if not select.select([pidfd], [], [], timeout)[0]:
                        raise subprocess.TimeoutExpired(self.args, timeout)
                finally:
                    os.close(pidfd)
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Forkserver:
    """tests/forkserver.py, started on the first process this one asks it for, ended with the
    session: ``steward run`` without its half second of imports per start, a fake without its fifth."""

    def __init__(self) -> None:
        self._server: subprocess.Popen[bytes] | None = None
        self._log: Path | None = None

    @property
    def pid(self) -> int | None:
        return None if self._server is None else self._server.pid

    def start(self, module: str, args: list[str], *, output: Path) -> ForkedProcess:
        """``python -m MODULE ARGS`` in ROOT with this environment, stdin from /dev/null, its output into *output*."""
        if self._server is None or self._server.poll() is not None:
            self.stop()
            fd, log = tempfile.mkstemp(prefix="steward-tests-forkserver-", suffix=".log")
            self._log = Path(log)
            self._server = subprocess.Popen([sys.executable, "-m", "tests.forkserver"], cwd=ROOT,
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=fd)
            os.close(fd)
        assert self._server.stdin is not None and self._server.stdout is not None
        request = {"module": module, "args": args, "cwd": str(ROOT), "env": dict(os.environ), "output": str(output)}
        try:
            self._server.stdin.write(json.dumps(request).encode() + b"\n")
            self._server.stdin.flush()
            reply = self._server.stdout.readline()
        except BrokenPipeError:
            reply = b""
        if not reply:
            assert self._log is not None
            raise AssertionError(f"the forkserver ended: {self._log.read_text()[-2000:]}")
        return ForkedProcess(json.loads(reply)["pid"], [sys.executable, "-m", module, *args])

    def stop(self) -> None:
        if self._server is not None:
            assert self._server.stdin is not None and self._server.stdout is not None
            self._server.stdin.close()  # EOF: it ends
            try:
                self._server.wait(10)
            except subprocess.TimeoutExpired:
                self._server.kill()
                self._server.wait()
            self._server.stdout.close()
            self._server = None
        if self._log is not None:
            self._log.unlink(missing_ok=True)
            self._log = None


FORKSERVER = Forkserver()


def wait_usage_rows(db: Path, count: int, timeout: float = 10.0,
                    where: Callable[[dict[str, Any]], bool] = lambda row: True) -> list[dict[str, Any]]:
    """The usage log's rows (in arrival order) once it holds *count* rows *where* holds for:
    steward writes them every ``usage.flush_interval``, not as each request ends."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(sqlite3.OperationalError), contextlib.closing(sqlite3.connect(db)) as connection:
            connection.row_factory = sqlite3.Row
            rows = [dict(row) for row in connection.execute("SELECT * FROM requests ORDER BY ts")]
            if sum(1 for row in rows if where(row)) >= count:
                return rows
        assert time.monotonic() < deadline, f"{count} usage rows in {db}"
        time.sleep(0.05)


@attrs.define
class RunningSteward:
    process: subprocess.Popen[bytes] | ForkedProcess
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

    @property
    def usage_db(self) -> Path:
        """The usage log where a config that names none keeps it: beside the event log."""
        return self.events_path.parent / "steward-usage.db"

    def engine_lines(self, engine: str) -> list[str]:
        """What *engine* printed, as steward keeps it (``GET /admin/engines/NAME/logs``, no key)."""
        answer = httpx.get(f"{self.url}/admin/engines/{engine}/logs", params={"lines": 2000}, timeout=5)
        answer.raise_for_status()
        return [line["line"] for line in answer.json()["lines"]]

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
    process = FORKSERVER.start("supervisor.cli", ["run", str(config_path)], output=stderr_path)
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


# The real ComfyUI while the modules that share it run, one after the other (ONE_WORKER_FIRST,
# below): started by the first test that asks, stopped once the next test is none of theirs, so no
# other test sees it (a test's "every process gone" would count it).
REAL_COMFYUI_MODULES = ("test_real_comfyui.py", "test_real_videos.py")
_real_comfyui: dict[str, Any] = {}


@pytest.fixture
def comfy_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The real ComfyUI (tests/test_real_comfyui.py's ``Comfy``), shared by REAL_COMFYUI_MODULES, so
    its start (~15 s of both cores) is paid once where they run together."""
    if "comfy" not in _real_comfyui:
        from tests.test_real_comfyui import comfy_process
        running = comfy_process(tmp_path_factory)
        _real_comfyui["comfy"] = next(running)
        _real_comfyui["running"] = running
    return _real_comfyui["comfy"]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if "running" in _real_comfyui and (nextitem is None or nextitem.path.name not in REAL_COMFYUI_MODULES):
        running = _real_comfyui.pop("running")
        _real_comfyui.clear()
        running.close()  # its `finally`: ComfyUI stopped


@pytest.fixture
def comfy(comfy_server: Any) -> Iterator[Any]:
    """The real ComfyUI, idle at the start and at the end of each test (the fake ComfyUI's modules
    have a `comfy` of their own, which wins there)."""
    comfy_server.settle()
    yield comfy_server
    comfy_server.settle()


# Under pytest-xdist (`--dist loadfile`): these modules run one after the other on one worker,
# first. Each has a long fixed cost that loads both cores (a real ComfyUI or vLLM started for the
# module) or measures speeds that a neighbour loading both cores would change (the load tests);
# beside each other they would slow and skew one another. Started last, any of them would keep
# a worker busy long after the other ran out of work.
ONE_WORKER_FIRST = ("test_loadtest.py", "test_loadtest_real.py", "test_real_vllm_supervised.py", "test_real_vllm.py",
                    "test_real_comfyui.py", "test_real_videos.py")  # the last two share one ComfyUI


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker sorts alike: xdist checks they collected the same
        rank = {name: i for i, name in enumerate(ONE_WORKER_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist (controller): `--dist loadfile`, except that ONE_WORKER_FIRST is one unit of work."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "one worker" if Path(module).name in ONE_WORKER_FIRST else module

    return Scheduling(config, log)


# What outlived the session of each pytest-xdist worker, as the workers report it (controller only).
LEFT_IN_WORKERS: list[str] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No child process may survive the suite, whichever test (or fixture) started it.

    Under pytest-xdist each worker checks its own descendants and hands what it found to the
    controller (a worker's exit status does not reach it), which fails the run.
    """
    FORKSERVER.stop()
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

