"""The event log: one JSON object per line in a file, a short human line on the terminal.

One task owns the file (``serve_event_log``); everyone else calls ``EventLog.emit``,
which never blocks, so a decision is never held up by a slow disk or terminal. Being the
only writer, that task also rotates the file by size (``FILE`` -> ``FILE.1`` -> ... ->
``FILE.KEEP``, the oldest dropped) between two lines, so no line is split or lost; a
rotation that fails is an event, and writing goes on in the current file.

The file and the terminal read the same events differently: the JSON keeps every value
exact (bytes, whole command lines); the terminal line is for a person in a tmux pane
(sizes in GiB, long values cut, one line per event, and a compact form for the busiest
events, ``request``). The schema of every record, and its version ``v``, are documented in
docs/events.md.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import shlex
import stat
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import attrs
import trio

from supervisor.observe.engine_logs import EngineLogs
from supervisor.safe_text import recordable
from supervisor.units import format_elapsed, format_size

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
# The "v" of every record: bumped when a field changes meaning or goes away (new fields come at any time).
SCHEMA_VERSION = 1
_BUFFER = 1 << 16
_REOPEN_CHECK_S = 1.0


class EventLogUnavailable(Exception):
    pass


# The keys every record has before its event's own fields.
RECORD_KEYS = frozenset({"ts", "time", "mono", "v", "event", "level"})


def iso_time(wall: float) -> str:
    """``2026-12-04T12:34:56.789Z``: a record's wall time as a person (and ``jq``, ``date -d``) reads it."""
    return datetime.datetime.fromtimestamp(wall, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@attrs.frozen
class Event:
    name: str
    level: str
    fields: dict[str, Any]
    wall: float
    mono: float

    def to_json(self) -> str:
        """One JSON line, whatever the fields hold: ASCII (a lone surrogate a client sent is
        written as its escape), and a value JSON cannot hold (a loop, a key that is no string)
        as its text rather than an event lost."""
        record = {"ts": round(self.wall, 6), "time": iso_time(self.wall), "mono": round(self.mono, 6),
                  "v": SCHEMA_VERSION, "event": self.name,
                  "level": self.level, **self.fields, **_size_texts(self.name, self.fields)}
        try:
            return json.dumps(record, separators=(",", ":"), default=str)
        except (TypeError, ValueError, RecursionError):
            return json.dumps({str(key): value if _dumps(value) else repr(value) for key, value in record.items()},
                              separators=(",", ":"), default=str)

    def to_line(self) -> str:
        """``HH:MM:SS LEVEL   event          details``, one line: the event's own compact form if it
        has one (``request``), else ``key=value`` with sizes readable and long values cut."""
        clock = time.strftime("%H:%M:%S", time.localtime(self.wall))
        shape = _LINE_SHAPES.get(self.name)
        if shape is not None:
            details = shape(self.fields)
        else:
            said = _said_twice(self.name, self.fields)
            details = " ".join(f"{key}={_terminal_value(self.name, key, value)}" for key, value in self.fields.items()
                               if key not in said)
        # A terminal takes UTF-8 only: a lone surrogate a client sent is shown as its escape.
        return recordable(f"{clock} {self.level.upper():<7} {self.name:<14} {details}".rstrip())


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
    # The engines' own output, kept beside the log rather than in it (observe/engine_output.py).
    engine_logs: EngineLogs = attrs.Factory(EngineLogs)
    _telling_failure: bool = False

    def emit(self, name: str, level: str = "info", **fields: Any) -> None:
        event = Event(name=name, level=level, fields=fields, wall=time.time(), mono=_now())
        for listener in self.listeners:
            try:
                listener(event)
            except Exception as exc:  # noqa: BLE001 - whoever emits (the scheduler actor) must not fail for it
                self._listener_failed(listener, event, exc)
        self.recent.append(event)
        if len(self.recent) > self.recent_max:
            del self.recent[: len(self.recent) - self.recent_max]
        try:
            self._send.send_nowait(event)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            # The writer has finished: shutdown's last words go to the terminal only.
            print(event.to_line(), file=sys.stderr)

    def count(self, name: str, **fields: Any) -> None:
        """Told to the listeners only (the metrics count it), never written nor kept in ``recent``:
        what steward causes itself every few seconds (its polls' lines in an engine's access log,
        a front door's polls of a node), which would bury the events worth reading."""
        event = Event(name=name, level="debug", fields=fields, wall=time.time(), mono=_now())
        for listener in self.listeners:
            try:
                listener(event)
            except Exception as exc:  # noqa: BLE001 - as in emit
                self._listener_failed(listener, event, exc)

    def close(self) -> None:
        self._send.close()

    def _listener_failed(self, listener: Callable[[Event], None], event: Event, exc: Exception) -> None:
        """A listener's bug is an ``internal_error`` event (once: not for the failures that telling it causes)."""
        if self._telling_failure:
            return
        self._telling_failure = True
        try:
            self.emit("internal_error", "error", source="event listener",
                      listener=getattr(listener, "__qualname__", repr(listener)), event=event.name,
                      error=f"{type(exc).__name__}: {exc}")
        finally:
            self._telling_failure = False


def _dumps(value: Any) -> bool:
    try:
        json.dumps(value, default=str)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def read_event_log(path: Path) -> list[dict[str, Any]]:
    """The records of an event log file, whole lines only (a running steward may be mid-line)."""
    text = path.read_text()
    return [json.loads(line) for line in text.splitlines()[:text.count("\n")] if line.strip()]


def _now() -> float:
    try:
        return trio.current_time()
    except RuntimeError:
        return time.monotonic()


# On the terminal only: the JSON keeps the exact bytes and the whole values.
_SIZE_FIELDS = frozenset({"memory", "reserved", "free", "need", "measured", "released", "budget", "estimate",
                          "nbytes", "outside", "per_device"})
# Where a field's name says the wrong thing: a count of jobs; bytes per device and buffer.
_SIZE_EXCEPTIONS = {("image_force_release", "released"): False, ("buffers", "devices"): True}
_ARGV_WIDTH = 100
_TEXT_WIDTH = 160
# Control characters (an engine's colours, a traceback's newlines) would break the one line or the pane.
_CONTROLS = ({code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7f, 0xa0))}
             | {9: "\\t", 10: "\\n", 13: "\\r"})


def _terminal_value(event: str, key: str, value: Any) -> str:
    if key == "argv" and isinstance(value, list) and all(isinstance(word, str) for word in value):
        return _cut(shlex.join(value).translate(_CONTROLS), _ARGV_WIDTH)
    return _cut(_render(value, sizes=_is_size(event, key)), _TEXT_WIDTH)


def _size_texts(event: str, fields: Mapping[str, Any]) -> dict[str, str]:
    """Beside each size in bytes, its words for a person reading the file: ``memory`` ->
    ``memory_text: "8.3 GiB"``, ``size_bytes`` -> ``size_text`` (never over a field of that name)."""
    return {name: _render(fields[key], sizes=True) for name, key in _size_text_names(event, fields).items()
            if name not in fields}


def _said_twice(event: str, fields: Mapping[str, Any]) -> set[str]:
    """The size words in *fields* that say just what their size says: a record read back
    (steward top draws /admin/events) reads on a terminal as it was sent, the words not said twice."""
    return {name for name, key in _size_text_names(event, fields).items()
            if fields.get(name) == _render(fields[key], sizes=True)}


def _size_text_names(event: str, fields: Mapping[str, Any]) -> dict[str, str]:
    """The name of each size's words -> the size's field."""
    return {f"{key.removesuffix('_bytes')}_text": key for key, value in fields.items()
            if value is not None and not isinstance(value, bool | str) and _is_size(event, key)}


def _is_size(event: str, key: str) -> bool:
    """Whether *event*'s field *key* holds bytes (an int, or ints in a list or mapping)."""
    return _SIZE_EXCEPTIONS.get((event, key), _is_size_field(key))


def _is_size_field(key: str) -> bool:
    return key in _SIZE_FIELDS or key.endswith("_bytes")


def _render(value: Any, *, sizes: bool) -> str:
    """*value* compact: sizes as GiB/MiB where *sizes* says the ints are bytes (and inside a
    mapping, where its keys say so); strings bare; JSON's words for the rest."""
    if sizes and isinstance(value, int) and not isinstance(value, bool):
        return format_size(value)
    if isinstance(value, str):
        return value.translate(_CONTROLS)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_render(k, sizes=False)}: {_render(v, sizes=sizes or _is_size_field(str(k)))}"
                               for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_render(item, sizes=sizes) for item in value) + "]"
    return json.dumps(value, default=str)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _request_line(fields: Mapping[str, Any]) -> str:
    """``interactive chat 200 queued 0.01s took 1.20s tokens 12+40 (key alice)``."""
    model = fields.get("model")
    parts = [fields.get("class"), model if model is not None else f"{fields.get('method')} {fields.get('route')}",
             fields.get("status"), fields.get("error")]
    for label, name in (("queued", "queued_s"), ("took", "duration_s")):
        seconds = fields.get(name)
        if isinstance(seconds, int | float):
            parts.append(f"{label} {seconds:.2f}s")
    prompt, completion = fields.get("prompt_tokens"), fields.get("completion_tokens")
    if prompt is not None or completion is not None:
        parts.append(f"tokens {'?' if prompt is None else prompt}+{'?' if completion is None else completion}")
    if fields.get("key") is not None:
        parts.append(f"(key {fields['key']})")
    # The model (an Ollama name) and the route are the client's words: no control characters get through.
    return _cut(" ".join(str(part) for part in parts if part is not None).translate(_CONTROLS), _TEXT_WIDTH)


def _load_line(fields: Mapping[str, Any]) -> str:
    """``gemma 8.3 GiB on gpu0: a background request waits for it (free 4.3 GiB)``."""
    where = f" on {fields['where']}" if fields.get("where") else ""
    why = fields.get("why") or fields.get("reason")
    free = fields.get("free")
    text = (f"{fields.get('engine')} {_size(fields.get('memory'))}{where}" + (f": {why}" if why else "")
            + (f" (free {_size(free)} after)" if free is not None else ""))
    return _cut(text.translate(_CONTROLS), _TEXT_WIDTH)


def _evict_line(fields: Mapping[str, Any]) -> str:
    """``gemma-e2b (2.8 GiB, idle 3.4s): to make room for gemma-e4b (needs 4.0 GiB, 1.5 GiB free)``."""
    busy = f"{fields['in_flight']} in flight" if fields.get("in_flight") else f"idle {_seconds(fields.get('idle_s'))}"
    hot = ", hot" if fields.get("hot") else ""
    why = fields.get("why") or f"for {fields.get('for_engine')}"
    return _cut(f"{fields.get('engine')} ({_size(fields.get('memory'))}, {busy}{hot}): {why}".translate(_CONTROLS),
                _TEXT_WIDTH)


def _ready_line(fields: Mapping[str, Any]) -> str:
    return f"{fields.get('engine')} after {_seconds(fields.get('load_s'))} at {fields.get('endpoint')}"


def _size(value: Any) -> str:
    return format_size(value) if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _seconds(value: Any) -> str:
    return format_elapsed(value) if isinstance(value, int | float) and not isinstance(value, bool) else str(value)


# Events that have a terminal form of their own; every other event reads key=value.
_LINE_SHAPES: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "request": _request_line, "load": _load_line, "wake": _load_line, "restart": _load_line, "evict": _evict_line,
    "ready": _ready_line}


def open_event_log(path: str | None, *, terminal_level: str = "info", terminal: IO[str] | None = None,
                   max_size: int = 0, keep: int = 5) -> tuple[EventLog, EventLogWriter]:
    """The senders' side and the writer of an event log. EventLogUnavailable if *path* cannot be opened.

    A line that would take the file past *max_size* bytes (0: no limit) goes to a fresh file,
    the full one becoming ``PATH.1``, of which *keep* are kept."""
    send, receive = trio.open_memory_channel[Event](math.inf)
    log = EventLog(send, terminal_level=LEVELS[terminal_level])
    terminal = terminal or sys.stderr
    try:
        sink = _LogFile.open(path, log, max_size=max_size, keep=keep) if path else None
    except OSError as exc:
        raise EventLogUnavailable(f"log.file: cannot open {path!r}: {exc.strerror or exc}") from None
    return log, EventLogWriter(receive, sink, terminal, log.terminal_level)


@attrs.define(eq=False)
class EventLogWriter:
    """The one task that writes the file. It may be restarted (supervise.py): what it needs
    outlives a run of ``serve``, and an event that made it fail is the only one lost."""

    receive: trio.MemoryReceiveChannel[Event]
    sink: _LogFile | None
    terminal: IO[str]
    terminal_level: int

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write events until the log is closed; everything sent before ``close`` is written."""
        task_status.started()
        with trio.CancelScope(shield=True):
            # Shielded: the writer outlives the cancellation of its siblings, so their
            # shutdown events still reach the file; it ends when the channel closes.
            async for event in self.receive:
                self._write(event)
                while True:
                    try:
                        event = self.receive.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                    self._write(event)
                if self.sink:
                    self.sink.flush()
                _flush_terminal(self.terminal)

    def _write(self, event: Event) -> None:
        _write(event, self.sink, self.terminal, self.terminal_level)

    def close(self) -> None:
        if self.sink:
            self.sink.close()


async def serve_event_log(path: str | None, *, terminal_level: str = "info", terminal: IO[str] | None = None,
                          max_size: int = 0, keep: int = 5,
                          task_status: trio.TaskStatus[EventLog] = trio.TASK_STATUS_IGNORED) -> None:
    """Open the log (``open_event_log``) and write events until it is closed, unsupervised."""
    log, writer = open_event_log(path, terminal_level=terminal_level, terminal=terminal, max_size=max_size,
                                 keep=keep)
    try:
        task_status.started(log)
        await writer.serve()
    finally:
        writer.close()


@attrs.define(eq=False)
class _LogFile:
    """The event log file. A write that fails (disk full, a file made read-only) is one event,
    ``log_write_failed`` (seen on the terminal, and by /healthz: degraded), and the lines are
    counted as lost until writing works again (``log_write_recovered``): losing log lines must
    never stop steward. Rotation happens between two lines, by this task alone."""

    path: str
    file: IO[str]
    events: EventLog  # where a rotation and a failure to write are told
    max_size: int  # 0: never rotated
    keep: int
    size: int  # bytes given to the file so far
    failure: str | None = None
    lost: int = 0
    rotation_failure: str | None = None  # told once per cause; rotation is tried again at the next line
    identity: tuple[int, int] | None = None  # (device, inode) of a regular file: noticed when it goes
    checked_at: float = -math.inf

    @classmethod
    def open(cls, path: str, events: EventLog, *, max_size: int, keep: int) -> _LogFile:
        file = _open_log(path)
        try:
            status = os.fstat(file.fileno())
        except OSError:
            file.close()
            raise
        # Only a regular file is rotated or opened again: log.file may be /dev/stderr or a named pipe.
        regular = stat.S_ISREG(status.st_mode)
        return cls(path, file, events, max_size if regular else 0, keep, status.st_size,
                   identity=(status.st_dev, status.st_ino) if regular else None, checked_at=time.monotonic())

    def write(self, line: str) -> None:
        if self.max_size and self.size and self.size + len(line) > self.max_size:
            self._rotate()
        try:
            self.file.write(line)
        except OSError as exc:
            self._failed(exc)
        else:
            self.size += len(line)  # the lines are JSON with ASCII escapes: one character, one byte

    def flush(self) -> None:
        try:
            self.file.flush()
        except OSError as exc:
            self._failed(exc)
            return
        if self.failure is not None:
            self.events.emit("log_write_recovered", "info", path=self.path, lost=self.lost)
            self.failure, self.lost = None, 0
        self._reopen_if_gone()

    def _reopen_if_gone(self) -> None:
        """A log file deleted or moved away under steward (by hand, by logrotate) is noticed, at
        most once a second, and opened afresh: lines written into a deleted file are lost to everyone."""
        now = time.monotonic()
        if self.identity is None or now < self.checked_at + _REOPEN_CHECK_S:
            return
        self.checked_at = now
        if _identity(self.path) == self.identity:
            return
        try:
            fresh = _open_log(self.path)
        except OSError as exc:
            self._failed(exc)
            return
        old, self.file, self.size = self.file, fresh, 0
        self.identity = _identity(self.path)
        with contextlib.suppress(OSError):
            old.close()
        self.events.emit("log_reopened", "warning", path=self.path,
                         detail="the event log file was deleted or moved away; a new one was opened")

    def close(self) -> None:
        try:
            self.file.close()
        except OSError as exc:
            self._failed(exc)

    def _rotate(self) -> None:
        """PATH becomes PATH.1 (PATH.1 becomes PATH.2, ..., PATH.KEEP is dropped) and PATH starts
        afresh. The buffer goes to the old file first, so each line is whole in one file."""
        self.flush()
        first = f"{self.path}.1"
        try:
            _make_room(self.path, self.keep)
            os.replace(self.path, first)
        except OSError as exc:
            self._rotation_failed(exc)
            return
        try:
            fresh = _open_log(self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.replace(first, self.path)  # back: the file still written keeps its name
            self._rotation_failed(exc)
            return
        full, self.file, self.size = self.file, fresh, 0
        self.identity = _identity(self.path)
        try:
            full.close()
        except OSError as exc:
            self._failed(exc)
        # Only a recovery is told: an event for every rotation would, with a tiny max_size, rotate again.
        if self.rotation_failure is not None:
            self.rotation_failure = None
            self.events.emit("log_rotate_recovered", "info", path=self.path)

    def _rotation_failed(self, exc: OSError) -> None:
        where = f"{exc.filename} -> {exc.filename2}" if exc.filename2 else exc.filename
        detail = f"{where}: {exc.strerror or exc}" if where else str(exc)
        if detail != self.rotation_failure:
            self.rotation_failure = detail
            self.events.emit("log_rotate_failed", "warning", path=self.path, detail=detail, size_bytes=self.size)

    def _failed(self, exc: OSError) -> None:
        self.lost += 1
        detail = exc.strerror or str(exc)
        if detail != self.failure:
            self.failure = detail
            self.events.emit("log_write_failed", "warning", path=self.path, detail=detail,
                             text=f"event log {self.path}: cannot write: {detail}; its events go to the terminal "
                                  f"only until it works again")


def _identity(path: str) -> tuple[int, int] | None:
    try:
        status = os.stat(path)
    except (OSError, ValueError):
        return None
    return status.st_dev, status.st_ino


def _open_log(path: str) -> IO[str]:
    return open(path, "a", buffering=_BUFFER)  # noqa: SIM115 (the writer closes it, or rotation does)


def _make_room(path: str, keep: int) -> None:
    """Free PATH.1: PATH.1 -> PATH.2 and so on, up to the first gap (PATH.KEEP is overwritten:
    the oldest goes). Stopping at a gap, a rotation tried again after a failure moves nothing twice.
    Files beyond KEEP (a run with a larger ``log.keep``) go too."""
    beyond = keep + 1
    while os.path.lexists(f"{path}.{beyond}"):
        os.remove(f"{path}.{beyond}")
        beyond += 1
    gap = next((n for n in range(1, keep) if not os.path.lexists(f"{path}.{n}")), keep)
    for n in range(gap, 1, -1):
        os.replace(f"{path}.{n - 1}", f"{path}.{n}")


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
