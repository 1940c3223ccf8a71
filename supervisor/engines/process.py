"""Child processes: own process group, die with steward, pipes always drained.

Stop is SIGTERM to the whole group, a grace period, then SIGKILL. When the leader
exits, by itself or stopped, whatever it left in its group is killed too. When steward
dies, even by SIGKILL, when no cleanup code of ours can run, PR_SET_PDEATHSIG kills each
child and the reaper (supervisor/engines/reaper.py) its whole group: that reaches the real
server behind a wrapper that does not ``exec``.
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

from supervisor.observe.events import EventLog
from supervisor.engines.reaper import Reaper

_PR_SET_PDEATHSIG = 1
# Loaded before any fork: the child must not dlopen between fork and exec.
_libc = ctypes.CDLL(None, use_errno=True)
# One per steward process: it watches the group of every child that is not yet reaped.
_reaper = Reaper()


_PR_SET_CHILD_SUBREAPER = 36


def die_with_parent(parent_pid: int, signum: int = signal.SIGKILL, cpus: frozenset[int] | None = None) -> None:
    """Runs in the child between fork and exec (``preexec_fn``): *signum* when the parent dies;
    the child and what it execs run on *cpus* only, when given (models.NAME.cpus)."""
    _libc.prctl(_PR_SET_PDEATHSIG, signum)
    if os.getppid() != parent_pid:
        os._exit(1)  # the parent died before prctl took effect
    if cpus is not None:
        os.sched_setaffinity(0, cpus)  # an OSError here fails the spawn: a SpawnError


def become_subreaper() -> None:
    """Orphaned descendants of this process are re-parented to it, not to init."""
    _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1)


@attrs.define(eq=False)
class ChildProcess:
    """A child process with its merged stdout/stderr as a trio stream."""

    popen: subprocess.Popen[bytes]
    output: trio.lowlevel.FdStream
    # What went wrong with the reaper on this child's behalf (it died and was replaced,
    # it could not start): the child runs regardless. See take_reaper_warnings.
    _reaper_warnings: list[str] = attrs.field(factory=list, init=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self._reap()

    async def wait(self) -> int:
        """Wait for the exit; any number of tasks may wait at once."""
        while (returncode := self._reap()) is None:
            try:
                pidfd = os.pidfd_open(self.popen.pid)
            except ProcessLookupError:
                continue  # reaped by someone else: _reap() records it
            try:
                await trio.lowlevel.wait_readable(pidfd)
            finally:
                os.close(pidfd)
        return returncode

    def _reap(self) -> int | None:
        """Reap the leader once it has exited, killing the rest of its group and forgetting it first.

        Both happen while the leader is a zombie: its pid, the group's id, is still taken,
        so the signal and the reaper can only ever mean this group, never a later one.
        """
        if self.popen.returncode is None and _has_exited(self.pid):
            _kill_group(self.pid)
            self._note(_reaper.forget(self.pid))
            self.popen.poll()
        return self.popen.returncode

    def take_reaper_warnings(self) -> list[str]:
        """The reaper's troubles since the last call, for the caller to log: after spawning and at exit."""
        taken, self._reaper_warnings = self._reaper_warnings, []
        return taken

    def _note(self, reaper_warning: str | None) -> None:
        if reaper_warning is not None:
            self._reaper_warnings.append(reaper_warning)


def _has_exited(pid: int) -> bool:
    """Whether our child *pid* has exited; it is left unreaped (WNOWAIT)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True  # reaped already: poll() records its status


class SpawnError(Exception):
    """The child could not be started; the message says which program and why. One kind for
    every way a spawn fails, so that each caller makes it a failed start (an event, a backoff),
    never an exception that ends its task: the program is missing or not executable (OSError,
    an exec format error included), or its arguments or environment are ones exec cannot
    take (ValueError: a NUL byte, a lone surrogate, '=' in a name; TypeError: no string), or
    the child failed between fork and exec (SubprocessError)."""


def open_child(argv: Sequence[str], env: Mapping[str, str] | None = None, *,
               cpus: frozenset[int] | None = None) -> ChildProcess:
    """Spawn *argv* in a new session, on *cpus* only when given; its stdout and stderr arrive
    merged on ``output``. SpawnError if it cannot be started.

    Deliberately synchronous, in the trio thread: PR_SET_PDEATHSIG fires when the
    *thread* that forked the child exits, and trio.open_process forks in a worker
    thread that exits after ten idle seconds, which would kill a healthy engine.
    """
    if cpus is not None and not cpus & os.sched_getaffinity(0):  # else the child fails in preexec, unexplained
        raise SpawnError(f"cannot run {argv[0] if argv else '(no program)'!r}: none of the CPUs "
                         f"{sorted(cpus)} is one steward may run on ({sorted(os.sched_getaffinity(0))})")
    try:
        popen = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, **(env or {})},
            preexec_fn=functools.partial(die_with_parent, os.getpid(), cpus=cpus))
    except (OSError, ValueError, TypeError, subprocess.SubprocessError) as exc:
        program = argv[0] if argv else "(no program)"
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        raise SpawnError(f"cannot run {program!r}: {detail}") from exc
    assert popen.stdout is not None
    output = trio.lowlevel.FdStream(os.dup(popen.stdout.fileno()))
    popen.stdout.close()
    process = ChildProcess(popen, output)
    process._note(_reaper.watch(popen.pid))  # its own session: the group's id is its pid
    return process


async def stop_child(process: ChildProcess, grace: float) -> int:
    """SIGTERM the group, wait up to *grace*, then SIGKILL. Returns the exit status."""
    _signal_group(process, signal.SIGTERM)
    _signal_group(process, signal.SIGCONT)  # a frozen (SIGSTOPped) process acts on the SIGTERM only once resumed
    with trio.move_on_after(grace):
        await process.wait()
    if process.returncode is None:
        _signal_group(process, signal.SIGKILL)
    return await process.wait()  # which kills what the leader left in its group


def terminate_child(process: ChildProcess) -> None:
    """Ask the group to exit, without waiting (whoever waits on it sees the exit)."""
    _signal_group(process, signal.SIGTERM)
    _signal_group(process, signal.SIGCONT)


def _signal_group(process: ChildProcess, signum: int) -> None:
    if process.returncode is None:  # a reaped leader's id may be someone else's by now
        _kill_group(process.pid, signum)


def _kill_group(pgid: int, signum: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pgid, signum)
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


def report_reaper(process: ChildProcess, events: EventLog, name: str) -> None:
    """What went wrong with the reaper for this child (it was replaced, could not start)."""
    for warning in process.take_reaper_warnings():
        events.emit("reaper", "warning", engine=name, detail=warning)
