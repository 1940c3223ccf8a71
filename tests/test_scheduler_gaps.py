"""Using the GPU's moments without chats (issue 16, GridCore's throughput): gap steps (rule
3b, ``gap_step``) and guard turns that fill their engine's slots (rule 4, ``guard_fill``),
in exact virtual time. Pure calls to the core with explicit times; every time is a binary
fraction, so every assertion is an equality.

Three pinned engines: a chat model (two slots), an agent model (two slots) and an embedder
(one slot). Before the first chat the lower classes are open, which is where the engines'
step times are first measured: an embedding step of 0.5 s (short), an agent step of 2 s.
"""

from __future__ import annotations

import pytest

from supervisor import config_policy
from supervisor.config import Config, ConfigError, parse_config
from supervisor.scheduler.core import Scheduler
from supervisor.scheduler.explain import WaitReason, explain
from supervisor.scheduler.types import Effect, Emit, EngineProfile, Grant, SchedulingPolicy
from tests.harness import GIB

ENGINES = (EngineProfile("chat", 6 * GIB, 2, pinned=True), EngineProfile("agent", 4 * GIB, 2, pinned=True),
           EngineProfile("embed", 1 * GIB, 1, pinned=True))


def make(*, background: float = 3.0, batch: float = 10.0, measured: bool = True, **knobs: object) -> Scheduler:
    """The three engines ready at 0; *measured*: one embedding step (0.0-0.5) and one agent
    step (0.0-2.0) have run, so the embedder's steps are short and the agent's are not."""
    policy = SchedulingPolicy(starvation={"interactive": 0.0, "background": background, "batch": batch},
                              **knobs)  # type: ignore[arg-type]
    s = Scheduler.create(16 * GIB, ENGINES, policy)
    s.start(0.0)
    for name in ("chat", "agent", "embed"):
        s.engine_ready(name, s.engines[name].generation, f"http://127.0.0.1:1/{name}", 0.0)
    if measured:
        assert granted(s.submit(901, "embed", "background", 0.0), 901)
        assert granted(s.submit(902, "agent", "background", 0.0), 902)
        s.finish(901, 0.5, 200)
        s.finish(902, 2.0, 200)
    return s


def granted(effects: list[Effect], *jobs: int) -> bool:
    grants = {e.job_id for e in effects if isinstance(e, Grant)}
    return all(job in grants for job in jobs)


def grants(effects: list[Effect]) -> list[int]:
    return [e.job_id for e in effects if isinstance(e, Grant)]


def emitted(effects: list[Effect], name: str) -> list[dict[str, object]]:
    return [e.fields for e in effects if isinstance(e, Emit) and e.event == name]


def tick_grants(s: Scheduler, *times: float) -> list[int]:
    return [job for t in times for job in grants(s.tick(t))]


# ---- gap steps (rule 3b) ------------------------------------------------------------------

def test_a_short_step_starts_the_moment_the_last_chat_ends_not_a_tick_earlier() -> None:
    s = make(gap_step=1.0, background=100.0)  # no guard: the window alone holds them back
    assert grants(s.submit(1, "chat", "interactive", 2.0)) == [1]
    assert grants(s.submit(2, "embed", "background", 2.25)) == []
    assert grants(s.submit(3, "agent", "background", 2.5)) == []
    assert tick_grants(s, 2.75, 2.96875) == []  # the chat computes: no lower step starts
    effects = s.finish(1, 3.0, 200)
    assert grants(effects) == [2]  # in the gap, while the window is open (until 5.0)
    assert emitted(effects, "gap_step") == [{"job": 2, "model": "embed", "class": "background", "step_s": 0.5,
                                             "gap_step_s": 1.0}]
    # The agent's steps are long: it waits for the window, as before.
    assert grants(s.finish(2, 3.5, 200)) == []
    assert tick_grants(s, 4.96875) == []
    assert grants(s.tick(5.0)) == [3]


def test_off_both_wait_for_the_window_as_before() -> None:
    s = make(background=100.0, lower_class_engines=0)  # gap_step 0, and every engine at once
    s.submit(1, "chat", "interactive", 2.0)
    s.submit(2, "embed", "background", 2.25)
    s.submit(3, "agent", "background", 2.5)
    assert grants(s.finish(1, 3.0, 200)) == []
    assert tick_grants(s, 4.96875) == []
    assert sorted(grants(s.tick(5.0))) == [2, 3]


def test_gap_steps_follow_each_other_while_the_gap_lasts_and_stop_when_a_chat_comes() -> None:
    s = make(gap_step=1.0, background=100.0)
    s.submit(1, "chat", "interactive", 2.0)
    for job, at in ((2, 2.25), (3, 2.375), (4, 2.5)):
        s.submit(job, "embed", "background", at)
    assert grants(s.finish(1, 3.0, 200)) == [2]
    assert grants(s.finish(2, 3.5, 200)) == [3]  # the gap lasts: the next one
    assert grants(s.submit(5, "chat", "interactive", 3.75)) == [5]  # the chat goes at once, beside it
    assert grants(s.finish(3, 4.0, 200)) == []  # a chat computes: no gap
    assert grants(s.finish(5, 5.0, 200)) == [4]  # the next gap


def test_a_chat_waiting_for_its_engine_is_no_gap() -> None:
    engines = (EngineProfile("chat", 6 * GIB, 2), *ENGINES[1:])
    s = Scheduler.create(16 * GIB, engines, SchedulingPolicy(
        starvation={"interactive": 0.0, "background": 100.0, "batch": 100.0}, gap_step=1.0))
    s.start(0.0)
    for name in ("agent", "embed"):
        s.engine_ready(name, s.engines[name].generation, f"http://127.0.0.1:1/{name}", 0.0)
    s.submit(901, "embed", "background", 0.0)
    s.finish(901, 0.5, 200)  # measured short
    s.submit(1, "chat", "interactive", 1.0)  # its engine loads: nothing computes, but a chat waits
    assert grants(s.submit(2, "embed", "background", 1.25)) == []
    assert tick_grants(s, 1.5) == []
    assert grants(s.engine_ready("chat", s.engines["chat"].generation, "http://127.0.0.1:1/chat", 2.0)) == [1]
    assert grants(s.finish(1, 3.0, 200)) == [2]


def test_an_engine_never_measured_is_not_short() -> None:
    s = make(gap_step=1.0, background=100.0, measured=False)
    s.submit(1, "chat", "interactive", 2.0)
    s.submit(2, "embed", "background", 2.25)
    assert grants(s.finish(1, 3.0, 200)) == []
    assert grants(s.tick(5.0)) == [2]  # the window


def test_no_gap_step_while_another_lower_class_step_computes() -> None:
    s = make(gap_step=1.0, background=100.0)
    assert grants(s.submit(3, "agent", "background", 2.0)) == [3]  # open: no chat yet, runs until 4.0
    s.submit(1, "chat", "interactive", 2.25)
    s.submit(2, "embed", "background", 2.5)
    assert grants(s.finish(1, 3.0, 200)) == []  # a gap, but the agent computes: one lower engine at most
    assert grants(s.finish(3, 4.0, 200)) == [2]  # the gap lasts (the window is open until 5.0)


def the_guards_turn_at_the_chats_end(gap_step: float) -> list[Effect]:
    """An embeddings request of two steps (short), asked at 2.25, and an agent step (long),
    asked at 2.5, both background, beside chats computing 2.0-3.0 and 3.25-6.0."""
    s = make(gap_step=gap_step)
    s.submit(1, "chat", "interactive", 2.0)
    s.submit(10, "embed", "background", 2.25, seq=10, request=10, step=1, steps=2)
    s.submit(20, "agent", "background", 2.5, seq=20)
    assert grants(s.finish(1, 3.0, 200)) == ([10] if gap_step else [])  # a gap step, or none
    s.submit(2, "chat", "interactive", 3.25)
    if gap_step:
        s.submit(11, "embed", "background", 3.5, seq=10, request=10, step=2, steps=2, handoff=(10, 200))
    # Due at 5.25 (off: the embeddings request waits since 2.25) or 5.5 (the agent's line: the
    # short one is left to the gaps, and the gap step was no progress); the chat computes.
    assert tick_grants(s, 5.25, 5.5, 5.96875) == []
    return s.finish(2, 6.0, 200)


def test_the_guards_turns_pass_over_the_short_lines_left_to_the_gaps() -> None:
    effects = the_guards_turn_at_the_chats_end(1.0)
    assert [e["model"] for e in emitted(effects, "starvation_step")] == ["agent"]
    # The turn was due first; the gap step would be a second lower-class engine beside it while
    # the chat's engine is hot (rule 3c): it waits for the turn, and the gaps serve it after.
    assert emitted(effects, "gap_step") == []
    assert grants(effects) == [20]


def test_off_the_guards_turn_goes_to_the_oldest() -> None:
    effects = the_guards_turn_at_the_chats_end(0.0)
    assert [e["model"] for e in emitted(effects, "starvation_step")] == ["embed"]
    assert grants(effects) == [10]


def test_a_short_line_passed_over_competes_again_after_its_starvation_time_and_guard_gap_wait() -> None:
    s = make(gap_step=1.0)
    s.submit(1, "chat", "interactive", 2.0)  # never pauses: no gap at all
    s.submit(20, "agent", "background", 2.5)
    s.submit(10, "embed", "background", 4.0, seq=10)  # older in line, but short: left to the gaps
    # The agent's line is due at 5.5 and, with no gap in guard_gap_wait, goes at 20.5.
    assert tick_grants(s, 20.46875) == []
    assert grants(s.tick(20.5)) == [20]
    s.finish(20, 21.0, 200)
    s.submit(21, "agent", "background", 21.0)
    # From 22.0 (4.0 + 3 + 15) the embeddings step is left to the gaps no more: the next turn,
    # due at 24.0 (progress at 21.0) and forced at 39.0, is its (the oldest), not the agent's.
    assert tick_grants(s, 22.0, 24.0, 38.96875) == []
    assert grants(s.tick(39.0)) == [10]


# ---- guard turns that fill their engine (rule 4, guard_fill) ---------------------------------

def agents_behind_a_chat(**knobs: object) -> Scheduler:
    """A chat computing 2.0-6.0, three agent steps asked at 2.5: due at 5.5, so the guard waits
    for the chat's end, a moment no interactive step computes."""
    s = make(**knobs)
    s.submit(1, "chat", "interactive", 2.0)
    for job in (20, 21, 22):
        assert grants(s.submit(job, "agent", "background", 2.5)) == []
    assert tick_grants(s, 5.5) == []
    return s


def test_a_guard_turn_in_a_gap_fills_its_engines_slots() -> None:
    s = agents_behind_a_chat(guard_fill=True)
    effects = s.finish(1, 6.0, 200)
    assert grants(effects) == [20, 21]  # the agent's two slots, oldest first
    assert [(e["job"], e["steps"]) for e in emitted(effects, "starvation_step")] == [(20, 2)]


def test_off_a_guard_turn_is_one_step() -> None:
    s = agents_behind_a_chat()
    effects = s.finish(1, 6.0, 200)
    assert grants(effects) == [20]
    assert [(e["job"], e["steps"]) for e in emitted(effects, "starvation_step")] == [(20, 1)]


def test_guard_share_counts_the_whole_turn() -> None:
    # The turn runs 6.0-8.0 (its steps end at 7.0 and 8.0) while a chat computes from 6.5 on.
    # With guard_share 0.25 the lane rests 3 x 2 s, until 14.0 (counting only the first step,
    # 6.0-7.0, it would be 10.0); the third agent step, due then (8.0 + 3 is earlier), waits
    # guard_gap_wait for a gap that never comes and goes at 29.0 (not 26.0).
    s = agents_behind_a_chat(guard_fill=True, guard_share=0.25)
    assert grants(s.finish(1, 6.0, 200)) == [20, 21]
    s.submit(2, "chat", "interactive", 6.5)
    s.finish(20, 7.0, 200)
    s.finish(21, 8.0, 200)
    assert tick_grants(s, 26.0, 28.96875) == []
    assert grants(s.tick(29.0)) == [22]


def test_beside_a_computing_chat_no_lower_step_starts_until_the_guard_and_then_one() -> None:
    # The chat never pauses: the due step (5.5) goes after guard_gap_wait, at 20.5, alone,
    # though guard_fill is on and the agent has a second slot; no gap step either.
    s = make(guard_fill=True, gap_step=1.0)
    s.submit(1, "chat", "interactive", 2.0)
    s.submit(30, "embed", "background", 2.25, seq=30)  # short, and younger than the agents
    for job in (20, 21):
        s.submit(job, "agent", "background", 2.5)
    assert tick_grants(s, 2.5, 5.5, 20.46875) == []
    effects = s.tick(20.5)
    assert grants(effects) == [20]
    assert [(e["job"], e["steps"]) for e in emitted(effects, "starvation_step")] == [(20, 1)]


def test_while_a_filled_turn_runs_another_class_waits_for_the_lane() -> None:
    s = agents_behind_a_chat(guard_fill=True, batch=3.0)
    s.submit(30, "embed", "batch", 2.75)  # batch, due at 5.75
    s.finish(1, 6.0, 200)  # the agents' turn: 3.5 s of their 3 overdue against batch's 3.25 of 3
    s.submit(2, "chat", "interactive", 6.25)
    s.finish(20, 7.0, 200)  # the turn's first step ended; the one that joined runs on
    job = s.waiting[30]
    wait = explain(s, job)
    assert wait.reason is WaitReason.GUARD_SHARE
    assert "a background turn has the lane" in wait.why


# ---- config ------------------------------------------------------------------------------

def test_the_knobs_come_from_the_config_and_default_to_off() -> None:
    default = config_policy.scheduling_policy(Config(models={}))
    assert (default.guard_fill, default.gap_step) == (False, 0.0)
    config = parse_config({"models": {"m": {"command": ["m"], "memory": "1GiB"}},
                           "scheduler": {"guard_fill": True, "gap_step": "750ms"}})
    policy = config_policy.scheduling_policy(config)
    assert (policy.guard_fill, policy.gap_step) == (True, 0.75)


def test_a_bad_gap_step_is_a_clear_error() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config({"models": {"m": {"command": ["m"], "memory": "1GiB"}}, "scheduler": {"gap_step": "soon"}})
    assert "scheduler.gap_step" in str(raised.value)


# ---- between chats, one engine at a time (rule 3c) ---------------------------------------

def test_between_chats_the_lower_classes_compute_on_one_engine_at_a_time_oldest_first() -> None:
    s = make(background=100.0)  # lower_class_engines 1 by default
    s.submit(1, "chat", "interactive", 2.0)
    s.submit(2, "embed", "background", 2.25)
    s.submit(3, "agent", "background", 2.5)
    s.submit(4, "agent", "background", 2.75)
    assert grants(s.finish(1, 3.0, 200)) == []
    assert tick_grants(s, 4.96875) == []
    assert grants(s.tick(5.0)) == [2]  # the window closed: the oldest request's engine only
    wait = explain(s, s.waiting[3])
    assert wait.reason is WaitReason.LOWER_CLASS_ENGINES
    assert "embed computes" in wait.why
    assert grants(s.submit(5, "embed", "background", 5.25)) == []  # one slot, busy: in line
    effects = s.finish(2, 5.5, 200)
    # The agent's request is now the oldest: its engine, with both its slots.
    assert grants(effects) == [3, 4]
    assert grants(s.finish(3, 6.0, 200)) == []  # the embedder waits while the agent computes
    assert grants(s.finish(4, 6.5, 200)) == [5]


def test_once_no_engine_is_hot_the_lower_classes_use_every_engine_again() -> None:
    s = make(background=100.0, hot_window=4.0)
    s.submit(1, "chat", "interactive", 2.0)
    s.submit(2, "embed", "background", 2.25)
    s.submit(3, "agent", "background", 2.5)
    s.finish(1, 3.0, 200)  # the chat's engine is hot until 7.0
    assert grants(s.tick(5.0)) == [2]
    assert s.next_wakeup() == 7.0
    assert tick_grants(s, 6.96875) == []
    assert grants(s.tick(7.0)) == [3]  # beside the embedder's step, still computing


def test_lower_class_engines_comes_from_the_config_and_zero_is_no_limit() -> None:
    assert config_policy.scheduling_policy(Config(models={})).lower_class_engines == 1
    config = parse_config({"models": {"m": {"command": ["m"], "memory": "1GiB"}},
                           "scheduler": {"lower_class_engines": 0}})
    assert config_policy.scheduling_policy(config).lower_class_engines == 0
    for bad in (-1, 1.5, "one", True):
        with pytest.raises(ConfigError) as raised:
            parse_config({"models": {"m": {"command": ["m"], "memory": "1GiB"}},
                          "scheduler": {"lower_class_engines": bad}})
        assert "scheduler.lower_class_engines" in str(raised.value)
        assert "0 or more" in str(raised.value)
