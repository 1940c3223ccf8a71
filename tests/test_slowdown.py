"""Showing the slowdown (issue 27, finding 6): each answer's decode rate against its engine's
speed alone, what computed beside it, and the class's figures in /healthz, /metrics, top and
the usage log.

The arithmetic and the door's reading of an answer are pure; the health over its window runs a
real scheduler core on MockClock with exact times, answers recorded through the real front
door; one slow test runs steward in this trio run in front of fake llama-server processes.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
import yaml
from rich.console import Console

from supervisor.config import load_config
from supervisor.observe.events import Event
from supervisor.gateway.door import Exchange, FrontDoor
from supervisor.observe.health import Answer, HealthStatus, HealthWatch, RecentActivity, assess, serve_health
from supervisor.engines.measurements import ContextCost, EngineSpeed, MeasurementStore, measurement_key
from supervisor.observe.metrics import StewardMetrics
from supervisor.request_class import RequestClass
from supervisor.scheduler.core import Scheduler
from supervisor.scheduler.types import EngineProfile
from supervisor.observe.slowdown import (
    Companion,
    ComputeCompany,
    PaceMeter,
    SpeedBook,
    decode_rate,
    format_factor,
    slowdown,
)
from supervisor.top.view import Frame, Screen, render_frame
from supervisor.tree import StopSignals, Steward, run_steward
from supervisor.usage.row import UsageRow
from supervisor.usage.writer import UsageLog
from tests.conftest import fake_model, free_port
from tests.harness import GIB, start_harness

SSE = [(b"content-type", b"text/event-stream")]
TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'


def final_chunk(tokens: int, decode_ms: float | None) -> bytes:
    """The last events of a llama-server chat stream: usage, its own timings, [DONE]."""
    timings = {} if decode_ms is None else {"timings": {"prompt_n": 5, "prompt_ms": 1.0, "predicted_n": tokens,
                                                        "predicted_ms": decode_ms}}
    body = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": tokens}, **timings}
    return f"data: {json.dumps(body)}\n\n".encode() + b"data: [DONE]\n\n"


# --- the arithmetic --------------------------------------------------------------------------


def test_decode_rate_needs_eight_tokens_timed() -> None:
    assert decode_rate(20, 2.0) == 10.0
    assert decode_rate(8, 0.8) == pytest.approx(10.0)
    assert decode_rate(7, 0.6) is None  # too few to tell
    assert decode_rate(None, 1.0) is None and decode_rate(50, 0.0) is None and decode_rate(50, None) is None


def test_slowdown_is_the_speed_alone_over_the_rate_seen() -> None:
    assert slowdown(100.0, 10.0) == 10.0
    assert slowdown(90.0, 70.0) == 1.286
    assert slowdown(None, 10.0) is None and slowdown(100.0, None) is None and slowdown(0.0, 10.0) is None
    assert [format_factor(x) for x in (1.0, 1.286, 9.96, 17.4)] == ["1.0×", "1.3×", "10×", "17×"]


def step_event(name: str, at: float, job: int, engine: str | None = None, klass: str = "interactive",
               **fields: Any) -> Event:
    return Event(name, "debug", {"job": job, "model": engine, "class": klass, **fields}, wall=0.0, mono=at)


def test_the_company_of_an_answer_is_every_other_step_that_overlapped_it_on_shared_compute() -> None:
    company = ComputeCompany()
    for event in [Event("load", "info", {"engine": "chat", "devices": [0]}, 0.0, 0.0),
                  Event("load", "info", {"engine": "agent", "devices": [0]}, 0.0, 0.0),
                  Event("load", "info", {"engine": "other-gpu", "devices": [1]}, 0.0, 0.0),
                  step_event("dispatch", 1.0, 1, "agent", "background"),
                  step_event("dispatch", 2.0, 2, "chat"),
                  step_event("dispatch", 2.5, 3, "other-gpu", "batch"),
                  step_event("complete", 4.0, 1),
                  step_event("complete", 4.5, 2),
                  step_event("dispatch", 5.0, 4, "chat"),
                  step_event("dispatch", 5.5, 5, "chat", "background")]:
        company.observe(event)
    assert company.beside("chat", "interactive", 3.0, 4.5) == (Companion("agent", "background"),)  # another device's step: not
    assert company.beside("chat", "interactive", 4.0, 4.9) == ()  # the agent ended as it began: alone
    assert company.beside("chat", "interactive", 5.2, 6.0) == (Companion("chat", "background"),)  # a second slot of its own
    assert company.beside("agent", "background", 6.0, 7.0) is None  # steward ran no step of it then
    company.observe(step_event("complete", 8.0, 4))
    company.observe(step_event("complete", 8.0, 5))
    assert company.beside("chat", "interactive", 5.2, 6.0) == (Companion("chat", "background"),)  # ended steps are remembered
    assert company.beside("chat", "interactive", 8.0, 9.0) is None
    company.observe(step_event("complete", 8.0 + 901.0, 999))  # far later: ended spans age out
    assert company.beside("chat", "interactive", 5.2, 6.0) is None


def test_an_engine_placed_nowhere_known_shares_the_host() -> None:
    company = ComputeCompany()
    company.observe(step_event("dispatch", 0.0, 1, "a", "batch"))
    company.observe(step_event("dispatch", 0.0, 2, "b"))
    assert company.beside("b", "interactive", 1.0, 2.0) == (Companion("a", "batch"),)


def test_the_speed_alone_is_learned_smoothed_and_kept_where_calibration_keeps_it(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    store = MeasurementStore.open(path)
    store.record_speed("k", "chat", EngineSpeed(100.0, prompt_tps=900.0))  # as `steward calibrate` writes it
    book = SpeedBook(store, lambda: {"chat": "k"})
    assert book.alone("chat") == 100.0 and book.alone("agent") is None
    assert book.learn("chat", 105.0) == 101.0  # a fifth of the way: one answer does not make the figure
    assert json.loads(path.read_text())["k"]["decode_tps"] == 100.0  # within a tenth: not written again
    for _ in range(5):
        book.learn("chat", 150.0)
    kept = MeasurementStore.open(path).speed("k")
    assert kept is not None and kept.prompt_tps == 900.0 and 110.0 < kept.decode_tps < 135.0
    fresh = SpeedBook(MeasurementStore(None), lambda: {"chat": "k"})
    assert fresh.learn("chat", 80.0) == 80.0 and fresh.alone("chat") == 80.0  # no calibration: the first is it


def test_the_speed_alone_is_the_one_at_the_answer_s_context(tmp_path: Path) -> None:
    """An agent decoding after a long prompt is not slowed by its own prompt: with the context
    cost calibrated, the figure alone is taken at the answer's context, and a figure learned
    there is taken back to the calibration's."""
    store = MeasurementStore.open(tmp_path / "state.json")
    # 64 tok/s at context 282; each token 1/64 + 1e-5 x (context - 282) s: 40 tok/s at 1,032.
    cost = ContextCost(0.0, (1 / 40 - 1 / 64) / 750, 250.0, 282.0)
    store.record_speed("k", "agent", EngineSpeed(64.0, context_cost=cost))
    book = SpeedBook(store, lambda: {"agent": "k"})
    assert book.alone("agent") == 64.0 and book.alone("agent", 1032.0) == pytest.approx(40.0)
    assert book.learn("agent", 40.0, 1032.0) == pytest.approx(64.0)  # as fast as calibrated
    meter = PaceMeter(ComputeCompany(), book)
    # 100 tokens out after a 982-token prompt: their mean context 1,032, decoded at 20 tok/s.
    pace = meter.measure("agent", "background", 100, 5.0, 0.0, 5.0, prompt_tokens=982)
    assert pace.slowdown == pytest.approx(2.0)  # not 3.2 against the short prompt's 64
    assert meter.measure("agent", "background", 100, 5.0, 0.0, 5.0).slowdown == pytest.approx(3.2)


# --- the door's reading of an answer ---------------------------------------------------------


def exchange(arrived: float = 0.0, engine: str = "chat", klass: str = "interactive") -> Exchange:
    return Exchange("r1", "openai", "POST", "/v1/chat/completions", 0.0, arrived, model=engine, engine=engine,
                    klass=klass)


def test_a_stream_decodes_by_the_engines_timings_else_by_its_first_and_last_bytes() -> None:
    timed = exchange()
    timed.saw_start(200, SSE)
    timed.saw_body(b": ping\n\n", 0.5)  # llama-server's keep-alive while it reads the prompt: not an answer
    timed.saw_body(TOKEN, 1.0)
    timed.saw_body(final_chunk(21, 1800.0), 3.0)
    assert timed.first_byte == 1.0
    assert timed.decoding(3.0) == (21, 1.8, 1.0, 3.0)
    plain = exchange()
    plain.saw_start(200, SSE)
    plain.saw_body(TOKEN, 1.0)
    plain.saw_body(final_chunk(11, None), 3.0)
    assert plain.decoding(3.5) == (10, 2.0, 1.0, 3.0)  # the tokens after the first, from its first byte
    whole = exchange()
    whole.saw_start(200, [(b"content-type", b"application/json")])
    whole.saw_body(b'{"choices":[],"usage":{"completion_tokens":9},"timings":{"predicted_n":9,"predicted_ms":400}}',
                   5.0)
    assert whole.decoding(5.0) == (9, 0.4, 4.6, 5.0)  # an answer sent whole decoded just before its end
    untimed = exchange()
    untimed.saw_start(200, [(b"content-type", b"application/json")])
    untimed.saw_body(b'{"choices":[],"usage":{"completion_tokens":9}}', 5.0)
    assert untimed.decoding(5.0) is None  # nothing tells when its first token came


# --- the health over its window, on MockClock ----------------------------------------------


async def answer(door: FrontDoor, engine: str, klass: str, tokens: int, decode_s: float, client: Any) -> None:
    """One streamed answer through the front door: granted by the scheduler, its first token
    one second after the grant, then *tokens* more in *decode_s* (the engine's timings say so)."""
    ex = exchange(trio.current_time(), engine, klass)
    async with client.open_grant(engine, RequestClass(klass)):
        await trio.sleep(1.0)
        ex.saw_start(200, SSE)
        ex.saw_body(TOKEN, trio.current_time())
        await trio.sleep(decode_s)
        ex.saw_body(final_chunk(tokens, decode_s * 1000), trio.current_time())
        ex.complete = True
    door.record(ex)


async def test_a_class_answering_slower_than_its_limit_is_degraded_naming_what_computes_beside_it(
        autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        harness = await start_harness(nursery, 24, EngineProfile("chat", 8 * GIB, slots=1),
                                      EngineProfile("agent", 8 * GIB, slots=1))
        events = harness.events
        recent, company = RecentActivity(window=60.0), ComputeCompany()
        events.listeners += [recent.observe, company.observe]
        store = MeasurementStore(None)
        store.record_speed("k-chat", "chat", EngineSpeed(100.0))
        rows: list[UsageRow] = []
        usage = UsageLog(None, events, None, listeners=[rows.append])
        door = FrontDoor(events, usage, pace=PaceMeter(company, SpeedBook(store, lambda: {"chat": "k-chat"})))
        watch = HealthWatch(harness.client, recent, {"interactive": 30.0, "background": 300.0, "batch": 1800.0},
                            slowdown_limit=3.0)
        await trio.sleep(0.5)  # the watch looks at t=0.5, 1.5, ...: never at the instant an answer ends
        await nursery.start(serve_health, watch, events, 1.0)

        async def agent() -> None:
            async with harness.client.open_grant("agent", RequestClass.BACKGROUND):  # loads in 2 s: computes from t=2 to t=40
                await trio.sleep(38.0)

        nursery.start_soon(agent)
        await trio.sleep(2.5)
        for _ in range(3):  # each: the grant (the first loads chat: 2 s), 1 s to the first token, 20 more in 2 s
            await answer(door, "chat", "interactive", 20, 2.0, harness.client)
        assert trio.current_time() == 3.0 + 2.0 + 3 * 3.0  # t=14
        assert [(row.decode_tps, row.slowdown) for row in rows] == [(10.0, 10.0)] * 3
        request = [e for e in events.recent if e.name == "request"][-1].fields
        assert (request["slowdown"], request["decode_tps"], request["beside"]) == (10.0, 10.0, ["agent (background)"])
        health = watch.assess()
        assert health.status is HealthStatus.DEGRADED
        assert health.reasons == ("interactive answers came 10× slower than their engines alone (median of 3 in the "
                                  "last 60s; p95 10×; health.slowdown 3×): beside them computed agent (background) "
                                  "in 3 of 3",)
        assert health.to_json()["answers"]["interactive"] == {  # type: ignore[index]
            "answers": 3, "measured": 3, "ttft_p50_s": 1.0, "ttft_p95_s": 2.8, "slowdown_p50": 10.0,
            "slowdown_p95": 10.0, "beside": {"agent (background)": 3}}
        await trio.sleep(1.0)
        slowed = [(e.mono, e.fields) for e in events.recent if e.name == "class_slowed"]
        assert [(at, f["class"], f["slowdown_p50"], f["answers"], f["beside"]) for at, f in slowed] == [
            (14.5, "interactive", 10.0, 3, {"agent (background)": 3})]

        await trio.sleep(41.0 - trio.current_time())  # the agent's step ended at t=40
        await answer(door, "chat", "interactive", 20, 0.2, harness.client)  # alone: 100 tokens/s
        assert (rows[-1].decode_tps, rows[-1].slowdown) == (100.0, 1.0)
        assert [e.fields["beside"] for e in events.recent if e.name == "request"][-1] == []
        # The slow answers ended at t=8, 11 and 14, the one alone at 42.2: once 8 and 11 are past the
        # 60 s window (the watch looks at t=71.5), two answers are too few to judge the class slow.
        await trio.sleep(80.0 - trio.current_time())
        assert [(e.mono, e.fields["class"], e.fields["slowdown_p50"], e.fields["answers"]) for e in events.recent
                if e.name == "class_recovered"] == [(71.5, "interactive", 5.5, 2)]
        assert watch.assess().status is HealthStatus.OK
        nursery.cancel_scope.cancel()


def test_health_slowdown_zero_never_judges_the_pace() -> None:
    recent = RecentActivity(window=60.0)
    for at in (1.0, 2.0, 3.0):
        recent.answers.add(Answer(at, "batch", 1.0, 50.0, ("chat (interactive)",)))
    snapshot = Scheduler.create(GIB, []).snapshot()
    slo = {"interactive": 30.0, "background": 300.0, "batch": 1800.0}
    assert assess(snapshot, recent, slo, 10.0, slowdown_limit=0.0).status is HealthStatus.OK
    judged = assess(snapshot, recent, slo, 10.0, slowdown_limit=3.0)
    assert judged.slowed["batch"].startswith("batch answers came 50× slower")


# --- metrics and top -------------------------------------------------------------------------


async def test_metrics_count_each_answers_slowdown_and_the_classes_figures(
        autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        harness = await start_harness(nursery, 24, EngineProfile("chat", 8 * GIB, slots=1))
        recent = RecentActivity(window=60.0)
        for at, factor in ((1.0, 2.0), (2.0, 4.0)):
            recent.observe(Event("request", "info", {"class": "interactive", "status": 200, "ttft_s": 0.5,
                                                     "slowdown": factor, "beside": []}, 0.0, at))
        metrics = StewardMetrics()
        metrics.watch(harness.client, HealthWatch(harness.client, recent, {"interactive": 30.0, "background": 300.0,
                                                                            "batch": 1800.0}, slowdown_limit=3.0))
        metrics.observe_usage(UsageRow(0.0, "r", None, "openai", "POST", "/v1/chat/completions", "chat", "chat",
                                       "interactive", 200, None, 0.0, 0.5, 1.0, 5, 20, 10, 10, 12.0, 2.5))
        text = metrics.render().decode()
        assert 'steward_slowdown_bucket{class="interactive",le="2.0"} 0.0' in text
        assert 'steward_slowdown_bucket{class="interactive",le="3.0"} 1.0' in text
        assert 'steward_slowdown_sum{class="interactive"} 2.5' in text
        assert 'steward_class_slowdown{class="interactive",quantile="0.5"} 3.0' in text
        assert 'steward_class_slowdown{class="interactive",quantile="0.95"} 3.9' in text
        assert 'steward_class_time_to_first_token_seconds{class="interactive",quantile="0.5"} 0.5' in text
        assert 'steward_class_slowed{class="interactive"} 0.0' in text  # two answers are too few to judge
        nursery.cancel_scope.cancel()


def test_top_shows_each_classes_slowdown_and_marks_a_slowed_one() -> None:
    state = {"time": 0.0, "mode": "llm", "health": {"status": "degraded", "reasons": []}, "devices": [],
             "engines": [], "waiting": [], "rejections": [], "events": [],
             "classes": {"interactive": {"queued": 0, "running": 1, "oldest_wait_s": None, "slowdown_p50": 9.1,
                                         "slowed": True},
                         "background": {"queued": 0, "running": 1, "oldest_wait_s": None, "slowdown_p50": 1.04,
                                        "slowed": False},
                         "batch": {"queued": 0, "running": 0, "oldest_wait_s": None, "slowdown_p50": None}}}
    console = Console(width=100, record=True, color_system=None)
    console.print(render_frame(Frame("http://127.0.0.1:8080", state, (), Screen.OVERVIEW, paused=False),
                               width=100, height=30))
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    assert "interactive    0 queued    1 running   slowdown 9.1×" in lines
    assert "background     0 queued    1 running   slowdown 1.0×" in lines
    assert "batch          0 queued    0 running" in lines


# --- steward itself, in front of fake llama-servers ------------------------------------------


@pytest.mark.slow
async def test_steward_shows_a_chat_slower_than_alone_beside_a_background_agent(tmp_path: Path) -> None:
    """The chat engine answers at 100 tokens/s; the state file says it decodes 400 alone: each
    chat comes 4× slower. /healthz names the agent computing beside them; the usage rows, the
    metrics, /admin/state and the events say it too."""
    chat = fake_model("1GiB", parallel=1, tps=100)
    # One step of 64 tokens at 10/s (scheduler.step_tokens: not cut): the chats all run beside it.
    config_path = tmp_path / "config.yaml"
    state_file = tmp_path / "state.json"
    config = {"listen": f"127.0.0.1:{free_port()}", "gpu": {"probe": "none", "budget": "8GiB"},
              "models": {"chat": chat, "agent": fake_model("1GiB", parallel=1, tps=10)},
              "log": {"file": str(tmp_path / "events.jsonl")}, "usage": {"db": str(tmp_path / "usage.db")},
              "health": {"slowdown": 2.0, "interval": "0.1s"}, "state_file": str(state_file)}
    config_path.write_text(yaml.safe_dump(config))
    loaded = load_config(config_path)
    state_file.write_text(json.dumps({measurement_key(loaded.models["chat"]): {"decode_tps": 400.0}}))
    stop = StopSignals()
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "stream": True}
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            steward: Steward = await nursery.start(functools.partial(run_steward, loaded, stop,
                                                                     config_path=config_path))
            slowed: list[dict[str, Any]] = []
            steward.events.listeners.append(lambda e: slowed.append(e.fields) if e.name == "class_slowed" else None)
            async with httpx.AsyncClient(base_url=steward.url, timeout=30) as http:
                agent_done = trio.Event()

                async def agent() -> None:
                    await http.post("/v1/chat/completions", headers={"x-steward-class": "background"},
                                    json={**body, "model": "agent", "max_tokens": 64, "stream": False})
                    agent_done.set()

                nursery.start_soon(agent)
                while not any(e.name == "dispatch" and e.fields.get("model") == "agent"
                              for e in steward.events.recent):
                    await trio.sleep(0.05)
                for _ in range(3):
                    async with http.stream("POST", "/v1/chat/completions", json=body) as answer:
                        assert answer.status_code == 200
                        await answer.aread()
                assert not agent_done.is_set()  # the chats all ran beside it
                while (health := (await http.get("/healthz")).json())["status"] != "degraded":
                    await trio.sleep(0.05)
                reasons = [r for r in health["reasons"] if r.startswith("interactive answers came")]
                assert len(reasons) == 1 and "beside them computed agent (background) in 3 of 3" in reasons[0]
                pace = health["answers"]["interactive"]
                assert pace["measured"] == 3 and pace["slowdown_p50"] > 3.0  # 4x on an idle machine; more on a busy one
                state = (await http.get("/admin/state")).json()
                assert state["classes"]["interactive"]["slowed"] is True
                metrics = (await http.get("/metrics")).text
                assert 'steward_slowdown_count{class="interactive"} 3.0' in metrics
                assert 'steward_class_slowed{class="interactive"} 1.0' in metrics
                assert 'steward_engine_alone_tokens_per_second{engine="chat"} 400.0' in metrics  # beside: not learned
                while not slowed:  # the health watch's next look (every 0.1 s) says it once
                    await trio.sleep(0.05)
                assert slowed[0]["class"] == "interactive" and slowed[0]["beside"] == {"agent (background)": 3}
                await agent_done.wait()
            stop.requested.set()
    with closing(sqlite3.connect(tmp_path / "usage.db")) as connection:
        rows = connection.execute("SELECT class, ttft_s, decode_tps, slowdown FROM requests ORDER BY ts").fetchall()
    chats = [row for row in rows if row[0] == "interactive"]
    assert len(chats) == 3 and all(row[3] > 3.0 and 0 < row[2] < 130 and row[1] > 0 for row in chats)
    agent_row = [row for row in rows if row[0] == "background"][0]
    assert agent_row[3] is None and 0 < agent_row[2] < 14  # no speed alone for the agent: its rate, no slowdown
