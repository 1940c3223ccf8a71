"""The decision core of the ledger/scheduler actor: pure, synchronous, no I/O.

Every input (a job submitted, a job finished, an engine ready or gone, time passing)
is one method call that updates the state and returns the effects to carry out
(grant a job, fail a job, start or stop an engine, log an event). Nothing here
awaits, so every decision is atomic, and the whole core runs in virtual time.

Rules kept here (DESIGN.md, "Hard rules of the scheduler"):
- Jobs wait in steward's queue, FIFO, never inside a runtime: an engine never gets
  more concurrent jobs than its slots.
- Count first, load second: a load reserves its memory in the ledger the moment it
  is decided; memory of engines already being evicted counts as being freed, so
  one need never claims a second victim.
- Eviction takes idle engines least-recently-used first; an engine with jobs in
  flight is only drained (no new work), never stopped; loading and pinned engines
  are never evicted.
- A reservation is released only after the engine has exited.
- A failed engine restarts on the next demand, after an exponential backoff.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable

import attrs

from supervisor.scheduler.ledger import Ledger

CLASSES = ("interactive", "background", "batch")


class EngineStatus(enum.Enum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    FAILED = "failed"  # exited unexpectedly; may start again at retry_at


@attrs.frozen
class EngineProfile:
    """What the core needs to know of an engine: its size, its slots, its tier."""

    name: str
    memory: int
    slots: int
    pinned: bool = False


@attrs.define
class EngineState:
    profile: EngineProfile
    status: EngineStatus = EngineStatus.STOPPED
    generation: int = 0  # bumped by every start; stale reports carry an old one
    endpoint: str | None = None
    in_flight: int = 0  # jobs of the current generation granted and not finished
    last_used: float = -math.inf
    draining: bool = False  # chosen for eviction: no new work, stop once in_flight == 0
    failures: int = 0  # consecutive unexpected exits
    retry_at: float = -math.inf
    start_decided_at: float = 0.0
    ready_at: float | None = None

    @property
    def name(self) -> str:
        return self.profile.name


@attrs.define
class Job:
    id: int
    model: str
    klass: str
    submitted: float
    deadline: float
    engine_generation: int | None = None  # set when granted


# Effects: what the async shell must do after a decision.
@attrs.frozen
class Grant:
    job_id: int
    engine: str
    endpoint: str


@attrs.frozen
class Fail:
    job_id: int
    status: int
    code: str
    message: str
    retry_after: float | None = None


@attrs.frozen
class StartEngine:
    engine: str
    generation: int


@attrs.frozen
class StopEngine:
    engine: str
    generation: int


@attrs.frozen
class Emit:
    event: str
    level: str
    fields: dict[str, object]


Effect = Grant | Fail | StartEngine | StopEngine | Emit


@attrs.frozen
class BackoffPolicy:
    initial: float = 1.0
    maximum: float = 60.0

    def delay(self, failures: int) -> float:
        return min(self.initial * 2 ** max(failures - 1, 0), self.maximum)


@attrs.frozen
class EngineSnapshot:
    name: str
    status: str
    in_flight: int
    slots: int
    memory: int
    reserved: int
    draining: bool
    pinned: bool
    queued: int
    failures: int


@attrs.frozen
class SchedulerSnapshot:
    budget: int
    reserved: int
    queued: int
    engines: tuple[EngineSnapshot, ...]


@attrs.define
class Scheduler:
    ledger: Ledger
    engines: dict[str, EngineState]
    backoff: BackoffPolicy = attrs.Factory(BackoffPolicy)
    queue: list[Job] = attrs.Factory(list)  # waiting jobs, FIFO
    running: dict[int, Job] = attrs.Factory(dict)  # granted jobs by id
    _effects: list[Effect] = attrs.Factory(list)

    @classmethod
    def create(cls, budget: int, profiles: Iterable[EngineProfile], backoff: BackoffPolicy | None = None,
               ) -> Scheduler:
        engines = {p.name: EngineState(p) for p in profiles}
        return cls(Ledger(budget), engines, backoff or BackoffPolicy())

    # ---- inputs -------------------------------------------------------------------

    def start(self, now: float) -> list[Effect]:
        """Called once: loads the pinned engines."""
        return self._decide(now)

    def submit(self, job_id: int, model: str, klass: str, now: float, timeout: float) -> list[Effect]:
        engine = self.engines[model]
        job = Job(job_id, model, klass, submitted=now, deadline=now + timeout)
        room = self.ledger.budget - sum(
            e.profile.memory for e in self.engines.values() if e.profile.pinned and e is not engine)
        if engine.profile.memory > room:
            self._emit("reject", "warning", job=job_id, model=model, reason="insufficient_memory")
            self._effects.append(Fail(job_id, 503, "insufficient_memory",
                                      f"model {model!r} needs {engine.profile.memory} bytes but at most "
                                      f"{room} can ever be free for it (budget {self.ledger.budget})"))
            return self._flush()
        self.queue.append(job)
        self._emit("enqueue", "debug", job=job_id, model=model, **{"class": klass}, queued=len(self.queue))
        return self._decide(now)

    def finish(self, job_id: int, now: float, status: int | None = None) -> list[Effect]:
        """The handler is done with a job: it completed, failed, or the client left.

        *status* is what the client was answered (HTTP status), for the log only.
        """
        job = self.running.pop(job_id, None)
        if job is None:
            for waiting in self.queue:
                if waiting.id == job_id:
                    self.queue.remove(waiting)
                    self._emit("withdraw", "debug", job=job_id, model=waiting.model,
                               waited_s=round(now - waiting.submitted, 6))
                    break
            return self._decide(now)
        engine = self.engines[job.model]
        if job.engine_generation == engine.generation and engine.status in (EngineStatus.READY,
                                                                            EngineStatus.STOPPING):
            engine.in_flight -= 1
            engine.last_used = now
        self._emit("complete", "debug", job=job_id, model=job.model, **{"class": job.klass}, status=status,
                   duration_s=round(now - job.submitted, 6), in_flight=engine.in_flight)
        if engine.draining and engine.in_flight == 0 and engine.status is EngineStatus.READY:
            self._stop(engine, now)
        return self._decide(now)

    def engine_ready(self, name: str, generation: int, endpoint: str, now: float) -> list[Effect]:
        engine = self.engines[name]
        if generation != engine.generation or engine.status is not EngineStatus.STARTING:
            return self._flush()
        engine.status = EngineStatus.READY
        engine.endpoint = endpoint
        engine.ready_at = now
        engine.last_used = now
        self._emit("ready", "info", engine=name, load_s=round(now - engine.start_decided_at, 6),
                   endpoint=endpoint)
        return self._decide(now)

    def engine_exited(self, name: str, generation: int, now: float, detail: str) -> list[Effect]:
        engine = self.engines[name]
        if generation != engine.generation or engine.status in (EngineStatus.STOPPED, EngineStatus.FAILED):
            return self._flush()
        released = self.ledger.release(name)
        expected = engine.status is EngineStatus.STOPPING
        was_starting = engine.status is EngineStatus.STARTING
        engine.endpoint = None
        engine.in_flight = 0
        engine.draining = False
        if expected:
            engine.status = EngineStatus.STOPPED
            self._emit("stopped", "info", engine=name, released=released, free=self.ledger.free)
            return self._decide(now)
        # Unexpected: a crash, or a start that never became ready.
        if engine.ready_at is not None and now - engine.ready_at >= self.backoff.maximum:
            engine.failures = 0  # it ran long enough that this is a new failure, not a loop
        engine.failures += 1
        delay = self.backoff.delay(engine.failures)
        engine.status = EngineStatus.FAILED
        engine.retry_at = now + delay
        self._emit("crash", "error", engine=name, during_start=was_starting, detail=detail,
                   released=released, failures=engine.failures, restart_in_s=delay)
        if was_starting:
            # Jobs waiting for this start get a clean error now rather than a hang.
            for job in [j for j in self.queue if j.model == name]:
                self.queue.remove(job)
                self._emit("reject", "warning", job=job.id, model=name, reason="engine_start_failed")
                self._effects.append(Fail(job.id, 503, "engine_start_failed",
                                          f"engine {name!r} failed to start: {detail}", retry_after=delay))
        return self._decide(now)

    def tick(self, now: float) -> list[Effect]:
        """Time passed: queue deadlines and restart backoffs may have come due."""
        return self._decide(now)

    def next_wakeup(self) -> float | None:
        times = [job.deadline for job in self.queue]
        wanted = {job.model for job in self.queue} | {e.name for e in self.engines.values() if e.profile.pinned}
        times += [self.engines[name].retry_at for name in wanted
                  if self.engines[name].status is EngineStatus.FAILED]
        return min(times, default=None)

    def snapshot(self) -> SchedulerSnapshot:
        queued: dict[str, int] = {}
        for job in self.queue:
            queued[job.model] = queued.get(job.model, 0) + 1
        return SchedulerSnapshot(
            budget=self.ledger.budget, reserved=self.ledger.reserved, queued=len(self.queue),
            engines=tuple(EngineSnapshot(
                name=e.name, status=e.status.value, in_flight=e.in_flight, slots=e.profile.slots,
                memory=e.profile.memory, reserved=self.ledger.reservations.get(e.name, 0),
                draining=e.draining, pinned=e.profile.pinned, queued=queued.get(e.name, 0),
                failures=e.failures) for e in self.engines.values()))

    # ---- decisions ----------------------------------------------------------------

    def _decide(self, now: float) -> list[Effect]:
        self._expire(now)
        # Memory that loads earlier in FIFO order are already counting on.
        promised = 0
        considered: set[str] = set()
        wanted: set[str] = set()  # engines that jobs ahead in the queue wait for
        for engine in self.engines.values():
            if engine.profile.pinned and self._may_start(engine, now):
                considered.add(engine.name)
                promised += self._load_or_make_room(engine, now, promised, wanted, reason="pinned")
        for job in list(self.queue):
            engine = self.engines[job.model]
            if engine.status is EngineStatus.READY and not engine.draining:
                if engine.in_flight < engine.profile.slots:
                    self._dispatch(job, engine, now)
                else:
                    wanted.add(engine.name)
                continue
            wanted.add(engine.name)
            if engine.name in considered or not self._may_start(engine, now):
                continue
            considered.add(engine.name)
            promised += self._load_or_make_room(engine, now, promised, wanted, reason=f"job {job.id}")
        return self._flush()

    def _may_start(self, engine: EngineState, now: float) -> bool:
        if engine.status is EngineStatus.STOPPED:
            return True
        return engine.status is EngineStatus.FAILED and now >= engine.retry_at

    def _expire(self, now: float) -> None:
        for job in list(self.queue):
            engine = self.engines[job.model]
            if job.deadline <= now:
                self.queue.remove(job)
                self._emit("timeout", "warning", job=job.id, model=job.model,
                           waited_s=round(now - job.submitted, 6))
                self._effects.append(Fail(job.id, 503, "queue_timeout",
                                          f"no capacity for model {job.model!r} within "
                                          f"{job.deadline - job.submitted:g}s", retry_after=1.0))
            elif engine.status is EngineStatus.FAILED and engine.retry_at > job.deadline:
                self.queue.remove(job)
                self._emit("reject", "warning", job=job.id, model=job.model, reason="engine_failed")
                self._effects.append(Fail(job.id, 503, "engine_failed",
                                          f"engine {job.model!r} failed and restarts in "
                                          f"{engine.retry_at - now:.1f}s", retry_after=engine.retry_at - now))

    def _dispatch(self, job: Job, engine: EngineState, now: float) -> None:
        assert engine.endpoint is not None
        self.queue.remove(job)
        job.engine_generation = engine.generation
        self.running[job.id] = job
        engine.in_flight += 1
        engine.last_used = now
        self._emit("dispatch", "debug", job=job.id, model=job.model, **{"class": job.klass},
                   waited_s=round(now - job.submitted, 6), in_flight=engine.in_flight,
                   slots=engine.profile.slots)
        self._effects.append(Grant(job.id, engine.name, engine.endpoint))

    def _load_or_make_room(self, engine: EngineState, now: float, promised: int, wanted: set[str],
                           *, reason: str) -> int:
        """Start *engine* if its memory is free; else evict for it. Returns memory still awaited."""
        need = engine.profile.memory
        free = self.ledger.free - promised
        if need <= free:
            self._load(engine, now, reason)
            return 0
        freeing = sum(self.ledger.reservations.get(e.name, 0) for e in self.engines.values()
                      if e.status is EngineStatus.STOPPING or (e.status is EngineStatus.READY and e.draining))
        if need <= free + freeing:
            return need  # enough is already on its way out: no second victim
        candidates = [e for e in self.engines.values()
                      if e.status is EngineStatus.READY and not e.draining and not e.profile.pinned
                      and e.name not in wanted and e is not engine]
        # Idle engines first, least recently used first; busy ones are only drained.
        candidates.sort(key=lambda e: (e.in_flight > 0, e.last_used))
        victims, gain = [], free + freeing
        for candidate in candidates:
            if gain >= need:
                break
            victims.append(candidate)
            gain += self.ledger.reservations.get(candidate.name, 0)
        if gain < need:
            return need  # nothing evictable frees enough now; wait for engines to finish loading or work
        for victim in victims:
            victim.draining = True
            self._emit("evict", "info", engine=victim.name, memory=self.ledger.reservations.get(victim.name, 0),
                       for_engine=engine.name, need=need, in_flight=victim.in_flight,
                       idle_s=round(now - victim.last_used, 6))
            if victim.in_flight == 0:
                self._stop(victim, now)
        return need

    def _load(self, engine: EngineState, now: float, reason: str) -> None:
        restart = engine.status is EngineStatus.FAILED
        self.ledger.reserve(engine.name, engine.profile.memory)
        engine.generation += 1
        engine.status = EngineStatus.STARTING
        engine.start_decided_at = now
        engine.ready_at = None
        self._emit("restart" if restart else "load", "info", engine=engine.name, memory=engine.profile.memory,
                   reserved=self.ledger.reserved, free=self.ledger.free, reason=reason,
                   generation=engine.generation)
        self._effects.append(StartEngine(engine.name, engine.generation))

    def _stop(self, engine: EngineState, now: float) -> None:
        engine.status = EngineStatus.STOPPING
        self._emit("stop", "info", engine=engine.name, generation=engine.generation)
        self._effects.append(StopEngine(engine.name, engine.generation))

    def _emit(self, event: str, level: str, **fields: object) -> None:
        self._effects.append(Emit(event, level, fields))

    def _flush(self) -> list[Effect]:
        effects, self._effects = self._effects, []
        return effects
