"""Fewer swaps (issue 16): the swap hold and the cost-based choice of victim, in exact
virtual time. Pure calls to the core with explicit times, and the actor on MockClock with
scripted engines for the thrash pattern; times are binary fractions, so every assertion
is an equality.

Three 6 GiB models on 12 GiB make room for two: the third must evict one of them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from supervisor.observe.events import Event
from supervisor.engines.measurements import MeasurementStore
from supervisor.observe.metrics import StewardMetrics
from supervisor.scheduler.core import Scheduler
from supervisor.scheduler.explain import WaitReason, explain
from supervisor.scheduler.types import (
    Effect,
    Emit,
    EngineProfile,
    EngineStatus,
    Grant,
    SchedulingPolicy,
    StartEngine,
    StopEngine,
)
from tests.conftest import StewardFactory, fake_model
from tests.harness import GIB, client_loop, start_harness


def model(name: str, gib: float = 6, *, pinned: bool = False) -> EngineProfile:
    return EngineProfile(name, int(gib * GIB), 1, pinned=pinned)


def make(*profiles: EngineProfile, budget: float = 12, swap_hold: float = 30.0, hot_window: float = 300.0,
         ) -> Scheduler:
    # No starvation guard: a lower class waits for the higher ones, exactly.
    starvation = {"interactive": 0.0, "background": 0.0, "batch": 0.0}
    policy = SchedulingPolicy(starvation=starvation, swap_hold=swap_hold, hot_window=hot_window)
    return Scheduler.create(int(budget * GIB), profiles, policy)


def emitted(effects: list[Effect], name: str) -> list[dict[str, object]]:
    return [e.fields for e in effects if isinstance(e, Emit) and e.event == name]


def acts(effects: list[Effect]) -> list[Effect]:
    return [e for e in effects if isinstance(e, Grant | StartEngine | StopEngine)]


def loaded(s: Scheduler, name: str, klass: str, job: int, at: float, ready: float) -> None:
    """Load *name* for one step of *klass*, asked at *at*, ready (and granted) at *ready*."""
    s.submit(job, name, klass, at)
    assert s.engines[name].status is EngineStatus.STARTING
    s.engine_ready(name, s.engines[name].generation, f"http://127.0.0.1:1/{name}", ready)
    assert job in s.running


def granted(effects: list[Effect], job: int) -> bool:
    return any(isinstance(e, Grant) and e.job_id == job for e in effects)


# ---- the swap hold ------------------------------------------------------------------

def busy_pair(swap_hold: float) -> Scheduler:
    """a and b loaded (a in 1 s, b in 2 s) and each running a background step."""
    s = make(model("a"), model("b"), model("c"), swap_hold=swap_hold)
    loaded(s, "a", "background", 1, 0.0, 1.0)
    loaded(s, "b", "background", 2, 0.0, 2.0)
    return s


def test_a_request_is_overtaken_for_loaded_models_until_exactly_its_swap_hold_then_its_victim_drains() -> None:
    s = busy_pair(swap_hold=30.0)
    effects = s.submit(3, "c", "background", 2.5)  # c would evict a busy engine
    assert acts(effects) == []
    assert emitted(effects, "swap_held") == [{
        "job": 3, "request": 3, "model": "c", "class": "background", "hold_until": 32.5, "hold_s": 30.0,
        "waited_s": 0.0, "behind": ["a", "b"], "would_evict": ["a"]}]
    assert not s.engines["a"].draining and not s.engines["b"].draining
    assert explain(s, s.waiting[3]).reason is WaitReason.SWAP_HOLD
    # Younger requests for the loaded models go first, again and again.
    s.finish(1, 4.0)
    assert granted(s.submit(4, "a", "background", 4.5), 4)
    s.finish(2, 8.0)
    assert granted(s.submit(5, "b", "background", 8.5), 5)
    # Time passes with no other input: every wakeup before the hold's end decides nothing...
    while (wakeup := s.next_wakeup()) is not None and wakeup < 32.5:
        assert emitted(s.tick(wakeup), "evict") == []
    assert wakeup == 32.5  # ...and its end is one: the core acts exactly then
    effects = s.tick(32.5)
    # Then it is served as strict arrival order would: a (cheaper to load again) drains for it.
    [evict] = emitted(effects, "evict")
    assert (evict["engine"], evict["for_engine"], evict["in_flight"]) == ("a", "c", 1)
    assert s.engines["a"].draining and not s.engines["b"].draining
    assert emitted(effects, "swap_held") == []  # said once
    assert not granted(s.submit(6, "a", "background", 33.0), 6)  # a draining engine takes no new work
    assert acts(s.finish(4, 34.0)) == [StopEngine("a", 1)]
    assert acts(s.engine_exited("a", 1, 35.0, "stopped")) == [StartEngine("c", 1)]


def test_swap_hold_zero_is_strict_arrival_order_as_before() -> None:
    s = busy_pair(swap_hold=0.0)
    effects = s.submit(3, "c", "background", 2.5)
    assert emitted(effects, "swap_held") == []
    assert [e["engine"] for e in emitted(effects, "evict")] == ["a"]  # at once
    s.finish(1, 4.0)
    assert not granted(s.submit(4, "a", "background", 4.5), 4)  # a is on its way out for c


def test_a_hold_ends_as_soon_as_nothing_of_its_class_runs_on_the_loaded_models() -> None:
    s = busy_pair(swap_hold=30.0)
    assert emitted(s.submit(3, "c", "background", 2.5), "swap_held")
    assert emitted(s.finish(1, 4.0), "evict") == []  # b still serves its class
    effects = s.finish(2, 5.0)  # nobody goes first any more: holding it would gain nothing
    assert [e["engine"] for e in emitted(effects, "evict")] == ["a"]
    assert acts(effects) == [StopEngine("a", 1)]


def test_an_older_interactive_request_is_never_held_behind_background_work() -> None:
    s = busy_pair(swap_hold=30.0)
    effects = s.submit(3, "c", "interactive", 2.5)
    assert emitted(effects, "swap_held") == []
    assert [e["engine"] for e in emitted(effects, "evict")] == ["a"]  # drained for it at once


def test_a_background_request_for_a_loaded_model_never_overtakes_a_held_interactive_one() -> None:
    s = make(model("a"), model("b"), model("c"), swap_hold=30.0)
    loaded(s, "b", "background", 1, 0.0, 1.0)
    s.finish(1, 2.0)  # b: loaded, idle, used lately
    loaded(s, "a", "interactive", 2, 2.0, 3.0)  # a chat runs on a
    assert emitted(s.submit(3, "c", "interactive", 4.0), "swap_held")  # held behind the chat on a
    assert not granted(s.submit(4, "b", "background", 5.0), 4)  # b is loaded and idle, but waits
    assert explain(s, s.waiting[4]).reason is WaitReason.INTERACTIVE_WINDOW
    effects = s.tick(34.0)
    assert [e["engine"] for e in emitted(effects, "evict")] == ["b"]  # cold before hot
    assert not granted(effects, 4)


def test_a_load_that_fits_is_never_held() -> None:
    s = make(model("a"), model("b"), model("c"), budget=18, swap_hold=30.0)
    loaded(s, "a", "background", 1, 0.0, 1.0)
    loaded(s, "b", "background", 2, 0.0, 2.0)
    effects = s.submit(3, "c", "background", 2.5)
    assert acts(effects) == [StartEngine("c", 1)]
    assert emitted(effects, "swap_held") == []


def test_a_load_whose_victims_nobody_used_lately_is_never_held() -> None:
    s = make(model("a"), model("b"), model("c"), swap_hold=30.0, hot_window=8.0)
    loaded(s, "a", "background", 1, 0.0, 1.0)
    s.finish(1, 1.5)
    loaded(s, "b", "background", 2, 0.0, 2.0)  # b keeps its class busy
    effects = s.submit(3, "c", "background", 10.0)  # a's only step started 9 s ago: evicting it costs nothing
    assert emitted(effects, "swap_held") == []
    assert acts(effects) == [StopEngine("a", 1)]


def test_a_held_request_says_so_in_metrics() -> None:
    metrics = StewardMetrics()
    metrics.observe(Event("swap_held", "info", {"job": 3, "class": "background"}, 0.0, 0.0))
    assert b'steward_swap_holds_total{class="background"} 1.0' in metrics.render()


async def thrash_loads(nursery: trio.Nursery, swap_hold: float) -> tuple[int, int]:
    """Three agents, each on its own model, asking again 0.5 s after each 2 s answer, for
    two minutes: A B C A B C. (loads decided, steps served)."""
    h = await start_harness(nursery, 12, model("a"), model("b"), model("c"),
                            policy=SchedulingPolicy(swap_hold=swap_hold))
    served: list[tuple[str, float]] = []
    until = trio.current_time() + 120.0
    async with trio.open_nursery() as agents:
        for name in ("a", "b", "c"):
            agents.start_soon(client_loop, h.client, name, "background", 2.0, 0.5, served, until)
            await trio.sleep(0.25)
    return len(h.names("load")), len(served)


async def test_the_thrash_pattern_loads_fewer_models_with_the_swap_hold(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    strict_loads, strict_served = await thrash_loads(nursery, 0.0)
    held_loads, held_served = await thrash_loads(nursery, 30.0)
    assert strict_loads == strict_served  # strict arrival order: a load for every request
    # Held, the requests for a model are served in runs (the exact count depends on how trio
    # orders tasks due at the same instant: 17 to 23 in practice).
    assert held_loads < strict_loads / 2
    assert held_served > strict_served  # and the agents get more done: the GPU loads less


# ---- a guard turn's swap beside chats (rule 4) -------------------------------------------

def chatting(budget: float) -> Scheduler:
    """a (6 GiB) loaded and used by background work, then idle and cold; from 10 s a chat
    computes on its own 6 GiB model; at 12 s a background request arrives for b (6 GiB). The
    guard's turn for it is due at 15 s (3 s of starvation), beside the chat."""
    policy = SchedulingPolicy(interactive_window=2.0, guard_gap_wait=15.0, swap_hold=10.0,
                              starvation={"interactive": 0.0, "background": 3.0, "batch": 10.0})
    s = Scheduler.create(int(budget * GIB), [model("chat"), model("a"), model("b")], policy)
    loaded(s, "a", "background", 1, 0.0, 1.0)
    s.finish(1, 2.0)
    loaded(s, "chat", "interactive", 2, 10.0, 11.0)
    assert acts(s.submit(3, "b", "background", 12.0)) == []
    return s


def test_a_guard_turn_that_would_swap_beside_a_chat_waits_for_the_window_to_close() -> None:
    s = chatting(budget=12)  # b can only go where a is
    assert emitted(s.tick(15.0), "starvation_step") == []  # due, but the chat computes (guard_gap_wait)
    # The chat ends: a gap, in which a step would start, but a swap slows the next chat for
    # all its load; the window closes 2 s later.
    assert acts(s.finish(2, 20.0)) == []
    assert not s.engines["a"].draining
    assert s.next_wakeup() == 22.0
    effects = s.tick(22.0)  # nobody chats: the class is served as usual, and a makes room for b
    assert [(e["engine"], e["for_engine"]) for e in emitted(effects, "evict")] == [("a", "b")]
    assert acts(effects) == [StopEngine("a", 1)]


def test_a_guard_turn_that_would_swap_goes_anyway_guard_gap_wait_after_it_was_due() -> None:
    s = chatting(budget=12)
    assert acts(s.finish(2, 20.0)) == []
    s.submit(4, "chat", "interactive", 20.5)  # the next chat: the window never closes
    while (wakeup := s.next_wakeup()) is not None and wakeup < 30.0:
        assert emitted(s.tick(wakeup), "evict") == []
    assert wakeup == 30.0  # due at 15 s, plus guard_gap_wait
    effects = s.tick(30.0)
    assert [(e["model"], e["load"]) for e in emitted(effects, "starvation_step")] == [("b", True)]
    assert acts(effects) == [StopEngine("a", 1)]


def test_a_guard_turn_that_loads_into_free_memory_goes_in_the_first_gap_between_chats() -> None:
    s = chatting(budget=18)  # b fits beside a and the chat
    assert acts(s.tick(15.0)) == []  # due, but the chat computes
    effects = s.finish(2, 20.0)  # the gap: the window is still open
    assert [(e["model"], e["load"]) for e in emitted(effects, "starvation_step")] == [("b", True)]
    assert acts(effects) == [StartEngine("b", 1)]


# ---- the choice of victim -----------------------------------------------------------

def test_the_victim_is_the_one_cheapest_to_load_again_not_the_least_recently_used() -> None:
    s = make(model("slow"), model("quick"), model("new"), swap_hold=30.0)
    loaded(s, "slow", "background", 1, 0.0, 8.0)  # measured: 8 s to load
    for job, t in ((2, 9.0), (3, 10.0)):
        s.finish(job - 1, t)
        s.submit(job, "slow", "background", t)
    s.finish(3, 11.0)  # three steps, the last ended at 11
    loaded(s, "quick", "background", 4, 19.0, 20.0)  # measured: 1 s; one step, ended at 21
    s.finish(4, 21.0)
    assert s.engines["slow"].last_used < s.engines["quick"].last_used  # least recently used: slow
    effects = s.submit(5, "new", "background", 30.0)
    [evict] = emitted(effects, "evict")
    likely = 1 - math.exp(-0.5)
    assert evict["engine"] == "quick"
    assert {k: evict[k] for k in ("load_s", "load_measured", "recent_uses", "likely", "cost")} == {
        "load_s": 1.0, "load_measured": True, "recent_uses": 0.5, "likely": round(likely, 3),
        "cost": round(likely, 3)}
    assert s.engines["slow"].reload_cost(30.0, 300.0, queued=False).cost == 8 * (1 - math.exp(-1.5))


def test_of_busy_victims_the_one_expected_to_drain_soonest_goes_by_its_measured_step_time() -> None:
    s = make(model("a"), model("b"), model("new"))
    loaded(s, "a", "background", 1, 0.0, 1.0)  # loads in 1 s; its step takes 20 s
    s.finish(1, 21.0)
    loaded(s, "b", "background", 2, 0.0, 2.0)  # loads in 2 s; its step takes 4 s
    s.finish(2, 6.0)
    s.submit(3, "b", "background", 21.5)
    s.submit(4, "a", "background", 22.0)
    # Without the drain, a would go: cheaper to load again (1 s against 2 s, used alike).
    effects = s.submit(5, "new", "interactive", 23.0)
    [evict] = emitted(effects, "evict")
    likely = round(1 - math.exp(-1.0), 3)  # two background steps each
    assert evict["engine"] == "b" and evict["in_flight"] == 1
    assert {k: evict[k] for k in ("drain_s", "load_s", "likely", "cost")} == {
        "drain_s": 2.5, "load_s": 2.0, "likely": likely, "cost": round(2.5 + 2.0 * (1 - math.exp(-1.0)), 3)}
    assert s.reload_cost(s.engines["a"], 23.0).drain_s == 19.0  # 20 s less the 1 s it has run
    s.finish(3, 24.0)  # b's step ends early: b stops, and new loads in its memory
    assert s.engines["b"].status is EngineStatus.STOPPING


def test_a_busy_victim_never_measured_goes_after_the_measured_ones() -> None:
    s = make(model("a"), model("b"), model("new"))
    loaded(s, "a", "background", 1, 0.0, 1.0)
    s.finish(1, 101.0)  # a's step: 100 s
    s.submit(2, "a", "background", 102.0)
    loaded(s, "b", "background", 3, 102.0, 103.0)  # b: running its first step, never measured
    assert s.reload_cost(s.engines["b"], 104.0).drain_s is None
    [evict] = emitted(s.submit(4, "new", "interactive", 104.0), "evict")
    assert evict["engine"] == "a" and evict["drain_s"] == 98.0


def test_the_tiers_win_over_cost() -> None:
    # pinned: never; hot (a chat on it lately): only after the cold ones, whatever they cost.
    s = make(model("embed", 2, pinned=True), model("chat", 4), model("agent", 4), model("new", 4),
             swap_hold=30.0)
    s.start(0.0)
    s.engine_ready("embed", 1, "http://127.0.0.1:1/embed", 0.5)
    loaded(s, "agent", "background", 1, 1.0, 9.0)  # dear: 8 s to load, and used often
    for job in range(2, 8):
        s.finish(job - 1, 8.0 + job)
        s.submit(job, "agent", "background", 8.0 + job)
    s.finish(7, 16.0)
    loaded(s, "chat", "interactive", 8, 17.0, 17.5)  # cheap: 0.5 s, used once
    s.finish(8, 18.0)
    chat, agent = (s.engines[n].reload_cost(21.0, 300.0, queued=False).cost for n in ("chat", "agent"))
    assert chat < agent and s.engines["embed"].reload_cost(21.0, 300.0, queued=False).cost == 0
    effects = s.submit(9, "new", "interactive", 21.0)
    assert [e["engine"] for e in emitted(effects, "evict")] == ["agent"]  # cold first, dear or not
    assert acts(effects) == [StopEngine("agent", 1)]


def test_an_engine_with_requests_queued_for_it_is_certain_to_be_needed() -> None:
    s = make(model("a"), model("b"))
    cost = s.engines["a"].reload_cost(0.0, 300.0, queued=True)
    assert (cost.load_s, cost.measured, cost.likely, cost.cost) == (7.0, False, 1.0, 7.0)  # 1 s + 1 s per GiB


# ---- load times in the state file ---------------------------------------------------

def test_load_times_round_trip_through_the_state_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    store = MeasurementStore.open(path)
    assert store.record("key-a", "a", 5 * GIB) is None
    assert store.record_load_time("key-a", "a", 12.3456) is None
    again = MeasurementStore.open(path)
    assert (again.get("key-a"), again.load_time("key-a")) == (5 * GIB, 12.346)  # one keeps the other
    assert again.load_time("key-b") is None
    # A load within a tenth of the kept figure does not rewrite the file.
    before = path.read_text()
    assert again.record_load_time("key-a", "a", 13.0) is None
    assert path.read_text() == before
    kept = again.load_time("key-a")
    assert kept is not None
    s = Scheduler.create(12 * GIB, [model("a"), model("b")], load_times={"a": kept})  # as steward starts
    cost = s.engines["a"].reload_cost(0.0, 300.0, queued=True)
    assert (cost.load_s, cost.measured) == (12.346, True)
    assert s.engines["b"].load_s is None
    s.submit(1, "a", "interactive", 0.0)
    assert explain(s, s.waiting[1]).why.endswith("a is loading (for 0ms; its last load took 12s)")


@pytest.mark.slow
def test_steward_keeps_each_load_time_in_its_state_file(start_steward: StewardFactory, tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    steward = start_steward({"chat": fake_model("1GiB", load_time="0.3s")}, state_file=str(state))
    chat = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(f"{steward.base_url}/chat/completions", json=chat, timeout=30).status_code == 200
    ready = steward.wait_event("ready", engine="chat")
    assert ready["wake"] is False and ready["load_s"] >= 0.3
    assert steward.stop() == 0
    [entry] = json.loads(state.read_text()).values()
    assert (entry["engine"], entry["load_s"]) == ("chat", round(ready["load_s"], 3))


def test_a_load_time_in_the_state_file_that_is_not_a_number_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text('{"k1": {"load_s": "slow"}, "k2": {"load_s": -1}, "k3": {"load_s": true}, "k4": 7}')
    store = MeasurementStore.open(path)
    assert [store.load_time(k) for k in ("k1", "k2", "k3", "k4")] == [None, None, None, None]


def test_a_wake_is_not_taken_for_a_load_time() -> None:
    s = make(model("a"))
    loaded(s, "a", "background", 1, 0.0, 4.0)
    assert s.engines["a"].load_s == 4.0
    s.engines["a"].waking = True  # as _load marks a wake of a sleeping engine's process
    s.engines["a"].status = EngineStatus.STARTING
    effects = s.engine_ready("a", s.engines["a"].generation, "http://127.0.0.1:1/a", 5.0)
    assert emitted(effects, "ready")[0]["wake"] is True
    assert s.engines["a"].load_s == 4.0


def test_regression_a_due_batch_turn_makes_room_where_only_background_engines_are() -> None:
    # Found on real engines (issue 27's mix): batch's model fitted only where the agent's and
    # the embedder's engines were, and background always had work queued for both, so the
    # guard's turn, which evicted only engines nobody earlier wanted, never found room: batch
    # waited 285 s of a 300 s run. Rule 4d: a due turn may evict what a higher lower class wants.
    policy = SchedulingPolicy(interactive_window=2.0, guard_gap_wait=15.0, swap_hold=10.0,
                              starvation={"interactive": 0.0, "background": 3.0, "batch": 10.0})
    s = Scheduler.create(18 * GIB, [model("chat"), model("agent"), model("embed"), model("batcher")], policy)
    loaded(s, "agent", "background", 1, 0.0, 1.0)
    loaded(s, "embed", "background", 2, 0.0, 1.0)
    loaded(s, "chat", "interactive", 3, 2.0, 3.0)  # hot from then on: one lower-class engine
    s.finish(1, 3.5)
    s.finish(2, 3.5)
    s.finish(3, 4.0)  # the window closes at 6.0
    for job in range(10, 20):  # background keeps both of its engines wanted
        s.submit(job, "agent", "background", 4.0)
        s.submit(job + 100, "embed", "background", 4.0)
    assert acts(s.submit(20, "batcher", "batch", 4.0)) == []
    assert granted(s.tick(6.0), 10)
    assert granted(s.finish(10, 11.0), 11)
    assert emitted(s.tick(14.0), "starvation_claim")  # due at 14.0: it claims the agent's engine
    effects = s.finish(11, 16.0)  # the agent's step ends: the turn goes, evicting the idle embedder
    assert [(e["model"], e["load"]) for e in emitted(effects, "starvation_step")] == [("batcher", True)]
    assert [(e["engine"], e["for_engine"]) for e in emitted(effects, "evict")] == [("embed", "batcher")]
    assert acts(effects) == [StopEngine("embed", 1)]
    assert acts(s.engine_exited("embed", 1, 16.5, "stopped")) == [StartEngine("batcher", 1)]
    effects = s.engine_ready("batcher", 1, "http://127.0.0.1:1/batcher", 17.5)
    assert granted(effects, 20)
