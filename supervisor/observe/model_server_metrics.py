"""The model-server metrics a cluster's router reads, per model: the GIE model-server protocol.

The Gateway API Inference Extension's endpoint picker (and llm-d's, and KServe's, which
build on it) routes by three gauges it scrapes from each model server's Prometheus
endpoint, whose names and meaning are fixed by its model-server protocol
(kubernetes-sigs/gateway-api-inference-extension, docs/proposals/003-model-server-protocol,
as of v1.5.0, commit df9f8909fe06): TotalQueuedRequests, TotalRunningRequests and
KVCacheUtilization, named as vLLM names them. Steward serves several models behind one
listener, so each gauge carries vLLM's own model label, ``model_name``, one series per
model; a picker is pointed at one model with a label selector in its metric spec
(``vllm:num_requests_waiting{model_name=qwen}``, docs/cluster.md).

- queued: the steps steward holds for the model (every class), plus those waiting inside the
  engine where it says so (vLLM's own gauge);
- running: the steps steward granted the model's engine (its slots in use), or the engine's own
  count where it gives one;
- KV-cache use, a fraction 0..1 (the picker's flag says "from 0 to 1"): the engine's own
  figure where it gives one, as its adapter last read it (vLLM's ``vllm:kv_cache_usage_perc``;
  llama-server's computing slots' tokens over its cache, from ``/slots``: the llama-server
  built here, llama.cpp from llama-cpp-python 0.3.36, has no KV-cache gauge in ``/metrics``).
  Where none exists (Ollama says nothing of its cache; an engine that has not answered yet,
  or answers without it) the share of its slots in use: what a slot-bounded engine fills
  next, at 1.0 the next request waits. docs/cluster.md lists which engine gives which.

There is no ``vllm:lora_requests_info``: steward serves no LoRA adapters, and the picker's
LoRA affinity is off for an engine whose spec leaves it empty.

``steward_model_ready`` says, per model, what ``/healthz/models/NAME`` answers (readiness.py).
Everything is read from the scheduler at scrape time: nothing here polls an engine (the
engines' figures come from the driver's usage poll, supervisor/engines/driver.py).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from supervisor.scheduler.actor import SchedulerClient
from supervisor.scheduler.types import EngineSnapshot, EngineStatus

MODEL_LABEL = "model_name"  # vLLM's label for the model, which the protocol's metric specs select on
QUEUED = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_CACHE = "vllm:kv_cache_usage_perc"
READY = "steward_model_ready"


def queued(engine: EngineSnapshot) -> int:
    """Requests for the model not yet computing: steward's queue, and the engine's own where it says."""
    return engine.queued + (engine.engine_waiting or 0)


def running(engine: EngineSnapshot) -> int:
    """Requests computing: the engine's own count where it gives one (what steward granted may still
    wait inside it, counted as queued), else the slots steward granted."""
    if engine.engine_running is not None:
        return engine.engine_running
    return engine.in_flight


def kv_cache_use(engine: EngineSnapshot) -> float:
    """The engine's KV-cache use, 0..1, as it last said; else the share of its slots in use
    (0 while it is not loaded)."""
    if engine.status is not EngineStatus.READY:
        return 0.0
    if engine.engine_kv_usage is not None:
        return engine.engine_kv_usage
    if engine.slots <= 0:
        return 0.0
    return min(1.0, engine.in_flight / engine.slots)


class ModelServerCollector(Collector):
    """The protocol's gauges and the per-model readiness, one series per model steward serves."""

    def __init__(self, scheduler: SchedulerClient) -> None:
        self._scheduler = scheduler

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshot = self._scheduler.snapshot()
        families = {
            QUEUED: GaugeMetricFamily(QUEUED, "Requests for the model waiting: in steward's queue (every class) and "
                                      "inside its engine (GIE model-server protocol: TotalQueuedRequests)",
                                      labels=[MODEL_LABEL]),
            RUNNING: GaugeMetricFamily(RUNNING, "Requests for the model computing on its engine (GIE model-server "
                                       "protocol: TotalRunningRequests)", labels=[MODEL_LABEL]),
            KV_CACHE: GaugeMetricFamily(KV_CACHE, "The model's KV-cache use, 0..1: as its engine says, else the share "
                                        "of its slots in use (GIE model-server protocol: KVCacheUtilization)",
                                        labels=[MODEL_LABEL]),
            READY: GaugeMetricFamily(READY, "1 while the model may be sent work: resident, loading, or loadable "
                                     "without evicting hot or busy work (/healthz/models/NAME)", labels=[MODEL_LABEL]),
        }
        for engine in snapshot.engines:
            label = [engine.name]
            families[QUEUED].add_metric(label, queued(engine))
            families[RUNNING].add_metric(label, running(engine))
            families[KV_CACHE].add_metric(label, kv_cache_use(engine))
            readiness = self._scheduler.readiness(engine.name)
            if readiness is not None:
                families[READY].add_metric(label, 1.0 if readiness.ready else 0.0)
        yield from families.values()
