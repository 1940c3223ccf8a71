"""The interactive window's gate and the starvation guard (rules 3, 4 to 4d).

``gate`` says whether a class is open, held back by higher work ('blocked'), or held back
but let through by the guard ('guard'). While an interactive step runs, and for
``interactive_window`` after the last one ends, no background or batch step starts
except by the guard (or a gap step, gaps.py). The guard: when the head of a lower class
has made no progress for its ``starvation`` time, one of its steps runs beside the higher
classes' work, the oldest that can actually run now. Beside interactive work both lower
classes share one lane, one turn at a time, the class due first first, within
``guard_share`` of the time, waiting up to ``guard_gap_wait`` for a moment no interactive
step computes; with ``guard_fill`` a turn fills its engine's free slots. Within a class the
turns are shared round-robin among the models whose steps wait (``turn_order``): the model
whose last turn is the oldest (never had one: first) goes first, the oldest request on a
tie; so one client that sends many steps for one model (an indexer's embeddings) cannot
take every turn while another model's steps (an agent's) wait. A turn obeys rule
3c; when the lower classes' own steps hold what it needs it claims them (4b: no other
lower-class step starts there until it has), and a due turn may evict what a higher lower
class wants (4d). A turn that would evict waits for the window to close, for up to
``guard_gap_wait``.
"""

from __future__ import annotations

import enum
import math

from supervisor.scheduler.classes import dispatch, lower_class_busy, lower_engines_full
from supervisor.scheduler.eviction import LoadReason, carry_out, place
from supervisor.scheduler.gaps import left_to_gaps
from supervisor.scheduler.state import TURN_DEMAND, CoreState, Demand, rounded
from supervisor.request_class import LOWER_CLASSES, RequestClass
from supervisor.scheduler.types import EngineState, EngineStatus, GuardClaim, Job

# ---- when a class is held back, and when its turn is due ----------------------------


class Gate(enum.Enum):
    """Whether a class's steps may start now."""

    OPEN = "open"
    GUARD = "guard"  # held back by higher work, but the guard lets one through
    BLOCKED = "blocked"  # held back by higher work


def gate(s: CoreState, klass: RequestClass, now: float, turn: RequestClass | None) -> Gate:
    """OPEN, or for a lower class held back by higher work: GUARD or BLOCKED. *turn*: the
    class whose turn beside interactive work is due (``guard_turn``)."""
    if klass is RequestClass.INTERACTIVE:
        return Gate.OPEN
    higher = klass.higher
    interactive_active = s.interactive_active(now)
    if not (interactive_active or any(s.running_by_class[h] or s.queues[h].size for h in higher)):
        return Gate.OPEN
    if interactive_active:
        return Gate.GUARD if turn is klass else Gate.BLOCKED
    return Gate.GUARD if _guard_due(s, klass, now, beside_interactive=False) else Gate.BLOCKED


def _guard_due(s: CoreState, klass: RequestClass, now: float, *, beside_interactive: bool) -> bool:
    """The class's head has made no progress for its starvation time. Beside interactive work
    the lower classes share one lane, within ``guard_share`` of the time."""
    limit = s.policy.starvation[klass]
    since = starved_since(s, klass)
    if limit <= 0 or since is None or now - since < limit or in_turn(s, klass):
        return False
    if beside_interactive:
        # Prefer a moment when no interactive step computes, so none is slowed from its
        # start; after waiting guard_gap_wait for such a gap, go anyway.
        due = lane_due_at(s, since, klass)
        gap = s.running_by_class[RequestClass.INTERACTIVE] == 0 or now >= due + s.policy.guard_gap_wait
        return gap and now >= due and lane_class(s) is None
    return True


def guard_turn(s: CoreState, now: float) -> RequestClass | None:
    """Which lower class may use the lane beside interactive work now: the one due first
    (starved since, plus its starvation time; background on a tie). First due, first
    served: a class waits for at most one turn of the other (and the lane's rest after it)."""
    if not s.interactive_active(now):
        return None
    due = [k for k in LOWER_CLASSES if _guard_due(s, k, now, beside_interactive=True)]
    return min(due, key=lambda k: (_own_due_at(s, k), k.rank), default=None)


def _own_due_at(s: CoreState, klass: RequestClass) -> float:
    """When *klass*'s head will have made no progress for its starvation time (inf: nothing starves)."""
    since = starved_since(s, klass)
    return math.inf if since is None else since + s.policy.starvation[klass]


def lane_due_at(s: CoreState, since: float, klass: RequestClass) -> float:
    """When a turn of *klass* beside interactive work is due: starved its starvation time,
    and the lane rested (guard_share)."""
    return max(since + s.policy.starvation[klass], s.turns.resume_at)


def starved_since(s: CoreState, klass: RequestClass) -> float | None:
    """Since when *klass*'s head has made no progress (None: nothing of it starves)."""
    head = _clock_head(s, klass)
    if head is None or head.exclusive:
        return None
    return max(s.progress[klass], head.submitted)


def _clock_head(s: CoreState, klass: RequestClass) -> Job | None:
    """The head the starvation clock reads: the class's oldest, passing over the short lines
    left to the gaps while a longer one waits (rule 3b)."""
    queue = s.queues[klass]
    if s.policy.gap_step <= 0:
        return queue.head()
    return min(queue.heads(), default=None, key=lambda h: (
        h.model is not None and left_to_gaps(s, h, s.now), h.seq, h.id))


def _swap_waits_for_window(s: CoreState, klass: RequestClass, now: float) -> bool:
    """Beside interactive work, a guard turn that would evict another engine waits for the
    window to close, for up to guard_gap_wait after it was due. A load slows the chats
    computing for all its length (weights copied in, the KV cache built), longer than a step,
    and the next chat's pause usually comes sooner; a load into free memory goes at once."""
    since = starved_since(s, klass)
    if since is None or not s.interactive_active(now):
        return False
    return now < lane_due_at(s, since, klass) + s.policy.guard_gap_wait


# ---- the turns under way --------------------------------------------------------------


def in_turn(s: CoreState, klass: RequestClass) -> bool:
    """A guard turn of *klass* is under way: its first step waits for its load or runs, or
    steps that joined it run."""
    return s.turns.step[klass] is not None or bool(s.turns.fill[klass])


def lane_class(s: CoreState) -> RequestClass | None:
    """The lower class whose guard turn holds the lane beside interactive work, if any."""
    return next((k for k in LOWER_CLASSES if in_turn(s, k)), None)


def end_turn_step(s: CoreState, job: Job, now: float) -> None:
    """A step of a guard turn ended; once the turn's last has, the lane rests (guard_share)."""
    klass = job.klass
    if s.turns.step[klass] == job.id:
        s.turns.step[klass] = None
    s.turns.fill[klass].discard(job.id)
    if job.by_guard and not in_turn(s, klass):
        share = s.policy.guard_share
        s.turns.resume_at = now + (now - s.turns.started[klass]) * (1 - share) / share


def turn_engines(s: CoreState) -> dict[str, Demand]:
    """Rule 4d: an engine loading (or loaded) for a guard turn's first step is wanted before
    any lower class's demand (only interactive work may take it), until that step starts:
    else the class the turn is for would evict it again the moment it is ready."""
    pending = (s.waiting.get(job_id) for job_id in s.turns.step.values() if job_id is not None)
    return {job.model: TURN_DEMAND for job in pending if job is not None and job.model is not None}


def drop_stale_guards(s: CoreState) -> None:
    """A guard step still waiting for the load made for it, which was undone (its engine
    evicted, for an exclusive job say, before the step could run), no longer holds the
    lane: the guard chooses again. Kept, it would wait for an engine nobody loads."""
    for klass, job_id in s.turns.step.items():
        job = s.waiting.get(job_id) if job_id is not None else None
        if job is None or job.model is None:
            continue  # running (or gone): its end frees the lane
        engine = s.engines[job.model]
        if engine.status not in (EngineStatus.STARTING, EngineStatus.READY):
            s.turns.step[klass] = None
            s.emit("starvation_retry", "info", job=job.id, model=job.model, **{"class": klass},
                   engine_status=engine.status.value)


# ---- serving a turn ---------------------------------------------------------------------


def serve_turn_first(s: CoreState, now: float, turn: RequestClass | None, blocked_from: int | None,
                     promised: dict[int, int], wanted: dict[str, Demand], claimed: GuardClaim | None) -> None:
    """Rule 4b: a due guard turn is served before the lower classes' other steps, and when
    the lower classes' own work holds what it needs, it claims those engines (*claimed*:
    the claim of the last decision, said once)."""
    klass = _due_turn(s, now, turn)
    if klass is None or (blocked_from is not None and klass.rank >= blocked_from):
        return
    for higher in klass.higher[1:]:  # interactive's are in *wanted* already
        for head in s.queues[higher].heads():
            if head.model is not None:
                wanted.setdefault(head.model, (higher.rank, head.seq))
    serve_guard(s, klass, now, promised, wanted, may_start_new=True)
    held = () if in_turn(s, klass) else _held_by_lower_work(s, klass, now)
    if not held:
        return
    s.turns.claim = GuardClaim(klass, held)
    if claimed is None or claimed.klass != klass:
        s.emit("starvation_claim", "info", **{"class": klass}, waits_for=list(held),
               starved_s=rounded(now - (starved_since(s, klass) or now)), step_s=s.measured_step(held))


def _due_turn(s: CoreState, now: float, turn: RequestClass | None) -> RequestClass | None:
    """The lower class whose guard turn is due now, if any."""
    if s.exclusive_holder is not None:
        return None
    return next((k for k in LOWER_CLASSES if s.queues[k].size and gate(s, k, now, turn) is Gate.GUARD), None)


def _held_by_lower_work(s: CoreState, klass: RequestClass, now: float) -> tuple[str, ...]:
    """The engines whose lower-class steps hold every line of *klass*: its engine is past
    rule 3c's bound (all the engines they compute on hold it), or all its slots are busy
    while lower-class steps compute on it. (): some line waits for something else."""
    busy = lower_class_busy(s)
    held: set[str] = set()
    for head in s.queues[klass].heads():
        if head.model is None:
            return ()
        if lower_engines_full(s, klass, head.model, now):
            held |= busy
        elif head.model in busy and not s.has_free_slot(s.engines[head.model]):
            held.add(head.model)
        else:
            return ()
    return tuple(sorted(held))


def serve_guard(s: CoreState, klass: RequestClass, now: float, promised: dict[int, int], wanted: dict[str, Demand], *,
                may_start_new: bool) -> None:
    """A class held back by higher work: one guard turn at a time runs beside it, one step,
    or with guard_fill its engine's free slots; within rule 3c's bound."""
    pending = s.turns.step[klass]
    if pending is not None:
        job = s.waiting.get(pending)
        if job is not None and s.has_free_slot(s.engines[job.model]):  # type: ignore[index]
            _start_turn(s, job, s.engines[job.model], now)  # type: ignore[index]
        return
    if not may_start_new:
        return
    rank = klass.rank
    # In turn_order, the first that can actually run now: resident with a free slot, or
    # loadable at once into free memory or over idle cold engines.
    for head in turn_order(s, klass, now):
        engine = s.engines[head.model]  # type: ignore[index]
        if lower_engines_full(s, klass, head.model, now):
            continue  # a second lower-class engine beside a hot chat's (rule 3c)
        if s.has_free_slot(engine):
            s.emit("starvation_step", "info", job=head.id, model=head.model, **{"class": klass},
                   starved_s=rounded(now - (starved_since(s, klass) or now)), load=False,
                   steps=1 + len(_turn_fill(s, head, engine)), step_s=s.measured_step([engine.name]))
            _start_turn(s, head, engine, now)
            return
        if not s.may_start(engine, now):
            continue
        option = place(s, engine, now, promised, wanted, (rank, head.seq), idle_only=True)
        if option is None or option.victims is None:
            option = place(s, engine, now, promised, _guard_wanted(klass, wanted), (rank, head.seq), idle_only=False)
        if option is None or option.victims is None:
            continue
        if option.victims and _swap_waits_for_window(s, klass, now):
            continue
        s.emit("starvation_step", "info", job=head.id, model=head.model, **{"class": klass},
               starved_s=rounded(now - (starved_since(s, klass) or now)), load=True,
               step_s=s.measured_step([engine.name]))
        s.turns.step[klass] = head.id
        carry_out(s, engine, option, now, promised, LoadReason.of(head, guard=True))
        return


def turn_order(s: CoreState, klass: RequestClass, now: float) -> list[Job]:
    """The heads of *klass*'s lines in the order its guard turns take them: round-robin
    among the models whose steps wait, the model whose last turn is the oldest first (never
    had one: first), the oldest request on a tie. With gap steps, the lines whose steps are
    short come last while the gaps serve them (left_to_gaps)."""
    last = s.turns.last_turn[klass]
    heads = [h for h in s.queues[klass].heads() if h.model is not None]
    return sorted(heads, key=lambda h: (left_to_gaps(s, h, now), last.get(h.model, 0), h.seq))  # type: ignore[arg-type]


def _guard_wanted(klass: RequestClass, wanted: dict[str, Demand]) -> dict[str, Demand]:
    """Rule 4d: the demand a due turn of *klass* leaves standing when memory holds it: the
    interactive class's and its own class's, not that of the lower classes above it."""
    return {name: demand for name, demand in wanted.items() if demand[0] in (0, klass.rank)}


def _start_turn(s: CoreState, head: Job, engine: EngineState, now: float) -> None:
    s.turns.turn_count += 1
    s.turns.last_turn[head.klass][engine.name] = s.turns.turn_count  # the model's turn: the next goes to another
    dispatch(s, head, engine, now, by_guard=True)
    for job in _turn_fill(s, head, engine):
        dispatch(s, job, engine, now, by_guard=True, fill=True)


def _turn_fill(s: CoreState, head: Job, engine: EngineState) -> list[Job]:
    """guard_fill: the steps that join *head*'s turn on its engine, up to its free slots: its
    class's next ones for the same model. Only while no interactive step computes: one engine
    more costs a chat the same whether one of its slots decodes or all (they batch), but
    beside a chat already computing the turn stays one step."""
    if not s.policy.guard_fill or s.running_by_class[RequestClass.INTERACTIVE]:
        return []
    free = engine.profile.slots - engine.in_flight - (0 if head.id in s.running else 1)
    return [job for job in s.queues[head.klass].line(engine.name) if job is not head][:max(free, 0)]
