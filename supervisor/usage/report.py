"""What the usage log says: requests per key, model, class, status, listener or route.

``read_usage`` selects only the columns a report needs, over an index range of ``ts``, from
a database a running steward may be writing (read-only; WAL lets both go on). The numbers
are computed in Python by ``summarize`` (SQLite has no percentiles), and a report is
printed as a table (``format_report``) or as one JSON object (``report_json``).

Rejected requests are rows like any other: a key turned away by its rate limit shows
as a high rejected share, not as silence. Speech requests (``/v1/audio/speech``) add the
characters they sent and the seconds of audio they got: two more columns in the table where
the report has any (other reports keep their columns), and in the JSON always.
"""

from __future__ import annotations

import contextlib
import enum
import math
import re
import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import attrs

from supervisor.observe.slowdown import format_factor
from supervisor.units import parse_duration, show
from supervisor.usage.row import TABLE

# What the client got when steward turned it away: no key, a key not allowed, too large,
# rate limited or timed out waiting, queue full or no capacity.
REJECTED = frozenset({401, 403, 408, 413, 429, 503})
_DAYS = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*d\s*$", re.IGNORECASE)


class Grouping(enum.StrEnum):
    """What a report has one line for; each is the name of its column."""

    KEY = "key"
    MODEL = "model"
    CLASS = "class"
    STATUS = "status"
    LISTENER = "listener"
    ROUTE = "route"


class UsageReadError(Exception):
    """The usage log cannot be read (there is none, it is no usage log); the message says why, naming the file."""


@attrs.frozen
class GroupUsage:
    group: str | int | None  # the column's value; None: a request without one (no key, rejected before a model)
    requests: int
    rejected: int
    waited: int  # queued_s > 0
    wait_p50_s: float | None  # over the requests that were queued (queued_s not null)
    wait_p95_s: float | None
    ttft_p50_s: float | None
    prompt_tokens: int
    completion_tokens: int
    slowdown_p50: float | None = None  # over the answers whose slowdown is known (supervisor/observe/slowdown.py)
    slowdown_p95: float | None = None
    gpu_s: float = 0.0  # seconds of engine slots and whole-GPU jobs held, added up
    speech: int = 0  # speech requests (their rows carry input_chars)
    input_chars: int = 0  # the characters of their input, added up
    audio_s: float = 0.0  # the seconds of audio they were sent, where measured, added up
    audio_unmeasured: int = 0  # answered 200 with audio steward could not measure (a FLAC that says no length)

    @property
    def rejected_share(self) -> float:
        return self.rejected / self.requests if self.requests else 0.0

    @property
    def waited_share(self) -> float:
        return self.waited / self.requests if self.requests else 0.0


@attrs.frozen
class UsageReport:
    path: str
    by: Grouping
    since_s: float
    now: float
    groups: tuple[GroupUsage, ...]  # most requests first
    total: GroupUsage


# One selected row: (group, status, queued_s, ttft_s, prompt_tokens, completion_tokens, slowdown, gpu_s,
# input_chars, audio_s).
Row = tuple[Any, ...]
_NEWER = ("slowdown", "gpu_s", "input_chars", "audio_s")  # columns a log an older steward wrote may lack


def parse_since(text: str) -> float:
    """``30m``, ``24h``, ``7d`` -> seconds: the durations config files take, and days."""
    try:
        seconds = float(match.group(1)) * 86400.0 if (match := _DAYS.match(text)) else parse_duration(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds):
        raise ValueError(f"must be a duration like 30m, 24h or 7d, got {show(text)}")
    return seconds


def read_usage(path: str, *, by: Grouping, since_s: float, now: float) -> UsageReport:
    """The report over the requests that arrived at or after ``now - since_s``."""
    return summarize(path, _select(path, by, now - since_s), by=by, since_s=since_s, now=now)


def _select(path: str, by: Grouping, start: float) -> list[Row]:
    with read_only(path) as connection:
        if connection is None:
            return []  # an empty file: a database nobody wrote yet
        # A log an older steward wrote (and no steward since opened) lacks the newer columns.
        columns = table_columns(connection)
        newer = ", ".join(name if name in columns else "NULL" for name in _NEWER)
        return connection.execute(
            f'SELECT "{by.value}", status, queued_s, ttft_s, prompt_tokens, completion_tokens, {newer} '
            f"FROM {TABLE} WHERE ts >= ?", (start,)).fetchall()


def table_columns(connection: sqlite3.Connection) -> set[str]:
    return {info[1] for info in connection.execute(f"PRAGMA table_info({TABLE})")}


@contextlib.contextmanager
def read_only(path: str) -> Iterator[sqlite3.Connection | None]:
    """The usage log at *path*, opened read-only (a reader never creates or changes the database a
    running steward writes); None for an empty database. SQLite's errors inside the ``with``
    become UsageReadError, naming the file."""
    where = Path(path)
    if not where.exists():
        raise UsageReadError(f"no usage log at {path}")
    if where.is_dir():
        raise UsageReadError(f"{path} is a directory, not a usage log")
    try:
        connection = sqlite3.connect(f"file:{quote(str(where.resolve()))}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise UsageReadError(f"cannot open {path}: {exc}") from None
    try:
        tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if TABLE not in tables and tables:
            raise UsageReadError(f"{path} is a SQLite database but not a usage log (no table {TABLE!r})")
        yield connection if TABLE in tables else None
    except sqlite3.OperationalError as exc:  # it is a database: a lock, an I/O error, a folder it cannot write
        raise UsageReadError(f"cannot read {path}: {exc}") from None
    except sqlite3.DatabaseError as exc:
        raise UsageReadError(f"{path} is not a usage log: {exc}") from None
    finally:
        connection.close()


def summarize(path: str, rows: Iterable[Row], *, by: Grouping, since_s: float, now: float) -> UsageReport:
    grouped: dict[Any, list[Row]] = {}
    everything: list[Row] = []
    for row in rows:
        grouped.setdefault(row[0], []).append(row)
        everything.append(row)
    groups = sorted((_group_usage(group, members) for group, members in grouped.items()),
                    key=lambda usage: (-usage.requests, _label(usage.group, by)))
    return UsageReport(path=path, by=by, since_s=since_s, now=now, groups=tuple(groups),
                       total=_group_usage("total", everything))


def _group_usage(group: Any, rows: list[Row]) -> GroupUsage:
    waits = sorted(_numbers(row[2] for row in rows))
    ttfts = sorted(_numbers(row[3] for row in rows))
    slowdowns = sorted(_numbers(row[6] for row in rows if len(row) > 6))
    return GroupUsage(
        group=group, requests=len(rows), rejected=sum(1 for row in rows if row[1] in REJECTED),
        waited=sum(1 for wait in waits if wait > 0), wait_p50_s=percentile(waits, 0.5),
        wait_p95_s=percentile(waits, 0.95), ttft_p50_s=percentile(ttfts, 0.5),
        prompt_tokens=int(sum(_numbers(row[4] for row in rows))),
        completion_tokens=int(sum(_numbers(row[5] for row in rows))),
        slowdown_p50=_rounded(percentile(slowdowns, 0.5)), slowdown_p95=_rounded(percentile(slowdowns, 0.95)),
        gpu_s=round(sum(_numbers(row[7] for row in rows if len(row) > 7)), 3), **_speech_usage(rows))


def _speech_usage(rows: list[Row]) -> dict[str, Any]:
    speech = [row for row in rows if len(row) > 9 and isinstance(row[8], int)]
    return {"speech": len(speech), "input_chars": sum(row[8] for row in speech),
            "audio_s": round(sum(_numbers(row[9] for row in speech)), 3),
            "audio_unmeasured": sum(1 for row in speech if row[1] == 200 and row[9] is None)}


def _rounded(factor: float | None) -> float | None:
    return None if factor is None else round(factor, 3)


def _numbers(values: Iterable[Any]) -> list[float]:
    # Nulls are "not known"; text would only be there if a writer got a type wrong.
    return [value for value in values if isinstance(value, int | float)]


def percentile(ordered: list[float], q: float) -> float | None:
    """The *q* quantile of sorted values, interpolated between the two nearest (numpy's default)."""
    if not ordered:
        return None
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def report_json(report: UsageReport) -> dict[str, Any]:
    return {"db": report.path, "by": report.by.value, "since_s": report.since_s, "from_ts": report.now - report.since_s,
            "to_ts": report.now, "groups": [{"group": usage.group, **_usage_json(usage)} for usage in report.groups],
            "total": _usage_json(report.total)}


def _usage_json(usage: GroupUsage) -> dict[str, Any]:
    return {"requests": usage.requests, "rejected": usage.rejected, "rejected_share": usage.rejected_share,
            "waited": usage.waited, "waited_share": usage.waited_share, "wait_p50_s": _microseconds(usage.wait_p50_s),
            "wait_p95_s": _microseconds(usage.wait_p95_s), "ttft_p50_s": _microseconds(usage.ttft_p50_s),
            "prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "slowdown_p50": usage.slowdown_p50, "slowdown_p95": usage.slowdown_p95, "gpu_s": usage.gpu_s,
            "speech": usage.speech, "input_chars": usage.input_chars, "audio_s": usage.audio_s,
            "audio_unmeasured": usage.audio_unmeasured}


def _microseconds(seconds: float | None) -> float | None:
    # All the precision the measurements carry; no 3.5999999999999996 from interpolating.
    return None if seconds is None else round(seconds, 6)


_HEADERS = ("requests", "rejected", "waited", "wait p50", "wait p95", "ttft p50", "slow p50", "slow p95",
            "gpu time", "prompt tok", "compl tok")
_SPEECH_HEADERS = ("chars in", "audio out")  # where the report has speech requests


def format_report(report: UsageReport) -> str:
    """A table, one line per group and a total line; a single clear line when there were no requests."""
    window = _window(report.since_s)
    if not report.groups:
        return f"no requests in {report.path} in the last {window}"
    speech = report.total.speech > 0
    lines = [[_label(usage.group, report.by), *_cells(usage), *(_speech_cells(usage) if speech else [])]
             for usage in report.groups]
    lines.append(["total", *_cells(report.total), *(_speech_cells(report.total) if speech else [])])
    header = [report.by.value, *_HEADERS, *(_SPEECH_HEADERS if speech else [])]
    widths = [max(len(line[column]) for line in [header, *lines]) for column in range(len(header))]
    text = [f"requests in {report.path}, last {window}, by {report.by.value}"]
    for line in [header, *lines]:
        text.append("  ".join(cell.ljust(widths[0]) if column == 0 else cell.rjust(widths[column])
                              for column, cell in enumerate(line)).rstrip())
    if report.total.audio_unmeasured:
        text.append(f"* audio out: without {report.total.audio_unmeasured} answer(s) whose audio steward could not "
                    "measure (a FLAC that says no length)")
    return "\n".join(text)


def _cells(usage: GroupUsage) -> list[str]:
    return [str(usage.requests), _percent(usage.rejected_share), _percent(usage.waited_share),
            _seconds(usage.wait_p50_s), _seconds(usage.wait_p95_s), _seconds(usage.ttft_p50_s),
            _factor(usage.slowdown_p50), _factor(usage.slowdown_p95), _seconds(usage.gpu_s), str(usage.prompt_tokens),
            str(usage.completion_tokens)]


def _speech_cells(usage: GroupUsage) -> list[str]:
    if not usage.speech:
        return ["-", "-"]
    return [str(usage.input_chars), _seconds(usage.audio_s) + ("*" if usage.audio_unmeasured else "")]


def _factor(value: float | None) -> str:
    """A slowdown as one says it: 1.2×, 17×."""
    return "-" if value is None else format_factor(value)


def _label(group: Any, by: Grouping) -> str:
    return f"(no {by.value})" if group is None else str(group)


def _percent(share: float) -> str:
    return f"{share * 100:.1f}%"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f}ms"
    if value < 100:
        return f"{value:.2f}s"
    return f"{value:.0f}s"


def _window(seconds: float) -> str:
    """As one would write it: 30m, 24h, 7d."""
    for unit, scale in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * scale and seconds % scale == 0:
            return f"{seconds / scale:g}{unit}"
    return f"{seconds:g}s"
