"""The home-lab seed's overload test, reproduced against steward: is an overload visible?

The seed (research: seeds/home-orchestrator.md, "The most instructive bug") ran 256
concurrent requests against an engine that did about 26 requests a minute. 16 were
rejected, some waited 118 s, and nothing showed it: the waiting gauge read zero in all 253
samples taken during the overload (it counted one kind of queue only), the usage log
held only "ok" rows (rejected requests got none), the one overload event went nowhere,
and the health check answered 200 throughout.

``run_overload`` does the same to steward, time scaled down: one fake llama-server with
one slot and a fixed ``max_tokens``, so its nominal capacity is ``capacity_per_s`` requests
a second (20 by default, 46 times the seed's engine; the report gives the throughput measured,
and its scale), and ``clients`` requests sent at once by a mix of callers:

- ``family`` (interactive) and ``guest`` (interactive, at most 2 at a time: the rest get
  429 ``concurrency_limited``);
- ``agents`` (background; a few ask for interactive, which the key may not: 403);
- ``jobs`` (batch, into a queue smaller than they are: 429 ``queue_full``);
- a ``stranger`` with a key steward does not know (401).

Interactive goes first, then background, whose ``queue_timeout`` is set to pass when about
half of it is served (503 ``queue_timeout``), then what fits of batch. A webhook receiver
stands in for the operator's phone. While the load runs, ``/metrics`` and ``/healthz`` are
read every ``sample_interval``; afterwards steward is stopped (SIGTERM, so every usage row
is written) and its usage log and event log are read. What each figure proves:

- **the queue is visible**: every sample taken while the overload is surely under way has a
  non-zero ``steward_queued`` and ``steward_waiting``. A sample counts once a first request
  was served (the engine is busy and requests are queued behind it) and while more
  requests are outstanding, as the clients count them, than the engine has slots plus a
  margin for requests in transit (``margin``);
- **rejections are visible**: ``steward_rejected_total`` and the event log count, per reason,
  exactly the rejections the clients saw; the usage log has one row per request sent,
  rejected ones included, with the same statuses and error codes the clients got;
- **the overload is told**: ``/healthz`` said ``overloaded``, with reasons, as HTTP 503, and
  the webhook got exactly one alert for the whole incident (not one per rejection);
- **priority works**: interactive requests waited less than batch ones (median and worst),
  from the usage log's ``queued_s`` of the requests served.

The checks are pure (``OverloadReport.problems``, from the figures alone); the I/O is in
``run_overload`` and the tasks it starts. ``steward loadtest --scenario overload`` runs it
from a terminal.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import attrs
import h11
import httpx
import trio
import yaml
from prometheus_client.parser import text_string_to_metric_families

from fakes.webhook import read_request
from supervisor.auth.keys import KeyCommandError, KeyFileError, add_key
from supervisor.tools.demo import open_workdir
from supervisor.events import read_event_log
from supervisor.tools.loadtest import stop_steward
from supervisor.process import die_with_parent
from supervisor.scheduler.types import RequestClass
from supervisor.usage.report import percentile
from supervisor.usage.row import TABLE

SEED_REQUESTS_PER_MIN = 26.0  # the seed's engine, measured
SEED_ZERO_SAMPLES = 253  # the seed's waiting gauge: zero in every one of them
MODEL = "chat"
SLOTS = 1
CHAT_PATH = "/v1/chat/completions"
CAPACITY_REASONS = frozenset({"queue_full", "queue_timeout"})
MIN_CLIENTS = 64  # below this some callers of the mix would be no one
MIN_COUNTED_SAMPLES = 10  # fewer samples during the overload cannot show the gauge is never zero
START_BOUND_S = 30.0  # steward listening and its engine ready
SETTLE_BOUND_S = 15.0  # after the load: the last usage rows counted, the alert delivered
# After interactive work the engine is kept from lower classes this long (default 2 s, scaled down).
INTERACTIVE_WINDOW_S = 0.25
GUEST_CONCURRENCY = 2
POOL_SIZE = 16  # client connections per httpx pool
UNKNOWN_KEY = "sk-steward-" + "0" * 43  # shaped like a key, in no key file


@attrs.frozen
class Caller:
    """One kind of client in the mix: whose key it sends, and the class it asks for (None: the key's default)."""

    name: str
    key: str | None  # a key's name in the key file; None: an unknown key
    count: int
    klass: str | None = None


@attrs.frozen
class OverloadPlan:
    """The mix and the limits, derived from the number of clients and the engine's capacity. Pure."""

    clients: int
    capacity_per_s: float
    max_tokens: int
    callers: tuple[Caller, ...]
    guest_concurrency: int
    batch_max_queue: int
    background_queue_timeout: float
    interactive_slo_wait: float
    interactive_window: float = INTERACTIVE_WINDOW_S
    health_window: float = 120.0  # longer than the whole run: every rejection counts until the end

    @classmethod
    def for_clients(cls, clients: int, capacity_per_s: float, max_tokens: int = 10) -> OverloadPlan:
        """Raises ValueError for a mix that cannot be made."""
        if not isinstance(clients, int) or clients < MIN_CLIENTS:
            raise ValueError(f"clients must be an integer of at least {MIN_CLIENTS}, got {clients!r}")
        if not capacity_per_s > 0 or not math.isfinite(capacity_per_s):
            raise ValueError(f"capacity_per_s must be a positive number, got {capacity_per_s!r}")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        guest, stranger, climbing = clients // 32, clients // 32, clients // 64
        family, background = clients * 3 // 16, clients * 3 // 8 - climbing
        jobs = clients - family - guest - stranger - background - climbing
        callers = (Caller("family", "family", family), Caller("guest", "guest", guest),
                   Caller("stranger", None, stranger), Caller("agents", "agents", background),
                   Caller("agents asking interactive", "agents", climbing, "interactive"),
                   Caller("jobs", "jobs", jobs, "batch"))
        interactive_s = (family + GUEST_CONCURRENCY) / capacity_per_s  # what gets past the door, served first
        return cls(clients, capacity_per_s, max_tokens, callers, guest_concurrency=GUEST_CONCURRENCY,
                   batch_max_queue=max(1, jobs // 4),
                   # Background times out once about half of it was served: some served, some turned away.
                   background_queue_timeout=round(interactive_s + INTERACTIVE_WINDOW_S
                                                  + background / 2 / capacity_per_s, 2),
                   # Some 20 requests' worth of waiting (1 s at 20/s): the interactive queue is longer.
                   interactive_slo_wait=round(min(20, family / 2) / capacity_per_s, 3))

    @property
    def tokens_per_second(self) -> float:
        return self.capacity_per_s * self.max_tokens

    def config(self, workdir: Path, webhook: str) -> dict[str, Any]:
        """Steward's config: one fake engine, the classes' limits, keys, usage log, health, alerts."""
        engine_args = ["--memory", "1GiB", "--load-time", "0.2s", "--tokens-per-second", f"{self.tokens_per_second:g}"]
        return {
            "listen": "127.0.0.1:0",
            "models": {MODEL: {"command": [sys.executable, "-m", "fakes.llama_server"], "args": engine_args,
                               "memory": "1GiB", "parallel": SLOTS, "always_on": True}},
            "gpu": {"probe": "none", "budget": "8GiB"},
            "engines": {"stop_grace": "3s", "restart_backoff": "0.2s"},
            "scheduler": {"interactive_window": f"{self.interactive_window}s"},
            "classes": {"interactive": {"slo_wait": f"{self.interactive_slo_wait}s"},
                        "background": {"queue_timeout": f"{self.background_queue_timeout}s"},
                        "batch": {"max_queue": self.batch_max_queue, "queue_timeout": "10m"}},
            "auth": {"keys_file": str(workdir / "keys.json")},
            "usage": {"db": str(workdir / "usage.db")},
            "health": {"window": f"{self.health_window:g}s", "interval": "0.2s"},
            "alerts": {"webhook": webhook, "min_interval": "10m"},
            "log": {"file": str(workdir / "events.jsonl"), "terminal": "warning", "max_size": 0},  # read whole after
            "state_file": str(workdir / "state.json"),
        }

    def make_keys(self, path: Path) -> dict[str, str]:
        """The key file at *path*: name -> key text, and ``monitor`` for the scrapes of /metrics."""
        limits: dict[str, dict[str, Any]] = {
            "family": {"classes": ["interactive"]},
            "guest": {"classes": ["interactive"], "concurrency": self.guest_concurrency},
            "agents": {"classes": ["background", "batch"], "default_class": "background"},
            "jobs": {"classes": ["batch"]},
            "monitor": {},
        }
        return {name: add_key(path, name, known_models=(MODEL,), **options) for name, options in limits.items()}


# --- what was seen ------------------------------------------------------------------------------------------


@attrs.frozen
class Answer:
    caller: str
    status: int  # 0: no HTTP answer at all
    reason: str | None  # the error code the client got; None when served
    at: float  # seconds from the start of the load


@attrs.frozen
class Scrape:
    """One /metrics page, the figures this test reads."""

    queued: dict[str, int]  # steward_queued, per class
    waiting: int  # steward_waiting, summed over engines and classes
    rejected: dict[str, int]  # steward_rejected_total, per reason (summed over classes)
    requests: dict[int, int]  # steward_requests_total, per status (summed over listeners, keys and classes)
    health: str | None  # the steward_health_status that is 1

    @property
    def total_queued(self) -> int:
        return sum(self.queued.values())


# The families a scrape reads, with the names of their samples.
_SCRAPED = {"steward_queued": "steward_queued", "steward_waiting": "steward_waiting",
            "steward_rejected": "steward_rejected_total", "steward_requests": "steward_requests_total",
            "steward_health_status": "steward_health_status"}


def parse_scrape(text: str) -> Scrape:
    """The figures of a Prometheus text page. Pure."""
    queued: dict[str, int] = {}
    rejected: collections.Counter[str] = collections.Counter()
    requests: collections.Counter[int] = collections.Counter()
    waiting, health = 0, None
    for family in text_string_to_metric_families(_lines_of(text, _SCRAPED)):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if name == "steward_queued":
                queued[labels["class"]] = int(value)
            elif name == "steward_waiting":
                waiting += int(value)
            elif name == "steward_rejected_total":
                rejected[labels["reason"]] += int(value)
            elif name == "steward_requests_total":
                requests[int(labels["status"])] += int(value)
            elif name == "steward_health_status" and value == 1:
                health = labels["status"]
    return Scrape(queued, waiting, dict(rejected), dict(requests), health)


def _lines_of(text: str, families: Mapping[str, str]) -> str:
    """Only the lines of *families* (comments and samples): the parser costs milliseconds a page, and
    the sampler shares this process with every client."""
    wanted = set(families.values())
    kept = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(maxsplit=3)
            keep = len(parts) > 2 and parts[2] in families
        else:
            keep = line.partition("{")[0].partition(" ")[0] in wanted
        if keep:
            kept.append(line)
    return "\n".join(kept) + "\n"


@attrs.frozen
class Sample:
    """One reading of /metrics and /healthz during the load."""

    at: float
    outstanding: int  # sent and not answered, once both pages were read
    counted: bool  # taken while the overload was surely under way
    queued: int | None  # steward_queued summed; None: /metrics could not be read
    waiting: int | None
    health_http: int | None  # /healthz's HTTP status; None: it could not be read
    health: str | None
    reasons: tuple[str, ...] = ()


@attrs.frozen
class ReceivedAlert:
    title: str
    priority: str
    tags: str
    body: str

    def to_json(self) -> dict[str, str]:
        return attrs.asdict(self)


@attrs.frozen
class Waits:
    """Seconds queued of one class's served requests, from the usage log."""

    served: int
    p50_s: float | None
    p95_s: float | None
    max_s: float | None

    @classmethod
    def of(cls, seconds: Iterable[float]) -> Waits:
        ordered = sorted(seconds)
        return cls(len(ordered), _round(percentile(ordered, 0.5)), _round(percentile(ordered, 0.95)),
                   _round(ordered[-1] if ordered else None))


@attrs.frozen
class UsageFigures:
    rows: int
    by_status: dict[int, int]
    by_error: dict[str, int]
    waits: dict[str, Waits]


@attrs.frozen
class OverloadReport:
    clients: int
    capacity_per_s: float
    max_tokens: int
    duration_s: float  # from the start of the load to its last answer
    answers: dict[int, int]  # HTTP status -> requests (0: no answer)
    rejected_by_clients: dict[str, int]  # error code -> requests, as the clients got them
    rejected_by_metrics: dict[str, int]  # steward_rejected_total per reason, after the load
    rejected_by_events: dict[str, int]  # reject, timeout and refused events per reason
    requests_by_metrics: dict[int, int]  # steward_requests_total per status, after the load
    samples: int
    counted_samples: int
    zero_queued_samples: int  # counted samples whose steward_queued was 0 (the seed's: all of them)
    zero_waiting_samples: int  # the same for steward_waiting
    max_queued: int
    usage: UsageFigures
    health_seen: dict[str, int]  # /healthz status -> samples
    overloaded_http: dict[int, int]  # HTTP status -> /healthz answers that said overloaded
    overloaded_reasons: tuple[str, ...]  # of the first answer that said overloaded
    health_events: tuple[str, ...]  # the statuses of the event log's health events, in order
    alerts: tuple[ReceivedAlert, ...]
    alert_sent_events: int
    steward_exit: int
    counted_margin: int = 20

    @property
    def served(self) -> int:
        return self.answers.get(200, 0)

    @property
    def throughput_per_s(self) -> float:
        return self.served / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def scale(self) -> float:
        """How much faster this run's engine served than the seed's (26 requests a minute)."""
        return self.throughput_per_s / (SEED_REQUESTS_PER_MIN / 60.0)

    @property
    def problems(self) -> tuple[str, ...]:
        """Each failed check, in words. Pure: from the figures alone."""
        found: list[str] = []
        if lost := self.answers.get(0, 0):
            found.append(f"{lost} requests got no HTTP answer")
        if self.counted_samples < MIN_COUNTED_SAMPLES:
            found.append(f"only {self.counted_samples} samples were taken while the overload was under way "
                         f"(at least {MIN_COUNTED_SAMPLES} are needed to judge the queue gauges)")
        if self.zero_queued_samples:
            found.append(f"steward_queued read 0 in {self.zero_queued_samples} of {self.counted_samples} samples "
                         f"taken during the overload")
        if self.zero_waiting_samples:
            found.append(f"steward_waiting read 0 in {self.zero_waiting_samples} of {self.counted_samples} samples "
                         f"taken during the overload")
        if self.rejected_by_metrics != self.rejected_by_clients:
            found.append(f"steward_rejected_total {_counts(self.rejected_by_metrics)} differs from what the clients "
                         f"got {_counts(self.rejected_by_clients)}")
        if self.rejected_by_events != self.rejected_by_clients:
            found.append(f"the event log's rejections {_counts(self.rejected_by_events)} differ from what the clients "
                         f"got {_counts(self.rejected_by_clients)}")
        if self.requests_by_metrics != self.answers:
            found.append(f"steward_requests_total {_counts(self.requests_by_metrics)} differs from the clients' "
                         f"answers {_counts(self.answers)}")
        capacity = sorted(CAPACITY_REASONS & set(self.rejected_by_clients))
        if len(capacity) < len(CAPACITY_REASONS):
            found.append(f"rejections for capacity of {len(capacity)} reason(s) ({', '.join(capacity) or 'none'}); "
                         f"the scenario makes {', '.join(sorted(CAPACITY_REASONS))}")
        if self.usage.rows != self.clients:
            found.append(f"the usage log has {self.usage.rows} rows for {self.clients} requests sent")
        if self.usage.by_status != self.answers:
            found.append(f"the usage log's statuses {_counts(self.usage.by_status)} differ from the clients' "
                         f"{_counts(self.answers)}")
        if self.usage.by_error != self.rejected_by_clients:
            found.append(f"the usage log's error codes {_counts(self.usage.by_error)} differ from the clients' "
                         f"{_counts(self.rejected_by_clients)}")
        if not self.health_seen.get("overloaded"):
            found.append(f"/healthz never said overloaded (it said {_counts(self.health_seen)})")
        elif set(self.overloaded_http) != {503}:
            found.append(f"/healthz said overloaded with HTTP {_counts(self.overloaded_http)}, not always 503")
        if self.health_seen.get("overloaded") and not self.overloaded_reasons:
            found.append("/healthz said overloaded without reasons")
        if "overloaded" not in self.health_events:
            found.append("the event log has no health event for overloaded")
        if len(self.alerts) != 1:
            found.append(f"the webhook got {len(self.alerts)} alerts for one incident, not 1")
        if self.alert_sent_events != 1:
            found.append(f"the event log has {self.alert_sent_events} alert_sent events, not 1")
        found.extend(_priority_problems(self.usage.waits))
        if self.steward_exit != 0:
            found.append(f"steward exited with status {self.steward_exit} after SIGTERM")
        return tuple(found)

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "clients": self.clients, "capacity_per_s": self.capacity_per_s, "max_tokens": self.max_tokens,
            "duration_s": self.duration_s, "served": self.served, "throughput_per_s": round(self.throughput_per_s, 2),
            "scale": round(self.scale, 1), "answers": _keyed(self.answers),
            "rejected": {"clients": self.rejected_by_clients, "metrics": self.rejected_by_metrics,
                         "events": self.rejected_by_events},
            "requests_by_metrics": _keyed(self.requests_by_metrics),
            "samples": {"taken": self.samples, "counted": self.counted_samples, "margin": self.counted_margin,
                        "zero_queued": self.zero_queued_samples, "zero_waiting": self.zero_waiting_samples,
                        "max_queued": self.max_queued},
            "usage": {"rows": self.usage.rows, "by_status": _keyed(self.usage.by_status),
                      "by_error": self.usage.by_error,
                      "waits": {klass: attrs.asdict(w) for klass, w in self.usage.waits.items()}},
            "health": {"seen": self.health_seen, "overloaded_http": _keyed(self.overloaded_http),
                       "overloaded_reasons": list(self.overloaded_reasons), "events": list(self.health_events)},
            "alerts": [a.to_json() for a in self.alerts], "alert_sent_events": self.alert_sent_events,
            "steward_exit": self.steward_exit, "passed": self.passed, "problems": list(self.problems),
        }


def _priority_problems(waits: Mapping[str, Waits]) -> list[str]:
    interactive, batch = waits.get("interactive"), waits.get("batch")
    if interactive is None or batch is None or not interactive.served or not batch.served:
        return ["interactive and batch requests were not both served: their waits cannot be compared"]
    found = []
    for figure in ("p50_s", "max_s"):
        mine, theirs = getattr(interactive, figure), getattr(batch, figure)
        if not mine < theirs:
            found.append(f"interactive waited {mine}s ({figure[:-2]}), not less than batch's {theirs}s")
    return found


def format_overload_report(report: OverloadReport) -> str:
    """The report for a terminal."""
    r = report
    lines = [
        f"overload: {r.clients} requests at once; engine capacity {r.capacity_per_s:g}/s (1 slot, max_tokens "
        f"{r.max_tokens}); served {r.served} in {r.duration_s:.1f}s = {r.throughput_per_s:.1f}/s, "
        f"{r.scale:.0f}x the seed's {SEED_REQUESTS_PER_MIN:g}/min",
        f"answers: {_counts(r.answers)}",
        f"rejected, by the clients:      {_counts(r.rejected_by_clients)}",
        f"rejected, steward_rejected:    {_counts(r.rejected_by_metrics)}",
        f"rejected, in the event log:    {_counts(r.rejected_by_events)}",
        f"queue gauges: {r.counted_samples} of {r.samples} samples taken during the overload (outstanding > "
        f"{SLOTS} slot + {r.counted_margin}); steward_queued 0 in {r.zero_queued_samples}, steward_waiting 0 in "
        f"{r.zero_waiting_samples}; max queued {r.max_queued} (seed: 0 in all {SEED_ZERO_SAMPLES})",
        f"usage log: {r.usage.rows} rows for {r.clients} requests; by status {_counts(r.usage.by_status)}; "
        f"errors {_counts(r.usage.by_error)} (seed: only ok rows)",
        f"/healthz: {_counts(r.health_seen)}; overloaded answered HTTP {_counts(r.overloaded_http)}; "
        f"health events {' -> '.join(r.health_events) or 'none'}",
    ]
    lines.extend(f"  reason: {reason}" for reason in r.overloaded_reasons)
    lines.append(f"alerts: {len(r.alerts)} received by the webhook, {r.alert_sent_events} alert_sent events")
    lines.extend(f"  [{a.priority}] {a.title}: {a.body.splitlines()[0] if a.body else ''}" for a in r.alerts)
    lines.append(f"{'class':<12} {'served':>6} {'wait p50':>9} {'p95':>8} {'max':>8}")
    for klass, w in r.usage.waits.items():
        cells = " ".join(f"{value:>7.2f}s" if value is not None else f"{'-':>8}" for value in (w.p50_s, w.p95_s))
        worst = f"{w.max_s:>7.2f}s" if w.max_s is not None else f"{'-':>8}"
        lines.append(f"{klass:<12} {w.served:>6}  {cells} {worst}")
    lines.append("passed" if r.passed else "FAILED:\n" + "\n".join(f"  - {p}" for p in r.problems))
    return "\n".join(lines)


# --- the run ------------------------------------------------------------------------------------------------


def run_overload(workdir: Path, *, clients: int = 256, capacity_per_s: float = 20.0, max_tokens: int = 10,
                 sample_interval: float = 0.05, margin: int = 20, seed: int = 7,
                 client_timeout: float = 120.0) -> OverloadReport:
    """The scenario of the module docstring, with steward's files in *workdir* (which must exist).

    Raises:
        ValueError: a mix that cannot be made (too few clients, a capacity that is no number).
        RuntimeError: steward could not be started (the message has its last words).
    """
    plan = OverloadPlan.for_clients(clients, capacity_per_s, max_tokens)
    try:
        keys = plan.make_keys(workdir / "keys.json")
    except (KeyCommandError, KeyFileError) as exc:
        raise RuntimeError(f"cannot make the scenario's keys in {workdir} (it needs a fresh folder): {exc}") from None
    run = trio.run(functools.partial(_overload_session, workdir, plan, keys, sample_interval=sample_interval,
                                     margin=margin, seed=seed, client_timeout=client_timeout))
    return _assemble(plan, run, margin, read_event_log(workdir / "events.jsonl"), _read_usage(workdir / "usage.db"))


@attrs.frozen
class _Run:
    answers: list[Answer]
    samples: list[Sample]
    final: Scrape | None
    alerts: list[ReceivedAlert]
    steward_exit: int
    duration_s: float


@attrs.define
class _Tally:
    sent: int = 0
    answered: int = 0
    served: int = 0

    @property
    def outstanding(self) -> int:
        return self.sent - self.answered


async def _overload_session(workdir: Path, plan: OverloadPlan, keys: Mapping[str, str], *, sample_interval: float,
                            margin: int, seed: int, client_timeout: float) -> _Run:
    alerts: list[ReceivedAlert] = []
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_webhook_receiver, alerts)
        config_path = workdir / "config.yaml"
        config_path.write_text(yaml.safe_dump(plan.config(workdir, f"http://127.0.0.1:{port}/steward")))
        outcome = await _run_steward(config_path, workdir, plan, keys, alerts, sample_interval=sample_interval,
                                     margin=margin, seed=seed, client_timeout=client_timeout)
        nursery.cancel_scope.cancel(reason="steward has stopped")
    if isinstance(outcome, RuntimeError):
        raise outcome  # out here: raised inside the nursery, it would come out wrapped in an ExceptionGroup
    return outcome


async def _run_steward(config_path: Path, workdir: Path, plan: OverloadPlan, keys: Mapping[str, str],
                       alerts: list[ReceivedAlert], *, sample_interval: float, margin: int, seed: int,
                       client_timeout: float) -> _Run | RuntimeError:
    """Steward started, the load, the last scrape, steward stopped (always); a start that failed, returned."""
    stderr_path = workdir / "steward.stderr"
    process = _launch_steward(config_path, stderr_path)
    try:
        url = await _wait_ready(process, workdir / "events.jsonl", stderr_path)
        monitor = {"Authorization": f"Bearer {keys['monitor']}"}
        async with httpx.AsyncClient(base_url=url, headers=monitor, timeout=10.0) as scraper:
            answers, samples, duration = await _load(url, plan, keys, scraper, sample_interval=sample_interval,
                                                     margin=margin, seed=seed, client_timeout=client_timeout)
            final = await _settle(scraper, plan.clients, alerts)
    except RuntimeError as exc:
        return exc
    finally:
        with trio.CancelScope(shield=True):
            status = await trio.to_thread.run_sync(stop_steward, process)
    return _Run(answers, samples, final, alerts, status, duration)


def _launch_steward(config_path: Path, stderr_path: Path) -> subprocess.Popen[bytes]:
    with stderr_path.open("ab") as err:
        return subprocess.Popen([sys.executable, "-m", "supervisor.cli", "run", str(config_path)],
                                stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True,
                                # When this process dies, however, its steward gets SIGTERM.
                                preexec_fn=functools.partial(die_with_parent, os.getpid(), signal.SIGTERM))


async def _wait_ready(process: subprocess.Popen[bytes], events: Path, stderr_path: Path) -> str:
    """Steward's URL once it listens and its engine is ready; RuntimeError if it exits or takes too long."""
    with trio.move_on_after(START_BOUND_S):
        while process.poll() is None:
            records = read_event_log(events) if events.exists() else []
            urls = [r["urls"][0] for r in records if r["event"] == "listening"]
            if urls and any(r["event"] == "ready" and r["engine"] == MODEL for r in records):
                return urls[0]
            await trio.sleep(0.05)
        raise RuntimeError(f"steward exited with status {process.returncode}{_tail(stderr_path)}")
    raise RuntimeError(f"steward and its engine were not ready within {START_BOUND_S:g}s{_tail(stderr_path)}")


def _tail(path: Path, lines: int = 10) -> str:
    text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
    return ":\n" + "\n".join(f"  {line}" for line in text) if text else ""


async def _load(url: str, plan: OverloadPlan, keys: Mapping[str, str], scraper: httpx.AsyncClient, *,
                sample_interval: float, margin: int, seed: int,
                client_timeout: float) -> tuple[list[Answer], list[Sample], float]:
    """Every client at once, and the sampler beside them until the last answer."""
    callers = [caller for caller in plan.callers for _ in range(caller.count)]
    random.Random(seed).shuffle(callers)
    body = {"model": MODEL, "max_tokens": plan.max_tokens, "messages": [{"role": "user", "content": "plan my day"}]}
    tally = _Tally()
    answers: list[Answer] = []
    samples: list[Sample] = []
    started = trio.current_time()

    async def ask(http: httpx.AsyncClient, caller: Caller) -> None:
        headers = {"Authorization": f"Bearer {keys[caller.key] if caller.key else UNKNOWN_KEY}"}
        if caller.klass is not None:
            headers["X-Steward-Class"] = caller.klass
        tally.sent += 1
        try:
            response = await http.post(CHAT_PATH, json=body, headers=headers)
            status, reason = response.status_code, _error_code(response)
        except httpx.HTTPError as exc:
            status, reason = 0, f"no answer ({type(exc).__name__})"
        tally.answered += 1
        tally.served += status == 200
        answers.append(Answer(caller.name, status, reason, round(trio.current_time() - started, 3)))

    async with contextlib.AsyncExitStack() as stack:
        # Small pools: httpcore hands out connections in time quadratic in its pool's size, which at
        # 256 connections in one pool costs this process seconds of CPU, and its answers arrive late.
        pools = [await stack.enter_async_context(httpx.AsyncClient(
            base_url=url, timeout=client_timeout, limits=httpx.Limits(max_connections=POOL_SIZE)))
            for _ in range(math.ceil(len(callers) / POOL_SIZE))]
        async with trio.open_nursery() as sampling:
            sampling.start_soon(functools.partial(_sample_forever, scraper, tally, samples, plan.clients,
                                                  threshold=SLOTS + margin, interval=sample_interval,
                                                  started=started))
            async with trio.open_nursery() as load:
                for index, caller in enumerate(callers):  # all at once: each task's first step is in one batch
                    load.start_soon(ask, pools[index // POOL_SIZE], caller)
            sampling.cancel_scope.cancel(reason="every client has its answer")
    duration = max((a.at for a in answers), default=0.0)
    return answers, samples, duration


def _error_code(response: httpx.Response) -> str | None:
    if response.status_code == 200:
        return None
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        error = None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) and code else f"http_{response.status_code}"


async def _sample_forever(scraper: httpx.AsyncClient, tally: _Tally, samples: list[Sample], clients: int, *,
                          threshold: int, interval: float, started: float) -> None:
    """/metrics and /healthz every *interval* until cancelled (a slow scrape delays the next, never stacks)."""
    next_at = trio.current_time()
    while True:
        # Under way: every request sent, a first one served (the engine is busy, requests queue behind it).
        under_way = tally.sent == clients and tally.served > 0
        metrics, health = await _read_pages(scraper)
        outstanding = tally.outstanding
        scrape = _parse_or_none(metrics)
        health_json = _json_or_none(health)
        status = health_json.get("status") if isinstance(health_json, dict) else None
        reasons = health_json.get("reasons") if isinstance(health_json, dict) else None
        samples.append(Sample(
            at=round(trio.current_time() - started, 3), outstanding=outstanding,
            counted=under_way and outstanding > threshold and scrape is not None,
            queued=scrape.total_queued if scrape is not None else None,
            waiting=scrape.waiting if scrape is not None else None,
            health_http=health.status_code if health is not None else None,
            health=status if isinstance(status, str) else None,
            reasons=tuple(str(r) for r in reasons) if isinstance(reasons, list) else ()))
        next_at = max(next_at + interval, trio.current_time())
        await trio.sleep_until(next_at)


async def _read_pages(scraper: httpx.AsyncClient) -> tuple[httpx.Response | None, httpx.Response | None]:
    pages: list[httpx.Response | None] = [None, None]

    async def read(index: int, path: str) -> None:
        with contextlib.suppress(httpx.HTTPError):
            pages[index] = await scraper.get(path)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read, 0, "/metrics")
        nursery.start_soon(read, 1, "/healthz")
    return pages[0], pages[1]


def _parse_or_none(response: httpx.Response | None) -> Scrape | None:
    if response is None or response.status_code != 200:
        return None
    try:
        return parse_scrape(response.text)
    except (ValueError, KeyError):
        return None


def _json_or_none(response: httpx.Response | None) -> Any:
    try:
        return response.json() if response is not None else None
    except ValueError:
        return None


async def _settle(scraper: httpx.AsyncClient, clients: int, alerts: list[ReceivedAlert]) -> Scrape | None:
    """The last /metrics page, once every request's usage row is counted and the alert has arrived."""
    final = None
    with trio.move_on_after(SETTLE_BOUND_S):
        while True:
            response, _ = await _read_pages(scraper)
            final = _parse_or_none(response) or final
            # The door records a request's row just after its last byte went out: wait for all of them.
            if final is not None and sum(final.requests.values()) >= clients and alerts:
                break
            await trio.sleep(0.1)
    return final


# --- the webhook receiver -----------------------------------------------------------------------------------


async def serve_webhook_receiver(received: list[ReceivedAlert], *,
                                 task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """An ntfy stand-in on 127.0.0.1: each POST's Title, Priority, Tags and body into *received*,
    answered 200. Started with ``nursery.start``, which returns its port; runs until cancelled."""

    async def handle(stream: trio.SocketStream) -> None:
        connection = h11.Connection(h11.SERVER)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            while (alert := await _read_alert(connection, stream)) is not None:
                received.append(alert)
                answer = h11.Response(status_code=200, headers=[("Content-Length", "0")])
                await stream.send_all(connection.send(answer) + connection.send(h11.EndOfMessage()))
                if connection.our_state is not h11.DONE or connection.their_state is not h11.DONE:
                    return
                connection.start_next_cycle()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
        task_status.started(listeners[0].socket.getsockname()[1])


async def _read_alert(connection: h11.Connection, stream: trio.SocketStream) -> ReceivedAlert | None:
    received = await read_request(connection, stream)
    if received is None:
        return None
    headers = received.headers
    return ReceivedAlert(headers.get("title", ""), headers.get("priority", ""), headers.get("tags", ""), received.body)


# --- afterwards: the logs -----------------------------------------------------------------------------------


def _read_usage(path: Path) -> list[tuple[Any, ...]]:
    """(class, status, error, queued_s) of every row; read-only, after steward has exited."""
    if not path.exists():
        return []
    connection = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True)
    try:
        return connection.execute(f'SELECT "class", status, error, queued_s FROM {TABLE}').fetchall()
    except sqlite3.Error:
        return []
    finally:
        connection.close()


def usage_figures(rows: Sequence[tuple[Any, ...]]) -> UsageFigures:
    """The usage log's rows by status and error code, and the waits of the served ones per class. Pure."""
    statuses = collections.Counter(status for _, status, _, _ in rows)
    errors = collections.Counter(str(error) for _, status, error, _ in rows if status != 200 and error)
    waits = {klass: Waits.of(float(queued) for k, status, _, queued in rows
                             if k == klass and status == 200 and isinstance(queued, int | float))
             for klass in RequestClass}
    return UsageFigures(len(rows), _sorted_counts(statuses), _sorted_counts(errors), waits)


def event_rejections(records: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Rejections in the event log, per reason: the scheduler's (reject, timeout) and the door's (refused). Pure."""
    counts: collections.Counter[str] = collections.Counter()
    for record in records:
        if record["event"] in ("reject", "refused"):
            counts[str(record.get("reason"))] += 1
        elif record["event"] == "timeout":
            counts["queue_timeout"] += 1
    return dict(counts)


def _assemble(plan: OverloadPlan, run: _Run, margin: int, records: list[dict[str, Any]],
              usage_rows: list[tuple[Any, ...]]) -> OverloadReport:
    counted = [s for s in run.samples if s.counted]
    overloaded = [s for s in run.samples if s.health == "overloaded"]
    final = run.final
    return OverloadReport(
        clients=plan.clients, capacity_per_s=plan.capacity_per_s, max_tokens=plan.max_tokens,
        duration_s=run.duration_s,
        answers=_sorted_counts(collections.Counter(a.status for a in run.answers)
                               + collections.Counter({0: plan.clients - len(run.answers)})),
        rejected_by_clients=_sorted_counts(collections.Counter(a.reason for a in run.answers if a.reason)),
        rejected_by_metrics=_sorted_counts(final.rejected if final is not None else {}),
        rejected_by_events=_sorted_counts(event_rejections(records)),
        requests_by_metrics=_sorted_counts(final.requests if final is not None else {}),
        samples=len(run.samples), counted_samples=len(counted),
        zero_queued_samples=sum(1 for s in counted if s.queued == 0),
        zero_waiting_samples=sum(1 for s in counted if s.waiting == 0),
        max_queued=max((s.queued for s in run.samples if s.queued is not None), default=0),
        usage=usage_figures(usage_rows),
        health_seen=_sorted_counts(collections.Counter(s.health or "unreadable" for s in run.samples)),
        overloaded_http=_sorted_counts(collections.Counter(s.health_http for s in overloaded
                                                           if s.health_http is not None)),
        overloaded_reasons=overloaded[0].reasons if overloaded else (),
        health_events=tuple(str(r.get("status")) for r in records if r["event"] == "health"),
        alerts=tuple(run.alerts), alert_sent_events=sum(1 for r in records if r["event"] == "alert_sent"),
        steward_exit=run.steward_exit, counted_margin=margin)


def _sorted_counts(counts: Mapping[Any, int]) -> dict[Any, int]:
    return {key: n for key, n in sorted(counts.items(), key=lambda item: str(item[0])) if n}


def _counts(counts: Mapping[Any, int]) -> str:
    return ", ".join(f"{key}: {n}" for key, n in counts.items()) or "none"


def _keyed(counts: Mapping[int, int]) -> dict[str, int]:
    return {str(key): n for key, n in counts.items()}


def _round(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


# --- from a terminal ----------------------------------------------------------------------------------------


def report_overload(*, clients: int = 256, capacity_per_s: float = 20.0, as_json: bool = False,
                    keep: bool = False) -> int:
    """``steward loadtest --scenario overload``: run it, print the report; 0 if every check passed."""
    started = time.monotonic()
    with open_workdir("overload", keep=keep) as workdir:
        try:
            report = run_overload(workdir, clients=clients, capacity_per_s=capacity_per_s)
        except (ValueError, RuntimeError) as exc:
            print(f"steward: loadtest: {exc}", file=sys.stderr)
            return 2
    print(json.dumps(report.to_json()) if as_json else format_overload_report(report))
    print(f"(the whole run took {time.monotonic() - started:.1f}s)", file=sys.stderr)
    return 0 if report.passed else 1
