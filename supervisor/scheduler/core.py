"""The decision core of the ledger/scheduler actor: pure, synchronous, no I/O.

Every input (a job submitted or finished, an engine ready or gone, a memory reading,
time passing) is one method call that updates the state and returns the effects to
carry out (grant or fail a job, start or stop an engine, log an event). Nothing here
awaits, so every decision is atomic, and the whole core runs in virtual time: the
actor in production, the tests on MockClock and ``steward simulate`` all drive it.

The rules (DESIGN.md, "Hard rules of the scheduler"):
1. Strict class order, interactive > background > batch; FIFO within a class by the
   request's arrival; no aging.
2. Work is cut into steps (an embeddings request into chunks); preemption happens only
   between steps. A later step keeps its request's place in line.
3. While an interactive step runs, and for ``interactive_window`` after the last one
   ends, no background or batch step starts, except by rule 3b or 4.
   3b. Gap steps (``gap_step``, 0: off): in a gap of that window (no interactive step
   computes or waits), one lower-class step whose engine's last steps took at most
   ``gap_step`` on average (measured; never measured: not short) starts at once, when no
   other lower-class step computes: background's first, oldest first; the next when it
   ends, if the gap lasts. A chat arriving meanwhile is slowed for about that long at
   most. A gap step is outside the guard's lane and share, and no progress for the
   starvation clock: the guard still serves the class's longer lines, and its turns pass
   over the short lines (the gaps serve them) until one has waited its starvation time plus
   ``guard_gap_wait``. It is not outside rule 3c: none starts while a guard turn is due
   and claims the lower classes' engine (rule 4b), and a due turn waits for a gap step on
   another engine to end (it is short).
   3c. Between chats, one engine at a time (``lower_class_engines``, 0: no limit): while an
   engine is hot, background and batch steps compute on at most that many engines at once
   (each with all its slots), the oldest request's first. A chat arriving after the window
   closed then shares the card with one engine, not with all of them; on a card that the
   engines saturate (bandwidth-bound decode) the lower classes lose no throughput by it.
   The guard's turns obey it too (rule 4b): a chat shares the card with that many
   lower-class engines at most, whatever let them start.
4. Starvation guard: when the head of a lower class has made no progress for its
   ``starvation`` time, one of its steps may run beside the higher classes' work: the
   oldest of its waiting jobs that can actually run now, not simply the oldest. Beside
   interactive work it is one turn at a time for both lower classes (the lane), the class
   due first first (starved since, plus its starvation time; background on a tie), used at
   most ``guard_share`` of the time, waiting up to ``guard_gap_wait`` for a moment no
   interactive step computes. With ``guard_fill`` a turn that starts in such a moment
   also starts its class's next steps for the same engine, up to its free slots: an
   engine more costs a chat the same whether one of its slots decodes or all (they
   batch); the turn lasts until its last step ends, and the share counts all of it.
   A turn beside interactive work that would evict another engine (a swap) waits for the
   window to close, for up to ``guard_gap_wait`` after it was due: a load slows the
   chats for all its length, longer than a step; one into free memory goes at once.
   4b. While an engine is hot a turn obeys rule 3c: it may use the free slots of an engine
   the lower classes compute on already, or start one when fewer than
   ``lower_class_engines`` do. Else, when the lower classes' own steps hold what it needs
   (the engines they compute on, or all its engine's slots), it claims them: no other
   background or batch step starts until the turn has (a `starvation_claim` event), so it
   waits for the steps running there to end, not for their class to run out of work; and
   a due turn is served before the lower classes' other steps in each decision.
   4c. The bound, then: beside interactive work a lower class's head starts within its
   starvation time, plus the longest lower-class step running when it is due divided by
   ``guard_share`` (one turn of the other class and the lane's rest after it), plus
   ``guard_gap_wait``, plus its engine's load if the turn needs one; batch beside
   background work alone, within its starvation time plus, while an engine is hot, the
   steps running on the lower classes' engine. Short steps keep it near the starvation
   time: a long generation cut into steps (the gateway's ``scheduler.step_tokens``).
   4d. Memory is no exception: a due turn whose engine fits only where engines that a higher
   lower class wants are (batch behind background's engines; never a hot or pinned one)
   may evict them, idle ones at once and busy ones drained: the turn waits for their
   steps, not for the higher class to run out of work (which may be never).
5. Residency: pinned engines are never evicted for another model (rule 8's exclusive job
   unloads them, last); hot ones (used interactively within
   ``hot_window``) only for interactive work, and only when cold ones do not free enough.
6. Count first, load second: a load reserves its memory the moment it is decided; memory
   of engines already on their way out counts as being freed (no second victim for one
   need); engines still loading are never evicted; an engine with work in flight is
   drained, never stopped; a reservation is released only after the engine exited and
   its memory was observed free (or a timeout).
7. Never more concurrent steps to an engine than its slots.
8. An exclusive job (the whole GPU) at the head of its class stops new work of that
   class and below, lets running work drain, unloads engines, runs, and then lets
   everything resume.
9. Swaps: within a class, a load that would evict another engine is held, for at most
   ``swap_hold`` after its request arrived, while the class's other work keeps loaded (or
   loading) engines busy and the engines it would evict were used lately: younger requests
   for loaded models go first, so one swap serves a batch of requests, not one. A load that
   fits, or whose victims cost nothing, is never held; nothing is held across classes, and
   while held its memory is promised (no later demand takes it). Once the hold is over it
   is served as rule 1 says.
10. Warming, batch work below every class: after an exclusive job ends or an idle unload, in
   the moments when nothing waits (no step of any class, no exclusive job), no exclusive job
   runs, the interactive window is closed and steward is not closing, one engine at a time
   is loaded ahead of demand: the first, likeliest needed first, that fits in free memory as
   it is (a warm load never evicts, nor takes memory promised to a waiting load). Likeliest:
   ``scheduler.warm`` in its order, then the engines used within hot_window by ReloadCost's
   likely (supervisor/scheduler/warming.py); one neither listed nor used lately is never
   warmed. Only stopped engines: not one in its backoff after a failure, not a sleeping one
   (its wake is quick: little to gain), and not one unloaded for being idle and unused since
   (its idle_unload says it is not wanted idle: warming it would load it only to unload it
   again, for ever). The next is decided once the last is ready; warming ends when nothing
   more fits and no memory is on its way out. It never delays real work by more than one
   stop: a warm load still starting is stopped (`warm_cancelled`) the moment a request for
   another engine, an exclusive job, a pinned or an admin load needs its memory, so they
   wait for its exit as they would for an idle engine's eviction, never for the rest of its
   load (left to finish, rule 6 would let nobody evict it until ready). Once ready, until a
   step runs on it, it counts as cold and as costing nothing to evict (ReloadCost.unused_warm):
   it was loaded for no one, so any class may evict it, first, and no load is held for it
   (rule 9); the free memory it took would have been theirs.

Victims (rules 5 and 8): of the engines that may be evicted, cold before hot and idle before
busy (the tiers are hard rules); within a tier, the least expected cost first, in whole
seconds (less is noise), least recently used on a tie. Expected cost = drain_s + load_s x
likely: drain_s is what a busy victim's running steps are expected to take yet (the load
waits for them): its measured mean step time less what the newest of them has run (busy and
never measured: after every busy one that was; idle: 0); load_s is its last load's measured
time (decision to ready, kept in the state file), else 1 s + 1 s per GiB; likely is 1 if requests for it are queued, else
1 - exp(-u), with u the steps started on it within ``hot_window`` (interactive 1, background
1/2, batch 1/4 each: whom a reload would delay): the chance of a step within the next
hot_window if they keep coming at that rate. An engine unused for hot_window costs 0 (least
recently used goes first). The `evict` event carries the figures.
"""

from __future__ import annotations

import collections
import heapq
import math
from collections.abc import Iterable, Mapping, Sequence

import attrs

from supervisor.address import Address
from supervisor.scheduler.explain import explain
from supervisor.scheduler.ledger import Ledger
from supervisor.scheduler.placing import candidate_placements, most_memory
from supervisor.scheduler.queues import ClassQueue
from supervisor.scheduler.types import (
    CLASSES,
    DEFAULT_DEVICE,
    RANK,
    CheckEngine,
    DeviceSnapshot,
    DeviceUse,
    Effect,
    Emit,
    EngineAction,
    EngineProfile,
    EngineSnapshot,
    EngineState,
    EngineStatus,
    Fail,
    Grant,
    GuardClaim,
    Job,
    LineSnapshot,
    Measured,
    Placement,
    ReloadCost,
    RetireEngine,
    Retirement,
    Revoke,
    SchedulerSnapshot,
    SchedulingPolicy,
    StartEngine,
    StopEngine,
    WarmCause,
)
from supervisor.scheduler.warming import warm_order
from supervisor.units import format_size

SHUTTING_DOWN = "steward is shutting down; try again once it is back"
SHUTDOWN_RETRY_AFTER = 5.0

Demand = tuple[int, int]  # (class rank, seq) of the earliest job that wants an engine
NO_DEMAND: Demand = (len(CLASSES), math.inf)  # type: ignore[assignment]
TURN_DEMAND: Demand = (RANK["background"], -1)  # a guard turn's engine: before any lower class's request
# Whether an engine's steps are short (rule 3b) is judged by the mean of its last this many.
STEP_SAMPLES = 8


@attrs.frozen
class LoadReason:
    code: str  # the `load` event's `reason`: `job N`, `job N (starvation guard)`, `pinned`, `admin`
    words: str  # its `why`

    @classmethod
    def of(cls, job: Job, *, guard: bool = False) -> LoadReason:
        if guard:
            return cls(f"job {job.id} (starvation guard)", f"the starvation guard lets a {job.klass} step run")
        return cls(f"job {job.id}", f"a {job.klass} request waits for it")


PINNED = LoadReason("pinned", "pinned: always loaded")
ADMIN = LoadReason("admin", "an admin asked for it")


@attrs.frozen
class SwapHold:
    """A load held so that younger requests for loaded engines go first (rule 9)."""

    until: float  # its request's arrival + swap_hold
    behind: tuple[str, ...]  # the loaded (or loading) engines the class's other work keeps busy
    would_evict: tuple[str, ...]  # what the load would evict now


@attrs.frozen
class _Option:
    """One way to place a load, and what it would take."""

    placement: Placement
    needs: dict[int, int]  # device -> what the load takes from what is free there
    fits: bool  # in free memory now: it loads at once
    # The engines to evict for it ([]: memory on its way out is enough); None: nothing
    # allowed frees enough now.
    victims: list[EngineState] | None
    hot: bool  # a victim is hot
    last: bool  # where the engine ran last time
    spare: int  # what would be left free on its devices after it


@attrs.define
class Scheduler:
    ledger: Ledger
    engines: dict[str, EngineState]
    policy: SchedulingPolicy = attrs.Factory(SchedulingPolicy)
    # With a GPU probe, a reservation waits for the memory to be observed free.
    observe_memory: bool = False
    queues: dict[str, ClassQueue] = attrs.Factory(lambda: {k: ClassQueue(k) for k in CLASSES})
    waiting: dict[int, Job] = attrs.Factory(dict)
    running: dict[int, Job] = attrs.Factory(dict)
    running_by_class: dict[str, int] = attrs.Factory(lambda: dict.fromkeys(CLASSES, 0))
    # When a class last made progress (a step of it started or ended): the starvation clock.
    progress: dict[str, float] = attrs.Factory(lambda: dict.fromkeys(CLASSES, -math.inf))
    # The step the starvation guard let through, per class, until it ends.
    guard: dict[str, int | None] = attrs.Factory(lambda: dict.fromkeys(CLASSES))
    # The steps that joined a guard turn on its engine (guard_fill), per class, until they end,
    # and when each class's turn began: guard_share counts the whole turn.
    guard_fill: dict[str, set[int]] = attrs.Factory(lambda: {k: set() for k in CLASSES})
    turn_started: dict[str, float] = attrs.Factory(lambda: dict.fromkeys(CLASSES, -math.inf))
    gap_job: int | None = None  # the gap step running (rule 3b), until it ends
    # Each engine's last steps, dispatch to end, newest last: which engines' steps are short.
    step_times: dict[str, collections.deque[float]] = attrs.Factory(dict)
    last_interactive_end: float = -math.inf
    guard_resume_at: float = -math.inf  # the guard's share of the GPU: no guard step before this
    # A due guard turn that waits for the lower classes' own steps, and on which engines (rule
    # 4b): no other lower-class step starts there until it has.
    guard_claim: GuardClaim | None = None
    mode: str = "idle"
    closing: bool = False  # steward is shutting down: no new requests start
    exclusive_holder: int | None = None
    warm_cause: WarmCause | None = None  # what freed the GPU, while engines are loaded ahead of demand (rule 10)
    outside_memory: tuple[int, ...] | None = None  # per device: memory used by processes that are not engines
    settle_polls_left: int = 0  # readings to go before the outside estimate may move again
    now: float = 0.0
    wall_offset: float = 0.0  # the wall clock minus this clock: times in words are the wall clock's
    _deadlines: list[tuple[float, int]] = attrs.Factory(list)
    _effects: list[Effect] = attrs.Factory(list)

    @classmethod
    def create(cls, budget: int | Sequence[int], profiles: Iterable[EngineProfile],
               policy: SchedulingPolicy | None = None, *, observe_memory: bool = False,
               load_times: Mapping[str, float] | None = None) -> Scheduler:
        """*budget*: one device's, or each device's (index = device); *load_times*: each
        engine's load time measured before (the state file's)."""
        load_times = load_times or {}
        engines = {p.name: EngineState(p, load_s=load_times.get(p.name)) for p in profiles}
        return cls(Ledger(budget), engines, policy or SchedulingPolicy(), observe_memory)

    # ---- inputs -------------------------------------------------------------------

    def start(self, now: float) -> list[Effect]:
        """Called once: loads the pinned engines."""
        return self._decide(now)

    def submit(self, job_id: int, model: str | None, klass: str, now: float, *, seq: int | None = None,
               request: int | None = None, step: int = 1, steps: int = 1, exclusive_memory: int | None = None,
               timeout: float | None = None, handoff: tuple[int, int | None] | None = None) -> list[Effect]:
        """Queue one step. *model* None asks for the GPU itself (an exclusive job).

        *handoff* is (job id, status) of the request's previous step, finished in the same
        decision, so its slot goes to this step and not to a newer request.
        """
        if handoff is not None:
            self._finish(*handoff, now)
        need = self._need(model, exclusive_memory)
        job = Job(job_id, model, klass, seq=job_id if seq is None else seq, submitted=now,
                  deadline=now + (self.policy.queue_timeout[klass] if timeout is None else timeout),
                  request=job_id if request is None else request, step=step, steps=steps,
                  exclusive_memory=need if model is None else 0)
        job.next_report = now + self.policy.wait_report_after
        if self.closing and step == 1:
            return self._refuse(job, 503, "shutting_down", SHUTTING_DOWN, retry_after=SHUTDOWN_RETRY_AFTER)
        if model is not None and (model not in self.engines or self._removed(model)):
            return self._refuse(job, 404, "model_not_found", f"the model '{model}' was removed from steward's config")
        if model is None:
            room = self.ledger.budgets[DEFAULT_DEVICE]
        else:
            room = most_memory(self.engines[model].profile, self.ledger, self._pinned_elsewhere(model))
        if need > room:
            return self._refuse(job, 503, "insufficient_memory",
                                f"{self._what(job)} needs {need} bytes but at most {room} can ever be free "
                                f"for it (budget {self.ledger.budget})")
        queue = self.queues[klass]
        if queue.size >= self.policy.max_queue[klass]:
            return self._refuse(job, 429, "queue_full", f"the {klass} queue is full ({queue.size} waiting)",
                                retry_after=1.0)
        if queue.size == 0 and self.running_by_class[klass] == 0:
            self.progress[klass] = now  # nothing was waiting: the starvation clock starts now
        queue.push(job)
        self.waiting[job_id] = job
        heapq.heappush(self._deadlines, (job.deadline, job_id))
        self._emit("enqueue", "debug", job=job_id, request=job.request, model=model, **{"class": klass},
                   step=f"{step}/{steps}", queued=queue.size)
        return self._decide(now)

    def close(self, now: float) -> list[Effect]:
        """Shutdown began: requests that have not started are answered 503 now and new ones
        are refused, so that only work already running holds the drain open. Running steps,
        and the later steps of a request already under way, go on."""
        self.closing = True
        for job in [j for j in self.waiting.values() if j.step == 1]:
            self._unqueue(job)
            self._fail(job, 503, "shutting_down", SHUTTING_DOWN, retry_after=SHUTDOWN_RETRY_AFTER,
                       reason="shutting_down")
        return self._decide(now)

    def finish(self, job_id: int, now: float, status: int | None = None) -> list[Effect]:
        """The handler is done with a step: it completed, failed, or the client left.

        *status* is what the client was answered (HTTP status), for the log only.
        """
        self._finish(job_id, status, now)
        return self._decide(now)

    def _finish(self, job_id: int, status: int | None, now: float) -> None:
        job = self.running.pop(job_id, None)
        if job is None:
            waiting = self.waiting.get(job_id)
            if waiting is not None:
                self._unqueue(waiting)
                self._emit("withdraw", "debug", job=job_id, model=waiting.model, **{"class": waiting.klass},
                           waited_s=_round(now - waiting.submitted))
            return
        klass = job.klass
        self.running_by_class[klass] -= 1
        if self.gap_job == job_id:
            self.gap_job = None  # a gap step is no progress for the starvation clock (rule 3b)
        else:
            self.progress[klass] = now
        if self.guard[klass] == job_id or job_id in self.guard_fill[klass]:
            self._end_turn_step(job, now)
        if job.model is not None and job.dispatched is not None and (status is None or status < 400):
            self.step_times.setdefault(job.model, collections.deque(maxlen=STEP_SAMPLES)).append(now - job.dispatched)
        if klass == "interactive" and self.running_by_class[klass] == 0:
            self.last_interactive_end = now
        if job.exclusive:
            self.ledger.release(_exclusive_owner(job_id))
            self.exclusive_holder = None
            self.warm_cause = WarmCause.EXCLUSIVE_JOB
        else:
            engine = self.engines[job.model]  # type: ignore[index]
            if job.engine_generation == engine.generation and engine.serving:
                engine.in_flight -= 1
                engine.last_used = now
                if klass == "interactive":
                    engine.last_interactive = now
                if engine.status is EngineStatus.DRAINING and engine.in_flight == 0:
                    self._stop(engine)
        self._emit("complete", "debug", job=job_id, request=job.request, model=job.model, **{"class": klass},
                   step=f"{job.step}/{job.steps}", status=status,
                   duration_s=_round(now - (job.dispatched or now)))

    def engine_spawned(self, name: str, generation: int, pid: int, now: float) -> list[Effect]:
        """The engine's process exists: its memory in GPU readings is its own, not outside use."""
        engine = self.engines[name]
        if generation == engine.generation and engine.status is EngineStatus.STARTING:
            engine.pid = pid
        return self._flush()

    def engine_ready(self, name: str, generation: int, endpoint: Address, now: float,
                     pid: int | None = None) -> list[Effect]:
        engine = self.engines[name]
        if generation != engine.generation or engine.status is not EngineStatus.STARTING:
            return self._flush()
        engine.status = EngineStatus.READY
        engine.requested = False
        engine.endpoint = endpoint
        engine.pid = pid if pid is not None else engine.pid
        engine.ready_at = now
        engine.last_used = now
        load_s = now - engine.start_decided_at
        if not engine.waking:  # a wake is quicker than the load an eviction costs
            engine.load_s = load_s  # kept in the state file, from this event
        self._emit("ready", "info", engine=name, load_s=_round(load_s),
                   endpoint=endpoint.url if isinstance(endpoint, Address) else endpoint, wake=engine.waking)
        return self._decide(now)

    def engine_exited(self, name: str, generation: int, now: float, detail: str) -> list[Effect]:
        engine = self.engines[name]
        if generation != engine.generation or engine.status in (EngineStatus.STOPPED, EngineStatus.FAILED):
            return self._flush()
        # A sleeping engine's kept process that went away had been unloaded already.
        expected = (engine.status is EngineStatus.STOPPING and not engine.restarting_unhealthy
                    or engine.status is EngineStatus.SLEEPING)
        if engine.restarting_unhealthy:
            detail = f"restarted because it stopped answering its health checks ({detail})"
        was_starting = engine.status is EngineStatus.STARTING
        engine.requested = False  # an admin's load that failed is not tried again
        engine.stop_serving()
        if self.observe_memory and engine.pid is not None:
            self.ledger.await_free(name, now + self.policy.release_timeout)
            if engine.outside_baseline is None:
                engine.outside_baseline = self.outside_memory
            released = 0
        else:
            released = self._release(engine)
        if expected:
            engine.status = EngineStatus.STOPPED
            self._emit("stopped", "info", engine=name, released=released, free=self.ledger.free)
            return self._decide(now)
        # Unexpected: a crash, or a start that never became ready.
        if engine.ready_at is not None and now - engine.ready_at >= self.policy.backoff.maximum:
            engine.failures = 0  # it ran long enough that this is a new failure, not a loop
        engine.failures += 1
        delay = self.policy.backoff.delay(engine.failures)
        engine.status = EngineStatus.FAILED
        engine.retry_at = now + delay
        self._emit("crash", "error", engine=name, during_start=was_starting, detail=detail,
                   released=released, failures=engine.failures, restart_in_s=delay)
        if was_starting:
            # Steps waiting for this start get a clean error now rather than a hang.
            for klass in CLASSES:
                for job in list(self.queues[klass].line(name)):
                    self._unqueue(job)
                    self._fail(job, 503, "engine_start_failed", f"engine {name!r} failed to start: {detail}",
                               retry_after=delay, reason="engine_start_failed")
        return self._decide(now)

    def engine_asleep(self, name: str, generation: int, now: float, detail: str) -> list[Effect]:
        """An engine told to stop was put to sleep instead: its process stays, holding less.

        Its reservation becomes ``sleep_memory`` when set, else what is measured while it
        sleeps (the full reservation until a reading says so)."""
        engine = self.engines[name]
        if generation != engine.generation or engine.status is not EngineStatus.STOPPING:
            return self._flush()
        if engine.restarting_unhealthy:  # a restart was asked for, not a sleep
            return self.engine_exited(name, generation, now, f"put to sleep, not restarted ({detail})")
        engine.status = EngineStatus.SLEEPING
        engine.stop_serving()
        engine.measured = 0
        reserved = self.ledger.held(name)
        if engine.profile.sleep_memory is not None and self.ledger.holds(name):
            self.ledger.rescale(name, min(engine.profile.sleep_memory, reserved))
        self._emit("asleep", "info", engine=name, detail=detail, reserved=self.ledger.held(name),
                   released=reserved - self.ledger.held(name), free=self.ledger.free)
        return self._decide(now)

    def engine_load(self, name: str, generation: int, running: int | None, waiting: int | None) -> list[Effect]:
        """The engine's own account of its queue: kept for the snapshot, decides nothing."""
        engine = self.engines[name]
        if generation == engine.generation and engine.serving:
            engine.reported_running, engine.reported_waiting = running, waiting
        return self._flush()

    def engine_checked(self, name: str, generation: int, now: float, problem: str | None) -> list[Effect]:
        """The result of one health check of a ready engine: *problem* None if it answered.

        After ``unhealthy_after`` failures in a row the engine gets no new work and the steps
        running on it are revoked (their clients get a clean error now, not at their own
        timeout); if it does not answer again within ``recover_timeout`` it is restarted.
        """
        engine = self.engines[name]
        if generation != engine.generation or not engine.serving:
            return self._flush()
        if problem is None:
            engine.check_failures = 0
            if engine.unhealthy_since is not None:
                self._emit("engine_recovered", "info", engine=name, unhealthy_s=_round(now - engine.unhealthy_since))
                engine.unhealthy_since = None
            return self._decide(now)
        engine.check_failures += 1
        self._emit("health_check_failed", "warning", engine=name, failures=engine.check_failures, detail=problem)
        if not engine.unhealthy and engine.check_failures >= self.policy.unhealthy_after:
            engine.unhealthy_since = now
            running = [job for job in self.running.values()
                       if job.model == name and job.engine_generation == engine.generation]
            self._emit("engine_unhealthy", "error", engine=name, failures=engine.check_failures, detail=problem,
                       revoked=len(running), restart_in_s=self.policy.recover_timeout)
            for job in running:
                self._effects.append(Revoke(job.id, f"stopped answering its health checks ({problem})"))
        return self._decide(now)

    def engine_stalled(self, name: str, generation: int, now: float, detail: str) -> list[Effect]:
        """A request on the engine got no byte within its timeout: check the engine now."""
        engine = self.engines[name]
        if generation == engine.generation and engine.serving:
            self._emit("engine_stalled", "warning", engine=name, detail=detail)
            self._effects.append(CheckEngine(name, generation))
        return self._flush()

    def observe(self, now: float, used: int, processes: dict[int, int]) -> list[Effect]:
        """A reading of a host with one device (see ``observe_devices``)."""
        return self.observe_devices(now, [DeviceUse(used, processes)])

    def observe_devices(self, now: float, readings: Sequence[DeviceUse]) -> list[Effect]:
        """A memory reading of every device: its total use, and the per-process list (taken separately).

        Memory not attributed to a live engine is outside use and is subtracted from what
        the ledger can hand out on that device. Phantom guard: while an engine stops, and for
        ``settle_polls`` readings after, that estimate stays frozen, because a process that
        exited between the two NVML calls is gone from the list while its memory still
        counts, and would look like outside use (GridCore evicted a healthy model over it).
        An exited engine's reservation is released once its process is gone from every
        device's list and the unattributed memory of each is back to the frozen estimate.
        """
        readings = readings[: len(self.ledger.budgets)]
        live = {e.pid: e for e in self.engines.values()
                if e.pid is not None and e.status in (EngineStatus.STARTING, EngineStatus.READY, EngineStatus.DRAINING,
                                                      EngineStatus.STOPPING, EngineStatus.SLEEPING)}
        # What a service says it holds is on the device its reservation is on.
        external = dict.fromkeys(range(len(readings)), 0)
        for engine in self.engines.values():
            if engine.serving and engine.external:
                device = min(self.ledger.shares.get(engine.name) or {DEFAULT_DEVICE: 0})
                external[device] = external.get(device, 0) + engine.external
        unattributed = tuple(
            reading.used - sum(nbytes for pid, nbytes in reading.processes.items() if pid in live) - external[device]
            for device, reading in enumerate(readings))
        if self.ledger.awaiting_free or any(e.status is EngineStatus.STOPPING for e in self.engines.values()):
            self.settle_polls_left = self.policy.settle_polls
        elif self.settle_polls_left > 0:
            self.settle_polls_left -= 1
        else:
            self.outside_memory = tuple(max(0, nbytes) for nbytes in unattributed)
            self.ledger.outside_by_device[: len(readings)] = self.outside_memory
        listed = {pid for reading in readings for pid in reading.processes}
        for engine in self.engines.values():
            if self.ledger.releasing(engine.name) and engine.pid not in listed:
                baseline = engine.outside_baseline if engine.outside_baseline is not None else unattributed
                if all(now_ <= then + self.policy.release_tolerance for now_, then in zip(unattributed, baseline)):
                    released = self._release(engine)
                    self._emit("released", "info", engine=engine.name, released=released, free=self.ledger.free)
        for pid, engine in live.items():
            share = {device: reading.processes[pid] for device, reading in enumerate(readings)
                     if pid in reading.processes}
            if engine.serving and share:
                self._measure(engine, share)
            elif engine.status is EngineStatus.SLEEPING and share:
                self._measure_asleep(engine, share)
        return self._decide(now)

    def _measure_asleep(self, engine: EngineState, share: dict[int, int]) -> None:
        """What a sleeping engine holds becomes its reservation, unless set by hand."""
        nbytes = sum(share.values())
        reserved = self.ledger.held(engine.name)
        if (engine.profile.sleep_memory is not None or not self.ledger.holds(engine.name)
                or abs(nbytes - reserved) <= reserved // 100):
            return
        self.ledger.resize(engine.name, share)
        self._emit("measured", "info", engine=engine.name, measured=nbytes, estimate=reserved, free=self.ledger.free,
                   asleep=True)

    def _measure(self, engine: EngineState, share: dict[int, int]) -> None:
        """Keep the most the process has used; it replaces the estimate once it differs by 1 %."""
        nbytes = sum(share.values())
        if nbytes <= engine.measured:
            return
        engine.measured = nbytes
        reserved = self.ledger.held(engine.name)
        if abs(nbytes - reserved) <= reserved // 100 or engine.profile.fixed_memory:
            return
        previous = self.ledger.resize(engine.name, share)
        engine.profile = attrs.evolve(engine.profile, memory=nbytes)
        self._emit("measured", "info", engine=engine.name, measured=nbytes, estimate=previous,
                   free=self.ledger.free)
        self._effects.append(Measured(engine.name, nbytes))

    def service_memory(self, name: str, generation: int, nbytes: int, now: float) -> list[Effect]:
        """A service's own account of the memory it holds now (Ollama's /api/ps).

        The reservation grows to it when it is more; it never shrinks below the configured
        amount while the service is up, since it may load a model at any request.
        """
        engine = self.engines[name]
        if generation != engine.generation or not engine.serving:
            return self._flush()
        engine.external = nbytes
        reserved = self.ledger.held(name)
        if nbytes > reserved:
            self.ledger.rescale(name, nbytes)
            self._emit("measured", "info", engine=name, measured=nbytes, estimate=reserved, free=self.ledger.free)
        return self._decide(now)

    def control(self, name: str, action: EngineAction, now: float) -> tuple[str | None, list[Effect]]:
        """An admin's load, unload, pin or unpin of engine *name*: None, or why it cannot be done now.

        It goes by the same rules as everything else: a load takes free memory or evicts only idle
        cold engines (never work in flight, never a hot one), an unload drains the engine first,
        pinning loads it at once (as at start), unpinning leaves it loaded and evictable."""
        engine = self.engines[name]
        problem = None
        if action is EngineAction.PIN or action is EngineAction.UNPIN:
            engine.profile = attrs.evolve(engine.profile, pinned=action is EngineAction.PIN)
        elif action is EngineAction.UNLOAD:
            engine.requested = False
            if engine.profile.pinned:
                problem = f"{name} is pinned: unpin it first"
            elif engine.status is not EngineStatus.READY:
                problem = f"{name} is {engine.status.value}, not loaded"
            else:
                self._evict(engine, now, for_what="admin", need=0, free=self.ledger.free)
        elif engine.status in (EngineStatus.STARTING, EngineStatus.READY):
            problem = None  # loaded (or loading) already
            engine.warm_generation = None  # a warm load an admin asks for is one someone wants
        elif not self._may_start(engine, now):
            problem = f"{name} is {engine.status.value}; try again once it is stopped"
        elif self._admin_option(engine, now, {}) is None:
            problem = f"{name} needs {format_size(engine.profile.memory)} and nothing idle and cold may be evicted for it"
        else:
            engine.requested = True  # loaded in this decision, or once its victims are gone
        self._emit("admin", "info", engine=name, action=action.value, done=problem is None, detail=problem)
        return problem, self._decide(now)

    def _admin_option(self, engine: EngineState, now: float, promised: dict[int, int]) -> _Option | None:
        """How an admin's load goes: into free memory, or over idle cold engines only."""
        option = self._place(engine, now, promised, {}, (RANK["background"], -1), idle_only=True)
        if option is None or (option.victims is None and not option.fits):
            return None
        return option

    # ---- reload ---------------------------------------------------------------------

    def add_engine(self, profile: EngineProfile, now: float, *, load_s: float | None = None) -> list[Effect]:
        """A reload added a model (its engine task exists already); *load_s*: its load time
        measured before (the state file), as ``create``'s load_times."""
        self.engines[profile.name] = EngineState(profile, load_s=load_s)
        self._emit("engine_added", "info", engine=profile.name, memory=profile.memory)
        return self._decide(now)

    def retire_engine(self, name: str, replacement: EngineProfile | None, now: float) -> list[Effect]:
        """A reload removed (*replacement* None) or changed a model: no new work for its engine,
        the steps on it finish, then it stops and its task is retired. Steps waiting for a
        removed model are answered 404 now; those for a changed one wait for the new engine."""
        engine = self.engines[name]
        engine.retiring = Retirement(replacement)
        engine.requested = False
        if replacement is None:
            for klass in CLASSES:
                for job in list(self.queues[klass].line(name)):
                    self._unqueue(job)
                    self._fail(job, 404, "model_not_found", f"the model '{name}' was removed from steward's config",
                               retry_after=None, reason="model_removed")
        self._emit("engine_retiring", "info", engine=name, removed=replacement is None, status=engine.status.value,
                   in_flight=engine.in_flight)
        return self._decide(now)

    def engine_replaced(self, name: str, now: float) -> list[Effect]:
        """The changed model's new engine task runs: the next load is the new config's."""
        engine = self.engines[name]
        assert engine.retiring is not None and engine.retiring.replacement is not None
        engine.profile, engine.retiring, engine.placement = engine.retiring.replacement, None, None
        engine.failures = 0
        engine.load_s = None  # another model or other arguments: measured afresh
        self._emit("engine_replaced", "info", engine=name, memory=engine.profile.memory)
        return self._decide(now)

    def replace_policy(self, policy: SchedulingPolicy, now: float) -> list[Effect]:
        self.policy = policy
        return self._decide(now)

    def _advance_retirements(self, now: float) -> None:
        for engine in list(self.engines.values()):
            retiring = engine.retiring
            if retiring is None or retiring.announced:
                continue
            if engine.status is EngineStatus.READY:
                self._evict(engine, now, for_what="reload", need=0, free=self.ledger.free)
            elif engine.status is EngineStatus.STARTING:
                self._stop(engine)  # a load of the old config: not finished
            elif engine.status is EngineStatus.SLEEPING:
                # Its kept process goes with its task: the memory is released once seen free.
                engine.status = EngineStatus.STOPPED
                if self.observe_memory and engine.pid is not None:
                    self.ledger.await_free(engine.name, now + self.policy.release_timeout)
                else:
                    self._release(engine)
            if engine.status in (EngineStatus.STOPPED, EngineStatus.FAILED):
                engine.retiring = attrs.evolve(retiring, announced=True)
                self._effects.append(RetireEngine(engine.name, replaced=retiring.replacement is not None))
        for name in [n for n, e in self.engines.items() if e.retiring is not None and e.retiring.announced
                     and e.retiring.replacement is None and not self.ledger.holds(n)]:
            del self.engines[name]
            self._emit("engine_removed", "info", engine=name)

    def tick(self, now: float) -> list[Effect]:
        """Time passed: deadlines, backoffs, the window and starvation clocks may have come due."""
        return self._decide(now)

    def next_wakeup(self) -> float | None:
        """The next time at which a decision may change with no other input."""
        times = []
        while self._deadlines and self._deadlines[0][1] not in self.waiting:
            heapq.heappop(self._deadlines)
        if self._deadlines:
            times.append(self._deadlines[0][0])
        times += self.ledger.awaiting_free.values()
        for engine in self.engines.values():
            if engine.status is EngineStatus.FAILED and (engine.profile.pinned or self._demand(engine.name)):
                times.append(engine.retry_at)
            if engine.unhealthy_since is not None and engine.serving:
                times.append(engine.unhealthy_since + self.policy.recover_timeout)
            if self._may_idle_unload(engine):
                times.append(engine.last_used + engine.profile.idle_unload)  # type: ignore[operator]
        if self.running_by_class["interactive"] == 0:
            times.append(self.last_interactive_end + self.policy.interactive_window)
        if self.policy.lower_class_engines > 0 and any(self.queues[k].size for k in CLASSES[1:]):
            times.append(self._hot_until())  # rule 3c ends then
        for queue in self.queues.values():
            for head in queue.heads():
                times.append(head.next_report)
                if head.held_until is not None:
                    times.append(head.held_until)  # the hold ends: the load is decided then
        for klass in CLASSES[1:]:
            if self.policy.gap_step > 0:  # when a short line the guard passes over is left to the gaps no more
                left_for = self.policy.starvation[klass] + self.policy.guard_gap_wait
                times += [h.submitted + left_for for h in self.queues[klass].heads()
                          if h.model is not None and self._short(h.model)]
            start = self._starved_since(klass)
            if start is not None and self.policy.starvation[klass] > 0:
                due = self._lane_due_at(start, klass)
                times += [due, due + self.policy.guard_gap_wait]
        future = [t for t in times if t > self.now]
        return min(future, default=None)

    def snapshot(self, *, explained: bool = False) -> SchedulerSnapshot:
        """The state for views; *explained*: with why each line's head waits (it costs a placement
        per line, so only views that show it ask)."""
        return SchedulerSnapshot(
            budget=self.ledger.budget, reserved=self.ledger.reserved, outside=self.ledger.outside, mode=self.mode,
            queued=len(self.waiting),
            queued_by_class={k: q.size for k, q in self.queues.items()},
            running_by_class=dict(self.running_by_class),
            releasing=len(self.ledger.awaiting_free),
            exclusive_waiting=sum(1 for job in self.waiting.values() if job.exclusive),
            lines=tuple(self._line_snapshot(line, explained) for queue in self.queues.values()
                        for line in queue.lines.values()),
            devices=tuple(DeviceSnapshot(device, self.ledger.budgets[device], self.ledger.reserved_on(device),
                                         self.ledger.outside_by_device[device]) for device in self.ledger.devices),
            engines=tuple(self._engine_snapshot(e) for e in self.engines.values()))

    def _engine_snapshot(self, e: EngineState) -> EngineSnapshot:
        hot = e.hot(self.now, self.policy.hot_window)
        return EngineSnapshot(
            # A draining engine still serves its steps: shown as ready, with draining set.
            name=e.name, status="ready" if e.status is EngineStatus.DRAINING else e.status.value,
            in_flight=e.in_flight, slots=e.profile.slots, memory=e.profile.memory, reserved=self.ledger.held(e.name),
            draining=e.draining, pinned=e.profile.pinned, hot=hot,
            queued=sum(q.count(e.name) for q in self.queues.values()), failures=e.failures,
            healthy=not e.unhealthy, measured=e.measured, engine_running=e.reported_running,
            engine_waiting=e.reported_waiting, devices=self._devices_of(e),
            held=dict(self.ledger.shares.get(e.name, {})), generation=e.generation, last_used=e.last_used,
            hot_until=e.last_interactive + self.policy.hot_window if hot else None)

    # ---- decisions ----------------------------------------------------------------

    def _decide(self, now: float) -> list[Effect]:
        self.now = now
        self._expire(now)
        self._undo_stale_drains()
        self._release_overdue(now)
        self._restart_unhealthy(now)
        self._unload_idle(now)
        self._drop_stale_guards()
        self._advance_retirements(now)
        self._cancel_warm(now)
        promised: dict[int, int] = {}  # per device: memory that loads decided earlier in this pass wait for
        wanted: dict[str, Demand] = self._turn_engines()  # earliest demand per engine seen so far
        blocked_from = self._exclusive_rank()
        if blocked_from is None and self.exclusive_holder is None:
            for engine in self.engines.values():
                if engine.profile.pinned and self._may_start(engine, now):
                    self._load_or_make_room(engine, now, promised, wanted, (0, -1), PINNED)
                elif engine.requested and self._may_start(engine, now):
                    if (option := self._admin_option(engine, now, promised)) is not None:
                        self._carry_out(engine, option, now, promised, ADMIN)
        turn = self._guard_turn(now)
        claimed, self.guard_claim = self.guard_claim, None  # decided afresh: only the turn due now claims
        for rank, klass in enumerate(CLASSES):
            queue = self.queues[klass]
            if rank == RANK["background"]:  # interactive work is served: the lower classes' moments
                self._serve_turn_first(now, turn, blocked_from, promised, wanted, claimed)
                if blocked_from is None and self.exclusive_holder is None:
                    self._serve_gap(now)
            if blocked_from is not None and rank >= blocked_from:
                if rank == blocked_from:
                    self._advance_exclusive(queue.head(), now, wanted)  # type: ignore[arg-type]
                break
            if queue.size:
                gate = self._gate(klass, now, turn)
                if gate == "open":
                    self._serve_class(klass, now, promised, wanted)
                else:
                    self._serve_guard(klass, now, promised, wanted, may_start_new=gate == "guard")
            for head in queue.heads():
                if head.model is not None:
                    wanted.setdefault(head.model, (rank, head.seq))
        self._warm(now, promised)
        self._update_mode(now)
        self._report_waits(now)
        return self._flush()

    def _report_waits(self, now: float) -> None:
        """Say why the head of each line waits, once it has waited a while, then at growing intervals."""
        for queue in self.queues.values():
            for head in queue.heads():
                if now >= head.next_report:
                    wait = explain(self, head)
                    self._emit("waiting", "info", job=head.id, request=head.request, model=head.model,
                               **{"class": head.klass}, waited_s=_round(now - head.submitted),
                               behind=queue.count(head.model) - 1, reason=wait.reason.value, why=wait.why)
                    head.next_report = head.submitted + 2 * (now - head.submitted)

    def _line_snapshot(self, line: list[Job], explained: bool) -> LineSnapshot:
        head = line[0]
        if not explained:
            return LineSnapshot(head.model, head.klass, len(line), head.submitted)
        wait = explain(self, head)
        return LineSnapshot(head.model, head.klass, len(line), head.submitted, wait.reason.value, wait.why)

    def _gate(self, klass: str, now: float, turn: str | None) -> str:
        """'open', or for a lower class held back by higher work: 'guard' or 'blocked'."""
        if klass == "interactive":
            return "open"
        higher = CLASSES[: RANK[klass]]
        interactive_active = self._interactive_active(now)
        if not (interactive_active or any(self.running_by_class[h] or self.queues[h].size for h in higher)):
            return "open"
        if interactive_active:
            return "guard" if turn == klass else "blocked"
        return "guard" if self._guard_due(klass, now, beside_interactive=False) else "blocked"

    def _interactive_active(self, now: float) -> bool:
        return self._window_open(now) or self.queues["interactive"].size > 0

    def _guard_due(self, klass: str, now: float, *, beside_interactive: bool) -> bool:
        """Rule 4: the class's head has made no progress for its starvation time. Beside
        interactive work the lower classes share one lane, within ``guard_share`` of the time."""
        limit = self.policy.starvation[klass]
        since = self._starved_since(klass)
        if limit <= 0 or since is None or now - since < limit or self._in_turn(klass):
            return False
        if beside_interactive:
            # Prefer a moment when no interactive step computes, so none is slowed from its
            # start; after waiting guard_gap_wait for such a gap, go anyway.
            due = self._lane_due_at(since, klass)
            gap = self.running_by_class["interactive"] == 0 or now >= due + self.policy.guard_gap_wait
            return gap and now >= due and self.lane_class() is None
        return True

    def _swap_waits_for_window(self, klass: str, now: float) -> bool:
        """Rule 4: beside interactive work, a guard turn that would evict another engine waits for
        the window to close, for up to guard_gap_wait after it was due. A load slows the chats
        computing for all its length (weights copied in, the KV cache built), longer than a step,
        and the next chat's pause usually comes sooner; a load into free memory goes at once."""
        since = self._starved_since(klass)
        if since is None or not self._interactive_active(now):
            return False
        return now < self._lane_due_at(since, klass) + self.policy.guard_gap_wait

    def _lane_due_at(self, starved_since: float, klass: str) -> float:
        """When a turn of *klass* beside interactive work is due: starved its starvation time,
        and the lane rested (guard_share)."""
        return max(starved_since + self.policy.starvation[klass], self.guard_resume_at)

    def _in_turn(self, klass: str) -> bool:
        """A guard turn of *klass* is under way: its first step waits for its load or runs, or
        steps that joined it run."""
        return self.guard[klass] is not None or bool(self.guard_fill[klass])

    def lane_class(self) -> str | None:
        """The lower class whose guard turn holds the lane beside interactive work, if any."""
        return next((k for k in CLASSES[1:] if self._in_turn(k)), None)

    def _end_turn_step(self, job: Job, now: float) -> None:
        """A step of a guard turn ended; once the turn's last has, the lane rests (guard_share)."""
        klass = job.klass
        if self.guard[klass] == job.id:
            self.guard[klass] = None
        self.guard_fill[klass].discard(job.id)
        if job.by_guard and not self._in_turn(klass):
            share = self.policy.guard_share
            self.guard_resume_at = now + (now - self.turn_started[klass]) * (1 - share) / share

    def _guard_turn(self, now: float) -> str | None:
        """Which lower class may use the lane beside interactive work now: the one due first
        (starved since, plus its starvation time; background on a tie). First due, first
        served: a class waits for at most one turn of the other (and the lane's rest after it)."""
        if not self._interactive_active(now):
            return None
        due = [k for k in CLASSES[1:] if self._guard_due(k, now, beside_interactive=True)]
        return min(due, key=lambda k: (self._own_due_at(k), RANK[k]), default=None)

    def _own_due_at(self, klass: str) -> float:
        """When *klass*'s head will have made no progress for its starvation time (inf: nothing starves)."""
        since = self._starved_since(klass)
        return math.inf if since is None else since + self.policy.starvation[klass]

    def _window_open(self, now: float) -> bool:
        return (self.running_by_class["interactive"] > 0
                or now < self.last_interactive_end + self.policy.interactive_window)

    def _starved_since(self, klass: str) -> float | None:
        head = self._clock_head(klass)
        if head is None or head.exclusive:
            return None
        return max(self.progress[klass], head.submitted)

    def _clock_head(self, klass: str) -> Job | None:
        """The head the starvation clock reads: the class's oldest, passing over the short lines
        left to the gaps while a longer one waits (rule 3b)."""
        queue = self.queues[klass]
        if self.policy.gap_step <= 0:
            return queue.head()
        return min(queue.heads(), default=None, key=lambda h: (
            h.model is not None and self._left_to_gaps(h, self.now), h.seq, h.id))

    def _serve_class(self, klass: str, now: float, promised: dict[int, int], wanted: dict[str, Demand]) -> None:
        """An open class: fill free slots oldest first, then load engines for the rest."""
        queue = self.queues[klass]
        rank = RANK[klass]
        heads = sorted((h for h in queue.heads() if h.model is not None), key=lambda h: h.seq)
        for model in [h.model for h in heads]:  # the oldest request's first (rule 3c may stop the rest)
            engine = self.engines[model]  # type: ignore[index]
            line = queue.line(model)
            if self.lower_engines_full(klass, model, now):
                continue
            while line and self._has_free_slot(engine):
                self._dispatch(line[0], engine, now)
                line = queue.line(model)
        heads = sorted((h for h in queue.heads() if h.model is not None), key=lambda h: h.seq)
        for head in heads:
            engine = self.engines[head.model]  # type: ignore[index]
            if self._may_start(engine, now):
                self._load_or_make_room(engine, now, promised, wanted, (rank, head.seq), LoadReason.of(head),
                                        for_job=head)
            wanted.setdefault(engine.name, (rank, head.seq))

    def lower_engines_full(self, klass: str, model: str | None, now: float) -> bool:
        """Rule 3c: while a chat's engine is hot, background and batch steps compute on at most
        ``lower_class_engines`` engines at once; whether *model* is past that. The engines a due
        guard turn of another class claims (rule 4b) are, too."""
        if klass == "interactive":
            return False
        claim = self.guard_claim
        if claim is not None and claim.klass != klass and model in claim.engines:
            return True
        if not self._engines_bounded(now):
            return False
        busy = self.lower_class_busy()
        return model not in busy and len(busy) >= self.policy.lower_class_engines

    def _engines_bounded(self, now: float) -> bool:
        """Rule 3c applies: a limit is set and a chat's engine is hot."""
        return self.policy.lower_class_engines > 0 and now < self._hot_until()

    def lower_class_busy(self) -> set[str]:
        """The engines background or batch steps compute on, and the engine a guard turn's
        first step waits for (loading for it): that turn will compute there next."""
        busy = {job.model for job in self.running.values() if job.klass != "interactive" and job.model is not None}
        pending = (self.waiting.get(job_id) for job_id in self.guard.values() if job_id is not None)
        return busy | {job.model for job in pending if job is not None and job.model is not None}

    def _hot_until(self) -> float:
        """When the last engine used interactively stops being hot (EngineState.hot)."""
        return max((e.last_interactive for e in self.engines.values()), default=-math.inf) + self.policy.hot_window

    def _serve_turn_first(self, now: float, turn: str | None, blocked_from: int | None, promised: dict[int, int],
                          wanted: dict[str, Demand], claimed: GuardClaim | None) -> None:
        """Rule 4b: a due guard turn is served before the lower classes' other steps, and when
        the lower classes' own work holds what it needs, it claims those engines (*claimed*:
        the claim of the last decision, said once)."""
        klass = self._due_turn(now, turn)
        if klass is None or (blocked_from is not None and RANK[klass] >= blocked_from):
            return
        for higher in CLASSES[1: RANK[klass]]:  # interactive's are in *wanted* already
            for head in self.queues[higher].heads():
                if head.model is not None:
                    wanted.setdefault(head.model, (RANK[higher], head.seq))
        self._serve_guard(klass, now, promised, wanted, may_start_new=True)
        held = () if self._in_turn(klass) else self._held_by_lower_work(klass, now)
        if not held:
            return
        self.guard_claim = GuardClaim(klass, held)
        if claimed is None or claimed.klass != klass:
            self._emit("starvation_claim", "info", **{"class": klass}, waits_for=list(held),
                       starved_s=_round(now - (self._starved_since(klass) or now)), step_s=self._measured_step(held))

    def _due_turn(self, now: float, turn: str | None) -> str | None:
        """The lower class whose guard turn is due now, if any."""
        if self.exclusive_holder is not None:
            return None
        return next((k for k in CLASSES[1:] if self.queues[k].size and self._gate(k, now, turn) == "guard"), None)

    def _held_by_lower_work(self, klass: str, now: float) -> tuple[str, ...]:
        """The engines whose lower-class steps hold every line of *klass*: its engine is past
        rule 3c's bound (all the engines they compute on hold it), or all its slots are busy
        while lower-class steps compute on it. (): some line waits for something else."""
        busy = self.lower_class_busy()
        held: set[str] = set()
        for head in self.queues[klass].heads():
            if head.model is None:
                return ()
            if self.lower_engines_full(klass, head.model, now):
                held |= busy
            elif head.model in busy and not self._has_free_slot(self.engines[head.model]):
                held.add(head.model)
            else:
                return ()
        return tuple(sorted(held))

    def _measured_step(self, engines: Iterable[str]) -> float | None:
        """The longest of the engines' measured mean step times (None: none measured)."""
        means = [sum(times) / len(times) for name in engines if (times := self.step_times.get(name))]
        return _round(max(means)) if means else None

    def _serve_guard(self, klass: str, now: float, promised: dict[int, int], wanted: dict[str, Demand], *,
                     may_start_new: bool) -> None:
        """A class held back by higher work: one guard turn at a time runs beside it, one step,
        or with guard_fill its engine's free slots (rule 4); within rule 3c's bound."""
        pending = self.guard[klass]
        if pending is not None:
            job = self.waiting.get(pending)
            if job is not None and self._has_free_slot(self.engines[job.model]):  # type: ignore[index]
                self._start_turn(job, self.engines[job.model], now)  # type: ignore[index]
            return
        if not may_start_new:
            return
        rank = RANK[klass]
        # Oldest first, and the first that can actually run now: resident with a free
        # slot, or loadable at once into free memory or over idle cold engines. With gap
        # steps, the lines whose steps are short are left to the gaps while there are any.
        heads = [h for h in self.queues[klass].heads() if h.model is not None]
        for head in sorted(heads, key=lambda h: (self._left_to_gaps(h, now), h.seq)):
            engine = self.engines[head.model]  # type: ignore[index]
            if self.lower_engines_full(klass, head.model, now):
                continue  # a second lower-class engine beside a hot chat's (rule 3c)
            if self._has_free_slot(engine):
                self._emit("starvation_step", "info", job=head.id, model=head.model, **{"class": klass},
                           starved_s=_round(now - (self._starved_since(klass) or now)), load=False,
                           steps=1 + len(self._turn_fill(head, engine)), step_s=self._measured_step([engine.name]))
                self._start_turn(head, engine, now)
                return
            if not self._may_start(engine, now):
                continue
            option = self._place(engine, now, promised, wanted, (rank, head.seq), idle_only=True)
            if option is None or option.victims is None:
                option = self._place(engine, now, promised, self._guard_wanted(klass, wanted), (rank, head.seq),
                                     idle_only=False)
            if option is None or option.victims is None:
                continue
            if option.victims and self._swap_waits_for_window(klass, now):
                continue
            self._emit("starvation_step", "info", job=head.id, model=head.model, **{"class": klass},
                       starved_s=_round(now - (self._starved_since(klass) or now)), load=True,
                       step_s=self._measured_step([engine.name]))
            self.guard[klass] = head.id
            self._carry_out(engine, option, now, promised, LoadReason.of(head, guard=True))
            return

    def _turn_engines(self) -> dict[str, Demand]:
        """Rule 4d: an engine loading (or loaded) for a guard turn's first step is wanted before
        any lower class's demand (only interactive work may take it), until that step starts:
        else the class the turn is for would evict it again the moment it is ready."""
        pending = (self.waiting.get(job_id) for job_id in self.guard.values() if job_id is not None)
        return {job.model: TURN_DEMAND for job in pending if job is not None and job.model is not None}

    @staticmethod
    def _guard_wanted(klass: str, wanted: dict[str, Demand]) -> dict[str, Demand]:
        """Rule 4d: the demand a due turn of *klass* leaves standing when memory holds it: the
        interactive class's and its own class's, not that of the lower classes above it."""
        return {name: demand for name, demand in wanted.items() if demand[0] in (0, RANK[klass])}

    def _start_turn(self, head: Job, engine: EngineState, now: float) -> None:
        self._dispatch(head, engine, now, by_guard=True)
        for job in self._turn_fill(head, engine):
            self._dispatch(job, engine, now, by_guard=True, fill=True)

    def _turn_fill(self, head: Job, engine: EngineState) -> list[Job]:
        """guard_fill: the steps that join *head*'s turn on its engine, up to its free slots: its
        class's next ones for the same model. Only while no interactive step computes: one engine
        more costs a chat the same whether one of its slots decodes or all (they batch), but
        beside a chat already computing the turn stays one step."""
        if not self.policy.guard_fill or self.running_by_class["interactive"]:
            return []
        free = engine.profile.slots - engine.in_flight - (0 if head.id in self.running else 1)
        return [job for job in self.queues[head.klass].line(engine.name) if job is not head][:max(free, 0)]

    # ---- gap steps (rule 3b) ------------------------------------------------------------

    def _in_gap(self, now: float) -> bool:
        """Between interactive steps: none computes or waits, while the window is still open."""
        return (self.policy.gap_step > 0 and self.running_by_class["interactive"] == 0
                and not self.queues["interactive"].size and self._window_open(now))

    def _short(self, engine: str) -> bool:
        """Whether the engine's steps are short: the mean of its last ones is at most gap_step.
        Never measured: not short."""
        times = self.step_times.get(engine)
        return bool(times) and sum(times) / len(times) <= self.policy.gap_step

    def _left_to_gaps(self, head: Job, now: float) -> bool:
        """A short step the guard's turns pass over (the gaps serve it), until it has waited its
        starvation time and guard_gap_wait for a gap, as a due guard step would."""
        limit = self.policy.starvation[head.klass] + self.policy.guard_gap_wait
        short = head.model is not None and self._short(head.model)
        return self.policy.gap_step > 0 and short and now - head.submitted < limit

    def _serve_gap(self, now: float) -> None:
        """Rule 3b: in a gap, one short lower-class step starts at once, when no lower-class
        step computes (background's first, oldest first); the next when it ends, if the gap lasts.
        Decided before the guard's turn, which may start beside it: neither waits for the other."""
        if (not self._in_gap(now) or any(self.running_by_class[k] for k in CLASSES[1:])
                or self.guard_claim is not None):
            return
        for klass in CLASSES[1:]:
            heads = sorted((h for h in self.queues[klass].heads() if h.model is not None), key=lambda h: h.seq)
            for head in heads:
                engine = self.engines[head.model]  # type: ignore[index]
                if self._short(engine.name) and self._has_free_slot(engine):
                    times = self.step_times[engine.name]
                    self._emit("gap_step", "debug", job=head.id, model=head.model, **{"class": klass},
                               step_s=_round(sum(times) / len(times)), gap_step_s=self.policy.gap_step)
                    self._dispatch(head, engine, now, gap=True)
                    return

    def _drop_stale_guards(self) -> None:
        """A guard step still waiting for the load made for it, which was undone (its engine
        evicted, for an exclusive job say, before the step could run), no longer holds the
        lane: the guard chooses again. Kept, it would wait for an engine nobody loads."""
        for klass, job_id in self.guard.items():
            job = self.waiting.get(job_id) if job_id is not None else None
            if job is None or job.model is None:
                continue  # running (or gone): its end frees the lane
            engine = self.engines[job.model]
            if engine.status not in (EngineStatus.STARTING, EngineStatus.READY):
                self.guard[klass] = None
                self._emit("starvation_retry", "info", job=job.id, model=job.model, **{"class": klass},
                           engine_status=engine.status.value)

    def _has_free_slot(self, engine: EngineState) -> bool:
        return (engine.status is EngineStatus.READY and not engine.unhealthy
                and engine.in_flight < engine.profile.slots)

    def _may_start(self, engine: EngineState, now: float) -> bool:
        if self.ledger.releasing(engine.name) or engine.retiring is not None:
            return False
        if engine.status in (EngineStatus.STOPPED, EngineStatus.SLEEPING):
            return True
        return engine.status is EngineStatus.FAILED and now >= engine.retry_at

    def _dispatch(self, job: Job, engine: EngineState, now: float, *, by_guard: bool = False, fill: bool = False,
                  gap: bool = False) -> None:
        """*by_guard*: the guard's turn (*fill*: a step that joins it); *gap*: a gap step (rule 3b)."""
        assert engine.endpoint is not None
        self._unqueue(job)
        job.engine_generation = engine.generation
        job.dispatched = now
        job.by_guard = by_guard
        self.running[job.id] = job
        self.running_by_class[job.klass] += 1
        if gap:
            self.gap_job = job.id  # the guard still serves the class's other lines: no progress
        else:
            self.progress[job.klass] = now
        if fill:
            self.guard_fill[job.klass].add(job.id)
        elif by_guard:
            self.guard[job.klass] = job.id
            self.turn_started[job.klass] = now
        engine.in_flight += 1
        engine.last_used = now
        engine.record_use(now, job.klass, self.policy.hot_window)
        if job.klass == "interactive":
            engine.last_interactive = now
        self._emit("dispatch", "debug", job=job.id, request=job.request, model=job.model, **{"class": job.klass},
                   step=f"{job.step}/{job.steps}", waited_s=_round(now - job.submitted),
                   in_flight=engine.in_flight, slots=engine.profile.slots, guard=by_guard)
        self._effects.append(Grant(job.id, engine.name, engine.endpoint, engine.generation))

    def _load_or_make_room(self, engine: EngineState, now: float, promised: dict[int, int],
                           wanted: dict[str, Demand], demand: Demand, reason: LoadReason, *,
                           for_job: Job | None = None) -> None:
        """Start *engine* where its memory is free, else evict for it where that takes least,
        unless *for_job*'s load is held for a swap (rule 9)."""
        option = self._place(engine, now, promised, wanted, demand, idle_only=False)
        if option is None:
            return
        if for_job is not None and (hold := self._swap_hold(for_job, option, now)) is not None:
            self._hold(for_job, hold, option, now, promised)
            return
        self._carry_out(engine, option, now, promised, reason)

    def _swap_hold(self, job: Job, option: _Option, now: float) -> SwapHold | None:
        """Whether *job*'s load, placed as *option* says, waits so that younger requests of its
        class for loaded engines go first (rule 9), and until when; None: it goes ahead."""
        until = job.submitted + self.policy.swap_hold
        if now >= until or not option.victims:
            return None
        if sum(self._reload_cost(v, now).cost for v in option.victims) == 0:
            return None  # nobody used what it would evict lately: evicting it costs nothing
        behind = self._class_work(job.klass, besides=job.model)
        if not behind:
            return None  # nothing of its class would go first: holding it would gain nothing
        return SwapHold(until, behind, tuple(v.name for v in option.victims))

    def _class_work(self, klass: str, *, besides: str | None) -> tuple[str, ...]:
        """The loaded (or loading) engines that steps of *klass* run on or wait for."""
        names = {job.model for job in self.running.values() if job.klass == klass} | set(self.queues[klass].lines)
        return tuple(sorted(name for name in names if name is not None and name != besides
                            and (e := self.engines.get(name)) is not None
                            and e.status in (EngineStatus.READY, EngineStatus.STARTING)))

    def _hold(self, job: Job, hold: SwapHold, option: _Option, now: float, promised: dict[int, int]) -> None:
        if job.held_until is None:
            job.held_until = hold.until
            self._emit("swap_held", "info", job=job.id, request=job.request, model=job.model,
                       **{"class": job.klass}, hold_until=_round(hold.until), hold_s=self.policy.swap_hold,
                       waited_s=_round(now - job.submitted), behind=list(hold.behind),
                       would_evict=list(hold.would_evict))
        self._promise(option, promised)

    def _carry_out(self, engine: EngineState, option: _Option, now: float, promised: dict[int, int],
                   reason: LoadReason) -> None:
        if option.fits:
            self._load(engine, option.placement, now, reason)
            return
        need, free = sum(option.needs.values()), sum(self.ledger.free_on(d) - promised.get(d, 0) for d in option.needs)
        for victim in option.victims or ():
            self._evict(victim, now, for_what=engine.name, need=need, free=free)
        self._promise(option, promised)

    def _promise(self, option: _Option, promised: dict[int, int]) -> None:
        """Later (lower) demand must not take what this load waits for."""
        for device, nbytes in option.needs.items():
            promised[device] = promised.get(device, 0) + nbytes

    def _place(self, engine: EngineState, now: float, promised: dict[int, int], wanted: dict[str, Demand],
               demand: Demand, *, idle_only: bool) -> _Option | None:
        """The best way to place *engine*: in free memory, then waiting for memory on its way
        out, then over cold engines, then (interactive demand only) over hot ones; on a tie
        the devices it ran on last, then the one left with most free. None: no device may
        ever hold it."""
        kept = engine.placement if engine.status is EngineStatus.SLEEPING else None
        options = [self._option(engine, placement, now, promised, wanted, demand, idle_only=idle_only)
                   for placement in candidate_placements(engine.profile, self.ledger, kept)]
        return min(options, default=None, key=lambda o: (
            not o.fits, o.victims is None, bool(o.victims), o.hot, not o.last, -o.spare, o.placement.devices))

    def _option(self, engine: EngineState, placement: Placement, now: float, promised: dict[int, int],
                wanted: dict[str, Demand], demand: Demand, *, idle_only: bool) -> _Option:
        """What loading *engine* with *placement* takes: the victims on each device short of
        memory (never on another), [] if memory on its way out is enough already."""
        needs = {d: nbytes - self.ledger.held_on(engine.name, d) for d, nbytes in placement.share.items()}
        free = {d: self.ledger.free_on(d) - promised.get(d, 0) for d in needs}
        last = engine.placement is not None and engine.placement.devices == placement.devices
        spare = sum(free[d] - needs[d] for d in needs)
        if all(needs[d] <= free[d] for d in needs):
            return _Option(placement, needs, True, [], False, last, spare)
        interactive = demand[0] == 0
        candidates = [e for e in self.engines.values()
                      if e.status is EngineStatus.READY and not e.profile.pinned
                      and e is not engine and wanted.get(e.name, NO_DEMAND) > demand
                      and (interactive or not e.hot(now, self.policy.hot_window))
                      and not (idle_only and e.in_flight)]
        # Cold before hot, idle before busy (busy ones are only drained), then the cheapest to
        # load again when next needed, least recently used on a tie.
        costs = {e.name: self._cost_rank(e, now) for e in candidates}
        candidates.sort(key=lambda e: (e.hot(now, self.policy.hot_window), e.in_flight > 0, costs[e.name],
                                       e.last_used))
        victims: list[EngineState] | None = []
        for device, need in needs.items():
            # Memory on its way out counts as being freed: no second victim for one need.
            gain = free[device] + self._freeing_on(device) + sum(self.ledger.held_on(v.name, device) for v in victims)
            for candidate in candidates:
                if gain >= need:
                    break
                if candidate not in victims and (held := self.ledger.held_on(candidate.name, device)):
                    victims.append(candidate)
                    gain += held
            if gain < need:
                victims = None
                break
        if idle_only and victims == []:
            victims = None  # it waits for memory on its way out: not a step that can run now
        hot = any(v.hot(now, self.policy.hot_window) for v in victims or ())
        return _Option(placement, needs, False, victims, hot, last, spare)

    def _reload_cost(self, engine: EngineState, now: float) -> ReloadCost:
        cost = engine.reload_cost(now, self.policy.hot_window, queued=self._demand(engine.name))
        return attrs.evolve(cost, drain_s=self._expected_drain(engine, now))

    def _expected_drain(self, engine: EngineState, now: float) -> float | None:
        """How long *engine*'s running steps are expected to take yet: its measured mean step
        less the time the newest of them has run (0: idle; None: busy, never measured)."""
        started = [job.dispatched for job in self.running.values()
                   if job.model == engine.name and job.dispatched is not None]
        if not started:
            return 0.0
        times = self.step_times.get(engine.name)
        if not times:
            return None
        return max(sum(times) / len(times) - (now - max(started)), 0.0)  # the newest ends last

    def _cost_rank(self, engine: EngineState, now: float) -> tuple[bool, int]:
        """Its expected cost in whole seconds (an unknown drain last): two models' loads a few
        tenths apart are noise, and then the least recently used goes first."""
        cost = self._reload_cost(engine, now)
        return cost.drain_s is None, math.floor(cost.cost)

    def _freeing_on(self, device: int) -> int:
        """Memory of engines on their way out: draining, stopping, or exited and not yet released."""
        return sum(self.ledger.held_on(e.name, device) for e in self.engines.values()
                   if self.ledger.releasing(e.name) or e.status in (EngineStatus.STOPPING, EngineStatus.DRAINING))

    def _evict(self, victim: EngineState, now: float, *, for_what: str, need: int, free: int,
               for_job: int | None = None) -> None:
        victim.status = EngineStatus.DRAINING
        victim.drained_for = for_job if for_job is not None else for_what if for_what in self.engines else None
        self._emit("evict", "info", engine=victim.name, memory=self.ledger.held(victim.name),
                   for_engine=for_what, need=need, free=free, in_flight=victim.in_flight,
                   idle_s=_round(now - victim.last_used), hot=victim.hot(now, self.policy.hot_window),
                   devices=list(self._devices_of(victim)), why=_evict_why(for_what, need, free),
                   **self._reload_cost(victim, now).fields())
        if victim.in_flight == 0:
            self._stop(victim)

    def _load(self, engine: EngineState, placement: Placement, now: float, reason: LoadReason) -> None:
        restart = engine.status is EngineStatus.FAILED
        waking = engine.status is EngineStatus.SLEEPING
        if waking:
            self.ledger.resize(engine.name, placement.share)  # the rest of its memory
        else:
            self.ledger.reserve(engine.name, placement.share)
            engine.pid = None  # a new process; a waking one keeps its own
        engine.placement = placement
        engine.generation += 1
        engine.status = EngineStatus.STARTING
        engine.start_decided_at = now
        engine.waking = waking
        engine.ready_at = None
        engine.measured = 0
        self._emit("restart" if restart else "wake" if waking else "load", "info",
                   engine=engine.name, memory=engine.profile.memory,
                   reserved=self.ledger.reserved, free=self.ledger.free, reason=reason.code,
                   generation=engine.generation, devices=list(placement.devices),
                   per_device=list(placement.share.values()), why=reason.words,
                   where=_where(placement))
        self._effects.append(StartEngine(engine.name, engine.generation, placement))

    def _devices_of(self, engine: EngineState) -> tuple[int, ...]:
        """Where it holds memory now, else where it was placed last."""
        if share := self.ledger.shares.get(engine.name):
            return tuple(sorted(share))
        return engine.placement.devices if engine.placement is not None else ()

    def _pinned_elsewhere(self, model: str) -> dict[int, int]:
        """Per device, what the other pinned engines hold (or, on one device, will)."""
        taken: dict[int, int] = {}
        for engine in self.engines.values():
            if engine.profile.pinned and engine.name != model:
                share = self.ledger.shares.get(engine.name)
                if share is None and len(self.ledger.budgets) == 1:
                    share = {0: engine.profile.memory}
                for device, nbytes in (share or {}).items():
                    taken[device] = taken.get(device, 0) + nbytes
        return taken

    def _undo_stale_drains(self) -> None:
        """A drain whose reason is gone is undone while the engine still serves (rule 8: a
        client that leaves while waiting never causes an unload)."""
        for engine in self.engines.values():
            cause = engine.drained_for
            if engine.status is not EngineStatus.DRAINING or cause is None:
                continue
            if isinstance(cause, int):
                stale = cause not in self.waiting and cause not in self.running
                gone = f"exclusive job {cause} no longer waits"
            else:
                target = self.engines.get(cause)
                stale = target is None or (target.status is not EngineStatus.STARTING and not target.requested
                                           and not any(self.queues[klass].count(cause) for klass in CLASSES))
                gone = f"nobody waits for {cause!r} any more"
            if stale:
                engine.status, engine.drained_for = EngineStatus.READY, None
                self._emit("evict_undone", "info", engine=engine.name, in_flight=engine.in_flight, why=gone)

    def _stop(self, engine: EngineState) -> None:
        engine.status = EngineStatus.STOPPING
        engine.drained_for = None
        engine.outside_baseline = self.outside_memory
        self._emit("stop", "info", engine=engine.name, generation=engine.generation)
        self._effects.append(StopEngine(engine.name, engine.generation))

    def _release(self, engine: EngineState) -> int:
        engine.outside_baseline = None
        return self.ledger.release(engine.name)

    def _restart_unhealthy(self, now: float) -> None:
        for engine in self.engines.values():
            if (engine.serving and engine.unhealthy_since is not None
                    and now >= engine.unhealthy_since + self.policy.recover_timeout):
                self._emit("engine_restart", "error", engine=engine.name, reason="unhealthy",
                           unhealthy_s=_round(now - engine.unhealthy_since), in_flight=engine.in_flight)
                engine.restarting_unhealthy = True
                self._stop(engine)

    def _may_idle_unload(self, engine: EngineState) -> bool:
        """Ready, idle, unloadable when idle, and nothing waits for it (then it is not idle)."""
        return (engine.profile.idle_unload is not None and not engine.profile.pinned
                and engine.status is EngineStatus.READY and engine.in_flight == 0
                and not self._demand(engine.name))

    def _unload_idle(self, now: float) -> None:
        # Decided here, in the actor, like every other stop: a request that arrives first
        # keeps the engine; one that arrives after waits for the stop and loads it again.
        for engine in self.engines.values():
            if self._may_idle_unload(engine) and now >= engine.last_used + engine.profile.idle_unload:  # type: ignore[operator]
                self._emit("idle_unload", "info", engine=engine.name, idle_s=_round(now - engine.last_used),
                           idle_unload_s=engine.profile.idle_unload)
                self._stop(engine)
                engine.idle_unloaded_at = now
                self.warm_cause = WarmCause.IDLE_UNLOAD

    def _release_overdue(self, now: float) -> None:
        for name, deadline in list(self.ledger.awaiting_free.items()):
            if now >= deadline:
                released = self._release(self.engines[name])
                self._emit("release_timeout", "warning", engine=name, released=released,
                           timeout_s=self.policy.release_timeout, free=self.ledger.free)

    # ---- warming (rule 10) ----------------------------------------------------------

    def _warm(self, now: float, promised: dict[int, int]) -> None:
        """Load the likeliest needed engine that fits in free memory, while nothing waits."""
        cause = self.warm_cause
        if cause is None:
            return
        if self.closing:
            self.warm_cause = None
            return
        if (self.waiting or self.exclusive_holder is not None or self._window_open(now)
                or any(e.warming for e in self.engines.values())):
            return  # batch work, one load at a time: it goes on in the next idle moment
        may_warm = [e for e in self.engines.values()
                    if not e.profile.pinned and not e.requested and e.status is not EngineStatus.SLEEPING
                    and not e.idle_since_unload and self._may_start(e, now)]
        for rank, choice in enumerate(warm_order(may_warm, self.policy.warm, now, self.policy.hot_window), 1):
            engine = self.engines[choice.engine]
            option = self._place(engine, now, promised, {}, NO_DEMAND, idle_only=True)
            if option is not None and option.fits:
                self._emit("warm", "info", **choice.fields(cause, rank))
                engine.last_interactive = -math.inf  # loaded for no one: cold until a step runs on it
                self._load(engine, option.placement, now, LoadReason("warm", choice.why(cause, rank)))
                engine.warm_generation = engine.generation
                return
        if not any(e.draining or self.ledger.releasing(e.name) for e in self.engines.values()):
            self.warm_cause = None  # nothing more fits, and no memory is on its way out to make room

    def _cancel_warm(self, now: float) -> None:
        """A warm load still starting gives way to real work that needs its memory."""
        for engine in self.engines.values():
            if engine.warming and not self._demand(engine.name) and (needer := self._warm_in_the_way(engine, now)):
                what = "an image job" if needer == "exclusive" else repr(needer)
                self._emit("warm_cancelled", "info", engine=engine.name, generation=engine.generation,
                           for_engine=needer, why=f"{what} needs its memory; it was loaded for no one")
                self._stop(engine)

    def _warm_in_the_way(self, warm: EngineState, now: float) -> str | None:
        """What real work needs the memory of the warm load *warm*: an engine to load, or
        'exclusive' (a waiting exclusive job); None: nothing."""
        devices = set(self._devices_of(warm))
        if (rank := self._exclusive_rank()) is not None and DEFAULT_DEVICE in devices:
            job = self.queues[CLASSES[rank]].head()
            unreserved = self.ledger.budgets[DEFAULT_DEVICE] - self.ledger.reserved_on(DEFAULT_DEVICE)
            if job is not None and job.exclusive_memory > unreserved + self._freeing_on(DEFAULT_DEVICE):
                return "exclusive"
        wanted = {head.model for queue in self.queues.values() for head in queue.heads() if head.model is not None}
        wanted |= {e.name for e in self.engines.values() if e.profile.pinned or e.requested}
        for name in sorted(wanted - {warm.name}):
            engine = self.engines[name]
            if not self._may_start(engine, now):
                continue  # loaded or loading already, or not yet loadable
            option = self._place(engine, now, {}, {}, NO_DEMAND, idle_only=False)
            # victims == []: memory on its way out is enough for it already.
            if option is not None and not option.fits and option.victims != [] and devices & set(option.needs):
                return name
        return None

    # ---- exclusive jobs -------------------------------------------------------------

    def _exclusive_rank(self) -> int | None:
        for rank, klass in enumerate(CLASSES):
            head = self.queues[klass].head()
            if head is not None and head.exclusive:
                return rank
        return None

    def _advance_exclusive(self, job: Job, now: float, wanted: dict[str, Demand]) -> None:
        """Drain and unload what the job needs, then grant it the GPU (rule 8)."""
        rank = RANK[job.klass]
        need = job.exclusive_memory
        # Outside use is not held against the job: the service that runs it (ComfyUI keeps
        # its models cached between jobs) is itself "outside" steward's engines. Only the
        # engines on its device make room for it.
        device = DEFAULT_DEVICE
        unreserved = self.ledger.budgets[device] - self.ledger.reserved_on(device)
        if self.exclusive_holder is None and need > unreserved + self._freeing_on(device):
            candidates = [e for e in self.engines.values()
                          if e.status is EngineStatus.READY and self.ledger.held_on(e.name, device)
                          and wanted.get(e.name, NO_DEMAND)[0] >= rank]
            candidates.sort(key=lambda e: (e.profile.pinned, e.in_flight > 0, self._cost_rank(e, now), e.last_used))
            gain = unreserved + self._freeing_on(device)
            for candidate in candidates:
                if gain >= need:
                    break
                gain += self.ledger.held_on(candidate.name, device)
                self._evict(candidate, now, for_what="exclusive", need=need, free=unreserved, for_job=job.id)
        still_running = sum(self.running_by_class[k] for k in CLASSES[rank:])
        if self.exclusive_holder is None and still_running == 0 and need <= unreserved:
            self._unqueue(job)
            self.ledger.reserve(_exclusive_owner(job.id), {device: need}, count_outside=False)
            job.dispatched = now
            self.running[job.id] = job
            self.running_by_class[job.klass] += 1
            self.progress[job.klass] = now
            self.exclusive_holder = job.id
            self._emit("dispatch", "info", job=job.id, request=job.request, model=None, **{"class": job.klass},
                       step="1/1", waited_s=_round(now - job.submitted), exclusive=True, memory=need)
            self._effects.append(Grant(job.id, None, None))

    # ---- bookkeeping ----------------------------------------------------------------

    def _expire(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            _, job_id = heapq.heappop(self._deadlines)
            job = self.waiting.get(job_id)
            if job is None:
                continue
            self._unqueue(job)
            self._emit("timeout", "warning", job=job.id, model=job.model, **{"class": job.klass},
                       waited_s=_round(now - job.submitted))
            self._effects.append(Fail(job.id, 503, "queue_timeout",
                                      f"no capacity for {self._what(job)} within {job.deadline - job.submitted:g}s",
                                      retry_after=1.0))
        for engine in self.engines.values():
            if engine.status is not EngineStatus.FAILED:
                continue
            for klass in CLASSES:
                for job in [j for j in self.queues[klass].line(engine.name) if engine.retry_at > j.deadline]:
                    self._unqueue(job)
                    self._fail(job, 503, "engine_failed", f"engine {engine.name!r} failed and restarts in "
                               f"{engine.retry_at - now:.1f}s", retry_after=engine.retry_at - now,
                               reason="engine_failed")

    def _update_mode(self, now: float) -> None:
        if self.exclusive_holder is not None:
            mode = "exclusive"
        elif self._window_open(now) or self.queues["interactive"].size:
            mode = "interactive"
        elif self.running_by_class["background"]:
            mode = "background"
        elif self.running_by_class["batch"]:
            mode = "batch"
        else:
            mode = "idle"
        if mode != self.mode:
            self._emit("mode", "debug", gpu=mode, previous=self.mode)  # frequent: the terminal shows loads and requests
            self.mode = mode

    def _unqueue(self, job: Job) -> None:
        del self.waiting[job.id]
        self.queues[job.klass].remove(job)
        if self.guard[job.klass] == job.id and job.id not in self.running:
            self.guard[job.klass] = None

    def _removed(self, model: str) -> bool:
        retiring = self.engines[model].retiring
        return retiring is not None and retiring.replacement is None

    def _demand(self, model: str) -> bool:
        return any(q.count(model) for q in self.queues.values())

    def _need(self, model: str | None, exclusive_memory: int | None) -> int:
        if model is None:
            return self.ledger.budgets[DEFAULT_DEVICE] if exclusive_memory is None else exclusive_memory
        return self.engines[model].profile.memory if model in self.engines else 0

    def _what(self, job: Job) -> str:
        return "an exclusive job" if job.exclusive else f"model {job.model!r}"

    def _refuse(self, job: Job, status: int, code: str, message: str, retry_after: float | None = None,
                ) -> list[Effect]:
        self._fail(job, status, code, message, retry_after=retry_after, reason=code)
        return self._flush()

    def _fail(self, job: Job, status: int, code: str, message: str, *, retry_after: float | None,
              reason: str) -> None:
        self._emit("reject", "warning", job=job.id, model=job.model, **{"class": job.klass}, reason=reason)
        self._effects.append(Fail(job.id, status, code, message, retry_after=retry_after))

    def _emit(self, event: str, level: str, **fields: object) -> None:
        self._effects.append(Emit(event, level, fields))

    def _flush(self) -> list[Effect]:
        effects, self._effects = self._effects, []
        return effects


def _where(placement: Placement) -> str | None:
    """Where a load goes, in words, when there was a choice (a host with several devices)."""
    if not placement.chosen:
        return None
    devices = placement.devices
    return f"device {devices[0]}" if len(devices) == 1 else f"devices {', '.join(map(str, devices))} (split)"


def _evict_why(for_what: str, need: int, free: int) -> str:
    if for_what == "exclusive":
        return "an image job needs the GPU"
    if for_what == "reload":
        return "its model was changed or removed in the config"
    if for_what == "admin":
        return "an admin unloaded it"
    return f"to make room for {for_what} (needs {format_size(need)}, {format_size(max(0, free))} free)"


def _exclusive_owner(job_id: int) -> str:
    return f"exclusive:{job_id}"


def _round(seconds: float) -> float:
    return round(seconds, 6)
