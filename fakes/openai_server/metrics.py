"""``GET /metrics``: vLLM's Prometheus families (names, help texts, labels) through prometheus_client.

As in vLLM v1 every family is labelled ``model_name`` and ``engine`` (the data-parallel index,
"0" here); ``vllm:engine_sleep_state`` adds ``sleep_state``; ``vllm:request_success`` adds
``finished_reason``. The ``fake:`` gauges are ours, for tests.
"""

from __future__ import annotations

import attrs
import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge

from fakes.openai_server.engine import FINISH_REASONS, Engine

ENGINE_INDEX = "0"
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST.encode()


def sleep_state_values(sleep_level: int) -> dict[str, int]:
    """vLLM's record_sleep_state: a level other than 1 or 2 sets neither of their gauges."""
    asleep = sleep_level > 0
    return {"awake": 0 if asleep else 1, "weights_offloaded": int(sleep_level == 1),
            "discard_all": int(sleep_level == 2)}


@attrs.define(eq=False)
class Metrics:
    engine: Engine
    registry: CollectorRegistry = attrs.field(factory=CollectorRegistry, init=False)
    _gauges: dict[str, Gauge] = attrs.field(factory=dict, init=False)
    _counters: dict[str, Counter] = attrs.field(factory=dict, init=False)
    _sleep: Gauge = attrs.field(init=False)
    _success: Counter = attrs.field(init=False)
    _counted: dict[str, float] = attrs.field(factory=dict, init=False)  # what the counters have been given

    def __attrs_post_init__(self) -> None:
        labels = ["model_name", "engine"]
        for name, doc in (("vllm:num_requests_running", "Number of requests in model execution batches."),
                          ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
                          ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")):
            self._gauges[name] = Gauge(name, doc, labels, registry=self.registry)
        self._sleep = Gauge("vllm:engine_sleep_state",
                            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
                            "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
                            [*labels, "sleep_state"], registry=self.registry)
        for name, doc in (("vllm:num_preemptions", "Cumulative number of preemption from the engine."),
                          ("vllm:prompt_tokens", "Number of prefill tokens processed."),
                          ("vllm:generation_tokens", "Number of generation tokens processed.")):
            self._counters[name] = Counter(name, doc, labels, registry=self.registry)
        self._success = Counter("vllm:request_success", "Count of successfully processed requests.",
                                [*labels, "finished_reason"], registry=self.registry)
        for name, doc in (("fake:max_num_requests_running", "The most requests ever running at once."),
                          ("fake:max_num_requests_waiting", "The most requests ever waiting at once.")):
            self._gauges[name] = Gauge(name, doc, ["model_name"], registry=self.registry)
        self._update()  # every series exists from the start, as vLLM creates them at init

    def _update(self) -> None:
        engine, stats = self.engine, self.engine.stats
        model = engine.cfg.model_name
        for name, value in (("vllm:num_requests_running", stats.running),
                            ("vllm:num_requests_waiting", stats.waiting),
                            ("vllm:kv_cache_usage_perc", engine.kv_cache_usage)):
            self._gauges[name].labels(model, ENGINE_INDEX).set(value)
        for state, value in sleep_state_values(engine.sleep_level).items():
            self._sleep.labels(model, ENGINE_INDEX, state).set(value)
        totals = {"vllm:num_preemptions": 0, "vllm:prompt_tokens": stats.prompt_tokens,
                  "vllm:generation_tokens": stats.generation_tokens}
        for name, total in totals.items():
            self._advance(self._counters[name].labels(model, ENGINE_INDEX), name, total)
        for reason in FINISH_REASONS:
            self._advance(self._success.labels(model, ENGINE_INDEX, reason), reason, stats.finished[reason])
        self._gauges["fake:max_num_requests_running"].labels(model).set(stats.max_running)
        self._gauges["fake:max_num_requests_waiting"].labels(model).set(stats.max_waiting)

    def _advance(self, counter: Counter, key: str, total: float) -> None:
        """Counters only go up: give them what the engine counted since the last scrape."""
        counter.inc(total - self._counted.get(key, 0))
        self._counted[key] = total

    def render(self) -> bytes:
        self._update()
        return prometheus_client.generate_latest(self.registry)
