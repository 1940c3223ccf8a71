"""Remote models (`runtime: remote`): a cloud API as one of steward's models (supervisor/gateway/cloud.py).

The config and the keys are pure; the HTTPS opener meets a real socket. The slow test stands up
a "cloud": the fake vLLM (fakes/openai_server) behind TLS on loopback, with a certificate from
a CA the test makes (openssl), checking the key header and counting what it was sent; steward
trusts that CA through the model's ``ca_file``, and the official ``openai`` SDK sees a local
model's answer and the cloud's with only ``model`` differing.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import socket
import sqlite3
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import trio

from supervisor.auth.keys import ApiKey, KeyHash, KeyName
from supervisor.backoff import Backoff
from supervisor.config import ConfigError, PriceConfig, parse_config
from supervisor.config_policy import remote_key_problems
from supervisor.gateway.relay.https_upstream import HttpsOpener
from supervisor.gateway.relay.tls import tls_context
from supervisor.gateway.relay.upstream import UpstreamUnreachable
from tests.conftest import FORKSERVER, StewardFactory, fake_model, free_port, stop_process, wait_usage_rows

CLOUD_KEY = "sk-cloud-test-0123456789"


def remote(**fields: Any) -> dict[str, Any]:
    return {"runtime": "remote", "upstream": "https://api.example.com/v1", "key_env": "CLOUD_KEY", **fields}


def problems(models: dict[str, Any], **sections: Any) -> list[str]:
    try:
        parse_config({"models": models, **sections})
    except ConfigError as exc:
        return exc.problems
    return []


# --- config ---------------------------------------------------------------------------------------------------


def test_a_remote_model_is_read_apart_from_the_engines() -> None:
    config = parse_config({"models": {
        "cloud": remote(served_name="gpt-4o-mini", aliases=["mini"], max_concurrency=2,
                        price={"input": 0.15, "output": 0.6}, timeout="30s"),
        "local": {"command": ["x"], "memory": "1GiB"}}})
    assert list(config.models) == ["local"]  # no engine, no memory, no scheduler entry
    cloud = config.remote_models["cloud"]
    assert (cloud.upstream, cloud.api, cloud.served_name, cloud.max_concurrency, cloud.timeout) == (
        "https://api.example.com/v1", "openai", "gpt-4o-mini", 2, 30.0)
    assert config.remote_alias_table() == {"cloud": "cloud", "mini": "cloud"}
    assert cloud.price.cost(1_000_000, 2_000_000) == pytest.approx(0.15 + 1.2)
    assert remote_default_concurrency() == 4


def remote_default_concurrency() -> int:
    return parse_config({"models": {"cloud": remote()}}).remote_models["cloud"].max_concurrency


@pytest.mark.parametrize(("fields", "expected"), [
    ({"upstream": "http://api.example.com/v1"}, "models.cloud.upstream: must be https://"),
    ({"upstream": "ftp://api.example.com"}, "models.cloud.upstream: must be an API's base URL"),
    ({"upstream": "https://user:pw@api.example.com"}, "models.cloud.upstream: must be an API's base URL"),
    ({"key_env": "NOT-A-NAME"}, "models.cloud.key_env: must be the name of an environment variable"),
    ({"price": {"input": -1}}, "models.cloud.price.input: must be a price per million tokens"),
    ({"api": "gemini"}, "models.cloud.api: must be one of 'openai', 'anthropic'"),
    ({"max_concurrency": 0}, "models.cloud.max_concurrency: must be a positive integer"),
    ({"served_name": ""}, "models.cloud.served_name: must be the model's name at the cloud"),
    ({"memory": "1GiB"}, "models.cloud.memory: unknown key"),
])
def test_remote_config_errors_name_the_key(fields: dict[str, Any], expected: str) -> None:
    found = problems({"cloud": remote(**fields)})
    assert any(line.startswith(expected) for line in found), found


def test_http_is_taken_to_loopback_only_and_names_clash_with_no_other_model() -> None:
    assert problems({"cloud": remote(upstream="http://127.0.0.1:8443/v1")}) == []
    assert problems({"cloud": remote(upstream="http://[::1]:8443")}) == []
    clash = problems({"cloud": remote(aliases=["chat"]), "chat": {"command": ["x"], "memory": "1GiB"}})
    assert clash == ["models.cloud.aliases: 'chat' already names 'chat'"]
    assert problems({"cloud": remote()}, scheduler={"warm": ["cloud"]}) == [
        "scheduler.warm[0]: 'cloud' is a remote model: a cloud serves it, steward loads nothing"]
    assert problems({"cloud": remote()}, remote_models={}) == [
        "remote_models: unknown key (a remote model goes under models, with runtime: remote)"]


def test_a_key_variable_not_set_or_an_unreadable_ca_file_refuses_the_config(tmp_path: Path) -> None:
    config = parse_config({"models": {"cloud": remote(ca_file=str(tmp_path / "missing.pem"))}})
    found = remote_key_problems(config, {})
    assert found[0] == ("models.cloud.key_env: CLOUD_KEY is not set in steward's environment (it holds the "
                        "cloud's API key)")
    assert found[1].startswith(f"models.cloud.ca_file: cannot read {tmp_path / 'missing.pem'} as PEM")
    (tmp_path / "junk.pem").write_text("not a certificate")
    config = parse_config({"models": {"cloud": remote(ca_file=str(tmp_path / "junk.pem"))}})
    assert [p.split(":")[0] for p in remote_key_problems(config, {"CLOUD_KEY": "k"})] == ["models.cloud.ca_file"]


def test_steward_check_shows_a_remote_model_and_refuses_a_missing_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from supervisor.check import run_check
    from supervisor.exit_status import EXIT_CONFIG

    config = parse_config({"models": {"cloud": remote(max_concurrency=2, price={"input": 0.15, "output": 0.6})},
                           "gpu": {"probe": "none"}, "state_file": None, "usage": {"db": None},
                           "auth": {"keys_file": str(tmp_path / "keys.json")}})
    monkeypatch.delenv("CLOUD_KEY", raising=False)
    assert run_check(config) == EXIT_CONFIG
    assert "models.cloud.key_env: CLOUD_KEY is not set" in capsys.readouterr().err
    monkeypatch.setenv("CLOUD_KEY", "k")
    assert run_check(config) == 0
    assert ("remote cloud  https://api.example.com/v1 (openai API, key from $CLOUD_KEY, 2 at once, 0.15/0.6 per "
            "million tokens in/out): no GPU memory") in capsys.readouterr().out


# --- keys, prices, retries ------------------------------------------------------------------------------------


def key(**fields: Any) -> ApiKey:
    return ApiKey(name=KeyName("k"), hash=KeyHash("0" * 64), created=datetime(2026, 12, 1, tzinfo=UTC), **fields)


def test_a_key_reaches_remote_models_only_where_it_may_send_data_out() -> None:
    assert not key().may_reach_remote  # all models, said nothing: private data stays home
    assert key(models=("cloud",)).may_reach_remote  # its list names the cloud's model
    assert not key(models=("cloud",), no_remote=True).may_reach_remote  # --no-remote wins
    assert key(no_remote=False).may_reach_remote  # --remote


def test_cost_is_per_million_tokens_and_a_count_not_told_costs_nothing() -> None:
    price = PriceConfig(input=0.15, output=0.6)
    assert price.cost(1000, 500) == pytest.approx(0.00045)
    assert price.cost(None, 500) == pytest.approx(0.0003)
    assert PriceConfig().cost(10**6, 10**6) == 0


def test_a_backoff_with_retries_ends() -> None:
    assert list(Backoff(0.25, 1.0, retries=3).delays()) == [0.25, 0.5, 1.0]
    assert list(Backoff(1, 1, retries=0).delays()) == []


async def test_a_refused_connection_is_unreachable_and_nothing_else_is() -> None:
    with socket.socket() as sock:  # a port nobody listens on: bound, never listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        opener = HttpsOpener("https", tls_context(None))
        with pytest.raises(UpstreamUnreachable, match="connection refused"):
            async with opener("127.0.0.1", port, b"POST", b"/v1/chat/completions", [], b"{}"):
                raise AssertionError("connected")


# --- a cloud on loopback, behind TLS ----------------------------------------------------------------------------


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate for 127.0.0.1 signed by it: (ca.pem, server.pem, server.key)."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *curve, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=steward test CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    openssl("req", *curve, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (folder / "server.ext").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                                       "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
                                       "authorityKeyIdentifier=keyid\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "2", "-extfile", "server.ext")
    return folder / "ca.pem", folder / "server.pem", folder / "server.key"


@contextlib.contextmanager
def cloud(tmp_path: Path, served: str = "gpt-cloud", *extra: str) -> Iterator[tuple[str, Path, httpx.Client]]:
    """The fake vLLM behind TLS as *served*, with CLOUD_KEY as its key: (its base URL, the CA, a client)."""
    ca, certificate, private_key = make_certificates(tmp_path)
    port = free_port()
    process = FORKSERVER.start("fakes.openai_server", [
        "--port", str(port), "--served-model-name", served, "--api-key", CLOUD_KEY,
        "--ssl-certfile", str(certificate), "--ssl-keyfile", str(private_key), "--tokens-per-second", "40",
        "--disable-uvicorn-access-log", *extra], output=tmp_path / "cloud.log")
    client = httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=ssl.create_default_context(cafile=ca))
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, (tmp_path / "cloud.log").read_text()
            with contextlib.suppress(httpx.TransportError):
                if client.get("/health").status_code == 200:
                    break
            assert time.monotonic() < deadline, "the cloud did not start"
            time.sleep(0.05)
        yield f"https://127.0.0.1:{port}/v1", ca, client
    finally:
        client.close()
        stop_process(process)


ASKED = [{"role": "user", "content": "Say hello."}]


def comparable(answer: Any) -> dict[str, Any]:
    """An answer without what differs from one answer to the next (id, time) and its model."""
    return {k: v for k, v in answer.model_dump().items() if k not in ("id", "created", "model")}


@pytest.mark.slow
def test_a_cloud_behind_tls_is_a_model_like_a_local_one(start_steward: StewardFactory, sim_gpu: Any,
                                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOUD_KEY", CLOUD_KEY)
    monkeypatch.setenv("WRONG_KEY", "sk-not-the-key")
    gpu = sim_gpu("8GiB")
    with cloud(tmp_path) as (upstream, ca, direct):
        local = {"runtime": "openai", "memory": "1GiB", "command": [
            sys.executable, "-m", "fakes.openai_server", "--port", "${PORT}", "--served-model-name", "local",
            "--memory", "1GiB", "--sim-gpu", str(gpu), "--tokens-per-second", "40", "--disable-uvicorn-access-log"]}
        steward = start_steward(
            {"local": local,
             "cloud": remote(upstream=upstream, served_name="gpt-cloud", ca_file=str(ca), max_concurrency=2,
                             price={"input": 0.15, "output": 0.6}),
             "untrusted": remote(upstream=upstream, served_name="gpt-cloud"),
             "wrong-key": remote(upstream=upstream, served_name="gpt-cloud", ca_file=str(ca), key_env="WRONG_KEY")},
            gpu={"probe": "simulated", "simulated_dir": str(gpu), "poll_interval": "0.1s"})
        client = openai.OpenAI(base_url=steward.base_url, api_key="unused", max_retries=0)

        # The same answer from here and from the cloud, but for its model, which is steward's name.
        here = client.chat.completions.create(model="local", messages=ASKED, max_tokens=6)
        there = client.chat.completions.create(model="cloud", messages=ASKED, max_tokens=6)
        assert (here.model, there.model) == ("local", "cloud")
        assert comparable(here) == comparable(there)
        chunks = list(client.chat.completions.create(model="cloud", messages=ASKED, max_tokens=6, stream=True))
        assert {chunk.model for chunk in chunks} == {"cloud"}
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == there.choices[0].message.content

        # No GPU memory, no engine: listed as a cloud's.
        listed = {m.id: m.model_dump() for m in client.models.list()}
        assert listed["cloud"]["owned_by"] == "remote" and listed["cloud"]["steward"]["memory"] == 0
        assert "cloud" not in steward.health()["engines"]
        state = httpx.get(f"{steward.url}/admin/state", timeout=10).json()
        assert {row["name"]: (row["memory"], row["max_concurrency"]) for row in state["remote"]} == {
            "cloud": (0, 2), "untrusted": (0, 4), "wrong-key": (0, 4)}
        assert {row["name"]: row["in_flight"] for row in steward.health()["remote"]} == {
            "cloud": 0, "untrusted": 0, "wrong-key": 0}
        assert 'steward_remote_places{model="cloud"} 2.0' in httpx.get(f"{steward.url}/metrics", timeout=10).text

        # A burst over max_concurrency waits for a place, then is served; the cloud never had more than 2.
        with concurrent.futures.ThreadPoolExecutor(5) as pool:
            burst = list(pool.map(lambda _: client.chat.completions.create(
                model="cloud", messages=ASKED, max_tokens=12), range(5)))
        assert [answer.model for answer in burst] == ["cloud"] * 5
        stats = direct.get("/fake/stats").json()
        assert stats["max_running"] == 2
        assert stats["api_requests"] == 7 and stats["unauthorized"] == 0  # each request sent once, with the key

        # The cloud's own refusal (a wrong key), in OpenAI's shape; a certificate no CA vouches for, a clean 502.
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model="wrong-key", messages=ASKED, max_tokens=2)
        assert direct.get("/fake/stats").json()["unauthorized"] == 1
        refused = httpx.post(f"{steward.base_url}/chat/completions", timeout=30,
                             json={"model": "untrusted", "messages": ASKED, "max_tokens": 2})
        assert refused.status_code == 502
        error = refused.json()["error"]
        assert "certificate verify failed" in error["message"] and error["code"] == "engine_error"
        assert direct.get("/fake/stats").json()["api_requests"] == 7  # nothing reached the cloud

        rows = wait_usage_rows(steward.usage_db, 11)
        served = [row for row in rows if row["model"] == "cloud" and row["status"] == 200]
        assert len(served) == 7
        for row in served:
            assert row["engine"] == "remote:cloud" and row["prompt_tokens"] and row["completion_tokens"]
            assert row["cost"] == pytest.approx(row["prompt_tokens"] * 0.15 / 1e6 + row["completion_tokens"] * 0.6 / 1e6)
        assert [row["cost"] for row in rows if row["model"] == "local"] == [None]
        assert any(row["model"] == "untrusted" and row["status"] == 502 for row in rows)


@pytest.mark.slow
def test_an_anthropic_cloud_gets_its_key_in_x_api_key(start_steward: StewardFactory, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import anthropic

    monkeypatch.setenv("CLOUD_KEY", CLOUD_KEY)
    with cloud(tmp_path, "claude-cloud", "--anthropic-key") as (upstream, ca, direct):
        steward = start_steward({"claude": remote(upstream=upstream, api="anthropic", served_name="claude-cloud",
                                                  ca_file=str(ca), price={"input": 3, "output": 15})})
        client = anthropic.Anthropic(base_url=steward.url, api_key="unused", max_retries=0)
        message = client.messages.create(model="claude", max_tokens=6, messages=ASKED)
        assert message.model == "claude" and message.usage.output_tokens > 0
        with client.messages.stream(model="claude", max_tokens=6, messages=ASKED) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert text == "".join(block.text for block in message.content if block.type == "text")
        assert final.model == "claude"
        assert direct.get("/fake/stats").json()["api_requests"] == 2
        # An OpenAI route to an Anthropic cloud is refused in OpenAI's shape, and nothing is sent.
        wrong = httpx.post(f"{steward.base_url}/chat/completions", timeout=10,
                           json={"model": "claude", "messages": ASKED})
        assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "model_not_supported"
        rows = wait_usage_rows(steward.usage_db, 3)
        served = [row for row in rows if row["status"] == 200]
        assert len(served) == 2 and all(row["engine"] == "remote:claude" for row in served)
        assert all(row["cost"] == pytest.approx((row["prompt_tokens"] * 3 + row["completion_tokens"] * 15) / 1e6)
                   and row["completion_tokens"] for row in served)


@pytest.mark.slow
def test_a_model_whose_engine_fails_falls_back_to_the_cloud(start_steward: StewardFactory, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's chain: background and batch to the smaller local variant, interactive to a cloud
    when the model's engine failed. The answers name the cloud's model; the usage row the model asked
    for and the cloud that served it, with its cost and no GPU time; a key that may not send data out
    of the house is never sent there."""
    from supervisor.auth.keys import add_key

    monkeypatch.setenv("CLOUD_KEY", CLOUD_KEY)
    keys = tmp_path / "keys.json"
    with cloud(tmp_path) as (upstream, ca, direct):
        models = {
            "big": fake_model("2GiB", extra=["--fail-load", "out of memory"], fallback=[
                {"model": "small", "when": ["no_room", "failed"], "classes": ["background", "batch"]},
                {"model": "cloud", "when": ["wait", "failed"], "classes": ["interactive"]}]),
            "small": fake_model("1GiB"),
            "cloud": remote(upstream=upstream, served_name="gpt-cloud", ca_file=str(ca), price={"input": 1, "output": 2})}
        names = ["big", "small", "cloud"]
        outward = add_key(keys, "outward", models=names, known_models=names).split()[-1]
        private = add_key(keys, "private", models=names, known_models=names, no_remote=True).split()[-1]
        steward = start_steward(models, gpu={"probe": "none", "budget": "4GiB"}, auth={"keys_file": str(keys)},
                                usage={"db": str(tmp_path / "u.db")}, engines={"restart_backoff": "60s"})
        client = openai.OpenAI(base_url=steward.base_url, api_key=outward, max_retries=0)

        # A key that may not send data out of the house waits for big's engine, as without a chain,
        # and is told its start failed; nothing reached the cloud for it.
        refused = httpx.post(f"{steward.base_url}/chat/completions", timeout=30,
                             headers={"authorization": f"Bearer {private}"},
                             json={"model": "big", "messages": ASKED, "max_tokens": 4})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_start_failed"
        assert direct.get("/fake/stats").json()["api_requests"] == 0 and not steward.events("fallback")

        # big's engine waits for its restart, a minute away: an interactive request goes to the cloud.
        raw = client.chat.completions.with_raw_response.create(model="big", messages=ASKED, max_tokens=6)
        answer = raw.parse()
        assert (answer.model, raw.headers["x-steward-model"]) == ("cloud", "cloud")
        direct_answer = direct.post("/v1/chat/completions", headers={"authorization": f"Bearer {CLOUD_KEY}"},
                                    json={"model": "gpt-cloud", "messages": ASKED, "max_tokens": 6}).json()
        assert answer.choices[0].message.content == direct_answer["choices"][0]["message"]["content"]
        moved = steward.wait_event("fallback")
        assert (moved["model"], moved["to"], moved["when"], moved["remote"]) == ("big", "cloud", "failed", True)
        assert moved["why"].startswith("interactive request for big goes to cloud (a cloud): big's engine failed")
        chunks = list(client.chat.completions.create(model="big", messages=ASKED, max_tokens=6, stream=True))
        assert {chunk.model for chunk in chunks} == {"cloud"}
        # A background request goes to the local variant, not out of the house.
        background = client.chat.completions.create(model="big", messages=ASKED, max_tokens=4,
                                                    extra_headers={"x-steward-class": "background"})
        assert background.model == "small"
        steward.stop()

    with sqlite3.connect(tmp_path / "u.db") as db:
        db.row_factory = sqlite3.Row
        rows = [dict(row) for row in db.execute("SELECT * FROM requests ORDER BY ts")]
    assert [(row["key"], row["model"], row["engine"], row["status"]) for row in rows] == [
        ("private", "big", None, 503), ("outward", "big", "remote:cloud", 200), ("outward", "big", "remote:cloud", 200),
        ("outward", "big", "small", 200)]
    for row in rows[1:3]:
        assert row["cost"] == pytest.approx((row["prompt_tokens"] * 1 + row["completion_tokens"] * 2) / 1e6)
        assert not row["gpu_s"]  # a cloud's time is no GPU time here
    assert rows[3]["cost"] is None and rows[3]["gpu_s"] > 0


class OnePlaceTaken:
    """Remote model ``cloud`` (max_concurrency 1, queue timeout 5 s) whose one place someone holds,
    and a chat request for it: what the next request to it meets."""

    def __init__(self, max_queue: dict[Any, float] | None = None) -> None:
        from supervisor.gateway.catalog import ModelCatalog
        from supervisor.gateway.cloud import RemoteModels
        from supervisor.gateway.door import FrontDoor
        from supervisor.gateway.routed import route_request
        from supervisor.observe.events import EventLog
        from supervisor.request_class import RequestClass
        from supervisor.usage.writer import UsageLog

        self.config = parse_config({"models": {"cloud": remote(max_concurrency=1)}})
        catalog = ModelCatalog.of(self.config)
        send_events, _ = trio.open_memory_channel[Any](math.inf)
        events = EventLog(send_events, recent_max=1000)
        door = FrontDoor(events, UsageLog(None, events, None), aliases=catalog.names)
        self.models = RemoteModels(catalog, door, events, dict.fromkeys(RequestClass, 5.0),
                                   max_queue or dict.fromkeys(RequestClass, math.inf), environ={"CLOUD_KEY": "k"})
        self.scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
                      "raw_path": b"/v1/chat/completions", "headers": [], "query_string": b""}
        self.routed = route_request(self.scope, b'{"model": "cloud", "messages": []}', {}).request  # type: ignore[union-attr]
        self.sent: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    async def take(self) -> None:
        await self.models._limiter("cloud", self.config.remote_models["cloud"]).acquire_on_behalf_of("someone")


async def test_waiting_for_a_place_is_bounded_by_the_queue_timeout(autojump_clock: trio.testing.MockClock) -> None:
    """max_concurrency holds: a request past it waits, and is answered 503 queue_timeout when no place frees."""
    from supervisor.gateway.door import Exchange, Refusal

    one = OnePlaceTaken()
    await one.take()
    models, scope, routed, sent, send = one.models, one.scope, one.routed, one.sent, one.send
    exchange = Exchange.arriving(scope, "openai")
    start = trio.current_time()
    await models.serve(scope, routed, exchange, send)
    assert trio.current_time() - start == pytest.approx(5.0)
    assert sent[0]["status"] == 503 and b"queue_timeout" in sent[1]["body"]
    assert exchange.row(trio.current_time()).error == "queue_timeout"

    # A key that said nothing of remote models is refused before it waits: its data stays home.
    exchange = Exchange.arriving(scope, "openai")
    exchange.key = key()
    with pytest.raises(Refusal) as refused:
        await models.serve(scope, routed, exchange, send)
    assert (refused.value.status, refused.value.code) == (403, "remote_not_allowed")
    assert trio.current_time() - start == pytest.approx(5.0)  # no wait
    exchange = Exchange.arriving(scope, "openai")
    exchange.key = key(models=("cloud",), no_remote=True)
    with pytest.raises(Refusal, match="may not use remote models"):
        await models.serve(scope, routed, exchange, send)


async def test_past_the_classs_max_queue_a_request_is_refused_429_at_once(
        autojump_clock: trio.testing.MockClock) -> None:
    """Waiting for a remote model's places is bounded in count too (classes.C.max_queue), and the
    places and waiters are in /metrics."""
    from supervisor.gateway.door import Exchange
    from supervisor.observe.metrics import StewardMetrics
    from supervisor.request_class import RequestClass

    one = OnePlaceTaken({**dict.fromkeys(RequestClass, 9), RequestClass.INTERACTIVE: 1})
    await one.take()
    models, scope, routed, sent, send = one.models, one.scope, one.routed, one.sent, one.send
    metrics = StewardMetrics()
    metrics.watch_remote(models.state)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(models.serve, scope, routed, Exchange.arriving(scope, "openai"), send)
        await trio.testing.wait_all_tasks_blocked()
        scraped = metrics.render().decode()
        assert 'steward_remote_in_flight{model="cloud"} 1.0' in scraped
        assert 'steward_remote_waiting{model="cloud"} 1.0' in scraped
        assert 'steward_remote_places{model="cloud"} 1.0' in scraped
        start = trio.current_time()
        exchange = Exchange.arriving(scope, "openai")
        await models.serve(scope, routed, exchange, send)
        assert trio.current_time() == start  # refused at once, not after a wait
        assert sent[0]["status"] == 429 and b"classes.interactive.max_queue" in sent[1]["body"]
        assert exchange.row(trio.current_time()).error == "queue_full"
        sent.clear()
    assert sent[0]["status"] == 503  # the one that waited: its queue timeout


def test_steward_keys_add_says_whether_a_key_may_use_remote_models(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    import yaml

    from supervisor.auth.commands import add_keys_parser, run_keys
    from supervisor.auth.keys import list_keys

    keys_file = tmp_path / "keys.json"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"gpu": {"probe": "none"}, "auth": {"keys_file": str(keys_file)},
                                      "models": {"cloud": remote(aliases=["mini"])}}))

    def keys(*argv: str) -> int:
        parser = argparse.ArgumentParser(prog="steward")
        add_keys_parser(parser.add_subparsers(dest="command", required=True))
        return run_keys(parser.parse_args(["keys", *argv, "--config", str(config)]))

    assert keys("add", "home", "--no-remote") == 0
    assert keys("add", "agents", "--models", "mini") == 0  # a remote model's alias is a name a key may list
    assert keys("add", "out", "--remote") == 0
    with pytest.raises(SystemExit):  # one or the other
        keys("add", "both", "--remote", "--no-remote")
    assert {key.name: key.may_reach_remote for key in list_keys(keys_file)} == {"home": False, "agents": True,
                                                                               "out": True}
    capsys.readouterr()
    assert keys("list") == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(row[0], row[7]) for row in rows] == [("home", "no"), ("agents", "listed"), ("out", "yes")]
