"""Health of ready engines in the pure core, with exact times: when an engine counts as
unhealthy, what happens to its work, when it is restarted, and what a recovery undoes."""

from __future__ import annotations

import math

import trio
import trio.testing

from supervisor.request_class import RequestClass
from supervisor.scheduler.core import Scheduler
from supervisor.scheduler.types import (
    BackoffPolicy,
    CheckEngine,
    EngineProfile,
    EngineStatus,
    Grant,
    Revoke,
    SchedulingPolicy,
    StartEngine,
    StopEngine,
)
from tests.harness import GIB, LOAD_S, start_harness

TIMEOUT = "/health did not answer within 5s"


def make(**policy: object) -> Scheduler:
    s = Scheduler.create(16 * GIB, [EngineProfile("chat", 4 * GIB, 2)],
                         SchedulingPolicy(backoff=BackoffPolicy(1.0, 8.0), unhealthy_after=3, recover_timeout=30.0,
                                          **policy))  # type: ignore[arg-type]
    s.submit(1, "chat", "interactive", 0.0)
    s.engine_ready("chat", 1, "http://127.0.0.1:9001", 2.0)
    s.submit(2, "chat", "interactive", 2.0)
    return s


def of(kind: type, effects: list) -> list:
    return [e for e in effects if isinstance(e, kind)]


def names(effects: list) -> list[str]:
    return [e.event for e in effects if hasattr(e, "event")]


def test_three_failed_checks_in_a_row_make_it_unhealthy_and_revoke_its_running_steps() -> None:
    s = make()
    assert names(s.engine_checked("chat", 1, 10.0, TIMEOUT)) == ["health_check_failed"]
    assert names(s.engine_checked("chat", 1, 16.0, TIMEOUT)) == ["health_check_failed"]
    assert s.snapshot().engines[0].healthy
    effects = s.engine_checked("chat", 1, 22.0, TIMEOUT)
    assert names(effects)[:2] == ["health_check_failed", "engine_unhealthy"]
    assert sorted(r.job_id for r in of(Revoke, effects)) == [1, 2]
    assert not s.snapshot().engines[0].healthy


def test_a_good_check_resets_the_count() -> None:
    s = make()
    s.engine_checked("chat", 1, 10.0, TIMEOUT)
    s.engine_checked("chat", 1, 16.0, TIMEOUT)
    assert names(s.engine_checked("chat", 1, 20.0, None)) == []  # healthy all along: nothing to say
    s.engine_checked("chat", 1, 26.0, TIMEOUT)
    assert "engine_unhealthy" not in names(s.engine_checked("chat", 1, 32.0, TIMEOUT))


def test_an_unhealthy_engine_gets_no_new_work_and_a_recovery_gives_it_work_again() -> None:
    s = make()
    for t in (10.0, 16.0, 22.0):
        s.engine_checked("chat", 1, t, TIMEOUT)
    s.finish(1, 23.0, 502)
    s.finish(2, 23.0, 502)
    assert of(Grant, s.submit(3, "chat", "interactive", 24.0)) == []  # waits: the engine does not answer
    assert s.snapshot().engines[0].queued == 1
    effects = s.engine_checked("chat", 1, 40.0, None)
    assert "engine_recovered" in names(effects)
    recovered = next(e for e in effects if getattr(e, "event", "") == "engine_recovered")
    assert recovered.fields["unhealthy_s"] == 18.0
    assert of(Grant, effects) == [Grant(3, "chat", "http://127.0.0.1:9001")]
    assert s.next_wakeup() != 52.0  # the restart that was due is off


def test_an_engine_unhealthy_for_recover_timeout_is_restarted_as_a_failure_with_backoff() -> None:
    s = make()
    for t in (10.0, 16.0, 22.0):
        s.engine_checked("chat", 1, t, TIMEOUT)
    assert s.next_wakeup() == 52.0  # unhealthy since 22 s, recover_timeout 30 s
    assert of(StopEngine, s.tick(51.9)) == []
    effects = s.tick(52.0)
    assert of(StopEngine, effects) == [StopEngine("chat", 1)]
    restart = next(e for e in effects if getattr(e, "event", "") == "engine_restart")
    assert restart.fields == {"engine": "chat", "reason": "unhealthy", "unhealthy_s": 30.0, "in_flight": 2}
    # The revoked steps end; the process is gone: that is a failure, not an eviction.
    s.finish(1, 52.5, 502)
    s.finish(2, 52.5, 502)
    s.submit(3, "chat", "interactive", 53.0)
    effects = s.engine_exited("chat", 1, 55.0, "stopped (killed by SIGKILL)")
    crash = next(e for e in effects if getattr(e, "event", "") == "crash")
    assert "health checks" in crash.fields["detail"] and crash.fields["restart_in_s"] == 1.0
    assert s.engines["chat"].status is EngineStatus.FAILED
    assert of(StartEngine, s.tick(56.0)) == [StartEngine("chat", 2)]  # after the backoff, for the waiting step
    assert s.engines["chat"].unhealthy_since is None and s.engines["chat"].check_failures == 0


def test_checks_of_an_older_process_or_of_an_engine_that_is_not_ready_count_for_nothing() -> None:
    s = make()
    for t in (10.0, 16.0, 22.0):
        assert s.engine_checked("chat", 0, t, TIMEOUT) == []  # generation 0: a process that is gone
    assert s.snapshot().engines[0].healthy
    starting = Scheduler.create(16 * GIB, [EngineProfile("chat", 4 * GIB, 2)])
    starting.submit(1, "chat", "interactive", 0.0)
    assert starting.engine_checked("chat", 1, 1.0, TIMEOUT) == []


def test_a_stalled_request_asks_for_a_check_now() -> None:
    s = make()
    effects = s.engine_stalled("chat", 1, 30.0, "no answer within 600s")
    assert of(CheckEngine, effects) == [CheckEngine("chat", 1)]
    assert names(effects) == ["engine_stalled"]
    assert s.engine_stalled("chat", 0, 31.0, "old") == []


async def test_through_the_actor_a_revoked_step_is_aborted_in_virtual_time(autojump_clock: trio.testing.MockClock,
                                                                          ) -> None:
    async with trio.open_nursery() as nursery:
        harness = await start_harness(nursery, 16, EngineProfile("chat", 4 * GIB, 1))
        outcome: list[tuple[str, float]] = []

        async def hold() -> None:
            async with harness.client.open_grant("chat", RequestClass.INTERACTIVE) as lease:
                with lease.abort.scope:
                    await trio.sleep(math.inf)
                outcome.append((lease.abort.reason or "", trio.current_time()))

        nursery.start_soon(hold)
        await trio.sleep(LOAD_S + 1.0)
        for _ in range(3):
            harness.client.report_health("chat", 1, TIMEOUT)
        await trio.sleep(0.5)
        assert outcome == [(f"stopped answering its health checks ({TIMEOUT})", LOAD_S + 1.0)]
        nursery.cancel_scope.cancel()


async def test_a_stall_report_reaches_the_engine_as_a_check(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        harness = await start_harness(nursery, 16, EngineProfile("chat", 4 * GIB, 1))
        async with harness.client.open_grant("chat", RequestClass.INTERACTIVE):
            harness.client.report_stall("chat", 1, "nothing for 120s between two chunks")
            await trio.sleep(0.1)
        assert harness.engines["chat"].checks == [(1, LOAD_S)]
        nursery.cancel_scope.cancel()
