"""Where each line of an engine's output goes. Every line is kept in the engine's own ring
(observe/engine_logs.py: ``steward logs NAME``) and counted (``steward_engine_output_lines``);
the event log gets an ``engine_output`` event only for a line that looks like a warning or an
error (``worth_logging``): one event a line buried every other event under a chatty engine.

The lines its access log writes for steward's own polls (a health check, the ``GET /metrics``
read every second, Ollama's ``GET /api/ps``) are counted (``steward_engine_poll_lines``), not
kept at all. A poll that failed (not 2xx) is kept as any line.

The access-log formats read: uvicorn's (vLLM, SGLang), ``INFO:     127.0.0.1:40312 - "GET
/metrics HTTP/1.1" 200 OK``; gin's (Ollama), ``[GIN] 2025/01/01 - 10:00:00 | 200 |
1.2ms | 127.0.0.1 | GET      "/api/ps"``; llama-server's with ``--verbose``, ``srv
log_server_r: request: GET /health 127.0.0.1 200``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection

from supervisor.observe.events import EventLog

# A word that engines' logs use for trouble (llama.cpp's "error:", vLLM's "ERROR"/"WARNING",
# Ollama's "level=WARN", a Python traceback, CUDA's "out of memory"), as a word, in any case.
_TROUBLE = re.compile(r"\b(?:error|errors|warn|warning|fatal|panic|critical|exception|traceback|"
                      r"failed|failure|out of memory|oom|segmentation fault|killed)\b", re.IGNORECASE)

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


def worth_logging(line: str) -> bool:
    """Whether a line of an engine's output belongs in the event log too: it says trouble."""
    return _TROUBLE.search(line) is not None


def output_to_events(events: EventLog, engine: str, poll_paths: Collection[str]) -> Callable[[str], None]:
    """What to do with each line of *engine*'s output: kept in its ring and counted (and an
    ``engine_output`` event if it says trouble), or only counted if it logs one of steward's polls."""

    def on_line(line: str) -> None:
        path = own_poll_path(line, poll_paths)
        if path is not None:
            events.count("engine_poll_line", engine=engine, path=path)
            return
        events.engine_logs.add(engine, line)
        events.count("engine_output_line", engine=engine)
        if worth_logging(line):
            events.emit("engine_output", "debug", engine=engine, line=line)

    return on_line
