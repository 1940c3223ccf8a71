"""Any OpenAI-compatible server: vLLM, SGLang, TGI, a llama-server someone else runs.

Steward runs it from ``command`` (``${PORT}`` filled in) or attaches to ``upstream``. Its
readiness and health are one path (``health``, default ``/health``: vLLM answers 200 with
an empty body once its engine is up). Where it serves vLLM's Prometheus gauges, its own
queue and KV-cache use are read from ``/metrics`` so that overload inside the engine shows in
steward too (and in the cluster's gauges, docs/cluster.md).
With ``sleep``, unloading it is ``POST /sleep?level=N`` and loading again ``POST /wake_up``
(vLLM, only with VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from prometheus_client.parser import text_string_to_metric_families

from adapters.base import USAGE_TIMEOUT_S, EngineUsage, Residence, probe_path
from supervisor.apis import GENERATION, Api
from supervisor.config.schema import PORT_PLACEHOLDER, ModelConfig
from supervisor.observe.events import EventLog

if TYPE_CHECKING:  # imported where a request is made: `steward check` imports the adapters, and needs no client
    import httpx

# Requests steward sends at once when `parallel` is not set: such servers batch many
# requests in one KV pool, so more than a llama-server's slots, fewer than its own limit.
DEFAULT_PARALLEL = 8
_POOLING_FLAGS = ("--runner", "--task", "--convert")
_RUNNING, _WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
# vLLM's KV-cache use, 0..1: the newer name, then the one builds before vllm-project/vllm#18354
# (mid-2025; deprecated, then removed) gave.
_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


class OpenAIRuntime:
    name = "openai"
    checks_health = True
    measured = True
    checks_model_name = True
    splits = False  # vLLM splits by its own --tensor-parallel-size

    def __init__(self, model: ModelConfig) -> None:
        self.model = model
        self.residence = (Residence.ATTACHED if model.upstream is not None
                          else Residence.SERVICE if model.sleep is not None else Residence.SPAWNED)
        self.slots = model.parallel or DEFAULT_PARALLEL
        self.sleeps = model.sleep is not None
        self._metrics = True  # until the server shows it has none

    @property
    def poll_paths(self) -> frozenset[str]:
        return frozenset({self.model.health, "/metrics"})

    def command(self, host: str, port: int) -> list[str] | None:
        if self.model.command is None:
            return None
        return [part.replace(PORT_PLACEHOLDER, str(port)) for part in [*self.model.command, *self.model.args]]

    @property
    def env(self) -> dict[str, str]:
        return self.model.env

    @property
    def apis(self) -> frozenset[Api]:
        # vLLM serves one kind of model: a pooling one embeds, any other generates.
        args = [*(self.model.command or []), *self.model.args]
        pooling = any(a in ("pooling", "embed", "embedding") for a in (_value_after(args, f) for f in _POOLING_FLAGS))
        return frozenset({Api.EMBEDDINGS}) if pooling else GENERATION

    def split_args(self, shares: list[int]) -> list[str]:
        return []

    def log_reader(self) -> None:
        return None

    async def is_ready(self, http: httpx.AsyncClient, base_url: str) -> bool:
        return await probe_path(http, f"{base_url}{self.model.health}") is None

    async def check_health(self, http: httpx.AsyncClient, base_url: str, timeout: float) -> str | None:
        return await probe_path(http, f"{base_url}{self.model.health}", timeout)

    async def unload(self, http: httpx.AsyncClient, base_url: str, events: EventLog) -> str:
        import httpx
        if self.model.sleep is None:
            return "left loaded: it has no sleep configured"
        level = self.model.sleep.level
        try:
            response = await http.post(f"{base_url}/sleep", params={"level": level}, timeout=60)
        except httpx.HTTPError as exc:
            return f"POST /sleep?level={level} failed: {exc or type(exc).__name__}"
        if response.status_code != 200:
            return f"POST /sleep?level={level} answered {response.status_code}: {response.text[:200]}"
        return f"asleep (level {level})"

    async def wake(self, http: httpx.AsyncClient, base_url: str) -> str | None:
        import httpx
        if self.model.sleep is None:
            return None
        try:
            response = await http.post(f"{base_url}/wake_up", timeout=120)
        except httpx.HTTPError as exc:
            return f"POST /wake_up failed: {exc or type(exc).__name__}"
        if response.status_code != 200:
            return f"POST /wake_up answered {response.status_code}: {response.text[:200]}"
        return None

    async def read_usage(self, http: httpx.AsyncClient, base_url: str) -> EngineUsage | None:
        import httpx
        if not self._metrics:
            return None
        try:
            response = await http.get(f"{base_url}/metrics", timeout=USAGE_TIMEOUT_S)
        except httpx.HTTPError:
            return None  # down for now; its health check says so
        if response.status_code == 404:
            self._metrics = False  # a server without Prometheus metrics: stop asking
            return None
        if response.status_code != 200:
            return None
        return read_vllm_load(response.text)


def read_vllm_load(text: str) -> EngineUsage | None:
    """vLLM's running/waiting gauges (summed over its model_name and engine labels) and its KV-cache
    use (the mean over its data-parallel engines, each with a cache of its own), or None without them."""
    sums: dict[str, float] = {}
    kv: dict[str, list[float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in (_RUNNING, _WAITING):
                    sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
                elif sample.name in _KV_USAGE and math.isfinite(sample.value):
                    kv.setdefault(sample.name, []).append(sample.value)
    except (ValueError, TypeError, IndexError):
        return None  # not Prometheus text after all
    shares = next((kv[name] for name in _KV_USAGE if name in kv), None)
    if not sums and shares is None:
        return None
    running, waiting = sums.get(_RUNNING), sums.get(_WAITING)
    return EngineUsage(running=None if running is None else int(running),
                       waiting=None if waiting is None else int(waiting),
                       kv_usage=None if shares is None else min(1.0, max(0.0, sum(shares) / len(shares))))


def _value_after(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if name == flag:
            return inline if eq else (args[i + 1] if i + 1 < len(args) else None)
    return None
