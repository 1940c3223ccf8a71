"""How much memory each engine reserves: by hand, measured, or estimated (in that order).

Count first, load second: a load reserves this amount the moment it is decided. A size
set in the config wins; otherwise the measurement of an earlier load of the same model
file with the same arguments; otherwise an estimate from the GGUF header.
"""

from __future__ import annotations

from typing import Literal

import attrs

from supervisor.accounting.estimate import estimate
from supervisor.accounting.gguf_header import GGUFError
from supervisor.config import Config, ConfigError, ModelConfig
from supervisor.measurements import MeasurementStore, measurement_key

Device = Literal["gpu", "cpu"]


@attrs.frozen
class MemoryPlan:
    nbytes: int
    source: Literal["config", "measured", "estimate"]
    key: str  # the measurement key: where a measurement of this engine is kept


def plan_memory(name: str, model: ModelConfig, argv: list[str], store: MeasurementStore, device: Device,
                ) -> MemoryPlan:
    """*argv*: the engine's flags (without the program), as steward will start it."""
    key = measurement_key(model)
    if model.memory is not None:
        return MemoryPlan(model.memory, "config", key)
    measured = store.get(key)
    if measured is not None:
        return MemoryPlan(measured, "measured", key)
    assert model.model is not None  # the config requires one of the two
    try:
        result = estimate(model.model, argv, device=device)
    except (GGUFError, ValueError, OSError) as exc:
        raise ConfigError([f"models.{name}.model: cannot estimate its memory: {exc}; "
                           f"set models.{name}.memory by hand"]) from None
    return MemoryPlan(result.gpu_total if device == "gpu" else result.host.total, "estimate", key)


def plan_all(config: Config, argvs: dict[str, list[str]], store: MeasurementStore, device: Device,
             ) -> dict[str, MemoryPlan]:
    """*argvs*: each engine's full command line; the program's own words are left out."""
    problems, plans = [], {}
    for name, model in config.models.items():
        try:
            plans[name] = plan_memory(name, model, argvs[name][len(model.command):], store, device)
        except ConfigError as exc:
            problems += exc.problems
    if problems:
        raise ConfigError(problems)
    return plans
