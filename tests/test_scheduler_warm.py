"""Warm where it pays (issue 16, part 3; core.py, rule 10), in exact virtual time.

Pure calls to the core with explicit times (binary fractions: every assertion is an
equality), and one run of the actor on MockClock. An image job is an exclusive job; it is
of the background class unless the test is about the interactive window after it.
"""

from __future__ import annotations

import math

import trio
import trio.testing

from supervisor.observe.events import Event
from supervisor.observe.metrics import StewardMetrics
from supervisor.scheduler.core import Scheduler
from supervisor.scheduler.types import (
    GIB,
    BackoffPolicy,
    Effect,
    EngineAction,
    EngineProfile,
    EngineState,
    EngineStatus,
    Grant,
    SchedulingPolicy,
    StartEngine,
    StopEngine,
    WarmCause,
)
from supervisor.scheduler.warming import warm_order
from tests.harness import LOAD_S, STOP_S, hold, start_harness
from tests.test_scheduler_swaps import acts, emitted, granted, loaded

STOP = 0.5  # how long a stopped engine takes to exit, in these tests


def model(name: str, gib: float = 6, *, idle_unload: float | None = None) -> EngineProfile:
    return EngineProfile(name, int(gib * GIB), 1, idle_unload=idle_unload)


def make(*profiles: EngineProfile, budget: float = 12, warm: tuple[str, ...] = (), **policy: object) -> Scheduler:
    # No starvation guard: a lower class waits for the higher ones, exactly.
    starvation = {"interactive": 0.0, "background": 0.0, "batch": 0.0}
    return Scheduler.create(int(budget * GIB), profiles,
                            SchedulingPolicy(starvation=starvation, warm=warm, **policy))  # type: ignore[arg-type]


def ready(s: Scheduler, name: str, at: float) -> list[Effect]:
    return s.engine_ready(name, s.engines[name].generation, f"http://127.0.0.1:1/{name}", at)


def image_job(s: Scheduler, job: int, at: float, klass: str = "background") -> None:
    """An image job (the whole budget) at *at*: the engines in its way stop and exit STOP
    later, and it runs."""
    stops = [e for e in s.submit(job, None, klass, at) if isinstance(e, StopEngine)]
    for stop in stops:
        s.engine_exited(stop.engine, stop.generation, at + STOP, "stopped")
    assert job in s.running


def warmed(effects: list[Effect]) -> list[str]:
    return [str(fields["engine"]) for fields in emitted(effects, "warm")]


# ---- after an image job ----------------------------------------------------------------

def test_after_an_image_job_the_warm_list_loads_one_at_a_time_into_free_memory_once_the_window_closes() -> None:
    s = make(model("a"), model("b"), model("c"), budget=16, warm=("b", "a"))
    loaded(s, "a", "interactive", 1, 0.0, 1.0)  # a: loaded in 1 s, used interactively
    s.finish(1, 2.0)
    loaded(s, "c", "background", 2, 5.0, 6.0)  # c: used by an agent
    s.finish(2, 7.0)
    image_job(s, 3, 8.0, klass="interactive")  # a and c go for it
    effects = s.finish(3, 10.0)
    # An interactive image job opens the interactive window as any interactive step does, and
    # warming is batch work: it starts exactly when the window closes.
    assert acts(effects) == [] and s.warm_cause is WarmCause.EXCLUSIVE_JOB
    assert s.next_wakeup() == 12.0
    effects = s.tick(12.0)
    assert acts(effects) == [StartEngine("b", 1)]  # first in scheduler.warm, though never used
    assert emitted(effects, "warm") == [{
        "engine": "b", "reason": "exclusive_job", "why": "after an image job: b is #1 in scheduler.warm",
        "rank": 1, "listed": 1, "recent_uses": 0.0, "likely": 0.0, "load_s": 7.0}]
    [load] = emitted(effects, "load")
    assert (load["reason"], load["why"]) == ("warm", "after an image job: b is #1 in scheduler.warm")
    # One at a time: a waits for b to be ready, however long b's load takes (7 s: 1 s + 6 GiB).
    while (wakeup := s.next_wakeup()) is not None and wakeup < 19.0:
        assert acts(s.tick(wakeup)) == []
    effects = ready(s, "b", 19.0)
    assert acts(effects) == [StartEngine("a", 2)]
    assert emitted(effects, "warm") == [{
        "engine": "a", "reason": "exclusive_job", "why": "after an image job: a is #2 in scheduler.warm",
        "rank": 1, "listed": 2, "recent_uses": 1.0, "likely": 0.632, "load_s": 1.0}]
    # c was used too, but 4 GiB is free and it needs 6: a warm load never evicts, and warming is over.
    effects = ready(s, "a", 20.0)
    assert acts(effects) == [] and emitted(effects, "evict") == []
    assert s.engines["c"].status is EngineStatus.STOPPED and s.warm_cause is None


def test_nothing_is_warmed_while_a_request_waits_then_it_is() -> None:
    s = make(model("a"), model("b"), warm=("b",))
    image_job(s, 1, 0.0)  # nothing loaded: it runs at once
    assert acts(s.submit(2, "a", "background", 1.0)) == []  # waits for the image job's memory
    effects = s.finish(1, 5.0)
    assert acts(effects) == [StartEngine("a", 1)] and warmed(effects) == []  # a's load is job 2's
    while (wakeup := s.next_wakeup()) is not None and wakeup < 12.0:
        assert acts(s.tick(wakeup)) == []  # job 2 waits for a: nothing is warmed
    effects = ready(s, "a", 12.0)
    assert granted(effects, 2) and acts(effects)[-1] == StartEngine("b", 1)  # nothing waits now
    assert warmed(effects) == ["b"]


# ---- a request during a warm load ------------------------------------------------------------

def warming_b() -> Scheduler:
    """b, first in scheduler.warm, warming from 4.0 (ready at 11.0 if left to finish); 6 of 12 GiB free."""
    s = make(model("a"), model("b"), model("c"), warm=("b",))
    image_job(s, 1, 0.0)
    assert acts(s.finish(1, 4.0)) == [StartEngine("b", 1)]
    return s


def test_a_warm_load_still_starting_is_stopped_for_a_request_that_needs_its_memory_which_waits_one_stop_only() -> None:
    s = warming_b()
    effects = s.submit(2, "a", "background", 5.0)  # a fits beside b: the warm load goes on
    assert acts(effects) == [StartEngine("a", 1)] and emitted(effects, "warm_cancelled") == []
    effects = s.submit(3, "c", "background", 6.0)  # c does not: b, loaded for no one, gives way at once
    assert acts(effects) == [StopEngine("b", 1)]
    assert emitted(effects, "warm_cancelled") == [{
        "engine": "b", "generation": 1, "for_engine": "c", "why": "'c' needs its memory; it was loaded for no one"}]
    assert emitted(effects, "evict") == []
    # c waits for b's exit only, not for the 5 s left of b's load (rule 6 would let no one
    # evict b until it was ready, then it would take its stop as well).
    assert acts(s.engine_exited("b", 1, 6.0 + STOP, "stopped")) == [StartEngine("c", 1)]
    assert acts(ready(s, "b", 11.0)) == []  # the cancelled load's late report changes nothing
    assert granted(ready(s, "a", 12.0), 2) and granted(ready(s, "c", 13.5), 3)
    s.finish(2, 14.0)
    effects = s.finish(3, 15.0)
    assert acts(effects) == [] and s.warm_cause is None  # b no longer fits, nothing is freeing: over


def test_a_warm_load_still_starting_is_stopped_for_an_image_job() -> None:
    s = warming_b()
    effects = s.submit(2, None, "background", 5.0)
    assert acts(effects) == [StopEngine("b", 1)]
    assert [f["for_engine"] for f in emitted(effects, "warm_cancelled")] == ["exclusive"]
    assert Grant(2, None, None) in s.engine_exited("b", 1, 5.0 + STOP, "stopped")


def test_a_warm_load_an_admin_asks_for_is_no_longer_stopped_for_others() -> None:
    s = warming_b()
    problem, _ = s.control("b", EngineAction.LOAD, 4.5)
    assert problem is None
    s.submit(2, "a", "background", 5.0)  # a fits beside b
    effects = s.submit(3, "c", "background", 6.0)  # someone wants b now: c waits its turn as usual
    assert acts(effects) == [] and emitted(effects, "warm_cancelled") == []


def test_a_warmed_engine_hot_before_the_image_job_keeps_the_hot_time_it_had_left() -> None:
    # Issue 30: this was "cold until used", so an agent evicted the chat model the moment an
    # image job was over. The job pauses the hot clock instead (rule 8): as before the job,
    # only interactive work may evict it until its hot time is over.
    s = make(model("a"), model("b"), budget=8)
    loaded(s, "a", "interactive", 1, 0.0, 1.0)
    s.finish(1, 2.0)  # a is hot until 302.0: only interactive work may evict it...
    image_job(s, 2, 3.0)  # ...but an image job does, with 299 s of hot time left
    assert acts(s.finish(2, 10.0)) == [StartEngine("a", 2)]  # the likeliest needed
    ready(s, "a", 11.0)
    assert s.snapshot().engines[0].hot_until == 309.0
    effects = s.submit(3, "b", "background", 20.0)
    assert acts(effects) == [] and emitted(effects, "evict") == []
    assert acts(s.tick(308.0)) == []
    effects = s.tick(309.0)
    assert acts(effects) == [StopEngine("a", 2)]
    [evict] = emitted(effects, "evict")
    assert (evict["engine"], evict["hot"]) == ("a", False)


def warmed_a_beside_busy_b(*, use_a: bool) -> tuple[Scheduler, list[Effect]]:
    """a warmed after an image job (ready at 11.0), then used once or not; b busy with an
    agent's step from 13.0; then another agent asks for c at 14.0, which needs a's memory."""
    s = make(model("a"), model("b"), model("c"))
    loaded(s, "a", "background", 1, 0.0, 1.0)
    s.finish(1, 2.0)
    image_job(s, 2, 3.0)
    assert acts(s.finish(2, 10.0)) == [StartEngine("a", 2)]
    ready(s, "a", 11.0)
    if use_a:
        assert granted(s.submit(5, "a", "background", 11.5), 5)
        s.finish(5, 11.75)
    loaded(s, "b", "background", 3, 12.0, 13.0)
    return s, s.submit(4, "c", "background", 14.0)


def test_a_warmed_engine_unused_since_costs_nothing_to_evict_so_no_request_is_held_for_it() -> None:
    s, effects = warmed_a_beside_busy_b(use_a=False)
    assert emitted(effects, "swap_held") == []  # b keeps the class busy, but a was loaded for no one
    assert acts(effects) == [StopEngine("a", 2)]
    [evict] = emitted(effects, "evict")
    assert {k: evict[k] for k in ("recent_uses", "likely", "cost", "unused_warm")} == {
        "recent_uses": 0.5, "likely": 0.0, "cost": 0.0, "unused_warm": True}
    # Once a step ran on it, it is an ordinary engine: evicting it costs, and the load is held (rule 9).
    s, effects = warmed_a_beside_busy_b(use_a=True)
    assert [f["would_evict"] for f in emitted(effects, "swap_held")] == [["a"]]
    assert acts(effects) == []


# ---- the order ---------------------------------------------------------------------------------

def test_without_a_list_the_recently_used_are_warmed_likeliest_first_and_the_unused_never() -> None:
    s = make(model("a", 4), model("b", 4), model("c", 4), model("d", 4), budget=16)
    loaded(s, "a", "background", 1, 0.0, 1.0)  # 0.5 weighted steps
    s.finish(1, 2.0)
    loaded(s, "b", "interactive", 2, 2.0, 3.0)
    s.finish(2, 4.0)
    assert granted(s.submit(3, "b", "interactive", 4.0), 3)  # b: 2 weighted steps
    s.finish(3, 5.0)
    loaded(s, "c", "batch", 4, 8.0, 9.0)  # 0.25 (batch waits out the interactive window, to 7.0)
    s.finish(4, 10.0)
    image_job(s, 5, 11.0)
    effects = s.finish(5, 20.0)
    assert acts(effects) == [StartEngine("b", 2)]
    assert emitted(effects, "warm") == [{
        "engine": "b", "reason": "exclusive_job", "rank": 1, "listed": None, "recent_uses": 2.0, "likely": 0.865,
        "load_s": 1.0,
        "why": "after an image job: b was used lately (2 weighted steps within hot_window: likely 0.86)"}]
    effects = ready(s, "b", 21.0)
    assert acts(effects) == [StartEngine("a", 2)]
    assert [(f["recent_uses"], f["likely"]) for f in emitted(effects, "warm")] == [(0.5, 0.393)]
    effects = ready(s, "a", 22.0)
    assert acts(effects) == [StartEngine("c", 2)]
    assert [(f["recent_uses"], f["likely"]) for f in emitted(effects, "warm")] == [(0.25, 0.221)]
    # d would fit, but it was never used and is not listed: loading it would be a guess.
    assert acts(ready(s, "c", 23.0)) == [] and s.warm_cause is None
    assert s.engines["d"].status is EngineStatus.STOPPED


def engine(name: str, load_s: float, uses: list[tuple[float, str]]) -> EngineState:
    state = EngineState(EngineProfile(name, GIB, 1), load_s=load_s)
    for when, klass in uses:
        state.record_use(when, klass, 300.0)
        state.last_used = when
    return state


def test_warm_order_list_first_then_likeliest_then_the_greater_load_time_saved_then_the_most_recent() -> None:
    x = engine("x", 10.0, [(1.0, "background")])
    y = engine("y", 2.0, [(2.0, "background")])
    z = engine("z", 2.0, [(3.0, "background")])
    w = engine("w", 2.0, [(0.0, "interactive")])  # likelier than the others
    idle = engine("idle", 2.0, [])
    order = warm_order([x, y, z, w, idle], (), 10.0, 300.0)
    assert [c.engine for c in order] == ["w", "x", "z", "y"]
    order = warm_order([x, y, z, w, idle], ("idle", "y", "gone"), 10.0, 300.0)  # names it does not know: skipped
    assert [(c.engine, c.listed) for c in order] == [("idle", 1), ("y", 2), ("w", None), ("x", None), ("z", None)]


def test_an_engine_in_its_backoff_is_not_warmed() -> None:
    s = make(model("a"), model("b"), warm=("b", "a"), backoff=BackoffPolicy(64.0, 64.0))
    s.submit(1, "b", "background", 0.0)
    s.engine_exited("b", 1, 1.0, "exited with status 1")  # failed to start: not again before 65.0
    image_job(s, 2, 2.0)
    effects = s.finish(2, 3.0)
    assert acts(effects) == [StartEngine("a", 1)]
    assert [(f["engine"], f["listed"], f["rank"]) for f in emitted(effects, "warm")] == [("a", 2, 1)]
    assert acts(ready(s, "a", 10.0)) == [] and s.warm_cause is None


# ---- after an idle unload -----------------------------------------------------------------------

def test_an_idle_unload_warms_another_engine_into_the_memory_it_frees_never_itself() -> None:
    s = make(model("a", idle_unload=30.0), model("b"), model("c"), swap_hold=0.0)
    loaded(s, "b", "background", 1, 0.0, 1.0)
    s.finish(1, 2.0)
    assert acts(s.submit(2, "c", "background", 3.0)) == [StartEngine("c", 1)]
    assert acts(s.submit(3, "a", "background", 4.0)) == [StopEngine("b", 1)]  # b goes for a
    assert acts(s.engine_exited("b", 1, 4.5, "stopped")) == [StartEngine("a", 1)]
    assert granted(ready(s, "c", 5.0), 2) and granted(ready(s, "a", 5.5), 3)
    s.finish(2, 6.0)
    s.finish(3, 7.0)
    assert s.next_wakeup() == 37.0  # a's idle_unload
    effects = s.tick(37.0)
    assert acts(effects) == [StopEngine("a", 1)] and warmed(effects) == []  # a still holds b's room
    assert s.warm_cause is WarmCause.IDLE_UNLOAD
    # By the order a (1.5 s to load) would go before b (1 s), both used as much: but a was
    # unloaded for being idle, and warming it would only load it to unload it again.
    effects = s.engine_exited("a", 1, 37.0 + STOP, "stopped")
    assert acts(effects) == [StartEngine("b", 2)]
    assert emitted(effects, "warm") == [{
        "engine": "b", "reason": "idle_unload", "rank": 1, "listed": None, "recent_uses": 0.5, "likely": 0.393,
        "load_s": 1.0,
        "why": "after an idle unload: b was used lately (0.5 weighted steps within hot_window: likely 0.39)"}]
    assert acts(ready(s, "b", 38.5)) == [] and s.warm_cause is None


def test_a_listed_engine_with_idle_unload_is_warmed_once_and_not_again_after_its_idle_unload() -> None:
    s = make(model("a", idle_unload=30.0), warm=("a",))
    image_job(s, 1, 0.0)
    assert acts(s.finish(1, 1.0)) == [StartEngine("a", 1)]
    ready(s, "a", 8.0)
    assert s.next_wakeup() == 38.0  # unused since it was warmed
    assert acts(s.tick(38.0)) == [StopEngine("a", 1)]
    assert acts(s.engine_exited("a", 1, 38.5, "stopped")) == [] and s.warm_cause is None
    assert s.next_wakeup() is None
    # Used again, it may be warmed again after the next image job.
    loaded(s, "a", "background", 2, 40.0, 41.0)
    s.finish(2, 42.0)
    image_job(s, 3, 43.0)
    assert acts(s.finish(3, 50.0)) == [StartEngine("a", 3)]


# ---- nothing to warm ------------------------------------------------------------------------------

def test_no_list_and_no_recent_use_warms_nothing() -> None:
    s = make(model("a"), model("b"), warm=())
    loaded(s, "a", "background", 1, 0.0, 1.0)
    s.finish(1, 2.0)
    image_job(s, 2, 400.0)  # a's use is older than hot_window (300 s)
    assert acts(s.finish(2, 410.0)) == [] and s.warm_cause is None


def test_nothing_is_warmed_while_steward_is_closing() -> None:
    s = make(model("a"), warm=("a",))
    image_job(s, 1, 0.0)
    s.close(1.0)  # the running image job goes on
    assert acts(s.finish(1, 2.0)) == [] and s.warm_cause is None


# ---- through the actor, and in the metrics ------------------------------------------------------

async def test_through_the_actor_a_warm_load_follows_the_image_job_and_is_counted(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    h = await start_harness(nursery, 8, model("chat"))
    log: list[tuple[str, float]] = []
    await hold(h.client, "chat", 1.0, log)  # loaded 0 .. LOAD_S, used to LOAD_S + 1
    await hold(h.client, None, 4.0, log, "background")  # chat stops for it
    image_end = LOAD_S + 1.0 + STOP_S + 4.0
    await trio.testing.wait_all_tasks_blocked()
    assert log == [("granted chat chat", LOAD_S), ("granted None None", LOAD_S + 1.0 + STOP_S)]
    assert [(w["engine"], w["reason"], w["at"]) for w in h.names("warm")] == [("chat", "exclusive_job", image_end)]
    assert h.engines["chat"].starts == [0.0, image_end]
    metrics = StewardMetrics()
    for event in h.events.recent:
        metrics.observe(event)
    assert b'steward_warm_loads_total{engine="chat"} 1.0' in metrics.render()


def test_a_warm_event_is_counted_per_engine() -> None:
    metrics = StewardMetrics()
    for name in ("a", "b", "a"):
        metrics.observe(Event("warm", "info", {"engine": name, "reason": "idle_unload"}, 0.0, math.nan))
    assert b'steward_warm_loads_total{engine="a"} 2.0' in metrics.render()
    assert b'steward_warm_loads_total{engine="b"} 1.0' in metrics.render()
