"""The discrete-event replay: a virtual clock, an event heap, and a policy making the decisions.

Events are per step, not per token: a client's arrival, the next step completion the
simulated GPU predicts, an engine ready or exited, and the policy's own wakeups. The
policy's effects (Grant, Fail, StartEngine, StopEngine) are carried out the way the
async shell would, with the times the scenario gives. Besides each request's outcome
the replay keeps when its first step started (its wait, also for requests that never
finished), when the load of its model was decided if it arrived with its model off the
card (the moment it stopped being held back: see metrics.py's overtake), and how long at
least one step computed (the GPU's busy time).

A load is decided by the first effect that commits memory to it: its StartEngine, or an
eviction made to make room for it. The core says which load an eviction is for (its
``evict`` event's ``for_engine``, when the victim starts draining); the baselines do not,
so a StopEngine that no such event announced counts for the model of the oldest held
request that would not fit beside what stays (after the victim's drain, as those
policies show it; one stop, one model: the next load in arrival order).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

import attrs

from supervisor.scheduler.types import Effect, Emit, Fail, Grant, StartEngine, StopEngine
from supervisor.tools.simulate.gpu import CardState, SimulatedGpu
from supervisor.tools.simulate.policies import Policy
from supervisor.tools.simulate.scenario import Scenario
from supervisor.tools.simulate.workload import Client, Request, make_clients

OK = 200


@attrs.frozen
class Record:
    """One request's outcome; latency None: it failed."""

    klass: str
    arrival: float
    latency: float | None


@attrs.frozen
class Wait:
    """How long one request waited for its first step to start computing. One that never
    started (``started`` None) waited until it failed or the run ended: a lower bound."""

    request: int  # in arrival order
    klass: str
    arrival: float
    started: float | None
    until: float  # started, or when it failed, or the end of the run
    # Its model was neither ready nor loading when it arrived: when the load of its model
    # was decided after that (its StartEngine, or an eviction for it: see the module
    # docstring), if that came before it started; else None.
    load_decided: float | None = None


@attrs.frozen
class Outcome:
    records: tuple[Record, ...]
    waits: tuple[Wait, ...]  # every request counted, finished or not, in arrival order
    loads: int
    unnecessary_loads: int
    peak_memory: int
    busy_share: float  # the fraction of the run during which at least one step computed
    fallbacks: int = 0  # requests steward sent along their model's fallback chain (rule 11)


@attrs.define
class Replay:
    scenario: Scenario
    policy: Policy
    gpu: SimulatedGpu
    clients: list[Client]
    # Called after every event with the replay itself: for tests and traces.
    watch: Callable[[Replay], None] | None = None
    now: float = 0.0
    records: list[Record] = attrs.Factory(list)
    waits: list[Wait] = attrs.Factory(list)
    busy: float = 0.0  # seconds during which at least one step computed
    loads: int = 0
    unnecessary_loads: int = 0
    fallbacks: int = 0
    _events: list[tuple[float, int, Callable[..., None], tuple[object, ...]]] = attrs.Factory(list)
    _order: itertools.count[int] = attrs.Factory(itertools.count)
    _job_ids: itertools.count[int] = attrs.Factory(lambda: itertools.count(1))
    _request_ids: itertools.count[int] = attrs.Factory(lambda: itertools.count(1))
    _by_job: dict[int, Request] = attrs.Factory(dict)  # the current step's job -> its request
    _waiting: dict[int, str] = attrs.Factory(dict)  # submitted, not yet granted: job -> model
    _next_check: float | None = None  # the completion the GPU predicts, as scheduled
    _ticks: set[float] = attrs.Factory(set)
    # Per engine: was its last eviction one that no pending load needed?
    _needless_eviction: dict[str, bool] = attrs.Factory(dict)
    # Requests that arrived with their model off the card and whose load is not decided yet:
    # request id -> model; then request id -> when the load was decided.
    _held: dict[int, str] = attrs.Factory(dict)
    _load_decided: dict[int, float] = attrs.Factory(dict)
    _announced_stops: set[str] = attrs.Factory(set)  # victims whose evict event said for whom

    @classmethod
    def create(cls, scenario: Scenario, policy: Policy, watch: Callable[[Replay], None] | None = None) -> Replay:
        gpu = SimulatedGpu.create(scenario.gpu.memory, scenario.gpu.sharing,
                                  {name: e.memory for name, e in scenario.engines.items()})
        return cls(scenario, policy, gpu, make_clients(scenario), watch)

    def run(self) -> Outcome:
        for client in self.clients:
            self._at(client.first_arrival(), self._arrive, client)
        self._apply(self.policy.start(0.0))
        self._plan()
        end = self.scenario.duration
        while self._events and self._events[0][0] <= end:
            when, _, handler, args = heapq.heappop(self._events)
            self._pass_time(when)
            handler(*args)
            self._plan()
            if self.watch is not None:
                self.watch(self)
        self._pass_time(end)
        for request in sorted(self._by_job.values(), key=lambda r: r.id):
            self._waited(request, end)  # still waiting or running when the run ends
        return Outcome(tuple(self.records), tuple(sorted(self.waits, key=lambda w: w.request)), self.loads,
                       self.unnecessary_loads, self.gpu.peak_memory, self.busy / end, self.fallbacks)

    # ---- events -----------------------------------------------------------------------

    def _arrive(self, client: Client) -> None:
        drawn = client.draw()
        request = Request(next(self._request_ids), client, self.now, client.steps_on(drawn, client.engine), drawn=drawn)
        model = client.spec.model
        if self.gpu.engines[model].state in (CardState.STOPPED, CardState.STOPPING):
            self._held[request.id] = model
        self._submit(request, handoff=None)

    def _check_completions(self, when: float) -> None:
        if when != self._next_check:
            return  # superseded by a later prediction
        self._next_check = None
        for job in self.gpu.complete_due(self.now):
            self._step_done(job)

    def _tick(self, when: float) -> None:
        self._ticks.discard(when)
        self._apply(self.policy.tick(self.now))

    def _loaded(self, name: str, generation: int) -> None:
        if self.gpu.finish_load(name, self.now):
            self._apply(self.policy.engine_ready(name, generation, f"sim://{name}", self.now))
        else:
            self._apply(self.policy.engine_exited(name, generation, self.now, "out of memory while loading"))

    def _exited(self, name: str, generation: int) -> None:
        self.gpu.finish_stop(name)
        self._apply(self.policy.engine_exited(name, generation, self.now, "stopped"))

    # ---- requests -----------------------------------------------------------------------

    def _submit(self, request: Request, handoff: tuple[int, int] | None) -> None:
        job = next(self._job_ids)
        request.job = job
        self._by_job[job] = request
        self._waiting[job] = request.client.spec.model
        spec = request.client.spec
        self._apply(self.policy.submit(job, spec.model, spec.klass, self.now, seq=request.id, request=request.id,
                                       step=request.step + 1, steps=len(request.steps), handoff=handoff))

    def _step_done(self, job: int) -> None:
        request = self._by_job.pop(job)
        if not request.last_step:
            request.step += 1
            self._submit(request, handoff=(job, OK))
            return
        self._apply(self.policy.finish(job, self.now, OK))
        self._record(request, self.now - request.arrival)

    def _record(self, request: Request, latency: float | None) -> None:
        if request.arrival >= self.scenario.warmup:
            self.records.append(Record(request.client.spec.klass, request.arrival, latency))
        self._waited(request, self.now)
        client = request.client
        self._at(self.now + client.think(), self._arrive, client)

    def _waited(self, request: Request, until: float) -> None:
        self._held.pop(request.id, None)
        decided = self._load_decided.pop(request.id, None)
        if request.arrival >= self.scenario.warmup:
            self.waits.append(Wait(request.id, request.client.spec.klass, request.arrival, request.started,
                                   until if request.started is None else request.started, decided))

    # ---- effects ------------------------------------------------------------------------

    def _apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Grant):
                del self._waiting[effect.job_id]
                request = self._by_job[effect.job_id]
                assert effect.engine is not None, "the scenario has no exclusive jobs"
                if request.started is None:
                    request.started = self.now
                    self._held.pop(request.id, None)  # it started before any load of its model was decided
                if request.step == 0:  # its prompt's reading: what this engine holds of it, at its speed
                    client, spec = request.client, self.scenario.engines[effect.engine]
                    generation = self.gpu.engines[effect.engine].generation
                    request.steps = client.steps_on(request.drawn, spec, client.cached_on(effect.engine, generation,
                                                                                          spec))
                    client.served_by = (effect.engine, generation)
                work = request.steps[request.step]
                self.gpu.start_step(effect.job_id, effect.engine, work.seconds, self.now, prefill=work.prefill)
            elif isinstance(effect, Fail):
                self._waiting.pop(effect.job_id, None)
                self.gpu.cancel_step(effect.job_id, self.now)
                self._record(self._by_job.pop(effect.job_id), None)  # the client thinks, then asks again
            elif isinstance(effect, StartEngine):
                self._start_engine(effect)
            elif isinstance(effect, StopEngine):
                self._stop_engine(effect)
            elif isinstance(effect, Emit) and effect.event == "evict":
                self._announced_stops.add(str(effect.fields["engine"]))
                self._decided(str(effect.fields["for_engine"]))
            elif isinstance(effect, Emit) and effect.event == "fallback":
                self.fallbacks += 1
                self._held.pop(int(effect.fields["request"]), None)  # its model's load is no longer awaited

    def _start_engine(self, effect: StartEngine) -> None:
        self.loads += 1
        self._decided(effect.engine)
        if self._needless_eviction.pop(effect.engine, False):
            self.unnecessary_loads += 1
        self.gpu.begin_load(effect.engine, effect.generation, self.now)
        self._at(self.now + self.scenario.engines[effect.engine].load_seconds, self._loaded, effect.engine,
                 effect.generation)

    def _stop_engine(self, effect: StopEngine) -> None:
        self._needless_eviction[effect.engine] = not self._memory_needed(effect.engine)
        if effect.engine in self._announced_stops:
            self._announced_stops.discard(effect.engine)
        elif (model := next((m for m in self._held.values() if not self._fits_beside_staying(m)), None)) is not None:
            self._decided(model)  # room for the next load in arrival order, as far as a policy that does not say shows
        self.gpu.begin_stop(effect.engine)
        self._at(self.now + self.scenario.engines[effect.engine].stop_seconds, self._exited, effect.engine,
                 effect.generation)

    def _decided(self, model: str) -> None:
        """The load of *model* is decided now: the requests held back for it are no longer."""
        for request in [r for r, m in self._held.items() if m == model]:
            del self._held[request]
            self._load_decided[request] = self.now

    def _memory_needed(self, victim: str) -> bool:
        """Does a pending load need *victim*'s memory? Some model with requests waiting is
        not on the card and would not fit beside what stays, *victim* included (memory
        of engines already stopping counts as freed: one need, one victim)."""
        pending = {model for model in self._waiting.values()
                   if self.gpu.engines[model].state is CardState.STOPPED}
        return any(not self._fits_beside_staying(model) for model in pending)

    def _fits_beside_staying(self, model: str) -> bool:
        staying = sum(e.memory for e in self.gpu.engines.values()
                      if e.holds_memory and e.state is not CardState.STOPPING)
        return self.gpu.engines[model].memory <= self.gpu.memory - staying

    # ---- the clock ----------------------------------------------------------------------

    def _pass_time(self, when: float) -> None:
        """Steps change only at events, so the GPU computed all along since the last one, or not at all."""
        if self.gpu.steps:
            self.busy += when - self.now
        self.now = when

    def _at(self, when: float, handler: Callable[..., None], *args: object) -> None:
        heapq.heappush(self._events, (when, next(self._order), handler, args))

    def _plan(self) -> None:
        """After every event: the next step completion and the policy's next wakeup."""
        completion = self.gpu.next_completion()
        if completion is not None and completion != self._next_check:
            self._next_check = completion
            self._at(completion, self._check_completions, completion)
        wakeup = self.policy.next_wakeup()
        if wakeup is not None and wakeup > self.now and wakeup not in self._ticks:
            self._ticks.add(wakeup)
            self._at(wakeup, self._tick, wakeup)


def replay(scenario: Scenario, policy: Policy) -> Outcome:
    return Replay.create(scenario, policy).run()
