"""A simulation scenario: the GPU, its engines, the clients and the policy knobs, from YAML.

Structured by a converter made the same way as the config's (supervisor.config), so
sizes, durations and errors read the same: ``clients.chat.think: must be a
duration like 2s or 5m, got 'soon'``.
"""

from __future__ import annotations

import importlib.resources
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NewType

import attrs
import cattrs
import yaml
from cattrs.errors import ClassValidationError

from supervisor.config import (
    ClassesConfig,
    ConfigError,
    Duration,
    FallbackConfig,
    PositiveInt,
    SchedulerConfig,
    Size,
    _describe,
    make_converter,
)
from supervisor.engines.measurements import HOST_KEY, EngineSpeed, MeasurementStore
from supervisor.request_class import RequestClass
from supervisor.tools.simulate.sharing import SharingModel
from supervisor.units import parse_duration

Klass = Literal["interactive", "background", "batch"]
Rate = NewType("Rate", float)  # a positive number: tokens per second
# The scenarios shipped with the package, each in NAME.yaml beside this module.
BUILTIN_SCENARIOS = ("gridcore", "thrash", "family", "pressure")
DEFAULT = "gridcore"


@attrs.frozen
class Range:
    """A value drawn uniformly from [low, high] for every request; one number is fixed."""

    low: float
    high: float

    def draw(self, rng: random.Random) -> float:
        return self.low if self.low == self.high else rng.uniform(self.low, self.high)

    def draw_int(self, rng: random.Random) -> int:
        return round(self.draw(rng))

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2


Tokens = NewType("Tokens", Range)
Seconds = NewType("Seconds", Range)
NONE = Range(0.0, 0.0)


@attrs.frozen
class KeepCacheSpec:
    """An engine that saves its slots' KV caches when evicted and restores them when loaded again
    (models.NAME.keep_cache): a conversation's history survives the reload, for these times."""

    save_time: Duration = Duration(0.1)  # added to its stop (after the drain, before the exit)
    restore_time: Duration = Duration(0.1)  # added to its load (before it is ready)


@attrs.frozen
class EngineSpec:
    memory: Size
    speed: Rate  # output tokens per second with the GPU to itself, one slot busy (at no context)
    prompt_speed: Rate | None = None  # prompt tokens per second; unset: 10 x speed
    slots: PositiveInt = PositiveInt(1)
    load_time: Duration = Duration(5.0)
    stop_time: Duration = Duration(1.0)
    pinned: bool = False
    # Each token's added seconds per token before it (measurements.ContextCost), reading a
    # prompt and decoding; 0: speed and prompt_speed whatever the context.
    prompt_context_cost: float = 0.0
    decode_context_cost: float = 0.0
    # Prompt tokens per second reading an embeddings request's inputs; unset: prompt_speed.
    embedding_speed: Rate | None = None
    # Where its waiting requests may go instead, as models.NAME.fallback (scheduler rule 11).
    fallback: list[FallbackConfig] = attrs.Factory(list)
    keep_cache: KeepCacheSpec | None = None  # unset: a reload loses every conversation's cached prompt

    @property
    def load_seconds(self) -> float:
        return self.load_time + (self.keep_cache.restore_time if self.keep_cache is not None else 0.0)

    @property
    def stop_seconds(self) -> float:
        return self.stop_time + (self.keep_cache.save_time if self.keep_cache is not None else 0.0)

    @property
    def prefill_speed(self) -> float:
        return self.prompt_speed if self.prompt_speed is not None else 10 * self.speed

    def read_seconds(self, start: float, end: float) -> float:
        """Seconds alone to read a prompt's tokens from position *start* to *end* (those before
        *start* are cached)."""
        tokens = max(end - start, 0.0)
        return tokens / self.prefill_speed + self.prompt_context_cost * (end**2 - start**2) / 2 if tokens else 0.0

    def decode_seconds(self, context: float, tokens: float) -> float:
        """Seconds alone to decode *tokens* tokens after *context* tokens."""
        return tokens / self.speed + self.decode_context_cost * ((context + tokens) ** 2 - context**2) / 2

    def embed_seconds(self, tokens: float) -> float:
        """Seconds alone to read one embeddings input of *tokens* tokens."""
        return tokens / self.embedding_speed if self.embedding_speed is not None else self.read_seconds(0, tokens)


@attrs.frozen
class ClientSpec:
    """*count* identical closed-loop clients: ask, wait for the answer, think, ask again."""

    model: str
    klass: Klass  # `class` in YAML
    count: PositiveInt = PositiveInt(1)
    think: Seconds = Seconds(NONE)
    # When each client asks first; unset: at a uniform time within one think time.
    start: Seconds | None = None
    prompt_tokens: Tokens = Tokens(NONE)  # for embeddings: per input
    output_tokens: Tokens = Tokens(NONE)
    inputs: PositiveInt | None = None  # set: an embeddings client, this many inputs per request
    chunk: PositiveInt | None = None  # inputs per step of an embeddings request; unset: scheduler.embedding_chunk
    # The first tokens of each prompt that the engine's slot still holds from the one before (a
    # chat template's system prompt): llama-server does not read them again.
    cached_prompt_tokens: int = 0
    # The first tokens of each prompt that repeat this client's previous prompt (an agent's
    # conversation so far): its engine holds them computed while it stays loaded since that
    # request (llama-server's slot), and across an eviction when it keeps caches (keep_cache);
    # after any other reload they are read again.
    carried_prompt_tokens: int = 0

    @property
    def embeddings(self) -> bool:
        return self.inputs is not None


@attrs.frozen
class GpuSpec:
    memory: Size
    sharing: SharingModel = attrs.Factory(SharingModel)


@attrs.frozen
class BaselineKnobs:
    models_max: PositiveInt = PositiveInt(4)  # lru-count: llama-server --models-max (its default 4)
    kill_in_flight: bool = True  # lru-count: evicting a busy model cuts its requests off, as the router does
    keep_alive: Duration = Duration(300.0)  # keepalive: OLLAMA_KEEP_ALIVE
    max_loaded: PositiveInt = PositiveInt(3)  # keepalive: OLLAMA_MAX_LOADED_MODELS (3 per GPU)


@attrs.frozen
class EngineFigures:
    """One engine's figures as measured on a host (``steward calibrate``); unset: the scenario's own."""

    speed: Rate | None = None  # decode tokens/s alone (at no context, with context costs)
    prompt_speed: Rate | None = None
    load_time: Duration | None = None
    prompt_context_cost: float | None = None
    decode_context_cost: float | None = None
    embedding_speed: Rate | None = None


def _engine_figures(speed: EngineSpeed | None, load_s: float | None) -> EngineFigures:
    """A state file's figures for one engine, its speeds taken to an empty context where the
    context cost was measured (the simulator adds each token's cost by its position)."""
    load = None if load_s is None else Duration(load_s)
    if speed is None:
        return EngineFigures(load_time=load)
    decode, prompt = speed.at_no_context()
    cost = speed.context_cost
    return EngineFigures(Rate(decode), None if not prompt else Rate(prompt), load,
                         None if cost is None else cost.prompt_s, None if cost is None else cost.decode_s,
                         None if not speed.embedding_tps else Rate(speed.embedding_tps))


@attrs.frozen
class Calibration:
    """A host's measured figures, which replace the scenario's assumed ones: the sharing
    model's alpha and batching gain, and its engines' speeds and load times. In YAML,
    ``calibration:`` is the path of a steward state file that ``steward calibrate`` wrote
    (its engines matched by name; relative to the scenario file), or the figures inline."""

    alpha: float | None = None
    batching_gain: float | None = None
    engines: dict[str, EngineFigures] = attrs.Factory(dict)
    source: str | None = None  # the state file the figures came from
    # How reading prompts shares (sharing.py); None: decoding's figures stand for it.
    prefill_alpha: float | None = None
    prefill_batching_gain: float | None = None

    @classmethod
    def from_state_file(cls, path: str | Path) -> Calibration:
        """The figures in a state file (supervisor/engines/measurements.py), per engine name the newest.

        Raises:
            ConfigError: the file cannot be read, or holds no calibration.
        """
        try:
            entries = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ConfigError([f"calibration: cannot read the state file {path}: {detail}"]) from None
        if not isinstance(entries, dict):
            raise ConfigError([f"calibration: {path} is not a steward state file"])
        store = MeasurementStore(None, entries)
        newest: dict[str, tuple[float, EngineFigures]] = {}
        for key, entry in entries.items():
            if key == HOST_KEY or not isinstance(entry, dict) or not isinstance(name := entry.get("engine"), str):
                continue
            figures = _engine_figures(store.speed(key), store.load_time(key))
            when = entry.get("measured_at")
            when = float(when) if isinstance(when, int | float) else 0.0
            if figures != EngineFigures() and (name not in newest or when >= newest[name][0]):
                newest[name] = (when, figures)
        sharing = store.sharing()
        if sharing is None and not newest:
            raise ConfigError([f"calibration: {path} holds no calibration (run steward calibrate with its config)"])
        return cls(None if sharing is None else sharing.alpha, None if sharing is None else sharing.batching_gain,
                   {name: figures for name, (_, figures) in newest.items()}, str(path),
                   None if sharing is None else sharing.prefill_alpha,
                   None if sharing is None else sharing.prefill_batching_gain)

    def apply(self, scenario: Scenario) -> Scenario:
        """*scenario* with these figures in place of its own; engines it does not have are left out."""
        measured = {"alpha": self.alpha, "prefill_alpha": self.prefill_alpha,
                    "batching_gain": None if self.batching_gain is None else min(self.batching_gain, 1.0),
                    "prefill_batching_gain": None if self.prefill_batching_gain is None
                    else min(self.prefill_batching_gain, 1.0)}
        sharing = attrs.evolve(scenario.gpu.sharing, **{k: v for k, v in measured.items() if v is not None})

        def engine(name: str, spec: EngineSpec) -> EngineSpec:
            f = self.engines.get(name, EngineFigures())
            return attrs.evolve(spec, **{k: v for k, v in attrs.asdict(f, recurse=False).items() if v is not None})
        known = {name: figures for name, figures in self.engines.items() if name in scenario.engines}
        return attrs.evolve(scenario, gpu=attrs.evolve(scenario.gpu, sharing=sharing),
                            engines={name: engine(name, spec) for name, spec in scenario.engines.items()},
                            calibration=attrs.evolve(self, engines=known))

    def describe(self) -> str:
        """One line: where the figures came from and what they set."""
        parts = [f"alpha {self.alpha:g}" if self.alpha is not None else "",
                 f"batching gain {self.batching_gain:g}" if self.batching_gain is not None else "",
                 f"prompts: alpha {self.prefill_alpha:g}" if self.prefill_alpha is not None else "",
                 f"prompts: batching gain {self.prefill_batching_gain:g}"
                 if self.prefill_batching_gain is not None else "",
                 f"engines {', '.join(self.engines)}" if self.engines else ""]
        return (f"calibration from {self.source}: " if self.source else "calibration: ") + (
            "; ".join(p for p in parts if p) or "no figure for this scenario")


@attrs.frozen
class Scenario:
    gpu: GpuSpec
    engines: dict[str, EngineSpec]
    clients: dict[str, ClientSpec]
    name: str = "scenario"
    duration: Duration = Duration(300.0)
    # Requests that arrive before this are served but not counted (cold engines).
    warmup: Duration = Duration(0.0)
    seed: int = 0
    # steward's knobs, the same sections as in its config; queue timeouts (classes.*)
    # are also every policy's client patience: a request waiting longer fails.
    scheduler: SchedulerConfig = attrs.Factory(SchedulerConfig)
    classes: ClassesConfig = attrs.Factory(ClassesConfig)
    baselines: BaselineKnobs = attrs.Factory(BaselineKnobs)
    # Measured figures in place of the assumed ones (already applied to gpu and engines).
    calibration: Calibration | None = None

    def present_classes(self) -> list[str]:
        """The classes some client asks in, highest first."""
        return [k for k in RequestClass if any(c.klass == k for c in self.clients.values())]

    def only(self, klass: str) -> Scenario:
        """The same scenario with only the clients of one class."""
        return attrs.evolve(self, clients={n: c for n, c in self.clients.items() if c.klass == klass})


def _structure_range(parse: Any) -> Any:
    def structure(value: Any, _: Any) -> Range:
        if isinstance(value, dict):
            if set(value) != {"min", "max"}:
                raise ValueError(f"must be a number or a mapping with exactly min and max, got {value!r}")
            low, high = parse(value["min"]), parse(value["max"])
        else:
            low = high = parse(value)
        if low > high:
            raise ValueError(f"must have min <= max, got {value!r}")
        return Range(float(low), float(high))
    return structure


def _parse_tokens(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(f"must be a whole number of tokens, got {value!r}")


def _structure_rate(value: Any, _: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    raise ValueError(f"must be a positive number, got {value!r}")


def _structure_float(value: Any, _: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise ValueError(f"must be a number, got {value!r}")


def _structure_int(value: Any, _: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError(f"must be a whole number, got {value!r}")


def make_scenario_converter() -> cattrs.Converter:
    converter = make_converter()
    converter.register_structure_hook(Tokens, _structure_range(_parse_tokens))
    converter.register_structure_hook(Seconds, _structure_range(parse_duration))
    converter.register_structure_hook(Rate, _structure_rate)
    converter.register_structure_hook(float, _structure_float)
    converter.register_structure_hook(int, _structure_int)
    client_hook = cattrs.gen.make_dict_structure_fn(
        ClientSpec, converter, _cattrs_forbid_extra_keys=True, klass=cattrs.gen.override(rename="class"))
    converter.register_structure_hook(ClientSpec, client_hook)
    return converter


converter = make_scenario_converter()


def parse_scenario(raw: object, name: str = "scenario", folder: Path | None = None) -> Scenario:
    """*folder*: where a relative ``calibration`` path is (the scenario file's; default: here)."""
    if not isinstance(raw, dict):
        raise ConfigError([f"(top level): must be a mapping of keys, got {type(raw).__name__}"])
    missing = [key for key in ("gpu", "engines", "clients") if key not in raw]
    if missing:
        raise ConfigError([f"{key}: required key is missing" for key in missing])
    raw = dict(raw)
    calibration = _parse_calibration(raw.pop("calibration", None), folder)
    try:
        scenario = converter.structure({"name": name} | raw, Scenario)
    except ClassValidationError as exc:
        # cattrs names a renamed field by its attribute; a person wrote the YAML key.
        raise ConfigError([p.replace(".klass:", ".class:") for p in _describe(exc, "")]) from None
    problems = _check(scenario)
    if calibration is not None:
        problems += _check_calibration(calibration, scenario)
        scenario = calibration.apply(scenario)
    if problems:
        raise ConfigError(problems)
    return scenario


def _parse_calibration(raw: object, folder: Path | None) -> Calibration | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        return Calibration.from_state_file(Path(folder or ".") / raw)
    if not isinstance(raw, dict) or "source" in raw:
        raise ConfigError(["calibration: must be the path of a steward state file or a mapping of alpha, "
                           f"batching_gain, prefill_alpha, prefill_batching_gain and engines, got {raw!r}"])
    try:
        return converter.structure(raw, Calibration)
    except ClassValidationError as exc:
        raise ConfigError(_describe(exc, "calibration")) from None


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read scenario: {exc.strerror or exc}"]) from None
    return _parse_text(text, str(path), path.stem, path.parent)


def builtin_scenario(name: str) -> Scenario:
    """One of BUILTIN_SCENARIOS, shipped with the package."""
    if name not in BUILTIN_SCENARIOS:
        raise ValueError(f"no built-in scenario {name!r}; there are {', '.join(BUILTIN_SCENARIOS)}")
    text = importlib.resources.files("supervisor.tools.simulate").joinpath(f"{name}.yaml").read_text()
    return _parse_text(text, f"{name}.yaml", name)


def default_scenario() -> Scenario:
    """The GridCore load test."""
    return builtin_scenario(DEFAULT)


def parse_seeds(text: str) -> list[int]:
    """``1-8``, ``3`` or ``1,4,7-9``: those seeds in that order, each once."""
    seeds: list[int] = []
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        try:
            first, last = int(low), int(high if dash else low)
        except ValueError:
            raise ValueError(f"expected seeds like 1-8 or 1,3,5, got {text!r}") from None
        if first > last:
            raise ValueError(f"{part.strip()!r} counts down; write the smaller seed first")
        seeds += [seed for seed in range(first, last + 1) if seed not in seeds]
    return seeds


def format_seeds(seeds: Sequence[int]) -> str:
    """The other way: 1, 2, 3, 5 as ``1-3, 5``."""
    runs: list[list[int]] = []
    for seed in seeds:
        if runs and seed == runs[-1][-1] + 1:
            runs[-1].append(seed)
        else:
            runs.append([seed])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _parse_text(text: str, where: str, name: str, folder: Path | None = None) -> Scenario:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"{where}: not valid YAML: {exc}"]) from None
    return parse_scenario(raw, name, folder)


def _check(scenario: Scenario) -> list[str]:
    problems = scenario.gpu.sharing.problems("gpu.sharing")
    if scenario.duration <= 0:
        problems.append("duration: must be longer than 0s")
    if not scenario.engines:
        problems.append("engines: must name at least one engine")
    if not scenario.clients:
        problems.append("clients: must name at least one group of clients")
    for name, engine in scenario.engines.items():
        if engine.memory == 0:
            problems.append(f"engines.{name}.memory: must be the engine's memory size, e.g. 8.3GiB (got 0)")
        for cost in ("prompt_context_cost", "decode_context_cost"):
            if getattr(engine, cost) < 0:
                problems.append(f"engines.{name}.{cost}: must not be negative, got {getattr(engine, cost)}")
        if engine.memory > scenario.gpu.memory:
            problems.append(f"engines.{name}.memory: {engine.memory} bytes is more than gpu.memory "
                            f"({scenario.gpu.memory} bytes); it could never load")
        problems += [f"engines.{name}.fallback[{i}].model: {route.model!r} is not under engines"
                     for i, route in enumerate(engine.fallback) if route.model not in scenario.engines]
    pinned = sum(e.memory for e in scenario.engines.values() if e.pinned)
    if pinned > scenario.gpu.memory:
        problems.append(f"engines: pinned engines need {pinned} bytes, more than gpu.memory")
    for name, client in scenario.clients.items():
        if client.model not in scenario.engines:
            problems.append(f"clients.{name}.model: {client.model!r} is not under engines")
        if client.embeddings and client.output_tokens != NONE:
            problems.append(f"clients.{name}.output_tokens: an embeddings client (inputs set) generates no tokens")
        for tokens in ("cached_prompt_tokens", "carried_prompt_tokens"):
            if getattr(client, tokens) < 0:
                problems.append(f"clients.{name}.{tokens}: must not be negative, got {getattr(client, tokens)}")
    return problems


def _check_calibration(calibration: Calibration, scenario: Scenario) -> list[str]:
    problems = [p.replace("gpu.sharing.", "calibration.")
                for p in SharingModel(alpha=calibration.alpha or 0.0, batching_gain=calibration.batching_gain or 0.0,
                                      prefill_alpha=calibration.prefill_alpha,
                                      prefill_batching_gain=calibration.prefill_batching_gain).problems("gpu.sharing")]
    if calibration.source is None:  # inline figures name the scenario's engines; a state file has the config's
        problems += [f"calibration.engines.{name}: not under engines" for name in calibration.engines
                     if name not in scenario.engines]
    return problems
