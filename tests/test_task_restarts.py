"""Each restartable task of a running steward, raised inside in turn under load (issue 26): the
service keeps serving, the task comes back, health says so, and no request and no usage row
that was handed over is lost.

Steward runs in this test's own trio run (``run_steward``, the tree ``steward run`` runs), in
front of a real fake llama-server process, so that a fault can be put inside one task with
``monkeypatch``: each fault raises once, in its task only. Clients call it over real sockets
the whole time, two at once. Slow: real processes and sockets, and each restart waits out its
backoff (supervise.py's default, 1 s).
"""

from __future__ import annotations

import functools
import inspect
import sqlite3
from collections.abc import Awaitable, Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import yaml

from fakes import simgpu
from supervisor.observe import alerts
from supervisor.observe import events as events_module
from supervisor.auth import watch
from supervisor.config import load_config
from supervisor.reloader import Reloader
from supervisor.tree import StopSignals, Steward, run_steward
from supervisor.units import parse_size
from supervisor.usage import writer
from tests.conftest import fake_model, free_port

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
DEADLINE = 60.0


class InjectedFault(Exception):
    pass


def raise_once_in(task_marker: str, original: Callable[..., Any], fired: list[str]) -> Callable[..., Any]:
    """*original*, except that its first call from a task whose name holds *task_marker* raises
    (supervise.py names each task it runs ``steward: NAME``)."""

    def maybe_raise() -> None:
        if task_marker not in fired and task_marker in trio.lowlevel.current_task().name:
            fired.append(task_marker)
            raise InjectedFault(f"injected into {task_marker}")

    if inspect.iscoroutinefunction(original):
        async def patched_async(*args: Any, **kwargs: Any) -> Any:
            maybe_raise()
            return await original(*args, **kwargs)
        return patched_async

    def patched(*args: Any, **kwargs: Any) -> Any:
        maybe_raise()
        return original(*args, **kwargs)
    return patched


async def wait_for(condition: Callable[[], Awaitable[bool] | bool], what: str) -> None:
    with trio.move_on_after(DEADLINE):
        while True:
            result = condition()
            if not isinstance(result, bool):
                result = await result
            if result:
                return
            await trio.sleep(0.02)
    raise AssertionError(f"not within {DEADLINE}s: {what}")


def usage_rows(path: Path, route: str) -> int:
    if not path.exists():
        return 0
    with closing(sqlite3.connect(path)) as connection:
        return connection.execute("SELECT count(*) FROM requests WHERE route = ?", (route,)).fetchone()[0]


@pytest.mark.slow
async def test_each_restartable_task_raised_inside_under_load_comes_back_and_nothing_is_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = simgpu.create_device(tmp_path / "gpu", total_bytes=parse_size("8GiB"), linger_s=0.05)
    usage_db = tmp_path / "usage.db"
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump({
        "listen": f"127.0.0.1:{free_port()}", "models": {"chat": fake_model("1GiB", gpu_dir=gpu)},
        "log": {"file": str(tmp_path / "events.jsonl"), "terminal": "warning"}, "state_file": None,
        "usage": {"db": str(usage_db)}, "auth": {"keys_file": str(tmp_path / "keys.json"), "reload_interval": "0.1s"},
        "gpu": {"probe": "simulated", "simulated_dir": str(gpu), "poll_interval": "0.1s"},
        "health": {"interval": "0.1s"}, "alerts": {"webhook": f"http://127.0.0.1:{free_port()}/alerts",
                                                  "timeout": "1s", "min_interval": "1s"},
        "engines": {"stop_grace": "3s"}}))
    config = load_config(config_path)
    fired: list[str] = []
    statuses: list[int] = []
    stop = StopSignals()

    async with trio.open_nursery() as nursery:
        steward: Steward = await nursery.start(functools.partial(run_steward, config, stop, config_path=config_path))
        events = steward.events
        seen: list[tuple[str, dict[str, Any]]] = []  # events.recent keeps the last 200 only: requests push them out
        events.listeners.append(lambda event: seen.append((event.name, event.fields)) if event.name.startswith(
            "task_") else None)
        async with httpx.AsyncClient(base_url=steward.url, timeout=30) as http:

            async def load() -> None:
                while not stop.requested.is_set():
                    answer = await http.post("/v1/chat/completions", json=CHAT)
                    statuses.append(answer.status_code)

            async def failed_and_back(task: str) -> None:
                await wait_for(lambda: ("task_restarted", task) in [(name, f["task"]) for name, f in seen],
                               f"{task} restarted")
                health = (await http.get("/healthz")).json()
                assert health["status"] == "degraded"
                assert f"steward's task {task!r} failed 1 time(s) in the last 5m" in health["reasons"]
                assert health["tasks"][task]["state"] == "running" and health["tasks"][task]["failures"] == 1
                assert [f["fatal"] for name, f in seen if name == "task_failed" and f["task"] == task] == [False]
                served = len(statuses)
                await wait_for(lambda: len(statuses) > served + 2, "requests go on being served")

            async with trio.open_nursery() as clients:
                for _ in range(2):
                    clients.start_soon(load)
                await wait_for(lambda: len(statuses) >= 4, "the first requests")

                # The event log's writer: an event it cannot take.
                write = events_module.EventLogWriter._write

                def poisoned(self: Any, event: Any) -> None:
                    if event.name == "chaos":
                        raise InjectedFault("an event the writer cannot take")
                    write(self, event)

                monkeypatch.setattr(events_module.EventLogWriter, "_write", poisoned)
                events.emit("chaos", "info")
                await failed_and_back("event log writer")

                # The alerter, as it delivers an alert (health entering overloaded is one).
                monkeypatch.setattr(alerts, "_deliver", raise_once_in("alerts", alerts._deliver, fired))
                events.emit("health", "warning", status="overloaded", previous="degraded", reasons=["a test"])
                await failed_and_back("alerts")

                # The usage writer, between two batches.
                monkeypatch.setattr(writer._Writer, "_write_batch",
                                    raise_once_in("usage log writer", writer._Writer._write_batch, fired))
                await failed_and_back("usage log writer")

                # The key watcher, the GPU probe and the health watch, each in its own loop.
                monkeypatch.setattr(watch, "_signature", raise_once_in("key file watcher", watch._signature, fired))
                await failed_and_back("key file watcher")
                monkeypatch.setattr(trio, "sleep", raise_once_in("gpu probe", trio.sleep, fired))
                await failed_and_back("gpu probe")
                monkeypatch.setattr(trio, "sleep", raise_once_in("health watch", trio.sleep, fired))
                await failed_and_back("health watch")

                # The reloader, in the middle of a reload: its caller is answered, never left waiting.
                monkeypatch.setattr(Reloader, "reload", raise_once_in("reloader", Reloader.reload, fired))
                answer = await http.post("/admin/reload")
                assert answer.status_code == 422 and "failed while reloading" in answer.text
                await failed_and_back("reloader")
                assert (await http.post("/admin/reload")).status_code == 200  # it reloads again

                assert fired == ["alerts", "usage log writer", "key file watcher", "gpu probe", "health watch",
                                 "reloader"]
                stop.requested.set()  # the clients stop; steward drains and stops
            assert statuses and set(statuses) <= {200, 503}  # 503 only for the last ones, sent as it stops
            served = statuses.count(200)
            assert served == len(statuses) - statuses.count(503) and statuses.count(503) <= 2
    # Every request that was answered has its row, the ones written while the writer was down too.
    assert usage_rows(usage_db, "/v1/chat/completions") == len(statuses)
