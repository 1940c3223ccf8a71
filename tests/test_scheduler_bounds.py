"""What computes beside a chat (issue 27, findings 3-5), in exact virtual time: the starvation
guard's turns obey ``lower_class_engines`` (rule 3c), the lane serves the class due first so
that batch's wait has an honest bound, and every time a "why" names is one the core keeps or
a lower bound worded "not before". Pure calls to the core with explicit times; every time is
a binary fraction, so every assertion is an equality.

Four pinned engines: a chat model (two slots), an agent model (two slots), an embedder and a
batch model (one slot each). Before the first chat the lower classes are open, which is where
the agent's step time is first measured (2 s).
"""

from __future__ import annotations

import time

from supervisor.scheduler.core import Scheduler
from supervisor.scheduler.explain import WaitReason, explain
from supervisor.scheduler.types import EngineProfile, SchedulingPolicy
from tests.harness import GIB
from tests.test_scheduler_gaps import emitted, grants, tick_grants

ENGINES = (EngineProfile("chat", 6 * GIB, 2, pinned=True), EngineProfile("agent", 4 * GIB, 2, pinned=True),
           EngineProfile("embed", 1 * GIB, 1, pinned=True), EngineProfile("batcher", 2 * GIB, 1, pinned=True))


def make(**knobs: object) -> Scheduler:
    """The engines ready at 0, one agent step measured (0.0-2.0), the wall clock at 09:00:00."""
    s = Scheduler.create(16 * GIB, ENGINES, SchedulingPolicy(**knobs))  # type: ignore[arg-type]
    s.wall_offset = time.mktime((2026, 12, 1, 9, 0, 0, 0, 0, -1))
    s.start(0.0)
    for name in ("chat", "agent", "embed", "batcher"):
        s.engine_ready(name, s.engines[name].generation, f"http://127.0.0.1:1/{name}", 0.0)
    assert grants(s.submit(901, "agent", "background", 0.0)) == [901]
    s.finish(901, 2.0, 200)
    return s


def clock(seconds: float) -> str:
    """Core time as the why reads it (09:00:00 is 0)."""
    return time.strftime("%H:%M:%S", time.gmtime(9 * 3600 + seconds))


def agent_between_chats(s: Scheduler) -> None:
    """A chat 3.0-4.0 (its engine hot from then on, the window open until 6.0), then an agent
    step that starts at 6.5, in the chat's think gap, and runs long: the lower classes' one
    engine while the chat's is hot (rule 3c)."""
    assert grants(s.submit(1, "chat", "interactive", 3.0)) == [1]
    s.finish(1, 4.0, 200)
    assert grants(s.submit(2, "agent", "background", 6.5)) == [2]


# ---- the guard's turns obey lower_class_engines (finding 3) ----------------------------------

def test_regression_a_guard_turn_beside_chats_does_not_start_a_second_lower_class_engine() -> None:
    # Found on real engines: a batch turn of the guard started on its own engine beside an agent
    # step already computing, so a chat shared the cores with two lower-class engines.
    s = make()
    agent_between_chats(s)
    assert grants(s.submit(3, "chat", "interactive", 7.0)) == [3]
    assert grants(s.submit(4, "batcher", "batch", 7.0)) == []  # due at 17.0 beside the chats
    s.finish(3, 8.0, 200)
    assert grants(s.submit(5, "chat", "interactive", 16.0)) == [5]
    s.finish(5, 16.5, 200)  # the window is open until 18.5, and no chat computes at 17.0
    effects = s.tick(17.0)
    assert grants(effects) == []  # it was let through here, beside the agent's step
    assert emitted(effects, "starvation_claim") == [
        {"class": "batch", "waits_for": ["agent"], "starved_s": 10.0, "step_s": 2.0}]
    wait = explain(s, s.waiting[4])
    assert wait.reason is WaitReason.LOWER_CLASS_ENGINES
    assert wait.why == ("batch request for batcher waits: its starvation guard turn is due and waits for the "
                        "steps on agent to end (their steps took 2s on average lately); while a chat's engine is "
                        "hot, background and batch compute on 1 engine(s) at once")
    assert tick_grants(s, 17.5, 29.96875) == []
    assert grants(s.finish(2, 30.0, 200)) == [4]  # the agent's step ended: the batch step, at once


def test_a_due_turn_claims_the_lower_class_engine_so_the_higher_lower_class_cannot_keep_it() -> None:
    # No chat computes or waits (the window closed): background runs on the agent's engine, and
    # batch's guard is due beside it. It may not start a second engine while the chat's is hot;
    # it claims: the agent takes no new step, and once its step ends the batch step goes.
    s = make()
    agent_between_chats(s)
    assert grants(s.submit(4, "batcher", "batch", 7.0)) == []  # behind background work
    effects = s.tick(17.0)
    assert grants(effects) == []
    assert [e["class"] for e in emitted(effects, "starvation_claim")] == ["batch"]
    # A new agent step with a free slot on the agent's engine waits for the batch turn.
    assert grants(s.submit(6, "agent", "background", 20.0)) == []
    wait = explain(s, s.waiting[6])
    assert wait.reason is WaitReason.LOWER_CLASS_ENGINES
    assert wait.why == ("background request for agent waits: a batch turn of the starvation guard is due and waits "
                        "for the steps on agent to end (their steps took 2s on average lately); no other background "
                        "or batch step starts there before it")
    assert grants(s.finish(2, 30.0, 200)) == [4]
    assert grants(s.finish(4, 31.0, 200)) == [6]  # one batch step, then the agents again


def test_a_due_turn_uses_the_free_slots_of_the_engine_that_already_computes() -> None:
    s = make()
    agent_between_chats(s)
    assert grants(s.submit(3, "chat", "interactive", 7.0)) == [3]
    assert grants(s.submit(4, "agent", "batch", 7.0)) == []
    assert grants(s.tick(17.0)) == []  # a chat computes: the turn waits for a gap (guard_gap_wait)
    effects = s.finish(3, 18.0, 200)
    assert grants(effects) == [4]  # the agent's engine computes already: its second slot
    assert emitted(effects, "starvation_claim") == []


def test_without_a_limit_the_guard_starts_any_engine_as_before() -> None:
    s = make(lower_class_engines=0)
    agent_between_chats(s)
    assert grants(s.submit(4, "batcher", "batch", 7.0)) == []
    assert grants(s.tick(17.0)) == [4]


def test_a_gap_step_waits_while_a_turn_claims() -> None:
    s = make(gap_step=1.0)
    assert grants(s.submit(902, "embed", "background", 2.0)) == [902]
    s.finish(902, 2.5, 200)  # the embedder's steps are short
    agent_between_chats(s)
    assert grants(s.submit(3, "chat", "interactive", 7.0)) == [3]
    assert grants(s.submit(4, "batcher", "batch", 7.0)) == []
    s.finish(3, 8.0, 200)
    s.submit(5, "chat", "interactive", 16.0)
    s.finish(5, 16.5, 200)
    assert grants(s.tick(17.0)) == []  # the batch turn claims
    assert grants(s.submit(7, "embed", "background", 17.25)) == []  # a gap, but no gap step
    assert grants(s.finish(2, 18.0, 200)) == [4]


# ---- the batch bound (finding 4) -------------------------------------------------------------

def long_embeddings_beside_chats() -> Scheduler:
    """A chat computing from 0.5 on (the window never closes) and no gap wait: every turn goes
    the moment it is due. Background: an embeddings request whose steps run 20 s each, from
    1.0 (due at 4.0); batch: one step, from 1.0 (due at 11.0). The first background step holds
    the lane 4.0-24.0 and the lane then rests as long (guard_share 0.5), until 44.0."""
    s = make(guard_gap_wait=0.0)
    assert grants(s.submit(1, "chat", "interactive", 0.5)) == [1]
    assert grants(s.submit(10, "embed", "background", 1.0, seq=10, request=10, step=1, steps=3)) == []
    assert grants(s.submit(20, "batcher", "batch", 1.0)) == []
    assert grants(s.tick(4.0)) == [10]
    assert tick_grants(s, 11.0) == []
    assert grants(s.submit(11, "embed", "background", 24.0, seq=10, request=10, step=2, steps=3,
                           handoff=(10, 200))) == []
    return s


def test_regression_batch_gets_the_lane_before_background_goes_again() -> None:
    # Found on real engines: batch waited 129-172 s against batch_max_starvation 10 s. The lane
    # went to the class most overdue relative to its own starvation time, and background's
    # 3 s made a long background turn's rest look more overdue than batch's wait, turn after turn.
    s = long_embeddings_beside_chats()
    assert tick_grants(s, 43.96875) == []
    effects = s.tick(44.0)
    assert grants(effects) == [20]  # batch was due at 11.0, background at 27.0: first due, first served
    # Within the documented bound: due + the longest step in the lane / guard_share + guard_gap_wait.
    assert 44.0 - 11.0 <= 20.0 / 0.5 + 0.0
    s.finish(20, 45.0, 200)  # the lane rests 1 s
    assert tick_grants(s, 45.96875) == []
    assert grants(s.tick(46.0)) == [11]  # and background's next turn is not starved either


# ---- whys that are true (finding 5) ----------------------------------------------------------

def test_the_guard_time_a_why_names_is_a_lower_bound_while_the_lane_is_held() -> None:
    s = long_embeddings_beside_chats()
    # At 5.0 the background turn (from 4.0) holds the lane; batch is due at 11.0: not before then.
    s2 = long_embeddings_beside_chats_at(5.0)
    assert explain(s2, s2.waiting[20]).why == (
        "batch request for batcher waits: 1 interactive step(s) running; the starvation guard lets one step "
        f"through beside them, not before {clock(11.0)}")
    # During the rest (24.0-44.0) the lane is free: the time named is the one the core keeps.
    s.tick(30.0)
    wait = explain(s, s.waiting[20])
    assert wait.reason is WaitReason.INTERACTIVE_WINDOW
    assert wait.why.endswith(f"not before {clock(44.0)}")
    assert tick_grants(s, 43.96875) == [] and grants(s.tick(44.0)) == [20]


def long_embeddings_beside_chats_at(now: float) -> Scheduler:
    """long_embeddings_beside_chats stopped at *now*, while the first background step runs."""
    s = make(guard_gap_wait=0.0)
    s.submit(1, "chat", "interactive", 0.5)
    s.submit(10, "embed", "background", 1.0, seq=10, request=10, step=1, steps=3)
    s.submit(20, "batcher", "batch", 1.0)
    s.tick(4.0)
    s.tick(now)
    return s


def test_once_due_while_the_lane_is_held_the_why_names_a_lower_bound_that_holds() -> None:
    s = long_embeddings_beside_chats_at(20.0)
    wait = explain(s, s.waiting[20])
    assert wait.reason is WaitReason.GUARD_SHARE
    # The turn from 4.0 runs on past 20.0, and the lane then rests at least as long: 36.0.
    assert wait.why == ("batch request for batcher waits: the starvation guard lets one lower-class turn run at a "
                        f"time, and a background turn has the lane; the next: not before {clock(36.0)}")
    s.finish(10, 24.0, 200)
    assert tick_grants(s, 35.96875, 36.0, 43.96875) == []
    assert grants(s.tick(44.0)) == [20]  # later than the bound, never sooner


def test_a_guard_time_named_in_a_quiet_lane_is_kept_to_the_tick() -> None:
    # Chats keep the window open (one 0.5-1.0, one 2.0-12.0); the lane is free and the gap wait
    # is 0: the time named is when the step starts.
    s = make(guard_gap_wait=0.0)
    s.submit(1, "chat", "interactive", 0.5)
    s.finish(1, 1.0, 200)
    assert grants(s.submit(20, "batcher", "batch", 1.5)) == []
    assert grants(s.submit(2, "chat", "interactive", 2.0)) == [2]
    assert explain(s, s.waiting[20]).why.endswith(f"not before {clock(11.5)}")
    assert tick_grants(s, 11.46875) == []
    assert grants(s.tick(11.5)) == [20]


def test_the_window_a_why_names_closes_then_and_the_step_starts_then() -> None:
    s = make()
    s.submit(1, "chat", "interactive", 0.5)
    assert grants(s.submit(20, "batcher", "batch", 0.75)) == []
    s.finish(1, 1.0, 200)
    wait = explain(s, s.waiting[20])
    assert wait.why == ("batch request for batcher waits: the interactive window is open until "
                        f"{clock(3.0)}; the starvation guard lets one step through beside chats, "
                        f"not before {clock(10.75)}")
    assert tick_grants(s, 2.96875) == []
    assert grants(s.tick(3.0)) == [20]


def test_while_its_own_turn_runs_the_next_is_not_before_its_starvation_time_after() -> None:
    # No chat: batch behind background, its turn (one step) beside it.
    s = make(lower_class_engines=0)
    assert grants(s.submit(2, "agent", "background", 3.0)) == [2]
    s.submit(20, "batcher", "batch", 3.0)
    s.submit(21, "batcher", "batch", 3.0)
    assert grants(s.tick(13.0)) == [20]
    s.tick(14.0)
    wait = explain(s, s.waiting[21])
    assert wait.why == ("batch request for batcher waits: background work goes first; the starvation guard lets "
                        f"one step through beside it, not before {clock(24.0)}")
    s.finish(20, 16.0, 200)
    assert tick_grants(s, 25.96875) == []
    assert grants(s.tick(26.0)) == [21]  # 10 s after the turn's end, which came after 14.0


def test_a_due_turn_claims_the_slots_of_an_engine_it_shares_with_background_work() -> None:
    # No chat at all (nothing is hot): batch shares the agent's engine with background work
    # that keeps both its slots busy. Its due turn claims the engine: the next free slot is its.
    s = make()
    assert grants(s.submit(2, "agent", "background", 3.0)) == [2]
    assert grants(s.submit(3, "agent", "background", 3.0)) == [3]
    assert grants(s.submit(20, "agent", "batch", 3.0)) == []
    assert grants(s.submit(4, "agent", "background", 4.0)) == []  # no free slot
    effects = s.tick(13.0)
    assert emitted(effects, "starvation_claim") == [
        {"class": "batch", "waits_for": ["agent"], "starved_s": 10.0, "step_s": 2.0}]
    assert explain(s, s.waiting[4]).why == (
        "background request for agent waits: a batch turn of the starvation guard is due and waits for the steps "
        "on agent to end (their steps took 2s on average lately); no other background or batch step starts there "
        "before it")
    assert explain(s, s.waiting[20]).why == (
        "batch request for agent waits: all 2 slot(s) of agent are busy; its starvation guard turn is due and takes "
        "the next one (their steps took 2s on average lately)")
    assert grants(s.finish(2, 15.0, 200)) == [20]  # not background's job 4, though it is the higher class
    assert grants(s.finish(3, 16.0, 200)) == [4]
