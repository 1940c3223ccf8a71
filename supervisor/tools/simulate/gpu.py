"""The simulated GPU: which engines hold memory, and how fast each running step advances.

Standard processor-sharing bookkeeping: every change (a step starts or ends, a load
begins or completes) first advances all running steps by rate x elapsed time, then
recomputes the rates. The runner asks for the next completion and schedules one event
for it; no per-token events.
"""

from __future__ import annotations

import enum

import attrs

from supervisor.tools.simulate.sharing import SharingModel

DONE = 1e-9  # seconds of work left that count as none (float error of rate x time)


class CardState(enum.Enum):
    STOPPED = "stopped"
    LOADING = "loading"
    READY = "ready"
    STOPPING = "stopping"


@attrs.define
class Step:
    job_id: int
    engine: str
    remaining: float  # seconds of work alone still to do
    rate: float = 0.0
    prefill: float = 0.0  # of which reading its prompt, still to do (it comes first)

    @property
    def reads_prompt(self) -> bool:
        return self.prefill > DONE


@attrs.define
class CardEngine:
    name: str
    memory: int
    state: CardState = CardState.STOPPED
    generation: int = 0
    # False for a load that does not fit beside what is on the card: it holds no memory
    # and fails when it would have been ready (an out-of-memory load).
    fits: bool = True
    steps: dict[int, Step] = attrs.Factory(dict)

    @property
    def holds_memory(self) -> bool:
        return self.state is not CardState.STOPPED and self.fits


@attrs.define
class SimulatedGpu:
    memory: int
    sharing: SharingModel
    engines: dict[str, CardEngine]
    steps: dict[int, Step] = attrs.Factory(dict)
    updated: float = 0.0
    peak_memory: int = 0

    @classmethod
    def create(cls, memory: int, sharing: SharingModel, engine_memory: dict[str, int]) -> SimulatedGpu:
        return cls(memory, sharing, {name: CardEngine(name, size) for name, size in engine_memory.items()})

    @property
    def used(self) -> int:
        return sum(e.memory for e in self.engines.values() if e.holds_memory)

    # ---- engines --------------------------------------------------------------------

    def begin_load(self, name: str, generation: int, now: float) -> bool:
        """A load starts; False if it cannot fit (it will fail when it would be ready)."""
        engine = self.engines[name]
        assert engine.state is CardState.STOPPED, f"{name} loaded while {engine.state.value}"
        self._advance(now)
        engine.fits = self.used + engine.memory <= self.memory
        engine.state = CardState.LOADING
        engine.generation = generation
        self.peak_memory = max(self.peak_memory, self.used)
        self._rerate()
        return engine.fits

    def finish_load(self, name: str, now: float) -> bool:
        """The load time has passed: ready, or (out of memory) stopped again."""
        engine = self.engines[name]
        self._advance(now)
        engine.state = CardState.READY if engine.fits else CardState.STOPPED
        self._rerate()
        return engine.state is CardState.READY

    def begin_stop(self, name: str) -> None:
        engine = self.engines[name]
        assert engine.state is CardState.READY and not engine.steps, f"{name} stopped with work on it"
        engine.state = CardState.STOPPING

    def finish_stop(self, name: str) -> None:
        engine = self.engines[name]
        engine.state = CardState.STOPPED
        engine.fits = True

    # ---- steps ----------------------------------------------------------------------

    def start_step(self, job_id: int, name: str, work: float, now: float, *, prefill: float = 0.0) -> None:
        """A step of *work* seconds alone starts, the first *prefill* of them reading its prompt."""
        engine = self.engines[name]
        assert engine.state is CardState.READY, f"step granted on {name} while {engine.state.value}"
        self._advance(now)
        step = Step(job_id, name, work, prefill=min(prefill, work))
        engine.steps[job_id] = step
        self.steps[job_id] = step
        self._rerate()

    def cancel_step(self, job_id: int, now: float) -> bool:
        if job_id not in self.steps:
            return False
        self._advance(now)
        self._remove(job_id)
        self._rerate()
        return True

    def complete_due(self, now: float) -> list[int]:
        """The steps done by *now*, removed, in job order (steps that ended reading their
        prompt by then share on at their decoding rates)."""
        self._advance(now)
        done = sorted(job for job, step in self.steps.items() if step.remaining <= DONE)
        for job in done:
            self._remove(job)
        self._rerate()  # called at a predicted end: a step's, or a prompt's
        return done

    def next_completion(self) -> float | None:
        """The next moment a step ends, or ends reading its prompt (its rate may change then)."""
        times = [self.updated + max(s.prefill if s.reads_prompt else s.remaining, 0.0) / s.rate
                 for s in self.steps.values() if s.rate > 0]
        return min(times, default=None)

    def _remove(self, job_id: int) -> None:
        step = self.steps.pop(job_id)
        del self.engines[step.engine].steps[job_id]

    def _advance(self, now: float) -> None:
        elapsed = now - self.updated
        if elapsed > 0:
            for step in self.steps.values():
                step.remaining -= step.rate * elapsed
                step.prefill = max(step.prefill - step.rate * elapsed, 0.0)
        self.updated = max(self.updated, now)

    def _rerate(self) -> None:
        computing = sum(1 for e in self.engines.values() if e.steps)
        loading = sum(1 for e in self.engines.values() if e.state is CardState.LOADING)
        for engine in self.engines.values():
            prefills = any(step.reads_prompt for step in engine.steps.values())
            for step in engine.steps.values():
                step.rate = self.sharing.step_rate(len(engine.steps), computing, loading, prefill=step.reads_prompt,
                                                   engine_prefills=prefills)

