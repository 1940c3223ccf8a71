"""``steward loadtest``: the GridCore client mix against a running steward, in real time.

Chat clients (interactive, streaming), background agents, batch jobs and embedding
indexers each loop: ask, wait for the whole answer, think, ask again, until the
duration is over. Ollama clients (``/api/chat``) and image clients (ComfyUI's
``/prompt``) can join them. Bounded in count and time, loopback only. Without ``--url``
it starts its own steward on the demo's simulated GPU and fake engines (a child process,
so the load generator does not share steward's CPU time slice), and reads steward's
event log afterwards for loads, evictions and peak memory.

While it runs it prints a plain progress line every few seconds on stderr (``LoadTally``:
requests done, failed and in flight per client kind, and how long the oldest has waited),
so that a long wait reads as one in a tmux pane or a log, not as a hang. Its own steward's
terminal output goes to ``steward.stderr`` in its folder (``--keep`` keeps it): the
loadtest says itself when it stops that steward, and names its warning and error events
in the report. The report has one row per client kind started, a kind that finished no
request included, with the reason.

``--chaos`` (supervisor/tools/chaos.py) also stops, freezes and kills the engines and
upstreams that steward supervises while the load runs, and checks afterwards that
nothing was lost: every request answered, the ledger adding up, no process left, no
fds gained; steward's memory and fds are sampled throughout.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

import attrs
import httpx
import trio
import yaml

from supervisor.tools import chaos
from supervisor.tools.demo import RealEnginesUnavailable, demo_config_dict, open_workdir, real_demo_config_dict
from supervisor.events import read_event_log
from supervisor.process import become_subreaper, die_with_parent
from supervisor.process_tree import rss_bytes
from supervisor.scheduler.types import RequestClass


@attrs.frozen
class ClientKind:
    name: str  # chat, background, batch, embedding, ollama, image
    klass: str
    model: str
    think_s: tuple[float, float]
    max_tokens: tuple[int, int] = (16, 64)
    inputs: int = 0  # > 0: an embeddings client sending this many inputs per request
    api: str = "openai"  # openai (steward's own listener), ollama (/api/chat), comfyui (/prompt)
    # Set: its prompts are this many repeats of a short phrase (about 3 tokens each, more for
    # a chat template), after a fresh number, so no engine reuses the last prompt's cache
    # (supervisor/tools/loadtest_real.py's agents); unset: a short prompt, as always.
    prompt_repeats: tuple[int, int] | None = None

    @property
    def group(self) -> str:
        """The row of the report: the class for OpenAI clients, the API for the others."""
        return self.klass if self.api == "openai" else self.name


DEFAULT_OLLAMA_MODEL = "llama3.2:3b"  # the demo's fake Ollama has it


def default_kinds(models: Mapping[str, str]) -> list[ClientKind]:
    return [
        ClientKind("chat", "interactive", models["chat"], think_s=(1.0, 3.0), max_tokens=(24, 64)),
        ClientKind("background", "background", models["background"], think_s=(0.0, 0.5), max_tokens=(32, 96)),
        ClientKind("batch", "batch", models["batch"], think_s=(0.0, 0.2), max_tokens=(32, 96)),
        ClientKind("embedding", "background", models["embedding"], think_s=(0.5, 1.0), inputs=100),
        ClientKind("ollama", "interactive", models.get("ollama", DEFAULT_OLLAMA_MODEL), think_s=(1.0, 4.0),
                   max_tokens=(8, 32), api="ollama"),
        ClientKind("image", "interactive", "", think_s=(5.0, 15.0), api="comfyui"),
    ]


@attrs.define
class Outcome:
    kind: str
    klass: str  # the report's row: a class, or ollama / image
    started: float
    latency: float
    status: int  # 0: no HTTP answer at all
    ttft: float | None = None
    # How it ended (supervisor/tools/chaos.py): answer, done, error_event, invalid (answered);
    # no_answer, timeout, truncated (lost); disconnect (the client left on purpose).
    ending: str = "answer"
    note: str = ""  # image jobs: success, error, vanished, unfinished (as /history told)

    @property
    def completed(self) -> bool:
        return self.status == 200 and self.ending in ("answer", "done")


PROGRESS_INTERVAL_S = 5.0
# A request in flight longer than this gets its age on the progress line: shorter ones
# are the mix's usual rhythm, longer ones are what a user wants explained (see /healthz).
LONG_WAIT_S = 10.0


@attrs.define
class KindCount:
    """One client kind's answered requests so far, as its clients saw them."""

    klass: str  # the class its clients ask for, or the API they use (ollama, comfyui)
    clients: int
    completed: int = 0
    failed: int = 0  # answered with an error, or lost
    left: int = 0  # its client left on purpose


@attrs.define
class LoadTally:
    """What every client kind has done so far, kept while the load runs.

    It makes the progress lines, and tells the report which kinds were started (one
    that finished no request still gets a row) and what was still in flight when the
    load was stopped. Pure: the caller says when each request was sent.
    """

    kinds: dict[str, KindCount]
    in_flight: dict[int, tuple[str, float]] = attrs.Factory(dict)  # ticket: kind, when it was sent
    _tickets: itertools.count[int] = attrs.field(factory=itertools.count, repr=False)

    @classmethod
    def of(cls, kinds: Mapping[ClientKind, int]) -> LoadTally:
        return cls({kind.name: KindCount(kind.klass if kind.api == "openai" else kind.api, count)
                    for kind, count in kinds.items() if count > 0})

    def sent(self, kind: str, at: float) -> int:
        """A request of *kind* sent at *at*; the ticket to give ``ended`` with its outcome."""
        ticket = next(self._tickets)
        self.in_flight[ticket] = (kind, at)
        return ticket

    def ended(self, ticket: int, outcome: Outcome) -> None:
        del self.in_flight[ticket]
        count = self.kinds[outcome.kind]
        if outcome.completed:
            count.completed += 1
        elif outcome.ending == chaos.LEFT:
            count.left += 1
        else:
            count.failed += 1

    def unanswered(self, kind: str) -> list[float]:
        """When each request of *kind* still in flight was sent, oldest first."""
        return sorted(at for name, at in self.in_flight.values() if name == kind)

    def progress_line(self, now: float, *, started: float, duration: float) -> str:
        """One line: how far the load is, then per kind done, failed, left and in flight."""
        elapsed = int(now - started)  # whole seconds, rounded down: never "30s/30s" before the end
        if now - started < duration:
            head = f"loadtest {elapsed}s/{duration:g}s"
        else:
            waiting = len(self.in_flight)
            answers = f"; waiting for {waiting} answer{'s' if waiting != 1 else ''}" if waiting else ""
            head = f"loadtest {elapsed}s (the {duration:g}s load is over{answers})"
        return head + ": " + "; ".join(self._kind_progress(name, now) for name in self.kinds)

    def _kind_progress(self, name: str, now: float) -> str:
        count, waiting = self.kinds[name], self.unanswered(name)
        parts = [f"{name} {count.completed} done"]
        parts += [f"{n} {what}" for n, what in ((count.failed, "failed"), (count.left, "left")) if n]
        if waiting:
            oldest = now - waiting[0]
            parts.append(f"{len(waiting)} in flight" + (f" (oldest {int(oldest)}s)" if oldest >= LONG_WAIT_S else ""))
        return ", ".join(parts)


async def serve_progress(tally: LoadTally, say: Callable[[str], None], *, started: float, duration: float,
                         interval: float = PROGRESS_INTERVAL_S,
                         task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> NoReturn:
    """Say *tally*'s progress line every *interval* seconds from *started*, until cancelled."""
    task_status.started()
    ticks = 0
    while True:
        ticks += 1
        await trio.sleep_until(started + ticks * interval)  # on the grid: a slow say does not drift it
        say(tally.progress_line(trio.current_time(), started=started, duration=duration))


@attrs.frozen
class Endpoints:
    openai: str
    ollama: str | None = None
    comfyui: str | None = None


@attrs.frozen
class ChaosOptions:
    """What ``--chaos`` does, and the bounds of the checks after it."""

    interval: float = 5.0  # mean seconds between two actions
    actions: tuple[str, ...] = chaos.ACTIONS
    freeze: tuple[float, float] = (1.0, 15.0)  # SIGSTOP lasts this long, uniformly drawn
    warmup: float | None = None  # no chaos before; the fd baseline is taken then (default: 10%, 2..60 s)
    # Longer than anything steward itself waits for (CHAOS_CONFIG: queue 60 s, start 30 s,
    # first byte 30 s, retries 5 s apart): a request that times out here is lost.
    client_timeout: float = 300.0
    idle_timeout: float = 120.0  # after the load, steward must be at rest within this
    fd_tolerance: int = 5
    sample_interval: float = 5.0  # steward's RSS and fds

    def warmup_for(self, duration: float) -> float:
        return self.warmup if self.warmup is not None else min(60.0, max(2.0, 0.1 * duration))


# Steward's own timeouts in the chaos config, small, so that it notices frozen and dead
# engines and upstreams within seconds (engines.health_check_* and the response timeouts
# are read by the health checks, issue 9).
CHAOS_CONFIG: dict[str, Any] = {
    "engines": {"health_check_interval": "1s", "health_check_timeout": "1s", "unhealthy_after": 2,
                "recover_timeout": "5s", "first_byte_timeout": "30s", "chunk_timeout": "10s",
                "start_timeout": "30s", "restart_backoff_max": "5s"},
    "classes": {"interactive": {"queue_timeout": "30s"}, "background": {"queue_timeout": "60s"},
                "batch": {"queue_timeout": "60s"}},
    "ollama": {"retry_max": "5s", "unload_timeout": "10s", "first_byte_timeout": "30s", "chunk_timeout": "10s"},
    "comfyui": {"retry_max": "5s", "job_timeout": "60s", "free_timeout": "10s"},
}


@attrs.frozen
class ResourceSample:
    t: float  # seconds from the start of the load
    rss: int
    fds: int
    own_fds: int  # chaos.count_fds: without live children's and clients' fds

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.define
class ChaosReport:
    seed: int
    schedule: list[chaos.ChaosAction]
    records: list[chaos.ChaosRecord]
    samples: list[ResourceSample]
    invariants: list[chaos.Invariant]
    warm_fds: chaos.FdCount | None = None
    end_fds: chaos.FdCount | None = None
    problems: dict[str, int] = attrs.Factory(dict)  # warning and error events in steward's log, by name
    workdir: str | None = None  # kept with --keep

    def rss(self) -> dict[str, int | None]:
        values = [s.rss for s in self.samples]
        return {"start": values[0] if values else None, "peak": max(values) if values else None,
                "end": values[-1] if values else None}

    def action_counts(self) -> dict[str, dict[str, int]]:
        counts: dict[str, dict[str, int]] = {}
        for record in self.records:
            row = counts.setdefault(record.action, {})
            row[record.result] = row.get(record.result, 0) + 1
        return counts

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "scheduled": len(self.schedule), "counts": self.action_counts(),
                "actions": [r.to_json() for r in self.records]}


@attrs.define
class LoadReport:
    duration_s: float
    outcomes: list[Outcome]
    engine_events: dict[str, Any] | None = None
    chaos: ChaosReport | None = None
    tally: LoadTally | None = None  # the kinds started, and what was in flight when the load ended
    problems: dict[str, int] | None = None  # its own steward's warning and error events, by name (not chaos)

    @property
    def passed(self) -> bool:
        return self.chaos is None or all(i.passed for i in self.chaos.invariants)

    def by_class(self) -> dict[str, dict[str, Any]]:
        """One row per class of OpenAI clients, then one for Ollama and one for image clients if any ran."""
        groups = list(RequestClass) + [g for g in ("ollama", "image") if any(o.klass == g for o in self.outcomes)]
        table = {}
        for group in groups:
            rows = [o for o in self.outcomes if o.klass == group]
            table[group] = _figures(rows)
            if group == "image":
                jobs: dict[str, int] = {}
                for o in rows:
                    if o.note:
                        jobs[o.note] = jobs.get(o.note, 0) + 1
                table[group]["jobs"] = jobs
        return table

    def by_kind(self) -> dict[str, dict[str, Any]]:
        """One row per client kind started, in order; one that completed no request says why."""
        kinds = dict(self.tally.kinds) if self.tally is not None else {}
        for o in self.outcomes:  # a report made without a tally: the kinds that were answered
            kinds.setdefault(o.kind, KindCount(o.klass, 0))
        table = {}
        for name, count in kinds.items():
            rows = [o for o in self.outcomes if o.kind == name]
            unanswered = len(self.tally.unanswered(name)) if self.tally is not None else 0
            row = {"class": count.klass, "clients": count.clients, **_figures(rows), "unanswered": unanswered}
            row["reason"] = _why_none_completed(rows, unanswered) if not row["completed"] else None
            table[name] = row
        return table

    def to_json(self) -> dict[str, Any]:
        errors = sorted({o.status for o in self.outcomes if not o.completed and o.ending != chaos.LEFT})
        result = {"duration_s": self.duration_s, "classes": self.by_class(), "kinds": self.by_kind(),
                  "error_statuses": errors, "engines": self.engine_events}
        if self.problems is not None:
            result["log_problems"] = self.problems
        if self.chaos is not None:
            c = self.chaos
            result["chaos"] = c.to_json()
            result["steward"] = {"rss_bytes": c.rss(), "fds": {"warm": c.warm_fds.to_json() if c.warm_fds else None,
                                                                "end": c.end_fds.to_json() if c.end_fds else None},
                                 "samples": [s.to_json() for s in c.samples], "log_problems": c.problems}
            result["invariants"] = [i.to_json() for i in c.invariants]
            result["passed"] = self.passed
            result["workdir"] = c.workdir
        return result


def _figures(rows: list[Outcome]) -> dict[str, Any]:
    """A report row's figures: counts by how the requests ended, latencies of the completed ones."""
    ok = sorted(o.latency for o in rows if o.completed)
    left = sum(1 for o in rows if o.ending == chaos.LEFT)
    statuses: dict[str, int] = {}
    endings: dict[str, int] = {}
    for o in rows:
        statuses[str(o.status)] = statuses.get(str(o.status), 0) + 1
        endings[o.ending] = endings.get(o.ending, 0) + 1
    return {"requests": len(rows), "completed": len(ok), "errors": len(rows) - len(ok) - left, "left": left,
            "lost": sum(1 for o in rows if o.ending in chaos.LOST), "p50_s": _quantile(ok, 0.50),
            "p95_s": _quantile(ok, 0.95), "max_s": ok[-1] if ok else None, "statuses": statuses, "endings": endings}


def _failures(outcomes: list[Outcome]) -> dict[str, int]:
    """The requests that failed (not those whose client left), by status and how they ended."""
    failures: dict[str, int] = {}
    for o in outcomes:
        if not o.completed and o.ending != chaos.LEFT:
            key = f"{o.status} {o.ending}" if o.status else o.ending
            failures[key] = failures.get(key, 0) + 1
    return dict(sorted(failures.items()))


def _why_none_completed(rows: list[Outcome], unanswered: int) -> str:
    if not rows:
        if unanswered:
            return f"{unanswered} sent, still without an answer when the load was stopped"
        return "sent no request before the load ended"
    ends = [f"{key} x{n}" for key, n in _failures(rows).items()]
    if left := sum(1 for o in rows if o.ending == chaos.LEFT):
        ends.append(f"left early x{left}")
    return f"none of {len(rows)} completed: " + ", ".join(ends)


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, math.ceil(q * len(values)) - 1)]


async def run_clients(endpoints: Endpoints | str, kinds: Mapping[ClientKind, int], duration: float, seed: int = 7,
                      *, timeout: float = 600.0, disconnect_rate: float = 0.0,
                      outcomes: list[Outcome] | None = None, tally: LoadTally | None = None,
                      say: Callable[[str], None] | None = None,
                      progress_interval: float = PROGRESS_INTERVAL_S, drain: float = math.inf) -> list[Outcome]:
    """Run every client until *duration* has passed; requests in flight then are finished,
    or abandoned *drain* seconds later (left in *tally* as unanswered).

    Outcomes are appended to *outcomes* as they come, and counted in *tally* (given:
    what was done before a cancellation is kept). With *say*, a progress line every
    *progress_interval* seconds until the last answer.
    """
    if isinstance(endpoints, str):
        endpoints = Endpoints(endpoints)
    outcomes = [] if outcomes is None else outcomes
    tally = LoadTally.of(kinds) if tally is None else tally
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits) as http:
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            if say is not None:
                await nursery.start(functools.partial(serve_progress, tally, say, started=started, duration=duration,
                                                      interval=progress_interval))
            with trio.move_on_at(started + duration + drain):
                async with trio.open_nursery() as clients:
                    for kind, count in kinds.items():
                        for index in range(count):
                            clients.start_soon(_client_loop, http, endpoints, kind, random.Random(rng.random()),
                                               started + duration, outcomes, tally, disconnect_rate,
                                               name=f"{kind.name}-{index}")
            nursery.cancel_scope.cancel(reason="every client is done")
    return outcomes


async def _client_loop(http: httpx.AsyncClient, endpoints: Endpoints, kind: ClientKind, rng: random.Random,
                       deadline: float, outcomes: list[Outcome], tally: LoadTally, disconnect_rate: float) -> None:
    await trio.sleep(rng.uniform(0, 0.5))  # do not all start in the same instant
    while trio.current_time() < deadline:
        ticket = tally.sent(kind.name, trio.current_time())
        outcome = await _one_request(http, endpoints, kind, rng, disconnect_rate)
        outcomes.append(outcome)
        tally.ended(ticket, outcome)
        # A think that would end after the deadline ends at it: no request would follow it.
        await trio.sleep_until(min(trio.current_time() + rng.uniform(*kind.think_s), deadline))


@attrs.define
class _Seen:
    """What a client has seen of its request so far."""

    status: int = 0
    ending: str | None = None
    ttft: float | None = None
    note: str = ""


async def _one_request(http: httpx.AsyncClient, endpoints: Endpoints, kind: ClientKind, rng: random.Random,
                       disconnect_rate: float) -> Outcome:
    started = trio.current_time()
    seen = _Seen()
    leaves = disconnect_rate > 0 and rng.random() < disconnect_rate
    streams = kind.api == "ollama" or (kind.api == "openai" and kind.klass == "interactive" and not kind.inputs)
    # A streaming client leaves after a few chunks; the others after a moment (waiting or running).
    leave_after_chunks = rng.randint(1, 4) if leaves and streams else 0
    leave_after_s = rng.uniform(0.05, 2.0) if leaves and not streams else math.inf
    try:
        with trio.move_on_after(leave_after_s) as leaving:
            if kind.api == "ollama":
                await _ollama_chat(http, endpoints, kind, rng, seen, started, leave_after_chunks)
            elif kind.api == "comfyui":
                await _image(http, endpoints, rng, seen)
            elif kind.inputs:
                await _embeddings(http, endpoints, kind, rng, seen)
            elif streams:
                await _chat_stream(http, endpoints, kind, rng, seen, started, leave_after_chunks)
            else:
                await _chat(http, endpoints, kind, rng, seen)
        if leaving.cancelled_caught and seen.ending is None:
            seen.ending = chaos.LEFT
    except httpx.HTTPError as exc:
        # A stream that already carried its error event was answered, however it closed.
        if seen.ending not in chaos.ANSWERED:
            timeout = isinstance(exc, httpx.TimeoutException)
            seen.ending = "timeout" if timeout else "truncated" if seen.status else "no_answer"
    return Outcome(kind.name, kind.group, started, trio.current_time() - started, seen.status, seen.ttft,
                   seen.ending or "truncated", seen.note)


def _headers(kind: ClientKind) -> dict[str, str]:
    return {"X-Steward-Class": kind.klass}


async def _chat_stream(http: httpx.AsyncClient, endpoints: Endpoints, kind: ClientKind, rng: random.Random,
                       seen: _Seen, started: float, leave_after: int) -> None:
    body = {"model": kind.model, "stream": True, "max_tokens": rng.randint(*kind.max_tokens),
            "messages": [{"role": "user", "content": _prompt(kind, rng, "tell me something ", (2, 20))}]}
    async with http.stream("POST", f"{endpoints.openai}/v1/chat/completions", json=body,
                           headers=_headers(kind)) as response:
        seen.status = response.status_code
        chunks = 0
        async for line in response.aiter_lines():
            if line.startswith('data: {"error"'):
                seen.ending = "error_event"
            elif line == "data: [DONE]":
                seen.ending = seen.ending or "done"
            elif line.startswith("data: {") and '"content"' in line:
                chunks += 1
                if seen.ttft is None:
                    seen.ttft = trio.current_time() - started
                if chunks == leave_after:
                    seen.ending = chaos.LEFT
                    return  # leaving the block closes the connection mid-stream
        seen.ending = seen.ending or ("answer" if seen.status != 200 else "truncated")


def _prompt(kind: ClientKind, rng: random.Random, phrase: str, repeats: tuple[int, int]) -> str:
    if kind.prompt_repeats is None:
        return phrase * rng.randint(*repeats)
    return f"{rng.randrange(10**6)} " + phrase * rng.randint(*kind.prompt_repeats)


async def _chat(http: httpx.AsyncClient, endpoints: Endpoints, kind: ClientKind, rng: random.Random,
                seen: _Seen) -> None:
    body = {"model": kind.model, "max_tokens": rng.randint(*kind.max_tokens),
            "messages": [{"role": "user", "content": _prompt(kind, rng, "work on this ", (5, 40))}]}
    async with http.stream("POST", f"{endpoints.openai}/v1/chat/completions", json=body,
                           headers=_headers(kind)) as response:
        seen.status = response.status_code
        await response.aread()
        seen.ending = "answer"


async def _embeddings(http: httpx.AsyncClient, endpoints: Endpoints, kind: ClientKind, rng: random.Random,
                      seen: _Seen) -> None:
    body = {"model": kind.model, "input": [f"document {rng.random():.6f} " * 8 for _ in range(kind.inputs)]}
    async with http.stream("POST", f"{endpoints.openai}/v1/embeddings", json=body, headers=_headers(kind)) as response:
        seen.status = response.status_code
        content = await response.aread()
    seen.ending = "answer"
    if seen.status == 200:
        try:
            complete = len(json.loads(content)["data"]) == kind.inputs
        except (ValueError, KeyError, TypeError):
            complete = False
        if not complete:
            seen.ending = "invalid"  # a partial answer is a failure, not a success


async def _ollama_chat(http: httpx.AsyncClient, endpoints: Endpoints, kind: ClientKind, rng: random.Random,
                       seen: _Seen, started: float, leave_after: int) -> None:
    body = {"model": kind.model, "stream": True, "options": {"num_predict": rng.randint(*kind.max_tokens)},
            "messages": [{"role": "user", "content": "why is the sky blue " * rng.randint(1, 10)}]}
    async with http.stream("POST", f"{endpoints.ollama}/api/chat", json=body) as response:
        seen.status = response.status_code
        if seen.status != 200:
            await response.aread()
            seen.ending = "answer"
            return
        chunks = 0
        async for line in response.aiter_lines():
            if not line.strip():
                continue
            try:
                piece = json.loads(line)
            except ValueError:
                seen.ending = seen.ending or "invalid"
                continue
            if "error" in piece:
                seen.ending = "error_event"
            elif piece.get("done"):
                seen.ending = seen.ending or "done"
            elif (piece.get("message") or {}).get("content"):
                chunks += 1
                if chunks == leave_after:
                    seen.ending = chaos.LEFT
                    return
        seen.ending = seen.ending or "truncated"


IMAGE_FOLLOW_S = 60.0  # how long an image client follows its job in /history before it asks again


async def _image(http: httpx.AsyncClient, endpoints: Endpoints, rng: random.Random, seen: _Seen) -> None:
    """A weight-free workflow, like the demo banner's: a sampler and a SaveImage, a second or two."""
    workflow = {"3": {"class_type": "KSampler", "inputs": {"fake_seconds": round(rng.uniform(0.5, 2.0), 2)}},
                "9": {"class_type": "SaveImage", "inputs": {"images": ["3", 0]}}}
    body = {"prompt": workflow, "client_id": f"loadtest-{rng.getrandbits(32):08x}"}
    async with http.stream("POST", f"{endpoints.comfyui}/prompt", json=body) as response:
        seen.status = response.status_code
        content = await response.aread()
    seen.ending = "answer"
    if seen.status == 200:
        try:
            prompt_id = json.loads(content)["prompt_id"]
        except (ValueError, KeyError, TypeError):
            seen.ending = "invalid"
            return
        seen.note = "unfinished"
        with trio.move_on_after(IMAGE_FOLLOW_S):
            seen.note = await _follow_image(http, str(endpoints.comfyui), prompt_id)


async def _follow_image(http: httpx.AsyncClient, comfyui: str, prompt_id: str) -> str:
    """success or error from /history; vanished: in neither /history nor /queue."""

    async def history() -> str | None:
        entry = (await http.get(f"{comfyui}/history/{prompt_id}")).json().get(prompt_id)
        return None if entry is None else str((entry.get("status") or {}).get("status_str", "success"))

    while True:
        await trio.sleep(1.0)
        try:
            if (status := await history()) is not None:
                return status
            queue = (await http.get(f"{comfyui}/queue")).json()
            queued = {item[1] for item in [*queue.get("queue_running", []), *queue.get("queue_pending", [])]}
            if prompt_id not in queued:
                return await history() or "vanished"
        except (httpx.HTTPError, ValueError, AttributeError, IndexError, TypeError):
            continue  # ComfyUI is down or restarting: ask again


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
        if name in ("load", "restart") and "reserved" in record:  # a service's restart reserves nothing
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


def count_problems(path: Path) -> dict[str, int]:
    """Warning and error events in steward's log, by name (crash, exit, reject, ...)."""
    counts: dict[str, int] = {}
    for record in read_event_log(path):
        if record.get("level") in ("warning", "error"):
            counts[record["event"]] = counts.get(record["event"], 0) + 1
    return dict(sorted(counts.items()))


def format_report(report: LoadReport) -> str:
    """The table, one row per client kind started, then the figures under it."""
    lines = [f"{'client':<10} {'class':<11} {'requests':>8} {'completed':>9} {'errors':>6} {'left':>4} {'lost':>4} "
             f"{'p50':>7} {'p95':>7} {'max':>7}"]
    for kind, row in report.by_kind().items():
        cells = [f"{row[k]:>6.2f}s" if row[k] is not None else f"{'-':>7}" for k in ("p50_s", "p95_s", "max_s")]
        reason = f"  {row['reason']}" if row["reason"] else ""
        lines.append(f"{kind:<10} {row['class']:<11} {row['requests']:>8} {row['completed']:>9} {row['errors']:>6} "
                     f"{row['left']:>4} {row['lost']:>4} " + " ".join(cells) + reason)
    ttfts = sorted(o.ttft for o in report.outcomes if o.ttft is not None)
    if ttfts:
        lines.append(f"chat time to first token: p50 {_quantile(ttfts, 0.5):.2f}s  p95 {_quantile(ttfts, 0.95):.2f}s")
    if report.engine_events:
        e = report.engine_events
        lines.append(f"loads {e['loads']}  evictions {e['evictions']}  unnecessary loads {e['unnecessary_loads']}  "
                     f"peak reserved {e['peak_reserved_bytes'] / 1024**3:.1f} GiB")
    if failures := _failures(report.outcomes):
        lines.append("errors seen: " + ", ".join(f"{k} x{n}" for k, n in failures.items()) +
                     " (status and how the request ended)")
    if report.problems:
        lines.append(_format_problems(report.problems))
    if report.chaos is not None:
        lines.extend(_format_chaos(report.chaos))
    return "\n".join(lines)


def _format_problems(problems: Mapping[str, int]) -> str:
    return "steward's warnings and errors: " + ", ".join(f"{k} {n}" for k, n in problems.items())


def _format_chaos(c: ChaosReport) -> list[str]:
    counts = c.action_counts()
    done = ", ".join(f"{action} {sum(row.values())} ({', '.join(f'{k} {n}' for k, n in row.items())})"
                     for action, row in counts.items())
    lines = [f"chaos (seed {c.seed}): {len(c.schedule)} actions scheduled; {done or 'none done'}"]
    if c.problems:
        lines.append(_format_problems(c.problems))
    rss = c.rss()
    if rss["start"] is not None:
        lines.append(f"steward RSS: start {_mib(rss['start'])}, peak {_mib(rss['peak'])}, end {_mib(rss['end'])}")
    if c.samples:
        step = max(1, len(c.samples) // 10)
        picked = c.samples[::step] + ([c.samples[-1]] if (len(c.samples) - 1) % step else [])
        lines.append("over time (s: RSS MiB / fds / own fds): " + "  ".join(
            f"{s.t:.0f}: {s.rss / 1024**2:.0f}/{s.fds}/{s.own_fds}" for s in picked))
    lines.append("invariants:")
    lines.extend(i.to_line() for i in c.invariants)
    if c.workdir:
        lines.append(f"steward's folder (config, event log, stderr) kept: {c.workdir}")
    return lines


def _mib(value: int | None) -> str:
    return f"{value / 1024**2:.1f} MiB" if value is not None else "-"


def _deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def demo_steward_config(workdir: Path, *, real: bool = False,
                        overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The demo's config (fake engines, or real with ``real``) for a loadtest's steward.

    *overrides* are merged into it (``ollama`` and ``comfyui`` only where the demo has
    them: the real demo has neither).
    """
    try:
        config = real_demo_config_dict(workdir, port=0) if real else demo_config_dict(workdir, port=0)
    except RealEnginesUnavailable as exc:
        raise RuntimeError(str(exc)) from None
    return _deep_merge(config, {k: v for k, v in (overrides or {}).items()
                                if k in config or k not in ("ollama", "comfyui")})


def start_steward(workdir: Path, config: Mapping[str, Any],
                  stderr: Path | None = None) -> tuple[subprocess.Popen[bytes], str, Path]:
    """``steward run`` on *config*, written into *workdir*, as a child process; its URL and event log.

    Its event log goes to *workdir* whatever *config* says (read whole afterwards);
    *stderr*: steward's terminal output goes there (default: the loadtest's stderr,
    never its stdout, which may be JSON).
    """
    config = {**config, "log": {"file": str(workdir / EVENTS_FILE), "terminal": "warning", "max_size": 0}}
    config_path = workdir / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    with contextlib.ExitStack() as stack:
        err = stack.enter_context(stderr.open("ab")) if stderr is not None else 2  # fd 2, whatever sys.stderr is
        process = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "run", str(config_path)],
                                   stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True,
                                   # When the loadtest dies, however, its steward gets SIGTERM.
                                   preexec_fn=functools.partial(die_with_parent, os.getpid(), signal.SIGTERM))
    events = workdir / EVENTS_FILE
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"steward exited with status {process.returncode}" + _tail(stderr))
        if events.exists():
            for record in read_event_log(events):
                if record["event"] == "listening":
                    return process, record["urls"][0], events
        time.sleep(0.05)
    stop_steward(process)
    raise RuntimeError("steward did not start within 30 s" + _tail(stderr))


def _tail(path: Path | None, lines: int = 10) -> str:
    if path is None or not path.exists():
        return ""
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return ":\n" + "\n".join(f"  {line}" for line in text) if text else ""


def stop_steward(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM, then SIGKILL to its group after 30 s; returns its exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return process.returncode


def run_loadtest(url: str | None, counts: Mapping[str, int], duration: float, models: Mapping[str, str],
                 seed: int = 7, *, real: bool = False, disconnect_rate: float = 0.0,
                 chaos_options: ChaosOptions | None = None, keep: bool = False,
                 announce: Callable[[chaos.ChaosRecord], None] | None = None,
                 say: Callable[[str], None] | None = None) -> LoadReport:
    """The client mix for *duration* seconds; with *chaos_options*, under chaos, then the invariants.

    *disconnect_rate*: the share of requests whose client leaves early (a stream after a
    few chunks, any other request after a moment). *say* gets the loadtest's own lines as
    it goes (its steward started and stopped, progress every few seconds); default: stderr.

    Raises:
        RuntimeError: steward could not be started, or chaos was asked of a steward at *url*.
    """
    say = say or _say
    kinds = {kind: counts[kind.name] for kind in default_kinds(models) if counts.get(kind.name)}
    services = [kind.name for kind in kinds if kind.api != "openai"]
    if url is not None:
        if chaos_options is not None:
            raise RuntimeError("--chaos needs a steward the loadtest starts itself (it signals the engines "
                               "that steward spawned, as its event log names them); leave out --url")
        if services:
            raise RuntimeError(f"{' and '.join(services)} clients need the loadtest's own steward "
                               f"(its Ollama and ComfyUI listeners); leave out --url or set them to 0")
        say(_load_line(kinds, duration, url))
        tally = LoadTally.of(kinds)
        outcomes = trio.run(functools.partial(run_clients, url.rstrip("/"), kinds, duration, seed,
                                              disconnect_rate=disconnect_rate, tally=tally, say=say))
        return LoadReport(duration, outcomes, tally=tally)
    if real and services:
        raise RuntimeError(f"{' and '.join(services)} clients need the fake demo (no Ollama or ComfyUI with --real)")
    with open_workdir("loadtest", keep=keep) as workdir:
        if chaos_options is not None:
            return _run_chaos_loadtest(workdir, kinds, duration, seed, chaos_options, real=real, keep=keep,
                                       disconnect_rate=disconnect_rate, announce=announce or _announce, say=say)
        return run_on_own_steward(workdir, demo_steward_config(workdir, real=real), kinds, duration, seed,
                                  engines=_engines_in_words(real), keep=keep, disconnect_rate=disconnect_rate,
                                  say=say)


def run_on_own_steward(workdir: Path, config: dict[str, Any], kinds: Mapping[ClientKind, int], duration: float,
                       seed: int, *, engines: str, keep: bool, disconnect_rate: float = 0.0,
                       say: Callable[[str], None] | None = None, drain: float = math.inf) -> LoadReport:
    """Start a steward on *config* in *workdir*, run the clients against it, stop it, read its event log.

    *engines* says in words what it runs on (the line that says it is up); *say* as
    run_loadtest's; *drain* as run_clients'.
    """
    say = say or _say
    output = workdir / STEWARD_OUTPUT
    process, steward_url, events = start_steward(workdir, config, stderr=output)
    tally = LoadTally.of(kinds)
    try:
        say(_started_line(steward_url, output, engines=engines, keep=keep))
        say(_load_line(kinds, duration, steward_url))
        endpoints = _endpoints(events, steward_url)
        outcomes = trio.run(functools.partial(run_clients, endpoints, kinds, duration, seed,
                                              disconnect_rate=disconnect_rate, tally=tally, say=say, drain=drain))
    finally:
        status = _stop_as_planned(process, say)
    say("loadtest: its steward has stopped" if status == 0
        else f"loadtest: its steward exited with status {status}" + _tail(output))
    return LoadReport(duration, outcomes, summarize_events(events), tally=tally, problems=count_problems(events))


STEWARD_OUTPUT = "steward.stderr"  # the loadtest's steward's terminal output, in its folder
EVENTS_FILE = "events.jsonl"  # its event log, in its folder


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)  # stderr: stdout may be the JSON report


def _engines_in_words(real: bool) -> str:
    return "real llama-server engines" if real else "the demo's fake engines"


def _started_line(steward_url: str, output: Path, *, engines: str, keep: bool) -> str:
    kept = "" if keep else "; removed at the end, --keep keeps it"
    return f"loadtest: its steward is up at {steward_url} on {engines} (its own output: {output}{kept})"


def _load_line(kinds: Mapping[ClientKind, int], duration: float, url: str) -> str:
    clients = ", ".join(f"{kind.name} {count}" for kind, count in kinds.items())
    return f"loadtest: clients for {duration:g}s against {url}: {clients}; progress every {PROGRESS_INTERVAL_S:g}s"


def _stop_as_planned(process: subprocess.Popen[bytes], say: Callable[[str], None]) -> int:
    # Said here because steward's own line about the SIGTERM, in its output file, would read
    # like an accident on the loadtest's terminal.
    say("loadtest: stopping its steward, as planned (it finishes what is in flight, then stops its engines)")
    return stop_steward(process)


def _announce(record: chaos.ChaosRecord) -> None:
    print(record.to_line(), file=sys.stderr, flush=True)


def _endpoints(events: Path, steward_url: str) -> Endpoints:
    for record in read_event_log(events):
        if record["event"] == "listening":
            ollama, comfyui = record.get("ollama") or [], record.get("comfyui") or []
            return Endpoints(steward_url, ollama[0] if ollama else None, comfyui[0] if comfyui else None)
    return Endpoints(steward_url)


def _run_chaos_loadtest(workdir: Path, kinds: Mapping[ClientKind, int], duration: float, seed: int,
                        options: ChaosOptions, *, real: bool, keep: bool, disconnect_rate: float,
                        announce: Callable[[chaos.ChaosRecord], None], say: Callable[[str], None]) -> LoadReport:
    # Orphans of a dying steward are re-parented here rather than to init, so the last
    # check (no process left) sees every descendant.
    become_subreaper()
    ours = os.getpid()
    before = {pid for pid, _ in chaos.descendants(ours)}
    output = workdir / STEWARD_OUTPUT
    config = demo_steward_config(workdir, real=real, overrides=CHAOS_CONFIG)
    process, steward_url, events = start_steward(workdir, config, stderr=output)
    watch = chaos.ProcessWatch(events)
    tally = LoadTally.of(kinds)
    try:
        say(_started_line(steward_url, output, engines=_engines_in_words(real), keep=keep))
        say(_load_line(kinds, duration, steward_url))
        watch.poll()
        endpoints = _endpoints(events, steward_url)
        session = trio.run(_chaos_session, process, endpoints, watch, kinds, duration, seed, options,
                           disconnect_rate, announce, tally, say)
    finally:
        stop_started = time.monotonic()
        status = _stop_as_planned(process, say)
        stop_s = time.monotonic() - stop_started
    watch.poll()
    left = _wait_for_no_descendants(ours, before, watch, deadline=time.monotonic() + 10.0)
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)  # the check has seen them; do not leave them running
        except ProcessLookupError:
            pass
    session.report.invariants = [
        chaos.check_alive(session.exited, None if session.exited is not None else status,
                          None if session.exited is not None else stop_s),
        chaos.check_answers(session.outcomes),
        session.idle,
        chaos.check_ledger(session.health),
        chaos.check_processes(left),
        chaos.check_fds(session.report.warm_fds, session.report.end_fds, options.fd_tolerance),
    ]
    session.report.problems = count_problems(events)
    session.report.workdir = str(workdir) if keep else None
    return LoadReport(duration, session.outcomes, summarize_events(events), session.report, tally=tally)


def _wait_for_no_descendants(root: int, before: set[int], watch: chaos.ProcessWatch,
                             deadline: float) -> list[tuple[int, str]]:
    """Descendants of *root* that were not there before steward, and every process steward spawned still alive."""
    while True:
        left = {pid: cmd for pid, cmd in chaos.descendants(root) if pid not in before}
        for incarnation in watch.spawned:
            if incarnation.pid not in left and chaos.is_running(incarnation):
                left[incarnation.pid] = f"({incarnation.name}, spawned by steward)"
        if not left or time.monotonic() > deadline:
            return sorted(left.items())
        time.sleep(0.1)


@attrs.define
class _Session:
    outcomes: list[Outcome]
    report: ChaosReport
    idle: chaos.Invariant
    health: dict[str, Any] | None  # the main listener's /healthz once steward was at rest
    exited: int | None  # steward's exit status if it died during the load


async def _chaos_session(process: subprocess.Popen[bytes], endpoints: Endpoints, watch: chaos.ProcessWatch,
                         kinds: Mapping[ClientKind, int], duration: float, seed: int, options: ChaosOptions,
                         disconnect_rate: float, announce: Callable[[chaos.ChaosRecord], None], tally: LoadTally,
                         say: Callable[[str], None]) -> _Session:
    started = trio.current_time()
    warmup = options.warmup_for(duration)
    targets = [*(name for name in _engine_names(watch)),
               *(name for name, url in (("ollama", endpoints.ollama), ("comfyui", endpoints.comfyui)) if url)]
    schedule = chaos.chaos_schedule(seed, targets, start=warmup, end=duration, mean_interval=options.interval,
                                    actions=options.actions, freeze=options.freeze)
    report = ChaosReport(seed, schedule, [], [], [])
    outcomes: list[Outcome] = []
    ports = watch.listener_ports()
    exited: int | None = None
    load = trio.CancelScope()

    def sample() -> None:
        rss, fds = rss_bytes(process.pid), chaos.count_fds(process.pid, ports)
        if rss is not None and fds is not None:
            report.samples.append(ResourceSample(round(trio.current_time() - started, 1), rss, fds.total,
                                                 fds.own_total))

    async def watch_steward() -> None:
        nonlocal exited
        next_sample = trio.current_time()
        while True:
            watch.poll()  # early, so that each spawned process's start time is read while it runs
            if process.poll() is not None:
                exited = process.returncode
                load.cancel(reason="steward exited")
                return
            if trio.current_time() >= next_sample:
                sample()
                next_sample += options.sample_interval
            await trio.sleep(0.25)

    def log(record: chaos.ChaosRecord) -> None:
        with (watch.path.parent / "chaos.jsonl").open("a") as f:  # beside steward's own log
            f.write(json.dumps(record.to_json()) + "\n")
        announce(record)

    async def chaos_after_warmup() -> None:
        await trio.sleep_until(started + warmup)
        report.warm_fds = chaos.count_fds(process.pid, ports)
        await chaos.run_chaos(schedule, watch, process.pid, started, report.records, log)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_steward)
        with load:
            async with trio.open_nursery() as load_nursery:
                load_nursery.start_soon(functools.partial(run_clients, endpoints, kinds, duration, seed,
                                                          timeout=options.client_timeout,
                                                          disconnect_rate=disconnect_rate, outcomes=outcomes,
                                                          tally=tally, say=say))
                load_nursery.start_soon(chaos_after_warmup)
        health = None
        if exited is None:
            idle, health = await _wait_idle(endpoints, options.idle_timeout)
            report.end_fds = await _settled_fds(process.pid, ports)
            sample()
        else:
            idle = chaos.check_idle(False, 0.0, [f"steward exited with status {exited}"])
        nursery.cancel_scope.cancel(reason="the load is over")
    return _Session(outcomes, report, idle, health, exited)


def _engine_names(watch: chaos.ProcessWatch) -> list[str]:
    models = (watch.listening or {}).get("models") or []
    return [str(m) for m in models]


async def _wait_idle(endpoints: Endpoints, bound: float) -> tuple[chaos.Invariant, dict[str, Any] | None]:
    """Poll every listener's /healthz until steward is at rest twice in a row, at most *bound* seconds."""
    started = trio.current_time()
    calm = 0
    busy: list[str] = []
    health = None
    async with httpx.AsyncClient(timeout=10.0) as http:
        while True:
            busy, health = await _busy(http, endpoints)
            calm = calm + 1 if not busy else 0
            waited = trio.current_time() - started
            if calm >= 2:
                return chaos.check_idle(True, waited, []), health
            if waited > bound:
                return chaos.check_idle(False, waited, busy), health
            await trio.sleep(0.5)


async def _busy(http: httpx.AsyncClient, endpoints: Endpoints) -> tuple[list[str], dict[str, Any] | None]:
    """What keeps steward from being at rest, by /healthz; empty when at rest."""
    busy: list[str] = []
    try:
        health = (await http.get(f"{endpoints.openai}/healthz")).json()
    except (httpx.HTTPError, ValueError) as exc:
        return [f"/healthz: {exc!r}"], None
    if health.get("mode") != "idle":
        busy.append(f"mode {health.get('mode')}")
    if health.get("queued"):
        busy.append(f"{health['queued']} queued")
    for klass, row in (health.get("classes") or {}).items():
        if row.get("running"):
            busy.append(f"{klass}: {row['running']} running")
    for name, engine in (health.get("engines") or {}).items():
        if engine.get("in_flight"):
            busy.append(f"{name}: {engine['in_flight']} in flight")
        if engine.get("status") in ("starting", "stopping"):
            busy.append(f"{name}: {engine['status']}")
        elif engine.get("status") in ("stopped", "failed") and engine.get("reserved"):
            busy.append(f"{name}: {engine['status']}, memory not yet released")
    for service, url in (("ollama", endpoints.ollama), ("comfyui", endpoints.comfyui)):
        if url is None:
            continue
        try:
            turnstile = (await http.get(f"{url}/healthz")).json()
        except (httpx.HTTPError, ValueError) as exc:
            busy.append(f"{service} /healthz: {exc!r}")
            continue
        if turnstile.get("state") != "idle" or turnstile.get("image_running") or turnstile.get("image_pending"):
            busy.append(f"{service} listener: state {turnstile.get('state')}, image running "
                        f"{turnstile.get('image_running', 0)}, pending {turnstile.get('image_pending')}")
    return busy, health


async def _settled_fds(pid: int, ports: set[int]) -> chaos.FdCount | None:
    """Steward's fds once the client connections it still held are closed (at most 10 s)."""
    with trio.move_on_after(10.0):
        while (fds := chaos.count_fds(pid, ports)) is not None and fds.clients:
            await trio.sleep(0.2)
        return fds
    return chaos.count_fds(pid, ports)
