"""Exclusive jobs: a job that takes the whole GPU, an image job say (rule 8).

An exclusive job at the head of its class stops new work of that class and below, lets
running work drain, unloads the engines on its device whose memory it needs (unpinned
before pinned, idle before busy, then the cheapest to load again; never one a higher
class wants), runs once that memory is free, and then lets everything resume (warming.py
may then load engines ahead of demand).

The job pauses the hot_window clock of the engines it evicted while hot: when it ends (or
leaves before it ran), each is hot again for the time it had left when it was evicted,
counted from the job's end, so the chat model that was hot before an image job is not the
first a batch request evicts after it (a warm load keeps that hot time: warming.py).
"""

from __future__ import annotations

from supervisor.scheduler.eviction import cost_rank, evict
from supervisor.scheduler.state import NO_DEMAND, CoreState, Demand, rounded
from supervisor.request_class import ALL_CLASSES
from supervisor.scheduler.types import DEFAULT_DEVICE, EngineState, EngineStatus, Grant, HotKept, Job


def exclusive_rank(s: CoreState) -> int | None:
    """The rank of the highest class whose head is an exclusive job (None: no such class):
    that class and those below it start nothing new."""
    for klass in ALL_CLASSES:
        head = s.queues[klass].head()
        if head is not None and head.exclusive:
            return klass.rank
    return None


def exclusive_owner(job_id: int) -> str:
    """The ledger's name for what an exclusive job holds."""
    return f"exclusive:{job_id}"


def advance_exclusive(s: CoreState, job: Job, now: float, wanted: dict[str, Demand]) -> None:
    """Drain and unload what the job needs, then grant it the GPU."""
    rank = job.klass.rank
    need = job.exclusive_memory
    # Outside use is not held against the job: the service that runs it (ComfyUI keeps
    # its models cached between jobs) is itself "outside" steward's engines. Only the
    # engines on its device make room for it.
    device = DEFAULT_DEVICE
    unreserved = s.ledger.budgets[device] - s.ledger.reserved_on(device)
    if s.exclusive_holder is None and need > unreserved + s.freeing_on(device):
        candidates = [e for e in s.engines.values()
                      if e.status is EngineStatus.READY and s.ledger.held_on(e.name, device)
                      and wanted.get(e.name, NO_DEMAND)[0] >= rank]
        candidates.sort(key=lambda e: (e.profile.pinned, e.in_flight > 0, cost_rank(s, e, now), e.last_used))
        gain = unreserved + s.freeing_on(device)
        for candidate in candidates:
            if gain >= need:
                break
            gain += s.ledger.held_on(candidate.name, device)
            keep_hot_time(s, candidate, job, now)
            evict(s, candidate, now, for_what="exclusive", need=need, free=unreserved, for_job=job.id)
    still_running = sum(s.running_by_class[k] for k in job.klass.and_lower)
    if s.exclusive_holder is None and still_running == 0 and need <= unreserved:
        s.unqueue(job)
        s.ledger.reserve(exclusive_owner(job.id), {device: need}, count_outside=False)
        job.dispatched = now
        s.running[job.id] = job
        s.running_by_class[job.klass] += 1
        s.progress[job.klass] = now
        s.exclusive_holder = job.id
        s.emit("dispatch", "info", job=job.id, request=job.request, model=None, **{"class": job.klass},
               step="1/1", waited_s=rounded(now - job.submitted), exclusive=True, memory=need)
        s.effects.append(Grant(job.id, None, None, waited_s=rounded(now - job.submitted)))


def keep_hot_time(s: CoreState, engine: EngineState, job: Job, now: float) -> None:
    """*engine*, evicted for exclusive *job*: the hot time it has left is kept for the job's end."""
    window = s.policy.hot_window
    if engine.hot(now, window):
        engine.hot_kept = HotKept(job.id, engine.last_interactive + window - now)


def resume_hot_time(s: CoreState, job_id: int, now: float) -> None:
    """Exclusive job *job_id* ended (or left): the engines it evicted while hot are hot again
    for the time they had left (a step since may have made one hotter: the later counts)."""
    window = s.policy.hot_window
    for engine in s.engines.values():
        kept = engine.hot_kept
        if kept is None or kept.job != job_id:
            continue
        engine.hot_kept = None
        engine.last_interactive = max(engine.last_interactive, now + kept.left - window)
        engine.hot_resumed = True
        s.emit("hot_resumed", "info", engine=engine.name, job=job_id, hot_left_s=rounded(kept.left),
               hot_until=rounded(engine.last_interactive + window), status=engine.status.value)
