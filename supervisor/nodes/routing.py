"""Which node serves a request, and which model a capability means: pure decisions from the
nodes' states, so every rule is tested without a network.

A request for a model goes, among the nodes that serve it and answer:
1. to one where the model is resident (loaded now: no load at all);
2. else to one where it fits without evicting hot work (free memory, plus what idle cold
   models hold);
3. else to the least loaded one (its own scheduler decides what to evict, by its rules);
ties go to the least loaded node, then to the first in the config. Only when no awake node
serves the model is a sleeping node with ``wake`` woken (the request waits for it), and a
node already waking is waited for rather than woken twice.

A capability (``capabilities: {reasoning: [qwen3-32b, qwen3-8b]}``) is the first of its
models resident on an awake node, else the first that fits somewhere without evicting hot
work, else simply the first: the caller named what it needs, not a model.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

import attrs

from supervisor.nodes.state import NodeState


class Availability(enum.Enum):
    AWAKE = "awake"  # answered its last state poll
    WAKING = "waking"  # sent its magic packet; not answering yet
    ASLEEP = "asleep"  # not answering, and can be woken (it has `wake`)
    DOWN = "down"  # not answering, and cannot be woken


class RouteReason(enum.Enum):
    RESIDENT = "resident"
    FITS = "fits"
    LEAST_LOADED = "least_loaded"


@attrs.frozen
class NodeView:
    """A node as the front door knows it now."""

    name: str
    availability: Availability
    serves: frozenset[str]  # model names and aliases, from its state (or remembered, or configured)
    state: NodeState | None = None  # its last state; None if it has not answered since the front door started

    @property
    def awake(self) -> bool:
        return self.availability is Availability.AWAKE and self.state is not None


@attrs.frozen
class Route:
    node: str
    model: str
    reason: RouteReason


@attrs.frozen
class Wake:
    """No awake node serves the model: wake this one (or wait for it, if ``already`` waking)."""

    node: str
    model: str
    already: bool


@attrs.frozen
class NoRoute:
    model: str
    message: str


def choose_node(model: str, nodes: Sequence[NodeView]) -> Route | Wake | NoRoute:
    """Where a request for *model* goes; *nodes* in the config's order."""
    serving = [node for node in nodes if model in node.serves]
    if not serving:
        return NoRoute(model, f"no node serves the model {model!r}")
    awake = [node for node in serving if node.awake]
    for reason in RouteReason:
        tier = [node for node in awake if _in_tier(node, model, reason)]
        if tier:
            best = min(tier, key=lambda node: (_load(node), awake.index(node)))
            return Route(best.name, model, reason)
    waking = next((node for node in serving if node.availability is Availability.WAKING), None)
    if waking is not None:
        return Wake(waking.name, model, already=True)
    asleep = next((node for node in serving if node.availability is Availability.ASLEEP), None)
    if asleep is not None:
        return Wake(asleep.name, model, already=False)
    names = ", ".join(node.name for node in serving)
    return NoRoute(model, f"every node that serves the model {model!r} is down ({names})")


def resolve_capability(name: str, capabilities: Mapping[str, Sequence[str]], nodes: Sequence[NodeView]) -> str | None:
    """The model a capability means now, or None if *name* is no capability."""
    models = capabilities.get(name)
    if not models:
        return None
    for reason in (RouteReason.RESIDENT, RouteReason.FITS):
        for model in models:
            if any(node.awake and model in node.serves and _in_tier(node, model, reason) for node in nodes):
                return model
    return models[0]


def _in_tier(node: NodeView, model: str, reason: RouteReason) -> bool:
    assert node.state is not None
    served = node.state.model(model)
    if reason is RouteReason.LEAST_LOADED:
        return True
    if served is None:
        return False
    if reason is RouteReason.RESIDENT:
        return served.resident
    return served.resident or node.state.free + node.state.evictable(for_interactive=False) >= served.memory


def _load(node: NodeView) -> int:
    return node.state.load if node.state is not None else 0
