"""Why a request waits, in words (supervisor.scheduler.explain), from the pure core with exact
times, and as /healthz says it from a real steward."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from supervisor.scheduler.core import Scheduler
from supervisor.scheduler.explain import WaitReason, explain
from supervisor.scheduler.types import Emit, EngineProfile, EngineStatus, SchedulingPolicy
from tests.conftest import StewardFactory, fake_model

GIB = 1024**3


def wall_offset_for(at: float, clock: str) -> float:
    """The offset that makes core time *at* read as *clock* (HH:MM:SS) on the local wall clock."""
    hours, minutes, seconds = map(int, clock.split(":"))
    return time.mktime((2026, 12, 1, hours, minutes, seconds, 0, 0, -1)) - at


def ready(s: Scheduler, name: str, now: float) -> None:
    s.engine_ready(name, s.engines[name].generation, "http://127.0.0.1:9000", now)


def waiting_events(effects: list) -> list[dict]:
    return [e.fields for e in effects if isinstance(e, Emit) and e.event == "waiting"]


def test_a_background_request_whose_only_victim_is_hot_says_so_and_when_that_ends() -> None:
    # The user's case: Ollama was used interactively, so it is hot for 5 minutes, and background
    # work may not evict a hot engine: the request waits, and says why, in words.
    s = Scheduler.create(10 * GIB, [EngineProfile("ollama", 8 * GIB, 4), EngineProfile("gemma4-e2b", 4 * GIB, 1)],
                         SchedulingPolicy(hot_window=300.0))
    s.wall_offset = wall_offset_for(301.0, "10:32:15")
    s.submit(1, "ollama", "interactive", 0.0)
    ready(s, "ollama", 0.5)
    s.finish(1, 1.0)
    assert waiting_events(s.submit(2, "gemma4-e2b", "background", 10.0, timeout=600)) == []
    why = ("background request for gemma4-e2b waits: needs 4.0 GiB, 2.0 GiB free; "
           "the only idle engine (ollama) is hot until 10:32:15")
    assert explain(s, s.waiting[2]) == explain(s, s.waiting[2]).__class__(WaitReason.NO_ROOM, why)
    assert [(line.reason, line.why) for line in s.snapshot(explained=True).lines] == [("no_room", why)]
    # Said in an event once it has waited 5 s, then at 10 s, 20 s, ... of waiting.
    assert s.next_wakeup() == 13.0  # the starvation clock (nothing else runs)
    assert waiting_events(s.tick(13.0)) == [] and s.next_wakeup() == 15.0
    [event] = waiting_events(s.tick(15.0))
    assert (event["job"], event["class"], event["model"], event["waited_s"], event["reason"], event["why"]) == (
        2, "background", "gemma4-e2b", 5.0, "no_room", why)
    assert s.next_wakeup() == 20.0
    assert waiting_events(s.tick(20.0))[0]["waited_s"] == 10.0
    assert waiting_events(s.tick(28.0)) == []  # (the starvation guard's gap wait)
    assert waiting_events(s.tick(30.0))[0]["waited_s"] == 20.0
    # Once ollama is no longer hot, the request evicts it: no longer waiting for that reason.
    s.tick(301.0)
    assert s.engines["ollama"].status is EngineStatus.STOPPING


def test_each_reason_the_core_can_give() -> None:
    s = Scheduler.create(16 * GIB, [EngineProfile("chat", 8 * GIB, 1), EngineProfile("embed", 2 * GIB, 1),
                                    EngineProfile("big", 12 * GIB, 1, pinned=False)],
                         SchedulingPolicy(interactive_window=2.0))
    s.wall_offset = wall_offset_for(0.0, "09:00:00")
    s.submit(1, "chat", "interactive", 0.0)
    assert explain(s, s.waiting[1]).why == "interactive request for chat waits: chat is loading (for 0ms)"
    s.submit(2, "chat", "interactive", 0.5)
    assert explain(s, s.waiting[2]).reason is WaitReason.IN_LINE
    assert explain(s, s.waiting[2]).why == ("interactive request for chat waits: 1 older interactive request(s) "
                                            "for chat go first (the first waits: chat is loading (for 500ms))")
    ready(s, "chat", 1.0)  # job 1 runs, job 2 waits for its one slot
    assert explain(s, s.waiting[2]).why == "interactive request for chat waits: all 1 slot(s) of chat are busy"
    s.submit(3, "embed", "batch", 1.0)
    assert explain(s, s.waiting[3]).why == ("batch request for embed waits: 1 interactive step(s) running; "
                                            "the starvation guard lets one step through beside them, "
                                            "not before 09:00:11")
    s.finish(1, 2.0)
    s.finish(2, 3.0)  # the interactive window stays open 2 s after the last interactive step
    assert explain(s, s.waiting[3]).reason is WaitReason.INTERACTIVE_WINDOW
    assert explain(s, s.waiting[3]).why.endswith("the interactive window is open until 09:00:05; "
                                                 "the starvation guard lets one step through beside chats, "
                                                 "not before 09:00:11")
    s.submit(4, None, "interactive", 3.0, exclusive_memory=16 * GIB)
    assert explain(s, s.waiting[4]).why == ("interactive image job waits: needs 16.0 GiB of the GPU; "
                                            "unloading chat")
    assert explain(s, s.waiting[3]).why == ("batch request for embed waits: an image job (interactive) is next: "
                                            "work drains for it")


@pytest.mark.slow
def test_healthz_says_why_each_line_waits(start_steward: StewardFactory) -> None:
    steward = start_steward({"chat": fake_model("8GiB"), "gemma": fake_model("4GiB")},
                            gpu={"probe": "none", "budget": "10GiB"})
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(f"{steward.base_url}/chat/completions", json={"model": "chat", **chat}, timeout=30).is_success
    # A background request that cannot evict the hot chat engine: it waits (until steward stops).
    answers: list[int] = []
    waiter = threading.Thread(target=lambda: answers.append(httpx.post(
        f"{steward.base_url}/chat/completions", json={"model": "gemma", **chat},
        headers={"x-steward-class": "background"}, timeout=60).status_code))
    waiter.start()
    try:
        deadline = time.monotonic() + 20
        # Held first by the interactive window (2 s after the chat), then for want of room.
        waiting = steward.health()["waiting"]
        while [w["reason"] for w in waiting] != ["no_room"] and time.monotonic() < deadline:
            time.sleep(0.05)
            waiting = steward.health()["waiting"]
    finally:
        steward.stop()
        waiter.join(30)
    assert answers == [503]  # told at shutdown, not left hanging
    [line] = waiting
    assert (line["class"], line["model"], line["waiting"], line["reason"]) == ("background", "gemma", 1, "no_room")
    assert line["why"].startswith("background request for gemma waits: needs 4.0 GiB, 2.0 GiB free; "
                                  "the only idle engine (chat) is hot until ")
