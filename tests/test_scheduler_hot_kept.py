"""The hot time kept across an image job (issue 30, item 4; core.py, rule 8), in exact virtual time.

An exclusive job pauses hot_window's clock of the engines it evicted while hot: when it ends,
each is hot again for the time it had left, and a warm load keeps it. Pure calls to the core
with explicit times (binary fractions: every assertion is an equality). hot_window is the
default 300 s; the chat model is last used interactively at 2.0, so it is hot until 302.0.
"""

from __future__ import annotations

from supervisor.scheduler.core import Scheduler
from supervisor.scheduler.explain import WaitReason, explain
from supervisor.scheduler.types import EngineStatus, HotKept, StartEngine, StopEngine
from tests.test_scheduler_swaps import acts, emitted, loaded
from tests.test_scheduler_warm import STOP, image_job, make, model, ready


def chat_then_image_job(image_at: float, image_end: float) -> tuple[Scheduler, list]:
    """chat (6 of 12 GiB) used interactively from 0.0 to 2.0; an image job from *image_at*
    (chat unloads for it) to *image_end*; the effects of its end."""
    s = make(model("chat"), model("b", 8))
    loaded(s, "chat", "interactive", 1, 0.0, 1.0)
    s.finish(1, 2.0)
    image_job(s, 2, image_at)
    return s, s.finish(2, image_end)


def test_the_chat_model_comes_back_from_an_image_job_with_the_hot_time_it_had_left() -> None:
    s = make(model("chat"), model("b", 8))
    loaded(s, "chat", "interactive", 1, 0.0, 1.0)
    s.finish(1, 2.0)
    effects = s.submit(2, None, "background", 100.0)
    [evict] = emitted(effects, "evict")
    assert (evict["engine"], evict["hot"]) == ("chat", True)
    assert s.engines["chat"].hot_kept == HotKept(2, 202.0)  # hot until 302.0, evicted at 100.0
    s.engine_exited("chat", 1, 100.0 + STOP, "stopped")
    assert 2 in s.running
    effects = s.finish(2, 200.0)
    assert emitted(effects, "hot_resumed") == [{
        "engine": "chat", "job": 2, "hot_left_s": 202.0, "hot_until": 402.0, "status": "stopped"}]
    # Warming brings it back at once (a background image job opens no window) and keeps its hot time.
    assert acts(effects) == [StartEngine("chat", 2)] and [w["engine"] for w in emitted(effects, "warm")] == ["chat"]
    ready(s, "chat", 201.0)
    assert s.engines["chat"].hot(401.0, 300.0) and not s.engines["chat"].hot(402.0, 300.0)
    assert s.snapshot().engines[0].hot_until == 402.0
    # A batch request for b at 310.0, past the 302.0 the chat model would have been hot until
    # had the job's time counted: chat is not evicted for it until its hot time is over.
    assert acts(s.submit(3, "b", "batch", 310.0)) == []
    wait = explain(s, s.waiting[3])
    assert wait.reason is WaitReason.NO_ROOM and "the only idle engine (chat) is hot until" in wait.why
    assert acts(s.tick(401.0)) == []
    effects = s.tick(402.0)
    assert acts(effects) == [StopEngine("chat", 2)]
    assert [(e["engine"], e["hot"]) for e in emitted(effects, "evict")] == [("chat", False)]


def test_an_engine_cold_before_the_image_job_comes_back_cold() -> None:
    # Evicted at 400.0, 98 s after its hot time ended: nothing is kept; warmed, it is cold.
    s, effects = chat_then_image_job(400.0, 450.0)
    assert s.engines["chat"].hot_kept is None and emitted(effects, "hot_resumed") == []
    assert s.engines["chat"].last_interactive == 2.0  # never warmed: no use within hot_window
    assert acts(effects) == [] and s.engines["chat"].status is EngineStatus.STOPPED


def test_an_image_job_that_leaves_before_it_ran_gives_the_hot_time_back_too() -> None:
    s = make(model("chat"), model("b", 8))
    loaded(s, "chat", "interactive", 1, 0.0, 1.0)
    s.finish(1, 2.0)
    assert granted_engine_busy(s, 3, 50.0)  # a background step on chat, running
    effects = s.submit(2, None, "background", 100.0)  # chat drains for it
    assert [e["engine"] for e in emitted(effects, "evict")] == ["chat"] and acts(effects) == []
    assert s.engines["chat"].hot_kept == HotKept(2, 202.0)
    effects = s.finish(2, 150.0)  # the client left: its drain is undone, chat serves on
    assert emitted(effects, "hot_resumed") == [{
        "engine": "chat", "job": 2, "hot_left_s": 202.0, "hot_until": 352.0, "status": "draining"}]
    assert s.engines["chat"].last_interactive == 52.0


def granted_engine_busy(s: Scheduler, job: int, at: float) -> bool:
    s.submit(job, "chat", "background", at)
    return job in s.running
