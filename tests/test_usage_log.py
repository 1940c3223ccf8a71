"""The usage log: rows into a real SQLite file, its failures made for real, and ``steward usage`` over it.

Failures are real: another connection holds the database with ``BEGIN EXCLUSIVE``, a
directory stands where the file should be, the file is read-only or not a database.
Tests wait for states (rows in the database, an event in ``events.recent``) under a
bounded deadline, never for a fixed time.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sqlite3
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from supervisor.backoff import Backoff
from supervisor.observe.events import Event, EventLog, serve_event_log
from supervisor.usage import UsageLog, UsageLogUnavailable, UsageRow, serve_usage_log, writer
from supervisor.usage.commands import add_usage_parser, run_usage
from supervisor.usage.report import parse_since
from supervisor.usage.row import COLUMNS
from supervisor.usage.writer import Backlog

DEADLINE = 30.0
# Failing writes must come round quickly in tests: a short busy timeout and short backoffs.
FAST = {"busy_timeout": 0.05, "retry_initial": 0.02, "retry_max": 0.1}


def usage_row(number: int = 0, **fields: Any) -> UsageRow:
    values: dict[str, Any] = {
        "ts": 1_700_000_000.0 + number, "request_id": f"r{number}", "key": "alice", "listener": "openai",
        "method": "POST", "route": "/v1/chat/completions", "model": "gemma", "engine": "llama",
        "klass": "interactive", "status": 200, "error": None, "queued_s": 0.0, "ttft_s": 0.1, "duration_s": 0.5,
        "prompt_tokens": 10, "completion_tokens": 20, "request_bytes": 100, "response_bytes": 200}
    return UsageRow(**{**values, **fields})


@contextlib.asynccontextmanager
async def open_usage_log(path: Path | str | None, **options: Any) -> AsyncIterator[tuple[UsageLog, EventLog]]:
    """A usage log and its event log; on leaving, the usage log is closed and its writer has finished."""
    async with trio.open_nursery() as outer:
        events: EventLog = await outer.start(partial(serve_event_log, None, terminal=io.StringIO()))
        try:
            async with trio.open_nursery() as nursery:
                usage: UsageLog = await nursery.start(
                    partial(serve_usage_log, None if path is None else str(path), events, **options))
                try:
                    yield usage, events
                finally:
                    usage.close()
        finally:
            events.close()


async def wait_until(condition: Callable[[], object]) -> None:
    with trio.fail_after(DEADLINE):
        while not condition():
            await trio.sleep(0.01)


def named(events: EventLog, name: str) -> list[Event]:
    return [event for event in events.recent if event.name == name]


def stored(path: Path, columns: str = "request_id") -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(path)) as connection:
        return connection.execute(f"SELECT {columns} FROM requests ORDER BY rowid").fetchall()


@contextlib.contextmanager
def locked(path: Path) -> Iterator[sqlite3.Connection]:
    """Another connection holding the database's write lock until the block ends."""
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as locker:
        locker.execute("BEGIN EXCLUSIVE")
        try:
            yield locker
        finally:
            locker.execute("COMMIT")


def count_attempts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the writer's transactions so far, failed ones included."""
    attempts: list[int] = []
    insert = writer._insert

    def counted(connection: sqlite3.Connection, rows: list[UsageRow]) -> None:
        attempts.append(len(rows))
        insert(connection, rows)

    monkeypatch.setattr(writer, "_insert", counted)
    return attempts


# --- writing ---------------------------------------------------------------------------


async def test_every_row_recorded_before_close_is_written_in_batches(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "usage.db"
    attempts = count_attempts(monkeypatch)
    async with open_usage_log(path, batch_max=1000) as (usage, _):
        for number in range(2500):  # no checkpoint between: all are waiting when the writer wakes
            usage.record(usage_row(number))
    assert attempts == [1000, 1000, 500]
    assert [request_id for (request_id,) in stored(path)] == [f"r{number}" for number in range(2500)]
    everything = ("ts, request_id, key, listener, method, route, model, engine, class, status, error, queued_s, "
                  "ttft_s, duration_s, prompt_tokens, completion_tokens, request_bytes, response_bytes, decode_tps, slowdown, "
                  "gpu_s, cost, input_chars, audio_s")
    assert stored(path, everything)[7] == attrs.astuple(usage_row(7))


async def test_the_database_is_wal_versioned_and_indexed_and_opens_again(tmp_path: Path) -> None:
    path = tmp_path / "usage.db"
    async with open_usage_log(path) as (usage, _):
        usage.record(usage_row(1))
    async with open_usage_log(path) as (usage, _):
        usage.record(usage_row(2, key=None, klass=None, queued_s=None, prompt_tokens=None))
    assert stored(path, "request_id, key, class, queued_s, prompt_tokens") == [
        ("r1", "alice", "interactive", 0.0, 10), ("r2", None, None, None, None)]
    with contextlib.closing(sqlite3.connect(path)) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert connection.execute("PRAGMA user_version").fetchone() == (5,)
        indexes = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert indexes == {"requests_ts", "requests_key", "requests_model"}


async def test_listeners_see_every_row_and_without_a_path_nothing_is_written(tmp_path: Path) -> None:
    seen: list[UsageRow] = []
    async with open_usage_log(None) as (usage, events):
        usage.listeners.append(seen.append)
        usage.record(usage_row(1))
        usage.record(usage_row(2))
    assert seen == [usage_row(1), usage_row(2)]
    assert list(tmp_path.iterdir()) == []
    assert not [event for event in events.recent if event.name.startswith("usage_")]


async def test_rows_recorded_while_the_siblings_are_cancelled_are_still_written(tmp_path: Path) -> None:
    path = tmp_path / "usage.db"

    async def request(usage: UsageLog, number: int, *, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            usage.record(usage_row(number, status=499))  # the client "left": shutdown cancelled it

    async with trio.open_nursery() as outer:
        events: EventLog = await outer.start(partial(serve_event_log, None, terminal=io.StringIO()))
        async with trio.open_nursery() as nursery:
            usage: UsageLog = await nursery.start(serve_usage_log, str(path), events)
            try:
                async with trio.open_nursery() as requests:
                    for number in range(3):
                        await requests.start(request, usage, number)
                    nursery.cancel_scope.cancel()  # shutdown: the writer is cancelled with everyone else
            finally:
                usage.close()
        events.close()
    assert sorted(stored(path, "request_id, status")) == [("r0", 499), ("r1", 499), ("r2", 499)]


async def test_a_value_of_a_type_sqlite_has_no_column_for_is_written_as_text(tmp_path: Path) -> None:
    path = tmp_path / "usage.db"
    async with open_usage_log(path) as (usage, events):
        usage.record(usage_row(1, model={"not": "a name"}, prompt_tokens=2**70, error=None))
        usage.record(usage_row(2))
    assert stored(path, "request_id, model, prompt_tokens") == [("r1", "{'not': 'a name'}", None), ("r2", "gemma", 10)]
    assert not named(events, "usage_write_failed")


async def test_a_row_recorded_after_close_is_reported_lost(tmp_path: Path) -> None:
    async with open_usage_log(tmp_path / "usage.db") as (usage, events):
        pass
    usage.record(usage_row(1))
    [lost] = named(events, "usage_rows_lost")
    assert lost.level == "error"
    assert lost.fields == {"path": str(tmp_path / "usage.db"), "lost": 1,
                           "detail": "recorded after the usage log was closed"}


# --- failures while running --------------------------------------------------------------


async def test_a_locked_database_keeps_the_rows_and_writes_them_once_released(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "usage.db"
    attempts = count_attempts(monkeypatch)
    async with open_usage_log(path, **FAST) as (usage, events):
        with locked(path):
            usage.record(usage_row(1))
            await wait_until(lambda: named(events, "usage_write_failed"))
            usage.record(usage_row(2))
            usage.record(usage_row(3))
            await wait_until(lambda: len(attempts) >= 4)  # several failed attempts ...
            assert len(named(events, "usage_write_failed")) == 1  # ... one event for the episode
            assert stored(path) == []
        await wait_until(lambda: named(events, "usage_write_recovered"))
        assert stored(path) == [("r1",), ("r2",), ("r3",)]
    [failed] = named(events, "usage_write_failed")
    assert failed.level == "warning"
    assert failed.fields == {"path": str(path), "detail": "database is locked (SQLITE_BUSY)", "pending": 1,
                             "retry_in_s": 0.02}
    [recovered] = named(events, "usage_write_recovered")
    assert (recovered.level, recovered.fields) == ("info", {"path": str(path), "written": 3})
    assert not named(events, "usage_rows_lost") and not named(events, "usage_rows_dropped")


async def test_beyond_pending_max_the_oldest_rows_are_dropped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "usage.db"
    async with open_usage_log(path, pending_max=5, **FAST) as (usage, events):
        with locked(path):
            usage.record(usage_row(0))
            await wait_until(lambda: named(events, "usage_write_failed"))
            for number in range(1, 8):
                usage.record(usage_row(number))
            await wait_until(lambda: named(events, "usage_rows_dropped"))
        await wait_until(lambda: named(events, "usage_write_recovered"))
    [dropped] = named(events, "usage_rows_dropped")
    assert (dropped.level, dropped.fields) == ("warning", {"path": str(path), "dropped": 3, "pending": 5})
    assert stored(path) == [(f"r{number}",) for number in range(3, 8)]


async def test_at_close_rows_that_still_cannot_be_written_are_reported_lost_at_once(tmp_path: Path) -> None:
    path = tmp_path / "usage.db"
    # An hour's backoff: closing must not wait for it.
    async with open_usage_log(path, busy_timeout=0.05, retry_initial=3600, retry_max=3600) as (usage, events):
        with locked(path):
            for number in range(3):
                usage.record(usage_row(number))
            await wait_until(lambda: named(events, "usage_write_failed"))
            with trio.fail_after(DEADLINE):
                usage.close()
                await wait_until(lambda: named(events, "usage_rows_lost"))
    [lost] = named(events, "usage_rows_lost")
    assert (lost.level, lost.fields) == ("error", {"path": str(path), "lost": 3,
                                                   "detail": "database is locked (SQLITE_BUSY)"})
    assert stored(path) == []


def test_the_backlog_backs_off_doubling_to_the_maximum_and_starts_over_after_a_success() -> None:
    backlog = Backlog(pending_max=3, backoff=Backoff(1.0, 5.0))
    for number in range(4):
        backlog.add(usage_row(number))
    assert [row.request_id for row in backlog.rows] == ["r1", "r2", "r3"] and backlog.take_dropped() == 1
    assert backlog.take_dropped() == 0
    assert backlog.failed("locked", now=100.0) == (True, 1.0) and backlog.retry_at == 101.0
    assert backlog.failed("locked", now=101.0) == (False, 2.0)
    assert backlog.failed("disk full", now=103.0) == (False, 4.0)
    assert backlog.failed("disk full", now=107.0) == (False, 5.0) and backlog.retry_at == 112.0
    assert backlog.failure == "disk full"
    assert backlog.batch(2) == [usage_row(1), usage_row(2)]
    assert backlog.written(2) is True and backlog.failure is None
    assert backlog.written(1) is False and not backlog.rows
    assert backlog.failed("locked", now=200.0) == (True, 1.0)


# --- failures at start ------------------------------------------------------------------


async def start_usage_log(path: Path) -> str:
    """The message ``nursery.start`` raises for a usage log at *path*."""
    events: EventLog = EventLog(trio.open_memory_channel[Event](1)[0])
    async with trio.open_nursery() as nursery:
        with pytest.raises(UsageLogUnavailable) as raised:
            await nursery.start(serve_usage_log, str(path), events)
    return str(raised.value)


async def test_a_directory_where_the_database_should_be_is_an_error_at_start(tmp_path: Path) -> None:
    (tmp_path / "usage.db").mkdir()
    assert await start_usage_log(tmp_path / "usage.db") == f"usage.db: cannot open {str(tmp_path / 'usage.db')!r}: " \
                                                           "it is a directory"
    assert await start_usage_log(tmp_path / "no" / "usage.db") == \
        f"usage.db: cannot open {str(tmp_path / 'no' / 'usage.db')!r}: no folder {str(tmp_path / 'no')!r}"


async def test_a_file_that_is_not_a_database_is_an_error_at_start(tmp_path: Path) -> None:
    path = tmp_path / "usage.db"
    path.write_text("these are not the rows you are looking for\n" * 100)
    assert await start_usage_log(path) == f"usage.db: cannot open {str(path)!r}: file is not a database (SQLITE_NOTADB)"
    assert path.read_text().startswith("these are not")


async def test_a_read_only_database_is_an_error_at_start(tmp_path: Path) -> None:
    path = tmp_path / "usage.db"
    async with open_usage_log(path) as (usage, _):
        usage.record(usage_row(1))
    with read_only(path):
        message = await start_usage_log(path)
    assert message == f"usage.db: cannot open {str(path)!r}: attempt to write a readonly database (SQLITE_READONLY)"
    assert stored(path) == [("r1",)]


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """*path* made read-only; for root, who writes whatever the mode says, made immutable."""
    if os.geteuid() != 0:
        path.chmod(0o444)
        try:
            yield
        finally:
            path.chmod(0o644)
        return
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("running as root on a file system without chattr +i: no file is read-only for root")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


async def test_a_database_of_a_newer_steward_or_of_something_else_is_an_error_at_start(tmp_path: Path) -> None:
    newer, other = tmp_path / "newer.db", tmp_path / "other.db"
    with contextlib.closing(sqlite3.connect(newer)) as connection:
        connection.execute("PRAGMA user_version = 7")
    with contextlib.closing(sqlite3.connect(other)) as connection:
        connection.execute("CREATE TABLE requests (url TEXT, at REAL)")
    assert await start_usage_log(newer) == f"usage.db: cannot open {str(newer)!r}: written by a newer steward " \
                                           "(schema version 7, this one knows 5)"
    assert await start_usage_log(other) == f"usage.db: cannot open {str(other)!r}: its table 'requests' is not a " \
                                           "steward usage log's"


async def test_a_usage_log_of_schema_1_gains_the_newer_columns_and_keeps_its_rows(tmp_path: Path,
                                                                                   capsys: pytest.CaptureFixture[str]
                                                                                   ) -> None:
    path = tmp_path / "usage.db"
    old_columns = COLUMNS[:COLUMNS.index("decode_tps")]  # schema 1's
    with contextlib.closing(sqlite3.connect(path)) as connection:
        connection.execute(f"CREATE TABLE requests ({', '.join(f'{name!r}' for name in old_columns)})")
        connection.execute(f"INSERT INTO requests VALUES ({', '.join('?' * len(old_columns))})",
                           attrs.astuple(usage_row(1, ts=time.time() - 10))[:len(old_columns)])
        connection.execute("PRAGMA user_version = 1")
        connection.commit()
    # `steward usage` reads a log no steward has opened since (read-only: no slowdown column yet).
    old = run_json(capsys, "--db", str(path))["total"]
    assert (old["slowdown_p50"], old["gpu_s"]) == (None, 0.0)
    async with open_usage_log(path) as (usage, _):
        usage.record(usage_row(2, ts=time.time() - 5, slowdown=4.0, decode_tps=12.5, gpu_s=2.5))
    assert stored(path, "request_id, decode_tps, slowdown, gpu_s, cost, input_chars, audio_s") == [
        ("r1", None, None, None, None, None, None), ("r2", 12.5, 4.0, 2.5, None, None, None)]
    with contextlib.closing(sqlite3.connect(path)) as connection:
        assert connection.execute("PRAGMA user_version").fetchone() == (5,)
    assert run_json(capsys, "--db", str(path))["total"]["slowdown_p50"] == 4.0
    assert run_json(capsys, "--db", str(path))["total"]["gpu_s"] == 2.5


# --- steward usage (async tests: the writer fills their database) ----------------------


def usage_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="steward")
    add_usage_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["usage", *argv])


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert run_usage(usage_args(*argv, "--json")) == 0
    return json.loads(capsys.readouterr().out)


def numbers(requests: int, rejected: int, waited: int, wait_p50_s: float | None, wait_p95_s: float | None,
            ttft_p50_s: float | None, prompt_tokens: int, completion_tokens: int, slowdown_p50: float | None = None,
            slowdown_p95: float | None = None, gpu_s: float = 0.0, **speech: Any) -> dict[str, Any]:
    return {"requests": requests, "rejected": rejected, "rejected_share": rejected / requests, "waited": waited,
            "waited_share": waited / requests, "wait_p50_s": wait_p50_s, "wait_p95_s": wait_p95_s,
            "ttft_p50_s": ttft_p50_s, "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "slowdown_p50": slowdown_p50, "slowdown_p95": slowdown_p95, "gpu_s": gpu_s,
            **{"speech": 0, "input_chars": 0, "audio_s": 0.0, "audio_unmeasured": 0, **speech}}


@pytest.fixture
async def usage_db(tmp_path: Path) -> Path:
    """A usage log the writer wrote: alice (one rate limited), bob (batch, each queued), a keyless 401, and
    an old row of alice's from three days ago."""
    path = tmp_path / "usage.db"
    now = time.time()
    rows = [
        usage_row(1, ts=now - 60, key="alice", queued_s=0.0, ttft_s=0.25, prompt_tokens=10, completion_tokens=20,
                  decode_tps=50.0, slowdown=1.0, gpu_s=0.5),
        usage_row(2, ts=now - 50, key="alice", queued_s=1.0, ttft_s=0.75, prompt_tokens=30, completion_tokens=40,
                  decode_tps=20.0, slowdown=3.0, gpu_s=1.5),
        usage_row(3, ts=now - 40, key="alice", status=429, error="rate_limited", queued_s=None, ttft_s=None,
                  engine=None, prompt_tokens=None, completion_tokens=None),
        usage_row(4, ts=now - 30, key="bob", klass="batch", model="qwen", queued_s=2.0, ttft_s=1.5,
                  prompt_tokens=5, completion_tokens=5, slowdown=5.0, gpu_s=3.0),
        usage_row(5, ts=now - 20, key="bob", klass="batch", model="qwen", status=503, error="queue_full",
                  queued_s=4.0, ttft_s=None, prompt_tokens=None, completion_tokens=None),
        usage_row(6, ts=now - 10, key="bob", klass="batch", model="qwen", status=499, queued_s=0.5, ttft_s=0.5,
                  prompt_tokens=7, completion_tokens=0, gpu_s=0.25),
        usage_row(7, ts=now - 5, key=None, listener="ollama", route="/api/chat", model=None, engine=None, klass=None,
                  status=401, error="unauthorized", queued_s=None, ttft_s=None, prompt_tokens=None,
                  completion_tokens=None),
        usage_row(8, ts=now - 3 * 86400, key="alice", prompt_tokens=1000, completion_tokens=1000),
    ]
    async with open_usage_log(path) as (usage, _):
        for row in rows:
            usage.record(row)
    return path


async def test_usage_by_key_counts_and_percentiles(usage_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "--db", str(usage_db))
    assert (report["db"], report["by"], report["since_s"]) == (str(usage_db), "key", 86400.0)
    assert report["to_ts"] - report["from_ts"] == 86400.0
    assert report["groups"] == [
        {"group": "alice", **numbers(3, 1, 1, 0.5, 0.95, 0.5, 40, 60, 2.0, 2.9, gpu_s=2.0)},
        {"group": "bob", **numbers(3, 1, 3, 2.0, 3.8, 1.0, 12, 5, 5.0, 5.0, gpu_s=3.25)},
        {"group": None, **numbers(1, 1, 0, None, None, None, 0, 0)},
    ]
    assert report["total"] == numbers(7, 3, 4, 1.0, 3.6, 0.625, 52, 65, 3.0, 4.8, gpu_s=5.25)


async def test_usage_over_a_longer_window_and_other_groupings(usage_db: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    week = run_json(capsys, "--db", str(usage_db), "--since", "7d")
    assert week["since_s"] == 7 * 86400.0
    assert [(group["group"], group["requests"], group["prompt_tokens"]) for group in week["groups"]] == [
        ("alice", 4, 1040), ("bob", 3, 12), (None, 1, 0)]
    by_status = run_json(capsys, "--db", str(usage_db), "--by", "status")
    assert [(group["group"], group["requests"]) for group in by_status["groups"]] == [
        (200, 3), (401, 1), (429, 1), (499, 1), (503, 1)]
    by_class = run_json(capsys, "--db", str(usage_db), "--by", "class", "--since", "30m")
    assert [(group["group"], group["requests"], group["rejected"]) for group in by_class["groups"]] == [
        ("batch", 3, 1), ("interactive", 3, 1), (None, 1, 1)]
    by_listener = run_json(capsys, "--db", str(usage_db), "--by", "listener")
    assert [(group["group"], group["requests"]) for group in by_listener["groups"]] == [("openai", 6), ("ollama", 1)]


async def test_usage_prints_a_table_with_a_line_per_group_and_a_total(usage_db: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert run_usage(usage_args("--db", str(usage_db))) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"requests in {usage_db}, last 24h, by key"
    assert lines[1].split() == ["key", "requests", "rejected", "waited", "wait", "p50", "wait", "p95", "ttft", "p50",
                                "slow", "p50", "slow", "p95", "gpu", "time", "prompt", "tok", "compl", "tok"]
    assert [line.split() for line in lines[2:]] == [
        ["alice", "3", "33.3%", "33.3%", "500ms", "950ms", "500ms", "2.0×", "2.9×", "2.00s", "40", "60"],
        ["bob", "3", "33.3%", "100.0%", "2.00s", "3.80s", "1.00s", "5.0×", "5.0×", "3.25s", "12", "5"],
        ["(no", "key)", "1", "100.0%", "0.0%", "-", "-", "-", "-", "-", "0ms", "0", "0"],
        ["total", "7", "42.9%", "57.1%", "1.00s", "3.60s", "625ms", "3.0×", "4.8×", "5.25s", "52", "65"],
    ]
    assert run_usage(usage_args("--db", str(usage_db), "--by", "model")) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()[2:]] == ["gemma", "qwen", "(no", "total"]


async def test_speech_requests_add_their_characters_and_audio_where_there_are_any(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "usage.db"
    now, speech = time.time(), {"route": "/v1/audio/speech", "model": "tts", "prompt_tokens": None,
                                "completion_tokens": None}
    async with open_usage_log(path) as (usage, _):
        usage.record(usage_row(1, ts=now - 900, key="alice", **speech, input_chars=39, audio_s=2.6))  # wav
        usage.record(usage_row(2, ts=now - 800, key="alice", **speech, input_chars=1000, audio_s=None))  # flac
        usage.record(usage_row(3, ts=now - 700, key="bob", **speech, input_chars=50, audio_s=1.0, status=499))
        usage.record(usage_row(4, ts=now - 10, key="bob", prompt_tokens=3, completion_tokens=4))  # a chat
    assert run_usage(usage_args("--db", str(path), "--by", "model")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[-4:] == ["chars", "in", "audio", "out"]
    assert [line.split()[-2:] for line in lines[2:5]] == [["1089", "3.60s*"], ["-", "-"], ["1089", "3.60s*"]]
    assert [line.split()[0] for line in lines[2:5]] == ["tts", "gemma", "total"]
    assert lines[5] == "* audio out: without 1 answer(s) whose audio steward could not measure (a FLAC that says no length)"
    groups = {group["group"]: group for group in run_json(capsys, "--db", str(path))["groups"]}
    assert {k: groups["bob"][k] for k in ("speech", "input_chars", "audio_s", "audio_unmeasured")} == {
        "speech": 1, "input_chars": 50, "audio_s": 1.0, "audio_unmeasured": 0}  # what a client that left was sent
    assert groups["alice"]["audio_unmeasured"] == 1 and groups["alice"]["audio_s"] == 2.6
    assert run_usage(usage_args("--db", str(path), "--since", "5m")) == 0  # only the chat: no speech columns
    assert capsys.readouterr().out.splitlines()[1].split()[-2:] == ["compl", "tok"]


async def test_usage_of_an_empty_log_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "usage.db"
    async with open_usage_log(path):
        pass
    assert run_usage(usage_args("--db", str(path), "--since", "30m")) == 0
    assert capsys.readouterr().out == f"no requests in {path} in the last 30m\n"
    report = run_json(capsys, "--db", str(path))
    assert report["groups"] == [] and report["total"]["requests"] == 0


def test_usage_of_a_missing_or_foreign_file_is_a_clear_error(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere.db"
    assert run_usage(usage_args("--db", str(missing))) == 2
    assert capsys.readouterr().err == f"steward: no usage log at {missing}\n"
    assert not missing.exists()
    garbage = tmp_path / "garbage.db"
    garbage.write_text("not a database, just text\n" * 100)
    assert run_usage(usage_args("--db", str(garbage), "--json")) == 2
    assert capsys.readouterr().err == f"steward: {garbage} is not a usage log: file is not a database\n"
    other = tmp_path / "other.db"
    with contextlib.closing(sqlite3.connect(other)) as connection:
        connection.execute("CREATE TABLE things (name TEXT)")
    assert run_usage(usage_args("--db", str(other))) == 2
    assert capsys.readouterr().err == f"steward: {other} is a SQLite database but not a usage log " \
                                      "(no table 'requests')\n"


def test_usage_without_db_or_config_reads_the_default_file_here(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_usage(usage_args()) == 2
    assert capsys.readouterr().err == "steward: no usage log at steward-usage.db\n"


def test_since_takes_durations_and_days(capsys: pytest.CaptureFixture[str]) -> None:
    assert [parse_since(text) for text in ("30m", "24h", "7d", "1.5d", "90s", "2H")] == [
        1800.0, 86400.0, 604800.0, 129600.0, 90.0, 7200.0]
    for text in ("yesterday", "-1h", "1w", "9" * 400 + "d"):
        with pytest.raises(ValueError, match="must be a duration like 30m, 24h or 7d"):
            parse_since(text)
    with pytest.raises(SystemExit) as exited:
        usage_args("--since", "soon")
    assert exited.value.code == 2
    assert "argument --since: must be a duration like 30m, 24h or 7d, got 'soon'" in capsys.readouterr().err


# --- faults the writer contains (issue 26) -----------------------------------------------


async def test_a_model_name_with_a_lone_surrogate_is_written_as_its_escape_and_the_batch_with_it(
        tmp_path: Path) -> None:
    """Before: UnicodeEncodeError escaped _insert and ended steward (one keyless request on the Ollama listener)."""
    path = tmp_path / "usage.db"
    async with open_usage_log(path) as (usage, events):
        usage.record(usage_row(1))
        usage.record(usage_row(2, model="x\ud800", error="\udfff"))
        usage.record(usage_row(3))
    assert stored(path, "request_id, model, error") == [("r1", "gemma", None), ("r2", "x\\ud800", "\\udfff"),
                                                        ("r3", "gemma", None)]
    assert named(events, "usage_rows_lost") == []


async def test_a_row_no_database_takes_is_dropped_alone_and_said(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "usage.db"
    column_values = writer.column_values

    def poisoned(row: UsageRow) -> tuple[Any, ...]:
        if row.request_id == "r2":
            raise TypeError("a value no column takes")
        return column_values(row)

    monkeypatch.setattr(writer, "column_values", poisoned)
    async with open_usage_log(path) as (usage, events):
        for number in range(5):
            usage.record(usage_row(number))
    assert [request_id for (request_id,) in stored(path)] == ["r0", "r1", "r3", "r4"]
    [lost] = named(events, "usage_rows_lost")
    assert lost.fields["lost"] == 1 and lost.fields["request_ids"] == ["r2"]
    assert "TypeError: a value no column takes" in lost.fields["detail"]


async def test_a_usage_db_deleted_under_the_writer_is_noticed_and_created_again(tmp_path: Path) -> None:
    """Before: SQLite went on writing into the deleted file; every row after was lost without a word."""
    path = tmp_path / "usage.db"
    async with open_usage_log(path, flush_interval=0.0) as (usage, events):
        usage.record(usage_row(1))
        await wait_until(lambda: path.exists() and stored(path) == [("r1",)])
        for leftover in tmp_path.glob("usage.db*"):
            leftover.unlink()
        usage.record(usage_row(2))
        await wait_until(lambda: named(events, "usage_db_recreated"))
        usage.record(usage_row(3))
    [recreated] = named(events, "usage_db_recreated")
    assert recreated.fields["detail"] == "it was deleted" and recreated.fields["path"] == str(path)
    assert stored(path) == [("r2",), ("r3",)]


async def test_a_usage_db_replaced_under_the_writer_is_noticed_and_written_there(tmp_path: Path) -> None:
    path = tmp_path / "usage.db"
    async with open_usage_log(path, flush_interval=0.0) as (usage, events):
        usage.record(usage_row(1))
        await wait_until(lambda: stored(path) == [("r1",)])
        moved = tmp_path / "usage-old.db"
        path.rename(moved)
        writer.open_usage_database(str(path)).close()  # another, empty usage log where it was
        usage.record(usage_row(2))
        await wait_until(lambda: named(events, "usage_db_recreated"))
    assert named(events, "usage_db_recreated")[0].fields["detail"] == "it was replaced by another file"
    assert stored(path) == [("r2",)]


async def test_a_writer_that_fails_is_restarted_on_its_backlog_and_no_row_handed_over_is_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock) -> None:
    from supervisor.backoff import Backoff
    from supervisor.supervise import Supervision

    path = tmp_path / "usage.db"
    write_batch = writer._Writer._write_batch
    failures = [RuntimeError("a bug in the writer")]

    async def failing_once(self: Any) -> bool:
        if failures:
            raise failures.pop()
        return await write_batch(self)

    monkeypatch.setattr(writer._Writer, "_write_batch", failing_once)
    async with trio.open_nursery() as outer:
        events: EventLog = await outer.start(partial(serve_event_log, None, terminal=io.StringIO()))
        supervision = Supervision(events, Backoff(2.0, 2.0))
        async with trio.open_nursery() as nursery:
            usage: UsageLog = await nursery.start(partial(serve_usage_log, str(path), events,
                                                          supervision=supervision, flush_interval=0.5))
            for number in range(3):
                usage.record(usage_row(number))
            await trio.sleep(1.0)  # failed at 0.5 s, with the three rows in its backlog
            assert [e.fields["task"] for e in named(events, "task_failed")] == ["usage log writer"]
            usage.record(usage_row(3))
            await trio.sleep(5.0)
            assert [e.mono for e in named(events, "task_restarted")] == [2.5]
            usage.close()
        events.close()
    assert [request_id for (request_id,) in stored(path)] == ["r0", "r1", "r2", "r3"]
