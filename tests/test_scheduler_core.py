"""The pure decision core: every rule of the foundation scheduler, with exact times."""

from __future__ import annotations

import pytest

from supervisor.scheduler.core import Scheduler
from supervisor.scheduler.types import (
    BackoffPolicy,
    EngineProfile,
    EngineStatus,
    Fail,
    Grant,
    SchedulingPolicy,
    StartEngine,
    StopEngine,
)

GIB = 1024**3


def make(budget: float, *profiles: EngineProfile, backoff: BackoffPolicy | None = None) -> Scheduler:
    return Scheduler.create(int(budget * GIB), profiles, SchedulingPolicy(backoff=backoff or BackoffPolicy(1.0, 8.0)))


def engine(name: str, gib: float, slots: int = 1, pinned: bool = False) -> EngineProfile:
    return EngineProfile(name, int(gib * GIB), slots, pinned)


def actions(effects: list) -> list:
    """The effects that act on the world (events left out)."""
    return [e for e in effects if isinstance(e, Grant | Fail | StartEngine | StopEngine)]


def events(effects: list) -> list[str]:
    return [e.event for e in effects if not isinstance(e, Grant | Fail | StartEngine | StopEngine)]


def load_ready(s: Scheduler, name: str, now: float) -> None:
    """Drive one engine from stopped to ready."""
    gen = s.engines[name].generation
    assert s.engines[name].status is EngineStatus.STARTING
    s.engine_ready(name, gen, f"http://127.0.0.1:{9000 + len(name)}", now)


def test_first_request_reserves_memory_at_the_moment_of_the_load_decision() -> None:
    s = make(16, engine("chat", 8.3))
    effects = s.submit(1, "chat", "interactive", now=0.0, timeout=60)
    assert actions(effects) == [StartEngine("chat", 1)]
    assert events(effects) == ["enqueue", "load", "mode"]
    load = effects[1].fields
    assert (load["reason"], load["job"], load["why"]) == ("request", 1, "an interactive request waits for it")
    assert s.ledger.totals == {"chat": int(8.3 * GIB)}
    # A second request while loading waits; no second load, no second reservation.
    assert actions(s.submit(2, "chat", "interactive", now=0.5, timeout=60)) == []
    assert s.ledger.reserved == int(8.3 * GIB)
    effects = s.engine_ready("chat", 1, "http://127.0.0.1:9001", now=2.0)
    assert actions(effects) == [Grant(1, "chat", "http://127.0.0.1:9001")]
    assert events(effects)[0] == "ready"
    assert effects[0].fields["load_s"] == 2.0


def test_never_more_concurrent_jobs_than_slots_and_fifo_within_the_queue() -> None:
    s = make(16, engine("chat", 4, slots=2))
    s.submit(1, "chat", "interactive", 0.0, timeout=60)
    load_ready(s, "chat", 1.0)
    grants = []
    for job in (2, 3, 4):
        grants += actions(s.submit(job, "chat", "interactive", 1.0, timeout=60))
    assert [g.job_id for g in grants] == [2]  # job 1 got the first slot at ready
    assert s.engines["chat"].in_flight == 2
    assert sorted(s.waiting) == [3, 4]
    assert [g.job_id for g in actions(s.finish(1, 2.0))] == [3]
    assert [g.job_id for g in actions(s.finish(3, 3.0))] == [4]
    assert s.engines["chat"].in_flight == 2


def test_load_then_evict_least_recently_used_idle_engine_with_reservations_at_each_step() -> None:
    s = make(10, engine("a", 4), engine("b", 4), engine("c", 5))
    s.submit(1, "a", "interactive", 0.0, timeout=60)
    load_ready(s, "a", 1.0)
    s.finish(1, 2.0)
    s.submit(2, "b", "interactive", 3.0, timeout=60)
    load_ready(s, "b", 4.0)
    s.finish(2, 5.0)
    assert s.ledger.totals == {"a": 4 * GIB, "b": 4 * GIB}
    # c needs 5: free is 2, so one idle engine goes: a, the least recently used.
    effects = s.submit(3, "c", "interactive", 6.0, timeout=60)
    assert actions(effects) == [StopEngine("a", 1)]
    evict = next(e for e in effects if getattr(e, "event", None) == "evict")
    assert evict.fields["engine"] == "a" and evict.fields["for_engine"] == "c"
    # a's memory stays reserved until it has exited.
    assert s.ledger.totals == {"a": 4 * GIB, "b": 4 * GIB}
    effects = s.engine_exited("a", 1, 7.0, "stopped")
    assert actions(effects) == [StartEngine("c", 1)]
    assert s.ledger.totals == {"b": 4 * GIB, "c": 5 * GIB}
    assert s.engines["a"].status is EngineStatus.STOPPED


def test_engine_with_requests_in_flight_is_drained_never_stopped() -> None:
    s = make(8, engine("a", 5), engine("b", 5))
    s.policy = SchedulingPolicy(backoff=BackoffPolicy(1.0, 8.0), swap_hold=0.0)  # b's load is not held
    s.submit(1, "a", "interactive", 0.0, timeout=60)
    load_ready(s, "a", 1.0)  # job 1 runs on a
    effects = s.submit(2, "b", "interactive", 2.0, timeout=60)
    assert actions(effects) == []  # a is busy: drained, not stopped
    assert s.engines["a"].draining
    # No new work goes to a draining engine.
    assert actions(s.submit(3, "a", "interactive", 2.5, timeout=60)) == []
    assert actions(s.finish(1, 3.0)) == [StopEngine("a", 1)]
    effects = s.engine_exited("a", 1, 4.0, "stopped")
    assert actions(effects) == [StartEngine("b", 1)]


def test_memory_already_being_freed_is_counted_so_one_need_never_claims_a_second_victim() -> None:
    s = make(10, engine("big1", 4), engine("big2", 4), engine("small", 2.5))
    s.policy = SchedulingPolicy(backoff=BackoffPolicy(1.0, 8.0), swap_hold=0.0)  # small's load is not held
    for job, name, t in ((1, "big1", 0.0), (2, "big2", 2.0)):
        s.submit(job, name, "interactive", t, timeout=60)
        load_ready(s, name, t + 1)
    # big1 still finishing its request, big2 idle but more recent: small needs 0.5 GiB more than is free.
    s.finish(2, 3.5)
    s.submit(3, "small", "interactive", 4.0, timeout=60)
    assert s.engines["big2"].draining and not s.engines["big1"].draining
    # Time passes, more decisions happen: nobody else is picked while big2 drains.
    for t in (4.1, 4.2, 5.0):
        assert actions(s.tick(t)) == []
        assert not s.engines["big1"].draining
    assert s.engines["big2"].status is EngineStatus.STOPPING


def test_loading_and_pinned_engines_are_never_evicted() -> None:
    s = make(10, engine("embed", 1, pinned=True), engine("a", 5), engine("b", 5))
    effects = s.start(0.0)
    assert actions(effects) == [StartEngine("embed", 1)]
    s.submit(1, "a", "interactive", 0.0, timeout=60)
    assert s.engines["a"].status is EngineStatus.STARTING
    # b does not fit: a is loading (counts as used, never evicted), embed is pinned.
    assert actions(s.submit(2, "b", "interactive", 0.5, timeout=60)) == []
    load_ready(s, "embed", 1.0)
    load_ready(s, "a", 2.0)
    effects = s.finish(1, 3.0)
    assert actions(effects) == [StopEngine("a", 1)]  # now a is idle and evictable; embed never


def test_queue_timeout_answers_503_with_retry_after_at_the_exact_deadline() -> None:
    s = make(10, engine("a", 4, slots=1))
    s.submit(1, "a", "interactive", 0.0, timeout=60)
    load_ready(s, "a", 1.0)
    s.submit(2, "a", "interactive", 1.5, timeout=5.0)
    assert s.next_wakeup() == 6.5
    assert actions(s.tick(6.4)) == []
    effects = s.tick(6.5)
    assert actions(effects) == [Fail(2, 503, "queue_timeout", "no capacity for model 'a' within 5s", 1.0)]
    assert "timeout" in events(effects)


def test_withdrawn_job_leaves_the_queue() -> None:
    s = make(10, engine("a", 4, slots=1))
    s.submit(1, "a", "interactive", 0.0, timeout=60)
    load_ready(s, "a", 1.0)
    s.submit(2, "a", "interactive", 1.0, timeout=60)
    effects = s.finish(2, 1.5)  # the client went away while waiting
    assert "withdraw" in events(effects)
    assert s.waiting == {}
    assert s.engines["a"].in_flight == 1


def test_shutdown_answers_requests_not_yet_started_and_lets_running_work_and_later_steps_go_on() -> None:
    s = make(10, engine("a", 4, slots=1), engine("b", 4, slots=1))
    s.submit(1, "a", "interactive", 0.0, timeout=60)
    load_ready(s, "a", 1.0)                                                   # 1 runs on a
    s.submit(2, "a", "interactive", 1.0, timeout=60)                          # waits for a's slot
    s.submit(3, "a", "interactive", 1.0, request=9, step=2, steps=3, timeout=60)  # a later step of a started request
    s.submit(4, "b", "background", 1.0, timeout=60)                           # waits for b to load
    effects = s.close(2.0)
    refusal = "steward is shutting down; try again once it is back"
    assert [a for a in actions(effects) if isinstance(a, Fail)] == [
        Fail(2, 503, "shutting_down", refusal, 5.0), Fail(4, 503, "shutting_down", refusal, 5.0)]
    assert events(effects).count("reject") == 2
    assert set(s.waiting) == {3}
    assert actions(s.submit(5, "a", "interactive", 2.5, timeout=60)) == [Fail(5, 503, "shutting_down", refusal, 5.0)]
    # The running step finishes; the started request's next step still gets the slot.
    assert actions(s.finish(1, 3.0, 200)) == [Grant(3, "a", s.engines["a"].endpoint)]


def test_model_that_can_never_fit_is_rejected_at_once() -> None:
    s = make(8, engine("embed", 1, pinned=True), engine("huge", 7.5))
    effects = s.submit(1, "huge", "interactive", 0.0, timeout=60)
    fail = actions(effects)[0]
    assert isinstance(fail, Fail) and fail.status == 503 and fail.code == "insufficient_memory"


def test_crash_releases_memory_and_the_next_demand_restarts_after_exponential_backoff() -> None:
    s = make(10, engine("a", 4, slots=1))
    s.submit(1, "a", "interactive", 0.0, timeout=60)
    load_ready(s, "a", 1.0)
    effects = s.engine_exited("a", 1, 2.0, "killed by SIGKILL")
    assert "crash" in events(effects)
    assert s.engines["a"].status is EngineStatus.FAILED
    assert s.ledger.totals == {}
    s.finish(1, 2.0)  # the handler reports its failed request
    assert s.engines["a"].in_flight == 0
    # Next demand at 2.5: backoff is 1 s after the first failure, so the restart comes at 3.0.
    assert actions(s.submit(2, "a", "interactive", 2.5, timeout=60)) == []
    assert s.next_wakeup() == 3.0
    effects = s.tick(3.0)
    assert actions(effects) == [StartEngine("a", 2)]
    assert "restart" in events(effects)
    # It fails during start: the waiting job gets a clean error, backoff doubles.
    effects = s.engine_exited("a", 2, 3.5, "exited with status 1; last output: error loading model")
    fail = actions(effects)[0]
    assert isinstance(fail, Fail) and fail.code == "engine_start_failed" and fail.retry_after == 2.0
    assert "error loading model" in fail.message
    assert s.engines["a"].retry_at == 5.5


def test_job_whose_deadline_comes_before_the_restart_is_refused_now() -> None:
    s = make(10, engine("a", 4), backoff=BackoffPolicy(30.0, 60.0))
    s.submit(1, "a", "interactive", 0.0, timeout=60)
    s.engine_exited("a", 1, 1.0, "exited with status 1")
    effects = s.submit(2, "a", "interactive", 2.0, timeout=5.0)
    fail = actions(effects)[0]
    assert fail.code == "engine_failed" and fail.retry_after == pytest.approx(29.0)


def test_reports_about_an_older_process_are_ignored() -> None:
    s = make(10, engine("a", 4))
    s.submit(1, "a", "interactive", 0.0, timeout=60)
    s.engine_exited("a", 1, 1.0, "crash")  # during start: job 1 is refused
    s.submit(2, "a", "interactive", 1.5, timeout=60)
    s.tick(2.0)  # restarts as generation 2
    assert s.engines["a"].generation == 2
    assert actions(s.engine_exited("a", 1, 2.5, "late news")) == []
    assert s.engines["a"].status is EngineStatus.STARTING


def test_fifo_head_waiting_for_memory_is_not_overtaken_by_a_later_load() -> None:
    s = make(10, engine("a", 6), engine("b", 6), engine("c", 3))
    s.submit(1, "a", "interactive", 0.0, timeout=60)
    load_ready(s, "a", 1.0)  # a busy with job 1
    s.submit(2, "b", "interactive", 2.0, timeout=60)  # needs a drained
    # c would fit in the 4 GiB free now, but that memory is promised to b.
    assert actions(s.submit(3, "c", "interactive", 2.5, timeout=60)) == []
    assert s.engines["c"].status is EngineStatus.STOPPED
