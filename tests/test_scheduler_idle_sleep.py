"""Idle unload and sleeping engines in the pure core, with exact times.

Idle unload is the scheduler's decision, made in the actor like every other stop, so it can
never race a request (llama-swap #946): a request that arrives first keeps the engine; one
that arrives while it stops waits and loads it again. A sleeping engine keeps its process and
a smaller reservation; waking it is a load of the difference.
"""

from __future__ import annotations

import trio
import trio.testing

from supervisor.request_class import RequestClass
from supervisor.scheduler.core import Scheduler
from supervisor.scheduler.types import EngineProfile, EngineStatus, Grant, SchedulingPolicy, StartEngine, StopEngine
from tests.harness import GIB, LOAD_S, STOP_S, start_harness

URL = "http://127.0.0.1:9001"


def of(kind: type, effects: list) -> list:
    return [e for e in effects if isinstance(e, kind)]


def names(effects: list) -> list[str]:
    return [e.event for e in effects if hasattr(e, "event")]


def idle_engine(**profile: object) -> Scheduler:
    """chat: loaded for job 1 at t=0, ready at 2, job 1 done at 3; unloaded after 10 s idle."""
    s = Scheduler.create(16 * GIB, [EngineProfile("chat", 4 * GIB, 2, idle_unload=10.0, **profile)],  # type: ignore[arg-type]
                         SchedulingPolicy(interactive_window=0.0))  # no other wakeup in the way
    s.submit(1, "chat", "interactive", 0.0)
    s.engine_ready("chat", 1, URL, 2.0)
    s.finish(1, 3.0, 200)
    return s


def test_an_idle_engine_is_stopped_exactly_when_its_idle_time_is_up() -> None:
    s = idle_engine()
    assert s.next_wakeup() == 13.0
    assert of(StopEngine, s.tick(12.999)) == []
    effects = s.tick(13.0)
    assert of(StopEngine, effects) == [StopEngine("chat", 1)]
    idle = next(e for e in effects if getattr(e, "event", None) == "idle_unload")
    assert idle.fields == {"engine": "chat", "idle_s": 10.0, "idle_unload_s": 10.0}
    assert names(s.engine_exited("chat", 1, 13.5, "stopped")) == ["stopped"]
    assert s.ledger.reserved == 0


def test_a_request_before_the_idle_time_is_up_keeps_the_engine_and_starts_the_clock_again() -> None:
    s = idle_engine()
    s.submit(2, "chat", "interactive", 12.0)
    s.finish(2, 12.5, 200)
    assert s.next_wakeup() == 22.5
    assert of(StopEngine, s.tick(13.0)) == []
    assert of(StopEngine, s.tick(22.5)) == [StopEngine("chat", 1)]


def test_a_request_waiting_for_the_engine_is_never_unloaded_from_under_it() -> None:
    s = idle_engine()
    s.submit(2, "chat", "interactive", 5.0)  # running: in flight
    assert of(StopEngine, s.tick(20.0)) == []
    s.finish(2, 21.0, 200)
    assert of(StopEngine, s.tick(31.0)) == [StopEngine("chat", 1)]


def test_a_request_that_arrives_while_it_stops_waits_and_loads_it_again() -> None:
    s = idle_engine()
    s.tick(13.0)  # stopping
    effects = s.submit(2, "chat", "interactive", 13.1)
    assert of(Grant, effects) == [] and of(StartEngine, effects) == []
    effects = s.engine_exited("chat", 1, 13.5, "stopped")
    assert of(StartEngine, effects) == [StartEngine("chat", 2)]
    assert of(Grant, s.engine_ready("chat", 2, URL, 15.5))[0].job_id == 2


def test_always_on_engines_are_never_idle_unloaded() -> None:
    s = idle_engine(pinned=True)
    assert of(StopEngine, s.tick(1000.0)) == []


def sleeping_engine(sleep_memory: int | None) -> Scheduler:
    """chat (8 GiB, sleeps) evicted for big (10 GiB) on a 16 GiB budget."""
    s = Scheduler.create(16 * GIB, [EngineProfile("chat", 8 * GIB, 2, sleep_memory=sleep_memory),
                                    EngineProfile("big", 10 * GIB, 1)], SchedulingPolicy(hot_window=0.0))
    s.submit(1, "chat", "interactive", 0.0)
    s.engine_ready("chat", 1, URL, 2.0, pid=4242)
    s.finish(1, 3.0, 200)
    assert of(StopEngine, s.submit(2, "big", "interactive", 4.0)) == [StopEngine("chat", 1)]
    return s


def test_a_sleeping_engine_keeps_its_sleep_memory_and_frees_the_rest() -> None:
    s = sleeping_engine(sleep_memory=1 * GIB)
    effects = s.engine_asleep("chat", 1, 5.0, "asleep (level 1)")
    assert names(effects)[:2] == ["asleep", "load"]
    asleep = next(e for e in effects if e.event == "asleep")
    assert asleep.fields["reserved"] == 1 * GIB and asleep.fields["released"] == 7 * GIB
    assert of(StartEngine, effects) == [StartEngine("big", 1)]  # 1 + 10 of 16 GiB
    assert s.engines["chat"].status is EngineStatus.SLEEPING and s.snapshot().engines[0].status == "sleeping"


def test_waking_reserves_only_the_difference_and_keeps_its_process() -> None:
    s = sleeping_engine(sleep_memory=1 * GIB)
    s.engine_asleep("chat", 1, 5.0, "asleep (level 1)")
    s.engine_ready("big", 1, URL, 7.0)
    s.finish(2, 8.0, 200)
    # 16 - 1 (asleep) - 10 (big) = 5 GiB free: waking needs 7 more, so big is evicted first.
    assert of(StopEngine, s.submit(3, "chat", "interactive", 9.0)) == [StopEngine("big", 1)]
    effects = s.engine_exited("big", 1, 9.5, "stopped")
    wake = next(e for e in effects if getattr(e, "event", None) == "wake")
    assert wake.fields["memory"] == 8 * GIB and of(StartEngine, effects) == [StartEngine("chat", 2)]
    assert s.ledger.totals == {"chat": 8 * GIB}
    assert s.engines["chat"].pid == 4242  # the same process, woken
    assert of(Grant, s.engine_ready("chat", 2, URL, 9.7, pid=4242))[0].job_id == 3


def test_without_a_set_sleep_memory_what_it_holds_asleep_is_measured() -> None:
    s = sleeping_engine(sleep_memory=None)
    s.observe_memory = True
    s.engine_asleep("chat", 1, 5.0, "asleep (level 2)")
    assert s.ledger.totals["chat"] == 8 * GIB  # until a reading says otherwise
    effects = s.observe(5.1, used=512 * 1024**2, processes={4242: 512 * 1024**2})
    measured = next(e for e in effects if getattr(e, "event", None) == "measured")
    assert measured.fields["asleep"] is True and s.ledger.totals["chat"] == 512 * 1024**2
    assert of(StartEngine, effects) == [StartEngine("big", 1)]


def test_a_kept_process_that_dies_while_asleep_gives_its_memory_back() -> None:
    s = sleeping_engine(sleep_memory=1 * GIB)
    s.engine_asleep("chat", 1, 5.0, "asleep")
    assert names(s.engine_exited("chat", 1, 6.0, "its process ended while asleep")) == ["stopped"]
    assert "chat" not in s.ledger.totals and s.engines["chat"].status is EngineStatus.STOPPED


async def test_through_the_actor_idle_unload_happens_in_virtual_time(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        harness = await start_harness(nursery, 16, EngineProfile("chat", 4 * GIB, 1, idle_unload=600.0))
        async with harness.client.open_grant("chat", RequestClass.INTERACTIVE):
            await trio.sleep(1.0)
        await trio.sleep(700.0)
        assert [e["at"] for e in harness.names("idle_unload")] == [LOAD_S + 1.0 + 600.0]
        assert [e["at"] for e in harness.names("stopped")] == [LOAD_S + 1.0 + 600.0 + STOP_S]
        async with harness.client.open_grant("chat", RequestClass.INTERACTIVE):  # loaded again on demand
            assert harness.engines["chat"].starts == [0.0, LOAD_S + 1.0 + 700.0]
        nursery.cancel_scope.cancel()


def kept_process_at_start() -> Scheduler:
    """chat's kept process (a sleep-capable vLLM, pid 4242) holds its 6 GiB from steward's start,
    before chat is loaded; big (6 GiB) shares the 10 GiB card."""
    s = Scheduler.create(10 * GIB, [EngineProfile("chat", 6 * GIB, 2, sleep_memory=GIB // 2),
                                    EngineProfile("big", 6 * GIB, 1)], SchedulingPolicy(hot_window=0.0))
    s.observe_memory = True
    s.kept_process("chat", 4242, 0.0)
    return s


def test_a_kept_process_that_holds_memory_before_its_first_load_is_its_engines_not_outside_use() -> None:
    s = kept_process_at_start()
    measured = next(e for e in s.observe(0.5, used=6 * GIB, processes={4242: 6 * GIB}) if e.event == "measured")
    assert measured.fields == {"engine": "chat", "measured": 6 * GIB, "estimate": 0, "free": 4 * GIB, "loaded": False}
    assert s.ledger.outside == 0 and s.ledger.totals == {"chat": 6 * GIB}
    # Its own load counts it: it starts at once, in the same process, with nothing more reserved.
    effects = s.submit(1, "chat", "interactive", 1.0)
    assert of(StartEngine, effects) == [StartEngine("chat", 1)]
    assert s.ledger.totals == {"chat": 6 * GIB} and s.engines["chat"].pid == 4242
    assert of(Grant, s.engine_ready("chat", 1, URL, 1.5, pid=4242))[0].job_id == 1


def test_what_a_kept_process_holds_unloaded_is_out_of_other_loads_reach() -> None:
    s = kept_process_at_start()
    s.observe(0.5, used=6 * GIB, processes={4242: 6 * GIB})
    effects = s.submit(1, "big", "interactive", 1.0)  # 6 + 6 > 10
    assert of(StartEngine, effects) == [] and s.ledger.totals == {"chat": 6 * GIB}


def test_a_kept_process_that_ends_unloaded_gives_its_memory_back_once_it_is_seen_free() -> None:
    s = kept_process_at_start()
    s.observe(0.5, used=6 * GIB, processes={4242: 6 * GIB})
    s.submit(1, "big", "interactive", 1.0)  # waits
    s.kept_process("chat", None, 2.0)
    assert s.ledger.totals == {"chat": 6 * GIB}  # until its memory is seen free (the phantom guard)
    effects = s.observe(2.5, used=0, processes={})
    assert names(effects)[:2] == ["released", "load"] and of(StartEngine, effects) == [StartEngine("big", 1)]
    assert s.ledger.totals == {"big": 6 * GIB}
