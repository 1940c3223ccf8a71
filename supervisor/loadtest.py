"""``steward loadtest``: the GridCore client mix against a running steward, in real time.

Chat clients (interactive, streaming), background agents, batch jobs and embedding
indexers each loop: ask, wait for the whole answer, think, ask again, until the
duration is over. Bounded in count and time, loopback only. Without ``--url`` it
starts its own steward on the demo's simulated GPU and fake engines (a child process,
so the load generator does not share steward's CPU time slice), and reads steward's
event log afterwards for loads, evictions and peak memory.
"""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio
import yaml

from supervisor.events import read_event_log
from supervisor.scheduler.types import CLASSES


@attrs.frozen
class ClientKind:
    name: str  # chat, background, batch, embedding
    klass: str
    model: str
    think_s: tuple[float, float]
    max_tokens: tuple[int, int] = (16, 64)
    inputs: int = 0  # > 0: an embeddings client sending this many inputs per request


def default_kinds(models: dict[str, str]) -> list[ClientKind]:
    return [
        ClientKind("chat", "interactive", models["chat"], think_s=(1.0, 3.0), max_tokens=(24, 64)),
        ClientKind("background", "background", models["background"], think_s=(0.0, 0.5), max_tokens=(32, 96)),
        ClientKind("batch", "batch", models["batch"], think_s=(0.0, 0.2), max_tokens=(32, 96)),
        ClientKind("embedding", "background", models["embedding"], think_s=(0.5, 1.0), inputs=100),
    ]


@attrs.define
class Outcome:
    kind: str
    klass: str
    started: float
    latency: float
    status: int  # 0: no HTTP answer at all
    ttft: float | None = None


@attrs.define
class LoadReport:
    duration_s: float
    outcomes: list[Outcome]
    engine_events: dict[str, Any] | None = None

    def by_class(self) -> dict[str, dict[str, Any]]:
        table = {}
        for klass in CLASSES:
            rows = [o for o in self.outcomes if o.klass == klass]
            ok = sorted(o.latency for o in rows if o.status == 200)
            table[klass] = {"requests": len(rows), "completed": len(ok), "errors": len(rows) - len(ok),
                            "p50_s": _quantile(ok, 0.50), "p95_s": _quantile(ok, 0.95),
                            "max_s": ok[-1] if ok else None}
        return table

    def to_json(self) -> dict[str, Any]:
        errors = sorted({o.status for o in self.outcomes if o.status != 200})
        return {"duration_s": self.duration_s, "classes": self.by_class(), "error_statuses": errors,
                "engines": self.engine_events}


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, math.ceil(q * len(values)) - 1)]


async def run_clients(base_url: str, kinds: dict[ClientKind, int], duration: float, seed: int = 7,
                      ) -> list[Outcome]:
    """Run every client until *duration* has passed; requests in flight then are finished."""
    outcomes: list[Outcome] = []
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(600.0), limits=limits) as http:
        deadline = trio.current_time() + duration
        async with trio.open_nursery() as nursery:
            for kind, count in kinds.items():
                for index in range(count):
                    nursery.start_soon(_client_loop, http, kind, random.Random(rng.random()), deadline, outcomes,
                                       name=f"{kind.name}-{index}")
    return outcomes


async def _client_loop(http: httpx.AsyncClient, kind: ClientKind, rng: random.Random, deadline: float,
                       outcomes: list[Outcome]) -> None:
    await trio.sleep(rng.uniform(0, 0.5))  # do not all start in the same instant
    while trio.current_time() < deadline:
        outcomes.append(await _one_request(http, kind, rng))
        await trio.sleep(rng.uniform(*kind.think_s))


async def _one_request(http: httpx.AsyncClient, kind: ClientKind, rng: random.Random) -> Outcome:
    started = trio.current_time()
    headers = {"X-Steward-Class": kind.klass}
    ttft = None
    try:
        if kind.inputs:
            body = {"model": kind.model, "input": [f"document {rng.random():.6f} " * 8 for _ in range(kind.inputs)]}
            response = await http.post("/v1/embeddings", json=body, headers=headers)
            status = response.status_code
            if status == 200 and len(response.json()["data"]) != kind.inputs:
                status = 0  # a partial answer is a failure, not a success
        elif kind.klass == "interactive":
            body = {"model": kind.model, "stream": True, "max_tokens": rng.randint(*kind.max_tokens),
                    "messages": [{"role": "user", "content": "tell me something " * rng.randint(2, 20)}]}
            async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
                status = response.status_code
                done = False
                async for line in response.aiter_lines():
                    if ttft is None and line.startswith("data: {") and '"content"' in line:
                        ttft = trio.current_time() - started
                    if line.startswith("data: {\"error\""):
                        status = 502
                    done = done or line == "data: [DONE]"
                if status == 200 and not done:
                    status = 0  # the stream ended without [DONE]
        else:
            body = {"model": kind.model, "max_tokens": rng.randint(*kind.max_tokens),
                    "messages": [{"role": "user", "content": "work on this " * rng.randint(5, 40)}]}
            response = await http.post("/v1/chat/completions", json=body, headers=headers)
            status = response.status_code
    except httpx.HTTPError:
        status = 0
    return Outcome(kind.name, kind.klass, started, trio.current_time() - started, status, ttft)


def summarize_events(path: Path) -> dict[str, Any]:
    """Loads, evictions, unnecessary loads and peak reserved memory from steward's event log.

    An unnecessary load is a load of a model that was evicted earlier at a moment when
    the memory it gave up was not needed (the free memory already covered the need).
    """
    loads = evictions = unnecessary = 0
    peak = 0
    evicted_needlessly: set[str] = set()
    for record in read_event_log(path):
        name = record["event"]
        if name in ("load", "restart"):
            loads += 1
            peak = max(peak, record["reserved"])
            if record["engine"] in evicted_needlessly:
                unnecessary += 1
                evicted_needlessly.discard(record["engine"])
        elif name == "evict":
            evictions += 1
            if record.get("free", -1) >= record["need"]:
                evicted_needlessly.add(record["engine"])
    return {"loads": loads, "evictions": evictions, "unnecessary_loads": unnecessary, "peak_reserved_bytes": peak}


def format_report(report: LoadReport) -> str:
    lines = [f"{'class':<12} {'requests':>8} {'completed':>9} {'errors':>6} {'p50':>8} {'p95':>8} {'max':>8}"]
    for klass, row in report.by_class().items():
        cells = [f"{row[k]:>7.2f}s" if row[k] is not None else f"{'-':>8}" for k in ("p50_s", "p95_s", "max_s")]
        lines.append(f"{klass:<12} {row['requests']:>8} {row['completed']:>9} {row['errors']:>6} " + " ".join(cells))
    ttfts = sorted(o.ttft for o in report.outcomes if o.ttft is not None)
    if ttfts:
        lines.append(f"chat time to first token: p50 {_quantile(ttfts, 0.5):.2f}s  p95 {_quantile(ttfts, 0.95):.2f}s")
    if report.engine_events:
        e = report.engine_events
        lines.append(f"loads {e['loads']}  evictions {e['evictions']}  unnecessary loads {e['unnecessary_loads']}  "
                     f"peak reserved {e['peak_reserved_bytes'] / 1024**3:.1f} GiB")
    errors = sorted({o.status for o in report.outcomes if o.status != 200})
    if errors:
        lines.append(f"error statuses seen: {errors} (0 = no HTTP answer)")
    return "\n".join(lines)


def start_demo_steward(workdir: Path, *, real: bool = False) -> tuple[subprocess.Popen[bytes], str, Path]:
    """A steward on the demo's engines (fake, or real with ``real``), as a child process."""
    from supervisor.demo import RealEnginesUnavailable, demo_config_dict, real_demo_config_dict

    try:
        config = real_demo_config_dict(workdir, port=0) if real else demo_config_dict(workdir, port=0)
    except RealEnginesUnavailable as exc:
        raise RuntimeError(str(exc)) from None
    config["log"] = {"file": str(workdir / "events.jsonl"), "terminal": "warning"}
    config_path = workdir / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    process = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "run", str(config_path)],
                               stdin=subprocess.DEVNULL, start_new_session=True)
    events = workdir / "events.jsonl"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"steward exited with status {process.returncode}")
        if events.exists():
            for record in read_event_log(events):
                if record["event"] == "listening":
                    return process, record["urls"][0], events
        time.sleep(0.05)
    stop_steward(process)
    raise RuntimeError("steward did not start within 30 s")


def stop_steward(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def run_loadtest(url: str | None, counts: dict[str, int], duration: float, models: dict[str, str],
                 seed: int = 7, *, real: bool = False) -> LoadReport:
    kinds = {kind: counts[kind.name] for kind in default_kinds(models) if counts.get(kind.name)}
    if url is not None:
        outcomes = trio.run(run_clients, f"{url.rstrip('/')}", kinds, duration, seed)
        return LoadReport(duration, outcomes)
    with tempfile.TemporaryDirectory(prefix="steward-loadtest-") as workdir:
        process, steward_url, events = start_demo_steward(Path(workdir), real=real)
        try:
            outcomes = trio.run(run_clients, steward_url, kinds, duration, seed)
        finally:
            stop_steward(process)
        return LoadReport(duration, outcomes, summarize_events(events))
