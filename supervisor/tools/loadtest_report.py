"""The loadtest's report: its figures per class and per client kind, the chaos section, and the table.

``LoadReport`` gathers the clients' outcomes (supervisor/tools/loadtest_clients.py), what
steward's event log says (loads, evictions, warnings and errors), and under ``--chaos``
the ``ChaosReport`` (supervisor/tools/loadtest_chaos.py): its actions, steward's memory and
fds over time, and the invariants checked afterwards. ``to_json`` is ``--json``'s report,
``format_report`` the terminal's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from supervisor.observe.events import read_event_log
from supervisor.request_class import RequestClass
from supervisor.tools import chaos
from supervisor.tools.loadtest_clients import KindCount, LoadTally, Outcome


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
