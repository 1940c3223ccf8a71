"""The usage log's writer: every request's row into SQLite, without ever holding up a request.

``UsageLog.record`` is synchronous and never blocks: it hands the row to an unbounded
memory channel and tells the listeners (metrics count from there). One task,
``serve_usage_log``, owns the database. Once a row arrives it gathers rows for
``flush_interval`` (or until ``batch_max``) and writes them in one transaction in a worker
thread, so the event loop never waits on the disk and requests cost one commit together,
not one each (a transaction and a thread hop per request cost more CPU than steward's
whole proxying of a fast request: tests/benchmarks/bench_proxy.py).

The usage log must never stop steward. A database that cannot be opened (a directory, a
read-only file, not a database) is an error at start, raised before ``task_status.started``
so the caller can say what is wrong. Once running, a write that fails (a full disk, the
database locked by someone else past the busy timeout, an I/O error) is an event: the rows
stay in memory (at most ``pending_max``; beyond that the oldest are dropped and counted)
and the writer retries with exponential backoff while new rows keep arriving. At close it
tries once more, at once, and reports the rows it still could not write.

The loop runs shielded, like the event log's, so that rows recorded while its siblings
are being cancelled at shutdown are still written; it ends when ``close`` closes the channel.
"""

from __future__ import annotations

import collections
import functools
import math
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import trio

from supervisor.backoff import Backoff
from supervisor.observe.events import EventLog
from supervisor.supervise import Supervision, supervise
from supervisor.usage.row import ADDED_COLUMNS, COLUMNS, SCHEMA_VERSION, TABLE, UsageRow, column_values

# No NOT NULL or CHECK constraints: a row the gateway got slightly wrong is still a row
# worth keeping, and a row the database refused would be retried forever.
_CREATE_TABLE = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} (ts REAL, request_id TEXT, key TEXT, listener TEXT, method TEXT, "
    "route TEXT, model TEXT, engine TEXT, class TEXT, status INTEGER, error TEXT, queued_s REAL, ttft_s REAL, "
    "duration_s REAL, prompt_tokens INTEGER, completion_tokens INTEGER, request_bytes INTEGER, "
    "response_bytes INTEGER, decode_tps REAL, slowdown REAL, gpu_s REAL)")
_CREATE_INDEXES = [f"CREATE INDEX IF NOT EXISTS {TABLE}_{column} ON {TABLE} ({column})"
                   for column in ("ts", "key", "model")]
_QUOTED = ", ".join(f'"{name}"' for name in COLUMNS)
_INSERT = f"INSERT INTO {TABLE} ({_QUOTED}) VALUES ({', '.join('?' * len(COLUMNS))})"


class UsageLogUnavailable(Exception):
    """The database cannot be used; the message names the setting and the file, and says why."""


class _Unusable(Exception):
    pass


@attrs.define(eq=False)
class UsageLog:
    """The recorders' side. ``record`` is synchronous and never blocks."""

    _send: trio.MemorySendChannel[UsageRow] | None  # None: steward runs without a usage log
    _events: EventLog
    path: str | None
    # Called with every row as it is recorded, with or without a database.
    listeners: list[Callable[[UsageRow], None]] = attrs.Factory(list)

    def record(self, row: UsageRow) -> None:
        for listener in self.listeners:
            listener(row)
        if self._send is None:
            return
        try:
            self._send.send_nowait(row)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            # Recorded after close: the writer has written its last transaction.
            self._events.emit("usage_rows_lost", "error", path=self.path, lost=1,
                              detail="recorded after the usage log was closed")

    def close(self) -> None:
        """The writer writes what is still queued, then returns."""
        if self._send is not None:
            self._send.close()


async def serve_usage_log(path: str | None, events: EventLog, *, supervision: Supervision | None = None,
                          batch_max: int = 1000, flush_interval: float = 0.5, retry_initial: float = 1.0,
                          retry_max: float = 30.0, pending_max: int = 100_000, busy_timeout: float = 5.0,
                          task_status: trio.TaskStatus[UsageLog] = trio.TASK_STATUS_IGNORED) -> None:
    """Write recorded rows until the log is closed; with a working disk, nothing recorded before ``close`` is lost.

    Under *supervision* the writing loop is the supervised task "usage log writer": a failure
    of the loop itself (a bug, not a disk: those are retried inside it) restarts it on the same
    channel and backlog, so no row already handed over is lost."""
    if path is None:
        task_status.started(UsageLog(None, events, None))
        return
    connection = await trio.to_thread.run_sync(open_usage_database, path, busy_timeout)
    send, receive = trio.open_memory_channel[UsageRow](math.inf)
    backlog = Backlog(pending_max=pending_max, backoff=Backoff(retry_initial, retry_max))
    writer = _Writer(_Database(path, busy_timeout, connection), events, backlog, batch_max, flush_interval)
    try:
        task_status.started(UsageLog(send, events, path))
        with trio.CancelScope(shield=True):
            if supervision is None:
                await writer.run(receive)
            else:
                await supervise(supervision, "usage log writer", functools.partial(writer.run, receive))
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(writer.database.close)  # it may checkpoint the WAL: a write


def open_usage_database(path: str, busy_timeout: float = 5.0) -> sqlite3.Connection:
    """The database at *path*, created if missing, its schema checked and proven writable."""
    try:
        return _open(path, busy_timeout)
    except sqlite3.Error as exc:
        problem = _detail(exc)
    except _Unusable as exc:
        problem = str(exc)
    raise UsageLogUnavailable(f"usage.db: cannot open {path!r}: {problem}")


def _open(path: str, busy_timeout: float) -> sqlite3.Connection:
    # SQLite says "unable to open database file" for the first two; say which it is.
    try:
        where = Path(path)
        if where.is_dir():
            raise _Unusable("it is a directory")
        if not where.parent.is_dir():
            raise _Unusable(f"no folder {str(where.parent)!r}")
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte
        raise _Unusable(str(exc)) from None
    connection = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
    try:
        _prepare(connection)
    except BaseException:
        connection.close()
        raise
    return connection


def _prepare(connection: sqlite3.Connection) -> None:
    # WAL: `steward usage` reads while steward writes; NORMAL: a commit is not an fsync, and
    # a power cut loses at most the last transactions, never the database.
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=NORMAL")
    connection.execute("BEGIN IMMEDIATE")
    try:
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise _Unusable(f"written by a newer steward (schema version {version}, this one knows {SCHEMA_VERSION})")
        connection.execute(_CREATE_TABLE)
        columns = _migrated(connection, tuple(info[1] for info in connection.execute(f"PRAGMA table_info({TABLE})")))
        if columns != COLUMNS:
            raise _Unusable(f"its table {TABLE!r} is not a steward usage log's")
        for statement in _CREATE_INDEXES:
            connection.execute(statement)
        # Written even when unchanged: it proves the file can be written, so a read-only
        # file is an error at start, not a warning at the first request.
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        connection.execute("COMMIT")
    except BaseException:
        _rollback(connection)
        raise


def _migrated(connection: sqlite3.Connection, columns: tuple[str, ...]) -> tuple[str, ...]:
    """The table's columns once those that later versions added are there: an older steward's
    log keeps its rows and gains the new columns (empty in its old rows)."""
    for version in sorted(ADDED_COLUMNS):
        added = ADDED_COLUMNS[version]
        if columns + tuple(name for name, _ in added) == COLUMNS[:len(columns) + len(added)]:
            for name, kind in added:
                connection.execute(f'ALTER TABLE {TABLE} ADD COLUMN "{name}" {kind}')
            columns += tuple(name for name, _ in added)
    return columns


def _insert(connection: sqlite3.Connection, rows: list[UsageRow]) -> None:
    """*rows* in one transaction (in a worker thread); all or none."""
    try:
        # IMMEDIATE: wait (up to the busy timeout) for the write lock now, rather than fail at the commit.
        connection.execute("BEGIN IMMEDIATE")
        connection.executemany(_INSERT, [column_values(row) for row in rows])
        connection.execute("COMMIT")
    except BaseException:
        _rollback(connection)
        raise


def _rollback(connection: sqlite3.Connection) -> None:
    try:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
    except sqlite3.Error:
        pass  # a failed rollback leaves nothing to keep: SQLite rolls back itself at the next open


def _detail(exc: sqlite3.Error) -> str:
    name = getattr(exc, "sqlite_errorname", None)
    return f"{exc} ({name})" if name else str(exc)


@attrs.define
class Backlog:
    """The rows not yet written, and whether writing is failing. Pure: times are arguments."""

    pending_max: int
    backoff: Backoff
    rows: collections.deque[UsageRow] = attrs.Factory(collections.deque)
    failure: str | None = None  # the last error while writing fails; None while it works
    retry_at: float = -math.inf
    dropped: int = 0  # since last taken
    _delays: Iterator[float] | None = None

    def add(self, row: UsageRow) -> None:
        self.rows.append(row)
        if len(self.rows) > self.pending_max:
            self.rows.popleft()
            self.dropped += 1

    def batch(self, size: int) -> list[UsageRow]:
        return [self.rows[i] for i in range(min(size, len(self.rows)))]

    def written(self, count: int) -> bool:
        """The first *count* rows are in the database; True when that ends a failure episode."""
        for _ in range(count):
            self.rows.popleft()
        recovered = self.failure is not None
        self.failure, self._delays = None, None
        return recovered

    def failed(self, detail: str, now: float) -> tuple[bool, float]:
        """A write failed at *now*: (whether this starts a failure episode, seconds until the retry)."""
        starts = self.failure is None
        if self._delays is None:
            self._delays = self.backoff.delays()
        delay = next(self._delays)
        self.failure, self.retry_at = detail, now + delay
        return starts, delay

    def give_up(self) -> int:
        """Drops the rows still here (at close, when the last attempt failed); how many they were."""
        count = len(self.rows)
        self.rows.clear()
        return count

    def take_dropped(self) -> int:
        count, self.dropped = self.dropped, 0
        return count


@attrs.define(eq=False)
class _Database:
    """The open database, and the file it was opened as: a usage log deleted or replaced under a
    running steward is noticed before the next write (SQLite would go on writing into the
    deleted file, and every row would be lost without a word), and opened afresh."""

    path: str
    busy_timeout: float
    connection: sqlite3.Connection
    identity: tuple[int, int] | None = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.identity = _identity(self.path)

    def insert(self, rows: list[UsageRow]) -> str | None:
        """*rows* in one transaction (in a worker thread); what happened to the file first, if it
        was deleted or replaced (the rows then went into a new one)."""
        gone = self._gone()
        if gone is not None:
            self.close()
            self.connection = open_usage_database(self.path, self.busy_timeout)
            self.identity = _identity(self.path)
        _insert(self.connection, rows)
        return gone

    def _gone(self) -> str | None:
        now = _identity(self.path)
        if now == self.identity:
            return None
        return "it was deleted" if now is None else "it was replaced by another file"

    def close(self) -> None:
        try:
            self.connection.close()
        except sqlite3.Error:
            pass


def _identity(path: str) -> tuple[int, int] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


@attrs.define(eq=False)
class _Writer:
    database: _Database
    events: EventLog
    backlog: Backlog
    batch_max: int
    flush_interval: float = 0.0

    async def run(self, receive: trio.MemoryReceiveChannel[UsageRow], *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while await self._gather(receive):
            await self._write_batch()
        # Closed: the last attempt, at once (a backoff sleep must not delay shutdown).
        while self.backlog.rows and await self._write_batch():
            pass
        if lost := self.backlog.give_up():
            self.events.emit("usage_rows_lost", "error", path=self.path, lost=lost, detail=self.backlog.failure)

    async def _gather(self, receive: trio.MemoryReceiveChannel[UsageRow]) -> bool:
        """Waits for rows to write, then takes what is waiting; False once the channel is closed and empty.

        While writing fails it takes every row until the retry time (the channel then stays
        empty and the backlog's bound holds); otherwise it waits for a first row and takes
        up to a batch, leaving the rest for the next transaction."""
        backlog = self.backlog
        try:
            if backlog.failure is not None:
                with trio.move_on_at(backlog.retry_at):
                    while True:
                        backlog.add(await receive.receive())
            elif not backlog.rows:
                backlog.add(await receive.receive())
                # A moment for more: requests one by one would each cost a transaction (and a
                # thread hop), most of what a fast request costs steward.
                with trio.move_on_after(self.flush_interval):
                    while len(backlog.rows) < self.batch_max:
                        backlog.add(await receive.receive())
            while backlog.failure is not None or len(backlog.rows) < self.batch_max:
                backlog.add(receive.receive_nowait())
        except trio.WouldBlock:
            pass
        except trio.EndOfChannel:
            return False
        return True

    @property
    def path(self) -> str:
        return self.database.path

    async def _write_batch(self) -> bool:
        batch = self.backlog.batch(self.batch_max)
        try:
            gone = await trio.to_thread.run_sync(self.database.insert, batch)
        except (sqlite3.Error, UsageLogUnavailable) as exc:
            detail = _detail(exc) if isinstance(exc, sqlite3.Error) else str(exc)
            starts, retry_in = self.backlog.failed(detail, trio.current_time())
            if starts:
                self.events.emit("usage_write_failed", "warning", path=self.path, detail=detail,
                                 pending=len(self.backlog.rows), retry_in_s=retry_in)
            self._report_dropped()
            return False
        except Exception as exc:  # noqa: BLE001 - a row no database takes: it alone is dropped, said, never retried
            await self._write_one_by_one(batch, exc)
            return True
        if gone is not None:
            self.events.emit("usage_db_recreated", "warning", path=self.path, detail=gone,
                             written=len(batch), text=f"the usage log {self.path} was gone ({gone}): a new one "
                                                      f"was created and writing goes on there")
        if self.backlog.written(len(batch)):
            self.events.emit("usage_write_recovered", "info", path=self.path, written=len(batch))
        self._report_dropped()
        return True

    async def _write_one_by_one(self, batch: list[UsageRow], error: Exception) -> None:
        """A batch failed for something in a row, not the disk: each row alone, the ones that
        fail again dropped (an event names them), so that one bad row never holds up the rest."""
        lost = []
        for row in batch:
            try:
                await trio.to_thread.run_sync(self.database.insert, [row])
            except Exception:  # noqa: BLE001 - the same decision, row by row
                lost.append(row.request_id)
        self.backlog.written(len(batch))
        if lost:
            self.events.emit("usage_rows_lost", "error", path=self.path, lost=len(lost), request_ids=lost[:20],
                             detail=f"rows no database accepts: {type(error).__name__}: {error}")

    def _report_dropped(self) -> None:
        if dropped := self.backlog.take_dropped():
            self.events.emit("usage_rows_dropped", "warning", path=self.path, dropped=dropped,
                             pending=len(self.backlog.rows))
