"""A reload in the pure core: engines added, removed (drained, waiting requests answered
404) and changed (drained, waiting requests kept for the new engine), with exact times."""

from __future__ import annotations

from supervisor.scheduler.core import Scheduler
from supervisor.scheduler.types import (
    EngineProfile,
    EngineStatus,
    Fail,
    Grant,
    RetireEngine,
    SchedulingPolicy,
    StartEngine,
    StopEngine,
)

GIB = 1024**3


def of(kind: type, effects: list) -> list:
    return [e for e in effects if isinstance(e, kind)]


def running(s: Scheduler, name: str, now: float) -> None:
    s.engine_ready(name, s.engines[name].generation, "http://127.0.0.1:9000", now)


def test_a_removed_engine_finishes_its_steps_answers_its_waiting_ones_404_and_goes() -> None:
    s = Scheduler.create(16 * GIB, [EngineProfile("a", 4 * GIB, 1), EngineProfile("b", 4 * GIB, 1)])
    s.submit(1, "a", "interactive", 0.0)
    running(s, "a", 1.0)  # job 1 runs on a's one slot
    s.submit(2, "a", "interactive", 2.0)  # waits for it
    effects = s.retire_engine("a", None, 3.0)
    assert [(f.job_id, f.status, f.code) for f in of(Fail, effects)] == [(2, 404, "model_not_found")]
    assert s.engines["a"].status is EngineStatus.DRAINING and of(StopEngine, effects) == []
    refused = s.submit(3, "a", "interactive", 3.5)  # a request that was routed before the names changed
    assert [(f.status, f.code) for f in of(Fail, refused)] == [(404, "model_not_found")]
    assert of(StopEngine, s.finish(1, 4.0)) == [StopEngine("a", 1)]  # the step in flight finished first
    effects = s.engine_exited("a", 1, 5.0, "stopped")
    assert of(RetireEngine, effects) == [RetireEngine("a", replaced=False)]
    assert "a" not in s.engines and s.ledger.totals == {}
    s.submit(4, "b", "interactive", 6.0)
    assert s.engines["b"].status is EngineStatus.STARTING  # the others go on


def test_a_changed_engine_drains_then_its_waiting_requests_load_the_new_one() -> None:
    s = Scheduler.create(16 * GIB, [EngineProfile("a", 4 * GIB, 1)])
    s.submit(1, "a", "interactive", 0.0)
    running(s, "a", 1.0)
    s.submit(2, "a", "interactive", 2.0)
    effects = s.retire_engine("a", EngineProfile("a", 6 * GIB, 2), 3.0)
    assert of(Fail, effects) == [] and s.engines["a"].status is EngineStatus.DRAINING
    s.finish(1, 4.0)
    assert of(RetireEngine, s.engine_exited("a", 1, 5.0, "stopped")) == [RetireEngine("a", replaced=True)]
    assert of(StartEngine, s.tick(6.0)) == []  # not until its new task runs
    effects = s.engine_replaced("a", 7.0)
    assert of(StartEngine, effects) == [StartEngine("a", 2)]
    assert s.ledger.totals == {"a": 6 * GIB} and s.engines["a"].profile.slots == 2
    assert of(Grant, s.engine_ready("a", 2, "http://127.0.0.1:9001", 8.0)) == [Grant(2, "a", "http://127.0.0.1:9001")]


def test_a_loading_engine_retired_is_stopped_and_a_stopped_one_retires_at_once() -> None:
    s = Scheduler.create(16 * GIB, [EngineProfile("a", 4 * GIB, 1), EngineProfile("b", 4 * GIB, 1)])
    s.submit(1, "a", "interactive", 0.0)
    effects = s.retire_engine("a", EngineProfile("a", 5 * GIB, 1), 0.5)
    assert of(StopEngine, effects) == [StopEngine("a", 1)]  # a load of the old config is not finished
    assert of(RetireEngine, s.retire_engine("b", None, 0.6)) == [RetireEngine("b", replaced=False)]
    assert "b" not in s.engines


def test_an_added_engine_and_new_rules() -> None:
    s = Scheduler.create(16 * GIB, [EngineProfile("a", 4 * GIB, 1)])
    s.add_engine(EngineProfile("new", 2 * GIB, 1), 0.0)
    assert of(StartEngine, s.submit(1, "new", "interactive", 1.0)) == [StartEngine("new", 1)]
    s.replace_policy(SchedulingPolicy(queue_timeout={"interactive": 1.0, "background": 1.0, "batch": 1.0}), 2.0)
    s.submit(2, "a", "interactive", 2.0)
    assert s.waiting[2].deadline == 3.0


def test_an_added_engine_knows_its_load_time_from_the_state_file_before_its_first_load() -> None:
    s = Scheduler.create(16 * GIB, [EngineProfile("a", 4 * GIB, 1)])
    s.add_engine(EngineProfile("measured", 2 * GIB, 1), 0.0, load_s=7.5)
    s.add_engine(EngineProfile("never", 2 * GIB, 1), 0.0)
    measured = s.engines["measured"].reload_cost(0.0, 300.0, queued=True)
    assert (measured.load_s, measured.measured) == (7.5, True)
    never = s.engines["never"].reload_cost(0.0, 300.0, queued=True)
    assert (never.load_s, never.measured) == (3.0, False)  # 1 s + 1 s per GiB until measured
