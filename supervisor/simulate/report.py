"""Replay a scenario through every chosen policy, check steward's targets, print the result."""

from __future__ import annotations

import time
from collections.abc import Sequence

import attrs
import cattrs

from supervisor.scheduler.types import CLASSES
from supervisor.simulate.metrics import Alone, ClassStats, PolicyResult, percentile
from supervisor.simulate.policies import POLICIES, make_policy
from supervisor.simulate.runner import replay
from supervisor.simulate.scenario import Scenario
from supervisor.units import format_size

INTERACTIVE_SLOWDOWN = 1.3  # target: steward's interactive p95 within this factor of the interactive clients alone


@attrs.frozen
class Target:
    what: str
    met: bool
    detail: str


@attrs.frozen
class Report:
    scenario: Scenario
    policies: dict[str, PolicyResult]
    interactive_alone: Alone
    wall_s: float

    def as_json(self) -> dict[str, object]:
        return {"scenario": self.scenario.name,
                "policies": {name: cattrs.unstructure(result) for name, result in self.policies.items()},
                "interactive_alone": cattrs.unstructure(self.interactive_alone)}

    def targets(self) -> list[Target]:
        """steward's targets; none when steward was not replayed."""
        steward = self.policies.get("steward")
        if steward is None:
            return []
        p95, alone = steward.classes["interactive"].p95_s, self.interactive_alone.p95_s
        if p95 is None or alone is None:
            slowdown = Target("interactive p95 within 1.3x of alone", False, "no interactive request completed")
        else:
            limit = INTERACTIVE_SLOWDOWN * alone
            slowdown = Target(f"interactive p95 <= {INTERACTIVE_SLOWDOWN:g} x alone", p95 <= limit,
                              f"{p95:.2f} s vs {alone:.2f} s alone = {p95 / alone:.2f}x (limit {limit:.2f} s)")
        present = [k for k in CLASSES if any(c.klass == k for c in self.scenario.clients.values())]
        idle = [k for k in present if steward.classes[k].completed == 0]
        return [
            slowdown,
            Target("every class completes work", not idle,
                   ", ".join(f"{k} {steward.classes[k].completed}" for k in present)
                   + (f"; none done: {', '.join(idle)}" if idle else "")),
            Target("zero unnecessary loads", steward.unnecessary_loads == 0,
                   f"{steward.unnecessary_loads} of {steward.loads} loads"),
            Target("zero errors", steward.errors == 0, f"{steward.errors} errors"),
        ]


def simulate(scenario: Scenario, policies: Sequence[str] = tuple(POLICIES)) -> Report:
    started = time.perf_counter()
    results = {name: PolicyResult.of(replay(scenario, make_policy(name, scenario))) for name in policies}
    alone = replay(scenario.only("interactive"), make_policy("steward", scenario))
    latencies = [r.latency for r in alone.records if r.latency is not None]
    interactive_alone = Alone(*(None if (p := percentile(latencies, f)) is None else round(p, 3) for f in (0.5, 0.95)))
    return Report(scenario, results, interactive_alone, time.perf_counter() - started)


def format_report(report: Report) -> str:
    scenario = report.scenario
    lines = [f"scenario {scenario.name}: {scenario.duration:g} s of virtual time, seed {scenario.seed}, "
             f"GPU {format_size(scenario.gpu.memory)}; replayed in {report.wall_s:.2f} s"]
    for name, result in report.policies.items():
        lines += ["", name, f"  {'class':<12}{'done':>6}{'p50 s':>9}{'p95 s':>9}{'max s':>9}{'errors':>8}"]
        lines += [_class_row(klass, stats) for klass, stats in result.classes.items()]
        lines.append(f"  loads {result.loads}, unnecessary loads {result.unnecessary_loads}, "
                     f"peak memory {format_size(result.peak_memory_bytes)}")
    alone = report.interactive_alone
    lines += ["", f"interactive alone (steward, interactive clients only): p50 {_seconds(alone.p50_s)} s, "
                  f"p95 {_seconds(alone.p95_s)} s"]
    targets = report.targets()
    if targets:
        lines += ["", "steward targets"]
        lines += [f"  {'PASS' if t.met else 'MISS'}  {t.what}: {t.detail}" for t in targets]
    return "\n".join(lines)


def _class_row(klass: str, stats: ClassStats) -> str:
    return (f"  {klass:<12}{stats.completed:>6}{_seconds(stats.p50_s):>9}{_seconds(stats.p95_s):>9}"
            f"{_seconds(stats.max_s):>9}{stats.errors:>8}")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
