"""Serving a class: strict order, FIFO lines, one engine at a time between chats (rules 1, 3c, 7).

An open class fills its engines' free slots oldest request first, never more steps to an
engine than its slots, then loads engines for the rest (swaps.py holds a swap, eviction.py
makes room). Between chats (rule 3c, ``lower_class_engines``): while an engine is hot,
background and batch steps compute on at most that many engines at once, the oldest
request's first, and not on the engines a due guard turn of the other class claims.
``dispatch`` grants a step: every rule that starts one (a class's own, the guard's turn,
a gap step) goes through it. The GPU's mode (what the terminal shows) is read here too.
"""

from __future__ import annotations

from supervisor.scheduler.eviction import LoadReason
from supervisor.scheduler.state import CoreState, Demand, rounded
from supervisor.scheduler.swaps import load_or_make_room
from supervisor.request_class import RequestClass
from supervisor.scheduler.types import EngineState, GpuMode, Grant, Job


def serve_class(s: CoreState, klass: RequestClass, now: float, promised: dict[int, int],
                wanted: dict[str, Demand]) -> None:
    """An open class: fill free slots oldest first, then load engines for the rest."""
    queue = s.queues[klass]
    rank = klass.rank
    heads = sorted((h for h in queue.heads() if h.model is not None), key=lambda h: h.seq)
    for model in [h.model for h in heads]:  # the oldest request's first (rule 3c may stop the rest)
        engine = s.engines[model]  # type: ignore[index]
        line = queue.line(model)
        if lower_engines_full(s, klass, model, now):
            continue
        while line and s.has_free_slot(engine):
            dispatch(s, line[0], engine, now)
            line = queue.line(model)
    heads = sorted((h for h in queue.heads() if h.model is not None), key=lambda h: h.seq)
    for head in heads:
        engine = s.engines[head.model]  # type: ignore[index]
        if s.may_start(engine, now):
            load_or_make_room(s, engine, now, promised, wanted, (rank, head.seq), LoadReason.of(head), for_job=head)
        wanted.setdefault(engine.name, (rank, head.seq))


def lower_engines_full(s: CoreState, klass: RequestClass, model: str | None, now: float) -> bool:
    """Rule 3c: while a chat's engine is hot, background and batch steps compute on at most
    ``lower_class_engines`` engines at once; whether *model* is past that. The engines a due
    guard turn of another class claims (rule 4b) are, too."""
    if klass is RequestClass.INTERACTIVE:
        return False
    claim = s.turns.claim
    if claim is not None and claim.klass != klass and model in claim.engines:
        return True
    if not engines_bounded(s, now):
        return False
    busy = lower_class_busy(s)
    return model not in busy and len(busy) >= s.policy.lower_class_engines


def engines_bounded(s: CoreState, now: float) -> bool:
    """Rule 3c applies: a limit is set and a chat's engine is hot."""
    return s.policy.lower_class_engines > 0 and now < s.hot_until()


def lower_class_busy(s: CoreState) -> set[str]:
    """The engines background or batch steps compute on, and the engine a guard turn's
    first step waits for (loading for it): that turn will compute there next."""
    busy = {job.model for job in s.running.values()
            if job.klass is not RequestClass.INTERACTIVE and job.model is not None}
    pending = (s.waiting.get(job_id) for job_id in s.turns.step.values() if job_id is not None)
    return busy | {job.model for job in pending if job is not None and job.model is not None}


def dispatch(s: CoreState, job: Job, engine: EngineState, now: float, *, by_guard: bool = False,
             fill: bool = False, gap: bool = False) -> None:
    """Grant *job* a slot of *engine*. *by_guard*: the guard's turn (*fill*: a step that joins
    it); *gap*: a gap step (rule 3b)."""
    assert engine.endpoint is not None
    s.unqueue(job)
    job.engine_generation = engine.generation
    job.dispatched = now
    job.by_guard = by_guard
    s.running[job.id] = job
    s.running_by_class[job.klass] += 1
    if gap:
        s.gap_job = job.id  # the guard still serves the class's other lines: no progress
    else:
        s.progress[job.klass] = now
    if fill:
        s.turns.fill[job.klass].add(job.id)
    elif by_guard:
        s.turns.step[job.klass] = job.id
        s.turns.started[job.klass] = now
    engine.in_flight += 1
    engine.last_used = now
    engine.record_use(now, job.klass, s.policy.hot_window)
    if job.klass is RequestClass.INTERACTIVE:
        engine.last_interactive = now
    s.emit("dispatch", "debug", job=job.id, request=job.request, model=job.model, **{"class": job.klass},
           step=f"{job.step}/{job.steps}", waited_s=rounded(now - job.submitted),
           in_flight=engine.in_flight, slots=engine.profile.slots, guard=by_guard)
    s.effects.append(Grant(job.id, engine.name, engine.endpoint, engine.generation, rounded(now - job.submitted)))


def update_mode(s: CoreState, now: float) -> None:
    """What the GPU does now, by the highest class at work: exclusive, interactive (its
    window open), background, batch or idle."""
    if s.exclusive_holder is not None:
        mode = GpuMode.EXCLUSIVE
    elif s.window_open(now) or s.queues[RequestClass.INTERACTIVE].size:
        mode = GpuMode.INTERACTIVE
    elif s.running_by_class[RequestClass.BACKGROUND]:
        mode = GpuMode.BACKGROUND
    elif s.running_by_class[RequestClass.BATCH]:
        mode = GpuMode.BATCH
    else:
        mode = GpuMode.IDLE
    if mode != s.mode:
        s.emit("mode", "debug", gpu=mode, previous=s.mode)  # frequent: the terminal shows loads and requests
        s.mode = mode
