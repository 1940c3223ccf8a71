"""Server-sent events as the gateway reads them on their way to a client: where an event
ends, what data it carries, and the whole events of a stream that comes in pieces."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from supervisor.gateway.relay.answer import NOTHING_HELD, AnswerHead, Passed

# An event ends at a blank line; engines write LF, a proxy in between may write CRLF.
EVENT_END = re.compile(rb"\r?\n\r?\n")
_EVENT_NAME = re.compile(rb"^event:[ \t]*([^\r\n]*?)[ \t]*\r?$", re.MULTILINE)
# An event begun but not ended is held up to this; past it, it goes as it comes (engines write
# whole events: what is held is seldom anything, at most the one event cut across two pieces).
MAX_EVENT_BYTES = 32 * 2**20


def event_data(event: bytes) -> bytes | None:
    """The data of one event (without its blank line): its ``data:`` lines joined, as the
    standard says; None for an event without data (a comment, a ping)."""
    lines = [line[5:].removeprefix(b" ") for line in event.splitlines() if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def event_name(event: bytes) -> bytes | None:
    """The name of one event (its ``event:`` line), or None for an unnamed one (a ``message``)."""
    named = _EVENT_NAME.search(event)
    return named.group(1) if named is not None else None


def json_events(stream: bytes, word: bytes) -> Iterator[dict[str, Any]]:
    """The JSON objects carried by the whole events of *stream* whose data holds *word*, in order
    (an event not yet ended, without data, or whose data is no JSON object is passed over)."""
    *whole, _rest = EVENT_END.split(stream)
    for event in whole:
        data = event_data(event)
        if data is None or word not in data:
            continue
        try:
            value = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            continue
        if isinstance(value, dict):
            yield value


def json_object(data: bytes) -> dict[str, Any] | None:
    """*data* parsed, if it is a JSON object."""
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def json_bytes(value: Any) -> bytes | None:
    """*value* as compact JSON, its text as it came (UTF-8); None if it cannot be written."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:  # a lone surrogate, escaped in what came: escaped again
        return json.dumps(value, separators=(",", ":")).encode()
    except (ValueError, RecursionError):
        return None


def with_data(event: bytes, data: bytes) -> bytes:
    """*event* (its lines, without its blank line) carrying *data* in place of its ``data:`` lines."""
    lines, placed = [], False
    for line in event.split(b"\n"):
        if not line.startswith(b"data:"):
            lines.append(line)
        elif not placed:
            lines.append(b"data: " + data + (b"\r" if line.endswith(b"\r") else b""))
            placed = True
    return b"\n".join(lines)


def after_last_event(data: bytes) -> int:
    """Where the last whole event of *data* ends (after its blank line, LF or CRLF); 0: none has."""
    lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)


def each_event(whole: bytes, rewrite: Callable[[bytes], bytes | None]) -> bytes:
    """*whole* (whole events) with each event as *rewrite* returns it (without its blank line):
    None keeps it as it came, an empty one drops it and its blank line."""
    out, start = [], 0
    for end in [*EVENT_END.finditer(whole), None]:
        event = whole[start:end.start()] if end is not None else whole[start:]
        separator = end.group() if end is not None else b""
        start = end.end() if end is not None else len(whole)
        if not event and not separator:
            continue
        rewritten = rewrite(event)
        if rewritten is None:
            out += (event, separator)
        elif rewritten:
            out += (rewritten, separator)
    return b"".join(out)


@attrs.define(eq=False)
class WholeEvents:
    """A stream's pieces cut at its events' ends: what ends in whole events goes on, the start of
    an event whose end is still to come is held. At the stream's end, or past *limit* bytes, what
    is held goes as it came (an unfinished event is no event)."""

    limit: int = MAX_EVENT_BYTES
    _held: list[bytes] = attrs.Factory(list)
    _held_bytes: int = 0
    _held_end: bytes = b""  # the last 3 bytes held: an event's end may begin there

    def whole(self, chunk: bytes, more: bool) -> bytes:
        """What of the stream up to *chunk* ends in whole events (all of it, at its end)."""
        if self._held and more and not EVENT_END.search(self._held_end + chunk):
            self._hold(chunk)  # still inside one event: not looked at again for each piece of it
            return self._take() if self._held_bytes > self.limit else b""
        data = self._take() + chunk if self._held else chunk
        end = len(data) if not more else after_last_event(data)
        if len(data) - end > self.limit:
            end = len(data)
        if end < len(data):
            self._hold(data[end:])
        return data[:end] if end < len(data) else data

    def _hold(self, piece: bytes) -> None:
        self._held.append(piece)
        self._held_bytes += len(piece)
        self._held_end = (self._held_end + piece)[-3:]

    def _take(self) -> bytes:
        held = b"".join(self._held)
        self._held.clear()
        self._held_bytes, self._held_end = 0, b""
        return held


@attrs.define(eq=False)
class EventsRewritten:
    """A reader (answer.py): a 200 event stream of no announced length (its length may change), each
    whole event as *rewrite* returns it (``each_event``). With *only_with*, a piece of whole events
    that does not hold those bytes goes as it came, not split. Only the start of an event whose end
    is still to come is held (``WholeEvents``)."""

    rewrite: Callable[[bytes], bytes | None]
    only_with: bytes | None = None
    reading: bool = False
    _events: WholeEvents = attrs.Factory(WholeEvents)

    def start(self, head: AnswerHead) -> AnswerHead:
        self.reading = head.event_stream and not head.length_declared
        return head

    def body(self, chunk: bytes, more: bool) -> Passed:
        if not self.reading:
            return None, chunk
        whole = self._events.whole(chunk, more)
        if self.only_with is not None and self.only_with not in whole:
            return None, whole
        return None, each_event(whole, self.rewrite)

    def end(self) -> Passed:
        return NOTHING_HELD
