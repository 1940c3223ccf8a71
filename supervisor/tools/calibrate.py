"""``steward calibrate CONFIG [--engine NAME]``: measure this host instead of assuming it.

Each configured llama-server engine (or the one named) is started briefly, as steward
starts it (its adapter's command, supervisor/engines/process.py's child), and measured with a few
short greedy requests to its native ``/completion`` whose answers carry llama-server's own
``timings``:

- its load time, from spawn to a ready ``/health``;
- its speed alone: decode tokens/s (one slot) and prompt tokens/s;
- how it slows with context: one long prompt (about 1,000 tokens) against the short ones
  (about 250), its prompt and decode rates giving each token's added cost per token before it
  (measurements.ContextCost; a context too small for it: not measured);
- for an engine that also serves embeddings, its prompt tokens/s reading a batch of inputs
  through ``/v1/embeddings`` (no ``timings`` there: tokens over the request's time);
- two of its slots busy at once: their decode rates added up, and the batching gain
  ``two_slots / alone - 1`` (0: a second slot adds nothing, 1: it doubles the work done);
- two of its slots reading fresh prompts at once (one token out): the prefill batching gain,
  the same ratio of prompt tokens/s;
- two engines decoding at once (the first two measured, or one engine and a copy of it):
  each at ``alone / 2**alpha``, so ``alpha = log2(alone / together)`` (0: they do not slow
  each other, 1: an even split of the compute, more: they fight over it); and the same two
  reading prompts at once: the prefill alpha, from their prompt tokens/s.

Decoding is bound by memory, reading a prompt by compute, so the two share a host
differently (a 2-core host: two slots decoding did 1.5x the work of one, reading prompts
1x): supervisor/tools/simulate/sharing.py takes both.

The figures go to the config's ``state_file`` (supervisor/engines/measurements.py: per engine
under its measurement key, the host's under HOST_KEY), where the scheduler and ``steward
simulate`` read them; a table is printed and one ``calibrated`` event is logged. Every
process it starts is stopped on every path, Ctrl-C included. Each engine gets the threads
and CPUs steward gives it (engine_specs: supervisor/accounting/cpu_share.py), so the figures
are those of the engines as steward runs them; run it on an idle host.
"""

from __future__ import annotations

import collections
import functools
import math
import os
import secrets
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import trio

from supervisor.config import Config
from supervisor.config_policy import engine_specs
from supervisor.address import pick_port
from supervisor.engines.driver import placed_command
from supervisor.engines.spec import EngineSpec
from supervisor.observe.events import EventLog, EventLogUnavailable, open_event_log
from supervisor.apis import GENERATION, Api
from supervisor.engines.measurements import ContextCost, EngineSpeed, HostSharing, MeasurementStore, measurement_key
from supervisor.engines.process import ChildProcess, SpawnError, open_child, pump_lines, stop_child

# The requests: short and greedy, a fresh prompt each (no prompt cache reused), a fixed
# number of tokens out whatever the model would say (ignore_eos).
DECODE_TOKENS = 64
PROMPT_REPEATS = 80  # "measure this " x 80: about 250 prompt tokens, enough to time the prompt
DEEP_REPEATS = 330  # about 1,000 prompt tokens: how each token's cost grows with the context
DEEP_CONTEXT_SHARE = 0.8  # of a slot's context at most (llama-server's /props), its decode included
EMBEDDING_INPUTS = 8
EMBEDDING_REPEATS = 25  # per input: about 80 tokens, an embeddings client's paragraph
# Reading prompts: one token out, sampled from the prompt's own logits, so no decode step
# adds to the time both prompts take (and the run stays short: a second or two per engine).
PROMPT_READ_TOKENS = 1
ALONE_REQUESTS = 2  # after one warm-up request
REQUEST_TIMEOUT_S = 120.0
OUTPUT_TAIL_LINES = 20


class CalibrationError(Exception):
    """An engine could not be measured (it did not start, or did not answer as llama-server does)."""


# ---- the arithmetic ---------------------------------------------------------------------

@attrs.frozen
class Timing:
    """One answer's llama-server ``timings``: tokens and milliseconds of its prompt and its decode."""

    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float

    @classmethod
    def of(cls, answer: Mapping[str, Any]) -> Timing | None:
        timings = answer.get("timings")
        if not isinstance(timings, dict):
            return None
        try:
            return cls(int(timings["prompt_n"]), float(timings["prompt_ms"]), int(timings["predicted_n"]),
                       float(timings["predicted_ms"]))
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def decode_tps(self) -> float | None:
        return self.predicted_n / self.predicted_ms * 1000 if self.predicted_n and self.predicted_ms > 0 else None

    @property
    def prompt_tps(self) -> float | None:
        return self.prompt_n / self.prompt_ms * 1000 if self.prompt_n and self.prompt_ms > 0 else None


def decode_rate(timings: Sequence[Timing]) -> float | None:
    """Tokens decoded per second over *timings* together (their tokens over their time)."""
    tokens, ms = sum(t.predicted_n for t in timings), sum(t.predicted_ms for t in timings)
    return tokens / ms * 1000 if tokens and ms > 0 else None


def prompt_rate(timings: Sequence[Timing]) -> float | None:
    tokens, ms = sum(t.prompt_n for t in timings), sum(t.prompt_ms for t in timings)
    return tokens / ms * 1000 if tokens and ms > 0 else None


def prompts_at_once_rate(timings: Sequence[Timing], span_ms: float) -> float | None:
    """Prompt tokens/s of one engine's slots reading prompts sent at the same moment: all their
    tokens over the time it took to read them all.

    That time is the longer of their ``prompt_ms`` when they were read in the same batches
    (each prompt_ms then covers both reads). But llama-server takes up a prompt that arrives
    while it computes another's batch only after that batch, and then each prompt_ms is one
    prompt read alone (llama-server 0.3.36 with two threads, two prompts sent together: queued
    in two tries of four): the longer prompt_ms would double the rate. *span_ms*, from sending
    them to the last answer, covers both cases (and a few milliseconds of HTTP); the longest
    prompt_ms still bounds it, for timings that were not slept (the fake llama-server's).
    """
    tokens = sum(t.prompt_n for t in timings)
    ms = max([span_ms, *(t.prompt_ms for t in timings)])
    return tokens / ms * 1000 if tokens and ms > 0 else None


def context_cost(short: Sequence[Timing], deep: Timing) -> ContextCost | None:
    """Each token's added seconds per token of context (measurements.ContextCost), from the
    short requests' rates and one long prompt's: a prompt of n tokens is read at a mean cost
    of ``1/p0 + prompt_s * n/2`` per token, a token decoded at context c costs
    ``1/d0 + decode_s * c``. None: the long prompt was not much longer (a context cut short).
    A rate that did not fall (noise) counts as no cost."""
    prompt_n = statistics.fmean(t.prompt_n for t in short)
    decode_at = statistics.fmean(t.prompt_n + t.predicted_n / 2 for t in short)
    short_prompt, short_decode = prompt_rate(short), decode_rate(short)
    if deep.prompt_n < 2 * prompt_n or None in (short_prompt, short_decode, deep.prompt_tps, deep.decode_tps):
        return None
    assert short_prompt and short_decode and deep.prompt_tps and deep.decode_tps
    prompt_s = 2 * (1 / deep.prompt_tps - 1 / short_prompt) / (deep.prompt_n - prompt_n)
    decode_s = (1 / deep.decode_tps - 1 / short_decode) / (deep.prompt_n + deep.predicted_n / 2 - decode_at)
    return ContextCost(max(prompt_s, 0.0), max(decode_s, 0.0), prompt_n, decode_at)


def batching_gain(alone_tps: float, two_slots_tps: float) -> float:
    """Two busy slots do ``1 + gain`` times the work of one (supervisor/tools/simulate/sharing.py), in [0, 1]."""
    return min(max(two_slots_tps / alone_tps - 1, 0.0), 1.0)


def sharing_alpha(alone_tps: float, together_tps: float) -> float:
    """Two engines at once each run at ``alone / 2**alpha``: ``alpha = log2(alone / together)``, at least 0."""
    return max(math.log2(alone_tps / together_tps), 0.0)


# ---- what was measured ------------------------------------------------------------------

@attrs.frozen
class EngineCalibration:
    name: str
    key: str  # its measurement key in the state file
    load_s: float
    speed: EngineSpeed
    slots: int

    @property
    def batching_gain(self) -> float | None:
        two = self.speed.two_slots_tps
        return None if two is None else batching_gain(self.speed.decode_tps, two)

    @property
    def decode_tps_deep(self) -> float | None:
        """Its decode rate alone with 1,000 tokens before each (None: the context cost was not measured)."""
        return None if self.speed.context_cost is None else self.speed.decode_tps_at(1000)

    @property
    def prefill_batching_gain(self) -> float | None:
        """Two slots reading prompts at once against one (None: one slot, or no prompt figure)."""
        alone, two = self.speed.prompt_tps, self.speed.two_slots_prompt_tps
        return None if alone is None or two is None else batching_gain(alone, two)


@attrs.frozen
class PairCalibration:
    """Two engines decoding at once: their names, their decode rates alone and together; and
    reading prompts at once: their prompt rates alone and together (None: not measured)."""

    names: tuple[str, str]
    alone_tps: tuple[float, float]
    together_tps: tuple[float, float]
    copy: bool = False  # the second is a copy of the first (one engine calibrated)
    alone_prompt_tps: tuple[float, float] | None = None
    together_prompt_tps: tuple[float, float] | None = None

    @property
    def alpha(self) -> float:
        return _mean_alpha(self.alone_tps, self.together_tps)

    @property
    def prefill_alpha(self) -> float | None:
        if self.alone_prompt_tps is None or self.together_prompt_tps is None:
            return None
        return _mean_alpha(self.alone_prompt_tps, self.together_prompt_tps)


def _mean_alpha(alone: tuple[float, float], together: tuple[float, float]) -> float:
    return statistics.fmean(sharing_alpha(a, t) for a, t in zip(alone, together, strict=True))


@attrs.frozen
class Calibration:
    engines: tuple[EngineCalibration, ...]
    pair: PairCalibration | None  # None: it could not be measured (no engine answered)
    cores: int
    duration_s: float
    state_file: str | None
    notes: tuple[str, ...] = ()  # what was not measured, and why
    write_problem: str | None = None  # the state file could not be written

    @property
    def batching_gain(self) -> float | None:
        return _mean([e.batching_gain for e in self.engines])

    @property
    def prefill_batching_gain(self) -> float | None:
        return _mean([e.prefill_batching_gain for e in self.engines])

    def sharing(self, kept: HostSharing | None = None) -> HostSharing | None:
        """The host's figures. A gain not measured now (every engine has one slot) is the one
        kept, else 0 for decoding and None for prompts (the simulator then takes decoding's);
        a prefill alpha not measured now is the one kept, as the state file keeps it."""
        if self.pair is None:
            return None
        gain, prefill_alpha, prefill_gain = self.batching_gain, self.pair.prefill_alpha, self.prefill_batching_gain
        if kept is not None:
            gain = kept.batching_gain if gain is None else gain
            prefill_alpha = kept.prefill_alpha if prefill_alpha is None else prefill_alpha
            prefill_gain = kept.prefill_batching_gain if prefill_gain is None else prefill_gain
        return HostSharing(self.pair.alpha, 0.0 if gain is None else gain, self.cores, prefill_alpha, prefill_gain)

    def to_json(self) -> dict[str, Any]:
        sharing = self.sharing()
        return {"engines": {e.name: {"load_s": round(e.load_s, 3), **e.speed.figures(), "slots": e.slots,
                                     "batching_gain": _round(e.batching_gain),
                                     "prefill_batching_gain": _round(e.prefill_batching_gain)}
                            for e in self.engines},
                "pair": None if self.pair is None else
                {"engines": list(self.pair.names), "copy": self.pair.copy,
                 "alone_tps": _rounded(self.pair.alone_tps), "together_tps": _rounded(self.pair.together_tps),
                 "alone_prompt_tps": _rounded(self.pair.alone_prompt_tps),
                 "together_prompt_tps": _rounded(self.pair.together_prompt_tps)},
                "alpha": None if sharing is None else round(sharing.alpha, 3),
                "batching_gain": None if sharing is None else round(sharing.batching_gain, 3),
                "prefill_alpha": None if sharing is None else _round(sharing.prefill_alpha),
                "prefill_batching_gain": None if sharing is None else _round(sharing.prefill_batching_gain),
                "cores": self.cores, "duration_s": round(self.duration_s, 3), "state_file": self.state_file,
                "notes": list(self.notes), "write_problem": self.write_problem}


def format_calibration(calibration: Calibration) -> str:
    # Decoding's figures, then reading prompts': alone, two slots at once, the gain.
    lines = [f"{'engine':<16} {'load':>7} {'decode tok/s':>12} {'2 slots tok/s':>13} {'gain':>5} "
             f"{'prompt tok/s':>12} {'2 slots prompt tok/s':>20} {'gain':>5} "
             f"{'decode at 1k context':>20} {'embed tok/s':>11}"]
    for e in calibration.engines:
        lines.append(f"{e.name:<16} {e.load_s:>6.2f}s {e.speed.decode_tps:>12.1f} {_cell(e.speed.two_slots_tps):>13} "
                     f"{_cell(e.batching_gain, '.2f'):>5} {_cell(e.speed.prompt_tps):>12} "
                     f"{_cell(e.speed.two_slots_prompt_tps):>20} {_cell(e.prefill_batching_gain, '.2f'):>5} "
                     f"{_cell(e.decode_tps_deep):>20} {_cell(e.speed.embedding_tps):>11}")
    if (pair := calibration.pair) is not None:
        second = f"{pair.names[1]} (a copy)" if pair.copy else pair.names[1]
        lines.append(f"two engines at once ({pair.names[0]} + {second}): "
                     f"{pair.together_tps[0]:.1f} / {pair.together_tps[1]:.1f} tok/s, alone "
                     f"{pair.alone_tps[0]:.1f} / {pair.alone_tps[1]:.1f}: alpha {pair.alpha:.2f}")
        if pair.alone_prompt_tps is None or pair.together_prompt_tps is None:
            lines.append("  reading prompts at once: not measured")
        else:
            lines.append(f"  reading prompts at once: {pair.together_prompt_tps[0]:.1f} / "
                         f"{pair.together_prompt_tps[1]:.1f} tok/s, alone {pair.alone_prompt_tps[0]:.1f} / "
                         f"{pair.alone_prompt_tps[1]:.1f}: prefill alpha {pair.prefill_alpha:.2f}")
    sharing = calibration.sharing()
    if sharing is not None:
        lines.append(f"host: {sharing.cores} cores; decode: alpha {sharing.alpha:.2f}, batching gain "
                     f"{sharing.batching_gain:.2f}; prompts: alpha {_cell(sharing.prefill_alpha, '.2f')}, "
                     f"batching gain {_cell(sharing.prefill_batching_gain, '.2f')} (the simulator's "
                     "assumptions: 1.0 and 0.5, the same for prompts)")
    lines.extend(f"note: {note}" for note in calibration.notes)
    took = f"took {calibration.duration_s:.1f}s"
    if calibration.write_problem:
        lines.append(f"NOT written: {calibration.write_problem} ({took})")
    elif calibration.state_file:
        lines.append(f"written to {calibration.state_file} ({took})")
    else:
        lines.append(f"not kept: the config has no state_file ({took})")
    return "\n".join(lines)


def _cell(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _rounded(values: tuple[float, ...] | None) -> list[float] | None:
    return None if values is None else [round(v, 3) for v in values]


def _mean(values: Sequence[float | None]) -> float | None:
    """The mean of the figures measured (None: none was)."""
    measured = [v for v in values if v is not None]
    return statistics.fmean(measured) if measured else None


# ---- running engines --------------------------------------------------------------------

@attrs.define(eq=False)
class RunningEngine:
    name: str
    url: str
    slots: int
    load_s: float
    embeddings: bool = False  # it serves /v1/embeddings too


def calibrated_engines(config: Config, only: str | None = None) -> list[str]:
    """The engines calibrate measures: the llama-server models steward starts itself, or *only*.

    Raises:
        CalibrationError: *only* is no such engine, or none can be calibrated.
    """
    runnable = [name for name, model in config.models.items()
                if model.runtime == "llama-server" and model.upstream is None and model.command]
    if only is not None:
        if only not in runnable:
            kind = "not a llama-server model steward starts" if only in config.models else "not in models"
            raise CalibrationError(f"--engine {only}: {kind} (calibrate measures {', '.join(runnable) or 'none'})")
        return [only]
    if not runnable:
        raise CalibrationError("the config has no llama-server model that steward starts: nothing to calibrate")
    return runnable


@asynccontextmanager
async def running_engine(spec: EngineSpec, http: httpx.AsyncClient,
                         nursery: trio.Nursery) -> AsyncIterator[RunningEngine]:
    """One process of *spec*, ready, as steward would start it (its command, devices, threads and
    CPUs); stopped when the block ends, however it ends. Its output is drained in *nursery*
    until the process has gone."""
    port = pick_port(spec.host)
    command = spec.command(port)
    assert command is not None  # a llama-server model steward starts has one
    argv, env = placed_command(spec, command, None)
    tail: collections.deque[str] = collections.deque(maxlen=OUTPUT_TAIL_LINES)
    started = time.monotonic()
    try:
        # Its threads (in its command) and CPUs as steward would give them (engine_specs: cpu_share.py).
        process = open_child(argv, env, cpus=None if spec.cpus is None else spec.cpus.cpus)
    except SpawnError as exc:
        raise CalibrationError(f"{spec.name}: {exc}") from None
    nursery.start_soon(_drain, process, tail.append)
    try:
        url = f"http://{spec.host}:{port}"
        with trio.move_on_after(spec.start_timeout) as waiting:
            while not await spec.runtime.is_ready(http, url):  # type: ignore[attr-defined]
                if process.returncode is not None:
                    raise CalibrationError(f"{spec.name}: exited before it was ready; last output: "
                                           + " | ".join(list(tail)[-5:]))
                await trio.sleep(spec.health_interval)
        if waiting.cancelled_caught:
            raise CalibrationError(f"{spec.name}: not ready within engines.start_timeout ({spec.start_timeout:g}s)")
        yield RunningEngine(spec.name, url, spec.slots, time.monotonic() - started,
                            Api.EMBEDDINGS in spec.runtime.apis and bool(spec.runtime.apis & GENERATION))
    finally:
        with trio.CancelScope(shield=True):
            await stop_child(process, spec.stop_grace)


async def _drain(process: ChildProcess, on_line: Callable[[str], None]) -> None:
    try:
        await pump_lines(process.output, on_line)
    finally:
        await process.output.aclose()


async def timed_completion(http: httpx.AsyncClient, engine: RunningEngine, *, repeats: int = PROMPT_REPEATS,
                           tokens: int = DECODE_TOKENS, prompt_only: bool = False) -> Timing:
    """One greedy ``/completion`` of a fresh prompt, *tokens* out; its timings, which must time
    its decode (*prompt_only*: its prompt; one token out is not a decode to time)."""
    prompt = f"{secrets.token_hex(4)} " + "measure this " * repeats
    body = {"prompt": prompt, "n_predict": tokens, "temperature": 0, "ignore_eos": True, "cache_prompt": False}
    try:
        response = await http.post(f"{engine.url}/completion", json=body, timeout=REQUEST_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise CalibrationError(f"{engine.name}: /completion failed: {exc or type(exc).__name__}") from None
    if response.status_code != 200:
        raise CalibrationError(f"{engine.name}: /completion answered {response.status_code}: {response.text[:200]}")
    try:
        timing = Timing.of(response.json())
    except ValueError:
        timing = None
    if timing is None or (timing.prompt_tps if prompt_only else timing.decode_tps) is None:
        raise CalibrationError(f"{engine.name}: its answer has no usable timings (not llama-server?)")
    return timing


async def deep_repeats(http: httpx.AsyncClient, engine: RunningEngine, short_tokens: int) -> int:
    """How many repeats the long prompt has: DEEP_REPEATS, fewer where a slot's context (its
    ``/props``; the model's tokenizer may cut the prompt into more tokens) would not hold it."""
    try:
        props = (await http.get(f"{engine.url}/props", timeout=REQUEST_TIMEOUT_S)).json()
        slot_context = int(props["default_generation_settings"]["n_ctx"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return DEEP_REPEATS  # not said: the long prompt is tried as it is
    per_repeat = max(short_tokens, 1) / PROMPT_REPEATS
    return min(DEEP_REPEATS, int((DEEP_CONTEXT_SHARE * slot_context - DECODE_TOKENS) / per_repeat))


async def embedding_rate(http: httpx.AsyncClient, engine: RunningEngine) -> float:
    """Prompt tokens per second of one ``/v1/embeddings`` request of fresh inputs: the usage's
    tokens over the request's time (llama-server sends no timings there)."""
    inputs = [f"{secrets.token_hex(4)} " + "measure this " * EMBEDDING_REPEATS for _ in range(EMBEDDING_INPUTS)]
    started = time.monotonic()
    try:
        response = await http.post(f"{engine.url}/v1/embeddings", json={"input": inputs}, timeout=REQUEST_TIMEOUT_S)
        took = time.monotonic() - started
        tokens = response.json()["usage"]["prompt_tokens"] if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise CalibrationError(f"{engine.name}: /v1/embeddings failed: {exc or type(exc).__name__}") from None
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens <= 0 or took <= 0:
        raise CalibrationError(f"{engine.name}: /v1/embeddings answered {response.status_code} "
                               f"without a token count: {response.text[:200]}")
    return tokens / took


async def at_once(*calls: Callable[[], Awaitable[Timing]]) -> list[Timing]:
    """Run *calls* concurrently; their results in order, or the first one's CalibrationError."""
    results: list[Timing | CalibrationError | None] = [None] * len(calls)

    async def one(index: int) -> None:
        try:
            results[index] = await calls[index]()
        except CalibrationError as exc:
            results[index] = exc

    async with trio.open_nursery() as nursery:
        for index in range(len(calls)):
            nursery.start_soon(one, index)
    if failed := [r for r in results if isinstance(r, CalibrationError)]:
        raise failed[0]
    return [r for r in results if isinstance(r, Timing)]


async def prompts_at_once(http: httpx.AsyncClient, *engines: RunningEngine) -> tuple[list[Timing], float]:
    """Each of *engines* (the same one twice: two of its slots) sent a long fresh prompt at the
    same moment, one token out: their timings, and the milliseconds from sending them to the
    last answer."""
    started = time.monotonic()
    timings = await at_once(*(functools.partial(timed_completion, http, engine, tokens=PROMPT_READ_TOKENS,
                                                prompt_only=True) for engine in engines))
    return timings, (time.monotonic() - started) * 1000


async def measure_alone(http: httpx.AsyncClient, engine: RunningEngine, key: str) -> EngineCalibration:
    await timed_completion(http, engine, repeats=4, tokens=8)  # warm-up: first answers are slower
    alone = [await timed_completion(http, engine) for _ in range(ALONE_REQUESTS)]
    decode = decode_rate(alone)
    assert decode is not None  # timed_completion checked every answer decoded
    two_slots = two_slots_prompt = None
    if engine.slots >= 2:
        pair = await at_once(*[functools.partial(timed_completion, http, engine, repeats=4)] * 2)
        rates = [t.decode_tps for t in pair]
        two_slots = sum(r for r in rates if r is not None)
        two_slots_prompt = prompts_at_once_rate(*await prompts_at_once(http, engine, engine))
    repeats = await deep_repeats(http, engine, alone[0].prompt_n)
    deep = None  # a slot's context too small for a long prompt: the cost stays unmeasured
    if repeats >= 2 * PROMPT_REPEATS:
        deep = context_cost(alone, await timed_completion(http, engine, repeats=repeats))
    embedding = await embedding_rate(http, engine) if engine.embeddings else None
    speed = EngineSpeed(decode, prompt_rate(alone), two_slots, two_slots_prompt, deep, embedding)
    return EngineCalibration(engine.name, key, engine.load_s, speed, engine.slots)


async def measure_pair(http: httpx.AsyncClient, specs: Sequence[EngineSpec], alone: Sequence[EngineCalibration],
                       nursery: trio.Nursery) -> PairCalibration:
    """The first two engines decoding at once, then reading prompts at once (one engine: it
    and a copy of it)."""
    copy = len(specs) == 1
    first, second = (specs[0], specs[0]) if copy else (specs[0], specs[1])
    async with running_engine(first, http, nursery) as a, running_engine(second, http, nursery) as b:
        await at_once(functools.partial(timed_completion, http, a, repeats=4, tokens=8),
                      functools.partial(timed_completion, http, b, repeats=4, tokens=8))
        together = await at_once(functools.partial(timed_completion, http, a, repeats=4),
                                 functools.partial(timed_completion, http, b, repeats=4))
        # Two processes: each prompt_ms is its own read, slowed only by the other's.
        reading, _ = await prompts_at_once(http, a, b)
    speeds = (alone[0].speed, alone[0 if copy else 1].speed)
    rates = tuple(t.decode_tps for t in together)  # every one decoded: timed_completion checked
    return PairCalibration((first.name, second.name), (speeds[0].decode_tps, speeds[1].decode_tps),
                           rates, copy,  # type: ignore[arg-type]
                           _both(s.prompt_tps for s in speeds), _both(t.prompt_tps for t in reading))


def _both(values: Iterable[float | None]) -> tuple[float, float] | None:
    """The two engines' figures, or None when either is missing."""
    first, second = values
    return None if first is None or second is None else (first, second)


async def calibrate(config: Config, names: Sequence[str], *, say: Callable[[str], None],
                    events: EventLog | None = None) -> Calibration:
    """Measure *names* (calibrated_engines), keep the figures in the state file, log ``calibrated``."""
    started = time.monotonic()
    specs = engine_specs(config)
    store = MeasurementStore.open(config.state_file)
    measured: list[EngineCalibration] = []
    notes: list[str] = []
    async with httpx.AsyncClient() as http, trio.open_nursery() as outputs:
        for name in names:
            say(f"calibrate: {name}: starting it")
            try:
                async with running_engine(specs[name], http, outputs) as engine:
                    say(f"calibrate: {name}: ready in {engine.load_s:.2f}s; measuring")
                    measured.append(await measure_alone(http, engine, measurement_key(config.models[name])))
            except CalibrationError as exc:
                notes.append(f"{exc}; not measured")
                say(f"calibrate: {exc}")
        pair = None
        if measured:
            pair_specs = [specs[e.name] for e in measured[:2]]
            say(f"calibrate: two engines at once: {' + '.join(s.name for s in pair_specs)}"
                + (" and a copy" if len(pair_specs) == 1 else ""))
            try:
                pair = await measure_pair(http, pair_specs, measured[:2], outputs)
            except CalibrationError as exc:
                notes.append(f"two engines at once: {exc}; alpha and prefill alpha not measured")
    problems = [store.record_speed(e.key, e.name, e.speed) for e in measured]
    problems += [store.record_load_time(e.key, e.name, e.load_s) for e in measured]
    calibration = Calibration(tuple(measured), pair, _cores(), time.monotonic() - started, config.state_file,
                              tuple(notes))
    if (sharing := calibration.sharing(store.sharing())) is not None:
        problems.append(store.record_sharing(sharing))
    calibration = attrs.evolve(calibration, write_problem=next((p for p in problems if p), None))
    if events is not None:
        figures = calibration.to_json()
        events.emit("calibrated", "info" if measured else "warning", engines=figures["engines"],
                    pair=figures["pair"], alpha=figures["alpha"], batching_gain=figures["batching_gain"],
                    prefill_alpha=figures["prefill_alpha"], prefill_batching_gain=figures["prefill_batching_gain"],
                    cores=calibration.cores, duration_s=figures["duration_s"], state_file=config.state_file,
                    notes=list(notes), write_problem=calibration.write_problem)
    return calibration


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def run_calibrate(config: Config, only: str | None = None, *,
                  say: Callable[[str], None] | None = None) -> Calibration:
    """``steward calibrate``: the engines measured, with the config's event log open for ``calibrated``.

    Raises:
        CalibrationError: nothing to calibrate, or no such engine.
        EventLogUnavailable: the config's log file cannot be opened.
    """
    names = calibrated_engines(config, only)
    say = say or _say

    async def main() -> Calibration:
        log, writer = open_event_log(config.log.file, terminal_level="warning", max_size=config.log.max_size,
                                     keep=config.log.keep)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer.serve)
                try:
                    return await calibrate(config, names, say=say, events=log)
                finally:
                    log.close()
        finally:
            writer.close()

    return trio.run(main)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


__all__ = ["Calibration", "CalibrationError", "EngineCalibration", "EventLogUnavailable", "PairCalibration",
           "Timing", "batching_gain", "calibrate", "calibrated_engines", "decode_rate", "format_calibration",
           "context_cost", "prompt_rate", "prompts_at_once_rate", "run_calibrate", "sharing_alpha"]
