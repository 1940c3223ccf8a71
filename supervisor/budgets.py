"""What steward may reserve on each device: the config's budgets over what the probe reads.

``steward check`` and ``steward run`` resolve them the same way; this module is apart from
the nursery tree (tree.py) so that ``check`` needs nothing of the gateway to print them.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from supervisor.config import Config, ConfigError
from supervisor.engines.memory_plan import Device
from supervisor.engines.probes import GpuProbe, GpuReading, host_memory_total
from supervisor.units import format_size


@attrs.frozen
class DeviceBudget:
    nbytes: int
    source: str  # where the figure comes from, for `steward check` and the `probe` event


def resolve_budgets(config: Config, readings: list[GpuReading]) -> list[DeviceBudget]:
    """What steward may reserve on each device (index = device): gpu.devices.N.budget, else
    gpu.budget, else the device's total (host RAM with no GPU)."""
    listed = max(config.gpu.devices, default=-1) + 1
    if readings and listed > len(readings):
        raise ConfigError([f"gpu.devices.{listed - 1}: no such device (the probe sees {len(readings)})"])
    budgets = []
    for index in range(max(len(readings), listed, 1)):
        device = config.gpu.devices.get(index)
        if device is not None and device.budget is not None:
            budgets.append(DeviceBudget(device.budget, f"gpu.devices.{index}.budget"))
        elif config.gpu.budget is not None:
            budgets.append(DeviceBudget(config.gpu.budget, "gpu.budget"))
        elif index < len(readings):
            reading = readings[index]
            budgets.append(DeviceBudget(reading.total_bytes, f"{reading.device} total ({reading.name})"))
        elif index == 0 and listed <= 1:
            budgets.append(DeviceBudget(host_memory_total(), "host memory total (no GPU probed; set gpu.budget "
                                                             "to choose)"))
        else:
            raise ConfigError([f"gpu.devices.{index}.budget: required (no probe reads device {index})"])
    return budgets


def budgets_beyond_devices(budgets: Sequence[DeviceBudget], readings: Sequence[GpuReading],
                           device: Device) -> list[str]:
    """Budgets set above what a probed GPU holds: steward would plan with memory the device does
    not have, and an engine would fail to load (or crash) where the plan said it fits. Host RAM,
    where an engine may use swap, has no such bound."""
    if device != "gpu":
        return []
    return [f"{budget.source}: {format_size(budget.nbytes)} ({budget.nbytes} bytes) is more than {reading.device} "
            f"holds, {format_size(reading.total_bytes)} ({reading.name}); steward would plan with memory the "
            f"device does not have"
            for budget, reading in zip(budgets, readings) if budget.nbytes > reading.total_bytes]


def memory_device(probe: GpuProbe | None) -> Device:
    """Where the engines' memory lives: the GPU, or host RAM on a CPU-only host."""
    return "gpu" if probe is not None and probe.kind != "host" else "cpu"
