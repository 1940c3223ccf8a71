"""Each engine's own output, kept per engine: its last lines, for ``steward logs NAME`` and
top's log pane (``GET /admin/engines/NAME/logs``), and told to whoever follows it.

An engine's stdout/stderr once went to the event log, one ``engine_output`` event a line: a
chatty engine (a vLLM's progress bars, a llama-server's per-slot lines) buried every other
event. Its lines are kept here instead; the event log keeps only those that look like
warnings or errors (observe/engine_output.py).

One ``EngineLogs`` holds every engine's ring, written and read only from steward's trio thread
(the engines' output pumps append; the admin routes read and follow), so no lock: each call
runs to its end. Memory is bounded per engine, by lines and by bytes, whichever comes first.
Engine output is untrusted: a line is cut at ``LINE_CHARS`` and its control characters (an
ANSI escape that would repaint the reader's terminal, a carriage return) are written as escapes.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

import attrs

from supervisor.safe_text import recordable

MAX_LINES = 2000
MAX_BYTES = 1 << 20  # per engine
LINE_CHARS = 4096  # of one line, the rest cut (a minified JSON dump, a progress bar without newlines)
_CUT_MARK = "…"
# Every C0 and C1 control but the tab, as its escape (ESC included: no colour nor cursor moves).
_CONTROLS = {code: f"\\x{code:02x}" for code in (*range(0x09), *range(0x0a, 0x20), *range(0x7f, 0xa0))}


def safe_line(text: str) -> str:
    """*text* as it may be shown and stored: cut, controls escaped, writable as UTF-8."""
    if len(text) > LINE_CHARS:
        text = text[:LINE_CHARS] + _CUT_MARK
    return recordable(text.translate(_CONTROLS))


@attrs.frozen
class OutputLine:
    seq: int  # the engine's line number since steward started (a follower sees what it missed)
    wall: float
    line: str
    size: int  # bytes as UTF-8, what the ring's bound counts

    def to_json(self) -> dict[str, object]:
        return {"seq": self.seq, "ts": round(self.wall, 6), "line": self.line}


@attrs.define(eq=False)
class OutputRing:
    """One engine's last lines: at most *max_lines*, and at most *max_bytes* of them (the
    newest line is always kept, whatever its size: a line is at most ``LINE_CHARS``)."""

    max_lines: int = MAX_LINES
    max_bytes: int = MAX_BYTES
    lines: collections.deque[OutputLine] = attrs.Factory(collections.deque)
    size: int = 0  # bytes held
    count: int = 0  # lines ever added

    def add(self, text: str, wall: float) -> OutputLine:
        line = safe_line(text)
        self.count += 1
        kept = OutputLine(self.count, wall, line, len(line.encode("utf-8")))
        self.lines.append(kept)
        self.size += kept.size
        while len(self.lines) > self.max_lines or (self.size > self.max_bytes and len(self.lines) > 1):
            self.size -= self.lines.popleft().size
        return kept

    def last(self, count: int) -> list[OutputLine]:
        if count <= 0:
            return []
        return list(self.lines)[-count:]


Follower = Callable[[OutputLine], None]


@attrs.define(eq=False)
class EngineLogs:
    """Every engine's ``OutputRing``, by engine name, and who follows each."""

    max_lines: int = MAX_LINES
    max_bytes: int = MAX_BYTES
    rings: dict[str, OutputRing] = attrs.Factory(dict)
    followers: dict[str, list[Follower]] = attrs.Factory(dict)

    def add(self, engine: str, text: str) -> None:
        ring = self.rings.get(engine)
        if ring is None:
            ring = self.rings[engine] = OutputRing(self.max_lines, self.max_bytes)
        line = ring.add(text, time.time())
        followers = self.followers.get(engine, [])
        for follower in list(followers):
            try:
                follower(line)
            except Exception:  # noqa: BLE001 - a reader's bug must not stop the engine's output pump
                followers.remove(follower)

    def last(self, engine: str, count: int) -> list[OutputLine]:
        ring = self.rings.get(engine)
        return [] if ring is None else ring.last(count)

    def followers_of(self, engine: str) -> list[Follower]:
        """The list to add a follower of *engine* to, and to remove it from when done (callers
        name only engines steward has: the list is one per engine, never per caller)."""
        return self.followers.setdefault(engine, [])
