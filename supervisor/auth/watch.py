"""Keys added and removed while steward runs: the key file is looked at every ``interval``.

Polling ``os.stat`` (inode, mtime, size, mode) rather than inotify: it works the same on every
filesystem and in every container, and once a second is nothing for one small file. A key file
that turns bad while steward runs (a half-finished hand edit, a chmod 644) is reported and
ignored: the keys in force stay until the file is good again, so a typo never opens the door
nor locks everyone out. A bad file at start is an error: steward refuses to start.

Events (docs/events.md): ``keys_loaded`` at start and after each change (names only, never a
key or its hash), ``keys_file_invalid`` when a changed file cannot be used.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NoReturn

import trio

from supervisor.auth.keys import KeyFile, KeyFileError, KeyTable, load_key_file
from supervisor.observe.events import EventLog

# What changes when the file is replaced (inode), written (mtime, size) or chmod-ed (mode);
# None: there is no file; an errno: stat itself failed.
_Signature = tuple[int, int, int, int] | int | None


async def serve_key_file(path: str, events: EventLog, on_change: Callable[[KeyTable], None], *,
                         interval: float = 1.0,
                         task_status: trio.TaskStatus[KeyTable] = trio.TASK_STATUS_IGNORED) -> NoReturn:
    """Load the key file (a missing one has no keys), call ``on_change`` with it, then again after
    each change that loads. Raises KeyFileError before ``started`` if the file is bad at start."""
    signature = _signature(path)
    table = KeyTable.from_key_file(load_key_file(path))
    on_change(table)
    _emit_loaded(events, path, KeyTable.from_key_file(KeyFile()), table)
    task_status.started(table)
    invalid = False
    while True:
        await trio.sleep(interval)
        now_signature = _signature(path)
        if now_signature == signature:
            continue
        signature = now_signature  # taken before reading: a change during the read is seen next time
        try:
            loaded = KeyTable.from_key_file(load_key_file(path))
        except KeyFileError as exc:
            events.emit("keys_file_invalid", "warning", path=path, detail="; ".join(exc.problems))
            invalid = True
            continue
        changed = loaded.keys != table.keys
        if changed or invalid:  # after an invalid file, say that it is good again even if nothing changed
            _emit_loaded(events, path, table, loaded)
        invalid = False
        if changed:
            table = loaded
            on_change(table)


def _emit_loaded(events: EventLog, path: str, before: KeyTable, after: KeyTable) -> None:
    old = {key.name: key for key in before.keys}
    new = {key.name: key for key in after.keys}
    events.emit("keys_loaded", "info", path=path, keys=len(after),
                added=[name for name in new if name not in old],
                removed=[name for name in old if name not in new],
                changed=[name for name, key in new.items() if name in old and old[name] != key])


def _signature(path: str) -> _Signature:
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc.errno
    except ValueError:  # a NUL in the path: loading says so
        return -1
    return stat.st_ino, stat.st_mtime_ns, stat.st_size, stat.st_mode
