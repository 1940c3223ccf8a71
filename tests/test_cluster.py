"""Sitting under a cluster's router (issue 33): the GIE model-server protocol's metrics per model,
and the per-model readiness probe.

The protocol is kubernetes-sigs/gateway-api-inference-extension's
docs/proposals/003-model-server-protocol/README.md as of release v1.5.0 (commit df9f8909fe06,
the file unchanged to the newest commit read, 84436a96b9e6): TotalQueuedRequests,
TotalRunningRequests and KVCacheUtilization are gauges, named as vLLM names them; vLLM
labels them with ``model_name``, which the endpoint picker's metric specs select on
(``vllm:num_requests_waiting{model_name=qwen}``), and the picker reads the KV figure as a
fraction "from 0 to 1" (its --kv-cache-usage-percentage-metric flag, v1.5.0).

Values are checked against a known state of a real scheduler actor in virtual time (scripted
engines); the route in process, behind the OpenAI listener's real door.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from supervisor.config import parse_config
from supervisor.gateway.door import FrontDoor
from supervisor.gateway.errors import error_body
from supervisor.gateway.http.gate import RequestGate
from supervisor.gateway.openai import app as gateway_app
from supervisor.gateway.openai.api_routes import error_shape_for
from supervisor.gateway.openai.app import create_app
from supervisor.gateway.services import Services, body_limits
from supervisor.observe.health import HealthWatch, RecentActivity
from supervisor.observe.history import History
from supervisor.observe.metrics import StewardMetrics
from supervisor.request_class import RequestClass
from supervisor.scheduler.readiness import ReadinessState
from supervisor.scheduler.types import EngineProfile
from supervisor.tree import _listener
from supervisor.usage.writer import UsageLog
from tests.conftest import StewardFactory, fake_model
from tests.harness import GIB, LOAD_S, Harness, start_harness
from tests.test_deploy import wait_until
from tests.test_ui import ADMIN_KEY, key_file

# The protocol's table (v1.5.0): the metric, its type, what it means; and the label vLLM gives it.
PROTOCOL = {"vllm:num_requests_waiting": "gauge", "vllm:num_requests_running": "gauge",
            "vllm:kv_cache_usage_perc": "gauge"}
MODEL_LABEL = "model_name"


def scrape(metrics: StewardMetrics) -> dict[str, tuple[str, dict[str, float]]]:
    """The protocol's families on a /metrics page: name -> (type, {model_name: value}); and each
    sample's labels are checked to be the model label alone."""
    found: dict[str, tuple[str, dict[str, float]]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        if family.name in PROTOCOL or family.name == "steward_model_ready":
            values = {}
            for sample in family.samples:
                assert set(sample.labels) == {MODEL_LABEL}, sample
                values[sample.labels[MODEL_LABEL]] = sample.value
            found[family.name] = (family.type, values)
    return found


async def hold(harness: Harness, model: str, klass: RequestClass, seconds: float) -> None:
    async with harness.client.open_grant(model, klass):
        await trio.sleep(seconds)


async def test_the_protocols_gauges_per_model_follow_the_queue_the_slots_and_the_readiness(
        autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        harness = await start_harness(nursery, 24, EngineProfile("chat", 16 * GIB, slots=2),
                                      EngineProfile("code", 16 * GIB, slots=4))
        metrics = StewardMetrics()
        metrics.watch(harness.client)
        found = scrape(metrics)
        assert {name: kind for name, (kind, _) in found.items() if name in PROTOCOL} == PROTOCOL
        assert found["vllm:num_requests_waiting"][1] == {"chat": 0, "code": 0}
        assert found["vllm:kv_cache_usage_perc"][1] == {"chat": 0, "code": 0}
        assert found["steward_model_ready"][1] == {"chat": 1, "code": 1}  # both fit in free memory

        for _ in range(3):  # two take chat's slots once it has loaded, the third waits for one
            nursery.start_soon(hold, harness, "chat", RequestClass.INTERACTIVE, 30.0)
        await trio.sleep(0.1)
        loading = scrape(metrics)
        assert loading["vllm:num_requests_waiting"][1] == {"chat": 3, "code": 0}  # waiting for the load
        assert loading["vllm:num_requests_running"][1] == {"chat": 0, "code": 0}
        await trio.sleep(LOAD_S)
        busy = scrape(metrics)
        assert busy["vllm:num_requests_waiting"][1] == {"chat": 1, "code": 0}
        assert busy["vllm:num_requests_running"][1] == {"chat": 2, "code": 0}
        assert busy["vllm:kv_cache_usage_perc"][1] == {"chat": 1.0, "code": 0.0}  # both slots busy
        # code does not fit beside chat, and chat is hot and busy: not ready
        assert busy["steward_model_ready"][1] == {"chat": 1, "code": 0}

        # Once its engine says what its KV cache holds (vLLM's gauge, llama-server's /slots), that is the figure.
        generation = next(e.generation for e in harness.client.snapshot().engines if e.name == "chat")
        harness.client.report_load("chat", generation, None, None, 0.375)
        harness.client.report_load("chat", generation - 1, None, None, 0.9)  # a load gone by: ignored
        await trio.testing.wait_all_tasks_blocked()
        said = scrape(metrics)
        assert said["vllm:kv_cache_usage_perc"][1] == {"chat": 0.375, "code": 0.0}
        assert said["vllm:num_requests_running"][1] == {"chat": 2, "code": 0}  # it said nothing of its queue
        harness.client.report_load("chat", generation, None, None, None)  # it stops saying: busy slots again
        await trio.testing.wait_all_tasks_blocked()
        assert scrape(metrics)["vllm:kv_cache_usage_perc"][1] == {"chat": 1.0, "code": 0.0}
        nursery.cancel_scope.cancel()


async def test_a_model_is_ready_resident_loadable_or_blocked_by_hot_or_busy_work(
        autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        harness = await start_harness(nursery, 24, EngineProfile("chat", 16 * GIB, slots=2),
                                      EngineProfile("code", 16 * GIB, slots=2), EngineProfile("huge", 40 * GIB, slots=1))
        client = harness.client

        def state(model: str) -> ReadinessState:
            readiness = client.readiness(model)
            assert readiness is not None
            return readiness.state

        assert client.readiness("nobody") is None
        assert state("huge") is ReadinessState.TOO_BIG
        assert state("chat") is ReadinessState.LOADABLE
        nursery.start_soon(hold, harness, "chat", RequestClass.INTERACTIVE, 10.0)
        await trio.sleep(0.1)
        assert state("chat") is ReadinessState.LOADING
        await trio.sleep(LOAD_S)
        assert state("chat") is ReadinessState.RESIDENT
        blocked = client.readiness("code")
        assert blocked is not None and blocked.state is ReadinessState.BLOCKED and not blocked.ready
        assert "chat (hot)" in blocked.why
        await trio.sleep(10.0)  # the chat ended: chat is idle, but hot for hot_window (300 s)
        assert state("code") is ReadinessState.BLOCKED
        await trio.sleep(300.0)
        assert state("code") is ReadinessState.LOADABLE  # chat is idle and cold: it may go
        assert state("chat") is ReadinessState.RESIDENT

        # Busy batch work on code is not hot, but it is busy: chat cannot come back beside it.
        nursery.start_soon(hold, harness, "code", RequestClass.BATCH, 60.0)
        await trio.sleep(LOAD_S + 5.0)  # chat is evicted for it (idle, cold), code loads and computes
        assert state("code") is ReadinessState.RESIDENT
        busy = client.readiness("chat")
        assert busy is not None and busy.state is ReadinessState.BLOCKED and "code (busy: 1 step(s))" in busy.why
        await trio.sleep(60.0)
        assert state("chat") is ReadinessState.LOADABLE  # code is idle now, and was never used interactively
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def openai_listener(keyed: bool) -> AsyncIterator[tuple[httpx.AsyncClient, Harness]]:
    """The OpenAI listener's app behind its real door (tree._listener), served in process."""
    config = parse_config({"listen": "127.0.0.1:8080", "models": {
        "chat": {"command": ["true"], "memory": "16GiB", "aliases": ["assistant"]},
        "code": {"command": ["true"], "memory": "16GiB"}}, "usage": {"db": None}})
    async with trio.open_nursery() as nursery:
        harness = await start_harness(nursery, 24, EngineProfile("chat", 16 * GIB, 1), EngineProfile("code", 16 * GIB, 1))
        door = FrontDoor(harness.events, UsageLog(None, harness.events, None))
        if keyed:
            door.replace_keys(key_file(("root", ADMIN_KEY, True)))
        metrics = StewardMetrics()
        metrics.watch(harness.client)
        harness.events.listeners.append(metrics.observe)
        services = Services(scheduler=harness.client, events=harness.events, gate=RequestGate(), metrics=metrics,
                            door=door, health=HealthWatch(harness.client, RecentActivity(60.0), {}),
                            body_limits=body_limits(config), history=History(), usage_db=None)
        listener = _listener(config, harness.events, door, "openai", create_app(config, services), config.listen,
                             error_body, error_shape_for, gateway_app.is_admin_route)
        transport = httpx.ASGITransport(app=listener.app, client=("127.0.0.1", 50000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8080") as client:
            yield client, harness
        nursery.cancel_scope.cancel()


async def test_the_readiness_route_answers_200_503_404_without_a_key_as_healthz_does() -> None:
    async with openai_listener(keyed=True) as (client, harness):
        cold = await client.get("/healthz/models/chat")
        assert (cold.status_code, cold.json()["state"], cold.json()["ready"]) == (200, "loadable", True)
        async with harness.client.open_grant("chat", RequestClass.INTERACTIVE):
            resident = await client.get("/healthz/models/assistant")  # an alias is as ready as its model
            blocked = await client.get("/healthz/models/code")
            generation = next(e.generation for e in harness.client.snapshot().engines if e.name == "chat")
            harness.client.report_load("chat", generation, None, None, 0.25)
            await trio.testing.wait_all_tasks_blocked()
            health = await client.get("/healthz")
        unknown = await client.get("/healthz/models/nobody")
        dotted = await client.get("/healthz/models/..%2F..%2Fadmin%2Fstate")  # ../../admin/state once decoded
        metrics = await client.get("/metrics")
        keyed_metrics = await client.get("/metrics", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert resident.status_code == 200
    assert resident.json() == {"model": "assistant", "alias_of": "chat", "ready": True, "state": "resident",
                               "why": "chat is loaded (1 of 1 slot(s) busy)"}
    assert blocked.status_code == 503 and blocked.headers["content-type"] == "application/json"
    engines = health.json()["engines"]
    assert engines["chat"]["engine_load"] == {"running": None, "waiting": None, "kv_usage": 0.25}
    assert engines["code"]["engine_load"] is None  # it says nothing: not loaded
    assert blocked.json()["state"] == "blocked" and "chat (hot)" in blocked.json()["why"]
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert dotted.status_code == 404 and "../../admin/state" in dotted.json()["error"]["message"]  # a name, no way out
    assert metrics.status_code == 401  # /metrics keeps its keys: only the probe is open
    assert keyed_metrics.status_code == 200 and 'vllm:num_requests_running{model_name="chat"}' in keyed_metrics.text
    # Probes are polls: counted under one path, never one label per name a client sends.
    assert 'steward_polls_answered_total{listener="openai",path="/healthz/models/NAME"} 5.0' in keyed_metrics.text


def gauges(url: str) -> dict[str, dict[str, float]]:
    """The protocol's gauges and steward_model_ready on a running steward's /metrics: name -> {model: value}."""
    page = httpx.get(f"{url}/metrics", timeout=5).text
    return {family.name: {s.labels[MODEL_LABEL]: s.value for s in family.samples}
            for family in text_string_to_metric_families(page)
            if family.name in PROTOCOL or family.name == "steward_model_ready"}


# A prompt of this many token ids is this many tokens to any llama-server (the fake counts them so too).
PROMPT_TOKENS = 512


@pytest.mark.slow
def test_a_running_steward_exports_the_gauges_and_sheds_a_model_that_would_evict_a_busy_one(
        start_steward: StewardFactory) -> None:
    """A real steward with two fake llama-servers that do not fit side by side: while a completion
    of a known prompt computes on one, it is resident with one of its two slots busy, its KV use is
    its engine's own (the prompt's tokens over its two 2048-token slots, read from its /slots), and
    the other says 503. Once the client has left its slot's cache is idle: free again."""
    steward = start_steward({"chat": fake_model("4GiB", parallel=2, tps=0.1, extra=["-c", "4096"]),
                             "code": fake_model("4GiB", parallel=2)},
                            gpu={"probe": "none", "budget": "6GiB"})
    url = steward.url
    assert httpx.get(f"{url}/healthz/models/code", timeout=5).json()["state"] == "loadable"
    answers: list[int] = []
    seen = threading.Event()

    def complete() -> None:  # one token at 0.1 tokens/s: it computes for 10 s, unless the client leaves first
        with httpx.stream("POST", f"{steward.base_url}/completions", timeout=60, json={
                "model": "chat", "max_tokens": 1, "prompt": [1] * PROMPT_TOKENS, "stream": True}) as answer:
            answers.append(answer.status_code)
            seen.wait(60)  # then it leaves: its slot is freed

    computing = threading.Thread(target=complete)
    computing.start()
    try:
        busy = wait_until(lambda: (g := gauges(url))["vllm:kv_cache_usage_perc"].get("chat") == PROMPT_TOKENS / 4096
                          and g, "the engine's own KV figure shows the prompt's tokens")
        assert busy["vllm:num_requests_running"] == {"chat": 1, "code": 0}
        assert busy["vllm:kv_cache_usage_perc"] == {"chat": 0.125, "code": 0.0}  # not the busy slots' 0.5
        assert busy["vllm:num_requests_waiting"] == {"chat": 0, "code": 0}
        assert busy["steward_model_ready"] == {"chat": 1, "code": 0}
        load = httpx.get(f"{url}/healthz", timeout=5).json()["engines"]["chat"]["engine_load"]
        assert load == {"running": None, "waiting": None, "kv_usage": 0.125}
        resident = httpx.get(f"{url}/healthz/models/chat", timeout=5)
        blocked = httpx.get(f"{url}/healthz/models/code", timeout=5)
        assert resident.status_code == 200 and resident.json()["state"] == "resident"
        assert blocked.status_code == 503 and blocked.json()["state"] == "blocked"
        assert httpx.get(f"{url}/healthz/models/nobody", timeout=5).status_code == 404
    finally:
        seen.set()
        computing.join(60)
    assert answers == [200]
    # Its slot keeps the prompt cached, idle: free to the next request, so not counted.
    wait_until(lambda: gauges(url)["vllm:kv_cache_usage_perc"] == {"chat": 0.0, "code": 0.0},
               "the idle slot's cache counts as free")
