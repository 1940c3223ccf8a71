"""Prometheus metrics, counted from the event log's events and read from the scheduler.

Counters and histograms follow the events (every decision that matters is one), so the
metrics and the log can never disagree; gauges are read from a scheduler snapshot at
scrape time. The turnstile metrics keep gpu-turnstile's names for its dashboards.
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from supervisor.events import Event
from supervisor.scheduler.actor import SchedulerClient

WAIT_BUCKETS = (0.005, 0.05, 0.25, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)


class _SchedulerCollector(Collector):
    def __init__(self, scheduler: SchedulerClient) -> None:
        self._scheduler = scheduler

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshot = self._scheduler.snapshot()
        llm = sum(e.in_flight for e in snapshot.engines)
        current = "image" if snapshot.mode == "exclusive" else ("llm" if llm else "idle")
        state = GaugeMetricFamily("gpu_turnstile_state", "The GPU's state: idle, llm or image", labels=["state"])
        for name in ("idle", "llm", "image"):
            state.add_metric([name], 1.0 if name == current else 0.0)
        yield state
        yield GaugeMetricFamily("gpu_turnstile_llm_inflight", "LLM requests in flight", value=llm)
        queued = GaugeMetricFamily("steward_queued", "Steps waiting, per class", labels=["class"])
        running = GaugeMetricFamily("steward_running", "Steps running, per class", labels=["class"])
        for klass, count in snapshot.queued_by_class.items():
            queued.add_metric([klass], count)
            running.add_metric([klass], snapshot.running_by_class[klass])
        yield queued
        yield running
        yield GaugeMetricFamily("steward_budget_bytes", "Memory steward may reserve", value=snapshot.budget)
        yield GaugeMetricFamily("steward_reserved_bytes", "Memory reserved by engines", value=snapshot.reserved)
        yield GaugeMetricFamily("steward_outside_bytes", "Memory used by other processes", value=snapshot.outside)
        families = {name: GaugeMetricFamily(f"steward_engine_{name}", help_text, labels=["engine"])
                    for name, help_text in (("in_flight", "Steps running on the engine"),
                                            ("slots", "The engine's slots"),
                                            ("queued", "Steps waiting for the engine"),
                                            ("reserved_bytes", "Memory reserved for the engine"),
                                            ("ready", "1 while the engine serves"),
                                            ("healthy", "0 while the engine fails its health checks"),
                                            ("measured_bytes", "The most its process tree was seen to hold"),
                                            ("reported_running", "Requests running inside the engine, as it says"),
                                            ("reported_waiting", "Requests queued inside the engine, as it says"))}
        for engine in snapshot.engines:
            families["in_flight"].add_metric([engine.name], engine.in_flight)
            families["slots"].add_metric([engine.name], engine.slots)
            families["queued"].add_metric([engine.name], engine.queued)
            families["reserved_bytes"].add_metric([engine.name], engine.reserved)
            families["ready"].add_metric([engine.name], 1.0 if engine.status == "ready" else 0.0)
            families["healthy"].add_metric([engine.name], 1.0 if engine.healthy else 0.0)
            families["measured_bytes"].add_metric([engine.name], engine.measured)
            # Only engines that say (vLLM's metrics): overload inside the engine shows here too.
            if engine.engine_running is not None:
                families["reported_running"].add_metric([engine.name], engine.engine_running)
            if engine.engine_waiting is not None:
                families["reported_waiting"].add_metric([engine.name], engine.engine_waiting)
        yield from families.values()


@attrs.define(eq=False, slots=False)
class StewardMetrics:
    registry: CollectorRegistry = attrs.Factory(CollectorRegistry)

    def __attrs_post_init__(self) -> None:
        r = self.registry
        self.lock_wait = Histogram("gpu_turnstile_lock_wait_seconds", "Time a request waited for the GPU",
                                   ["kind"], buckets=WAIT_BUCKETS, registry=r)
        self.image_jobs = Counter("gpu_turnstile_image_jobs", "Image jobs that held the GPU", registry=r)
        self.unload = Histogram("gpu_turnstile_unload_seconds", "Time Ollama took to unload its models",
                                buckets=WAIT_BUCKETS, registry=r)
        self.waited = Histogram("steward_wait_seconds", "Time a step waited in steward's queue", ["class"],
                                buckets=WAIT_BUCKETS, registry=r)
        self.rejected = Counter("steward_rejected", "Steps refused or timed out", ["class", "reason"], registry=r)
        self.loads = Counter("steward_loads", "Engine loads decided", ["engine"], registry=r)
        self.evictions = Counter("steward_evictions", "Engines chosen for eviction", ["engine"], registry=r)
        self.crashes = Counter("steward_crashes", "Engines that exited unexpectedly", ["engine"], registry=r)
        self.failed_checks = Counter("steward_health_check_failures", "Failed health checks of ready engines",
                                     ["engine"], registry=r)
        self.unhealthy = Counter("steward_engine_unhealthy", "Times an engine was found unhealthy", ["engine"],
                                 registry=r)
        self.stalls = Counter("steward_engine_stalls", "Requests an engine left without a byte past a timeout",
                              ["engine"], registry=r)
        self.connections_refused = Counter("steward_connections_refused", "Connections refused at the door",
                                           ["listener", "reason"], registry=r)
        self.connection_errors = Counter("steward_connection_errors", "Connections ended by an error in steward",
                                         ["listener"], registry=r)
        self.internal_errors = Counter("steward_internal_errors", "Errors of steward's own (bugs)", registry=r)

    def watch(self, scheduler: SchedulerClient) -> None:
        self.registry.register(_SchedulerCollector(scheduler))

    def observe(self, event: Event) -> None:
        f = event.fields
        match event.name:
            case "dispatch":
                self.waited.labels(f["class"]).observe(f["waited_s"])
                self.lock_wait.labels("image" if f.get("exclusive") else "llm").observe(f["waited_s"])
            case "reject":
                self.rejected.labels(f.get("class", ""), f["reason"]).inc()
            case "timeout":
                self.rejected.labels(f.get("class", ""), "queue_timeout").inc()
            case "load" | "restart":
                self.loads.labels(f["engine"]).inc()
            case "evict":
                self.evictions.labels(f["engine"]).inc()
            case "crash":
                self.crashes.labels(f["engine"]).inc()
            case "ollama_unload":
                self.unload.observe(f["seconds"])
            case "image_released":
                self.image_jobs.inc()
            case "health_check_failed":
                self.failed_checks.labels(f["engine"]).inc()
            case "engine_unhealthy":
                self.unhealthy.labels(f["engine"]).inc()
            case "engine_stalled":
                self.stalls.labels(f["engine"]).inc()
            case "connection_refused":
                self.connections_refused.labels(f["listener"], f["reason"]).inc()
            case "cross_site_refused":
                self.connections_refused.labels(f["listener"], "cross_site").inc()
            case "connection_error":
                self.connection_errors.labels(f["listener"]).inc()
            case "internal_error":
                self.internal_errors.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
