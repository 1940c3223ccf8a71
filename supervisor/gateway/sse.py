"""Server-sent events as the gateway reads them on their way to a client: where an event
ends, and what data it carries."""

from __future__ import annotations

import re

# An event ends at a blank line; engines write LF, a proxy in between may write CRLF.
EVENT_END = re.compile(rb"\r?\n\r?\n")


def event_data(event: bytes) -> bytes | None:
    """The data of one event (without its blank line): its ``data:`` lines joined, as the
    standard says; None for an event without data (a comment, a ping)."""
    lines = [line[5:].removeprefix(b" ") for line in event.splitlines() if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None
