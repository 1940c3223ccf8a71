"""Can a model serve a request sent to this node now, without thrashing? Read from the core, deciding nothing.

A cluster's router (the Gateway API Inference Extension's endpoint picker, llm-d, KServe)
sends each request to one of the pods that say they are ready. Steward holds several models
on one GPU and swaps them; a pod that says "ready" for a model it would have to evict hot
work to load invites the router to make steward thrash. So a model is *ready* here when:

- it is resident (loaded and healthy), or on its way in (loading: the load is already paid);
- or it is not loaded but fits into free memory, memory already on its way out, or the room
  of idle engines nobody used interactively within ``hot_window`` (cold idle victims);

and *not ready* while it cannot be loaded without evicting hot or busy work, is pinned out
by an exclusive (image) job, has failed and backs off, fails its health checks, is being
unloaded, or steward shuts down. The placement is eviction.py's own (``place``), asked as a
background load would ask it (hot engines are never victims of one), so this says what the
scheduler would do, not a second opinion. ``/healthz/models/NAME`` answers with it.
"""

from __future__ import annotations

import enum

import attrs

from supervisor.request_class import RequestClass
from supervisor.scheduler.eviction import place
from supervisor.scheduler.state import CoreState
from supervisor.scheduler.types import EngineStatus
from supervisor.units import format_size

# Asked as a background step would ask: hot engines are never its victims (eviction.py).
_PROBE_DEMAND = (RequestClass.BACKGROUND.rank, -1)


class ReadinessState(enum.StrEnum):
    """Why a model is ready or not; its value is what the probe's JSON says (``state``)."""

    RESIDENT = "resident"  # loaded, healthy, taking work
    LOADING = "loading"  # its load is under way
    LOADABLE = "loadable"  # not loaded, fits without evicting hot or busy work
    BLOCKED = "blocked"  # not loaded, and loading it would evict hot or busy work (or nothing frees enough)
    TOO_BIG = "too_big"  # no device of this node may ever hold it
    UNHEALTHY = "unhealthy"  # loaded, failing its health checks
    FAILED = "failed"  # exited unexpectedly; backing off before the next start
    UNLOADING = "unloading"  # chosen for eviction (or retired by a reload): takes no new work
    EXCLUSIVE = "exclusive"  # an image job holds the GPU: nothing loads until it ends
    SHUTTING_DOWN = "shutting_down"


READY_STATES = frozenset({ReadinessState.RESIDENT, ReadinessState.LOADING, ReadinessState.LOADABLE})


@attrs.frozen
class Readiness:
    model: str
    state: ReadinessState
    why: str  # in words, for a person reading the probe's answer or `kubectl describe pod`

    @property
    def ready(self) -> bool:
        return self.state in READY_STATES

    def to_json(self) -> dict[str, object]:
        return {"model": self.model, "ready": self.ready, "state": self.state.value, "why": self.why}


def model_readiness(s: CoreState, model: str, now: float) -> Readiness | None:
    """Whether *model* (an engine's name) is ready to be sent work at *now*; None: no such model."""
    engine = s.engines.get(model)
    if engine is None:
        return None

    def said(state: ReadinessState, why: str) -> Readiness:
        return Readiness(model, state, why)

    if s.closing:
        return said(ReadinessState.SHUTTING_DOWN, "steward is shutting down")
    if engine.draining or engine.retiring is not None or engine.status in (EngineStatus.DRAINING,
                                                                            EngineStatus.STOPPING):
        return said(ReadinessState.UNLOADING, f"{model} is being unloaded and takes no new work")
    if engine.status is EngineStatus.READY:
        if engine.unhealthy:
            return said(ReadinessState.UNHEALTHY, f"{model} fails its health checks")
        return said(ReadinessState.RESIDENT, f"{model} is loaded ({engine.in_flight} of {engine.profile.slots} "
                                             f"slot(s) busy)")
    if engine.status is EngineStatus.STARTING:
        return said(ReadinessState.LOADING, f"{model} is loading")
    if engine.status is EngineStatus.FAILED and now < engine.retry_at:
        return said(ReadinessState.FAILED, f"{model} failed {engine.failures} time(s) in a row and backs off "
                                           f"for {engine.retry_at - now:.0f}s more")
    if s.exclusive_holder is not None:
        return said(ReadinessState.EXCLUSIVE, "an image job holds the GPU; nothing loads until it ends")
    option = place(s, engine, now, {}, {}, _PROBE_DEMAND, idle_only=False)
    if option is None:
        return said(ReadinessState.TOO_BIG, f"{model} needs {format_size(engine.profile.memory)}, more than "
                                             f"this node's devices hold")
    need = format_size(sum(option.needs.values()))
    if option.fits:
        return said(ReadinessState.LOADABLE, f"{model} is not loaded; it fits in free memory ({need})")
    if option.victims == []:
        return said(ReadinessState.LOADABLE, f"{model} is not loaded; memory on its way out makes room ({need})")
    if option.victims is not None and not any(v.in_flight for v in option.victims):
        names = ", ".join(v.name for v in option.victims)
        return said(ReadinessState.LOADABLE, f"{model} is not loaded; it would evict idle cold {names} ({need})")
    return said(ReadinessState.BLOCKED, f"{model} is not loaded and needs {need}: {_held_by(s, model, now)}")


def _held_by(s: CoreState, model: str, now: float) -> str:
    """Who holds the memory it would need, and why they stay, in words."""
    reasons = []
    for other in s.engines.values():
        if other.name == model or not s.ledger.held(other.name):
            continue
        if other.profile.pinned:
            reasons.append(f"{other.name} (pinned)")
        elif other.status is EngineStatus.STARTING:
            reasons.append(f"{other.name} (loading)")
        elif other.hot(now, s.policy.hot_window):
            reasons.append(f"{other.name} (hot)")
        elif other.in_flight:
            reasons.append(f"{other.name} (busy: {other.in_flight} step(s))")
    held = ", ".join(reasons) or "memory outside steward's engines"
    return f"loading it would evict hot or busy work ({held})"
