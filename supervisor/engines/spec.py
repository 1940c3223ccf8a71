"""What it takes to run one engine, resolved from the config: a value the driver runs by.

Apart from the driver (an httpx client and trio tasks), so that ``steward check`` plans the
engines without importing either.
"""

from __future__ import annotations

import attrs

from adapters import Runtime
from supervisor.accounting.cpu_share import CpuSet
from supervisor.backoff import Backoff
from supervisor.slot_cache.plan import SlotCachePlan

# How often a runtime is asked what it holds and how loaded it is (Ollama's /api/ps,
# vLLM's /metrics), unless its config says otherwise.
USAGE_POLL_S = 2.0


@attrs.frozen
class HealthChecks:
    """How often a ready engine's health is checked, and how long one check may take."""

    interval: float = 10.0
    timeout: float = 5.0
    # After a failed check the next comes sooner, so that a frozen engine is found in
    # seconds, not in several intervals.
    retry: float = 1.0


@attrs.frozen
class EngineSpec:
    """Everything needed to run one engine, resolved from the config."""

    name: str
    runtime: Runtime
    host: str
    start_timeout: float
    stop_grace: float
    health_interval: float  # readiness polling while it loads
    tail_lines: int
    checks: HealthChecks = attrs.Factory(HealthChecks)
    port: int | None = None  # fixed: configured, or the attached server's; else one is picked per process
    usage_poll: float = USAGE_POLL_S
    # A service's restarts, and an attached server's reconnects while it is awaited.
    retry: Backoff = attrs.Factory(Backoff)
    devices: tuple[int, ...] | None = None  # models.NAME.devices: where its process may run
    cpus: CpuSet | None = None  # models.NAME.cpus (cpu_share.py): the CPUs its process may run on
    slot_cache: SlotCachePlan | None = None  # models.NAME.keep_cache: its slots saved on eviction, restored on load

    @property
    def slots(self) -> int:
        return self.runtime.slots

    def command(self, port: int | str) -> list[str] | None:
        return self.runtime.command(self.host, port)  # type: ignore[arg-type]
