"""Replay a scenario through every chosen policy (on one seed or several), check steward's
targets, print the result: one table per scenario with the policies side by side."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence

import attrs
import cattrs

from supervisor.tools.simulate.metrics import Alone, ClassStats, PolicyResult, percentile
from supervisor.tools.simulate.policies import DEFAULT_POLICIES, make_policy
from supervisor.tools.simulate.room import lower_room
from supervisor.tools.simulate.runner import replay
from supervisor.tools.simulate.scenario import Scenario, format_seeds
from supervisor.tools.simulate.targets import Target, Verdict, targets_for, worst_case
from supervisor.units import format_size

LABEL = 26  # width of the table's first column
COLUMN = 10  # width of each policy's column


@attrs.frozen
class Report:
    """One scenario on one seed, through every chosen policy."""

    scenario: Scenario
    policies: dict[str, PolicyResult]
    interactive_alone: Alone
    wall_s: float

    def as_json(self) -> dict[str, object]:
        calibration = self.scenario.calibration
        return {"scenario": self.scenario.name, "seed": self.scenario.seed,
                **({} if calibration is None else {"calibration": calibration.describe()}),
                "policies": {name: cattrs.unstructure(result) for name, result in self.policies.items()},
                "interactive_alone": cattrs.unstructure(self.interactive_alone),
                "targets": [t.as_json() for t in self.targets()]}

    def targets(self) -> list[Target]:
        """steward's targets on this scenario (targets.py); none when steward was not replayed."""
        return targets_for(self)


@attrs.frozen
class Sweep:
    """One scenario on several seeds: a target is met only if it is met on every seed."""

    runs: tuple[Report, ...]
    wall_s: float

    @property
    def scenario(self) -> Scenario:
        return self.runs[0].scenario

    @property
    def seeds(self) -> list[int]:
        return [run.scenario.seed for run in self.runs]

    def as_json(self) -> dict[str, object]:
        return {"scenario": self.scenario.name, "seeds": self.seeds, "runs": [run.as_json() for run in self.runs],
                "targets": [t.as_json() for t in self.targets()]}

    def targets(self) -> list[Target]:
        return worst_case([run.targets() for run in self.runs], self.seeds)


def simulate(scenario: Scenario, policies: Sequence[str] = DEFAULT_POLICIES) -> Report:
    started = time.perf_counter()
    results = {name: PolicyResult.of(replay(scenario, make_policy(name, scenario))) for name in policies}
    return Report(scenario, results, _interactive_alone(scenario), time.perf_counter() - started)


def _interactive_alone(scenario: Scenario) -> Alone:
    alone = replay(scenario.only("interactive"), make_policy("steward", scenario))
    latencies = [r.latency for r in alone.records if r.latency is not None]
    p50, p95 = (None if (p := percentile(latencies, f)) is None else round(p, 3) for f in (0.5, 0.95))
    if "interactive" not in scenario.present_classes():
        return Alone(p50, p95)
    idle = scenario.duration * (1 - alone.busy_share)
    room = lower_room(scenario, idle)
    return Alone(p50, p95, round(idle, 3), None if room is None else round(room, 1))


def simulate_seeds(scenario: Scenario, seeds: Sequence[int], policies: Sequence[str] = DEFAULT_POLICIES) -> Sweep:
    started = time.perf_counter()
    runs = tuple(simulate(attrs.evolve(scenario, seed=seed), policies) for seed in seeds)
    return Sweep(runs, time.perf_counter() - started)


def format_report(result: Report | Sweep) -> str:
    return _format_sweep(result) if isinstance(result, Sweep) else _format_report(result)


# ---- one seed: the policies side by side -------------------------------------------------

Row = tuple[str, Callable[[PolicyResult], str]]


def _class_rows(klass: str) -> list[Row]:
    def cell(pick: Callable[[ClassStats], float | int | None]) -> Callable[[PolicyResult], str]:
        return lambda result: _cell(pick(result.classes[klass]))
    return [
        (f"{klass} done", cell(lambda c: c.completed)),
        ("  errors", cell(lambda c: c.errors)),
        ("  latency p50 s", cell(lambda c: c.p50_s)),
        ("  latency p95 s", cell(lambda c: c.p95_s)),
        ("  latency max s", cell(lambda c: c.max_s)),
        ("  wait p50 s", cell(lambda c: c.wait_p50_s)),
        ("  wait p95 s", cell(lambda c: c.wait_p95_s)),
        ("  wait max s", cell(lambda c: c.wait_max_s)),
        ("  largest overtake s", cell(lambda c: c.overtake_max_s)),
    ]


SUMMARY_ROWS: list[Row] = [
    ("loads", lambda r: str(r.loads)),
    ("  unnecessary", lambda r: str(r.unnecessary_loads)),
    ("  per 100 requests", lambda r: _cell(r.loads_per_100, ".1f")),
    ("fallbacks", lambda r: str(r.fallbacks)),
    ("GPU busy", lambda r: f"{100 * r.busy_share:.0f} %"),
    ("peak memory", lambda r: format_size(r.peak_memory_bytes)),
]


def _format_report(report: Report) -> str:
    scenario = report.scenario
    lines = [f"scenario {scenario.name}: {scenario.duration:g} s of virtual time, seed {scenario.seed}, "
             f"GPU {format_size(scenario.gpu.memory)}; replayed in {report.wall_s:.2f} s", *_calibrated(scenario), ""]
    results = list(report.policies.values())
    width = max(COLUMN, *(len(name) + 1 for name in report.policies))
    lines.append(" " * LABEL + "".join(f"{name:>{width}}" for name in report.policies))
    rows = [row for klass in scenario.present_classes() for row in _class_rows(klass)] + SUMMARY_ROWS
    lines += [f"{label:<{LABEL}}" + "".join(f"{show(r):>{width}}" for r in results) for label, show in rows]
    alone = report.interactive_alone
    if "interactive" in scenario.present_classes():
        lines += ["", f"interactive alone (steward, interactive clients only): p50 {_cell(alone.p50_s)} s, "
                      f"p95 {_cell(alone.p95_s)} s"]
        if alone.lower_room is not None:
            lines.append(f"  the GPU idle beside them {_cell(alone.idle_s, '.1f')} s: room for at most "
                         f"{alone.lower_room:.0f} lower-class requests that slow no chat "
                         "(an upper bound: docs/simulator.md)")
    lines += _format_targets(report.targets())
    return "\n".join(lines)


# ---- several seeds: one row per seed, then the worst case --------------------------------

Column = tuple[str, str, Callable[[Report], str]]  # group, title, the cell of one run


def _steward(pick: Callable[[Report, PolicyResult], str]) -> Callable[[Report], str]:
    return lambda run: "-" if (steward := run.policies.get("steward")) is None else pick(run, steward)


def _ratio(run: Report, steward: PolicyResult) -> str:
    p95, alone = steward.classes["interactive"].p95_s, run.interactive_alone.p95_s
    return "-" if p95 is None or not alone else f"{p95 / alone:.2f}x"


def _done(klass: str) -> Callable[[Report], str]:
    return _steward(lambda _, steward: str(steward.classes[klass].completed))


def _loads_of(policy: str) -> Callable[[Report], str]:
    return lambda run: _cell(run.policies[policy].loads_per_100, ".1f")


def _sweep_columns(scenario: Scenario, policies: Sequence[str]) -> list[Column]:
    """steward's figures, then every policy's loads per 100 requests, then steward's targets met."""
    columns: list[Column] = [("", "seed", lambda run: str(run.scenario.seed))]
    if "interactive" in scenario.present_classes():
        group = "interactive p95 s"
        columns += [(group, "alone", lambda run: _cell(run.interactive_alone.p95_s)),
                    (group, "steward", _steward(lambda _, s: _cell(s.classes["interactive"].p95_s))),
                    (group, "ratio", _steward(_ratio))]
        if any(k != "interactive" for k in scenario.present_classes()):
            columns += [("chats alone", "idle s", lambda run: _cell(run.interactive_alone.idle_s, ".1f")),
                        ("chats alone", "room", lambda run: _cell(run.interactive_alone.lower_room, ".0f"))]
    columns += [("steward done", k, _done(k)) for k in scenario.present_classes()]
    columns += [("steward", "overtake s", _steward(lambda _, s: _cell(s.overtake_max_s))),
                ("steward", "GPU busy", _steward(lambda _, s: f"{100 * s.busy_share:.0f} %"))]
    columns += [("loads per 100 requests", p, _loads_of(p)) for p in policies]
    columns.append(("", "targets met", lambda run: _met(run.targets())))
    return columns


def _format_sweep(sweep: Sweep) -> str:
    scenario = sweep.scenario
    lines = [f"scenario {scenario.name}, seeds {format_seeds(sweep.seeds)}: {scenario.duration:g} s of "
             f"virtual time each, GPU {format_size(scenario.gpu.memory)}; replayed in {sweep.wall_s:.2f} s",
             *_calibrated(scenario), ""]
    columns = _sweep_columns(scenario, list(sweep.runs[0].policies))
    table = [[title for _, title, _ in columns]] + [[show(run) for _, _, show in columns] for run in sweep.runs]
    widths = [max(len(row[i]) for row in table) + 2 for i in range(len(columns))]
    groups = ""
    for group, members in itertools.groupby(zip(columns, widths, strict=True), key=lambda cw: cw[0][0]):
        span = sum(width for _, width in members)
        groups += f"{group:>{span}}" if group else " " * span
    lines.append(groups.rstrip())
    lines += ["".join(f"{cell:>{width}}" for cell, width in zip(row, widths, strict=True)) for row in table]
    lines += _format_targets(sweep.targets(), "on every seed")
    return "\n".join(lines)


def _calibrated(scenario: Scenario) -> list[str]:
    """The line that says the scenario runs on a host's measured figures, if it does."""
    return [] if scenario.calibration is None else [scenario.calibration.describe()]


def _met(targets: list[Target]) -> str:
    return f"{sum(t.verdict is Verdict.PASS for t in targets)}/{len(targets)}" if targets else "-"


def _format_targets(targets: list[Target], scope: str = "") -> list[str]:
    if not targets:
        return []
    return ["", f"steward targets{' ' + scope if scope else ''}"] + [
        f"  {t.verdict.value}  {t.what}: {t.detail}" for t in targets]


def _cell(value: float | int | None, spec: str = ".2f") -> str:
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else format(value, spec)
