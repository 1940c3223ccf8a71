"""A spawn that raises is a failed start of that engine or service, never an exception that ends
its task (and with it steward).

Before: ``open_child`` let a ValueError through (a NUL byte in an argument: ``embedded null
byte``), and the engine task, which caught OSError only, took the whole service down at the
first request for the model; an engines.host that is no address of this machine did the same
from ``pick_port``. `steward check` refuses both now (tests/test_config_refusals.py); these
tests put such values past it, to prove the engine side contains them on its own.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
import trio.testing

from supervisor.engines import process
from supervisor.backoff import Backoff
from supervisor.config import parse_config
from supervisor.config_policy import engine_profiles, engine_specs, scheduling_policy
from supervisor.engines.driver import serve_engine
from supervisor.observe.events import EventLog
from supervisor.engines.memory_plan import MemoryPlan
from supervisor.scheduler.actor import open_scheduler_mailbox, serve_scheduler
from supervisor.scheduler.core import Scheduler
from supervisor.engines.service import serve_service_process
from tests.harness import GIB, LOAD_S, ScriptedEngine, hold

TRUE = [sys.executable, "-c", "pass"]


def event_log() -> EventLog:
    send, _receive = trio.open_memory_channel[Any](math.inf)
    return EventLog(send, recent_max=10_000)


def not_executable(tmp_path: Path) -> str:
    path = tmp_path / "not-a-program"
    path.write_text("just text, no #! line\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize(("argv", "env", "why"), [
    (["/no/such/program"], {}, "No such file or directory"),
    (["/"], {}, "Permission denied"),
    ([*TRUE, "a\0b"], {}, "embedded null byte"),
    ([*TRUE, "\ud800"], {}, "surrogates not allowed"),
    (TRUE, {"A": "b\0c"}, "embedded null byte"),
    (TRUE, {"A=B": "c"}, "illegal environment variable name"),
])
def test_every_way_a_spawn_fails_is_one_spawn_error_naming_the_program(argv: list[str], env: dict[str, str],
                                                                       why: str) -> None:
    with pytest.raises(process.SpawnError, match=why) as caught:
        process.open_child(argv, env)
    assert str(caught.value).startswith(f"cannot run {argv[0]!r}: ")


def test_an_exec_format_error_is_a_spawn_error(tmp_path: Path) -> None:
    program = not_executable(tmp_path)
    with pytest.raises(process.SpawnError, match="Exec format error"):
        process.open_child([program])


def scheduled(config: Any) -> tuple[dict[str, Any], Scheduler, Any, Any]:
    """The engines' specs of *config*, and a scheduler core for them (16 GiB, 1 GiB each) with its mailbox."""
    specs = engine_specs(config)
    plans = {name: MemoryPlan(GIB, "config", name) for name in specs}
    core = Scheduler.create([16 * GIB], engine_profiles(config, specs, plans), scheduling_policy(config))
    client, mailbox = open_scheduler_mailbox(core)
    return specs, core, client, mailbox


# What the config refuses now, as if something had let it through: a NUL in an argument, an
# engine host that is no address here (192.0.2.1: TEST-NET-1, never a local address).
BREAKAGES = [
    ({"args": ["--alias", "a\0b"]}, "127.0.0.1", f"cannot run {sys.executable!r}: embedded null byte"),
    ({}, "192.0.2.1", "cannot pick a port on 192.0.2.1: Cannot assign requested address"),
]


@pytest.mark.parametrize(("model", "host", "detail"), BREAKAGES, ids=["nul-in-an-argument", "engine-host-not-here"])
async def test_an_engine_whose_spawn_raises_fails_its_start_and_steward_serves_on(
        autojump_clock: trio.testing.MockClock, model: dict[str, Any], host: str, detail: str) -> None:
    """One engine's spawn raises at every start: its requests fail with engine_start_failed,
    it is tried again after the backoff, and the other engine serves."""
    config = parse_config({"models": {"broken": {"command": TRUE, "memory": "1GiB"},
                                      "good": {"command": TRUE, "memory": "1GiB"}},
                           "engines": {"restart_backoff": "1s", "restart_backoff_max": "8s"}})
    config = attrs.evolve(config, models={**config.models, "broken": attrs.evolve(config.models["broken"], **model)},
                          engines=attrs.evolve(config.engines, host=host))
    specs, core, client, mailbox = scheduled(config)
    events = event_log()
    log: list[tuple[str, float]] = []
    async with httpx.AsyncClient() as http, trio.open_nursery() as nursery:
        good = ScriptedEngine("good", nursery, client)
        handles: dict[str, Any] = {"good": good}
        handles["broken"] = await nursery.start(serve_engine, specs["broken"], client, events, http)
        await nursery.start(serve_scheduler, core, mailbox, handles, events)
        await hold(client, "broken", 1.0, log)
        await hold(client, "broken", 1.0, log)
        await hold(client, "good", 1.0, log)
        nursery.cancel_scope.cancel()
    # Failed at once, tried again after the 1 s backoff; the good engine loads meanwhile (LOAD_S).
    assert log == [("failed engine_start_failed", 0.0), ("failed engine_start_failed", 1.0),
                   ("granted good good", 1.0 + LOAD_S)]
    failed = [e for e in events.recent if e.name == "spawn_failed"]
    assert [(e.mono, e.fields["engine"]) for e in failed] == [(0.0, "broken"), (1.0, "broken")]
    assert failed[0].fields["detail"] == detail
    assert [e.mono for e in events.recent if e.name == "restart"] == [1.0]


async def test_a_service_whose_spawn_raises_is_restarted_with_backoff(autojump_clock: trio.testing.MockClock) -> None:
    """`ollama serve` or ComfyUI with an argument exec cannot take: a spawn_failed event and a
    restart after each delay of its backoff, never an exception out of the service's task."""
    events = event_log()
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_service_process, "comfyui", [*TRUE, "a\0b"], {}, events, Backoff(0.5, 2.0))
        await trio.sleep(10)
        nursery.cancel_scope.cancel()
    failed = [e.mono for e in events.recent if e.name == "spawn_failed"]
    assert failed == [0.0, 0.5, 1.5, 3.5, 5.5, 7.5, 9.5]  # after 0.5, 1, 2, 2, ... s: the backoff, capped
    assert [e.fields["restart_in_s"] for e in events.recent if e.name == "restart"] == [0.5, 1.0, 2.0, 2.0, 2.0, 2.0,
                                                                                       2.0]


async def test_a_bug_while_driving_an_engine_ends_that_generation_as_a_crash_and_the_engine_loads_again(
        autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Anything raised in the engine's own driver (not its process) is contained in engines/driver.py:
    an internal_error, the generation counted as a crash, a restart after the backoff."""
    from supervisor.engines import driver as engine_module

    failures = [RuntimeError("a driver's bug")]

    async def failing_once(engine: Any, generation: int, placement: Any) -> Any:
        if failures:
            raise failures.pop()
        return engine_module.Ended(engine_module.EndKind.EXITED, "exited with status 0")

    monkeypatch.setattr(engine_module, "_run_spawned", failing_once)
    config = parse_config({"models": {"chat": {"command": TRUE, "memory": "1GiB"}},
                           "engines": {"restart_backoff": "1s", "restart_backoff_max": "8s"}})
    specs, core, client, mailbox = scheduled(config)
    events = event_log()
    log: list[tuple[str, float]] = []
    async with httpx.AsyncClient() as http, trio.open_nursery() as nursery:
        handles: dict[str, Any] = {"chat": await nursery.start(serve_engine, specs["chat"], client, events, http)}
        await nursery.start(serve_scheduler, core, mailbox, handles, events)
        await hold(client, "chat", 1.0, log)
        await hold(client, "chat", 1.0, log)
        nursery.cancel_scope.cancel()
    [error] = [e for e in events.recent if e.name == "internal_error"]
    assert (error.mono, error.fields["source"], error.fields["error"]) == (0.0, "engine chat",
                                                                          "RuntimeError: a driver's bug")
    crash = [e for e in events.recent if e.name == "crash"][0]
    assert "steward failed while driving it (RuntimeError: a driver's bug)" in crash.fields["detail"]
    assert [e.mono for e in events.recent if e.name == "restart"] == [1.0]  # and the engine task serves on
