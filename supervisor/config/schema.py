"""The config's schema: attrs classes, one per section, and the typed values their keys take.

What each key means and its default are here; how YAML becomes these classes is in
``hooks`` (one structure hook per typed value) and ``loading``; what the keys mean together
is checked in ``checks``.
"""

from __future__ import annotations

from typing import Literal, NewType

import attrs

from supervisor.accounting.cpu_share import CpuSet
from supervisor.address import Address, MacAddress
from supervisor.request_class import RequestClass

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
ApiName = Literal["chat", "completions", "responses", "messages", "embeddings", "rerank", "transcription",
                  "speech"]
SleepLevel = Literal[1, 2]
FallbackWhenName = Literal["no_room", "wait", "failed"]  # supervisor/scheduler/fallback.py
ProbeName = Literal["auto", "nvml", "simulated", "host", "none"]
LogLevel = Literal["debug", "info", "warning"]


@attrs.frozen
class FallbackConfig:
    """One route of a model's fallback chain (models.NAME.fallback), tried in order: its waiting
    requests of *classes* go to *model* when one of *when* holds (scheduler rule 11)."""

    model: str
    when: list[FallbackWhenName]
    classes: list[RequestClass] | None = None  # default: every class
    wait: PositiveDuration | None = None  # the bound for `wait`; default: the class's slo_wait


@attrs.frozen
class SleepConfig:
    """Evicting the engine puts it to sleep (POST /sleep?level=N) instead of stopping it;
    the next demand wakes it (POST /wake_up): much faster than a cold start."""

    level: SleepLevel = 1
    # Reserved while it sleeps; default: what is measured once it sleeps.
    memory: Size | None = None


DEFAULT_HEALTH = "/health"  # a model's readiness and health path unless it says another


@attrs.frozen
class KeepCacheConfig:
    """Which of a llama-server's slots are saved to disk when it is evicted, and restored when it
    loads again (supervisor/slot_cache/): the ones holding the most cached tokens, up to these bounds."""

    slots: PositiveInt = PositiveInt(1)  # at most this many slots' caches per eviction
    max_bytes: Size | None = None  # at most this many bytes of them per eviction; default: kv_cache.max_bytes
    min_tokens: PositiveInt = PositiveInt(256)  # a slot holding fewer cached tokens is not worth a file


@attrs.frozen
class ModelConfig:
    # The engine's program, supervised by steward; `${PORT}` in it or in args is the port
    # steward picked. Left out for a server someone else runs (`upstream`).
    command: list[str] | None = None
    # Set by hand, or left out: then measured after the first load, estimated from the
    # GGUF header until then (supervisor/engines/memory_plan.py).
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
    health: str = DEFAULT_HEALTH  # readiness and health path (runtime openai)
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
    # transcription, speech); default: what its runtime serves with its args (adapters: `apis`).
    serves: list[ApiName] | None = None
    # A speech model's voices (`serves: [speech]`): a request naming another is refused by steward
    # with a 400 naming `voice`; default: any voice goes to the engine, which says if it has it.
    voices: list[str] | None = None
    # llama.cpp's threads (-t, -tb); null (written `auto`): its share of the cores, so that the
    # engines that may compute at once never oversubscribe them (supervisor/accounting/cpu_share.py).
    threads: ThreadCount | None = None
    # The CPUs its process may run on, as "0-3,6"; default: any steward may use.
    cpus: CpuSet | None = None
    # Where its waiting requests may go instead, in order (scheduler rule 11); default: nowhere.
    fallback: list[FallbackConfig] = attrs.Factory(list)
    # Save its slots' KV caches when it is evicted, restore them when it loads again (llama-server
    # only); default: off.
    keep_cache: KeepCacheConfig | None = None

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
    # A video model (POST /v1/videos) rather than an image model: the clip lengths and sizes it
    # takes, and its frame rate ({{frames}} = seconds * fps).
    video: VideoSpec | None = None


# OpenAI's VideoSize values: a video model's sizes by default.
OPENAI_VIDEO_SIZES = (ImageSize("720x1280"), ImageSize("1280x720"), ImageSize("1024x1792"), ImageSize("1792x1024"))


@attrs.frozen
class VideoSpec:
    """What a video workflow takes: `seconds` and `size` outside these are a 400 naming the parameter."""

    seconds: list[PositiveInt] = attrs.Factory(lambda: [PositiveInt(4), PositiveInt(8), PositiveInt(12)])
    sizes: list[ImageSize] = attrs.Factory(lambda: list(OPENAI_VIDEO_SIZES))  # the first when a request asks none
    fps: PositiveInt = PositiveInt(8)  # {{fps}}; {{frames}} is seconds * fps


@attrs.frozen
class VideosConfig:
    """Where the videos of POST /v1/videos are kept, and for how long: they survive a restart."""

    dir: str = "steward-videos"  # beside the config unless absolute
    max_bytes: Size = Size(10 * 2**30)  # over this, the oldest videos go first
    keep: PositiveDuration = PositiveDuration(7 * 86400.0)  # a video is deleted this long after it was made


REMOTE_RUNTIME = "remote"  # a model of this runtime is a cloud API, not an engine (RemoteModelConfig)
RemoteApiName = Literal["openai", "anthropic"]  # supervisor.gateway.remote_models.RemoteApi's values
RemoteUrl = NewType("RemoteUrl", str)  # https://HOST[:PORT][/BASE]; http:// only to a loopback address
EnvName = NewType("EnvName", str)  # the name of an environment variable
Price = NewType("Price", float)  # per million tokens, 0 or more, in the currency the cloud bills in


@attrs.frozen
class PriceConfig:
    """What a million tokens cost at the cloud: what the usage log's ``cost`` is computed with."""

    input: Price = Price(0.0)
    output: Price = Price(0.0)

    def cost(self, prompt_tokens: int | None, completion_tokens: int | None) -> float:
        """What a request cost at these prices (a count the answer did not tell: 0)."""
        return ((prompt_tokens or 0) * self.input + (completion_tokens or 0) * self.output) / 1e6


@attrs.frozen
class RemoteModelConfig:
    """A model served by a cloud API (`runtime: remote`): no GPU memory, no engine slot; requests
    for it go to ``upstream`` with the key in ``key_env``, at most ``max_concurrency`` at once."""

    runtime: Literal["remote"]
    # The API's base URL as its SDK takes it, e.g. https://api.openai.com/v1: a route's path
    # after /v1 is appended to it.
    upstream: RemoteUrl
    # The environment variable holding the cloud's key: never in the config.
    key_env: EnvName
    api: RemoteApiName = "openai"
    served_name: str | None = None  # the model's name at the cloud; default: the name here
    aliases: list[str] = attrs.Factory(list)
    max_concurrency: PositiveInt = PositiveInt(4)  # requests at the cloud at once; more wait (queue timeout)
    price: PriceConfig = attrs.Factory(PriceConfig)
    # A PEM bundle of CAs trusted besides the system's (a cloud behind a private CA); beside the config.
    ca_file: str | None = None
    # Connecting and the first byte of the answer, then between two chunks.
    timeout: PositiveDuration = PositiveDuration(600.0)


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
    # a chat arriving meanwhile waits one step at most; 0: never cut (gateway/relay/chunked.py).
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
    default_class: RequestClass = RequestClass.INTERACTIVE
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
    job_class: RequestClass = RequestClass.INTERACTIVE  # image jobs wait in this class (writer preference within it)
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
class KvCacheConfig:
    """Where the slots' KV caches of models with ``keep_cache`` are kept between an eviction and the
    next load (supervisor/slot_cache/), and for how long."""

    dir: str = "steward-kv-cache"  # relative to the config file's folder; one folder per model in it
    max_bytes: Size = Size(4 * 1024**3)  # all models' files together; the oldest saves go first
    keep: PositiveDuration = PositiveDuration(3600.0)  # a save older than this is deleted, never restored
    # The save runs after the drain, before the stop, while the load that evicted it waits: past
    # this it is cut short (what was saved by then is kept; the rest is skipped, and said so).
    save_within: PositiveDuration = PositiveDuration(5.0)
    restore_within: PositiveDuration = PositiveDuration(30.0)  # the same bound for a load's restore


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
    kv_cache: KvCacheConfig = attrs.Factory(KvCacheConfig)
    ollama: OllamaConfig | None = None
    comfyui: ComfyConfig | None = None
    videos: VideosConfig = attrs.Factory(VideosConfig)  # POST /v1/videos's store
    # A front door: the nodes it routes to, and names callers may use instead of a model.
    nodes: dict[str, NodeConfig] = attrs.Factory(dict)
    capabilities: dict[str, list[str]] = attrs.Factory(dict)
    # The models of `runtime: comfyui`, split from `models` as they are read (parse_config).
    image_models: dict[str, ImageModelConfig] = attrs.Factory(dict)
    # The models of `runtime: remote`, split from `models` as they are read (parse_config).
    remote_models: dict[str, RemoteModelConfig] = attrs.Factory(dict)

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

    def remote_alias_table(self) -> dict[str, str]:
        """Every name a client may send for a remote model, mapped to that model."""
        table = {name: name for name in self.remote_models}
        for name, model in self.remote_models.items():
            table.update(dict.fromkeys(model.aliases, name))
        return table
