"""The event log: one JSON object per line in a file, a short human line on the terminal.

One task owns the file (``serve_event_log``); everyone else calls ``EventLog.emit``,
which never blocks, so a decision is never held up by a slow disk or terminal.
The schema of every record is documented in docs/events.md.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import attrs
import trio

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


class EventLogUnavailable(Exception):
    pass


@attrs.frozen
class Event:
    name: str
    level: str
    fields: dict[str, Any]
    wall: float
    mono: float

    def to_json(self) -> str:
        record = {"ts": round(self.wall, 6), "mono": round(self.mono, 6), "event": self.name,
                  "level": self.level, **self.fields}
        return json.dumps(record, separators=(",", ":"), default=str)

    def to_line(self) -> str:
        clock = time.strftime("%H:%M:%S", time.localtime(self.wall))
        details = " ".join(f"{key}={_short(value)}" for key, value in self.fields.items())
        return f"{clock} {self.level.upper():<7} {self.name:<14} {details}".rstrip()


@attrs.define(eq=False)
class EventLog:
    """The senders' side. ``emit`` is synchronous and never blocks."""

    _send: trio.MemorySendChannel[Event]
    terminal_level: int = LEVELS["info"]
    # Handy in tests and for /healthz: the last few events, newest last.
    recent: list[Event] = attrs.Factory(list)
    recent_max: int = 200
    # Called with every event as it is emitted (metrics are counted from the events).
    listeners: list[Callable[[Event], None]] = attrs.Factory(list)

    def emit(self, name: str, level: str = "info", **fields: Any) -> None:
        event = Event(name=name, level=level, fields=fields, wall=time.time(), mono=_now())
        for listener in self.listeners:
            listener(event)
        self.recent.append(event)
        if len(self.recent) > self.recent_max:
            del self.recent[: len(self.recent) - self.recent_max]
        try:
            self._send.send_nowait(event)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            # The writer has finished: shutdown's last words go to the terminal only.
            print(event.to_line(), file=sys.stderr)

    def close(self) -> None:
        self._send.close()


def read_event_log(path: Path) -> list[dict[str, Any]]:
    """The records of an event log file, whole lines only (a running steward may be mid-line)."""
    text = path.read_text()
    return [json.loads(line) for line in text.splitlines()[:text.count("\n")] if line.strip()]


def _now() -> float:
    try:
        return trio.current_time()
    except RuntimeError:
        return time.monotonic()


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


async def serve_event_log(path: str | None, *, terminal_level: str = "info", terminal: IO[str] | None = None,
                          task_status: trio.TaskStatus[EventLog] = trio.TASK_STATUS_IGNORED) -> None:
    """Write events until the log is closed; everything sent before ``close`` is written."""
    send, receive = trio.open_memory_channel[Event](math.inf)
    log = EventLog(send, terminal_level=LEVELS[terminal_level])
    terminal = terminal or sys.stderr
    try:
        sink = _LogFile(path, open(path, "a", buffering=1 << 16), terminal) if path else None  # noqa: SIM115
    except OSError as exc:
        raise EventLogUnavailable(f"log.file: cannot open {path!r}: {exc.strerror or exc}") from None
    try:
        task_status.started(log)
        with trio.CancelScope(shield=True):
            # Shielded: the writer outlives the cancellation of its siblings, so their
            # shutdown events still reach the file; it ends when the channel closes.
            async for event in receive:
                _write(event, sink, terminal, log.terminal_level)
                while True:
                    try:
                        event = receive.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                    _write(event, sink, terminal, log.terminal_level)
                if sink:
                    sink.flush()
                _flush_terminal(terminal)
    finally:
        if sink:
            sink.close()


@attrs.define(eq=False)
class _LogFile:
    """The event log file. A write that fails (disk full, a file made read-only) is said once on
    the terminal and the lines are counted as lost until writing works again: losing log lines
    must never stop steward."""

    path: str
    file: IO[str]
    terminal: IO[str]
    failure: str | None = None
    lost: int = 0

    def write(self, line: str) -> None:
        try:
            self.file.write(line)
        except OSError as exc:
            self._failed(exc)

    def flush(self) -> None:
        try:
            self.file.flush()
        except OSError as exc:
            self._failed(exc)
            return
        if self.failure is not None:
            self._say(f"steward: event log {self.path}: writing again ({self.lost} events were lost)")
            self.failure, self.lost = None, 0

    def close(self) -> None:
        try:
            self.file.close()
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        self.lost += 1
        detail = exc.strerror or str(exc)
        if detail != self.failure:
            self.failure = detail
            self._say(f"steward: event log {self.path}: cannot write: {detail}; its events go to the terminal "
                      f"only until it works again")

    def _say(self, text: str) -> None:
        try:
            self.terminal.write(text + "\n")
        except (OSError, ValueError):
            pass


def _write(event: Event, sink: _LogFile | None, terminal: IO[str], terminal_level: int) -> None:
    if sink:
        sink.write(event.to_json() + "\n")
    if LEVELS[event.level] >= terminal_level or (sink is not None and sink.failure is not None
                                                 and LEVELS[event.level] >= LEVELS["info"]):
        try:
            terminal.write(event.to_line() + "\n")
        except (OSError, ValueError):
            pass  # the terminal went away (its pane closed): the log file still has it


def _flush_terminal(terminal: IO[str]) -> None:
    try:
        terminal.flush()
    except (OSError, ValueError):
        pass
