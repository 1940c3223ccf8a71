"""What a node tells a front door about itself: ``GET /steward/state``.

Every steward serves it (an admin route once keys are in force); a front door reads it from
each of its nodes to route requests: which models the node serves and which are resident,
its memory per device, its queues and whether it is overloaded. The same document, kept
in the front door's state file, describes a node while it sleeps.

One schema, versioned, structured and unstructured by one cattrs converter at the edges:
``node_state`` builds it from a scheduler snapshot (pure), ``parse_node_state`` reads a
node's answer and says what is wrong with it in one line.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any, Literal

import attrs
import cattrs

from supervisor.observe.health import Health
from supervisor.engines.memory_plan import device_label
from supervisor.request_class import RequestClass
from supervisor.scheduler.types import SchedulerSnapshot

STATE_PATH = "/steward/state"
SCHEMA_VERSION = 1


@attrs.frozen
class ModelState:
    name: str
    status: str  # the engine's: stopped, starting, ready, stopping, sleeping, failed
    memory: int  # what it reserves while loaded
    slots: int
    in_flight: int
    queued: int
    pinned: bool
    hot: bool  # used interactively of late: background work cannot evict it
    aliases: tuple[str, ...] = ()

    @property
    def resident(self) -> bool:
        """Loaded now: a request for it is served without a load."""
        return self.status == "ready"


@attrs.frozen
class DeviceState:
    device: str  # gpu0, cpu, ...
    budget: int
    reserved: int
    outside: int  # used by processes that are not the node's engines

    @property
    def free(self) -> int:
        return max(0, self.budget - self.reserved - self.outside)


@attrs.frozen
class NodeState:
    version: Literal[1]
    node: str  # the node's host name, as it says
    models: tuple[ModelState, ...]
    devices: tuple[DeviceState, ...]
    queued: dict[str, int]  # steps waiting per class
    health: str  # ok, degraded, overloaded
    reasons: tuple[str, ...] = ()

    def model(self, name: str) -> ModelState | None:
        return next((m for m in self.models if m.name == name or name in m.aliases), None)

    @property
    def free(self) -> int:
        """The most free memory on any one device: what a single-device load can have without evicting."""
        return max((d.free for d in self.devices), default=0)

    def evictable(self, *, for_interactive: bool) -> int:
        """Memory held by models a load may evict: idle, not pinned, and not hot unless the load is interactive."""
        return sum(m.memory for m in self.models
                   if m.resident and not m.pinned and m.in_flight == 0 and (for_interactive or not m.hot))

    @property
    def load(self) -> int:
        """How busy it is: steps waiting and running."""
        return sum(self.queued.values()) + sum(m.in_flight for m in self.models)


def node_state(snapshot: SchedulerSnapshot, health: Health, aliases: Mapping[str, str], device: str,
               node: str | None = None) -> NodeState:
    """This steward's state, from a snapshot of its scheduler and its health. Pure."""
    others: dict[str, list[str]] = {}
    for alias, target in aliases.items():
        if alias != target:
            others.setdefault(target, []).append(alias)
    models = tuple(ModelState(e.name, e.status, e.memory, e.slots, e.in_flight, e.queued, e.pinned, e.hot,
                              tuple(others.get(e.name, ()))) for e in snapshot.engines)
    devices = tuple(DeviceState(device_label(device, d.index), d.budget, d.reserved, d.outside)  # type: ignore[arg-type]
                    for d in snapshot.devices)
    return NodeState(SCHEMA_VERSION, node or socket.gethostname(), models, devices,
                     {klass: snapshot.queued_by_class.get(klass, 0) for klass in RequestClass}, health.status.value,
                     health.reasons)


_converter = cattrs.Converter(forbid_extra_keys=False)  # a newer node may say more: read what we know


class NodeStateError(Exception):
    """A node's answer to /steward/state is not a state steward can read."""


def state_to_json(state: NodeState) -> dict[str, Any]:
    return _converter.unstructure(state)


def parse_node_state(raw: object) -> NodeState:
    """A node's state from its JSON; NodeStateError saying what is wrong, in one line."""
    if not isinstance(raw, dict):
        raise NodeStateError("not a JSON object")
    if raw.get("version") != SCHEMA_VERSION:
        raise NodeStateError(f"schema version {raw.get('version')!r}, this steward reads {SCHEMA_VERSION}")
    try:
        return _converter.structure(raw, NodeState)
    except (cattrs.BaseValidationError, ValueError, TypeError, KeyError) as exc:
        details = cattrs.transform_error(exc) if isinstance(exc, cattrs.BaseValidationError) else [str(exc)]
        raise NodeStateError("; ".join(details)) from None
