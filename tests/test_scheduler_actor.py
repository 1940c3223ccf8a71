"""The scheduler actor in virtual time: MockClock(autojump_threshold=0), exact times.

Engines are scripted stand-ins that take a fixed time to load and to stop, so every
grant, timeout and restart happens at a time computed by hand.
"""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing

from supervisor.request_class import RequestClass
from supervisor.scheduler.actor import JobFailed
from supervisor.scheduler.types import EngineProfile
from tests.harness import GIB, LOAD_S, STOP_S, hold, start_harness


async def test_first_request_is_granted_exactly_when_the_engine_is_ready(autojump_clock: trio.testing.MockClock,
                                                                          nursery: trio.Nursery) -> None:
    h = await start_harness(nursery, 16, EngineProfile("chat", 8 * GIB, slots=1))
    log: list[tuple[str, float]] = []
    await hold(h.client, "chat", 1.0, log)
    assert log == [("granted chat chat", LOAD_S)]
    assert trio.current_time() == LOAD_S + 1.0


async def test_requests_beyond_the_slots_wait_and_go_in_order(autojump_clock: trio.testing.MockClock,
                                                               nursery: trio.Nursery) -> None:
    h = await start_harness(nursery, 16, EngineProfile("chat", 4 * GIB, slots=2))
    log: list[tuple[str, float]] = []
    async with trio.open_nursery() as clients:
        for i in range(5):
            clients.start_soon(hold, h.client, "chat", 3.0, log)
            await trio.sleep(0.1)  # arrival order 0.0, 0.1, ... 0.4
    # Two slots: 2 at ready (2.0), 2 when those finish (5.0), 1 more at 8.0.
    assert [t for _, t in log] == [2.0, 2.0, 5.0, 5.0, 8.0]
    waits = [d["waited_s"] for d in h.names("dispatch")]
    assert waits == pytest.approx([2.0, 1.9, 4.8, 4.7, 7.6])


async def test_queue_timeout_fires_at_the_exact_deadline(autojump_clock: trio.testing.MockClock,
                                                         nursery: trio.Nursery) -> None:
    h = await start_harness(nursery, 16, EngineProfile("chat", 4 * GIB, slots=1), queue_timeout=5.0)
    log: list[tuple[str, float]] = []
    async with trio.open_nursery() as clients:
        clients.start_soon(hold, h.client, "chat", 30.0, log)
        await trio.sleep(3.0)
        clients.start_soon(hold, h.client, "chat", 1.0, log)
    assert log == [("granted chat chat", 2.0), ("failed queue_timeout", 8.0)]
    assert h.names("timeout")[0]["waited_s"] == 5.0


async def test_a_client_that_leaves_the_queue_frees_its_place(autojump_clock: trio.testing.MockClock,
                                                              nursery: trio.Nursery) -> None:
    h = await start_harness(nursery, 16, EngineProfile("chat", 4 * GIB, slots=1))
    log: list[tuple[str, float]] = []
    async with trio.open_nursery() as clients:
        clients.start_soon(hold, h.client, "chat", 4.0, log)  # runs 2.0 .. 6.0
        await trio.sleep(0.1)
        with trio.move_on_after(1.0):  # gives up at 1.1, still queued
            await hold(h.client, "chat", 1.0, log)
        clients.start_soon(hold, h.client, "chat", 1.0, log)
    assert log == [("granted chat chat", 2.0), ("granted chat chat", 6.0)]
    assert len(h.names("withdraw")) == 1


async def test_eviction_loads_the_new_engine_only_after_the_old_one_exited(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    h = await start_harness(nursery, 10, EngineProfile("a", 6 * GIB, 1), EngineProfile("b", 6 * GIB, 1))
    log: list[tuple[str, float]] = []
    await hold(h.client, "a", 1.0, log)  # a ready at 2.0, done at 3.0
    await hold(h.client, "b", 1.0, log)  # at 3.0: evict a (stops by 3.5), load b (ready 5.5)
    assert log == [("granted a a", 2.0), ("granted b b", 3.0 + STOP_S + LOAD_S)]
    assert h.engines["b"].starts == [3.0 + STOP_S]
    assert [(e["engine"], e["at"]) for e in h.names("evict")] == [("a", 3.0)]


async def test_a_crashed_engine_restarts_on_demand_after_the_backoff(autojump_clock: trio.testing.MockClock,
                                                                     nursery: trio.Nursery) -> None:
    h = await start_harness(nursery, 10, EngineProfile("chat", 4 * GIB, 1))
    log: list[tuple[str, float]] = []
    await hold(h.client, "chat", 1.0, log)  # ready at 2.0, generation 1
    h.engines["chat"].crash(1)  # at 3.0
    await trio.sleep(0.25)
    await hold(h.client, "chat", 1.0, log)  # asks at 3.25; restart at 3.0 + 1.0 backoff; ready 2.0 later
    assert h.engines["chat"].starts == [0.0, 4.0]
    assert log[-1] == ("granted chat chat", 6.0)
    assert [e["restart_in_s"] for e in h.names("crash")] == [1.0]


async def test_the_wait_a_step_is_told_is_the_schedulers_own_and_zero_when_granted_as_taken(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    """One definition of "waited": the usage log's queued_s is the dispatch event's waited_s, so
    a step granted at once waited 0 s there too (not the actor's round trip, which made every
    request count as waited in `steward usage` while /healthz said few had)."""
    autojump_clock.rate = 1.0  # the clock also runs as real time does: the round trip to the actor takes some
    h = await start_harness(nursery, 16, EngineProfile("chat", 4 * GIB, slots=1))
    account = Account()
    async with h.client.open_grant("chat", RequestClass.INTERACTIVE, account=account):
        await trio.sleep(1.0)  # loaded for it: it waited LOAD_S (and a little)
    async with h.client.open_grant("chat", RequestClass.INTERACTIVE, account=account):
        pass  # a free slot: granted as it was taken
    assert account.waits[0] >= LOAD_S and account.waits[1] == 0.0
    assert [d["waited_s"] for d in h.names("dispatch")] == account.waits


@attrs.define
class Account:
    waits: list[float] = attrs.Factory(list)
    holds: list[float] = attrs.Factory(list)

    def waited(self, seconds: float) -> None:
        self.waits.append(seconds)

    def held(self, seconds: float) -> None:
        self.holds.append(seconds)


async def test_a_step_is_told_how_long_it_held_its_grant_and_a_refused_one_nothing(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    h = await start_harness(nursery, 16, EngineProfile("chat", 4 * GIB, slots=1), EngineProfile("huge", 40 * GIB, 1))
    account = Account()
    async with h.client.open_grant("chat", RequestClass.INTERACTIVE, account=account):
        await trio.sleep(1.5)
    async with h.client.open_grant(None, RequestClass.BATCH, account=account, exclusive_memory=8 * GIB):
        await trio.sleep(4.0)  # an image job: the whole GPU for 4 s
    with pytest.raises(JobFailed):
        async with h.client.open_grant("huge", RequestClass.BATCH, account=account):
            pass
    assert account.holds == [1.5, 4.0]
