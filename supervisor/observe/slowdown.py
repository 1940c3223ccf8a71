"""How much slower an answer came than its engine decodes alone, and what computed beside it.

Issue 27 found interactive answers 9–17× slower than alone while every health figure said
"wait 0": the loss was all in compute shared with lower-class steps already running. So each
answer is measured:

- its **decode rate**: the engine's own figure where it gives one (llama-server's ``timings``,
  streamed or not: ``predicted_n`` over ``predicted_ms``, the time after the first token, as
  ``steward calibrate`` measures the speed alone), else the completion tokens after the first
  over the time from a stream's first byte to its last, as the door saw them;
- its **slowdown**: the engine's speed alone over that rate (None: the speed alone is not
  known yet, or fewer than ``MIN_TOKENS`` tokens tell nothing). The speed alone is the one at
  the answer's own context where calibrate measured how the engine slows with context
  (measurements.ContextCost): an agent decoding after a 1,500-token prompt is not slowed by
  its own prompt (SmolLM2 on 2 cores: 34 tokens/s there alone against 57 after a short one);
- **what computed beside it**: the other steps that ran while it decoded, on engines that
  share its compute (the same device, or the host when a device is not known), and a
  second slot of its own engine. ``ComputeCompany`` keeps the steps' spans from the
  scheduler's ``dispatch`` and ``complete`` events.

An answer that decoded with nothing beside it is a measurement of the engine's speed alone:
``SpeedBook`` keeps it, smoothed, and writes it to the state file (``steward calibrate``
seeds it), so steward learns the figure from real traffic without a calibration.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping

import attrs

from supervisor.observe.events import Event
from supervisor.engines.measurements import EngineSpeed, MeasurementStore

MIN_TOKENS = 8  # fewer tokens timed than this tell nothing about the decode rate
LEARNING_WEIGHT = 0.2  # of a new alone figure in the kept one (an exponential average)
REWRITE_CHANGE = 0.1  # the kept figure is written to the state file again once it moved this share
SPANS_KEPT_S = 900.0  # ended steps are kept this long: the longest answer whose company is asked
SPANS_KEPT = 100_000  # and at most this many


def decode_rate(tokens: int | None, seconds: float | None) -> float | None:
    """Tokens per second: the *tokens* decoded in *seconds* (both counted after the first token);
    None with fewer than MIN_TOKENS tokens or no time to tell."""
    if tokens is None or seconds is None or tokens < MIN_TOKENS or seconds <= 0:
        return None
    return tokens / seconds


def slowdown(alone_tps: float | None, observed_tps: float | None) -> float | None:
    """How many times slower than alone: the speed alone over the observed decode rate."""
    if not alone_tps or not observed_tps or alone_tps <= 0 or observed_tps <= 0:
        return None
    return round(alone_tps / observed_tps, 3)


def format_factor(factor: float) -> str:
    """A slowdown as one says it: ``1.2×``, ``17×``."""
    return f"{factor:.1f}×" if factor < 9.95 else f"{factor:.0f}×"


@attrs.frozen
class Companion:
    """A step that computed beside an answer: its engine and class."""

    engine: str
    klass: str

    def label(self) -> str:
        return f"{self.engine} ({self.klass})"


@attrs.define
class StepSpan:
    engine: str
    klass: str
    start: float
    end: float | None = None  # None: still running

    def overlaps(self, start: float, end: float) -> bool:
        return self.start < end and (self.end is None or self.end > start)


@attrs.define(eq=False)
class ComputeCompany:
    """Which steps computed when, on which devices: from the scheduler's events (``dispatch``,
    ``complete``; ``load``/``restart``/``wake`` say where each engine is placed)."""

    keep_s: float = SPANS_KEPT_S
    running: dict[object, StepSpan] = attrs.Factory(dict)  # job id -> its span
    # In the order they ended (so an answer reads only those that ended while it decoded).
    ended: collections.deque[StepSpan] = attrs.Factory(lambda: collections.deque(maxlen=SPANS_KEPT))
    devices: dict[str, frozenset[int]] = attrs.Factory(dict)  # engine -> where it was placed last

    def observe(self, event: Event) -> None:
        f = event.fields
        match event.name:
            case "dispatch" if f.get("model") is not None:  # exclusive (image) jobs have no engine
                self.running[f["job"]] = StepSpan(str(f["model"]), str(f["class"]), event.mono)
            case "complete":
                if (span := self.running.pop(f.get("job"), None)) is not None:
                    span.end = event.mono
                    self.ended.append(span)
                self._age(event.mono)
            case "load" | "restart" | "wake":
                self.devices[str(f["engine"])] = frozenset(f.get("devices") or ())

    def shares(self, engine: str, other: str) -> bool:
        """Whether two engines compute on the same thing: a device in common, or the host (a
        device not known counts as shared: steward would rather say too much than too little)."""
        mine, theirs = self.devices.get(engine), self.devices.get(other)
        return engine == other or not mine or not theirs or bool(mine & theirs)

    def beside(self, engine: str, klass: str | None, start: float, end: float) -> tuple[Companion, ...] | None:
        """What computed beside an answer of *engine* and *klass* that decoded from *start* to
        *end*: a companion per other step that overlapped it there (its own step is one of
        *engine*'s of its class); None when steward saw no such step then (nothing to say)."""
        own = 0
        others: list[Companion] = []
        for span in [*self.running.values(), *self._ended_after(start)]:
            if not span.overlaps(start, end) or not self.shares(engine, span.engine):
                continue
            if span.engine == engine and span.klass == klass and own == 0:
                own = 1  # its own step (or one just like it: which one does not matter)
                continue
            others.append(Companion(span.engine, span.klass))
        return tuple(sorted(others, key=lambda c: (c.engine, c.klass))) if own else None

    def _ended_after(self, moment: float) -> list[StepSpan]:
        """The ended steps that ended after *moment*: the newest, however many ended before."""
        spans = []
        for span in reversed(self.ended):
            if span.end is not None and span.end <= moment:
                break
            spans.append(span)
        return spans

    def _age(self, now: float) -> None:
        while self.ended and self.ended[0].end is not None and self.ended[0].end < now - self.keep_s:
            self.ended.popleft()


@attrs.define(eq=False)
class SpeedBook:
    """Each engine's decode speed alone: calibrated (the state file), and learned from answers
    that decoded with nothing beside them, smoothed. Where a figure is kept is the engine's
    measurement key (supervisor/engines/measurements.py), which a reload may change (``keys``)."""

    store: MeasurementStore
    keys: Callable[[], Mapping[str, str]]  # engine -> its measurement key now
    on_write_failed: Callable[[str], None] = lambda problem: None
    _learned: dict[str, float] = attrs.Factory(dict)  # key -> the smoothed figure

    def alone(self, engine: str, context: float | None = None) -> float | None:
        """*engine*'s decode tokens/s alone: at *context* tokens of context where its context cost
        is known, else as measured (at the calibration's context)."""
        key = self.keys().get(engine)
        if key is None:
            return None
        kept = self.store.speed(key)
        figure = self._learned.get(key, kept.decode_tps if kept is not None else None)
        if figure is None or context is None or kept is None or kept.context_cost is None:
            return figure
        return EngineSpeed(figure, context_cost=kept.context_cost).decode_tps_at(context)

    def learn(self, engine: str, tps: float, context: float | None = None) -> float | None:
        """An answer of *engine* decoded at *tps* with nothing beside it, at *context* tokens of
        context: the figure alone now (at the calibration's context, where its cost is known)."""
        key = self.keys().get(engine)
        if key is None or tps <= 0:
            return None
        cost = kept.context_cost if (kept := self.store.speed(key)) is not None else None
        if cost is not None and context is not None:  # what it would have decoded at the calibration's context
            tps = cost.decode_tps_moved(tps, context, cost.decode_context)
        known = self.alone(engine)
        figure = tps if known is None else known + LEARNING_WEIGHT * (tps - known)
        self._learned[key] = figure
        kept = self.store.speed(key)
        if kept is None or abs(figure - kept.decode_tps) > kept.decode_tps * REWRITE_CHANGE:
            previous = kept if kept is not None else EngineSpeed(figure)
            problem = self.store.record_speed(key, engine, attrs.evolve(previous, decode_tps=round(figure, 3)))
            if problem is not None:
                self.on_write_failed(problem)
        return figure


@attrs.frozen
class Pace:
    """One answer's figures: its decode rate, how much slower than alone, and what computed beside it."""

    decode_tps: float | None
    slowdown: float | None
    beside: tuple[Companion, ...] | None  # None: not known (steward did not run its step)


@attrs.define(eq=False)
class PaceMeter:
    """Measures each answer as the door records it (``measure``), and learns speeds alone."""

    company: ComputeCompany
    speeds: SpeedBook | None = None

    def measure(self, engine: str | None, klass: str | None, tokens: int | None, seconds: float | None,
                start: float, end: float, prompt_tokens: int | None = None) -> Pace:
        """An answer of *engine* and *klass* that decoded *tokens* in *seconds* (after its first
        token), between *start* and *end* (the door's clock), after *prompt_tokens* of prompt."""
        rate = decode_rate(tokens, seconds)
        if engine is None:
            return Pace(None if rate is None else round(rate, 3), None, None)
        beside = self.company.beside(engine, klass, start, end)
        # The decoded tokens' mean context: the prompt and half of what it decoded.
        context = None if prompt_tokens is None else prompt_tokens + (tokens or 0) / 2
        alone = self.speeds.alone(engine, context) if self.speeds is not None else None
        figure = slowdown(alone, rate)
        if rate is not None and beside == () and self.speeds is not None:
            self.speeds.learn(engine, rate, context)
        return Pace(None if rate is None else round(rate, 3), figure, beside)
