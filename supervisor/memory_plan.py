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
from supervisor.units import format_size

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


def plan_all(config: Config, argvs: dict[str, list[str] | None], store: MeasurementStore, device: Device,
             ) -> dict[str, MemoryPlan]:
    """*argvs*: each engine's full command line; the program's own words are left out."""
    problems, plans = [], {}
    for name, model in config.models.items():
        try:
            argv = argvs.get(name) or []  # an attached server has none
            plans[name] = plan_memory(name, model, argv[len(model.command or []):], store, device)
        except ConfigError as exc:
            problems += exc.problems
    if problems:
        raise ConfigError(problems)
    return plans


def budget_problems(config: Config, plans: dict[str, MemoryPlan], budget: int) -> list[str]:
    """What could never fit in *budget*: one model, the pinned models together, a service's reservation."""
    over = f"exceeds the budget {format_size(budget)}"
    problems = [f"models.{name}.memory: {format_size(plans[name].nbytes)} {over}; it could never load"
                for name in config.models if plans[name].nbytes > budget]
    pinned = [name for name, model in config.models.items() if model.resident]
    need = sum(plans[name].nbytes for name in pinned)
    if need > budget:
        problems.append(f"models: the pinned models ({', '.join(pinned)}) need {format_size(need)}, "
                        f"more than the budget {format_size(budget)}")
    if config.ollama is not None and config.ollama.memory > budget:
        problems.append(f"ollama.memory: {format_size(config.ollama.memory)} {over}; Ollama could never load a model")
    comfy = config.comfyui.memory if config.comfyui is not None else None
    if comfy is not None and comfy > budget:
        problems.append(f"comfyui.memory: {format_size(comfy)} {over}; an image job could never run")
    return problems
