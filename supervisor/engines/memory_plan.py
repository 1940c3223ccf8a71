"""How much memory each engine reserves: by hand, measured, or estimated (in that order).

Count first, load second: a load reserves this amount the moment it is decided. A size
set in the config wins; otherwise the measurement of an earlier load of the same model
file with the same arguments; otherwise an estimate from the GGUF header.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import attrs

from supervisor.accounting.estimate import estimate
from supervisor.accounting.gguf_header import GGUFError
from supervisor.config import Config, ConfigError, ModelConfig
from supervisor.engines.measurements import MeasurementStore, measurement_key
from supervisor.scheduler.ledger import Ledger
from supervisor.scheduler.placing import most_memory
from supervisor.scheduler.types import DEFAULT_DEVICE, EngineProfile
from supervisor.units import format_size

Device = Literal["gpu", "cpu"]


def device_label(kind: Device, index: int) -> str:
    """How /healthz, /metrics and /steward/state name a device: gpu0, gpu1 (as NVML numbers them), or cpu."""
    return "cpu" if kind == "cpu" else f"gpu{index}"


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


def budget_problems(config: Config, profiles: Sequence[EngineProfile], budgets: Sequence[int]) -> list[str]:
    """What could never fit in the devices' budgets: one model (on the devices it may use, split
    if its runtime splits), the pinned models together, a service's reservation, an image job."""
    ledger = Ledger(budgets)
    first = f"the budget {format_size(budgets[DEFAULT_DEVICE])}" + (
        f" of device {DEFAULT_DEVICE}" if len(budgets) > 1 else "")
    problems = []
    for profile in profiles:
        if profile.name in config.models and profile.memory > (room := most_memory(profile, ledger, {})):
            where = f"the budget {format_size(room)}" if len(budgets) == 1 else (
                f"the {format_size(room)} its devices can hold")
            problems.append(f"models.{profile.name}.memory: {format_size(profile.memory)} exceeds {where}; "
                            f"it could never load")
    pinned = [p for p in profiles if p.pinned and p.name in config.models]
    need, total = sum(p.memory for p in pinned), sum(budgets)
    if need > total:
        problems.append(f"models: the pinned models ({', '.join(p.name for p in pinned)}) need {format_size(need)}, "
                        f"more than the budget {format_size(total)}")
    if config.ollama is not None and config.ollama.memory > budgets[DEFAULT_DEVICE]:
        problems.append(f"ollama.memory: {format_size(config.ollama.memory)} exceeds {first}; "
                        f"Ollama could never load a model")
    comfy = config.comfyui.memory if config.comfyui is not None else None
    if comfy is not None and comfy > budgets[DEFAULT_DEVICE]:
        problems.append(f"comfyui.memory: {format_size(comfy)} exceeds {first}; an image job could never run")
    return problems
