"""What other systems would decide, with the same inputs and effects as the real core.

Each baseline is a small class with Scheduler's method interface (start, submit,
finish, engine_ready, engine_exited, observe, tick, next_wakeup), so the runner drives
any of them exactly as it drives steward. What they share (engines, one line in
arrival order, client patience, effects) lives in BaselinePolicy; each subclass only
decides what to load, evict and grant (research: llama_swap_router.md, ollama_litellm.md).

None of these systems cuts a request into steps: an embeddings request is one call that
holds its slot until done. A later step handed over with ``handoff`` therefore keeps
its predecessor's slot at once, which is how the runtime would run the whole request.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Iterator

import attrs

from supervisor.scheduler.core import Scheduler
from supervisor.scheduler.types import (
    Effect,
    EngineProfile,
    EngineStatus,
    Fail,
    Grant,
    StartEngine,
    StopEngine,
)

Handoff = tuple[int, int | None]


@attrs.define
class Engine:
    profile: EngineProfile
    status: EngineStatus = EngineStatus.STOPPED
    generation: int = 0
    endpoint: str | None = None
    in_flight: int = 0
    last_used: float = -math.inf
    draining: bool = False  # chosen for eviction: no new work, stopped once idle

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def resident(self) -> bool:
        return self.status in (EngineStatus.STARTING, EngineStatus.READY, EngineStatus.STOPPING)

    @property
    def free_slot(self) -> bool:
        return self.status is EngineStatus.READY and not self.draining and self.in_flight < self.profile.slots


@attrs.define
class Waiting:
    id: int
    model: str
    seq: int
    deadline: float


@attrs.define
class BaselinePolicy:
    """One line in arrival order (no classes), client patience, and the engine bookkeeping."""

    budget: int
    engines: dict[str, Engine]
    queue_timeout: dict[str, float]
    line: list[Waiting] = attrs.Factory(list)  # by (seq, id): arrival order, steps keep their request's place
    running: dict[int, str] = attrs.Factory(dict)  # job -> engine
    now: float = 0.0
    _effects: list[Effect] = attrs.Factory(list)

    @classmethod
    def create(cls, budget: int, profiles: Iterable[EngineProfile], queue_timeout: dict[str, float],
               **knobs: object) -> BaselinePolicy:
        return cls(budget, {p.name: Engine(p) for p in profiles}, queue_timeout, **knobs)

    # ---- inputs, as Scheduler's -------------------------------------------------------

    def start(self, now: float) -> list[Effect]:
        return self._decide_at(now)

    def submit(self, job_id: int, model: str | None, klass: str, now: float, *, seq: int | None = None,
               request: int | None = None, step: int = 1, steps: int = 1, exclusive_memory: int | None = None,
               timeout: float | None = None, handoff: Handoff | None = None) -> list[Effect]:
        assert model is not None, "baselines know no exclusive jobs"
        self.now = now
        if handoff is not None and handoff[0] in self.running:
            # The same request goes on in the slot it holds (see the module docstring).
            engine = self.engines[self.running.pop(handoff[0])]
            self.running[job_id] = engine.name
            self._effects.append(Grant(job_id, engine.name, engine.endpoint))
            return self._decide_at(now)
        job = Waiting(job_id, model, job_id if seq is None else seq,
                      now + (self.queue_timeout[klass] if timeout is None else timeout))
        bisect.insort(self.line, job, key=_order)
        self._arrived(self.engines[model], now)
        return self._decide_at(now)

    def finish(self, job_id: int, now: float, status: int | None = None) -> list[Effect]:
        name = self.running.pop(job_id, None)
        if name is not None:
            engine = self.engines[name]
            engine.in_flight -= 1
            engine.last_used = now
        else:
            self._withdraw(job_id)
        return self._decide_at(now)

    def engine_ready(self, name: str, generation: int, endpoint: str, now: float,
                     pid: int | None = None) -> list[Effect]:
        engine = self.engines[name]
        if generation == engine.generation and engine.status is EngineStatus.STARTING:
            engine.status = EngineStatus.READY
            engine.endpoint = endpoint
            engine.last_used = now
        return self._decide_at(now)

    def engine_exited(self, name: str, generation: int, now: float, detail: str) -> list[Effect]:
        engine = self.engines[name]
        if generation != engine.generation or engine.status is EngineStatus.STOPPED:
            return self._decide_at(now)
        failed_start = engine.status is EngineStatus.STARTING
        engine.status = EngineStatus.STOPPED
        engine.endpoint = None
        engine.in_flight = 0
        engine.draining = False
        if failed_start:  # the requests that were waiting for it get the runtime's error
            for job in [j for j in self.line if j.model == name]:
                self._fail(job, 500, "load_failed", f"model {name!r} failed to load: {detail}")
        return self._decide_at(now)

    def observe(self, now: float, used: int, processes: dict[int, int]) -> list[Effect]:
        return self._decide_at(now)

    def tick(self, now: float) -> list[Effect]:
        return self._decide_at(now)

    def next_wakeup(self) -> float | None:
        times = [job.deadline for job in self.line]
        times.extend(self._timers())
        return min((t for t in times if t > self.now), default=None)

    # ---- what each baseline decides ---------------------------------------------------

    def _decide(self, now: float) -> None:
        raise NotImplementedError

    def _arrived(self, engine: Engine, now: float) -> None:
        """A request for *engine* came in (the llama.cpp router counts this as use)."""

    def _timers(self) -> Iterator[float]:
        """Times at which a decision may change with no input (keep-alive expiries)."""
        return iter(())

    # ---- shared helpers ---------------------------------------------------------------

    def _decide_at(self, now: float) -> list[Effect]:
        self.now = now
        self._expire(now)
        self._decide(now)
        effects, self._effects = self._effects, []
        return effects

    def _grant_free_slots(self) -> None:
        """Oldest first, every waiting job whose engine has a free slot (the runtime's own queue)."""
        for job in [j for j in self.line if self.engines[j.model].free_slot]:
            engine = self.engines[job.model]
            if engine.free_slot:
                self._unqueue(job)
                engine.in_flight += 1
                engine.last_used = self.now
                self.running[job.id] = engine.name
                self._effects.append(Grant(job.id, engine.name, engine.endpoint))

    def _waiting_models(self) -> list[str]:
        """The models asked for, oldest request first, each once."""
        return list(dict.fromkeys(job.model for job in self.line))

    def _has_waiting(self, engine: Engine) -> bool:
        return any(job.model == engine.name for job in self.line)

    def _load(self, engine: Engine) -> None:
        engine.generation += 1
        engine.status = EngineStatus.STARTING
        engine.last_used = self.now
        self._effects.append(StartEngine(engine.name, engine.generation))

    def _stop(self, engine: Engine) -> None:
        engine.status = EngineStatus.STOPPING
        engine.draining = False
        self._effects.append(StopEngine(engine.name, engine.generation))

    def _evict(self, engine: Engine, *, kill: bool = False) -> None:
        """Stop it now if idle; busy: drain it, or with *kill* cut its requests off."""
        if engine.in_flight and kill:
            for job_id in [j for j, name in self.running.items() if name == engine.name]:
                del self.running[job_id]
                self._effects.append(Fail(job_id, 502, "engine_stopped", f"model {engine.name!r} was unloaded"))
            for job in [j for j in self.line if j.model == engine.name]:
                self._fail(job, 502, "engine_stopped", f"model {engine.name!r} was unloaded")
            engine.in_flight = 0
        if engine.in_flight:
            engine.draining = True
        else:
            self._stop(engine)

    def _stop_drained(self) -> None:
        for engine in self.engines.values():
            if engine.draining and engine.in_flight == 0 and engine.status is EngineStatus.READY:
                self._stop(engine)

    def _expire(self, now: float) -> None:
        for job in [j for j in self.line if j.deadline <= now]:
            self._fail(job, 503, "queue_timeout", f"no answer from model {job.model!r} in time")

    def _fail(self, job: Waiting, status: int, code: str, message: str) -> None:
        self._unqueue(job)
        self._effects.append(Fail(job.id, status, code, message))

    def _withdraw(self, job_id: int) -> None:
        for job in self.line:
            if job.id == job_id:
                self._unqueue(job)
                return

    def _unqueue(self, job: Waiting) -> None:
        self.line.remove(job)


def _order(job: Waiting) -> tuple[int, int]:
    return (job.seq, job.id)


def _least_recently_used(engines: Iterable[Engine]) -> Engine | None:
    return min(engines, key=lambda e: e.last_used, default=None)


@attrs.define
class CollatePolicy(BaselinePolicy):
    """llama-swap's scheduler since #790/#823 (research/peers_2026.md §1): one FIFO line,
    collated. A request for a loaded model goes as soon as it has a free slot, ahead of
    older ones that wait for a load (A B C A B C is served A A B B C C), with no bound on
    how long a request is overtaken and no classes (its priority is per model, and no
    scenario sets one). Loads follow the line: the model of the oldest request waiting
    for one loads first, and later ones wait behind it. Models stay together while they
    fit in memory, as a user would declare the groups for the card; to make room the least
    recently used idle model is unloaded, never one with requests in flight, never a
    pinned (persistent) one. One swap at a time: while a model loads or unloads, no other
    starts or stops, as one run loop carrying each swap through (assumed: the research
    names the single run loop, not this detail)."""

    def _decide(self, now: float) -> None:
        self._grant_free_slots()
        if any(e.status in (EngineStatus.STARTING, EngineStatus.STOPPING) for e in self.engines.values()):
            return
        for model in self._waiting_models():
            engine = self.engines[model]
            if engine.status is not EngineStatus.STOPPED:
                continue
            if self._room_for(engine):
                self._load(engine)
            break  # first come, first loaded; one at a time

    def _room_for(self, engine: Engine) -> bool:
        """Can *engine* load now? If not, unload idle models toward it and wait for them."""
        resident = [e for e in self.engines.values() if e.resident]
        if self._fits(engine, resident):
            return True
        staying = [e for e in resident if e.status is not EngineStatus.STOPPING]
        for victim in sorted((e for e in staying if self._evictable(e)), key=lambda e: e.last_used):
            if self._fits(engine, staying):
                break  # the unloads under way make room: one need, no second victim
            self._stop(victim)
            staying.remove(victim)
        return False

    def _fits(self, engine: Engine, beside: list[Engine]) -> bool:
        return sum(e.profile.memory for e in beside) + engine.profile.memory <= self.budget

    def _evictable(self, engine: Engine) -> bool:
        return engine.status is EngineStatus.READY and engine.in_flight == 0 and not engine.profile.pinned


@attrs.define
class SwapPolicy(CollatePolicy):
    """llama-swap's default group: one model at a time, whatever would fit. Requests for
    the loaded model take the fast path; one for another model waits until the loaded one
    has nothing in flight or queued, then it is swapped out. Pinning is unknown to it."""

    def _fits(self, engine: Engine, beside: list[Engine]) -> bool:
        return not beside

    def _evictable(self, engine: Engine) -> bool:
        return engine.status is EngineStatus.READY and engine.in_flight == 0


@attrs.define
class LruCountPolicy(BaselinePolicy):
    """llama-server router mode, ``--models-max N``: at most N models, the least
    recently used one unloaded when another is needed. No memory accounting: a load
    that does not fit fails as the out-of-memory load would. Loads in progress count
    toward N and are never evicted (llama.cpp#25528). In the version read, unloading a
    model cuts off its requests in flight (llama.cpp#21678); kill_in_flight=False drains
    instead (PR #23640's proposal)."""

    models_max: int = 4
    kill_in_flight: bool = True

    def _arrived(self, engine: Engine, now: float) -> None:
        if engine.resident:
            engine.last_used = now  # the router stamps a model when it proxies a request to it

    def _decide(self, now: float) -> None:
        self._grant_free_slots()
        self._stop_drained()
        for model in self._waiting_models():
            engine = self.engines[model]
            if engine.status is not EngineStatus.STOPPED:
                continue
            staying = [e for e in self.engines.values() if e.status in (EngineStatus.STARTING, EngineStatus.READY)
                       and not e.draining]
            if len(staying) < self.models_max:
                if sum(e.resident for e in self.engines.values()) < self.models_max:
                    self._load(engine)
                    continue
                break  # a place is being freed: wait for that unload to finish
            victim = _least_recently_used(e for e in staying if e.status is EngineStatus.READY
                                          and (self.kill_in_flight or e.in_flight == 0))
            if victim is None:
                break
            self._evict(victim, kill=self.kill_in_flight)
            break  # one eviction at a time; the load follows once it is gone


@attrs.define
class KeepAlivePolicy(BaselinePolicy):
    """Ollama: a model stays loaded for keep_alive after its last request, then unloads
    on its timer. Requests for a loaded model run at once up to its parallel slots;
    loads go one at a time through one pending line (head-of-line blocking). A load
    that does not fit in memory, or past max_loaded models, evicts the least recently
    used idle model first (a busy one is drained); no classes, no pinning."""

    keep_alive: float = 300.0
    max_loaded: int = 3

    def _timers(self) -> Iterator[float]:
        for engine in self.engines.values():
            if self._idle(engine):
                yield engine.last_used + self.keep_alive

    def _idle(self, engine: Engine) -> bool:
        return engine.status is EngineStatus.READY and engine.in_flight == 0 and not engine.draining

    def _decide(self, now: float) -> None:
        for engine in self.engines.values():
            if self._idle(engine) and now >= engine.last_used + self.keep_alive and not self._has_waiting(engine):
                self._stop(engine)
        self._grant_free_slots()
        self._stop_drained()
        if any(e.status in (EngineStatus.STARTING, EngineStatus.STOPPING) or e.draining
               for e in self.engines.values()):
            return  # one load, or one eviction, at a time
        head = next((j for j in self.line if self.engines[j.model].status is EngineStatus.STOPPED), None)
        if head is None:
            return
        engine = self.engines[head.model]
        loaded = [e for e in self.engines.values() if e.resident]
        used = sum(e.profile.memory for e in loaded)
        if len(loaded) < self.max_loaded and used + engine.profile.memory <= self.budget:
            self._load(engine)
            return
        victim = (_least_recently_used(e for e in loaded if self._idle(e))
                  or _least_recently_used(e for e in loaded if e.status is EngineStatus.READY))
        if victim is not None:
            self._evict(victim)


@attrs.define
class FifoPolicy:
    """steward's own core with every request in the interactive class: one FIFO line per
    engine in strict arrival order (``swap_hold: 0s``), memory-aware eviction, pinning,
    no interactive window and no starvation guard. Each request keeps its own class's
    queue timeout."""

    core: Scheduler
    queue_timeout: dict[str, float]

    def start(self, now: float) -> list[Effect]:
        return self.core.start(now)

    def submit(self, job_id: int, model: str | None, klass: str, now: float, **step: object) -> list[Effect]:
        step.setdefault("timeout", self.queue_timeout[klass])
        return self.core.submit(job_id, model, "interactive", now, **step)  # type: ignore[arg-type]

    def finish(self, job_id: int, now: float, status: int | None = None) -> list[Effect]:
        return self.core.finish(job_id, now, status)

    def engine_ready(self, name: str, generation: int, endpoint: str, now: float,
                     pid: int | None = None) -> list[Effect]:
        return self.core.engine_ready(name, generation, endpoint, now, pid)

    def engine_exited(self, name: str, generation: int, now: float, detail: str) -> list[Effect]:
        return self.core.engine_exited(name, generation, now, detail)

    def observe(self, now: float, used: int, processes: dict[int, int]) -> list[Effect]:
        return self.core.observe(now, used, processes)

    def tick(self, now: float) -> list[Effect]:
        return self.core.tick(now)

    def next_wakeup(self) -> float | None:
        return self.core.next_wakeup()
