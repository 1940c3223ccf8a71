"""Swap holds: a load that would evict waits while its class's loaded engines serve (rule 9).

Within a class, a load that would evict another engine is held, for at most ``swap_hold``
after its request arrived, while the class's other work keeps loaded (or loading) engines
busy and the engines it would evict were used lately: younger requests for loaded models
go first, so that one swap serves a batch of requests, not one. A load that fits, or whose
victims cost nothing, is never held; nothing is held across classes; and while held, its
memory is promised (no later demand takes it).
"""

from __future__ import annotations

import attrs

from supervisor.scheduler.eviction import LoadReason, Option, carry_out, place, promise, reload_cost
from supervisor.scheduler.state import CoreState, Demand, rounded
from supervisor.request_class import RequestClass
from supervisor.scheduler.types import EngineState, EngineStatus, Job


@attrs.frozen
class SwapHold:
    """A load held so that younger requests for loaded engines go first (rule 9)."""

    until: float  # its request's arrival + swap_hold
    behind: tuple[str, ...]  # the loaded (or loading) engines the class's other work keeps busy
    would_evict: tuple[str, ...]  # what the load would evict now


def load_or_make_room(s: CoreState, engine: EngineState, now: float, promised: dict[int, int],
                      wanted: dict[str, Demand], demand: Demand, reason: LoadReason, *,
                      for_job: Job | None = None) -> None:
    """Start *engine* where its memory is free, else evict for it where that takes least,
    unless *for_job*'s load is held for a swap."""
    option = place(s, engine, now, promised, wanted, demand, idle_only=False)
    if option is None:
        return
    if for_job is not None and (hold := swap_hold(s, for_job, option, now)) is not None:
        _hold(s, for_job, hold, option, now, promised)
        return
    carry_out(s, engine, option, now, promised, reason)


def swap_hold(s: CoreState, job: Job, option: Option, now: float) -> SwapHold | None:
    """Whether *job*'s load, placed as *option* says, waits so that younger requests of its
    class for loaded engines go first, and until when; None: it goes ahead."""
    until = job.submitted + s.policy.swap_hold
    if now >= until or not option.victims:
        return None
    if sum(reload_cost(s, v, now).cost for v in option.victims) == 0:
        return None  # nobody used what it would evict lately: evicting it costs nothing
    behind = _class_work(s, job.klass, besides=job.model)
    if not behind:
        return None  # nothing of its class would go first: holding it would gain nothing
    return SwapHold(until, behind, tuple(v.name for v in option.victims))


def _class_work(s: CoreState, klass: RequestClass, *, besides: str | None) -> tuple[str, ...]:
    """The loaded (or loading) engines that steps of *klass* run on or wait for."""
    names = {job.model for job in s.running.values() if job.klass == klass} | set(s.queues[klass].lines)
    return tuple(sorted(name for name in names if name is not None and name != besides
                        and (e := s.engines.get(name)) is not None
                        and e.status in (EngineStatus.READY, EngineStatus.STARTING)))


def _hold(s: CoreState, job: Job, hold: SwapHold, option: Option, now: float, promised: dict[int, int]) -> None:
    if job.held_until is None:
        job.held_until = hold.until
        s.emit("swap_held", "info", job=job.id, request=job.request, model=job.model,
               **{"class": job.klass}, hold_until=rounded(hold.until), hold_s=s.policy.swap_hold,
               waited_s=rounded(now - job.submitted), behind=list(hold.behind),
               would_evict=list(hold.would_evict))
    promise(option, promised)
