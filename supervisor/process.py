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

import attrs
import trio

_PR_SET_PDEATHSIG = 1
# Loaded before any fork: the child must not dlopen between fork and exec.
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent(parent_pid: int) -> None:
    """Runs in the child between fork and exec."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)  # the parent died before prctl took effect


@attrs.define(eq=False)
class ChildProcess:
    """A child process with its merged stdout/stderr as a trio stream."""

    popen: subprocess.Popen[bytes]
    output: trio.lowlevel.FdStream

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    async def wait(self) -> int:
        """Wait for the exit; any number of tasks may wait at once."""
        while self.popen.poll() is None:
            try:
                pidfd = os.pidfd_open(self.popen.pid)
            except ProcessLookupError:
                continue  # exited and not yet reaped by us: poll() reaps it
            try:
                await trio.lowlevel.wait_readable(pidfd)
            finally:
                os.close(pidfd)
        return self.popen.returncode


def open_child(argv: Sequence[str], env: Mapping[str, str] | None = None) -> ChildProcess:
    """Spawn *argv* in a new session; its stdout and stderr arrive merged on ``output``.

    Deliberately synchronous, in the trio thread: PR_SET_PDEATHSIG fires when the
    *thread* that forked the child exits, and trio.open_process forks in a worker
    thread that exits after ten idle seconds, which would kill a healthy engine.
    """
    popen = subprocess.Popen(
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, env={**os.environ, **(env or {})},
        preexec_fn=functools.partial(_die_with_parent, os.getpid()))
    assert popen.stdout is not None
    output = trio.lowlevel.FdStream(os.dup(popen.stdout.fileno()))
    popen.stdout.close()
    return ChildProcess(popen, output)


async def stop_child(process: ChildProcess, grace: float) -> int:
    """SIGTERM the group, wait up to *grace*, then SIGKILL. Returns the exit status."""
    _signal_group(process, signal.SIGTERM)
    with trio.move_on_after(grace):
        await process.wait()
    if process.returncode is None:
        _signal_group(process, signal.SIGKILL)
        await process.wait()
    # The leader is gone; anything it left in its group goes too.
    _signal_group(process, signal.SIGKILL)
    assert process.returncode is not None
    return process.returncode


def _signal_group(process: ChildProcess, signum: int) -> None:
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
