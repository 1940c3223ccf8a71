"""``steward loadtest --scenario thrash``: issue 16's thrash workload on real processes.

The simulator's thrash scenario (supervisor/tools/simulate/thrash.yaml: three agents, each on
its own 10 GiB model, room for two on a 24 GiB card) run by a real ``steward run`` on
fake llama-servers that hold their memory on a simulated GPU, the agents real HTTP
clients (supervisor/tools/loadtest_clients.py's), for a fixed wall time; then the same workload
replayed in the simulator, and the loads compared.

Both sides run one *scaled* scenario, made here from thrash.yaml: every time in it (load
and stop times, the agents' think times, steward's scheduler durations) multiplied by
the time scale and every speed divided by it, so the workload is the same in fewer
seconds. What the fakes cannot do is made equal on both sides rather than approximated
on one: a fake llama-server spends time only on its answer's tokens, so an agent's
prompt becomes the output tokens that take as long (the same step time alone), and the
fakes compute side by side without slowing each other (no shared GPU), so the scaled
scenario's engines share nothing. A fake's load also takes its process's start-up, a
stop its exit and the memory seen free, and an answer its HTTP on top of its tokens, so
the simulator replays the load and stop times and the speeds measured in steward's event
log (``ready``'s ``load_s``; ``stop`` to ``released``; a ``request``'s tokens over its
time after the queue).

Loads are counted from steward's event log (``load`` events, as summarize_events does)
and compared per 100 requests completed (closed-loop agents ask more often when served
faster) with the simulator's figure averaged over seeds: the real agents draw their own
requests from the same distributions, not the same requests. Within ±20 % is PASS.
"""

from __future__ import annotations

import statistics
import sys
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import cattrs

from fakes import simgpu
from supervisor.config import Duration, SchedulerConfig
from supervisor.tools.demo import open_workdir
from supervisor.observe.events import read_event_log
from supervisor.tools.loadtest import run_on_own_steward
from supervisor.tools.loadtest_clients import ClientKind
from supervisor.tools.loadtest_report import LoadReport, format_report
from supervisor.tools.loadtest_steward import EVENTS_FILE
from supervisor.tools.simulate.metrics import PolicyResult
from supervisor.tools.simulate.policies import make_policy
from supervisor.tools.simulate.runner import replay
from supervisor.tools.simulate.scenario import EngineSpec, Range, Scenario, builtin_scenario, format_seeds
from supervisor.tools.simulate.sharing import SharingModel
from supervisor.tools.simulate.targets import Verdict

DEFAULT_SCALE = 0.25  # loads of 2-3 s, steps of 0.6-1.6 s, 0.25-1 s of tool work between them
DEFAULT_DURATION = 90.0
TOLERANCE = 0.2  # real loads per 100 requests within this share of the simulator's
SIMULATED_SEEDS = tuple(range(1, 9))
FIRST_ASK = Range(0.0, 0.5)  # supervisor/tools/loadtest_clients.py's clients start within the first half second
GPU_POLL_S = 0.1  # steward reads the simulated GPU this often: a stop's memory is seen free within it
GPU_LINGER_S = 0.05  # how long the simulated driver still counts an exited process's memory


# ---- the scaled scenario, for both sides ------------------------------------------------

def scaled_thrash(scale: float, duration: float) -> Scenario:
    """thrash.yaml with every time x *scale* and every speed / *scale*, for *duration*
    seconds, made as the fakes can run it (the module docstring says how)."""
    if not scale > 0:
        raise ValueError(f"the time scale must be positive, got {scale:g}")
    if not duration > 0:
        raise ValueError(f"the duration must be positive, got {duration:g}")
    base = builtin_scenario("thrash")
    engines = {name: attrs.evolve(e, speed=e.speed / scale, prompt_speed=None, load_time=e.load_time * scale,
                                  stop_time=e.stop_time * scale)
               for name, e in base.engines.items()}
    clients = {}
    for name, client in base.clients.items():
        engine = base.engines[client.model]
        as_output = engine.speed / engine.prefill_speed  # output tokens that take as long as one prompt token
        output = Range(client.output_tokens.low + as_output * client.prompt_tokens.low,
                       client.output_tokens.high + as_output * client.prompt_tokens.high)
        clients[name] = attrs.evolve(client, prompt_tokens=Range(0.0, 0.0), output_tokens=output, start=FIRST_ASK,
                                     think=Range(client.think.low * scale, client.think.high * scale))
    sharing = SharingModel(alpha=0.0, batching_gain=base.gpu.sharing.batching_gain, load_weight=0.0)
    return attrs.evolve(base, name="thrash", duration=duration, warmup=0.0, engines=engines, clients=clients,
                        gpu=attrs.evolve(base.gpu, sharing=sharing), scheduler=_scaled(base.scheduler, scale))


def _scaled(scheduler: SchedulerConfig, scale: float) -> SchedulerConfig:
    """Every duration of the scheduler's knobs x *scale*, whichever knobs it has."""
    hints = typing.get_type_hints(SchedulerConfig)
    return attrs.evolve(scheduler, **{f.name: getattr(scheduler, f.name) * scale
                                      for f in attrs.fields(SchedulerConfig) if hints[f.name] is Duration})


def agent_kinds(scenario: Scenario) -> dict[ClientKind, int]:
    """The scenario's agents as loadtest clients: one kind per agent, its step as output tokens."""
    return {ClientKind(name, client.klass, client.model, think_s=(client.think.low, client.think.high),
                       max_tokens=(round(client.output_tokens.low), round(client.output_tokens.high))): client.count
            for name, client in scenario.clients.items()}


def steward_config(workdir: Path, scenario: Scenario) -> dict[str, Any]:
    """A steward for *scenario*: its card as a simulated GPU, its engines as fake llama-servers."""
    gpu_dir = simgpu.create_device(workdir / "gpu", total_bytes=scenario.gpu.memory,
                                   name=f"Simulated GPU ({scenario.name})", linger_s=GPU_LINGER_S)
    models = {name: {"command": [sys.executable, "-m", "fakes.llama_server"], "model": f"/models/{name}.gguf",
                     "memory": engine.memory, "parallel": engine.slots, "pinned": engine.pinned,
                     "args": ["--alias", name, "--memory", str(engine.memory), "--sim-gpu", str(gpu_dir),
                              "--load-time", f"{engine.load_time}s", "--tokens-per-second", f"{engine.speed}",
                              "--ctx-size", "8192"]}
              for name, engine in scenario.engines.items()}
    return {
        "listen": "127.0.0.1:0",
        "models": models,
        "gpu": {"probe": "simulated", "simulated_dir": str(gpu_dir), "poll_interval": GPU_POLL_S},
        "engines": {"stop_grace": "3s", "restart_backoff": "0.5s"},
        "scheduler": cattrs.unstructure(scenario.scheduler),  # the scaled knobs the simulator replays
        "state_file": str(workdir / "state.json"),
        "usage": {"db": str(workdir / "usage.db")},
        "auth": {"keys_file": str(workdir / "keys.json")},
    }


@attrs.frozen
class Measured:
    """One engine in a run: its mean load and stop times, its speed; None: not seen."""

    load_s: float | None = None
    stop_s: float | None = None
    speed: float | None = None  # output tokens per second, its answers' HTTP included


@attrs.define
class _Seen:
    loads: list[float] = attrs.Factory(list)
    stops: list[float] = attrs.Factory(list)
    tokens: int = 0
    computing_s: float = 0.0
    stopping_since: float | None = None  # the log's monotonic clock

    def measured(self) -> Measured:
        return Measured(_mean(self.loads), _mean(self.stops),
                        self.tokens / self.computing_s if self.tokens and self.computing_s > 0 else None)


def measured_engines(events: Path) -> dict[str, Measured]:
    """Per engine, from steward's event log, what the simulator's engines have: the mean
    load (decision to ready: ``ready``'s ``load_s``), the mean stop (``stop`` until its
    memory was released) and the speed (answered tokens over their requests' time after
    the queue)."""
    seen: dict[str, _Seen] = {}
    for record in read_event_log(events):
        name = record["event"]
        if (engine_name := record.get("model" if name == "request" else "engine")) is None:
            continue
        engine = seen.setdefault(str(engine_name), _Seen())
        if name == "ready" and not record.get("wake") and isinstance(record.get("load_s"), int | float):
            engine.loads.append(float(record["load_s"]))
        elif name == "stop":
            engine.stopping_since = float(record["mono"])
        elif (name == "released" or (name == "stopped" and record.get("released"))) and engine.stopping_since is not None:
            engine.stops.append(float(record["mono"]) - engine.stopping_since)
            engine.stopping_since = None
        elif name == "request" and record.get("status") == 200 and record.get("completion_tokens"):
            engine.tokens += int(record["completion_tokens"])
            engine.computing_s += float(record["duration_s"]) - float(record.get("queued_s") or 0.0)
    return {name: s.measured() for name, s in seen.items()}


def with_measured(scenario: Scenario, measured: Mapping[str, Measured]) -> Scenario:
    """*scenario* with its engines' figures as measured, where they were."""
    def evolve(name: str, e: EngineSpec) -> EngineSpec:
        m = measured.get(name, Measured())
        return attrs.evolve(e, load_time=e.load_time if m.load_s is None else m.load_s,
                            stop_time=e.stop_time if m.stop_s is None else m.stop_s,
                            speed=e.speed if m.speed is None else m.speed)
    return attrs.evolve(scenario, engines={name: evolve(name, e) for name, e in scenario.engines.items()})


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


# ---- the comparison ---------------------------------------------------------------------

@attrs.frozen
class Loads:
    """Loads and completed requests of one run; per 100 requests None when none completed."""

    loads: int
    completed: int

    @property
    def per_100(self) -> float | None:
        return None if self.completed == 0 else 100 * self.loads / self.completed


def simulated_loads(scenario: Scenario, seeds: Sequence[int] = SIMULATED_SEEDS) -> dict[int, Loads]:
    """steward's loads and completed requests on *scenario*, per seed."""
    results = {seed: PolicyResult.of(replay(attrs.evolve(scenario, seed=seed), make_policy("steward", scenario)))
               for seed in seeds}
    return {seed: Loads(r.loads, r.completed) for seed, r in results.items()}


@attrs.frozen
class ThrashReport:
    scenario: Scenario  # the scaled scenario, with its engines' figures as measured
    scale: float
    load: LoadReport  # the real run
    simulated: dict[int, Loads]  # per seed

    @property
    def real(self) -> Loads:
        events = self.load.engine_events or {}
        completed = sum(row["completed"] for row in self.load.by_class().values())
        return Loads(int(events.get("loads", 0)), completed)

    @property
    def simulated_per_100(self) -> float | None:
        figures = [s.per_100 for s in self.simulated.values() if s.per_100 is not None]
        return statistics.fmean(figures) if figures else None

    @property
    def ratio(self) -> float | None:
        real, simulated = self.real.per_100, self.simulated_per_100
        return None if real is None or not simulated else real / simulated

    @property
    def verdict(self) -> Verdict:
        ratio = self.ratio
        return Verdict.PASS if ratio is not None and abs(ratio - 1) <= TOLERANCE else Verdict.MISS

    @property
    def passed(self) -> bool:
        return self.verdict is Verdict.PASS and self.load.passed

    def to_json(self) -> dict[str, Any]:
        real = self.real
        return {"scenario": "thrash", "time_scale": self.scale, "duration_s": self.scenario.duration,
                "measured": {name: {"load_s": round(e.load_time, 3), "stop_s": round(e.stop_time, 3),
                                    "speed": round(e.speed, 1)} for name, e in self.scenario.engines.items()},
                "real": {"loads": real.loads, "completed": real.completed, "loads_per_100": _round(real.per_100)},
                "simulated": {"seeds": list(self.simulated), "loads_per_100": _round(self.simulated_per_100),
                              "runs": [{"seed": seed, "loads": s.loads, "completed": s.completed,
                                        "loads_per_100": _round(s.per_100)} for seed, s in self.simulated.items()]},
                "tolerance": TOLERANCE, "ratio": _round(self.ratio), "verdict": self.verdict.value,
                "passed": self.passed, "loadtest": self.load.to_json()}


def run_thrash_loadtest(duration: float = DEFAULT_DURATION, *, scale: float = DEFAULT_SCALE, seed: int = 7,
                        seeds: Sequence[int] = SIMULATED_SEEDS, keep: bool = False,
                        say: Callable[[str], None] | None = None) -> ThrashReport:
    """The scaled thrash workload for *duration* seconds on its own steward, then in the simulator.

    Raises:
        ValueError: *scale* or *duration* is not positive.
        RuntimeError: steward could not be started.
    """
    scenario = scaled_thrash(scale, duration)
    with open_workdir("loadtest", keep=keep) as workdir:
        load = run_on_own_steward(workdir, steward_config(workdir, scenario), agent_kinds(scenario), duration, seed,
                                  engines=f"fake llama-servers on a simulated {scenario.gpu.memory / 1024**3:g} GiB "
                                          f"GPU (thrash, time x {scale:g})",
                                  keep=keep, say=say)
        measured = with_measured(scenario, measured_engines(workdir / EVENTS_FILE))
    return ThrashReport(measured, scale, load, simulated_loads(measured, seeds))


def format_thrash_report(report: ThrashReport) -> str:
    """The agents' table, then the loads real and simulated side by side, PASS/MISS."""
    scenario, real = report.scenario, report.real
    nominal = scaled_thrash(report.scale, scenario.duration).engines
    figures = "; ".join(f"{name} {e.load_time:.2f} / {e.stop_time:.2f} s, {e.speed:.0f} tok/s (nominal "
                        f"{nominal[name].load_time:g} / {nominal[name].stop_time:g} s, {nominal[name].speed:g})"
                        for name, e in scenario.engines.items())
    runs = [s.per_100 for s in report.simulated.values() if s.per_100 is not None]
    spread = f", {min(runs):.1f}-{max(runs):.1f}" if runs else ""
    ratio = "-" if report.ratio is None else f"{report.ratio:.2f}x"
    return "\n".join([
        format_report(report.load),
        "",
        f"thrash, every time x {report.scale:g}, {scenario.duration:g} s; load / stop times and speeds as "
        f"measured: {figures}",
        f"  real       {real.loads} loads, {real.completed} requests completed: {_per_100(real.per_100)}",
        f"  simulated  {_per_100(report.simulated_per_100)} (mean of seeds {format_seeds(list(report.simulated))}"
        f"{spread}), the same scaled scenario",
        f"  {report.verdict.value}  real loads per 100 requests within ±{100 * TOLERANCE:g} % of simulated: "
        f"{_cell(real.per_100)} vs {_cell(report.simulated_per_100)} ({ratio})",
    ])


def _per_100(value: float | None) -> str:
    return f"{_cell(value)} loads per 100 requests"


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
