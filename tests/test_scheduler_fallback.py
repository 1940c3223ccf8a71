"""Fallback chains in the pure core (rule 11), with exact times: each `when`, the class
filter, the key's models, no loop, and a fallback that has no room itself (then the request
waits, as without a chain)."""

from __future__ import annotations

from typing import Any

from supervisor.request_class import RequestClass
from supervisor.scheduler import fallback
from supervisor.scheduler.core import Scheduler
from supervisor.scheduler.types import (
    BackoffPolicy,
    EngineProfile,
    FallbackRoute,
    FallbackWhen,
    Grant,
    SchedulingPolicy,
    StartEngine,
    StopEngine,
)

GIB = 1024**3
URL = "http://127.0.0.1:9001"
NO_ROOM, WAIT, FAILED = FallbackWhen.NO_ROOM, FallbackWhen.WAIT, FallbackWhen.FAILED
LOWER = frozenset({RequestClass.BACKGROUND, RequestClass.BATCH})


def route(model: str, *when: FallbackWhen, classes: frozenset[RequestClass] | None = None,
          wait: float | None = None, remote: bool = False) -> FallbackRoute:
    return FallbackRoute(model, frozenset(when), classes, wait, remote=remote)


def steward(*chain: FallbackRoute, small_chain: tuple[FallbackRoute, ...] = (), load_times: dict[str, float] | None = None,
            small_gib: float = 4, **policy: Any) -> Scheduler:
    """A 16 GiB card: chat (10 GiB), big (12 GiB, its chain), small (a smaller variant of big)."""
    return Scheduler.create(16 * GIB, [EngineProfile("chat", 10 * GIB, 2), EngineProfile("big", 12 * GIB, 1, fallback=chain),
                                       EngineProfile("small", int(small_gib * GIB), 1, fallback=small_chain)],
                            SchedulingPolicy(backoff=BackoffPolicy(30.0, 30.0), **policy), load_times=load_times)


def fallbacks(effects: list) -> list[dict[str, Any]]:
    return [e.fields for e in effects if getattr(e, "event", None) == "fallback"]


def starts(effects: list) -> list[StartEngine]:
    return [e for e in effects if isinstance(e, StartEngine)]


def hot_chat(s: Scheduler) -> None:
    """chat loaded and used by a chat at 0-1 s: hot for hot_window (300 s)."""
    s.submit(1, "chat", "interactive", 0.0)
    s.engine_ready("chat", 1, URL, 0.5)
    s.finish(1, 1.0, 200)


def test_no_room_a_background_request_for_a_model_that_would_evict_a_hot_one_goes_to_the_smaller() -> None:
    s = steward(route("small", NO_ROOM, classes=LOWER))
    hot_chat(s)
    effects = s.submit(2, "big", "background", 5.0)
    assert fallbacks(effects) == [{
        "job": 2, "request": 2, "model": "big", "to": "small", "class": RequestClass.BACKGROUND, "when": "no_room",
        "waited_s": 0.0, "remote": False, "why": fallbacks(effects)[0]["why"]}]
    assert fallbacks(effects)[0]["why"].startswith("background request for big goes to small: ")
    assert starts(effects) == [StartEngine("small", 1)]  # 10 + 4 of 16: no eviction
    assert [e for e in s.engine_ready("small", 1, URL, 6.0) if isinstance(e, Grant)] == [Grant(2, "small", URL)]


def test_the_class_filter_an_interactive_request_keeps_its_model_and_evicts() -> None:
    s = steward(route("small", NO_ROOM, classes=LOWER))
    hot_chat(s)
    effects = s.submit(2, "big", "interactive", 5.0)
    assert fallbacks(effects) == [] and [e for e in effects if isinstance(e, StopEngine)] == [StopEngine("chat", 1)]


def test_wait_a_model_whose_load_alone_passes_the_slo_goes_to_the_fallback_at_once() -> None:
    s = steward(route("small", WAIT), load_times={"big": 45.0}, slo_wait={"interactive": 30.0, "background": 300.0,
                                                                          "batch": 1800.0})
    effects = s.submit(1, "big", "interactive", 2.0)
    [moved] = fallbacks(effects)
    assert (moved["when"], moved["why"]) == ("wait", "interactive request for big goes to small: it would wait 45s, "
                                                     "past 30s (interactive's slo_wait)")
    assert starts(effects) == [StartEngine("small", 1)]


def test_wait_a_request_behind_a_busy_slot_goes_exactly_when_the_routes_bound_passes() -> None:
    s = steward(route("small", WAIT, wait=20.0))
    s.submit(1, "big", "interactive", 0.0)
    s.engine_ready("big", 1, URL, 1.0)  # job 1 holds big's one slot
    assert fallbacks(s.submit(2, "big", "interactive", 3.0)) == []
    assert list(fallback.next_times(s)) == [23.0]  # a decision is due then
    assert fallbacks(s.tick(22.999)) == []
    effects = s.tick(23.0)
    assert [(f["job"], f["when"], f["waited_s"]) for f in fallbacks(effects)] == [(2, "wait", 20.0)]
    # small fits beside nothing else: big's 12 + small's 4 = 16 GiB.
    assert starts(effects) == [StartEngine("small", 1)]


def test_failed_a_request_waiting_for_a_crashed_engine_goes_to_the_fallback_not_its_backoff() -> None:
    s = steward(route("small", FAILED))
    s.submit(1, "big", "batch", 0.0)
    effects = s.engine_exited("big", 1, 2.0, "exited with status 1")  # during its start
    [moved] = fallbacks(effects)  # job 1 goes along the chain rather than being refused
    assert (moved["job"], moved["when"], moved["why"]) == (
        1, "failed", "batch request for big goes to small: big's engine failed; it starts again in 30s at the earliest")
    assert [e for e in effects if getattr(e, "job_id", None) == 1] == [] and starts(effects) == [StartEngine("small", 1)]
    effects = s.submit(2, "big", "batch", 3.0)  # would wait for the retry at 32 s
    [moved] = fallbacks(effects)
    assert (moved["when"], moved["why"]) == (
        "failed", "batch request for big goes to small: big's engine failed; it starts again in 29s at the earliest")
    assert starts(effects) == []  # small is loading for job 1 already


def test_failed_without_a_route_that_holds_a_request_waiting_for_a_failed_start_is_refused_as_before() -> None:
    s = steward(route("small", FAILED, classes=frozenset({RequestClass.INTERACTIVE})))
    s.submit(1, "big", "batch", 0.0)
    effects = s.engine_exited("big", 1, 2.0, "exited with status 1")
    assert fallbacks(effects) == []
    assert [(e.status, e.code) for e in effects if getattr(e, "job_id", None) == 1] == [(503, "engine_start_failed")]


def test_a_fallback_is_taken_once_and_its_own_chain_is_not_followed() -> None:
    s = steward(route("small", NO_ROOM, classes=LOWER), small_chain=(route("big", WAIT, wait=1.0),))
    hot_chat(s)
    s.submit(2, "big", "background", 5.0)  # to small, which loads
    effects = s.tick(100.0)  # small still loading: its own chain would send it back to big
    assert fallbacks(effects) == []
    assert [e for e in s.engine_ready("small", 1, URL, 101.0) if isinstance(e, Grant)] == [Grant(2, "small", URL)]


def test_a_fallback_stays_within_the_models_the_key_may_use() -> None:
    s = steward(route("small", NO_ROOM, classes=LOWER))
    hot_chat(s)
    effects = s.submit(2, "big", "background", 5.0, may_use=frozenset({"big", "chat"}))
    assert fallbacks(effects) == [] and starts(effects) == []  # it waits for big, as without a chain


def test_a_fallback_with_no_room_itself_leaves_the_request_waiting() -> None:
    s = steward(route("small", NO_ROOM, classes=LOWER), small_gib=8)  # 10 (hot chat) + 8 > 16 as well
    hot_chat(s)
    effects = s.submit(2, "big", "background", 5.0)
    assert fallbacks(effects) == [] and starts(effects) == []
    assert s.snapshot().lines[0].engine == "big"


# --- a fallback to a cloud's model (runtime: remote) ----------------------------------------------

CLOUD = frozenset({"cloud"})


def test_a_cloud_route_takes_an_interactive_request_at_its_bound_and_it_leaves_the_scheduler() -> None:
    """The issue's chain: background and batch to the smaller variant, interactive to a cloud."""
    s = steward(route("small", NO_ROOM, WAIT, classes=LOWER),
                route("cloud", WAIT, FAILED, classes=frozenset({RequestClass.INTERACTIVE}), remote=True))
    s.submit(1, "big", "interactive", 0.0, may_use=CLOUD)
    s.engine_ready("big", 1, URL, 1.0)  # job 1 holds big's one slot
    assert fallbacks(s.submit(2, "big", "interactive", 4.0, may_use=CLOUD)) == []
    assert list(fallback.next_times(s)) == [34.0]  # interactive's slo_wait, 30 s
    effects = s.tick(34.0)
    [moved] = fallbacks(effects)
    assert (moved["to"], moved["when"], moved["waited_s"], moved["remote"]) == ("cloud", "wait", 30.0, True)
    assert moved["why"] == ("interactive request for big goes to cloud (a cloud): it would wait 30s, past 30s "
                            "(interactive's slo_wait)")
    assert [e for e in effects if isinstance(e, Grant)] == [Grant(2, "cloud", None, remote=True)]
    assert starts(effects) == [] and s.snapshot().lines == ()  # no engine loads for it; nothing waits
    assert s.finish(2, 50.0, 200) == []  # its end is no slot's: nothing to decide


def test_a_cloud_route_serves_the_requests_of_a_model_whose_engine_failed() -> None:
    s = steward(route("cloud", FAILED, remote=True))
    s.submit(1, "big", "batch", 0.0, may_use=CLOUD)
    effects = s.engine_exited("big", 1, 2.0, "exited with status 1")  # during its start: job 1 waited for it
    assert [e for e in effects if isinstance(e, Grant)] == [Grant(1, "cloud", None, remote=True)]
    effects = s.submit(2, "big", "batch", 3.0, may_use=CLOUD)
    assert [e for e in effects if isinstance(e, Grant)] == [Grant(2, "cloud", None, remote=True)]
    assert fallbacks(effects)[0]["why"] == ("batch request for big goes to cloud (a cloud): big's engine failed; it "
                                            "starts again in 29s at the earliest")


def test_a_cloud_route_is_taken_only_where_the_caller_said_its_key_may_reach_it() -> None:
    """A caller that names no models (None: any, e.g. a listener with no keys of its own) never
    sends data out of the house by a chain: the gateway names the cloud when the key may."""
    for may_use in (None, frozenset({"small"})):
        s = steward(route("cloud", NO_ROOM, remote=True))
        hot_chat(s)
        effects = s.submit(2, "big", "background", 5.0, may_use=may_use)
        assert fallbacks(effects) == [] and [e for e in effects if isinstance(e, Grant)] == []


def test_a_cloud_route_after_a_local_one_with_no_room() -> None:
    """The first route's target has no room itself: the next route, a cloud's, takes the request."""
    s = steward(route("small", NO_ROOM, classes=LOWER), route("cloud", NO_ROOM, remote=True), small_gib=8)
    hot_chat(s)
    effects = s.submit(2, "big", "background", 5.0, may_use=frozenset({"small", "cloud"}))
    assert [(f["to"], f["when"]) for f in fallbacks(effects)] == [("cloud", "no_room")]
    assert [e for e in effects if isinstance(e, Grant)] == [Grant(2, "cloud", None, remote=True)]
