"""Prometheus metrics, counted from the event log's events and read from the scheduler.

Counters and histograms follow the events (every decision that matters is one), so the
metrics and the log can never disagree; gauges are read from a scheduler snapshot at
scrape time. The turnstile metrics keep gpu-turnstile's names for its dashboards.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import attrs
import trio
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from supervisor.observe.events import Event
from supervisor.observe.model_server_metrics import ModelServerCollector
from supervisor.engines.memory_plan import device_label
from supervisor.scheduler.actor import SchedulerClient
from supervisor.request_class import RequestClass
from supervisor.scheduler.types import (
    DeviceSnapshot,
    EngineSnapshot,
    EngineStatus,
    GpuMode,
    SchedulerSnapshot,
)
from supervisor.usage.row import UsageRow

if TYPE_CHECKING:
    from supervisor.nodes.fleet import FleetSnapshot
    from supervisor.observe.health import HealthWatch
    from supervisor.observe.slowdown import SpeedBook

WAIT_BUCKETS = (0.005, 0.05, 0.25, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
SLOWDOWN_BUCKETS = (1.1, 1.25, 1.5, 2, 3, 5, 10, 20, 50)  # times slower than the engine alone
# A snapshot shows a draining engine as ready (with draining set).
ENGINE_STATES = tuple(status for status in EngineStatus if status is not EngineStatus.DRAINING)
RATE_WINDOW_S = 60.0  # tokens per second are averaged over this
NODE_STATES = ("awake", "waking", "asleep", "down")  # supervisor.nodes.routing.Availability's values
# A front door's wake events, by what came of the wake.
WAKE_OUTCOMES = {"node_wake": "sent", "node_woken": "woken", "node_wake_timeout": "timeout",
                 "node_wake_failed": "failed"}


def ledger_tier(engine: EngineSnapshot) -> str:
    """Which tier an engine's reservation is in: what evicting it would cost."""
    if engine.status is EngineStatus.SLEEPING:
        return "asleep"
    if engine.pinned:
        return "pinned"
    return "hot" if engine.hot else "cold"


def device_tiers(snapshot: SchedulerSnapshot, device: DeviceSnapshot, *, freeing: bool = False) -> dict[str, int]:
    """What each tier holds on *device*, an exclusive (image) job's reservation included;
    *freeing*: engines on their way out count as a tier of their own."""
    tiers = dict.fromkeys(("pinned", "hot", "cold", "asleep", *(("freeing",) if freeing else ())), 0)
    for engine in snapshot.engines:
        leaving = freeing and (engine.draining or engine.status in (EngineStatus.STOPPED, EngineStatus.FAILED))
        tiers["freeing" if leaving else ledger_tier(engine)] += engine.held.get(device.index, 0)
    tiers["exclusive"] = max(0, device.reserved - sum(e.held.get(device.index, 0) for e in snapshot.engines))
    return tiers


class _FrontDoorCollector(Collector):
    """Every queue (per engine and class, exclusive jobs included), the ledger by tier, the health."""

    def __init__(self, scheduler: SchedulerClient, health: HealthWatch | None, device: str,
                 tokens: collections.deque[tuple[float, int]], speeds: SpeedBook | None = None) -> None:
        self._scheduler, self._health, self._device, self._tokens = scheduler, health, device, tokens
        self._speeds = speeds

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshot = self._scheduler.snapshot()
        now = trio.current_time()
        waiting = GaugeMetricFamily("steward_waiting", "Steps waiting in steward's queue, per engine and class "
                                    "(engine 'exclusive': whole-GPU jobs such as images)", labels=["engine", "class"])
        oldest = GaugeMetricFamily("steward_oldest_wait_seconds", "How long the longest-waiting step of a class has "
                                   "waited", labels=["class"])
        # Every queue, empty ones too: a gauge that is absent when zero cannot be told from a missing one.
        counts = {(engine, klass): 0 for engine in [e.name for e in snapshot.engines] + ["exclusive"]
                  for klass in RequestClass}
        for line in snapshot.lines:
            counts[line.engine or "exclusive", line.klass] = line.waiting
        for (engine, klass), count in counts.items():
            waiting.add_metric([engine, klass], count)
        for klass in RequestClass:
            since = snapshot.oldest_waiting(klass)
            oldest.add_metric([klass], 0.0 if since is None else max(0.0, now - since))
        yield waiting
        yield oldest
        yield self._ledger(snapshot)
        yield from self._devices(snapshot)
        states = GaugeMetricFamily("steward_engine_state", "1 for the engine's current state", labels=["engine", "state"])
        for engine in snapshot.engines:
            for state in ENGINE_STATES:
                states.add_metric([engine.name, state], 1.0 if engine.status is state else 0.0)
        yield states
        if self._speeds is not None:
            alone = GaugeMetricFamily("steward_engine_alone_tokens_per_second", "How fast the engine decodes with "
                                      "nothing beside it (steward calibrate, then learned from answers alone)",
                                      labels=["engine"])
            for engine in snapshot.engines:
                if (tps := self._speeds.alone(engine.name)) is not None:
                    alone.add_metric([engine.name], tps)
            yield alone
        while self._tokens and self._tokens[0][0] < now - RATE_WINDOW_S:
            self._tokens.popleft()
        yield GaugeMetricFamily("steward_tokens_per_second", f"Completion tokens per second over the last "
                                f"{RATE_WINDOW_S:g}s", value=sum(n for _, n in self._tokens) / RATE_WINDOW_S)
        if self._health is not None:
            yield from self._health_families()

    def _devices(self, snapshot: SchedulerSnapshot) -> Iterator[GaugeMetricFamily]:
        families = {name: GaugeMetricFamily(f"steward_device_{name}_bytes", help_text, labels=["device"])
                    for name, help_text in (("budget", "Memory steward may reserve on the device"),
                                            ("reserved", "Memory reserved on the device"),
                                            ("outside", "Memory used on the device by processes that are not engines"),
                                            ("free", "Memory free on the device for a load"))}
        for device in snapshot.devices:
            label = [device_label(self._device, device.index)]  # type: ignore[arg-type]
            for name in families:
                families[name].add_metric(label, getattr(device, name))
        yield from families.values()

    def _ledger(self, snapshot: SchedulerSnapshot) -> GaugeMetricFamily:
        ledger = GaugeMetricFamily("steward_ledger_bytes", "Memory reserved in the ledger, per device and tier",
                                   labels=["device", "tier"])
        for device in snapshot.devices:
            for tier, nbytes in device_tiers(snapshot, device).items():
                ledger.add_metric([device_label(self._device, device.index), tier], nbytes)  # type: ignore[arg-type]
        return ledger

    def _health_families(self) -> Iterator[GaugeMetricFamily]:
        assert self._health is not None
        health = self._health.assess()
        status = GaugeMetricFamily("steward_health_status", "1 for steward's health now (/healthz)", labels=["status"])
        for name in ("ok", "degraded", "overloaded"):
            status.add_metric([name], 1.0 if health.status.value == name else 0.0)
        yield status
        share = GaugeMetricFamily("steward_waited_share", "The share of steps that had to wait, over the health "
                                  "window", labels=["class"])
        for klass, value in health.waited_share.items():
            if value is not None:
                share.add_metric([klass], value)
        yield share
        window = "over the health window (health.window); absent while no answer tells"
        slowdown = GaugeMetricFamily("steward_class_slowdown", "How many times slower than their engines alone a "
                                     f"class's answers decoded, {window}", labels=["class", "quantile"])
        ttft = GaugeMetricFamily("steward_class_time_to_first_token_seconds", "A class's time to first token, "
                                 f"{window}", labels=["class", "quantile"])
        slowed = GaugeMetricFamily("steward_class_slowed", "1 while a class answers more than health.slowdown times "
                                   "slower than alone", labels=["class"])
        for klass, pace in health.paces.items():
            for quantile, factor, seconds in (("0.5", pace.slowdown_p50, pace.ttft_p50_s),
                                              ("0.95", pace.slowdown_p95, pace.ttft_p95_s)):
                if factor is not None:
                    slowdown.add_metric([klass, quantile], factor)
                if seconds is not None:
                    ttft.add_metric([klass, quantile], seconds)
            slowed.add_metric([klass], 1.0 if klass in health.slowed else 0.0)
        yield slowdown
        yield ttft
        yield slowed


class _SchedulerCollector(Collector):
    def __init__(self, scheduler: SchedulerClient) -> None:
        self._scheduler = scheduler

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshot = self._scheduler.snapshot()
        llm = sum(e.in_flight for e in snapshot.engines)
        current = "image" if snapshot.mode is GpuMode.EXCLUSIVE else ("llm" if llm else "idle")
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
            families["ready"].add_metric([engine.name], 1.0 if engine.status is EngineStatus.READY else 0.0)
            families["healthy"].add_metric([engine.name], 1.0 if engine.healthy else 0.0)
            families["measured_bytes"].add_metric([engine.name], engine.measured)
            # Only engines that say (vLLM's metrics): overload inside the engine shows here too.
            if engine.engine_running is not None:
                families["reported_running"].add_metric([engine.name], engine.engine_running)
            if engine.engine_waiting is not None:
                families["reported_waiting"].add_metric([engine.name], engine.engine_waiting)
        yield from families.values()


class _FleetCollector(Collector):
    """A front door's nodes and the requests it holds for them, read at scrape time."""

    def __init__(self, fleet: Callable[[], FleetSnapshot]) -> None:
        self._fleet = fleet

    def collect(self) -> Iterator[GaugeMetricFamily]:
        fleet = self._fleet()
        state = GaugeMetricFamily("steward_node_state", "1 for the node's current state", labels=["node", "state"])
        age = GaugeMetricFamily("steward_node_last_poll_age_seconds", "How long ago the node's last poll ended "
                                "(answered or not)", labels=["node"])
        free = GaugeMetricFamily("steward_node_free_bytes", "Memory free on a node's device, as its last poll said "
                                 "(awake nodes only)", labels=["node", "device"])
        held = GaugeMetricFamily("steward_held_requests", "Requests held for the node (waiting for it to wake)",
                                 labels=["node"])
        for report in fleet.nodes:
            name, view = report.view.name, report.view
            for value in NODE_STATES:
                state.add_metric([name, value], 1.0 if view.availability.value == value else 0.0)
            if report.last_poll is not None:
                age.add_metric([name], max(0.0, fleet.now - report.last_poll.at))
            if view.awake and view.state is not None:
                for device in view.state.devices:
                    free.add_metric([name, device.device], device.free)
            held.add_metric([name], fleet.held_for(name))
        yield from (state, age, free, held)


class _RemoteCollector(Collector):
    """The remote models (runtime: remote): their places at the cloud in use and who waits, read at
    scrape time from the gateway's (the last one told: a listener made again replaces it)."""

    def __init__(self) -> None:
        self.rows: Callable[[], list[dict[str, Any]]] = list

    def collect(self) -> Iterator[GaugeMetricFamily]:
        places = GaugeMetricFamily("steward_remote_places", "Requests a remote model may have at its cloud at once "
                                   "(max_concurrency)", labels=["model"])
        in_flight = GaugeMetricFamily("steward_remote_in_flight", "Requests at a remote model's cloud now",
                                      labels=["model"])
        waiting = GaugeMetricFamily("steward_remote_waiting", "Requests waiting for one of a remote model's places",
                                    labels=["model"])
        for row in self.rows():
            places.add_metric([row["name"]], row["max_concurrency"])
            in_flight.add_metric([row["name"]], row["in_flight"])
            waiting.add_metric([row["name"]], row["waiting"])
        yield from (places, in_flight, waiting)


@attrs.define(eq=False, slots=False)
class StewardMetrics:
    registry: CollectorRegistry = attrs.Factory(CollectorRegistry)

    def __attrs_post_init__(self) -> None:
        r = self.registry
        self.lock_wait = Histogram("gpu_turnstile_lock_wait_seconds", "Time a request waited for the GPU",
                                   ["kind"], buckets=WAIT_BUCKETS, registry=r)
        self.image_jobs = Counter("gpu_turnstile_image_jobs", "Image jobs that held the GPU", registry=r)
        self.images = Counter("steward_images_generated", "Images handed out by /v1/images/generations",
                              ["model"], registry=r)
        self.image_failures = Counter("steward_image_failures", "/v1/images/generations jobs that gave no image",
                                      ["code"], registry=r)
        self.videos = Counter("steward_videos", "/v1/videos jobs that ended, by how", ["model", "status"],
                              registry=r)
        self.unload = Histogram("gpu_turnstile_unload_seconds", "Time Ollama took to unload its models",
                                buckets=WAIT_BUCKETS, registry=r)
        self.waited = Histogram("steward_wait_seconds", "Time a step waited in steward's queue", ["class"],
                                buckets=WAIT_BUCKETS, registry=r)
        self.rejected = Counter("steward_rejected", "Steps refused or timed out", ["class", "reason"], registry=r)
        self.loads = Counter("steward_loads", "Engine loads decided", ["engine"], registry=r)
        self.evictions = Counter("steward_evictions", "Engines chosen for eviction", ["engine"], registry=r)
        self.swap_holds = Counter("steward_swap_holds", "Requests whose load was held so that requests for "
                                  "loaded models go first (scheduler.swap_hold)", ["class"], registry=r)
        self.warm_loads = Counter("steward_warm_loads", "Engines loaded ahead of demand after an image job or an idle "
                                  "unload (scheduler.warm, recent use)", ["engine"], registry=r)
        self.fallbacks = Counter("steward_fallbacks", "Waiting requests sent along their model's fallback chain "
                                 "(models.NAME.fallback), by the model asked for, the one that served and why",
                                 ["model", "to", "when"], registry=r)
        self.evictions_undone = Counter("steward_evictions_undone", "Drains undone: what they were for went away",
                                        ["engine"], registry=r)
        self.kv_cache = Counter("steward_kv_cache", "Slot KV cache saves and restores (keep_cache), by outcome: "
                                "saved, restored, or skipped_WHY", ["engine", "outcome"], registry=r)
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
        self.dispatched = Counter("steward_dispatched", "Steps started, per class", ["class"], registry=r)
        self.dispatched_waited = Counter("steward_dispatched_waited", "Steps that had to wait before they started",
                                         ["class"], registry=r)
        self.requests = Counter("steward_requests", "Requests answered, per listener, key, class and status",
                                ["listener", "key", "class", "status"], registry=r)
        self.ttft = Histogram("steward_time_to_first_token_seconds", "From a request's arrival to the first byte "
                              "of its answer", ["class"], buckets=TTFT_BUCKETS, registry=r)
        self.slowdown = Histogram("steward_slowdown", "How many times slower than its engine decodes alone an "
                                  "answer decoded (answers whose engine's speed alone is known)", ["class"],
                                  buckets=SLOWDOWN_BUCKETS, registry=r)
        self.tokens = Counter("steward_tokens", "Tokens in answered requests, per model and kind", ["model", "kind"],
                              registry=r)
        self.speech = Counter("steward_speech", "Speech answered (/v1/audio/speech), per model: characters in "
                              "(kind input_chars) and seconds of audio out where measured (kind audio_seconds)",
                              ["model", "kind"], registry=r)
        self.context_exceeded = Counter("steward_context_exceeded", "Prompts an engine refused as too long for a "
                                        "slot of their model (the event context_exceeded)", ["model"], registry=r)
        self.alerts = Counter("steward_alerts", "Alerts sent to the webhook, or failed", ["kind", "outcome"],
                              registry=r)
        self.usage_failures = Counter("steward_usage_write_failures", "Times the usage log could not be written",
                                      registry=r)
        self.log_failures = Counter("steward_event_log_write_failures", "Times the event log could not be written",
                                    registry=r)
        self.rows_lost = Counter("steward_usage_rows_lost", "Usage rows that never reached the database", registry=r)
        self.task_failures = Counter("steward_task_failures", "Failures of steward's own long-lived tasks (restarted "
                                     "unless fatal)", ["task", "fatal"], registry=r)
        self.own_poll_lines = Counter("steward_engine_poll_lines", "Lines of an engine's access log for steward's "
                                      "own polls (its health checks, its /metrics reads): counted, not logged",
                                      ["engine", "path"], registry=r)
        self.output_lines = Counter("steward_engine_output_lines", "Lines of an engine's output, kept in its "
                                    "own log (steward logs NAME), not the event log", ["engine"], registry=r)
        self.polls_answered = Counter("steward_polls_answered", "Polls steward answered without a request event "
                                      "or usage row (/steward/state, /healthz, /metrics, /admin/state, ...)",
                                      ["listener", "path"], registry=r)
        self.node_wakes = Counter("steward_node_wakes", "A front door's wakes of its nodes, by outcome (sent, woken, "
                                  "timeout, failed)", ["node", "outcome"], registry=r)
        self.route_waits = Counter("steward_route_waits", "Requests a front door held for a node to wake",
                                   ["node"], registry=r)
        self._recent_tokens: collections.deque[tuple[float, int]] = collections.deque(maxlen=100_000)
        self._remote = _RemoteCollector()
        r.register(self._remote)

    def watch(self, scheduler: SchedulerClient, health: HealthWatch | None = None, device: str = "gpu",
              speeds: SpeedBook | None = None) -> None:
        self.registry.register(_SchedulerCollector(scheduler))
        self.registry.register(_FrontDoorCollector(scheduler, health, device, self._recent_tokens, speeds))
        self.registry.register(ModelServerCollector(scheduler))  # what a cluster's router reads, per model

    def watch_remote(self, rows: Callable[[], list[dict[str, Any]]]) -> None:
        """The remote models' places and waiters (gateway/cloud.py's ``state``), read at each scrape."""
        self._remote.rows = rows

    def watch_fleet(self, fleet: Callable[[], FleetSnapshot]) -> None:
        """A front door's: its nodes and the requests held for them, read at each scrape."""
        self.registry.register(_FleetCollector(fleet))

    def observe_usage(self, row: UsageRow) -> None:
        """Counted from each usage row, as the events are: metrics and the usage log agree."""
        klass = row.klass or ""
        self.requests.labels(row.listener, row.key or "", klass, str(row.status)).inc()
        if row.status == 200 and row.ttft_s is not None:
            self.ttft.labels(klass).observe(row.ttft_s)
        if row.slowdown is not None:
            self.slowdown.labels(klass).observe(row.slowdown)
        model = row.model or ""
        if row.prompt_tokens:
            self.tokens.labels(model, "prompt").inc(row.prompt_tokens)
        if row.completion_tokens:
            self.tokens.labels(model, "completion").inc(row.completion_tokens)
            self._recent_tokens.append((trio.current_time(), row.completion_tokens))
        if row.input_chars:
            self.speech.labels(model, "input_chars").inc(row.input_chars)
        if row.audio_s:
            self.speech.labels(model, "audio_seconds").inc(row.audio_s)

    def observe(self, event: Event) -> None:
        f = event.fields
        match event.name:
            case "dispatch":
                self.waited.labels(f["class"]).observe(f["waited_s"])
                self.dispatched.labels(f["class"]).inc()
                if f["waited_s"] > 0:
                    self.dispatched_waited.labels(f["class"]).inc()
                self.lock_wait.labels("image" if f.get("exclusive") else "llm").observe(f["waited_s"])
            case "reject":
                self.rejected.labels(f.get("class", ""), f["reason"]).inc()
            case "timeout":
                self.rejected.labels(f.get("class", ""), "queue_timeout").inc()
            case "refused":
                self.rejected.labels(f.get("class") or "", f["reason"]).inc()
            case "alert_sent" | "alert_failed":
                self.alerts.labels(f["kind"], "sent" if event.name == "alert_sent" else "failed").inc()
            case "usage_write_failed":
                self.usage_failures.inc()
            case "log_write_failed":
                self.log_failures.inc()
            case "usage_rows_lost":
                self.rows_lost.inc(f["lost"])
            case "usage_rows_dropped":
                self.rows_lost.inc(f["dropped"])
            case "task_failed":
                self.task_failures.labels(f["task"], "true" if f.get("fatal") else "false").inc()
            case "load" | "restart":
                self.loads.labels(f["engine"]).inc()
            case "evict":
                self.evictions.labels(f["engine"]).inc()
            case "swap_held":
                self.swap_holds.labels(f["class"]).inc()
            case "warm":
                self.warm_loads.labels(f["engine"]).inc()
            case "fallback":
                self.fallbacks.labels(f["model"], f["to"], f["when"]).inc()
            case "cache_saved" | "cache_restored":
                self.kv_cache.labels(f["engine"], event.name.removeprefix("cache_")).inc()
            case "cache_skipped":
                self.kv_cache.labels(f["engine"], f"skipped_{f['why']}").inc()
            case "evict_undone":
                self.evictions_undone.labels(f["engine"]).inc()
            case "crash":
                self.crashes.labels(f["engine"]).inc()
            case "node_wake" | "node_woken" | "node_wake_timeout" | "node_wake_failed":
                self.node_wakes.labels(f["node"], WAKE_OUTCOMES[event.name]).inc()
            case "route_wait":
                self.route_waits.labels(f["node"]).inc()
            case "ollama_unload":
                self.unload.observe(f["seconds"])
            case "image_released":
                self.image_jobs.inc()
            case "images_generated":
                self.images.labels(f["model"]).inc(f["images"])
            case "images_failed":
                self.image_failures.labels(f["code"]).inc()
            case "video_completed" | "video_failed" | "video_deleted":
                self.videos.labels(f["model"], f["status"]).inc()
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
            case "context_exceeded":
                self.context_exceeded.labels(f["model"]).inc()
            case "connection_error":
                self.connection_errors.labels(f["listener"]).inc()
            case "internal_error":
                self.internal_errors.inc()
            # Counted only (EventLog.count): never in the log.
            case "engine_poll_line":
                self.own_poll_lines.labels(f["engine"], f["path"]).inc()
            case "engine_output_line":
                self.output_lines.labels(f["engine"]).inc()
            case "poll_answered":
                self.polls_answered.labels(f["listener"], f["path"]).inc()

    def completion_tokens(self) -> int:
        """Completion tokens answered since start (the history's tokens/s: this counter's growth)."""
        return int(sum(s.value for s in _totals(self.tokens) if s.labels.get("kind") == "completion"))

    def rejections(self) -> dict[str, int]:
        """Steps refused or timed out since start, by reason."""
        by_reason: dict[str, int] = {}
        for sample in _totals(self.rejected):
            by_reason[sample.labels["reason"]] = by_reason.get(sample.labels["reason"], 0) + int(sample.value)
        return by_reason

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _totals(counter: Counter) -> list[Any]:
    return [sample for family in counter.collect() for sample in family.samples if sample.name.endswith("_total")]


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
