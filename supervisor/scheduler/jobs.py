"""A step's life in the core: queued, refused, withdrawn, timed out, finished (rules 1, 2).

``submit`` queues one step in its class's line for its engine (ordered by its request's
place in line: a later step keeps its request's place), or refuses it at once: steward is
closing, the model is gone, it could never fit, or the queue is full. ``expire`` answers
the steps that waited past their queue timeout, and those whose engine restarts too late
for them. ``finish`` ends a step: its slot frees, the starvation clock moves (not for a gap
step), a guard turn may end, its time is measured for gap steps and drains, an exclusive
job's GPU returns, a draining engine whose last step it was stops.
"""

from __future__ import annotations

import collections
import heapq

from supervisor.scheduler.exclusive import exclusive_owner, resume_hot_time
from supervisor.scheduler.guard import end_turn_step
from supervisor.scheduler.placing import most_memory
from supervisor.scheduler.state import STEP_SAMPLES, CoreState, rounded
from supervisor.request_class import ALL_CLASSES, RequestClass
from supervisor.scheduler.types import DEFAULT_DEVICE, EngineStatus, Fail, Job, WarmCause

SHUTTING_DOWN = "steward is shutting down; try again once it is back"
SHUTDOWN_RETRY_AFTER = 5.0


def submit(s: CoreState, job_id: int, model: str | None, klass: RequestClass, now: float, *, seq: int | None,
           request: int | None, step: int, steps: int, exclusive_memory: int | None,
           timeout: float | None, may_use: frozenset[str] | None = None) -> bool:
    """Queue one step (*model* None: an exclusive job); False: it was refused."""
    need = _need(s, model, exclusive_memory)
    job = Job(job_id, model, klass, seq=job_id if seq is None else seq, submitted=now,
              deadline=now + (s.policy.queue_timeout[klass] if timeout is None else timeout),
              request=job_id if request is None else request, step=step, steps=steps,
              exclusive_memory=need if model is None else 0, may_use=may_use)
    job.next_report = now + s.policy.wait_report_after
    if s.closing and step == 1:
        return _refuse(s, job, 503, "shutting_down", SHUTTING_DOWN, retry_after=SHUTDOWN_RETRY_AFTER)
    if model is not None and (model not in s.engines or s.removed(model)):
        return _refuse(s, job, 404, "model_not_found", f"the model '{model}' was removed from steward's config")
    if model is None:
        room = s.ledger.budgets[DEFAULT_DEVICE]
    else:
        room = most_memory(s.engines[model].profile, s.ledger, _pinned_elsewhere(s, model))
    if need > room:
        return _refuse(s, job, 503, "insufficient_memory",
                       f"{_what(job)} needs {need} bytes but at most {room} can ever be free "
                       f"for it (budget {s.ledger.budget})")
    queue = s.queues[klass]
    if queue.size >= s.policy.max_queue[klass]:
        return _refuse(s, job, 429, "queue_full", f"the {klass} queue is full ({queue.size} waiting)",
                       retry_after=1.0)
    if queue.size == 0 and s.running_by_class[klass] == 0:
        s.progress[klass] = now  # nothing was waiting: the starvation clock starts now
    queue.push(job)
    s.waiting[job_id] = job
    heapq.heappush(s.deadlines, (job.deadline, job_id))
    s.emit("enqueue", "debug", job=job_id, request=job.request, model=model, **{"class": klass},
           step=f"{step}/{steps}", queued=queue.size)
    return True


def close(s: CoreState) -> None:
    """Shutdown began: the steps of requests not yet started are answered 503 now."""
    s.closing = True
    for job in [j for j in s.waiting.values() if j.step == 1]:
        s.unqueue(job)
        s.fail(job, 503, "shutting_down", SHUTTING_DOWN, retry_after=SHUTDOWN_RETRY_AFTER, reason="shutting_down")


def finish(s: CoreState, job_id: int, status: int | None, now: float) -> None:
    """A step ended (*status*: what its client was answered), or a waiting one was withdrawn."""
    job = s.running.pop(job_id, None)
    if job is None:
        waiting = s.waiting.get(job_id)
        if waiting is not None:
            s.unqueue(waiting)
            s.emit("withdraw", "debug", job=job_id, model=waiting.model, **{"class": waiting.klass},
                   waited_s=rounded(now - waiting.submitted))
            resume_hot_time(s, job_id, now)
        return
    klass = job.klass
    s.running_by_class[klass] -= 1
    if s.gap_job == job_id:
        s.gap_job = None  # a gap step is no progress for the starvation clock (rule 3b)
    else:
        s.progress[klass] = now
    if s.turns.step[klass] == job_id or job_id in s.turns.fill[klass]:
        end_turn_step(s, job, now)
    if job.model is not None and job.dispatched is not None and (status is None or status < 400):
        s.step_times.setdefault(job.model, collections.deque(maxlen=STEP_SAMPLES)).append(now - job.dispatched)
    if klass is RequestClass.INTERACTIVE and s.running_by_class[klass] == 0:
        s.last_interactive_end = now
    if job.exclusive:
        s.ledger.release(exclusive_owner(job_id))
        s.exclusive_holder = None
        s.warm_cause = WarmCause.EXCLUSIVE_JOB
        resume_hot_time(s, job_id, now)
    else:
        engine = s.engines[job.model]  # type: ignore[index]
        if job.engine_generation == engine.generation and engine.serving:
            engine.in_flight -= 1
            engine.last_used = now
            if klass is RequestClass.INTERACTIVE:
                engine.last_interactive = now
            if engine.status is EngineStatus.DRAINING and engine.in_flight == 0:
                s.stop(engine)
    s.emit("complete", "debug", job=job_id, request=job.request, model=job.model, **{"class": klass},
           step=f"{job.step}/{job.steps}", status=status, duration_s=rounded(now - (job.dispatched or now)))


def expire(s: CoreState, now: float) -> None:
    """Answer the steps past their queue timeout, and those whose failed engine restarts after it."""
    while s.deadlines and s.deadlines[0][0] <= now:
        _, job_id = heapq.heappop(s.deadlines)
        job = s.waiting.get(job_id)
        if job is None:
            continue
        s.unqueue(job)
        s.emit("timeout", "warning", job=job.id, model=job.model, **{"class": job.klass},
               waited_s=rounded(now - job.submitted))
        resume_hot_time(s, job.id, now)
        s.effects.append(Fail(job.id, 503, "queue_timeout",
                              f"no capacity for {_what(job)} within {job.deadline - job.submitted:g}s",
                              retry_after=1.0))
    for engine in s.engines.values():
        if engine.status is not EngineStatus.FAILED:
            continue
        for klass in ALL_CLASSES:
            for job in [j for j in s.queues[klass].line(engine.name) if engine.retry_at > j.deadline]:
                s.unqueue(job)
                s.fail(job, 503, "engine_failed", f"engine {engine.name!r} failed and restarts in "
                       f"{engine.retry_at - now:.1f}s", retry_after=engine.retry_at - now, reason="engine_failed")


def next_deadline(s: CoreState) -> float | None:
    """The next queue timeout of a step still waiting (None: none waits)."""
    while s.deadlines and s.deadlines[0][1] not in s.waiting:
        heapq.heappop(s.deadlines)
    return s.deadlines[0][0] if s.deadlines else None


def _refuse(s: CoreState, job: Job, status: int, code: str, message: str, retry_after: float | None = None) -> bool:
    s.fail(job, status, code, message, retry_after=retry_after, reason=code)
    return False


def _pinned_elsewhere(s: CoreState, model: str) -> dict[int, int]:
    """Per device, what the other pinned engines hold (or, on one device, will)."""
    taken: dict[int, int] = {}
    for engine in s.engines.values():
        if engine.profile.pinned and engine.name != model:
            share = s.ledger.shares.get(engine.name)
            if share is None and len(s.ledger.budgets) == 1:
                share = {0: engine.profile.memory}
            for device, nbytes in (share or {}).items():
                taken[device] = taken.get(device, 0) + nbytes
    return taken


def _need(s: CoreState, model: str | None, exclusive_memory: int | None) -> int:
    if model is None:
        return s.ledger.budgets[DEFAULT_DEVICE] if exclusive_memory is None else exclusive_memory
    return s.engines[model].profile.memory if model in s.engines else 0


def _what(job: Job) -> str:
    return "an exclusive job" if job.exclusive else f"model {job.model!r}"
