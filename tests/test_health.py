"""/healthz from what is happening: waits over slo_wait, rejections, failing engines.

The core is driven in virtual time with exact assertions: a real Scheduler core and a
RecentActivity fed from its own events, as steward wires them.
"""

from __future__ import annotations

import time

import pytest
import trio
import trio.testing

from supervisor.observe.health import HealthStatus, HealthWatch, RecentActivity, assess, serve_health
from supervisor.request_class import RequestClass
from supervisor.scheduler.types import EngineProfile, SchedulingPolicy
from tests.harness import GIB, Harness, start_harness

SLO = {"interactive": 5.0, "background": 60.0, "batch": 600.0}


async def watched(nursery: trio.Nursery, window: float, *profiles: EngineProfile,
                  policy: SchedulingPolicy | None = None,
                  slo: dict[str, float] = SLO) -> tuple[Harness, HealthWatch]:
    """A scheduler in virtual time and the health watch over it, fed from its events as in steward."""
    harness = await start_harness(nursery, 24, *profiles, policy=policy)
    recent = RecentActivity(window=window)
    harness.events.listeners.append(recent.observe)
    return harness, HealthWatch(harness.client, recent, slo)


async def test_a_class_waiting_past_its_slo_is_overloaded_and_ok_once_served(
        autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        harness, watch = await watched(nursery, 300.0, EngineProfile("chat", 8 * GIB, slots=1))
        assert watch.assess().status is HealthStatus.OK

        async def chat(hold: float) -> None:
            async with harness.client.open_grant("chat", RequestClass.INTERACTIVE):
                await trio.sleep(hold)

        nursery.start_soon(chat, 20.0)  # loads in 2 s, then holds the only slot until t=22
        await trio.sleep(0.1)
        nursery.start_soon(chat, 1.0)  # waits behind it
        await trio.sleep(5.0)
        assert watch.assess().status is HealthStatus.OK  # t=5.1: it has waited its 5 s, not more
        await trio.sleep(0.2)
        health = watch.assess()
        assert health.status is HealthStatus.OVERLOADED
        assert health.reasons == ("interactive requests have waited 5.2s, over their slo_wait of 5s",)
        assert health.waiting_s["interactive"] == 5.2
        await trio.sleep(17.0)  # t=22.3: the second chat runs
        health = watch.assess()
        assert health.status is HealthStatus.OK
        assert health.waited_share["interactive"] == 1.0  # both waited (the first for the load)
        nursery.cancel_scope.cancel()


async def test_capacity_rejections_overload_for_the_window_and_broken_ones_degrade(
        autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        policy = SchedulingPolicy(max_queue={"interactive": 1, "background": 10, "batch": 10})
        harness, watch = await watched(nursery, 60.0, EngineProfile("chat", 8 * GIB, slots=1),
                                       EngineProfile("huge", 40 * GIB, slots=1), policy=policy,
                                       slo={**SLO, "interactive": 1000.0})
        outcomes: list[str] = []

        async def chat() -> None:
            try:
                async with harness.client.open_grant("chat", RequestClass.INTERACTIVE):
                    await trio.sleep(3.0)
                outcomes.append("ok")
            except Exception as exc:  # JobFailed
                outcomes.append(getattr(exc, "failure").code)

        for _ in range(2):  # one waits (for the load), one finds the queue full
            nursery.start_soon(chat)
            await trio.sleep(0)
        await trio.sleep(0.5)
        health = watch.assess()
        assert outcomes == ["queue_full"]
        assert health.status is HealthStatus.OVERLOADED
        assert health.rejected == {"queue_full": 1}
        # Until when it stays overloaded: the second of the rejection at t=0 leaves the window at 61.
        until = health.overloaded_until
        assert until is not None and until - (time.time() - trio.current_time()) == pytest.approx(61.0, abs=0.01)
        assert health.reasons == ("1 requests rejected for capacity in the last 60s (queue_full: 1); overloaded "
                                  f"until {time.strftime('%H:%M:%S', time.localtime(until))} unless more are rejected",)
        await trio.sleep(61.0)  # t=61.5: the second of the rejection at t=0 has left the window
        assert watch.assess().status is HealthStatus.OK
        try:
            async with harness.client.open_grant("huge", RequestClass.BATCH):
                pass
        except Exception as exc:  # noqa: BLE001 - JobFailed: it can never fit
            assert getattr(exc, "failure").code == "insufficient_memory"
        health = watch.assess()
        assert health.status is HealthStatus.DEGRADED
        assert health.reasons == ("1 requests refused in the last 60s (insufficient_memory: 1)",)
        nursery.cancel_scope.cancel()


async def test_a_failed_engine_degrades_and_each_change_of_status_is_one_event(
        autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        harness, watch = await watched(nursery, 300.0, EngineProfile("chat", 8 * GIB, slots=1))
        await nursery.start(serve_health, watch, harness.events, 1.0)

        async def chat() -> None:
            async with harness.client.open_grant("chat", RequestClass.INTERACTIVE):
                await trio.sleep(100)

        nursery.start_soon(chat)
        await trio.sleep(3.0)  # loaded at t=2
        harness.engines["chat"].crash(1)  # its first generation
        await trio.sleep(1.5)
        health = watch.assess()
        assert health.status is HealthStatus.DEGRADED
        assert health.reasons == ("engine 'chat' crashed 1 time(s) in the last 5m",)
        await trio.sleep(300.0)  # the crash at t=3 has left the window
        changes = [(e.mono, e.fields["previous"], e.fields["status"]) for e in harness.events.recent
                   if e.name == "health"]
        assert changes == [(4.0, "ok", "degraded"), (304.0, "degraded", "ok")]  # assessed once a second
        nursery.cancel_scope.cancel()


def test_assess_is_pure_on_an_empty_snapshot() -> None:
    from supervisor.scheduler.core import Scheduler

    health = assess(Scheduler.create(GIB, []).snapshot(), RecentActivity(window=10.0), SLO, now=1000.0)
    assert health.to_json() == {"status": "ok", "reasons": [], "overloaded_until": None, "rejected": {},
                                "waited_share": {"interactive": None, "background": None, "batch": None},
                                "waiting_s": {"interactive": 0.0, "background": 0.0, "batch": 0.0}, "tasks": {},
                                "answers": {klass: {"answers": 0, "measured": 0, "ttft_p50_s": None, "ttft_p95_s": None,
                                                    "slowdown_p50": None, "slowdown_p95": None, "beside": {}}
                                            for klass in ("interactive", "background", "batch")}}
