"""``steward loadtest --scenario real``: issue 27's mix on real llama-servers, beside the simulator.

Four model names on the real llama-server with one real instruct model (SmolLM2-135M,
fakes/real_model.py), ``gpu: {probe: host, budget: 3GiB}`` and 1 GiB each, so three fit;
every scheduler key at its default. On a CPU host the cores play the GPU's part: the
engines compete for them as models compete for a card's compute. The clients
(supervisor/tools/loadtest_clients.py's): two interactive chats streaming (think 2-6 s), three
background agents (1-2k-token prompts, 64-128 tokens out), one batch client (the same
sizes) and one embeddings client (64 inputs, on the name started with ``--embeddings``).

It runs, each for ``--duration`` seconds on its own fresh steward: the chats alone, then
the whole mix. Before them it calibrates this host (supervisor/tools/calibrate.py) into the
state file the stewards use, or takes a calibration it is given (``--calibration``).
Then the same mix is replayed in the simulator with the calibration's figures (alpha,
batching gain, speeds, load times), the real run's request sizes and measured stop times,
on several seeds, and the two are printed side by side with the verdicts of the issue's
targets. The real figures are as noisy as the host is busy: run it on an idle one.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from supervisor.config import ClassesConfig, SchedulerConfig, parse_config
from supervisor.tools.demo import open_workdir
from supervisor.observe.events import read_event_log
from supervisor.tools.loadtest import run_on_own_steward
from supervisor.tools.loadtest_clients import ClientKind
from supervisor.tools.loadtest_report import LoadReport, format_report
from supervisor.tools.loadtest_steward import EVENTS_FILE
from supervisor.tools.loadtest_thrash import measured_engines
from supervisor.request_class import RequestClass
from supervisor.tools.simulate.metrics import PolicyResult
from supervisor.tools.simulate.policies import make_policy
from supervisor.tools.simulate.runner import Outcome, replay
from supervisor.tools.simulate.scenario import (
    Calibration,
    ClientSpec,
    EngineSpec,
    GpuSpec,
    Range,
    Scenario,
    format_seeds,
)
from supervisor.tools.simulate.sharing import SharingModel
from supervisor.tools.simulate.targets import Verdict

DEFAULT_DURATION = 300.0
SIMULATED_SEEDS = tuple(range(1, 9))
GIB = 1024**3
BUDGET = 3 * GIB
MEMORY = GIB  # each model's, set by hand: three fit in the budget
ALONE_BOUND = 1.3  # interactive p95 in the mix at most this x its alone run's
TOLERANCE = 0.25  # simulated figures within this share of the real ones
FIRST_ASK = Range(0.0, 0.5)  # supervisor/tools/loadtest_clients.py's clients start within the first half second
GGUF_ENV = "STEWARD_SMOLLM2_GGUF"
# Requests still in flight when a run's duration is over are abandoned at once: the run
# stops by itself, and counts what the simulator counts (the requests answered within it).
DRAIN_S = 0.0
ENGINES_IN_WORDS = "real llama-servers with SmolLM2-135M (four names, 1 GiB each in a 3 GiB budget)"
PROMPT_TOKENS_PER_REPEAT = 3  # "work on this " in SmolLM2's tokens
# SmolLM2's chat template before the user's text (its system prompt), in its tokens: each slot
# keeps it cached from the request before, and llama-server reads only what follows (the
# clients' prompts begin with a random number). Measured with the real llama-server's
# /apply-template and /tokenize. Embeddings have no template.
TEMPLATE_PREFIX_TOKENS = 23


@attrs.frozen
class MixClient:
    """One group of the mix: the loadtest's client kind, how many, and the engine it asks."""

    kind: ClientKind
    count: int
    parallel: int  # its model's slots
    embeddings: bool = False


AGENT_PROMPT = (1000 // PROMPT_TOKENS_PER_REPEAT, 2000 // PROMPT_TOKENS_PER_REPEAT)
MIX = (
    MixClient(ClientKind("chat", "interactive", "chat", think_s=(2.0, 6.0), max_tokens=(32, 96)), 2, 2),
    MixClient(ClientKind("agent", "background", "agent", think_s=(1.0, 3.0), max_tokens=(64, 128),
                         prompt_repeats=AGENT_PROMPT), 3, 2),
    MixClient(ClientKind("batch", "batch", "batch", think_s=(0.5, 1.0), max_tokens=(64, 128),
                         prompt_repeats=AGENT_PROMPT), 1, 2),
    MixClient(ClientKind("embedding", "background", "embed", think_s=(5.0, 15.0), inputs=64), 1, 1, embeddings=True),
)


def smollm2_path() -> Path:
    """The SmolLM2 GGUF: fakes/real_model.py's, else $STEWARD_SMOLLM2_GGUF.

    Raises:
        RuntimeError: neither has it.
    """
    problem = ""
    try:
        from fakes.real_model import smollm2_gguf
    except ImportError:
        problem = "fakes.real_model is not installed"
    else:
        try:
            return smollm2_gguf()
        except FileNotFoundError as exc:
            problem = str(exc)
    if (override := os.environ.get(GGUF_ENV)) and Path(override).is_file():
        return Path(override)
    raise RuntimeError(f"no SmolLM2 GGUF: {problem}; or set {GGUF_ENV}")


def real_config(workdir: Path, binary: str, gguf: Path) -> dict[str, Any]:
    """Four names on one real model, 1 GiB each in a 3 GiB budget; every scheduler key at its default."""
    models = {}
    for client in MIX:
        name = client.kind.model
        embeds = ["--embeddings", "--pooling", "mean"] if client.embeddings else []
        models[name] = {"command": [binary], "model": str(gguf), "memory": MEMORY, "parallel": client.parallel,
                        "args": ["-c", str(4096 * client.parallel), "--alias", name, *embeds]}
    return {
        "listen": "127.0.0.1:0",
        "models": models,
        "gpu": {"probe": "host", "budget": BUDGET, "poll_interval": "0.5s"},
        "engines": {"stop_grace": "3s", "restart_backoff": "0.5s"},
        "state_file": str(workdir / "state.json"),
        "usage": {"db": str(workdir / "usage.db")},
        "auth": {"keys_file": str(workdir / "keys.json")},
    }


# ---- what the real runs measured ----------------------------------------------------------

@attrs.frozen
class Sizes:
    """One model's requests as its engine counted them: prompt and output tokens, min and max."""

    prompt: Range
    output: Range


def request_sizes(events: Path) -> dict[str, Sizes]:
    """Per model, the tokens of its completed requests, from steward's ``request`` events
    (an embeddings request's prompt tokens per input)."""
    inputs = {c.kind.model: c.kind.inputs for c in MIX if c.kind.inputs}
    seen: dict[str, tuple[list[float], list[float]]] = {}
    for record in read_event_log(events):
        if record["event"] != "request" or record.get("status") != 200 or not record.get("prompt_tokens"):
            continue
        model = str(record.get("model"))
        prompts, outputs = seen.setdefault(model, ([], []))
        prompts.append(record["prompt_tokens"] / inputs.get(model, 1))
        outputs.append(float(record.get("completion_tokens") or 0))
    return {model: Sizes(Range(min(p), max(p)), Range(min(o), max(o))) for model, (p, o) in seen.items()}


def served_rate(events: Path, klass: str) -> float | None:
    """Completion tokens per second after the queue (duration less queued), over the class's
    completed requests: what a client of the class got once it was served."""
    tokens = seconds = 0.0
    for record in read_event_log(events):
        if record["event"] == "request" and record.get("class") == klass and record.get("status") == 200:
            tokens += record.get("completion_tokens") or 0
            seconds += float(record["duration_s"]) - float(record.get("queued_s") or 0.0)
    return tokens / seconds if tokens and seconds > 0 else None


def longest_queue_wait(events: Path, klass: str) -> float | None:
    waits = [float(r["queued_s"]) for r in read_event_log(events)
             if r["event"] == "request" and r.get("class") == klass and r.get("queued_s") is not None]
    return max(waits, default=None)


def longest_lower_class_step(events: Path) -> float:
    """The longest background or batch step of the run (dispatch to complete), in seconds."""
    return max((float(r["duration_s"]) for r in read_event_log(events)
                if r["event"] == "complete" and r.get("class") != "interactive" and r.get("duration_s") is not None),
               default=0.0)


def documented_batch_bound(scheduler: SchedulerConfig, longest_step_s: float, load_s: float) -> float:
    """Batch's bound beside chats as the core's rule 4c states it: its starvation time, plus the
    longest lower-class step running when it is due divided by guard_share (a turn of background
    and the lane's rest after it), plus guard_gap_wait, plus its engine's load."""
    return (scheduler.batch_max_starvation + longest_step_s / scheduler.guard_share + scheduler.guard_gap_wait
            + load_s)


@attrs.frozen
class ClassFigures:
    """One class in one run, real or simulated (a mean over seeds)."""

    completed: float
    p50_s: float | None
    p95_s: float | None
    longest_wait_s: float | None = None
    tokens_per_s: float | None = None  # completion tokens per second after the queue

    def to_json(self) -> dict[str, Any]:
        return {k: _round(v) for k, v in attrs.asdict(self).items()}


def real_figures(report: LoadReport, events: Path, classes: Sequence[str]) -> dict[str, ClassFigures]:
    """Per class of *classes*, its figures in the run; the longest wait counts requests whose
    client left while they were queued (at the end of the run: as the simulator counts them)."""
    rows = report.by_class()
    return {klass: ClassFigures(rows[klass]["completed"], rows[klass]["p50_s"], rows[klass]["p95_s"],
                                longest_queue_wait(events, klass), served_rate(events, klass))
            for klass in classes}


# ---- the same mix in the simulator ----------------------------------------------------------

def mix_scenario(duration: float, calibration: Calibration, sizes: Mapping[str, Sizes],
                 stops: Mapping[str, float]) -> Scenario:
    """The mix as a scenario: the budget as the card, the calibration's figures, the real sizes."""
    engines = {}
    for client in MIX:
        name = client.kind.model
        figures = calibration.engines.get(name)
        if figures is None or figures.speed is None:
            raise RuntimeError(f"the calibration has no speed for {name}: calibrate the mix's engines "
                               f"(leave out --calibration, or give a state file of this mix)")
        engines[name] = EngineSpec(memory=MEMORY, speed=figures.speed, prompt_speed=figures.prompt_speed,
                                   slots=client.parallel, load_time=figures.load_time or 1.0,
                                   stop_time=stops.get(name, 0.5),
                                   prompt_context_cost=figures.prompt_context_cost or 0.0,
                                   decode_context_cost=figures.decode_context_cost or 0.0,
                                   embedding_speed=figures.embedding_speed)
    clients = {}
    for client in MIX:
        kind, name = client.kind, client.kind.model
        seen = sizes.get(name)
        prompt = seen.prompt if seen is not None else _assumed_prompt(kind)
        output = Range(0.0, 0.0) if kind.inputs else (seen.output if seen is not None else Range(*kind.max_tokens))
        clients[kind.name] = ClientSpec(model=name, klass=kind.klass, count=client.count,  # type: ignore[arg-type]
                                        think=Range(*kind.think_s), start=FIRST_ASK, prompt_tokens=prompt,
                                        output_tokens=output, inputs=kind.inputs or None,
                                        cached_prompt_tokens=0 if kind.inputs else TEMPLATE_PREFIX_TOKENS)
    sharing = SharingModel(alpha=calibration.alpha if calibration.alpha is not None else 1.0,
                           batching_gain=calibration.batching_gain if calibration.batching_gain is not None else 0.5,
                           prefill_alpha=calibration.prefill_alpha,
                           prefill_batching_gain=calibration.prefill_batching_gain)
    return Scenario(GpuSpec(BUDGET, sharing), engines, clients, name="real-mix", duration=duration,  # type: ignore[arg-type]
                    scheduler=SchedulerConfig(), classes=ClassesConfig(), calibration=calibration)


def _assumed_prompt(kind: ClientKind) -> Range:
    if kind.inputs:
        return Range(80.0, 80.0)  # supervisor/tools/loadtest_clients.py's embedding inputs
    repeats = kind.prompt_repeats or (2, 20)
    return Range(30.0 + PROMPT_TOKENS_PER_REPEAT * repeats[0], 30.0 + PROMPT_TOKENS_PER_REPEAT * repeats[1])


def simulated_figures(scenario: Scenario, seeds: Sequence[int]) -> dict[str, ClassFigures]:
    """steward's figures per class in the simulator, each the mean over *seeds*."""
    runs = [replay(attrs.evolve(scenario, seed=seed), make_policy("steward", scenario)) for seed in seeds]
    return {klass: _mean_figures([_figures_of(run, scenario, klass) for run in runs])
            for klass in scenario.present_classes()}


def _figures_of(outcome: Outcome, scenario: Scenario, klass: str) -> ClassFigures:
    stats = PolicyResult.of(outcome).classes[klass]
    waits = {w.arrival: w for w in outcome.waits if w.klass == klass}
    served = [r.latency - (waits[r.arrival].until - r.arrival) for r in outcome.records
              if r.klass == klass and r.latency is not None and r.arrival in waits]
    outputs = [c.output_tokens.mean for c in scenario.clients.values() if c.klass == klass and not c.embeddings]
    rate = statistics.fmean(outputs) * len(served) / sum(served) if outputs and served and sum(served) > 0 else None
    return ClassFigures(stats.completed, stats.p50_s, stats.p95_s, stats.wait_max_s, rate)


def _mean_figures(runs: list[ClassFigures]) -> ClassFigures:
    def mean(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.fmean(known) if known else None
    return ClassFigures(statistics.fmean(r.completed for r in runs), mean([r.p50_s for r in runs]),
                        mean([r.p95_s for r in runs]), mean([r.longest_wait_s for r in runs]),
                        mean([r.tokens_per_s for r in runs]))


# ---- the report -------------------------------------------------------------------------------

@attrs.frozen
class Check:
    verdict: Verdict
    what: str
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"verdict": self.verdict.value, "what": self.what, "detail": self.detail}


@attrs.frozen
class RealReport:
    duration_s: float
    seed: int
    seeds: tuple[int, ...]
    scenario: Scenario  # the simulated mix, its calibration included
    alone: LoadReport  # the real runs
    mix: LoadReport
    real: dict[str, ClassFigures]  # the mix's classes, real
    real_alone: ClassFigures  # the chats alone, real
    simulated: dict[str, ClassFigures]
    simulated_alone: ClassFigures
    batch_bound_s: float
    workdir: str | None = None

    @staticmethod
    def ratio(mix: ClassFigures | None, alone: ClassFigures) -> float | None:
        if mix is None or mix.p95_s is None or not alone.p95_s:
            return None
        return mix.p95_s / alone.p95_s

    def checks(self) -> list[Check]:
        checks = []
        chats = self.real.get("interactive")
        ratio = self.ratio(chats, self.real_alone)
        checks.append(Check(_verdict(ratio is not None and ratio <= ALONE_BOUND),
                            f"interactive p95 at most {ALONE_BOUND:g}x its alone run",
                            f"{_cell(chats.p95_s if chats else None)} s vs {_cell(self.real_alone.p95_s)} s "
                            f"({_times(ratio)})"))
        for klass in ("background", "batch"):
            done = self.real.get(klass)
            checks.append(Check(_verdict(done is not None and done.completed > 0), f"{klass} completes work",
                                f"{0 if done is None else int(done.completed)} completed"))
        batch = self.real.get("batch")
        wait = None if batch is None else batch.longest_wait_s
        checks.append(Check(_verdict(wait is not None and wait <= self.batch_bound_s),
                            "batch's longest wait within its bound",
                            f"{_cell(wait)} s vs {self.batch_bound_s:.2f} s (rule 4c: batch_max_starvation + "
                            f"the longest lower-class step / guard_share + guard_gap_wait + a load)"))
        for klass, real in self.real.items():
            simulated = self.simulated.get(klass)
            for figure in ("completed", "p95_s"):
                have, model = getattr(real, figure), None if simulated is None else getattr(simulated, figure)
                close = bool(have and model) and abs(model / have - 1) <= TOLERANCE
                label = "completions" if figure == "completed" else "e2e p95"
                checks.append(Check(_verdict(close), f"simulated {klass} {label} within ±{100 * TOLERANCE:g} % "
                                    f"of real", f"{_cell(model, '.1f' if figure == 'completed' else '.2f')} vs "
                                    f"{_cell(have, '.1f' if figure == 'completed' else '.2f')}"
                                    + (f" ({model / have:.2f}x)" if have and model else "")))
        return checks

    @property
    def passed(self) -> bool:
        return all(c.verdict is Verdict.PASS for c in self.checks())

    def to_json(self) -> dict[str, Any]:
        calibration = self.scenario.calibration
        sharing = self.scenario.gpu.sharing
        return {
            "scenario": "real", "duration_s": self.duration_s, "seed": self.seed, "simulated_seeds": list(self.seeds),
            "calibration": {"source": calibration.source if calibration else None, "alpha": sharing.alpha,
                            "batching_gain": sharing.batching_gain,
                            "engines": {name: {"speed": round(e.speed, 3), "prompt_speed": _round(e.prompt_speed),
                                               "load_s": round(e.load_time, 3), "stop_s": round(e.stop_time, 3)}
                                        for name, e in self.scenario.engines.items()}},
            "real": {"alone": {"interactive": self.real_alone.to_json()},
                     "mix": {k: v.to_json() for k, v in self.real.items()},
                     "ratio": _round(self.ratio(self.real.get("interactive"), self.real_alone))},
            "simulated": {"alone": {"interactive": self.simulated_alone.to_json()},
                          "mix": {k: v.to_json() for k, v in self.simulated.items()},
                          "ratio": _round(self.ratio(self.simulated.get("interactive"), self.simulated_alone))},
            "batch_bound_s": round(self.batch_bound_s, 3),
            "checks": [c.to_json() for c in self.checks()], "passed": self.passed,
            "loadtest": {"alone": self.alone.to_json(), "mix": self.mix.to_json()}, "workdir": self.workdir,
        }


def format_real_report(report: RealReport) -> str:
    """The mix's own table, then real and simulated side by side, then the verdicts."""
    sharing, scenario = report.scenario.gpu.sharing, report.scenario
    speeds = ", ".join(f"{name} {e.speed:.0f} tok/s" + (f" ({1 / (1 / e.speed + e.decode_context_cost * 1000):.0f} "
                                                         "after 1,000 tokens)" if e.decode_context_cost else "")
                       for name, e in scenario.engines.items())
    prompts = ("" if sharing.prefill_alpha is None and sharing.prefill_batching_gain is None else
               f"; prompts: alpha {_cell(sharing.prefill_alpha)}, batching gain {_cell(sharing.prefill_batching_gain)}")
    width = 24
    lines = [format_report(report.mix), "",
             f"issue 27's mix, {report.duration_s:g} s each run; simulated with this host's calibration "
             f"(alpha {sharing.alpha:.2f}, batching gain {sharing.batching_gain:.2f}{prompts}; {speeds}), mean of seeds "
             f"{format_seeds(list(report.seeds))}",
             f"{'':<{width}} {'real':>15} {'simulated':>15}"]

    def row(label: str, real: str, simulated: str) -> None:
        lines.append(f"{label:<{width}} {real:>15} {simulated:>15}")

    def pair(f: ClassFigures | None) -> str:
        return "-" if f is None else f"{_cell(f.p50_s)} / {_cell(f.p95_s)}"

    row("chats alone p50 / p95 s", pair(report.real_alone), pair(report.simulated_alone))
    row("  tokens/s served", _cell(report.real_alone.tokens_per_s, ".1f"),
        _cell(report.simulated_alone.tokens_per_s, ".1f"))
    for klass in RequestClass:
        real, simulated = report.real.get(klass), report.simulated.get(klass)
        if real is None and simulated is None:
            continue
        row(f"{klass} p50 / p95 s", pair(real), pair(simulated))
        row("  completed", _cell(real.completed if real else None, ".0f"),
            _cell(simulated.completed if simulated else None, ".1f"))
        if klass == "interactive":
            row("  tokens/s served", _cell(real.tokens_per_s if real else None, ".1f"),
                _cell(simulated.tokens_per_s if simulated else None, ".1f"))
            row("  p95 / alone p95", _times(report.ratio(real, report.real_alone)),
                _times(report.ratio(simulated, report.simulated_alone)))
        if klass == "batch":
            row("  longest wait s", _cell(real.longest_wait_s if real else None),
                _cell(simulated.longest_wait_s if simulated else None))
    lines += ["", "targets (issue 27)"]
    lines += [f"  {c.verdict.value}  {c.what}: {c.detail}" for c in report.checks()]
    if report.workdir:
        lines.append(f"its folder (configs, event logs, state file) kept: {report.workdir}")
    return "\n".join(lines)


def _verdict(ok: bool) -> Verdict:
    return Verdict.PASS if ok else Verdict.MISS


def _cell(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# ---- running it -------------------------------------------------------------------------------

def run_real_loadtest(duration: float = DEFAULT_DURATION, *, seed: int = 7, calibration: Path | None = None,
                      seeds: Sequence[int] = SIMULATED_SEEDS, keep: bool = False,
                      say: Callable[[str], None] | None = None) -> RealReport:
    """Calibrate (or take *calibration*), run the chats alone then the mix, replay it, compare.

    Raises:
        ValueError: *duration* is not positive.
        RuntimeError: no llama-server or SmolLM2, a calibration without the mix's engines, or
            a steward that could not be started.
    """
    from fakes.llama_binary import llama_server_path
    from supervisor.tools.calibrate import CalibrationError, calibrate

    if not duration > 0:
        raise ValueError(f"the duration must be positive, got {duration:g}")
    say = say or _say
    try:
        binary = str(llama_server_path())
    except FileNotFoundError as exc:
        raise RuntimeError(str(exc)) from None
    gguf = smollm2_path()
    with open_workdir("loadtest-real", keep=keep) as workdir:
        config = real_config(workdir, binary, gguf)
        state = Path(config["state_file"])
        if calibration is not None:
            shutil.copyfile(calibration, state)
            say(f"loadtest: the calibration in {calibration}")
        else:
            parsed = parse_config(config)
            say("loadtest: calibrating this host (steward calibrate) first")
            try:
                measured = trio.run(lambda: calibrate(parsed, list(parsed.models), say=say))
            except CalibrationError as exc:
                raise RuntimeError(f"calibration failed: {exc}") from None
            if measured.write_problem:
                raise RuntimeError(measured.write_problem)
        figures = Calibration.from_state_file(state)
        mix_scenario(duration, figures, {}, {})  # the calibration has every engine's figures, before the runs
        kinds = {client.kind: client.count for client in MIX}
        runs = {}
        for name, run_kinds in (("alone", {k: n for k, n in kinds.items() if k.klass == "interactive"}),
                                ("mix", kinds)):
            folder = workdir / name
            folder.mkdir()
            say(f"loadtest: the {'chats alone' if name == 'alone' else 'mix'}, {duration:g}s")
            runs[name] = run_on_own_steward(folder, config, run_kinds, duration, seed, keep=keep, say=say,
                                            drain=DRAIN_S, engines=ENGINES_IN_WORDS)
        events = workdir / "mix" / EVENTS_FILE
        stops = {name: m.stop_s for name, m in measured_engines(events).items() if m.stop_s is not None}
        scenario = mix_scenario(duration, figures, request_sizes(events), stops)
        real = real_figures(runs["mix"], events, scenario.present_classes())
        [alone] = real_figures(runs["alone"], workdir / "alone" / EVENTS_FILE, ["interactive"]).values()
        load_s = max((e.load_time for e in scenario.engines.values()), default=0.0)
        say(f"loadtest: replaying the mix in the simulator, seeds {format_seeds(list(seeds))}")
        return RealReport(duration, seed, tuple(seeds), scenario, runs["alone"], runs["mix"], real, alone,
                          simulated_figures(scenario, seeds),
                          simulated_figures(scenario.only("interactive"), seeds)["interactive"],
                          documented_batch_bound(SchedulerConfig(), longest_lower_class_step(events), load_s),
                          str(workdir) if keep else None)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)  # stderr: stdout may be the JSON report
