"""The fleet as a person watching a front door sees it: each node (its state and since when,
its last poll and how old it is, its models, free memory per device, queue and health) and
the requests held for a node, with their deadline and why they wait.

``FleetSnapshot`` is taken at one moment (``NodeRouter.fleet``): the node trackers' reports
and the held requests, with trio's clock. The rest is pure: ``fleet_json`` for
``/admin/state`` and ``/healthz`` (sizes with their words beside them, times on the wall
clock), ``held_lines`` for the ``waiting`` lists beside the local queues' heads, and
``/metrics`` reads the snapshot as it is.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from supervisor.nodes.held import HeldRequest, HoldBound
from supervisor.nodes.routing import Availability, NodeView
from supervisor.units import format_age, format_duration, format_size

_BOUNDS = {HoldBound.WAKE_TIMEOUT: "the node's wake.timeout", HoldBound.QUEUE_TIMEOUT: "the class's queue timeout"}


@attrs.frozen
class PollOutcome:
    at: float  # trio's clock: when the answer (or the silence) came
    answered: bool
    detail: str  # "answered", or why it gave no state


@attrs.frozen
class NodeReport:
    """One node, as its tracker knows it now."""

    view: NodeView
    url: str
    detail: str  # why it is in its state, in words
    since: float  # trio's clock: when it came to its state
    last_poll: PollOutcome | None
    answered_at: float  # trio's clock: its state is as of then; nan if it has not answered since the start
    key_known: bool  # the front door has a key for it (nodes.NAME.key_env)
    wake_timeout: float | None  # None: it cannot be woken
    waking_until: float = math.inf  # while waking: when its wake times out


@attrs.frozen
class FleetSnapshot:
    nodes: tuple[NodeReport, ...]
    held: tuple[HeldRequest, ...]
    now: float  # trio's clock

    def held_for(self, node: str) -> int:
        return sum(1 for request in self.held if request.node == node)

    def availability(self, node: str) -> Availability | None:
        return next((report.view.availability for report in self.nodes if report.view.name == node), None)


def fleet_json(fleet: FleetSnapshot, wall: float) -> dict[str, list[dict[str, Any]]]:
    """``nodes`` and ``held`` of /admin/state and /healthz: one schema (docs/events.md)."""
    return {"nodes": [node_json(report, fleet, wall) for report in fleet.nodes],
            "held": [held_json(request, fleet.availability(request.node), fleet.now, wall) for request in fleet.held]}


def node_json(report: NodeReport, fleet: FleetSnapshot, wall: float) -> dict[str, Any]:
    now, view, state = fleet.now, report.view, report.view.state
    poll = report.last_poll
    return {
        "name": view.name, "url": report.url, "state": view.availability.value, "since": _wall(report.since, now, wall),
        "for_s": _ago(report.since, now), "detail": report.detail,
        "last_poll": None if poll is None else {"at": _wall(poll.at, now, wall), "age_s": _ago(poll.at, now),
                                                "answered": poll.answered, "detail": poll.detail},
        # What follows is as the node last said it (as_of): a sleeping node's memory is not read now.
        "as_of": _wall(report.answered_at, now, wall),
        "serves": sorted(view.serves),
        "models": [] if state is None else [
            {"name": m.name, "status": m.status, "resident": m.resident, "memory": m.memory,
             "memory_text": format_size(m.memory), "in_flight": m.in_flight, "queued": m.queued, "pinned": m.pinned,
             "hot": m.hot} for m in state.models],
        "devices": [] if state is None else [
            {"device": d.device, "budget": d.budget, "budget_text": format_size(d.budget), "free": d.free,
             "free_text": format_size(d.free)} for d in state.devices],
        "queued": None if state is None else dict(state.queued),
        "in_flight": None if state is None else sum(m.in_flight for m in state.models),
        "health": None if state is None else state.health,
        "health_reasons": [] if state is None else list(state.reasons),
        "key_known": report.key_known,
        "wake_timeout_s": report.wake_timeout,
        "wake_deadline": _wall(report.waking_until, now, wall),
        "held": fleet.held_for(view.name),
    }


def held_json(request: HeldRequest, availability: Availability | None, now: float, wall: float) -> dict[str, Any]:
    return {"request_id": request.request_id, "node": request.node, "model": request.model, "class": request.klass,
            "since": _wall(request.since, now, wall), "held_s": _ago(request.since, now),
            "deadline": _wall(request.deadline, now, wall), "limit_s": round(request.limit, 3),
            "bound": request.bound.value, "why": held_why(request, availability, now)}


def held_lines(fleet: FleetSnapshot) -> list[dict[str, Any]]:
    """The held requests as lines of /admin/state's and /healthz's ``waiting``, as the local
    queues' are: one line per class, model and node, its oldest request's wait and why, and
    how many wait in it."""
    lines: dict[tuple[str, str, str], dict[str, Any]] = {}
    for request in fleet.held:  # oldest first: the first of a line is its head
        line = lines.get((request.klass, request.model, request.node))
        if line is not None:
            line["waiting"] += 1
            continue
        availability = fleet.availability(request.node)
        lines[request.klass, request.model, request.node] = {
            "class": request.klass, "model": request.model, "waiting": 1, "waited_s": _ago(request.since, fleet.now),
            "reason": _reason(availability), "why": held_why(request, availability, fleet.now), "node": request.node}
    return list(lines.values())


def held_why(request: HeldRequest, availability: Availability | None, now: float) -> str:
    """``interactive request for qwen waits for node b to wake: 8.2s of 2m (the node's wake.timeout)``."""
    node = f"node {request.node}"
    waits = f"waits for {node}" if availability is None else {
        Availability.WAKING: f"waits for {node} to wake",
        Availability.AWAKE: f"goes to {node}, awake now",
        Availability.ASLEEP: f"waits for {node}, asleep again (its wake failed)",
        Availability.DOWN: f"waits for {node}, down"}[availability]
    held = format_age(max(0.0, now - request.since))
    return (f"{request.klass} request for {request.model} {waits}: {held} of {format_duration(request.limit)} "
            f"({_BOUNDS[request.bound]})")


def _reason(availability: Availability | None) -> str:
    return f"node_{availability.value}" if availability is not None else "node_unknown"


def _wall(moment: float, now: float, wall: float) -> float | None:
    return None if not math.isfinite(moment) else round(wall + moment - now, 3)


def _ago(moment: float, now: float) -> float | None:
    return None if not math.isfinite(moment) else round(max(0.0, now - moment), 3)
