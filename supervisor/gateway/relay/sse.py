"""Server-sent events as the gateway reads them on their way to a client: where an event
ends, and what data it carries."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

# An event ends at a blank line; engines write LF, a proxy in between may write CRLF.
EVENT_END = re.compile(rb"\r?\n\r?\n")
_EVENT_NAME = re.compile(rb"^event:[ \t]*([^\r\n]*?)[ \t]*\r?$", re.MULTILINE)


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
