"""Child processes: own process group, die with steward, pipes always drained.

Stop is SIGTERM to the whole group, a grace period, then SIGKILL. PR_SET_PDEATHSIG
makes the kernel kill a child when steward dies, even by SIGKILL, when no cleanup
code of ours can run.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence

import trio

_PR_SET_PDEATHSIG = 1
# Loaded before any fork: the child must not dlopen between fork and exec.
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent(parent_pid: int) -> None:
    """Runs in the child between fork and exec."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)  # the parent died before prctl took effect


async def open_child(argv: Sequence[str], env: Mapping[str, str] | None = None) -> trio.Process:
    """Spawn *argv* in a new session; its stdout and stderr arrive merged on ``stdout``."""
    merged_env = {**os.environ, **(env or {})}
    return await trio.lowlevel.open_process(
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, env=merged_env, preexec_fn=functools.partial(_die_with_parent, os.getpid()))


async def stop_child(process: trio.Process, grace: float) -> int:
    """SIGTERM the group, wait up to *grace*, then SIGKILL. Returns the exit status."""
    _signal_group(process, signal.SIGTERM)
    with trio.move_on_after(grace):
        await process.wait()
    if process.returncode is None:
        _signal_group(process, signal.SIGKILL)
        await process.wait()
    # The leader is gone; anything it left in its group goes too.
    _signal_group(process, signal.SIGKILL)
    return process.returncode


def _signal_group(process: trio.Process, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


async def pump_lines(stream: trio.abc.ReceiveStream, on_line: Callable[[str], None]) -> None:
    """Read *stream* to its end, calling *on_line* for each line (a full pipe would stall the child)."""
    pending = b""
    while True:
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            on_line(line.decode("utf-8", "replace").rstrip("\r"))
    if pending:
        on_line(pending.decode("utf-8", "replace"))


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"
