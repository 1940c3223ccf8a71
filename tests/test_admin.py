"""The admin API: /admin/state (what steward top draws), /admin/events (the event log, live)
and an admin's load, unload, pin and unpin, through the scheduler."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from supervisor.observe.events import Event
from supervisor.gateway.admin import admin_state
from supervisor.observe.health import Health, HealthStatus
from supervisor.scheduler.core import Scheduler
from supervisor.scheduler.types import EngineAction, EngineProfile, EngineStatus, StartEngine, StopEngine
from tests.conftest import StewardFactory, fake_model

GIB = 1024**3


def test_the_state_has_memory_by_tier_engines_queues_and_why_they_wait() -> None:
    s = Scheduler.create([16 * GIB, 12 * GIB], [EngineProfile("chat", 8 * GIB, 2, pinned=True),
                                              EngineProfile("embed", 2 * GIB, 1), EngineProfile("big", 11 * GIB, 1)])
    s.start(0.0)
    s.engine_ready("chat", 1, "http://127.0.0.1:1", 1.0)
    s.submit(1, "embed", "interactive", 2.0)
    s.engine_ready("embed", 1, "http://127.0.0.1:2", 3.0)
    s.finish(1, 4.0)  # embed is hot for 5 minutes
    s.submit(2, "big", "batch", 10.0)  # fits device 1 only, where the hot embed is: waits
    health = Health(HealthStatus.OK, (), {}, {}, {})
    recent = [Event("load", "info", {"engine": "chat"}, 100.0, 0.0), Event("mode", "debug", {}, 101.0, 1.0),
              Event("reject", "warning", {"reason": "queue_full"}, 102.0, 2.0)]
    state = admin_state(s.snapshot(explained=True), health, recent, "gpu", now=12.0, wall=1000.0)
    assert state["version"] == 1 and state["health"] == {"status": "ok", "reasons": []}
    gpu0, gpu1 = state["devices"]
    assert gpu0["device"] == "gpu0" and gpu0["tiers"]["pinned"] == 8 * GIB and gpu0["reserved"] == 8 * GIB
    assert gpu1["tiers"]["hot"] == 2 * GIB  # embed went where most was left
    engines = {e["name"]: e for e in state["engines"]}
    assert engines["embed"]["hot_until"] == 1000.0 + 304.0 - 12.0 and engines["embed"]["idle_s"] == 8.0
    assert engines["chat"]["generation"] == 1 and engines["chat"]["devices"] == ["gpu0"]
    assert state["classes"]["batch"] == {"queued": 1, "running": 0, "oldest_wait_s": 2.0, "held": 0}
    assert (state["nodes"], state["held"]) == ([], [])  # no fleet: no node, nothing held for one
    [waiting] = state["waiting"]
    assert (waiting["model"], waiting["reason"]) == ("big", "no_room")
    assert "the only idle engine (embed) is hot until" in waiting["why"]
    assert [e["event"] for e in state["events"]] == ["load", "reject"]  # not the debug ones
    assert [e["reason"] for e in state["rejections"]] == ["queue_full"]


def test_load_unload_pin_and_unpin_go_by_the_schedulers_rules() -> None:
    s = Scheduler.create(16 * GIB, [EngineProfile("a", 8 * GIB, 1), EngineProfile("b", 10 * GIB, 1)])
    problem, effects = s.control("a", EngineAction.LOAD, 0.0)
    assert problem is None and [e for e in effects if isinstance(e, StartEngine)] == [StartEngine("a", 1)]
    s.engine_ready("a", 1, "http://127.0.0.1:1", 1.0)
    problem, effects = s.control("b", EngineAction.LOAD, 2.0)  # a must go: it is idle and cold, so it does
    assert problem is None and [e.engine for e in effects if isinstance(e, StopEngine)] == ["a"]
    assert [e for e in s.engine_exited("a", 1, 3.0, "stopped") if isinstance(e, StartEngine)] == [StartEngine("b", 1)]
    s.engine_ready("b", 1, "http://127.0.0.1:2", 4.0)
    s.submit(1, "b", "interactive", 5.0)  # b busy: an unload drains it first
    problem, effects = s.control("b", EngineAction.UNLOAD, 6.0)
    assert problem is None and s.engines["b"].status is EngineStatus.DRAINING
    assert not [e for e in effects if isinstance(e, StopEngine)]
    assert [e.engine for e in s.finish(1, 7.0) if isinstance(e, StopEngine)] == ["b"]
    s.engine_exited("b", 1, 8.0, "stopped")
    problem, effects = s.control("a", EngineAction.PIN, 9.0)  # pinned: loaded at once, never evicted
    assert problem is None and [e for e in effects if isinstance(e, StartEngine)] == [StartEngine("a", 2)]
    assert s.control("a", EngineAction.UNLOAD, 9.5)[0] == "a is pinned: unpin it first"
    assert s.control("a", EngineAction.UNPIN, 10.0)[0] is None and not s.engines["a"].profile.pinned
    assert s.control("b", EngineAction.UNLOAD, 10.0)[0] == "b is stopped, not loaded"


def read_events(url: str, into: list[dict[str, Any]], ready: threading.Event) -> None:
    with httpx.stream("GET", url, timeout=60) as stream:
        ready.set()
        for line in stream.iter_lines():
            if line.startswith("data: "):
                into.append(json.loads(line[6:]))


@pytest.mark.slow
def test_the_admin_api_of_a_running_steward(start_steward: StewardFactory) -> None:
    steward = start_steward({"chat": fake_model("4GiB"), "embed": fake_model("2GiB")},
                            gpu={"probe": "none", "budget": "16GiB"})
    seen: list[dict[str, Any]] = []
    connected = threading.Event()
    reader = threading.Thread(target=read_events, args=(f"{steward.url}/admin/events?event=load,admin", seen,
                                                        connected))
    reader.start()
    assert connected.wait(20)
    loaded = httpx.post(f"{steward.url}/admin/engines/chat/load", timeout=30)
    assert loaded.status_code == 200 and loaded.json()["status"] == "starting"
    steward.wait_event("ready", engine="chat")
    assert httpx.post(f"{steward.url}/admin/engines/chat/pin", timeout=30).json()["pinned"] is True
    refused = httpx.post(f"{steward.url}/admin/engines/chat/unload", timeout=30)
    assert refused.status_code == 409 and refused.json()["error"]["message"] == "chat is pinned: unpin it first"
    assert httpx.post(f"{steward.url}/admin/engines/chat/unpin", timeout=30).status_code == 200
    assert httpx.post(f"{steward.url}/admin/engines/chat/unload", timeout=30).json()["draining"] is True
    steward.wait_event("stopped", engine="chat")
    assert httpx.post(f"{steward.url}/admin/engines/nope/load").status_code == 404
    assert httpx.post(f"{steward.url}/admin/engines/chat/explode").status_code == 404
    state = httpx.get(f"{steward.url}/admin/state", timeout=10).json()
    assert {e["name"]: e["status"] for e in state["engines"]} == {"chat": "stopped", "embed": "stopped"}
    deadline = time.monotonic() + 10
    while len([e for e in seen if e["event"] == "admin"]) < 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [e["event"] for e in seen][:2] == ["admin", "load"]  # only what was asked for, as it happened
    assert [e["action"] for e in seen if e["event"] == "admin"] == ["load", "pin", "unload", "unpin", "unload"]
    # An open event stream never holds steward's shutdown open: it ends as the drain begins.
    assert steward.stop() == 0
    reader.join(20)
    assert not reader.is_alive() and steward.events("shutdown_cut") == []
