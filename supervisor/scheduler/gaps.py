"""Gap steps: a short lower-class step in a pause between chats (rule 3b, ``gap_step``).

In a gap of the interactive window (no interactive step computes or waits), one
lower-class step whose engine's last steps took at most ``gap_step`` on average (measured;
never measured: not short) starts at once, when no other lower-class step computes:
background's first, oldest first; the next when it ends, if the gap lasts. A gap step is no
progress for the starvation clock, and the guard's turns pass over the short lines (the
gaps serve them) until one has waited its starvation time plus ``guard_gap_wait``.
"""

from __future__ import annotations

from supervisor.scheduler.classes import dispatch
from supervisor.scheduler.state import CoreState, rounded
from supervisor.request_class import LOWER_CLASSES, RequestClass
from supervisor.scheduler.types import Job


def in_gap(s: CoreState, now: float) -> bool:
    """Between interactive steps: none computes or waits, while the window is still open."""
    return (s.policy.gap_step > 0 and s.running_by_class[RequestClass.INTERACTIVE] == 0
            and not s.queues[RequestClass.INTERACTIVE].size and s.window_open(now))


def short(s: CoreState, engine: str) -> bool:
    """Whether the engine's steps are short: the mean of its last ones is at most gap_step.
    Never measured: not short."""
    mean = s.mean_step(engine)
    return mean is not None and mean <= s.policy.gap_step


def left_to_gaps(s: CoreState, head: Job, now: float) -> bool:
    """A short step the guard's turns pass over (the gaps serve it), until it has waited its
    starvation time and guard_gap_wait for a gap, as a due guard step would."""
    limit = s.policy.starvation[head.klass] + s.policy.guard_gap_wait
    is_short = head.model is not None and short(s, head.model)
    return s.policy.gap_step > 0 and is_short and now - head.submitted < limit


def serve_gap(s: CoreState, now: float) -> None:
    """In a gap, one short lower-class step starts at once, when no lower-class step computes
    (background's first, oldest first); the next when it ends, if the gap lasts. Decided
    before the guard's turn, which may start beside it: neither waits for the other."""
    if not in_gap(s, now) or any(s.running_by_class[k] for k in LOWER_CLASSES) or s.turns.claim is not None:
        return
    for klass in LOWER_CLASSES:
        heads = sorted((h for h in s.queues[klass].heads() if h.model is not None), key=lambda h: h.seq)
        for head in heads:
            engine = s.engines[head.model]  # type: ignore[index]
            if short(s, engine.name) and s.has_free_slot(engine):
                s.emit("gap_step", "debug", job=head.id, model=head.model, **{"class": klass},
                       step_s=rounded(s.mean_step(engine.name)), gap_step_s=s.policy.gap_step)  # type: ignore[arg-type]
                dispatch(s, head, engine, now, gap=True)
                return
