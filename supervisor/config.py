"""The YAML config, structured into attrs classes by one cattrs converter.

Every error names the key path and what is wrong, e.g.
``models.chat.parallel: must be a positive integer, got 'two'``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, NewType

import attrs
import cattrs
import yaml
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError

from supervisor.units import parse_duration, parse_size

Size = NewType("Size", int)
Duration = NewType("Duration", float)
PositiveInt = NewType("PositiveInt", int)
Fraction = NewType("Fraction", float)

RuntimeName = Literal["llama-server"]
ProbeName = Literal["auto", "nvml", "simulated", "host", "none"]
LogLevel = Literal["debug", "info", "warning"]


class ConfigError(Exception):
    """A config problem a person can fix; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@attrs.frozen
class ModelConfig:
    command: list[str]
    # Set by hand, or left out: then measured after the first load, estimated from the
    # GGUF header until then (supervisor/memory_plan.py).
    memory: Size | None = None
    runtime: RuntimeName = "llama-server"
    model: str | None = None
    args: list[str] = attrs.Factory(list)
    parallel: PositiveInt | None = None
    aliases: list[str] = attrs.Factory(list)
    pinned: bool = False
    env: dict[str, str] = attrs.Factory(dict)
    # A fixed port for the engine; default: a free one picked at each start.
    port: PositiveInt | None = None


@attrs.frozen
class GpuConfig:
    probe: ProbeName = "auto"
    # How much memory steward may reserve; default: the probed device total.
    budget: Size | None = None
    simulated_dir: str | None = None
    poll_interval: Duration = Duration(1.0)


@attrs.frozen
class LimitsConfig:
    max_body_size: Size = Size(16 * 1024**2)
    # Once a request's headers are in, its whole body must arrive within this (else 408).
    body_timeout: Duration = Duration(60.0)
    # Open client connections over all listeners; more are answered 503 and closed.
    max_connections: PositiveInt = PositiveInt(1000)
    shutdown_timeout: Duration = Duration(30.0)


@attrs.frozen
class SecurityConfig:
    """Who may talk to the listeners from a browser (DNS rebinding, cross-site requests)."""

    # Host names (or addresses) clients may use besides loopback and the listen address; "*": any.
    allowed_hosts: list[str] = attrs.Factory(list)
    # Origins (scheme://host[:port]) of pages elsewhere that may call the listeners; "*": any.
    allowed_origins: list[str] = attrs.Factory(list)


@attrs.frozen
class ClassConfig:
    """Unset values take the class's default (supervisor.scheduler.types.SchedulingPolicy)."""

    max_queue: PositiveInt | None = None
    queue_timeout: Duration | None = None


@attrs.frozen
class ClassesConfig:
    interactive: ClassConfig = attrs.Factory(ClassConfig)
    background: ClassConfig = attrs.Factory(ClassConfig)
    batch: ClassConfig = attrs.Factory(ClassConfig)


@attrs.frozen
class SchedulerConfig:
    interactive_window: Duration = Duration(2.0)
    background_max_starvation: Duration = Duration(3.0)
    batch_max_starvation: Duration = Duration(10.0)
    guard_share: Fraction = Fraction(0.5)
    guard_gap_wait: Duration = Duration(15.0)
    hot_window: Duration = Duration(300.0)
    embedding_chunk: PositiveInt = PositiveInt(32)
    release_timeout: Duration = Duration(10.0)


@attrs.frozen
class EngineDefaults:
    host: str = "127.0.0.1"
    start_timeout: Duration = Duration(300.0)
    stop_grace: Duration = Duration(10.0)
    health_interval: Duration = Duration(0.05)
    restart_backoff: Duration = Duration(1.0)
    restart_backoff_max: Duration = Duration(60.0)
    stderr_tail_lines: PositiveInt = PositiveInt(50)
    # Toward an engine: its first response byte (a whole answer when not streaming, so long
    # enough for a big prompt on a slow card), then at most this long between two chunks.
    first_byte_timeout: Duration = Duration(600.0)
    chunk_timeout: Duration = Duration(120.0)
    # A ready engine's /health is checked this often (and at once when a request stalls);
    # after `unhealthy_after` failed checks in a row it gets no work, its requests are cut,
    # and it is restarted unless it answers again within `recover_timeout`.
    health_check_interval: Duration = Duration(10.0)
    health_check_timeout: Duration = Duration(10.0)
    unhealthy_after: PositiveInt = PositiveInt(3)
    recover_timeout: Duration = Duration(30.0)


@attrs.frozen
class LogConfig:
    file: str | None = "steward-events.jsonl"
    terminal: LogLevel = "info"


ClassName = Literal["interactive", "background", "batch"]


@attrs.frozen
class OllamaConfig:
    """Ollama behind steward: its clients talk to ``listen``; steward talks to ``upstream``."""

    upstream: str  # HOST:PORT of the real Ollama (e.g. started with OLLAMA_HOST=127.0.0.1:11435)
    listen: str | None = "127.0.0.1:11434"  # null: no Ollama listener
    # Supervise `ollama serve` as a child (OLLAMA_HOST is set to upstream); default: attach.
    command: list[str] | None = None
    parallel: PositiveInt = PositiveInt(4)  # inference requests steward lets through at once
    # Reserved while Ollama may hold models; grows to what /api/ps reports.
    memory: Size = Size(8 * 1024**3)
    default_class: ClassName = "interactive"
    unload_timeout: Duration = Duration(60.0)
    unload_poll: Duration = Duration(0.5)
    ps_poll: Duration = Duration(2.0)
    retry_initial: Duration = Duration(1.0)
    retry_max: Duration = Duration(60.0)
    # Toward Ollama on inference routes (the first byte may wait for a model load).
    first_byte_timeout: Duration = Duration(600.0)
    chunk_timeout: Duration = Duration(120.0)


OLLAMA_ENGINE = "ollama"  # the name of the Ollama service in the scheduler and the ledger


@attrs.frozen
class ComfyConfig:
    """ComfyUI behind steward: each `/prompt` is an exclusive GPU job in steward's scheduler."""

    upstream: str  # HOST:PORT of the real ComfyUI (e.g. started with --port 8189)
    listen: str | None = "127.0.0.1:8188"  # null: no ComfyUI listener
    command: list[str] | None = None  # supervise ComfyUI as a child; default: attach
    job_class: ClassName = "interactive"  # image jobs wait in this class (writer preference within it)
    memory: Size | None = None  # GPU memory a job needs; default: the whole budget
    job_timeout: Duration = Duration(900.0)
    history_poll: Duration = Duration(1.0)
    free_timeout: Duration = Duration(30.0)
    prompt_capture_limit: Size = Size(65536)
    retry_initial: Duration = Duration(1.0)
    retry_max: Duration = Duration(60.0)
    # An Ollama model to load again after an image job, once the GPU is idle (batch class).
    warm_model: str | None = None


@attrs.frozen
class Config:
    models: dict[str, ModelConfig]
    listen: str = "127.0.0.1:8080"
    aliases: dict[str, str] = attrs.Factory(dict)
    gpu: GpuConfig = attrs.Factory(GpuConfig)
    limits: LimitsConfig = attrs.Factory(LimitsConfig)
    security: SecurityConfig = attrs.Factory(SecurityConfig)
    scheduler: SchedulerConfig = attrs.Factory(SchedulerConfig)
    classes: ClassesConfig = attrs.Factory(ClassesConfig)
    engines: EngineDefaults = attrs.Factory(EngineDefaults)
    log: LogConfig = attrs.Factory(LogConfig)
    # Measured memory per model and arguments, kept across restarts; null: not kept.
    state_file: str | None = "steward-state.json"
    ollama: OllamaConfig | None = None
    comfyui: ComfyConfig | None = None

    @property
    def listen_host(self) -> str:
        return self.listen.rsplit(":", 1)[0].strip("[]")

    @property
    def listen_port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    def alias_table(self) -> dict[str, str]:
        """Every name a client may send, mapped to the model it means."""
        table = {name: name for name in self.models}
        for name, model in self.models.items():
            table.update(dict.fromkeys(model.aliases, name))
        table.update(self.aliases)
        return table


def _structure_size(value: Any, _: Any) -> int:
    return parse_size(value)


def _structure_duration(value: Any, _: Any) -> float:
    return parse_duration(value)


def _structure_positive_int(value: Any, _: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise ValueError(f"must be a positive integer, got {value!r}")


def _structure_fraction(value: Any, _: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1:
        return float(value)
    if isinstance(value, str) and value.endswith("%"):
        try:
            return _structure_fraction(float(value[:-1]) / 100, _)
        except ValueError:
            pass
    raise ValueError(f"must be a fraction in (0, 1] such as 0.1 or 10%, got {value!r}")


def _structure_str(value: Any, _: Any) -> str:
    # YAML reads `8080` or `yes` as int/bool; a command-line argument is text.
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"must be a string, got {value!r}")


def _structure_bool(value: Any, _: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise ValueError(f"must be true or false, got {value!r}")


def _structure_command(value: Any, _: Any) -> list[str]:
    if isinstance(value, str) and value.strip():
        return [value]
    if isinstance(value, list) and value and all(isinstance(part, str) for part in value):
        return list(value)
    raise ValueError(f"must be a program path or a non-empty list of strings, got {value!r}")


def make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    converter.register_structure_hook(Size, _structure_size)
    converter.register_structure_hook(Duration, _structure_duration)
    converter.register_structure_hook(PositiveInt, _structure_positive_int)
    converter.register_structure_hook(Fraction, _structure_fraction)
    converter.register_structure_hook(str, _structure_str)
    converter.register_structure_hook(bool, _structure_bool)
    # `command` is the one field that takes either form; a hook on the field keeps it local.
    model_hook = cattrs.gen.make_dict_structure_fn(
        ModelConfig, converter, _cattrs_forbid_extra_keys=True,
        command=cattrs.gen.override(struct_hook=_structure_command),
    )
    converter.register_structure_hook(ModelConfig, model_hook)
    return converter


converter = make_converter()


def load_config(path: str | Path) -> Config:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read config: {exc.strerror or exc}"]) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML: {exc}"]) from None
    return parse_config(raw)


def parse_config(raw: object) -> Config:
    if not isinstance(raw, dict):
        raise ConfigError([f"(top level): must be a mapping of keys, got {type(raw).__name__}"])
    if "models" not in raw:
        raise ConfigError(["models: required key is missing (a mapping of model name to its engine)"])
    try:
        config = converter.structure(raw, Config)
    except ClassValidationError as exc:
        raise ConfigError(_describe(exc, "")) from None
    problems = _check_semantics(config)
    if problems:
        raise ConfigError(problems)
    return config


def _describe(exc: BaseException, path: str) -> list[str]:
    """Flatten cattrs' nested exception groups into `key.path: what is wrong` lines."""
    if isinstance(exc, ClassValidationError | IterableValidationError):
        with_notes, without_notes = exc.group_exceptions()
        lines = [line for sub in without_notes for line in _describe(sub, path)]
        for sub, note in with_notes:
            name = getattr(note, "name", None)
            index = getattr(note, "index", None)
            if name is not None:
                child = f"{path}.{name}" if path else str(name)
            else:
                child = f"{path}[{index!r}]" if not isinstance(index, str) else (
                    f"{path}.{index}" if path else index)
            lines.extend(_describe(sub, child))
        return lines
    if isinstance(exc, ForbiddenExtraKeysError):
        prefix = f"{path}." if path else ""
        return [f"{prefix}{key}: unknown key" for key in sorted(exc.extra_fields)]
    if isinstance(exc, KeyError):
        return [f"{path}: required key is missing"]
    if isinstance(exc, ValueError) and str(exc).startswith("must"):
        return [f"{path}: {exc}"]
    return [f"{path}: {_type_problem(exc)}"]


def _type_problem(exc: BaseException) -> str:
    text = str(exc)
    literal = re.fullmatch(r"(.*) not in literal typing\.Literal\[(.*)\]", text)
    if literal:
        return f"must be one of {literal.group(2)}, got {literal.group(1)!r}"
    if isinstance(exc, AttributeError) and "'items'" in text:
        return f"must be a mapping of keys, got a {text.split(chr(39))[1]}"
    return f"invalid value ({text})"


_HOST_PORT = re.compile(r"(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.\-]+):([0-9]{1,5})")


def _is_host_port(value: str) -> bool:
    match = _HOST_PORT.fullmatch(value)
    return match is not None and int(match.group(2)) <= 65535


def _check_semantics(config: Config) -> list[str]:
    problems = []
    if not _is_host_port(config.listen):
        problems.append(f"listen: must be HOST:PORT like 127.0.0.1:8080, got {config.listen!r}")
    if not config.models and config.ollama is None and config.comfyui is None:
        problems.append("models: must name at least one model (or configure ollama or comfyui)")
    seen: dict[str, str] = {}
    for name, model in config.models.items():
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:/\-]*", name) or "@" in name:
            problems.append(f"models.{name}: a model name may hold letters, digits and ._:/- (no '@')")
        if model.parallel is not None and _has_flag(model.args, "-np", "--parallel"):
            problems.append(f"models.{name}.parallel: set here and as --parallel in args; keep one")
        if model.memory == 0:
            problems.append(f"models.{name}.memory: must be the engine's memory size, e.g. 8.3GiB (got 0)")
        if model.memory is None and model.model is None:
            problems.append(f"models.{name}.memory: required when models.{name}.model names no GGUF file "
                            f"to estimate it from")
        if config.gpu.budget is not None and model.memory is not None and model.memory > config.gpu.budget:
            problems.append(f"models.{name}.memory: {model.memory} bytes is more than gpu.budget "
                            f"({config.gpu.budget} bytes); it could never load")
        for alias in model.aliases:
            if alias in seen or alias in config.models:
                problems.append(f"models.{name}.aliases: {alias!r} already names "
                                f"{seen.get(alias, alias)!r}")
            seen[alias] = name
    for alias, target in config.aliases.items():
        if target not in config.models:
            problems.append(f"aliases.{alias}: names model {target!r}, which is not under models")
        if alias in config.models or alias in seen:
            problems.append(f"aliases.{alias}: already names {seen.get(alias, alias)!r}")
    if config.ollama is not None:
        if OLLAMA_ENGINE in config.models:
            problems.append(f"models.{OLLAMA_ENGINE}: the name is taken by the Ollama service; rename the model")
        for key in ("upstream", "listen"):
            value = getattr(config.ollama, key)
            if value is not None and not _is_host_port(value):
                problems.append(f"ollama.{key}: must be HOST:PORT like 127.0.0.1:11434, got {value!r}")
    if config.comfyui is not None and config.comfyui.warm_model is not None and config.ollama is None:
        problems.append("comfyui.warm_model: names an Ollama model, but no ollama section is configured")
    if config.comfyui is not None:
        for key in ("upstream", "listen"):
            value = getattr(config.comfyui, key)
            if value is not None and not _is_host_port(value):
                problems.append(f"comfyui.{key}: must be HOST:PORT like 127.0.0.1:8188, got {value!r}")
    if config.gpu.probe == "simulated" and not config.gpu.simulated_dir:
        problems.append("gpu.simulated_dir: required when gpu.probe is 'simulated'")
    return problems


def _has_flag(args: list[str], *flags: str) -> bool:
    return any(arg in flags or arg.split("=", 1)[0] in flags for arg in args)
