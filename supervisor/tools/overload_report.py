"""What a run of the overload scenario saw, the checks on it, and its report.

The run (supervisor/tools/overload.py) records the clients' answers, its samples of
``/metrics`` and ``/healthz``, the last scrape and the alerts the webhook got
(``OverloadRun``); ``assemble_report`` adds the event log and the usage log and makes the
``OverloadReport``. Its checks are pure (``OverloadReport.problems``, from the figures
alone); ``to_json`` is ``--json``'s report, ``format_overload_report`` the terminal's.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
from prometheus_client.parser import text_string_to_metric_families

from supervisor.request_class import RequestClass
from supervisor.tools.overload_scenario import SLOTS, OverloadPlan
from supervisor.usage.report import percentile

SEED_REQUESTS_PER_MIN = 26.0  # the seed's engine, measured
SEED_ZERO_SAMPLES = 253  # the seed's waiting gauge: zero in every one of them
CAPACITY_REASONS = frozenset({"queue_full", "queue_timeout"})
MIN_COUNTED_SAMPLES = 10  # fewer samples during the overload cannot show the gauge is never zero


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


@attrs.frozen
class OverloadRun:
    """What one run saw: the clients' answers, the samples, the last scrape, the alerts, steward's exit status."""

    answers: list[Answer]
    samples: list[Sample]
    final: Scrape | None
    alerts: list[ReceivedAlert]
    steward_exit: int
    duration_s: float


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


def assemble_report(plan: OverloadPlan, run: OverloadRun, margin: int, records: list[dict[str, Any]],
                    usage_rows: list[tuple[Any, ...]]) -> OverloadReport:
    """The report of *run*, with steward's event log *records* and its usage log's rows. Pure."""
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
