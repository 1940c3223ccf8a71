"""The /ui page and the history it plots (issue 30): the ring in virtual time; the routes,
their auth, their escaping and the listener's Host/Origin rules, in process (the OpenAI app
behind its real door and cross-site guard, a scheduler actor with scripted engines)."""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from supervisor.auth.keys import ApiKey, KeyFile, KeyTable, key_digest
from supervisor.config import parse_config
from supervisor.gateway.door import FrontDoor
from supervisor.gateway.http.gate import RequestGate
from supervisor.gateway.errors import error_body
from supervisor.gateway.openai import app as gateway_app
from supervisor.gateway.openai.api_routes import error_shape_for
from supervisor.gateway.admin import admin_state
from supervisor.gateway.openai.app import create_app
from supervisor.gateway.ui.page import render_live
from supervisor.gateway.services import Services, body_limits
from supervisor.observe.events import Event, EventLog
from supervisor.observe.health import Health, HealthStatus, HealthWatch, RecentActivity
from supervisor.observe.history import SAMPLES, History, Totals, serve_history, take_sample
from supervisor.observe.metrics import StewardMetrics
from supervisor.scheduler.core import Scheduler
from supervisor.scheduler.types import EngineProfile
from supervisor.tree import _listener
from supervisor.usage.row import UsageRow
from supervisor.usage.writer import UsageLog, serve_usage_log
from tests.harness import GIB, start_harness

HOSTILE = '<script>alert("x")</script>'
ADMIN_KEY, USER_KEY = "sk-admin-test-key-0123456789", "sk-user-test-key-0123456789"


def test_a_sample_holds_memory_by_tier_queues_and_the_counters_growth() -> None:
    s = Scheduler.create(16 * GIB, [EngineProfile("chat", 8 * GIB, 1), EngineProfile("big", 12 * GIB, 1)])
    s.start(0.0)
    s.submit(1, "chat", "interactive", 1.0)
    s.engine_ready("chat", 1, "http://127.0.0.1:1", 2.0)
    s.submit(2, "big", "batch", 3.0)  # no room beside the busy chat: waits
    sample = take_sample(s.snapshot(), "gpu", Totals(250, {"queue_full": 3, "rate_limited": 1}),
                         Totals(50, {"queue_full": 1, "rate_limited": 1}), wall=1000.0, elapsed_s=10.0)
    assert sum(sample.devices["gpu0"].values()) == 8 * GIB
    assert sample.queued == {"interactive": 0, "background": 0, "batch": 1}
    assert sample.running == {"interactive": 1, "background": 0, "batch": 0}
    assert (sample.tokens_per_s, sample.rejected, dict(sample.rejected_by)) == (20.0, 2, {"queue_full": 2})
    assert sample.to_json()["ts"] == 1000.0


async def test_the_ring_samples_every_10s_and_keeps_the_last_hour(autojump_clock: trio.testing.MockClock) -> None:
    tokens = [0]
    history = History()
    async with trio.open_nursery() as nursery:
        harness = await start_harness(nursery, 16, EngineProfile("chat", 2 * GIB, 1))

        def totals() -> Totals:
            tokens[0] += 100  # 100 tokens between samples: 10 tokens/s
            return Totals(tokens[0], {})

        await nursery.start(functools.partial(serve_history, history, harness.client.snapshot, totals, "gpu",
                                              trio.current_time))
        await trio.sleep(SAMPLES * 10.0 + 25.0)
        nursery.cancel_scope.cancel()
    assert len(history.samples) == SAMPLES  # an hour: the oldest went
    times = [sample.ts for sample in history.samples]
    assert times[-1] == SAMPLES * 10.0 + 20.0 and times[0] == 30.0
    assert all(b - a == 10.0 for a, b in zip(times, times[1:], strict=False))
    assert {sample.tokens_per_s for sample in history.samples} == {10.0}
    body = history.to_json()
    assert body["interval_s"] == 10 and set(body["samples"][0]) >= {"ts", "devices", "queued", "running",
                                                                    "tokens_per_s", "rejected"}


async def write_usage(path: Path, *rows: UsageRow) -> None:
    """Rows in a usage log, written by steward's own writer (it ends once closed and written)."""
    async with trio.open_nursery() as nursery:
        send, _ = trio.open_memory_channel[Event](100)
        usage: UsageLog = await nursery.start(serve_usage_log, str(path), EventLog(send))
        for row in rows:
            usage.record(row)
        usage.close()


def usage_row(key: str | None, model: str) -> UsageRow:
    return UsageRow(time.time(), "r1", key, "openai", "POST", "/v1/chat/completions", model, model, "interactive",
                    200, None, 0.0, 0.1, 0.5, 10, 20, 100, 200)


def key_file(*keys: tuple[str, str, bool]) -> KeyTable:
    created = datetime(2026, 1, 1, tzinfo=UTC)
    return KeyTable.from_key_file(KeyFile(keys=tuple(ApiKey(name=name, hash=key_digest(text), admin=admin, created=created)
                                                     for name, text, admin in keys)))


@asynccontextmanager
async def ui_listener(tmp_path: Path, keys: KeyTable | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """The OpenAI listener's app behind its door and cross-site guard (tree._listener), served
    in process; two engines, one with a hostile name, and a usage log with a hostile key name."""
    db = tmp_path / "usage.db"
    await write_usage(db, usage_row(HOSTILE, "chat"), usage_row("alice", "chat"))
    config = parse_config({"listen": "127.0.0.1:8080", "models": {"chat": {"command": ["true"], "memory": "2GiB"}},
                           "usage": {"db": str(db)}})
    async with trio.open_nursery() as nursery:
        harness = await start_harness(nursery, 16, EngineProfile("chat", 2 * GIB, 1), EngineProfile(HOSTILE, GIB, 1))
        door = FrontDoor(harness.events, UsageLog(None, harness.events, None))
        if keys is not None:
            door.replace_keys(keys)
        services = Services(scheduler=harness.client, events=harness.events, gate=RequestGate(),
                            metrics=StewardMetrics(), door=door,
                            health=HealthWatch(harness.client, RecentActivity(60.0), {}), body_limits=body_limits(config),
                            history=History(), usage_db=str(db))
        listener = _listener(config, harness.events, door, "openai", create_app(config, services), config.listen,
                             error_body, error_shape_for, gateway_app.is_admin_route)
        transport = httpx.ASGITransport(app=listener.app, client=("127.0.0.1", 50000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8080") as client:
            yield client
        nursery.cancel_scope.cancel()


async def test_the_page_shows_engines_queues_plots_and_usage_with_every_name_escaped(tmp_path: Path) -> None:
    async with ui_listener(tmp_path) as client:
        answer = await client.get("/ui?period=24h")
        history = await client.get("/admin/history")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in answer.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
    assert answer.headers["x-content-type-options"] == "nosniff"
    page = answer.text
    assert "<script>" not in page and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert page.count("&lt;script&gt;") == 2  # the engine and the key, both escaped
    assert "<td>chat</td>" in page and "<td>alice</td>" in page and "per model" in page
    assert '<script src="/ui/app.js" defer></script>' in page and 'data-period="24h"' in page
    assert history.json() == {"interval_s": 10, "samples": []}


async def test_the_script_and_style_are_served_from_the_package(tmp_path: Path) -> None:
    async with ui_listener(tmp_path) as client:
        script, style, other = (await client.get("/ui/app.js"), await client.get("/ui/app.css"),
                                await client.get("/ui/nothing.js"))
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert "/ui/live" in script.text and "/admin/events" in script.text
    assert style.status_code == 200 and "rect.pinned" in style.text
    assert other.status_code == 404


async def test_a_foreign_host_or_origin_is_refused(tmp_path: Path) -> None:
    async with ui_listener(tmp_path) as client:
        rebound = await client.get("/ui", headers={"host": "evil.example"})
        foreign = await client.get("/ui/live", headers={"origin": "http://evil.example"})
        own = await client.get("/ui/live", headers={"origin": "http://127.0.0.1:8080"})
    assert rebound.status_code == 403 and foreign.status_code == 403
    assert own.status_code == 200 and "<td>chat</td>" in own.text


async def test_with_keys_the_page_is_a_shell_and_its_data_needs_an_admin_key(tmp_path: Path) -> None:
    keys = key_file(("root", ADMIN_KEY, True), ("user", USER_KEY, False))
    async with ui_listener(tmp_path, keys) as client:
        shell = await client.get("/ui")
        script = await client.get("/ui/app.js")
        anonymous = await client.get("/ui/live")
        user = await client.get("/ui/live", headers={"authorization": f"Bearer {USER_KEY}"})
        history = await client.get("/admin/history", headers={"authorization": f"Bearer {USER_KEY}"})
        admin = await client.get("/ui/live", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert shell.status_code == 200 and 'id="key-form"' in shell.text
    assert "chat" not in shell.text and "alice" not in shell.text  # no data without the key
    assert script.status_code == 200
    assert (anonymous.status_code, user.status_code, history.status_code) == (401, 403, 403)
    assert admin.status_code == 200 and "<td>alice</td>" in admin.text


def test_the_fleet_and_the_plots_are_drawn_with_names_escaped() -> None:
    s = Scheduler.create(16 * GIB, [EngineProfile("chat", 8 * GIB, 1)])
    state = admin_state(s.snapshot(explained=True), Health(HealthStatus.OK, (), {}, {}, {}), [], "gpu",
                        now=1.0, wall=1000.0)
    sample = take_sample(s.snapshot(), "gpu", Totals(100, {"queue_full": 1}), Totals(0, {}), wall=1000.0,
                         elapsed_s=10.0).to_json()
    page = render_live(state, {"samples": [sample, sample]}, {},
                       [{"name": HOSTILE, "availability": "asleep", "serves": ["chat", HOSTILE]}])
    assert "<script>" not in page and page.count("&lt;script&gt;") == 2
    assert "<h2>Fleet</h2>" in page and "<td>asleep</td>" in page
    assert page.count("<polyline") == 1 + 3 + 1 + 1  # memory per device; queued per class; tokens/s; rejections
    assert "tokens/s (max 10.0)" in page


def test_the_pages_fleet_is_the_admin_states_nodes_with_their_since_poll_and_held() -> None:
    from supervisor.gateway.ui.routes import _fleet

    state = {"nodes": [{"name": "b", "state": "waking", "for_s": 8.2, "last_poll": {"age_s": 0.4, "answered": False},
                        "serves": ["qwen"], "held": 1},
                       {"name": "a", "state": "awake", "for_s": 300.0, "last_poll": {"age_s": 0.9, "answered": True},
                        "serves": ["chat", "embed"], "held": 0}]}
    assert _fleet(state) == [
        {"name": "b", "availability": "waking for 8.2s, polled 400ms ago (no answer), 1 held for it", "serves": ["qwen"]},
        {"name": "a", "availability": "awake for 5m, polled 900ms ago", "serves": ["chat", "embed"]}]
    assert _fleet({}) == []
