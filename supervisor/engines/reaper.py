"""The reaper: a tiny process that SIGKILLs steward's process groups when steward dies.

PR_SET_PDEATHSIG only reaches steward's direct children; an engine started through a
wrapper that does not ``exec`` (``sh -c "llama-server ...; echo bye"``) has the real
server one level down, and it would outlive a SIGKILL of steward. So steward keeps
the write end of a pipe to the reaper's stdin and sends one line per change:
``+PGID`` (watch that group) and ``-PGID`` (forget it). When the pipe reaches EOF,
which happens however steward ends, the reaper SIGKILLs every group it still
watches and exits.

Both ends live here. This file is also the reaper's program, run as
``python -I -S reaper.py``, so it may import nothing outside the standard library.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

# Reapers let go (pipe closed) but not yet reaped, by any Reaper: each is reaped once it
# has exited, at a later call, so that none is left a zombie or waited for.
_exiting: list[subprocess.Popen[bytes]] = []


def reaper_argv() -> list[str]:
    """How to start the reaper: isolated and without site, so it starts in a few milliseconds."""
    return [sys.executable, "-I", "-S", os.path.abspath(__file__)]


def main() -> None:
    # Ctrl-C in a terminal reaches the whole foreground group; steward's orderly
    # shutdown stays in charge, so only EOF (or SIGKILL) ends the reaper.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    watched: set[int] = set()
    for line in sys.stdin.buffer:
        _apply(watched, line)
    for pgid in watched:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass  # the group is empty already


def _apply(watched: set[int], line: bytes) -> None:
    try:
        pgid = int(line[1:])
    except ValueError:
        return
    if pgid <= 1:
        return  # 0 would name the reaper's own group
    if line.startswith(b"+"):
        watched.add(pgid)
    elif line.startswith(b"-"):
        watched.discard(pgid)


class Reaper:
    """Steward's end: tells the reaper which groups to watch, and keeps one running while any are.

    The reaper starts with the first watched group and is let go (its pipe closed, so it
    exits) when the last is forgotten. A reaper found dead, or no longer reading, is
    replaced and told the whole watched set again. No method blocks or raises: each
    returns a warning for the caller to log when the reaper needed attention, else None.
    """

    # A plain class, not attrs: this module runs without site-packages (see above).
    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._pipe: int | None = None  # the write end of the reaper's stdin; non-blocking
        self._watched: set[int] = set()  # every group to watch; a new reaper is told all of them

    @property
    def pid(self) -> int | None:
        """The running reaper's; None while none runs (no group watched, or it could not start)."""
        return None if self._process is None else self._process.pid

    def watch(self, pgid: int) -> str | None:
        self._watched.add(pgid)
        return self._send(f"+{pgid}\n")

    def forget(self, pgid: int) -> str | None:
        if pgid not in self._watched:
            return None
        self._watched.discard(pgid)
        if self._watched:
            return self._send(f"-{pgid}\n")
        return self._let_go_after(f"-{pgid}\n")

    def _send(self, line: str) -> str | None:
        _reap_exited()
        if self._process is None:
            return self._start()  # a fresh reaper is told the whole set, this line included
        if (trouble := self._tell(line)) is not None:
            return self._replace(trouble)
        return None

    def _let_go_after(self, line: str) -> str | None:
        """Tell the reaper its last *line*, then let it go: nothing is left to watch."""
        # Told before EOF, or at EOF it would kill a group whose id may soon be someone else's.
        trouble = None if self._process is None else self._tell(line)
        if trouble is not None:
            assert self._process is not None
            self._process.kill()  # it must not read EOF while it still watches that group
        self._let_go()
        return trouble

    def _tell(self, line: str) -> str | None:
        """Write *line* to the running reaper; returns why it could not be told, else None."""
        assert self._process is not None and self._pipe is not None
        if (status := self._process.poll()) is not None:
            return f"the reaper (pid {self._process.pid}) had {_describe(status)}"
        try:
            os.write(self._pipe, line.encode())  # a line this short is written whole or not at all
        except BlockingIOError:
            return f"the reaper (pid {self._process.pid}) stopped reading, so it was killed"
        except OSError as exc:  # EPIPE: it exited since the poll above
            return f"the reaper (pid {self._process.pid}) could not be told: {exc}"
        return None

    def _replace(self, trouble: str) -> str:
        assert self._process is not None
        # Killed before its pipe is closed: an old reaper reading EOF would kill
        # groups that the new one now watches, live engines among them.
        self._process.kill()
        self._let_go()
        failed_start = self._start()
        return f"{trouble}; {failed_start or f'a new one (pid {self.pid}) watches {len(self._watched)} groups'}"

    def _start(self) -> str | None:
        read_end, write_end = os.pipe()
        try:
            self._process = subprocess.Popen(
                reaper_argv(), stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                cwd="/", start_new_session=True)  # out of the terminal's group, and no fd of ours held
        except OSError as exc:
            os.close(write_end)
            return f"cannot start the reaper, so engines' children may outlive a killed steward: {exc}"
        finally:
            os.close(read_end)
        os.set_blocking(write_end, False)
        self._pipe = write_end
        try:
            # A new pipe holds 64 KiB, thousands of groups: the whole set goes in at once.
            os.write(write_end, "".join(f"+{pgid}\n" for pgid in sorted(self._watched)).encode())
        except OSError as exc:  # it died at once; the next call finds it dead and replaces it
            return f"the new reaper (pid {self._process.pid}) could not be told: {exc}"
        return None

    def _let_go(self) -> None:
        if self._process is not None:
            _exiting.append(self._process)
        if self._pipe is not None:
            os.close(self._pipe)  # EOF: the reaper kills what it still watches, then exits
        self._process = self._pipe = None


def _reap_exited() -> None:
    _exiting[:] = [process for process in _exiting if process.poll() is None]


def _describe(status: int) -> str:
    if status < 0:
        try:
            return f"been killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"been killed by signal {-status}"
    return f"exited with status {status}"


if __name__ == "__main__":
    main()
