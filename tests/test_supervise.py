"""Supervision with restart (supervisor/supervise.py) in virtual time: MockClock(autojump_threshold=0),
exact times. A restartable task that fails is an event and comes back after its backoff; a
fatal one ends what runs it; a task that fails before it started is the caller's error; a
failing event listener or an event JSON cannot hold never reaches whoever emitted it.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any

import pytest
import trio
import trio.testing

from supervisor.backoff import Backoff
from supervisor.observe.events import Event, EventLog
from supervisor.observe.health import RecentActivity, StandingFaults, assess
from supervisor.scheduler.core import Scheduler
from supervisor.supervise import OnFailure, Supervision, TaskState, serve_contained_nursery, supervise

SLO = {"interactive": 30.0, "background": 300.0, "batch": 1800.0}


def new_events() -> EventLog:
    send, _ = trio.open_memory_channel[Event](math.inf)
    return EventLog(send, recent_max=1000)


def named(events: EventLog, name: str) -> list[dict[str, Any]]:
    return [{**event.fields, "at": event.mono} for event in events.recent if event.name == name]


class Boom(Exception):
    pass


class FailingTask:
    """Fails at each of *fail_after* seconds after its (re)start, in turn; then runs until cancelled."""

    def __init__(self, *fail_after: float) -> None:
        self.fail_after = list(fail_after)
        self.starts: list[float] = []

    async def __call__(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        self.starts.append(trio.current_time())
        task_status.started(f"handle {len(self.starts)}")
        if self.fail_after:
            await trio.sleep(self.fail_after.pop(0))
            raise Boom(f"failure {len(self.starts)}")
        await trio.sleep_forever()


async def test_a_restartable_task_comes_back_after_each_backoff_delay_and_says_so(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    events = new_events()
    supervision = Supervision(events, Backoff(1.0, 8.0))
    task = FailingTask(5.0, 0.5, 0.5)
    handle = await nursery.start(supervise, supervision, "poller", task)
    assert handle == "handle 1"  # the first start's: callers keep it
    await trio.sleep(100)
    # fails at 5, back at 6 (1 s); fails at 6.5, back at 8.5 (2 s); fails at 9, back at 13 (4 s)
    assert task.starts == [0.0, 6.0, 8.5, 13.0]
    failed = named(events, "task_failed")
    assert [(e["at"], e["restart_in_s"], e["failures"], e["error"]) for e in failed] == [
        (5.0, 1.0, 1, "Boom: failure 1"), (6.5, 2.0, 2, "Boom: failure 2"), (9.0, 4.0, 3, "Boom: failure 3")]
    assert all(e["fatal"] is False and "Boom: failure" in e["traceback"] for e in failed)
    assert [e["at"] for e in named(events, "task_restarted")] == [6.0, 8.5, 13.0]
    record = supervision.tasks["poller"]
    assert (record.state, record.failures, record.last_error) == (TaskState.RUNNING, 3, "Boom: failure 3")
    assert supervision.to_json() == {"poller": {"state": "running", "on_failure": "restart", "failures": 3,
                                                "last_error": "Boom: failure 3"}}


async def test_a_task_that_ran_as_long_as_the_cap_starts_again_from_the_first_delay(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    events = new_events()
    supervision = Supervision(events, Backoff(1.0, 8.0))
    task = FailingTask(0.0, 0.0, 8.0, 0.0)
    await nursery.start(supervise, supervision, "poller", task)
    await trio.sleep(100)
    # 1 s, 2 s; then it ran 8 s (the cap): 1 s again, then 2 s
    assert task.starts == [0.0, 1.0, 3.0, 12.0, 14.0]
    assert [e["restart_in_s"] for e in named(events, "task_failed")] == [1.0, 2.0, 1.0, 2.0]


async def test_while_a_task_waits_to_restart_health_is_degraded_and_names_it(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    events = new_events()
    recent, standing = RecentActivity(window=60.0), StandingFaults()
    events.listeners += [recent.observe, standing.observe]
    supervision = Supervision(events, Backoff(10.0, 10.0))
    await nursery.start(supervise, supervision, "usage log writer", FailingTask(1.0))
    snapshot = Scheduler.create(2**30, []).snapshot()
    await trio.sleep(2.0)  # failed at 1, back at 11
    health = assess(snapshot, recent, SLO, trio.current_time(), standing.faults)
    assert health.status.value == "degraded"
    assert health.reasons == ("steward's task 'usage log writer' failed (Boom: failure 1); it restarts in 10.0s",
                              "steward's task 'usage log writer' failed 1 time(s) in the last 60s")
    await trio.sleep(10.0)  # t=12: running again, the failure still within the window
    health = assess(snapshot, recent, SLO, trio.current_time(), standing.faults)
    assert health.reasons == ("steward's task 'usage log writer' failed 1 time(s) in the last 60s",)
    await trio.sleep(60.0)  # t=72: the failure is older than the window
    assert assess(snapshot, recent, SLO, trio.current_time(), standing.faults).status.value == "ok"


async def test_a_fatal_task_that_fails_is_an_event_and_ends_what_runs_it(
        autojump_clock: trio.testing.MockClock) -> None:
    events = new_events()
    supervision = Supervision(events)
    with pytest.RaisesGroup(pytest.RaisesExc(Boom, match="failure 1"), flatten_subgroups=True):
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(supervise, supervision, "scheduler actor", FailingTask(3.0),
                                                  on_failure=OnFailure.STOP_SERVICE))
    assert trio.current_time() == 3.0
    [failed] = named(events, "task_failed")
    assert failed["fatal"] is True and failed["task"] == "scheduler actor"
    assert supervision.tasks["scheduler actor"].state is TaskState.ENDED


async def test_a_task_that_fails_before_it_started_is_the_callers_error_and_not_restarted(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    async def cannot_open(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        raise OSError("usage.db: cannot open 'x': it is a directory")

    events = new_events()
    with pytest.raises(OSError, match="it is a directory"):  # as nursery.start raises it: no group around it
        await nursery.start(supervise, Supervision(events), "usage log writer", cannot_open)
    assert named(events, "task_failed") == []


async def test_a_task_that_returns_has_ended_and_is_not_restarted(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    async def once(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep(1.0)

    supervision = Supervision(new_events())
    await nursery.start(supervise, supervision, "ollama probe", once)
    await trio.sleep(5.0)
    assert supervision.tasks["ollama probe"].state is TaskState.ENDED


async def test_two_tasks_cannot_share_a_name(autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    supervision = Supervision(new_events())
    await nursery.start(supervise, supervision, "poller", FailingTask())
    with pytest.raises(ValueError, match="supervised already"):
        await nursery.start(supervise, supervision, "poller", FailingTask())


async def test_a_job_that_fails_in_a_contained_nursery_is_an_event_and_the_others_go_on(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    events = new_events()
    jobs = await nursery.start(serve_contained_nursery, "image job", events)
    finished: list[float] = []

    async def job(fails: bool) -> None:
        await trio.sleep(1.0)
        if fails:
            raise Boom("no image")
        await trio.sleep(1.0)
        finished.append(trio.current_time())

    jobs.start_soon(job, True)
    jobs.start_soon(job, False)
    await trio.sleep(5.0)
    assert finished == [2.0]
    [error] = named(events, "internal_error")
    assert (error["source"], error["error"], error["at"]) == ("image job", "Boom: no image", 1.0)


def test_a_listener_that_fails_is_an_internal_error_never_the_emitters_failure() -> None:
    events = new_events()
    seen: list[str] = []

    def broken(event: Event) -> None:
        raise KeyError("waited_s")

    events.listeners += [broken, lambda event: seen.append(event.name)]
    events.emit("dispatch", "info", engine="chat")  # the scheduler actor emits: it must not see the KeyError
    assert sorted(seen) == ["dispatch", "internal_error"]  # the listeners after the broken one still hear it
    [error] = named(events, "internal_error")
    assert error["source"] == "event listener" and error["event"] == "dispatch"
    assert error["error"] == "KeyError: 'waited_s'" and "broken" in error["listener"]


def test_an_event_json_cannot_hold_is_written_as_text_and_a_lone_surrogate_as_its_escape() -> None:
    loop: list[Any] = []
    loop.append(loop)
    record = json.loads(Event("request", "info", {"model": "x\ud800", "loop": loop, "n": 2}, 1.0, 2.0).to_json())
    assert (record["model"], record["loop"], record["n"]) == ("x\ud800", "[[...]]", 2)
    line = Event("request", "info", {"model": "x\ud800"}, 1.0, 2.0).to_line()
    assert line.endswith("x\\ud800") and line.encode("utf-8")  # a terminal can take it
