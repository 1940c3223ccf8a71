"""A real vLLM server (CPU build, fakes/vllm_env.py) started bare, for tests that ask it directly.

    require_vllm_python()                # fails (or skips with STEWARD_SKIP_VLLM=1) when missing
    with running_vllm(write_tiny_model(), "tiny", log=tmp / "vllm.log") as (process, base_url):
        ...

vLLM keeps its memory in child processes (the engine core), so the server runs in its own
process group and is stopped group-wide. A server outlives the tests of a module-scoped
fixture: while it runs its processes are in long_lived_pids(), which conftest's per-test
leak check leaves alone (the check at the end of the session does not).

This module imports nothing from tests.conftest, so conftest can import it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
import pytest

from fakes.vllm_env import vllm_python
from supervisor.engines.process_tree import stat_fields

# A start takes about a minute on a quiet 2-core machine (real_runtimes.md); a CI machine
# shared with other jobs can take several times that.
START_TIMEOUT_S = 600.0
# SIGTERM to the group stops it in about 1 s; past this grace what is left gets SIGKILL.
STOP_GRACE_S = 20.0
# The engine's model context; the tiny model's is 512 too.
MAX_MODEL_LEN = 512

# Root pids of the servers running now (see long_lived_pids).
_running: set[int] = set()


def require_vllm_python() -> Path:
    """vllm_python(), or the test fails with how to install it (skips only with STEWARD_SKIP_VLLM=1)."""
    try:
        return vllm_python()
    except FileNotFoundError as exc:
        if os.environ.get("STEWARD_SKIP_VLLM") == "1":
            pytest.skip(f"STEWARD_SKIP_VLLM=1: {exc}")
        pytest.fail(str(exc), pytrace=False)


def vllm_command(model_dir: Path, port: int, name: str, *, extra: Sequence[str] = ()) -> list[str]:
    """The argv of an OpenAI-compatible vLLM server on 127.0.0.1:*port* serving *model_dir* as *name*.

    `vllm serve` of the venv (it needs the `vllm` metadata shim deploy/install-vllm.sh adds);
    `python -m vllm.entrypoints.openai.api_server` starts as fast but warns that it is
    deprecated. Eager mode: no graph capture or compilation. At most 4 sequences run at
    once, so a 5th concurrent request waits (vllm:num_requests_waiting).
    """
    return [str(vllm_python().parent / "vllm"), "serve", str(model_dir),
            "--host", "127.0.0.1", "--port", str(port), "--served-model-name", name,
            "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32", "--enforce-eager",
            "--max-num-seqs", "4", "--disable-uvicorn-access-log", *extra]


def vllm_env() -> dict[str, str]:
    """This environment plus what a test server needs: offline, 1 GiB of KV cache, no usage reports."""
    env = {**os.environ,
           "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; by default a share of the host's memory
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           # /sleep, /wake_up and /is_sleeping exist only in dev mode (404 otherwise).
           "VLLM_SERVER_DEV_MODE": "1",
           # "auto" pins the worker to one core and keeps the other for the rest; on a
           # machine shared with the test suite (and other jobs) the scheduler does better.
           "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    # Unset, vLLM loads with every CPU it may use and serves with one thread; a value set
    # here would hold for serving too (its threads spin between steps). Starts measured
    # the same (40-45 s) with 1, 2 or unset on 2 cores.
    env.pop("OMP_NUM_THREADS", None)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def long_lived_pids() -> set[int]:
    """Every live process of the vLLM servers running now (their process groups)."""
    return {pid for root in _running for pid in _live_members(root)}


@contextmanager
def running_vllm(model_dir: Path, name: str, *, log: Path, extra: Sequence[str] = (),
                 port: int | None = None) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """Start vLLM (its output into *log*), yield (process, base URL) once /health is 200.

    On exit the whole process group gets SIGTERM, then SIGKILL after STOP_GRACE_S, and this
    returns only when no process of the group is left.
    """
    port = free_port() if port is None else port
    base_url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        process = subprocess.Popen(vllm_command(model_dir, port, name, extra=extra), env=vllm_env(),
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    _running.add(process.pid)
    try:
        wait_healthy(process, base_url, log)
        yield process, base_url
    finally:
        stop_group(process)
        _running.discard(process.pid)


def wait_healthy(process: subprocess.Popen[bytes], base_url: str, log: Path) -> float:
    """Poll /health until 200; the seconds it took. AssertionError with the log's tail if it dies or hangs."""
    started = time.monotonic()
    while True:
        if process.poll() is not None:
            raise AssertionError(f"vLLM exited with {process.returncode} while starting:\n{_tail(log)}")
        if time.monotonic() - started > START_TIMEOUT_S:
            raise AssertionError(f"vLLM not healthy within {START_TIMEOUT_S:.0f} s:\n{_tail(log)}")
        try:
            if httpx.get(f"{base_url}/health", timeout=2.0).status_code == 200:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        time.sleep(0.5)


def stop_group(process: subprocess.Popen[bytes], grace: float = STOP_GRACE_S) -> None:
    """SIGTERM to the process group *process* leads, SIGKILL after *grace*; returns when none of it is left."""
    pgid = process.pid
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _live_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    while _live_members(pgid):
        _signal_group(pgid, signal.SIGKILL)
        time.sleep(0.05)
    process.wait()


def group_members(pgid: int) -> list[tuple[int, str, int]]:
    """(pid, state, parent pid) of each process in process group *pgid*, zombies included."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        if (stat := stat_fields(int(entry))) is not None and int(stat[2]) == pgid:
            members.append((int(entry), stat[0], int(stat[1])))
    return members


def _live_members(pgid: int) -> list[int]:
    """The group's live processes; reaps its zombies that are this process's children (re-parented
    here, as pytest is a subreaper), except the leader, which Popen reaps."""
    live = []
    for pid, state, parent in group_members(pgid):
        if state not in ("Z", "X"):
            live.append(pid)
        elif parent == os.getpid() and pid != pgid:
            with suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
    return live


def _signal_group(pgid: int, signum: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(pgid, signum)


def _tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
