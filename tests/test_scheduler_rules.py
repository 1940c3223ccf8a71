"""The scheduler's hard rules, and the bugs GridCore found on real hardware, replayed in
virtual time: MockClock(autojump_threshold=0), scripted engines, exact times.

Times are chosen to be exact binary fractions, so every assertion is an equality.
"""

from __future__ import annotations

import trio
import trio.testing

from supervisor.scheduler.core import Scheduler
from supervisor.scheduler.types import (
    BackoffPolicy,
    Emit,
    EngineProfile,
    EngineStatus,
    Fail,
    Grant,
    SchedulingPolicy,
    StartEngine,
    StopEngine,
)
from tests.harness import GIB, LOAD_S, STOP_S, client_loop, hold, hold_steps, start_harness


def pinned(name: str, gib: float, slots: int) -> EngineProfile:
    return EngineProfile(name, int(gib * GIB), slots, pinned=True)


def policy(**overrides: object) -> SchedulingPolicy:
    starvation = {"interactive": 0.0, "background": overrides.pop("background", 3.0),
                  "batch": overrides.pop("batch", 3.0)}
    return SchedulingPolicy(starvation=starvation, **overrides)  # type: ignore[arg-type]


def eager(**overrides: object) -> SchedulingPolicy:
    """GridCore's guard exactly: a step as soon as the starvation time has passed."""
    return policy(guard_share=1.0, guard_gap_wait=0.0, **overrides)


# ---- GridCore's regressions ---------------------------------------------------------

async def test_regression_six_chat_clients_cannot_starve_background_work(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    h = await start_harness(nursery, 16, pinned("chat", 8, 2), pinned("agent", 4, 2), policy=eager())
    await trio.sleep(LOAD_S)
    chats: list[tuple[str, float]] = []
    background: list[tuple[str, float]] = []
    async with trio.open_nursery() as clients:
        for _ in range(6):  # six chat clients on two slots: interactive work never stops
            clients.start_soon(client_loop, h.client, "chat", "interactive", 1.25, 0.125, chats, 62.0)
        await trio.sleep(0.5)
        clients.start_soon(client_loop, h.client, "agent", "background", 1.0, 0.0, background, 62.0)
    # Asked at 2.5; no progress for 3 s lets one step run beside the chats; it runs 1 s,
    # which is progress, so the next one waits 3 s again.
    assert [t for _, t in background] == [2.5 + 3 + 4 * k for k in range(15)]
    assert all(e["class"] == "background" for e in h.names("starvation_step"))
    assert len(chats) > 90  # and the chats kept going all along: two slots, 1.25 s each


async def test_regression_with_default_settings_background_still_progresses_under_constant_chat(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    h = await start_harness(nursery, 16, pinned("chat", 8, 2), pinned("agent", 4, 2))
    await trio.sleep(LOAD_S)
    chats: list[tuple[str, float]] = []
    background: list[tuple[str, float]] = []
    async with trio.open_nursery() as clients:
        for _ in range(6):
            clients.start_soon(client_loop, h.client, "chat", "interactive", 1.25, 0.125, chats, 62.0)
        await trio.sleep(0.5)
        clients.start_soon(client_loop, h.client, "agent", "background", 1.0, 0.0, background, 62.0)
    # The chats never leave a gap: due at 5.5, the step waits guard_gap_wait (15 s) for one,
    # then goes. After a 1 s step the lane rests 1 s (guard_share 0.5); the next is due 3 s
    # after the step's end, and again waits 15 s: a step every 19 s.
    times = [t for _, t in background]
    assert times[:3] == [20.5, 39.5, 58.5]
    # As the chats wind down (they stop asking at 62), the first gap lets the next one go.
    assert len(times) == 4 and 62.5 <= times[3] < 62.5 + 15


async def test_regression_without_the_guard_background_waits_for_the_window_after_the_last_chat(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    h = await start_harness(nursery, 16, pinned("chat", 8, 2), pinned("agent", 4, 2),
                            policy=policy(background=0.0))
    await trio.sleep(LOAD_S)
    chats: list[tuple[str, float]] = []
    background: list[tuple[str, float]] = []
    async with trio.open_nursery() as clients:
        for _ in range(6):
            clients.start_soon(client_loop, h.client, "chat", "interactive", 1.25, 0.125, chats, 30.0)
        await trio.sleep(0.5)
        clients.start_soon(hold, h.client, "agent", 1.0, background, "background")
    last_chat_end = max(e["at"] for e in h.names("complete") if e["class"] == "interactive")
    assert [t for _, t in background] == [last_chat_end + 2.0]  # full exclusivity, then the window


async def test_regression_the_guard_runs_the_first_starved_job_that_can_run_not_the_oldest(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    # Two hot chat models and the pinned embedder leave 3 GiB: the 5 GiB model of the
    # oldest starved job cannot load without evicting a hot model, which background
    # work may not do. The embeddings behind it, for a loaded model, must run.
    h = await start_harness(nursery, 16, EngineProfile("chat-a", 6 * GIB, 2), EngineProfile("chat-b", 6 * GIB, 2),
                            pinned("embed", 1, 2), EngineProfile("e4b", 5 * GIB, 1), policy=eager())
    chats: list[tuple[str, float]] = []
    background: list[tuple[str, float]] = []
    async with trio.open_nursery() as clients:
        for model in ("chat-a", "chat-a", "chat-a", "chat-b", "chat-b", "chat-b"):
            clients.start_soon(client_loop, h.client, model, "interactive", 1.0, 0.125, chats, 20.0)
        await trio.sleep(5.0)
        clients.start_soon(hold, h.client, "e4b", 1.0, background, "background")
        await trio.sleep(0.125)
        clients.start_soon(hold, h.client, "embed", 0.5, background, "background")
        await trio.sleep(10.0)
        clients.cancel_scope.cancel()
    assert background == [("granted embed embed", 5.0 + 3.0)]
    assert h.names("evict") == []
    assert [e["model"] for e in h.names("starvation_step")] == ["embed"]


async def test_regression_freeing_a_little_memory_never_claims_a_second_victim_while_the_first_drains(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    # 8.5 + 6.8 GiB loaded on 16 GiB: 0.7 GiB free; a 0.9 GiB model needs 0.2 more.
    h = await start_harness(nursery, 16, EngineProfile("big1", int(8.5 * GIB), 1),
                            EngineProfile("big2", int(6.8 * GIB), 1), EngineProfile("small", int(0.9 * GIB), 1),
                            policy=SchedulingPolicy(backoff=BackoffPolicy(1.0, 8.0), swap_hold=0.0))
    log: list[tuple[str, float]] = []
    async with trio.open_nursery() as clients:
        clients.start_soon(hold, h.client, "big1", 10.0, log)  # ready 2.0, busy until 12.0
        clients.start_soon(client_loop, h.client, "big2", "interactive", 1.0, 0.0, log, 20.0)
        await trio.sleep(4.5)
        clients.start_soon(hold, h.client, "small", 1.0, log)
        await trio.sleep(25.0)
    evictions = h.names("evict")
    assert [(e["engine"], e["at"]) for e in evictions] == [("big1", 4.5)]  # drained, not stopped
    # big1 finishes at 12.0, stops by 12.5; only then is small loaded, ready 2 s later.
    assert h.engines["small"].starts == [12.0 + STOP_S]
    assert ("granted small small", 12.0 + STOP_S + LOAD_S) in log


async def test_regression_gridcore_event_log_chat_overtakes_background_steps(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    h = await start_harness(nursery, 16, pinned("gemma4-12b", 8.3, 2), pinned("nomic-embed", 0.4, 1))
    await trio.sleep(10.0 - trio.current_time())
    steps: list[tuple[str, float]] = []
    chat: list[tuple[str, float]] = []
    async with trio.open_nursery() as clients:
        clients.start_soon(hold_steps, h.client, "nomic-embed", "background", 32, 0.625, steps)
        await trio.sleep(0.25)
        clients.start_soon(hold, h.client, "gemma4-12b", 1.25, chat)
    events = h.log("enqueue", "dispatch", "complete", "mode")
    line = [(t, name, f.get("class") or f.get("gpu"), f.get("step")) for t, name, f in events if t >= 10.0]
    assert line[:9] == [
        (10.0, "enqueue", "background", "1/32"),
        (10.0, "dispatch", "background", "1/32"),
        (10.0, "mode", "background", None),
        (10.25, "enqueue", "interactive", "1/1"),
        (10.25, "dispatch", "interactive", "1/1"),  # the chat gets the GPU the moment it arrives
        (10.25, "mode", "interactive", None),
        (10.625, "complete", "background", "1/32"),
        (10.625, "enqueue", "background", "2/32"),  # keeps its place, but waits for the chat
        (11.5, "complete", "interactive", "1/1"),
    ]
    # The window closes 2 s after the chat (13.5), before the guard would fire (13.625).
    assert line[9:11] == [(13.5, "dispatch", "background", "2/32"), (13.5, "mode", "background", None)]
    assert steps[-1] == ("step 32/32", 13.5 + 30 * 0.625)


# ---- the rules one by one -----------------------------------------------------------

async def test_strict_class_order_then_fifo_within_a_class(autojump_clock: trio.testing.MockClock,
                                                           nursery: trio.Nursery) -> None:
    h = await start_harness(nursery, 16, pinned("m", 4, 1), policy=policy(background=0.0, batch=0.0,
                                                                           interactive_window=0.0))
    await trio.sleep(LOAD_S)
    log: list[tuple[str, float]] = []
    async with trio.open_nursery() as clients:
        clients.start_soon(hold, h.client, "m", 1.0, log, "interactive")  # holds the only slot
        await trio.sleep(0.125)
        for klass in ("batch", "background", "background", "interactive", "batch", "interactive"):
            clients.start_soon(hold, h.client, "m", 1.0, log, klass)
            await trio.sleep(0.125)
    order = [(e["class"], e["job"]) for e in h.names("dispatch")]
    assert [k for k, _ in order] == ["interactive", "interactive", "interactive", "background", "background",
                                     "batch", "batch"]
    jobs_by_class: dict[str, list[object]] = {}
    for klass, job in order:
        jobs_by_class.setdefault(klass, []).append(job)
    assert all(jobs == sorted(jobs) for jobs in jobs_by_class.values())  # FIFO within each class


async def test_interactive_window_holds_lower_classes_for_exactly_the_window(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    h = await start_harness(nursery, 16, pinned("chat", 4, 2), pinned("agent", 4, 2),
                            policy=policy(interactive_window=2.0, background=10.0))
    await trio.sleep(LOAD_S)
    log: list[tuple[str, float]] = []
    async with trio.open_nursery() as clients:
        clients.start_soon(hold, h.client, "chat", 1.5, log)  # 2.0 .. 3.5
        await trio.sleep(0.25)
        clients.start_soon(hold, h.client, "agent", 1.0, log, "background")
    assert log[-1] == ("granted agent agent", 3.5 + 2.0)
    await trio.testing.wait_all_tasks_blocked()  # the actor has seen the last finish
    modes = [(e["at"], e["gpu"]) for e in h.names("mode")]
    assert modes == [(2.0, "interactive"), (5.5, "background"), (6.5, "idle")]


async def test_batch_has_its_own_guard_relative_to_background(autojump_clock: trio.testing.MockClock,
                                                             nursery: trio.Nursery) -> None:
    h = await start_harness(nursery, 16, pinned("agent", 4, 2), pinned("batcher", 4, 1),
                            policy=policy(batch=5.0))
    await trio.sleep(LOAD_S)
    agents: list[tuple[str, float]] = []
    batch: list[tuple[str, float]] = []
    async with trio.open_nursery() as clients:
        for _ in range(4):
            clients.start_soon(client_loop, h.client, "agent", "background", 1.0, 0.0, agents, 20.0)
        await trio.sleep(1.0)
        clients.start_soon(hold, h.client, "batcher", 1.0, batch, "batch")
    assert batch == [("granted batcher batcher", 3.0 + 5.0)]
    assert [e["class"] for e in h.names("starvation_step")] == ["batch"]


async def test_background_work_cannot_evict_a_hot_model_but_interactive_work_can(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    h = await start_harness(nursery, 10, EngineProfile("chat", 6 * GIB, 1), EngineProfile("agent", 6 * GIB, 1),
                            EngineProfile("other", 6 * GIB, 1),
                            policy=policy(interactive_window=0.0, hot_window=300.0))
    log: list[tuple[str, float]] = []
    await hold(h.client, "chat", 1.0, log)  # chat is hot until 303.0
    with trio.move_on_after(60.0):
        await hold(h.client, "agent", 1.0, log, "background")
    assert log == [("granted chat chat", 2.0)]  # the background request waited in vain
    assert h.names("evict") == []
    await hold(h.client, "other", 1.0, log)  # interactive: may evict the hot model
    assert [(e["engine"], e["hot"]) for e in h.names("evict")] == [("chat", True)]


async def test_cold_models_go_before_hot_ones_least_recently_used_first(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    h = await start_harness(nursery, 12, *(EngineProfile(n, 4 * GIB, 1) for n in ("hot", "cold1", "cold2", "new")),
                            policy=policy(interactive_window=0.0, hot_window=100.0))
    log: list[tuple[str, float]] = []
    await hold(h.client, "cold1", 1.0, log, "background")
    await hold(h.client, "cold2", 1.0, log, "background")
    await hold(h.client, "hot", 1.0, log)  # the least recently used of all, but hot
    await hold(h.client, "new", 1.0, log)
    assert [e["engine"] for e in h.names("evict")] == ["cold1"]


async def test_steps_of_a_request_keep_its_place_in_line(autojump_clock: trio.testing.MockClock,
                                                         nursery: trio.Nursery) -> None:
    h = await start_harness(nursery, 16, pinned("embed", 1, 1))
    await trio.sleep(LOAD_S)
    steps: list[tuple[str, float]] = []
    later: list[tuple[str, float]] = []
    async with trio.open_nursery() as clients:
        clients.start_soon(hold_steps, h.client, "embed", "background", 3, 1.0, steps)
        await trio.sleep(0.5)
        for _ in range(2):
            clients.start_soon(hold, h.client, "embed", 1.0, later, "background")
    assert [t for _, t in steps] == [2.0, 3.0, 4.0]  # the newer requests wait for all its steps
    assert [t for _, t in later] == [5.0, 6.0]


async def test_exclusive_job_drains_unloads_runs_alone_then_everything_resumes(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    h = await start_harness(nursery, 16, pinned("embed", 1, 1), EngineProfile("chat", 8 * GIB, 2))
    log: list[tuple[str, float]] = []
    image: list[tuple[str, float]] = []
    async with trio.open_nursery() as clients:
        clients.start_soon(hold, h.client, "chat", 3.0, log)  # 2.0 .. 5.0
        await trio.sleep(3.0)
        clients.start_soon(hold, h.client, None, 4.0, image)  # the whole GPU, interactive class
        await trio.sleep(0.25)
        clients.start_soon(hold, h.client, "chat", 1.0, log)  # arrives after the image: waits behind it
    # The running chat finishes (5.0); both engines stop (5.5); the image runs 5.5 .. 9.5.
    assert image == [("granted None None", 5.0 + STOP_S)]
    assert sorted(e["engine"] for e in h.names("evict")) == ["chat", "embed"]
    # Then the chat model and the pinned embedder load again; the waiting chat runs.
    assert log[-1] == ("granted chat chat", 9.5 + LOAD_S)
    assert h.engines["embed"].starts == [0.0, 9.5]


# ---- pure core: memory observed free, queue limits -----------------------------------

def test_reservation_is_released_only_when_the_memory_is_observed_free() -> None:
    s = Scheduler.create(10 * GIB, [EngineProfile("a", 6 * GIB, 1), EngineProfile("b", 6 * GIB, 1)],
                         observe_memory=True)
    s.observe(0.0, used=1 * GIB, processes={})  # 1 GiB used by something else
    s.submit(1, "a", "interactive", 0.0)
    s.engine_ready("a", 1, "http://a", 2.0, pid=100)
    s.observe(2.5, used=7 * GIB, processes={100: 6 * GIB})
    s.finish(1, 3.0)
    effects = s.submit(2, "b", "interactive", 3.0)
    assert [e for e in effects if isinstance(e, StopEngine)] == [StopEngine("a", 1)]
    s.engine_exited("a", 1, 3.5, "stopped")
    assert s.ledger.totals == {"a": 6 * GIB}  # exited, but the driver still holds it
    # Gone from the process list while its memory still counts: not free yet.
    assert not [e for e in s.observe(3.6, used=7 * GIB, processes={}) if isinstance(e, StartEngine)]
    assert s.ledger.totals == {"a": 6 * GIB}
    effects = s.observe(3.7, used=1 * GIB, processes={})
    assert [e for e in effects if isinstance(e, StartEngine)] == [StartEngine("b", 1)]
    assert s.ledger.totals == {"b": 6 * GIB}


def test_release_times_out_and_says_so() -> None:
    s = Scheduler.create(10 * GIB, [EngineProfile("a", 6 * GIB, 1)], SchedulingPolicy(release_timeout=5.0),
                         observe_memory=True)
    s.submit(1, "a", "interactive", 0.0)
    s.engine_ready("a", 1, "http://a", 2.0, pid=100)
    s.engine_exited("a", 1, 3.0, "killed by SIGKILL")
    assert s.next_wakeup() == 8.0
    effects = s.tick(8.0)
    assert [e.event for e in effects if hasattr(e, "event")] == ["release_timeout"]
    assert s.ledger.totals == {}


def test_a_full_class_queue_answers_429() -> None:
    s = Scheduler.create(10 * GIB, [EngineProfile("a", 6 * GIB, 1)],
                         SchedulingPolicy(max_queue={"interactive": 2, "background": 2, "batch": 2}))
    s.submit(1, "a", "background", 0.0)
    s.submit(2, "a", "background", 0.0)
    effects = s.submit(3, "a", "background", 0.0)
    refusal = next(e for e in effects if isinstance(e, Fail))
    assert (refusal.status, refusal.code, refusal.retry_after) == (429, "queue_full", 1.0)
    assert not [e for e in s.submit(4, "a", "interactive", 0.0) if isinstance(e, Fail)]  # its own queue


def test_per_class_queue_timeouts() -> None:
    s = Scheduler.create(10 * GIB, [EngineProfile("a", 6 * GIB, 1)],
                         SchedulingPolicy(queue_timeout={"interactive": 5.0, "background": 50.0, "batch": 500.0},
                                          starvation={"interactive": 0.0, "background": 3.0, "batch": 3.0},
                                          guard_gap_wait=0.0))
    s.submit(1, "a", "interactive", 0.0)
    s.engine_ready("a", 1, "http://a", 1.0)  # job 1 holds the slot
    s.submit(2, "a", "interactive", 1.0)
    s.submit(3, "a", "batch", 1.0)
    assert s.next_wakeup() == 4.0  # the batch starvation clock: nothing can run beside, though
    assert not [e for e in s.tick(4.0) if isinstance(e, Fail | Grant)]
    assert s.next_wakeup() == 6.0
    effects = s.tick(6.0)
    assert [e.job_id for e in effects if isinstance(e, Fail)] == [2]
    # Job 3 has waited 5 s: said once, and again at 10 s of waiting; it times out at 501.
    assert [e.fields["job"] for e in effects if isinstance(e, Emit) and e.event == "waiting"] == [3]
    assert s.next_wakeup() == 11.0


def test_grant_for_an_exclusive_job_names_no_engine() -> None:
    s = Scheduler.create(10 * GIB, [EngineProfile("a", 6 * GIB, 1)])
    effects = s.submit(1, None, "interactive", 0.0)
    assert [e for e in effects if isinstance(e, Grant)] == [Grant(1, None, None)]
    assert s.ledger.totals == {"exclusive:1": 10 * GIB}
    s.finish(1, 4.0)
    assert s.ledger.totals == {}


async def test_one_lower_class_step_at_a_time_beside_interactive_work_background_first(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    h = await start_harness(nursery, 16, pinned("chat", 6, 2), pinned("agent", 4, 2), pinned("batcher", 4, 2),
                            policy=eager(batch=10.0))
    await trio.sleep(LOAD_S)
    chats: list[tuple[str, float]] = []
    background: list[tuple[str, float]] = []
    batch: list[tuple[str, float]] = []
    async with trio.open_nursery() as clients:
        for _ in range(6):
            clients.start_soon(client_loop, h.client, "chat", "interactive", 1.25, 0.125, chats, 40.0)
        await trio.sleep(0.5)
        for _ in range(2):
            clients.start_soon(client_loop, h.client, "agent", "background", 1.0, 0.0, background, 40.0)
            clients.start_soon(client_loop, h.client, "batcher", "batch", 1.0, 0.0, batch, 40.0)
    guarded = [(e["at"], e["class"]) for e in h.names("starvation_step")]
    assert guarded[:2] == [(2.5 + 3.0, "background"), (9.5, "background")]  # background goes first
    assert guarded[2] == (2.5 + 10.0, "batch")  # batch_max_starvation is 10 s by default
    assert {klass for _, klass in guarded} == {"background", "batch"}  # and batch is not starved
    # Never two lower-class steps at once beside the chats (they stop asking at 40):
    running = 0
    for at, name, fields in h.log("dispatch", "complete"):
        if fields["class"] != "interactive" and at < 40.0:
            running += 1 if name == "dispatch" else -1
            assert running <= 1
    assert len(background) >= len(batch)


async def test_a_due_guard_step_waits_for_a_moment_without_interactive_compute(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    for settings, expected in ((policy(), 9.0), (eager(), 7.5)):
        h = await start_harness(nursery, 16, pinned("chat", 6, 2), pinned("agent", 4, 2), policy=settings)
        start = trio.current_time()
        await trio.sleep(LOAD_S)
        chats: list[tuple[str, float]] = []
        background: list[tuple[str, float]] = []
        async with trio.open_nursery() as clients:
            # One chat at a time: computing 2.0-4.0, 4.5-6.5, 7.0-9.0, ... (the window stays open).
            clients.start_soon(client_loop, h.client, "chat", "interactive", 2.0, 0.5, chats, start + 12.0)
            await trio.sleep(2.5)
            clients.start_soon(hold, h.client, "agent", 1.0, background, "background")  # due at 7.5
        assert [t - start for _, t in background] == [expected]


def test_regression_the_image_services_own_cache_does_not_block_the_next_exclusive_job() -> None:
    # Found with the ComfyUI listener: after a job whose /free never came (force-released),
    # ComfyUI still caches 6 GiB. That is outside use to the ledger; holding it against the
    # next exclusive job (which needs "the whole budget") blocked every image for good.
    s = Scheduler.create(16 * GIB, [EngineProfile("a", 6 * GIB, 1)], observe_memory=True)
    s.observe(0.0, used=6 * GIB, processes={})
    assert s.ledger.outside == 6 * GIB
    effects = s.submit(1, None, "interactive", 1.0)
    assert Grant(1, None, None) in effects
    # What the job's own process holds is outside use within its reservation: shown once.
    device = s.snapshot().devices[0]
    assert (device.reserved, device.outside, device.free) == (16 * GIB, 0, 0)
    s.finish(1, 2.0)
    assert Grant(2, None, None) in s.submit(2, None, "interactive", 3.0)


def test_regression_a_guard_step_whose_load_was_undone_gets_a_new_load() -> None:
    """Found by `steward loadtest --chaos`: the guard loaded an engine for a starved batch step,
    an image job evicted it before the step ran, and the step then waited for an engine
    nobody loaded (until its queue timeout) while the GPU sat idle."""
    s = Scheduler.create(10 * GIB, [EngineProfile("chat", 4 * GIB, 1), EngineProfile("big", 3 * GIB, 1),
                                    EngineProfile("small", 2 * GIB, 1)],
                         SchedulingPolicy(backoff=BackoffPolicy(64.0, 64.0)))
    s.submit(1, "chat", "interactive", 0.0)
    s.engine_ready("chat", 1, "http://127.0.0.1:1", 1.0)
    s.finish(1, 2.0, 200)
    s.submit(2, "big", "background", 3.0)
    s.engine_exited("big", 1, 3.5, "exited with status 1")  # failed start: retried in 64 s
    s.submit(3, "big", "background", 4.0)  # waits for that retry: background is never idle
    s.submit(5, "small", "batch", 4.0)
    effects = s.tick(14.0)  # batch starved for 10 s: the guard loads `small` for job 5
    assert [e for e in effects if isinstance(e, StartEngine)] == [StartEngine("small", 1)]
    s.submit(6, None, "interactive", 14.25)  # an image job: every engine goes
    assert [e for e in s.engine_ready("small", 1, "http://127.0.0.1:3", 15.0)
            if isinstance(e, StopEngine)] == [StopEngine("small", 1)]
    s.engine_exited("small", 1, 15.5, "stopped")
    s.engine_exited("chat", 1, 15.5, "stopped")
    effects = s.finish(6, 20.0, 200)  # the image job is over
    assert [e for e in effects if isinstance(e, StartEngine)] == [StartEngine("small", 2)]
    granted = s.engine_ready("small", 2, "http://127.0.0.1:3", 21.0)
    assert Grant(5, "small", "http://127.0.0.1:3") in granted


def test_a_waiting_image_job_whose_client_leaves_unloads_nothing() -> None:
    """Issue 15: an image job at the head of its class drains Ollama (a chat runs on it); its
    client leaves while it waits: the drain is undone, and the chat's end unloads nothing."""
    s = Scheduler.create(10 * GIB, [EngineProfile("ollama", 6 * GIB, 2)])
    s.submit(1, "ollama", "interactive", 0.0)
    s.engine_ready("ollama", 1, "http://127.0.0.1:1", 1.0)
    s.submit(2, None, "interactive", 2.0, exclusive_memory=8 * GIB)  # needs Ollama's memory
    assert s.engines["ollama"].draining and s.engines["ollama"].drained_for == 2
    effects = s.finish(2, 3.0)  # its client left while it waited
    assert [e.fields for e in effects if getattr(e, "event", None) == "evict_undone"] == [
        {"engine": "ollama", "in_flight": 1, "why": "exclusive job 2 no longer waits"}]
    assert not s.engines["ollama"].draining
    assert not [e for e in s.finish(1, 4.0) if isinstance(e, StopEngine)]  # the chat ends: no unload
    assert s.engines["ollama"].status is EngineStatus.READY
    assert [e for e in s.submit(3, "ollama", "interactive", 5.0) if isinstance(e, Grant)] == [
        Grant(3, "ollama", "http://127.0.0.1:1", 1)]  # the next chat is served at once, no reload


def test_an_image_job_that_times_out_waiting_undoes_its_drain_at_the_exact_deadline() -> None:
    s = Scheduler.create(10 * GIB, [EngineProfile("ollama", 6 * GIB, 2)])
    s.submit(1, "ollama", "interactive", 0.0)
    s.engine_ready("ollama", 1, "http://127.0.0.1:1", 1.0)
    s.submit(2, None, "interactive", 2.0, exclusive_memory=8 * GIB, timeout=5.0)
    assert s.engines["ollama"].draining
    assert s.engines["ollama"].draining and not [e for e in s.tick(6.999) if getattr(e, "event", "") == "timeout"]
    effects = s.tick(7.0)
    assert [getattr(e, "event", None) for e in effects if getattr(e, "event", None) in ("timeout", "evict_undone")] \
        == ["timeout", "evict_undone"]
    assert not s.engines["ollama"].draining
    assert not [e for e in s.finish(1, 8.0) if isinstance(e, StopEngine)]


def test_a_drain_for_a_load_nobody_waits_for_any_more_is_undone_and_one_still_wanted_is_not() -> None:
    s = Scheduler.create(8 * GIB, [EngineProfile("a", 5 * GIB, 1), EngineProfile("b", 5 * GIB, 1)],
                         SchedulingPolicy(swap_hold=0.0))
    s.submit(1, "a", "interactive", 0.0)
    s.engine_ready("a", 1, "http://127.0.0.1:1", 1.0)
    s.submit(2, "b", "interactive", 2.0)  # a is busy: drained for b
    s.submit(3, "b", "interactive", 2.5)
    assert s.engines["a"].drained_for == "b"
    s.finish(2, 3.0)  # one of b's clients left: b is still wanted
    assert s.engines["a"].draining
    s.finish(3, 3.5)  # the other too: nobody waits for b
    assert not s.engines["a"].draining
    assert not [e for e in s.finish(1, 4.0) if isinstance(e, StopEngine)]
    assert s.engines["a"].status is EngineStatus.READY
    # Wanted again, with a idle now: evicted for it, and this time it goes.
    assert [e for e in s.submit(4, "b", "interactive", 5.0) if isinstance(e, StopEngine)] == [StopEngine("a", 1)]


def test_an_exclusive_job_unloads_a_pinned_engine_only_when_nothing_else_frees_enough() -> None:
    """One rule: an exclusive job frees what it needs, unpinned engines first, pinned ones last
    and only when needed."""
    s = Scheduler.create(16 * GIB, [EngineProfile("embed", 4 * GIB, 1, pinned=True),
                                    EngineProfile("chat", 6 * GIB, 1)])
    s.start(0.0)
    s.engine_ready("embed", 1, "http://127.0.0.1:1", 1.0)
    s.submit(1, "chat", "interactive", 1.0)
    s.engine_ready("chat", 1, "http://127.0.0.1:2", 2.0)
    s.finish(1, 3.0)
    effects = s.submit(2, None, "interactive", 4.0, exclusive_memory=10 * GIB)  # 6 free: chat's 6 is enough
    assert [e for e in effects if isinstance(e, StopEngine)] == [StopEngine("chat", 1)]
    assert Grant(2, None, None) in s.engine_exited("chat", 1, 5.0, "stopped")  # chat's memory was enough
    assert s.engines["embed"].status is EngineStatus.READY
    s.finish(2, 6.0)
    effects = s.submit(3, None, "interactive", 7.0, exclusive_memory=14 * GIB)  # only the pinned one's 4 more
    assert [e for e in effects if isinstance(e, StopEngine)] == [StopEngine("embed", 1)]
