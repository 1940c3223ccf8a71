"""An engine's output in the event log: each line an ``engine_output`` event, but for the lines
its access log writes for steward's own polls (a health check, the ``GET /metrics`` read every
second, Ollama's ``GET /api/ps``), which would bury the rest: those are counted
(``steward_engine_poll_lines``), not logged. A poll that failed (not 2xx) is logged as any line.

The access-log formats read: uvicorn's (vLLM, SGLang), ``INFO:     127.0.0.1:40312 - "GET
/metrics HTTP/1.1" 200 OK``; gin's (Ollama), ``[GIN] 2025/01/01 - 10:00:00 | 200 |
1.2ms | 127.0.0.1 | GET      "/api/ps"``; llama-server's with ``--verbose``, ``srv
log_server_r: request: GET /health 127.0.0.1 200``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection

from supervisor.observe.events import EventLog

_ACCESS_LINES = (
    re.compile(r'^INFO:\s+\S+ - "GET (?P<path>[^ "?]+)\S* HTTP/[\d.]+" 2\d\d\b'),
    re.compile(r'^\[GIN\] [^|]*\|\s*2\d\d\s*\|[^|]*\|[^|]*\|\s*GET\s+"(?P<path>[^"?]+)[^"]*"\s*$'),
    re.compile(r'^srv\s+log_server_r: request: GET (?P<path>[^ ?]+)\S* \S+ 2\d\d\s*$'),
)


def own_poll_path(line: str, poll_paths: Collection[str]) -> str | None:
    """The path of a successful ``GET`` of one of *poll_paths* that *line* logs, else None."""
    for pattern in _ACCESS_LINES:
        match = pattern.match(line)
        if match is not None:
            return match["path"] if match["path"] in poll_paths else None
    return None


def output_to_events(events: EventLog, engine: str, poll_paths: Collection[str]) -> Callable[[str], None]:
    """What to do with each line of *engine*'s output: an ``engine_output`` event, or a count."""

    def on_line(line: str) -> None:
        path = own_poll_path(line, poll_paths)
        if path is None:
            events.emit("engine_output", "debug", engine=engine, line=line)
        else:
            events.count("engine_poll_line", engine=engine, path=path)

    return on_line
