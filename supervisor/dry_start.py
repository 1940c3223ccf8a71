"""What `steward run` opens at start, opened the same way by `steward check`, so that a config
check accepts is one run starts with.

Each check calls the very function run calls (the event log's ``open_event_log``, the usage
log's ``open_usage_database``, the engines' ``pick_port``) and says what it raised, in its
words: a usage log on a directory, on /dev/null or in a folder that does not exist, an event
log under /proc, an engine host that is no address of this machine. A file that did not exist
before is removed again: check leaves nothing behind.

Not opened: an event log on a named pipe (opening it waits for a reader; run waits too) and
anything not a regular file is left as it is.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
from collections.abc import Iterator

from supervisor.config import Config
from supervisor.address import pick_port
from supervisor.observe.events import EventLogUnavailable, open_event_log
from supervisor.usage.writer import UsageLogUnavailable, open_usage_database

# What SQLite may leave beside a database it created (removed by its last close, unless it failed).
_SQLITE_COMPANIONS = ("-wal", "-shm", "-journal")


def dry_start_problems(config: Config) -> list[str]:
    """What `steward run` would refuse to start with, or fail at an engine's first start for."""
    problems = []
    if config.log.file is not None and not _is_pipe(config.log.file):
        with _leaving_no_new_file(config.log.file):
            try:
                _, writer = open_event_log(config.log.file, terminal=io.StringIO(), max_size=config.log.max_size,
                                           keep=config.log.keep)
            except EventLogUnavailable as exc:
                problems.append(str(exc))
            else:
                writer.close()
    if config.usage.db is not None:
        with _leaving_no_new_file(config.usage.db, _SQLITE_COMPANIONS):
            try:
                open_usage_database(config.usage.db).close()
            except UsageLogUnavailable as exc:
                problems.append(str(exc))
    return problems + engine_host_problems(config)


def engine_host_problems(config: Config) -> list[str]:
    """engines.host must be an address of this machine: each engine started there gets a port picked on it."""
    if not any(model.command is not None for model in config.models.values()):
        return []
    try:
        pick_port(config.engines.host)
    except OSError as exc:
        return [f"engines.host: steward cannot listen on {config.engines.host} here ({exc.strerror or exc}): "
                f"its engines are started on this machine, at this address"]
    return []


def _is_pipe(path: str) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def _leaving_no_new_file(path: str, companions: tuple[str, ...] = ()) -> Iterator[None]:
    """Whatever the body creates at *path* (and *path* + each of *companions*) is removed after it."""
    existed = {name: os.path.lexists(name) for name in (path, *(path + suffix for suffix in companions))}
    try:
        yield
    finally:
        for name, there in existed.items():
            if not there and os.path.isfile(name):
                with contextlib.suppress(OSError):
                    os.remove(name)
