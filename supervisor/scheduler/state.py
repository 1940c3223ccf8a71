"""What the decision core owns, and the reads and moves every rule shares.

``CoreState`` is the core's whole mutable state: the engines, the ledger, the class queues,
the jobs waiting and running, the starvation guard's turns, the mode, the clock and the
effects decided so far. The rule modules (core.py's last list says which owns which rule)
are functions over it; ``Scheduler`` (core.py) is this state with its inputs.

Besides the fields, only what every rule needs and no rule owns lives here: saying things
(``emit``, ``fail``), taking a job out of its line, telling an engine to stop, releasing
its memory, and plain reads (is the interactive window open, has an engine a free slot, may
it start, where does it hold memory).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable

import attrs

from supervisor.scheduler.ledger import Ledger
from supervisor.scheduler.queues import ClassQueue
from supervisor.request_class import RequestClass
from supervisor.scheduler.types import (
    Effect,
    Emit,
    EngineState,
    EngineStatus,
    Fail,
    GpuMode,
    GuardClaim,
    Job,
    SchedulingPolicy,
    StopEngine,
    WarmCause,
)

Demand = tuple[int, int]  # (class rank, seq) of the earliest job that wants an engine
NO_DEMAND: Demand = (len(RequestClass), math.inf)  # type: ignore[assignment]
TURN_DEMAND: Demand = (RequestClass.BACKGROUND.rank, -1)  # a guard turn's engine: before any lower class's request
# Whether an engine's steps are short (rule 3b) is judged by the mean of its last this many.
STEP_SAMPLES = 8


@attrs.define
class GuardTurns:
    """The starvation guard's turns (guard.py): per lower class, the turn under way, and the lane's rest."""

    # The step the starvation guard let through, per class, until it ends (its engine may
    # still be loading for it: then it waits, and holds the lane).
    step: dict[RequestClass, int | None] = attrs.Factory(lambda: dict.fromkeys(RequestClass))
    # The steps that joined a guard turn on its engine (guard_fill), per class, until they end,
    # and when each class's turn began: guard_share counts the whole turn.
    fill: dict[RequestClass, set[int]] = attrs.Factory(lambda: {k: set() for k in RequestClass})
    started: dict[RequestClass, float] = attrs.Factory(lambda: dict.fromkeys(RequestClass, -math.inf))
    resume_at: float = -math.inf  # the guard's share of the GPU: no guard step before this
    # The lane's fair share among a class's models (guard.turn_order): per class, the number
    # of each model's last turn (turns are counted from 1), and the last number given.
    last_turn: dict[RequestClass, dict[str, int]] = attrs.Factory(lambda: {k: {} for k in RequestClass})
    turn_count: int = 0
    # A due guard turn that waits for the lower classes' own steps, and on which engines (rule
    # 4b): no other lower-class step starts there until it has.
    claim: GuardClaim | None = None


@attrs.define
class CoreState:
    """What the decision core owns: the rule modules move it, explain.py and the snapshot only read it."""

    ledger: Ledger
    engines: dict[str, EngineState]
    policy: SchedulingPolicy = attrs.Factory(SchedulingPolicy)
    # With a GPU probe, a reservation waits for the memory to be observed free.
    observe_memory: bool = False
    queues: dict[RequestClass, ClassQueue] = attrs.Factory(lambda: {k: ClassQueue(k) for k in RequestClass})
    waiting: dict[int, Job] = attrs.Factory(dict)
    running: dict[int, Job] = attrs.Factory(dict)
    running_by_class: dict[RequestClass, int] = attrs.Factory(lambda: dict.fromkeys(RequestClass, 0))
    # When a class last made progress (a step of it started or ended): the starvation clock.
    progress: dict[RequestClass, float] = attrs.Factory(lambda: dict.fromkeys(RequestClass, -math.inf))
    gap_job: int | None = None  # the gap step running (rule 3b), until it ends
    # Each engine's last steps, dispatch to end, newest last: which engines' steps are short.
    step_times: dict[str, collections.deque[float]] = attrs.Factory(dict)
    last_interactive_end: float = -math.inf
    turns: GuardTurns = attrs.Factory(GuardTurns)
    mode: GpuMode = GpuMode.IDLE
    closing: bool = False  # steward is shutting down: no new requests start
    exclusive_holder: int | None = None
    warm_cause: WarmCause | None = None  # what freed the GPU, while engines are loaded ahead of demand (rule 10)
    outside_memory: tuple[int, ...] | None = None  # per device: memory used by processes that are not engines
    settle_polls_left: int = 0  # readings to go before the outside estimate may move again
    now: float = 0.0
    wall_offset: float = 0.0  # the wall clock minus this clock: times in words are the wall clock's
    # (deadline, job id) of the waiting jobs, a heap: the next queue timeout first.
    deadlines: list[tuple[float, int]] = attrs.Factory(list)
    effects: list[Effect] = attrs.Factory(list)  # decided in this input, not yet handed out

    # ---- saying and undoing -------------------------------------------------------------

    def emit(self, event: str, level: str, **fields: object) -> None:
        self.effects.append(Emit(event, level, fields))

    def flush(self) -> list[Effect]:
        """The effects decided since the last flush, handed out once."""
        effects, self.effects = self.effects, []
        return effects

    def fail(self, job: Job, status: int, code: str, message: str, *, retry_after: float | None,
             reason: str) -> None:
        self.emit("reject", "warning", job=job.id, model=job.model, **{"class": job.klass}, reason=reason)
        self.effects.append(Fail(job.id, status, code, message, retry_after=retry_after))

    def unqueue(self, job: Job) -> None:
        del self.waiting[job.id]
        self.queues[job.klass].remove(job)
        if self.turns.step[job.klass] == job.id and job.id not in self.running:
            self.turns.step[job.klass] = None

    def stop(self, engine: EngineState) -> None:
        engine.status = EngineStatus.STOPPING
        engine.drained_for = None
        engine.outside_baseline = self.outside_memory
        self.emit("stop", "info", engine=engine.name, generation=engine.generation)
        self.effects.append(StopEngine(engine.name, engine.generation))

    def release(self, engine: EngineState) -> int:
        engine.outside_baseline = None
        return self.ledger.release(engine.name)

    # ---- reads ----------------------------------------------------------------------------

    def queued_for(self, model: str) -> bool:
        """Whether steps of any class wait for *model*."""
        return any(q.count(model) for q in self.queues.values())

    def removed(self, model: str) -> bool:
        """A reload removed *model* from the config: its engine goes once its steps end."""
        retiring = self.engines[model].retiring
        return retiring is not None and retiring.replacement is None

    def window_open(self, now: float) -> bool:
        """Rule 3: an interactive step runs, or one ended within ``interactive_window``."""
        return (self.running_by_class[RequestClass.INTERACTIVE] > 0
                or now < self.last_interactive_end + self.policy.interactive_window)

    def interactive_active(self, now: float) -> bool:
        """The window is open or an interactive step waits: the lower classes are held back."""
        return self.window_open(now) or self.queues[RequestClass.INTERACTIVE].size > 0

    def hot_until(self) -> float:
        """When the last engine used interactively stops being hot (EngineState.hot)."""
        return max((e.last_interactive for e in self.engines.values()), default=-math.inf) + self.policy.hot_window

    def has_free_slot(self, engine: EngineState) -> bool:
        return (engine.status is EngineStatus.READY and not engine.unhealthy
                and engine.in_flight < engine.profile.slots)

    def may_start(self, engine: EngineState, now: float) -> bool:
        if self.ledger.releasing(engine.name) or engine.retiring is not None:
            return False
        if engine.status in (EngineStatus.STOPPED, EngineStatus.SLEEPING):
            return True
        return engine.status is EngineStatus.FAILED and now >= engine.retry_at

    def mean_step(self, engine: str) -> float | None:
        """The mean of *engine*'s last measured steps (None: never measured)."""
        times = self.step_times.get(engine)
        return sum(times) / len(times) if times else None

    def measured_step(self, engines: Iterable[str]) -> float | None:
        """The longest of the engines' measured mean step times (None: none measured)."""
        means = [mean for name in engines if (mean := self.mean_step(name)) is not None]
        return rounded(max(means)) if means else None

    def devices_of(self, engine: EngineState) -> tuple[int, ...]:
        """Where it holds memory now, else where it was placed last."""
        if share := self.ledger.shares.get(engine.name):
            return tuple(sorted(share))
        return engine.placement.devices if engine.placement is not None else ()

    def freeing_on(self, device: int) -> int:
        """Memory of engines on their way out: draining, stopping, or exited and not yet released."""
        return sum(self.ledger.held_on(e.name, device) for e in self.engines.values()
                   if self.ledger.releasing(e.name) or e.status in (EngineStatus.STOPPING, EngineStatus.DRAINING))


def rounded(seconds: float) -> float:
    """A time as events carry it."""
    return round(seconds, 6)
