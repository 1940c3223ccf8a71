"""The policies a scenario replays through, by name, all with Scheduler's interface."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import attrs

from supervisor import config_policy
from supervisor.config import Config, SchedulerConfig
from supervisor.scheduler.core import Scheduler
from supervisor.scheduler.types import Effect, EngineProfile, SchedulingPolicy
from supervisor.tools.simulate.baselines import CollatePolicy, FifoPolicy, KeepAlivePolicy, LruCountPolicy, SwapPolicy
from supervisor.tools.simulate.scenario import Scenario


class Policy(Protocol):
    def start(self, now: float) -> list[Effect]: ...

    def submit(self, job_id: int, model: str | None, klass: str, now: float, *, seq: int | None = None,
               request: int | None = None, step: int = 1, steps: int = 1, exclusive_memory: int | None = None,
               timeout: float | None = None, handoff: tuple[int, int | None] | None = None) -> list[Effect]: ...

    def finish(self, job_id: int, now: float, status: int | None = None) -> list[Effect]: ...

    def engine_ready(self, name: str, generation: int, endpoint: str, now: float,
                     pid: int | None = None) -> list[Effect]: ...

    def engine_exited(self, name: str, generation: int, now: float, detail: str) -> list[Effect]: ...

    def observe(self, now: float, used: int, processes: dict[int, int]) -> list[Effect]: ...

    def tick(self, now: float) -> list[Effect]: ...

    def next_wakeup(self) -> float | None: ...


def profiles(scenario: Scenario, *, fallback: bool = True) -> list[EngineProfile]:
    """*fallback*: with the engines' fallback chains (else as if none were configured)."""
    return [EngineProfile(name, e.memory, e.slots, e.pinned,
                          fallback=config_policy.fallback_routes(e.fallback) if fallback else ())
            for name, e in scenario.engines.items()]


def scheduling_policy(scenario: Scenario, scheduler: SchedulerConfig | None = None) -> SchedulingPolicy:
    """Exactly what `steward run` would make of the same config sections."""
    scheduler = scenario.scheduler if scheduler is None else scheduler
    return config_policy.scheduling_policy(Config(models={}, scheduler=scheduler, classes=scenario.classes))


def strict_arrival_order(scheduler: SchedulerConfig) -> SchedulerConfig:
    """The same knobs with swap-aware order off (``swap_hold: 0s``), where the config has it (issue 16)."""
    if "swap_hold" not in attrs.fields_dict(SchedulerConfig):
        return scheduler
    return attrs.evolve(scheduler, swap_hold=0.0)


def queue_timeouts(scenario: Scenario) -> dict[str, float]:
    return scheduling_policy(scenario).queue_timeout


def _steward(scenario: Scenario) -> Policy:
    return Scheduler.create(scenario.gpu.memory, profiles(scenario), scheduling_policy(scenario))


def _no_fallback(scenario: Scenario) -> Policy:
    """steward with its fallback chains left out: what they are worth."""
    return Scheduler.create(scenario.gpu.memory, profiles(scenario, fallback=False), scheduling_policy(scenario))


def _fifo(scenario: Scenario) -> Policy:
    policy = scheduling_policy(scenario, strict_arrival_order(scenario.scheduler))
    core = Scheduler.create(scenario.gpu.memory, profiles(scenario), policy)
    return FifoPolicy(core, queue_timeouts(scenario))


def _swap(scenario: Scenario) -> Policy:
    return SwapPolicy.create(scenario.gpu.memory, profiles(scenario), queue_timeouts(scenario))


def _collate(scenario: Scenario) -> Policy:
    return CollatePolicy.create(scenario.gpu.memory, profiles(scenario), queue_timeouts(scenario))


def _lru_count(scenario: Scenario) -> Policy:
    return LruCountPolicy.create(scenario.gpu.memory, profiles(scenario), queue_timeouts(scenario),
                                 models_max=scenario.baselines.models_max,
                                 kill_in_flight=scenario.baselines.kill_in_flight)


def _keepalive(scenario: Scenario) -> Policy:
    return KeepAlivePolicy.create(scenario.gpu.memory, profiles(scenario), queue_timeouts(scenario),
                                  keep_alive=scenario.baselines.keep_alive, max_loaded=scenario.baselines.max_loaded)


POLICIES: dict[str, Callable[[Scenario], Policy]] = {
    "steward": _steward,
    "no-fallback": _no_fallback,
    "fifo": _fifo,
    "swap": _swap,
    "collate": _collate,
    "lru-count": _lru_count,
    "keepalive": _keepalive,
}


# What a run replays unless told: steward and the baselines (no-fallback is steward without its
# fallback chains, asked for by name where a scenario has chains: pressure.yaml).
DEFAULT_POLICIES = tuple(name for name in POLICIES if name != "no-fallback")


def make_policy(name: str, scenario: Scenario) -> Policy:
    return POLICIES[name](scenario)
