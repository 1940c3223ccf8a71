"""The YAML config, structured into attrs classes by one cattrs converter.

Every error names the key path and what is wrong, e.g.
``models.chat.parallel: must be a positive integer, got 'two'``.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NewType, get_args, get_origin

import attrs
import cattrs
import cattrs.cols
import yaml
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError

from supervisor.accounting.cpu_share import MAX_CPU, CpuSet
from supervisor.address import Address
from supervisor.nodes.wake import MacAddress
from supervisor.safe_text import encodes
from supervisor.units import is_host, parse_duration, parse_size, show

Size = NewType("Size", int)
Duration = NewType("Duration", float)
# Polls, intervals and timeouts where 0 would spin a core or fail everything at once.
PositiveDuration = NewType("PositiveDuration", float)
PositiveInt = NewType("PositiveInt", int)
Count = NewType("Count", int)  # 0, 1, ...
ThreadCount = NewType("ThreadCount", int)  # 1..MAX_CPU, or `auto` (None)
Fraction = NewType("Fraction", float)
SlowdownFactor = NewType("SlowdownFactor", float)  # 0 (off), or how many times slower than alone: 1 or more
Port = NewType("Port", int)  # 1..65535
DeviceIndex = NewType("DeviceIndex", int)  # 0, 1, ... as NVML numbers the devices
Host = NewType("Host", str)  # an IP address or an RFC 1123 host name
ListenAddress = NewType("ListenAddress", Address)  # HOST:PORT to listen on; port 0: any free one
UpstreamAddress = NewType("UpstreamAddress", Address)  # HOST:PORT of a server steward connects to
NodeAddress = NewType("NodeAddress", Address)  # http://HOST:PORT of another steward

# What speaks on the other side (one module each in adapters/): llama.cpp's llama-server,
# or any OpenAI-compatible server (vLLM, SGLang, TGI, a llama-server someone else runs).
RuntimeName = Literal["llama-server", "openai", "comfyui"]  # comfyui: ImageModelConfig
# supervisor.apis.Api's values: what a model may serve
ApiName = Literal["chat", "completions", "responses", "messages", "embeddings", "rerank", "transcription"]
SleepLevel = Literal[1, 2]
ProbeName = Literal["auto", "nvml", "simulated", "host", "none"]
LogLevel = Literal["debug", "info", "warning"]


class ConfigError(Exception):
    """A config problem a person can fix; ``problems`` holds one line per problem, as a terminal
    shows it: a control character, a lone surrogate or a line break a key or value holds is
    written as its escape (``\\x1b``), never acted on by the terminal that shows the problem."""

    def __init__(self, problems: list[str]) -> None:
        problems = [_printable(problem) for problem in problems]
        super().__init__("\n".join(problems))
        self.problems = problems


def _printable(text: str) -> str:
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


@attrs.frozen
class SleepConfig:
    """Evicting the engine puts it to sleep (POST /sleep?level=N) instead of stopping it;
    the next demand wakes it (POST /wake_up): much faster than a cold start."""

    level: SleepLevel = 1
    # Reserved while it sleeps; default: what is measured once it sleeps.
    memory: Size | None = None


@attrs.frozen
class ModelConfig:
    # The engine's program, supervised by steward; `${PORT}` in it or in args is the port
    # steward picked. Left out for a server someone else runs (`upstream`).
    command: list[str] | None = None
    # Set by hand, or left out: then measured after the first load, estimated from the
    # GGUF header until then (supervisor/memory_plan.py).
    memory: Size | None = None
    runtime: RuntimeName = "llama-server"
    model: str | None = None
    args: list[str] = attrs.Factory(list)
    parallel: PositiveInt | None = None
    aliases: list[str] = attrs.Factory(list)
    pinned: bool = False  # the older name of always_on
    # Loaded at start and never evicted; default: true for an attached server, else false.
    always_on: bool | None = None
    env: dict[str, str] = attrs.Factory(dict)
    # A fixed port for the engine; default: a free one picked at each start.
    port: Port | None = None
    # Attach to a server that runs already, at HOST:PORT, instead of starting one.
    upstream: UpstreamAddress | None = None
    health: str = "/health"  # readiness and health path (runtime openai)
    # The model's name on its server (vLLM's --served-model-name), sent in every request's
    # `model` whatever alias the client used; default: the model's name here (runtime openai).
    served_name: str | None = None
    sleep: SleepConfig | None = None
    # The devices it may run on (indices as NVML numbers them); several: it is split over
    # them; default: steward picks one, or splits a llama-server model no single one holds.
    devices: list[DeviceIndex] | None = None
    # Stopped (or put to sleep) once it has had no request for this long; null: never.
    idle_unload: PositiveDuration | None = None
    # The APIs it serves (chat, completions, responses, messages, embeddings, rerank,
    # transcription); default: what its runtime serves with its args (adapters: `apis`).
    serves: list[ApiName] | None = None
    # llama.cpp's threads (-t, -tb); null (written `auto`): its share of the cores, so that the
    # engines that may compute at once never oversubscribe them (supervisor/accounting/cpu_share.py).
    threads: ThreadCount | None = None
    # The CPUs its process may run on, as "0-3,6"; default: any steward may use.
    cpus: CpuSet | None = None

    @property
    def resident(self) -> bool:
        """Loaded at start, never evicted."""
        if self.always_on is not None:
            return self.always_on
        return self.pinned or self.upstream is not None


IMAGE_RUNTIME = "comfyui"  # a model of this runtime is an image workflow, not an engine (ImageModelConfig)
ImageSize = NewType("ImageSize", str)  # WIDTHxHEIGHT, like 1024x1024


@attrs.frozen
class ImageModelConfig:
    """A text-to-image model (`runtime: comfyui`): an API-format ComfyUI workflow that steward
    fills (prompt, size, seed, steps) and runs as an image job for POST /v1/images/generations."""

    runtime: Literal["comfyui"]
    # ComfyUI's "Export (API)" JSON with {{prompt}} and, where it takes them, {{negative_prompt}},
    # {{width}}, {{height}}, {{seed}} and {{steps}}; beside the config unless absolute.
    workflow: str
    aliases: list[str] = attrs.Factory(list)
    size: ImageSize = ImageSize("1024x1024")  # when a request asks for none, or for "auto"
    steps: PositiveInt = PositiveInt(20)  # {{steps}} when a request asks for none
    negative_prompt: str = ""  # {{negative_prompt}} when a request asks for none


@attrs.frozen
class DeviceConfig:
    budget: Size | None = None  # what steward may reserve on this device; default: gpu.budget, else its total


@attrs.frozen
class GpuConfig:
    probe: ProbeName = "auto"
    # How much memory steward may reserve on each device; default: the probed device's total.
    budget: Size | None = None
    # Per device (index as NVML numbers them, CUDA_DEVICE_ORDER=PCI_BUS_ID): where the default is not wanted.
    devices: dict[DeviceIndex, DeviceConfig] = attrs.Factory(dict)
    simulated_dir: str | None = None
    poll_interval: PositiveDuration = PositiveDuration(1.0)


@attrs.frozen
class LimitsConfig:
    max_body_size: Size = Size(16 * 1024**2)
    # Once a request's headers are in, its whole body must arrive within this (else 408).
    body_timeout: PositiveDuration = PositiveDuration(60.0)
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
class AuthConfig:
    """Who may call steward: keys made with `steward keys add`, kept hashed in keys_file.

    With at least one key in the file every request needs one (except on open_paths);
    listening beyond loopback without any key is refused unless allow_unauthenticated."""

    keys_file: str = "steward-keys.json"  # relative to the config file's folder
    allow_unauthenticated: bool = False
    # Paths any caller reaches without a key: what monitors poll.
    open_paths: list[str] = attrs.Factory(lambda: ["/livez", "/healthz"])
    reload_interval: PositiveDuration = PositiveDuration(1.0)  # how often keys_file is looked at


@attrs.frozen
class UsageConfig:
    """The usage log: one SQLite row per request, rejected ones too (`steward usage` reads it)."""

    db: str | None = "steward-usage.db"  # relative to the config file's folder; null: no usage log


@attrs.frozen
class HealthConfig:
    """What /healthz weighs besides the waits over each class's slo_wait."""

    # Rejections for capacity within this window make steward `overloaded`.
    window: PositiveDuration = PositiveDuration(300.0)
    interval: PositiveDuration = PositiveDuration(1.0)  # how often the health is assessed (for alerts)
    # A class whose answers come (median over the window) more than this many times slower than
    # their engines decode alone is `degraded`, naming what computes beside it; 0: never.
    slowdown: SlowdownFactor = SlowdownFactor(3.0)


@attrs.frozen
class AlertsConfig:
    """A POST to `webhook` (ntfy-compatible) when requests start being rejected, when steward
    enters `overloaded`, and when an engine crashes `crash_loop` times in a row."""

    webhook: str | None = None
    min_interval: PositiveDuration = PositiveDuration(600.0)  # at most one alert per kind this often
    crash_loop: PositiveInt = PositiveInt(3)
    timeout: PositiveDuration = PositiveDuration(10.0)


@attrs.frozen
class ClassConfig:
    """Unset values take the class's default (supervisor.scheduler.types.SchedulingPolicy)."""

    max_queue: PositiveInt | None = None
    queue_timeout: Duration | None = None
    # A request of this class waiting longer than this makes steward `overloaded` (/healthz);
    # default: 30s interactive, 5m background, 30m batch.
    slo_wait: PositiveDuration | None = None


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
    # A guard turn beside chats fills its engine's free slots: one engine more slows a chat the
    # same whether one of its slots decodes or all, so a turn does up to slots x the work.
    guard_fill: bool = False
    # Steps whose engine's last ones took at most this long start in any gap between chats,
    # outside the guard: a chat arriving meanwhile is slowed about that long at most. 0s: off.
    gap_step: Duration = Duration(0.0)
    # While a chat's engine is hot, background and batch steps compute on at most this many
    # engines at once, so a chat arriving between chats shares the card with one engine, not
    # all of them. 0: no limit (a card whose engines each leave much of it idle).
    lower_class_engines: Count = Count(1)
    hot_window: Duration = Duration(300.0)
    # Within a class, a request whose model would have to evict another may be overtaken by
    # younger requests for loaded models for up to this long after it arrived, so a swap
    # serves a batch, not one request. 10 s: about one model's load from a page-cached disk,
    # so a held request waits about one load more at most; on the thrash scenario it halves
    # fifo's loads and beats a collating scheduler's, with a wait tail near its (30 s: a
    # third fewer loads, 4-12 s more tail; docs/simulator.md). 0s: strict arrival order.
    swap_hold: Duration = Duration(10.0)
    # Models to load again ahead of demand after an image job or an idle unload, into free
    # memory only and first first, before the models used lately (which are warmed anyway,
    # likeliest first); a request that needs the memory stops a warm load still starting.
    warm: list[str] = attrs.Factory(list)
    embedding_chunk: PositiveInt = PositiveInt(32)
    # A background or batch chat completion on llama-server longer than this many tokens is
    # generated this many at a time, each step continuing the last from its cached prompt, so
    # a chat arriving meanwhile waits one step at most; 0: never cut (gateway/chunked.py).
    # Off by default: in the simulator, 64 cost thrash's agents 2.5x the loads (docs/simulator.md).
    step_tokens: Count = Count(0)
    release_timeout: Duration = Duration(10.0)


@attrs.frozen
class EngineDefaults:
    host: Host = Host("127.0.0.1")
    start_timeout: PositiveDuration = PositiveDuration(300.0)
    stop_grace: Duration = Duration(10.0)
    health_interval: PositiveDuration = PositiveDuration(0.05)
    restart_backoff: PositiveDuration = PositiveDuration(1.0)
    restart_backoff_max: PositiveDuration = PositiveDuration(60.0)
    stderr_tail_lines: PositiveInt = PositiveInt(50)
    # Toward an engine: its first response byte (a whole answer when not streaming, so long
    # enough for a big prompt on a slow card), then at most this long between two chunks.
    first_byte_timeout: PositiveDuration = PositiveDuration(600.0)
    chunk_timeout: PositiveDuration = PositiveDuration(120.0)
    # A ready engine's /health is checked this often (and at once when a request stalls);
    # after `unhealthy_after` failed checks in a row it gets no work, its requests are cut,
    # and it is restarted unless it answers again within `recover_timeout`.
    health_check_interval: PositiveDuration = PositiveDuration(10.0)
    health_check_timeout: PositiveDuration = PositiveDuration(5.0)
    unhealthy_after: PositiveInt = PositiveInt(3)
    recover_timeout: Duration = Duration(30.0)


@attrs.frozen
class LogConfig:
    file: str | None = "steward-events.jsonl"
    terminal: LogLevel = "info"
    # Before a line would take the file past max_size it becomes FILE.1 (FILE.1 becomes FILE.2, ...);
    # `keep` rotated files are kept, the oldest goes. 0: never rotated (an outside logrotate's job).
    max_size: Size = Size(64 * 1024**2)
    keep: PositiveInt = PositiveInt(5)


ClassName = Literal["interactive", "background", "batch"]


@attrs.frozen
class OllamaConfig:
    """Ollama behind steward: its clients talk to ``listen``; steward talks to ``upstream``."""

    upstream: UpstreamAddress  # the real Ollama (e.g. started with OLLAMA_HOST=127.0.0.1:11435)
    listen: ListenAddress | None = ListenAddress(Address("127.0.0.1", 11434))  # null: no Ollama listener
    # Supervise `ollama serve` as a child (OLLAMA_HOST is set to upstream); default: attach.
    command: list[str] | None = None
    parallel: PositiveInt = PositiveInt(4)  # inference requests steward lets through at once
    # Reserved while Ollama may hold models; grows to what /api/ps reports.
    memory: Size = Size(8 * 1024**3)
    default_class: ClassName = "interactive"
    unload_timeout: Duration = Duration(60.0)
    unload_poll: PositiveDuration = PositiveDuration(0.5)
    ps_poll: PositiveDuration = PositiveDuration(2.0)
    retry_initial: PositiveDuration = PositiveDuration(1.0)
    retry_max: PositiveDuration = PositiveDuration(60.0)
    # Toward Ollama on inference routes (the first byte may wait for a model load).
    first_byte_timeout: PositiveDuration = PositiveDuration(600.0)
    chunk_timeout: PositiveDuration = PositiveDuration(120.0)


OLLAMA_ENGINE = "ollama"  # the name of the Ollama service in the scheduler and the ledger
PORT_PLACEHOLDER = "${PORT}"  # llama-swap's spelling: the port steward picked for the engine
# In a key's models, the ComfyUI listener (supervisor/auth/keys.py): with a comfyui section no model takes the name.
COMFYUI_SCOPE = "comfyui"


@attrs.frozen
class ComfyConfig:
    """ComfyUI behind steward: each `/prompt` is an exclusive GPU job in steward's scheduler."""

    upstream: UpstreamAddress  # the real ComfyUI (e.g. started with --port 8189)
    listen: ListenAddress | None = ListenAddress(Address("127.0.0.1", 8188))  # null: no ComfyUI listener
    command: list[str] | None = None  # supervise ComfyUI as a child; default: attach
    job_class: ClassName = "interactive"  # image jobs wait in this class (writer preference within it)
    memory: Size | None = None  # GPU memory a job needs; default: the whole budget
    job_timeout: PositiveDuration = PositiveDuration(900.0)
    history_poll: PositiveDuration = PositiveDuration(1.0)
    free_timeout: Duration = Duration(30.0)
    prompt_capture_limit: Size = Size(65536)
    # The largest body of a request passed through (image and video uploads), streamed on as it
    # comes; limits.max_body_size still bounds /prompt.
    max_body_size: Size = Size(512 * 2**20)
    retry_initial: PositiveDuration = PositiveDuration(1.0)
    retry_max: PositiveDuration = PositiveDuration(60.0)
    # An Ollama model to load again after an image job, once the GPU is idle (batch class).
    warm_model: str | None = None


@attrs.frozen
class WakeConfig:
    """Wake-on-LAN for a node that sleeps: its magic packet, and how long a request waits for it."""

    mac: MacAddress
    broadcast: Host = Host("255.255.255.255")  # the node's LAN broadcast address, e.g. 192.168.1.255
    port: Port = Port(9)
    timeout: PositiveDuration = PositiveDuration(180.0)


@attrs.frozen
class NodeConfig:
    """Another steward this one is the front door of."""

    url: NodeAddress
    # The environment variable holding the node's key (an admin key of that node): never in the config.
    key_env: str | None = None
    wake: WakeConfig | None = None
    # What it serves while it sleeps; default: what it said when it was last awake.
    models: list[str] | None = None
    poll: PositiveDuration = PositiveDuration(2.0)  # how often its state is read


@attrs.frozen
class Config:
    models: dict[str, ModelConfig]
    listen: ListenAddress = ListenAddress(Address("127.0.0.1", 8080))
    aliases: dict[str, str] = attrs.Factory(dict)
    gpu: GpuConfig = attrs.Factory(GpuConfig)
    limits: LimitsConfig = attrs.Factory(LimitsConfig)
    security: SecurityConfig = attrs.Factory(SecurityConfig)
    scheduler: SchedulerConfig = attrs.Factory(SchedulerConfig)
    classes: ClassesConfig = attrs.Factory(ClassesConfig)
    engines: EngineDefaults = attrs.Factory(EngineDefaults)
    log: LogConfig = attrs.Factory(LogConfig)
    auth: AuthConfig = attrs.Factory(AuthConfig)
    usage: UsageConfig = attrs.Factory(UsageConfig)
    health: HealthConfig = attrs.Factory(HealthConfig)
    alerts: AlertsConfig = attrs.Factory(AlertsConfig)
    # Measured memory per model and arguments, kept across restarts; null: not kept.
    state_file: str | None = "steward-state.json"
    ollama: OllamaConfig | None = None
    comfyui: ComfyConfig | None = None
    # A front door: the nodes it routes to, and names callers may use instead of a model.
    nodes: dict[str, NodeConfig] = attrs.Factory(dict)
    capabilities: dict[str, list[str]] = attrs.Factory(dict)
    # The models of `runtime: comfyui`, split from `models` as they are read (parse_config).
    image_models: dict[str, ImageModelConfig] = attrs.Factory(dict)

    def alias_table(self) -> dict[str, str]:
        """Every name a client may send, mapped to the model it means."""
        table = {name: name for name in self.models}
        for name, model in self.models.items():
            table.update(dict.fromkeys(model.aliases, name))
        table.update(self.aliases)
        return table

    def image_alias_table(self) -> dict[str, str]:
        """Every name a client may send for an image model, mapped to that model."""
        table = {name: name for name in self.image_models}
        for name, model in self.image_models.items():
            table.update(dict.fromkeys(model.aliases, name))
        return table


def _structure_size(value: Any, _: Any) -> int:
    return parse_size(value)


def _structure_duration(value: Any, _: Any) -> float:
    return parse_duration(value)


def _structure_positive_duration(value: Any, _: Any) -> float:
    seconds = parse_duration(value)
    if seconds > 0:
        return seconds
    raise ValueError(f"must be a positive duration like 1s or 250ms, got {show(value)}")


def _structure_image_size(value: Any, _: Any) -> str:
    if isinstance(value, str) and (match := re.fullmatch(r"([1-9][0-9]{0,5})x([1-9][0-9]{0,5})", value)):
        return f"{match.group(1)}x{match.group(2)}"
    raise ValueError(f"must be WIDTHxHEIGHT like 1024x1024, got {show(value)}")


# Counts go where sizes go (C's 64-bit integers: a deque's maxlen, SQLite, JSON readers): 10**100 is no setting.
_COUNT_LIMIT = 2**63


def _structure_positive_int(value: Any, _: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < _COUNT_LIMIT:
        return value
    raise ValueError(f"must be a positive integer{_below_limit(value)}, got {show(value)}")


def _structure_count(value: Any, _: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _COUNT_LIMIT:
        return value
    raise ValueError(f"must be a whole number, 0 or more{_below_limit(value)}, got {show(value)}")


def _below_limit(value: Any) -> str:
    return " less than 2**63" if isinstance(value, int) and value >= _COUNT_LIMIT else ""


def _structure_port(value: Any, _: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 65535:
        return value
    raise ValueError(f"must be a port number 1..65535, got {show(value)}")


def _structure_device_index(value: Any, _: Any) -> int:
    if isinstance(value, str) and value.isdigit():
        value = int(value)  # a YAML mapping key may come quoted
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(f"must be a device index like 0 or 1, got {show(value)}")


def _structure_host(value: Any, _: Any) -> str:
    if isinstance(value, str) and is_host(value):
        return value
    raise ValueError(f"must be an IP address or a host name, got {show(value)}")


# An IPv6 host goes in brackets: in `::1:8080` no one can tell where the address ends.
_HOST_PORT = re.compile(r"(?:\[(?P<v6>[^\]]*)\]|(?P<host>[^:\[\]]*)):(?P<port>[0-9]+)")


def _address_hook(lowest_port: int, note: str) -> Callable[[Any, Any], Address]:
    """HOST:PORT (IPv6 in brackets) into a typed Address, parsed once here."""

    def structure(value: Any, _: Any) -> Address:
        match = _HOST_PORT.fullmatch(value) if isinstance(value, str) else None
        if match is None:
            raise ValueError(f"must be HOST:PORT like 127.0.0.1:8080, got {show(value)}")
        v6, host, port = match.group("v6", "host", "port")
        if not (is_host(host) if v6 is None else ":" in v6 and is_host(v6)):
            raise ValueError(f"must have an IP address or a host name before the port, got {show(value)}")
        if len(port) > 5 or not lowest_port <= int(port) <= 65535:
            raise ValueError(f"must have a port {lowest_port}..65535 after the host{note}, got {show(value)}")
        return Address(host if v6 is None else v6, int(port))

    return structure


def _structure_node_address(value: Any, _: Any) -> Address:
    if isinstance(value, str) and value.startswith("http://"):
        return _address_hook(1, "")(value.removeprefix("http://").rstrip("/"), None)
    if isinstance(value, str) and value.startswith("https://"):
        raise ValueError(f"must be http://HOST:PORT (steward speaks plain HTTP to its nodes; put TLS in a "
                         f"tunnel or VPN between them), got {show(value)}")
    raise ValueError(f"must be a node's URL like http://192.168.1.20:8080, got {show(value)}")


def _structure_mac(value: Any, _: Any) -> MacAddress:
    return MacAddress.parse(value)


def _structure_slowdown_factor(value: Any, _: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and (value == 0 or 1 <= value < 1e6):
        return float(value)
    raise ValueError(f"must be a factor of 1 or more (how many times slower than alone, e.g. 3), or 0 for off, "
                     f"got {show(value)}")


def _structure_fraction(value: Any, _: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1:
        return float(value)
    if isinstance(value, str) and value.endswith("%"):
        try:
            return _structure_fraction(float(value[:-1]) / 100, _)
        except ValueError:
            pass
    raise ValueError(f"must be a fraction in (0, 1] such as 0.1 or 10%, got {show(value)}")


def _structure_str(value: Any, _: Any) -> str:
    # YAML reads `8080` or `yes` as int/bool; a command-line argument is text.
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        return _passable(str(value))
    raise ValueError(f"must be a string, got {show(value)}")


def _passable(text: str, where: str = "") -> str:
    """*text*, if it can go where every string of a config may end up: an engine's argv or
    environment (exec takes no NUL), a file path, a URL, an event, a UTF-8 terminal. YAML's
    escapes can write a NUL (``"\\0"``) and a lone surrogate (``"\\ud800"``); both are refused here,
    once for every key, so that `steward run` never meets them at an engine's first start."""
    if "\0" in text:
        raise ValueError(f"must not contain a NUL character (an argument, a path or the environment cannot "
                         f"hold one), got {show(text)}{where}")
    if not encodes(text):
        surrogate = next(char for char in text if not encodes(char))
        raise ValueError(f"must be text UTF-8 can write; it holds the lone surrogate {surrogate!r}, got "
                         f"{show(text)}{where}")
    return text


def _structure_bool(value: Any, _: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise ValueError(f"must be true or false, got {show(value)}")


def _structure_command(value: Any, _: Any) -> list[str]:
    if isinstance(value, str) and value.strip():
        return [_passable(value)]
    if isinstance(value, list) and value and all(isinstance(part, str) for part in value):
        return [_passable(part, f" (item [{i}])" if len(value) > 1 else "") for i, part in enumerate(value)]
    raise ValueError(f"must be a program path or a non-empty list of strings, got {show(value)}")


def _structure_threads(value: Any, _: Any) -> int | None:
    if value is None or value == "auto":
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_CPU:
        return value
    raise ValueError(f"must be auto or a number of threads 1..{MAX_CPU}, got {show(value)}")


def _structure_cpus(value: Any, _: Any) -> CpuSet:
    return CpuSet.parse(value)


def _optional(structure: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def optional(value: Any, type_: Any) -> Any:
        return None if value is None else structure(value, type_)

    return optional


def _literal_hook(type_: Any, _: cattrs.Converter) -> Callable[[Any, Any], Any]:
    choices = get_args(type_)

    def structure(value: Any, _: Any) -> Any:
        if any(type(value) is type(choice) and value == choice for choice in choices):
            return value
        raise ValueError(f"must be one of {', '.join(map(repr, choices))}, got {show(value)}")

    return structure


def _shaped(shape: type, structure: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """*structure*, for values of the YAML shape it needs: cattrs takes any iterable as a list
    (`aliases: gpt-4o` would be six one-letter aliases) and fails obscurely on a non-mapping."""

    def guarded(value: Any, type_: Any) -> Any:
        if isinstance(value, shape):
            return structure(value, type_)
        raise ValueError(_wrong_shape(shape, value))

    return guarded


def _wrong_shape(shape: type, value: object) -> str:
    if shape is dict:
        return f"must be a mapping of keys, got {show(value)}"
    if isinstance(value, str):
        example = json.dumps([word.strip(",") for word in value[:60].split()], ensure_ascii=False)
        return f"must be a list like {example}, got a string {show(value)}"
    return f"must be a list, got {show(value)}"


def make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    converter.register_structure_hook(Size, _structure_size)
    converter.register_structure_hook(Duration, _structure_duration)
    converter.register_structure_hook(PositiveDuration, _structure_positive_duration)
    converter.register_structure_hook(PositiveInt, _structure_positive_int)
    converter.register_structure_hook(Count, _structure_count)
    converter.register_structure_hook(Port, _structure_port)
    converter.register_structure_hook(DeviceIndex, _structure_device_index)
    converter.register_structure_hook(Host, _structure_host)
    converter.register_structure_hook(ListenAddress, _address_hook(0, " (0: any free one)"))
    converter.register_structure_hook(UpstreamAddress, _address_hook(1, ""))
    converter.register_structure_hook(NodeAddress, _structure_node_address)
    converter.register_structure_hook(MacAddress, _structure_mac)
    converter.register_structure_hook(Fraction, _structure_fraction)
    converter.register_structure_hook(SlowdownFactor, _structure_slowdown_factor)
    converter.register_structure_hook(ImageSize, _structure_image_size)
    converter.register_structure_hook(str, _structure_str)
    converter.register_structure_hook(bool, _structure_bool)
    converter.register_structure_hook_factory(lambda t: get_origin(t) is Literal, _literal_hook)
    converter.register_structure_hook_factory(
        lambda t: get_origin(t) is list, lambda t, c: _shaped(list, cattrs.cols.list_structure_factory(t, c)))
    converter.register_structure_hook_factory(
        lambda t: get_origin(t) is dict, lambda t, c: _shaped(dict, cattrs.cols.mapping_structure_factory(t, c)))
    converter.register_structure_hook_factory(attrs.has, lambda t, c: _shaped(dict, c.gen_structure_attrs_fromdict(t)))
    # `command` is the one field that takes either form; a hook on the field keeps it local.
    model_hook = cattrs.gen.make_dict_structure_fn(
        ModelConfig, converter, _cattrs_forbid_extra_keys=True,
        command=cattrs.gen.override(struct_hook=_optional(_structure_command)),
        threads=cattrs.gen.override(struct_hook=_structure_threads),
        cpus=cattrs.gen.override(struct_hook=_optional(_structure_cpus)),
    )
    converter.register_structure_hook(ModelConfig, _shaped(dict, model_hook))
    return converter


converter = make_converter()


def load_config(path: str | Path) -> Config:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read config: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{path}: cannot read config: not UTF-8 text (byte {exc.start})"]) from None
    config = resolve_paths(parse_config(_read_yaml(text, str(path))), path.parent)
    if problems := workflow_problems(config):
        raise ConfigError(problems)
    return config


def workflow_problems(config: Config) -> list[str]:
    """What is wrong with the image models' workflow files (read here, and again when served)."""
    from adapters.comfyui_workflow import load_workflow  # adapters import this module

    problems = []
    for name, model in config.image_models.items():
        try:
            load_workflow(model.workflow)
        except ValueError as exc:
            problems.append(f"models.{name}.workflow: {model.workflow} {exc}")
    return problems


def load_config_for_command(path: str | Path) -> Config | None:
    """The config a `steward` command was given, or None once what is wrong with it is on stderr."""
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"steward: {path} is not a valid config:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return None


def resolve_paths(config: Config, folder: Path) -> Config:
    """Steward's own files (event log, state, keys, usage log) live beside the config unless a
    path says otherwise, so `steward keys add --config` and `steward run` agree from any folder."""

    def beside(value: str | None) -> str | None:
        return None if value is None else str(folder / Path(value).expanduser())

    return attrs.evolve(
        config, state_file=beside(config.state_file),
        image_models={name: attrs.evolve(model, workflow=beside(model.workflow))
                      for name, model in config.image_models.items()},
        log=attrs.evolve(config.log, file=beside(config.log.file)),
        auth=attrs.evolve(config.auth, keys_file=beside(config.auth.keys_file)),
        usage=attrs.evolve(config.usage, db=beside(config.usage.db)))


# Far deeper than any config; PyYAML's composer recurses, and Python's stack ends near 1000.
_MAX_DEPTH = 100
_MERGE_TAG = "tag:yaml.org,2002:merge"
_INT_TAG = "tag:yaml.org,2002:int"


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, bounded in depth, whose errors name the file, the line and the key."""

    def __init__(self, text: str, where: str) -> None:
        super().__init__(text)
        self.name = where  # the marks in its errors would say "<unicode string>"
        self._depth = 0
        self._paths: dict[yaml.Node, str] = {}  # each node's key path, filled by check_tree

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node | None:
        if self._depth >= _MAX_DEPTH:
            raise yaml.composer.ComposerError(None, None, f"nested more than {_MAX_DEPTH} levels deep",
                                              self.peek_event().start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as exc:  # int() past Python's digit limit, a 13th month, ...
            where = f"{self._paths.get(node, '(top level)')}: line {node.start_mark.line + 1}"
            raise ConfigError([f"{where}: {_unreadable(node, exc)}"]) from None

    def check_tree(self, node: yaml.Node, path: str = "", holders: tuple[yaml.Node, ...] = ()) -> list[str]:
        """Keys given twice, and aliases to their own holder; notes each node's key path."""
        if node in holders:
            where = f"{path or '(top level)'}: line {node.start_mark.line + 1}"
            return [f"{where}: an alias refers to the list or mapping that holds it"]
        if node in self._paths:
            return []  # reached again through an alias: checked once (so a billion laughs stay ten)
        self._paths[node] = path or "(top level)"
        holders = (*holders, node)
        if isinstance(node, yaml.SequenceNode):
            return [p for i, item in enumerate(node.value)
                    for p in self.check_tree(item, f"{path or '(top level)'}[{i}]", holders)]
        if isinstance(node, yaml.MappingNode):
            return self._check_mapping(node, path, holders)
        return []

    def _check_mapping(self, node: yaml.MappingNode, path: str, holders: tuple[yaml.Node, ...]) -> list[str]:
        problems: list[str] = []
        lines: dict[tuple[str, str], int] = {}  # each key's first line
        for key, value in node.value:
            child = path  # a merge key (`<<: *base`) adds its keys to this mapping
            if isinstance(key, yaml.ScalarNode) and key.tag != _MERGE_TAG:
                child = f"{path}.{_key_text(key.value)}" if path else _key_text(key.value)
                problems += _given_twice(lines, key, child)
            problems += self.check_tree(key, child, holders) + self.check_tree(value, child, holders)
        return problems


def _given_twice(lines: dict[tuple[str, str], int], key: yaml.ScalarNode, path: str) -> list[str]:
    line, first = key.start_mark.line + 1, lines.get((key.tag, key.value))
    if first is None:
        lines[key.tag, key.value] = line
        return []
    where = f"lines {first} and {line}" if line != first else f"line {line}"
    return [f"{path}: key given twice, on {where}; keep one"]


def _read_yaml(text: str, where: str) -> object:
    try:
        loader = _Loader(text, where)
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow; found before any parsing
        line = text.count("\n", 0, exc.position) + 1
        problem = f"{where}, line {line}: not valid YAML: character #x{exc.character:04x} is not allowed"
        raise ConfigError([problem]) from None
    try:
        root = loader.get_single_node()
        problems = [] if root is None else loader.check_tree(root)
        if problems:
            raise ConfigError(problems)
        return None if root is None else loader.construct_document(root)
    except yaml.YAMLError as exc:
        raise ConfigError([_yaml_problem(exc, where)]) from None
    finally:
        loader.dispose()


def _yaml_problem(exc: yaml.YAMLError, where: str) -> str:
    mark = getattr(exc, "problem_mark", None)
    if not isinstance(exc, yaml.MarkedYAMLError) or mark is None:
        return f"{where}: not valid YAML: {exc}"
    context = ""
    if exc.context and exc.context_mark is not None:
        context = f" ({exc.context} that starts on line {exc.context_mark.line + 1})"
    return (f"{where}, line {mark.line + 1}, column {mark.column + 1}: not valid YAML: "
            f"{exc.problem or exc.context}{context}")


def _unreadable(node: yaml.Node, exc: Exception) -> str:
    if node.tag == _INT_TAG and len(node.value) > sys.get_int_max_str_digits():
        return f"an integer of {len(node.value)} digits is more than any setting takes"
    return f"cannot read {show(node.value)} as {node.tag.rsplit(':', 1)[-1]}: {exc}"


def parse_config(raw: object) -> Config:
    if not isinstance(raw, dict):
        raise ConfigError([f"(top level): must be a mapping of keys, got {show(raw)}"])
    if "models" not in raw:
        raise ConfigError(["models: required key is missing (a mapping of model name to its engine)"])
    if "image_models" in raw:
        raise ConfigError(["image_models: unknown key (an image model goes under models, with runtime: comfyui)"])
    raw, images = _split_image_models(raw)
    problems = []
    try:
        config = converter.structure(raw, Config)
    except ClassValidationError as exc:
        problems = _describe(exc, "")
    image_models = {}
    for name, entry in images.items():
        try:
            image_models[name] = converter.structure(entry, ImageModelConfig)
        except ClassValidationError as exc:
            problems += _describe(exc, f"models.{name}")
    if problems:
        raise ConfigError(problems)
    config = attrs.evolve(config, image_models=image_models)
    from supervisor.config_checks import check_semantics  # it reads the classes above

    problems = check_semantics(config)
    if problems:
        raise ConfigError(problems)
    return config


def _split_image_models(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The config without its image models, and those (they are workflows, not engines)."""
    models = raw["models"]
    if not isinstance(models, dict):
        return raw, {}
    images = {name: entry for name, entry in models.items()
              if isinstance(entry, dict) and entry.get("runtime") == IMAGE_RUNTIME}
    return {**raw, "models": {name: entry for name, entry in models.items() if name not in images}}, images


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
                child = f"{path}[{show(index)}]" if not isinstance(index, str) else (
                    f"{path}.{_key_text(index)}" if path else _key_text(index))
            lines.extend(_describe(sub, child))
        return lines
    if isinstance(exc, ForbiddenExtraKeysError):
        prefix = f"{path}." if path else ""
        return [f"{prefix}{key}: unknown key" for key in sorted(map(_key_text, exc.extra_fields))]
    if isinstance(exc, KeyError):
        return [f"{path}: required key is missing"]
    if isinstance(exc, ValueError) and str(exc).startswith("must"):
        return [f"{path}: {exc}"]
    return [f"{path}: invalid value ({exc})"]


def _key_text(key: object) -> str:
    """A key as a key path shows it: the empty one as '' (so that it is seen, not taken for its parent)."""
    return key if isinstance(key, str) and key else show(key)
