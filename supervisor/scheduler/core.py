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
   first of its waiting jobs that can actually run now, not simply the oldest, its turns
   shared round-robin among the class's models that wait (the model whose last turn is the
   oldest first, never had one: first; the oldest request on a tie): one client's many
   steps for one model (an indexer's embeddings) do not take every turn. Beside
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
   The job pauses hot_window's clock of the engines it evicted while hot: when it ends, each
   is hot again for the time it had left (a `hot_resumed` event), so the chat model that was
   hot before an image job is not the first thing a batch request evicts after it.
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
   step runs on it, it counts as cold (but one an exclusive job evicted while hot keeps the
   hot time it had left, rule 8) and as costing nothing to evict (ReloadCost.unused_warm):
   it was loaded for no one, so any class may evict it, first, and no load is held for it
   (rule 9); the free memory it took would have been theirs.
11. Fallback (``models.NAME.fallback``): a waiting request of one step whose model's chain
   has a route for its class goes to that route's model when one of the route's ``when``
   holds (its model has no room without evictions its class may not make, its predicted
   wait passes the class's slo_wait or the route's bound, its engine failed), if that model
   may serve it sooner and its key may use it; once, never along the fallback's own chain
   (supervisor/scheduler/fallback.py).

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

Where each rule lives (each module's docstring says more):
- core.py, this module: the facade; the core's inputs over its state, the order a decision
  applies the rules in (``Scheduler._decide``), next_wakeup and the snapshot.
- state.py: what the core owns (``CoreState``), and the reads and moves every rule shares.
- jobs.py: a step queued, refused, withdrawn, timed out or finished (rules 1, 2).
- classes.py: an open class served, one engine at a time between chats (rules 1, 3c, 7).
- guard.py: the window's gate and the starvation guard (rules 3, 4 to 4d).
- gaps.py: gap steps (rule 3b).
- eviction.py: where a load goes and what it evicts (rules 5, 6; Victims).
- swaps.py: swap holds (rule 9).
- exclusive.py: exclusive jobs (rule 8).
- warming.py: loads ahead of demand (rule 10).
- fallback.py: a waiting request sent along its model's fallback chain (rule 11).
- lifecycle.py, memory.py, reload.py: the engines' reports, health and idle unloads; memory
  readings and releases; config reloads.
- explain.py: why a step waits, in words, from the same predicates.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import attrs

from supervisor.address import Address
from supervisor.scheduler import classes, eviction, fallback, guard, jobs, lifecycle, memory, reload, warming
from supervisor.scheduler.eviction import ADMIN, PINNED, admin_option, carry_out
from supervisor.scheduler.exclusive import advance_exclusive, exclusive_owner, exclusive_rank
from supervisor.scheduler.explain import explain
from supervisor.scheduler.gaps import serve_gap, short
from supervisor.scheduler.ledger import Ledger
from supervisor.scheduler.state import CoreState, Demand, rounded
from supervisor.scheduler.swaps import load_or_make_room
from supervisor.request_class import ALL_CLASSES, LOWER_CLASSES, RequestClass
from supervisor.scheduler.types import (
    DeviceSnapshot,
    DeviceUse,
    Effect,
    EngineAction,
    EngineProfile,
    EngineSnapshot,
    EngineState,
    EngineStatus,
    Job,
    LineSnapshot,
    ReloadCost,
    SchedulerSnapshot,
    SchedulingPolicy,
)


@attrs.define
class Scheduler(CoreState):
    """The decision core: its state, and one method per input, each returning the effects."""

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

    def submit(self, job_id: int, model: str | None, klass: RequestClass | str, now: float, *, seq: int | None = None,
               request: int | None = None, step: int = 1, steps: int = 1, exclusive_memory: int | None = None,
               timeout: float | None = None, handoff: tuple[int, int | None] | None = None,
               may_use: frozenset[str] | None = None) -> list[Effect]:
        """Queue one step of *klass* (a RequestClass, or its name). *model* None asks for the GPU
        itself (an exclusive job).

        *handoff* is (job id, status) of the request's previous step, finished in the same
        decision, so its slot goes to this step and not to a newer request. *may_use*: the models
        its caller's key may use (None: any), which a fallback stays within.
        """
        if handoff is not None:
            jobs.finish(self, *handoff, now)
        queued = jobs.submit(self, job_id, model, RequestClass(klass), now, seq=seq, request=request, step=step,
                             steps=steps, exclusive_memory=exclusive_memory, timeout=timeout, may_use=may_use)
        return self._decide(now) if queued else self.flush()

    def close(self, now: float) -> list[Effect]:
        """Shutdown began: requests that have not started are answered 503 now and new ones
        are refused, so that only work already running holds the drain open. Running steps,
        and the later steps of a request already under way, go on."""
        jobs.close(self)
        return self._decide(now)

    def finish(self, job_id: int, now: float, status: int | None = None) -> list[Effect]:
        """The handler is done with a step: it completed, failed, or the client left.

        *status* is what the client was answered (HTTP status), for the log only.
        """
        jobs.finish(self, job_id, status, now)
        return self._decide(now)

    def engine_spawned(self, name: str, generation: int, pid: int, now: float) -> list[Effect]:
        """The engine's process exists: its memory in GPU readings is its own, not outside use."""
        lifecycle.engine_spawned(self, name, generation, pid)
        return self.flush()

    def engine_ready(self, name: str, generation: int, endpoint: Address, now: float,
                     pid: int | None = None) -> list[Effect]:
        return self._decide_if(lifecycle.engine_ready(self, name, generation, endpoint, now, pid), now)

    def engine_exited(self, name: str, generation: int, now: float, detail: str) -> list[Effect]:
        return self._decide_if(lifecycle.engine_exited(self, name, generation, now, detail), now)

    def engine_asleep(self, name: str, generation: int, now: float, detail: str) -> list[Effect]:
        """An engine told to stop was put to sleep instead: its process stays, holding less."""
        return self._decide_if(lifecycle.engine_asleep(self, name, generation, now, detail), now)

    def engine_load(self, name: str, generation: int, running: int | None, waiting: int | None,
                    kv_usage: float | None = None) -> list[Effect]:
        """The engine's own account of its queue and KV cache: kept for the snapshot, decides nothing."""
        lifecycle.engine_load(self, name, generation, running, waiting, kv_usage)
        return self.flush()

    def cache_saved(self, name: str, generation: int, seconds: float) -> list[Effect]:
        """Its slots' save (keep_cache) took *seconds* before its stop: it decides nothing now."""
        lifecycle.engine_cache_saved(self, name, generation, seconds)
        return self.flush()

    def engine_checked(self, name: str, generation: int, now: float, problem: str | None) -> list[Effect]:
        """The result of one health check of a ready engine: *problem* None if it answered."""
        return self._decide_if(lifecycle.engine_checked(self, name, generation, now, problem), now)

    def engine_stalled(self, name: str, generation: int, now: float, detail: str) -> list[Effect]:
        """A request on the engine got no byte within its timeout: check the engine now."""
        lifecycle.engine_stalled(self, name, generation, detail)
        return self.flush()

    def observe(self, now: float, used: int, processes: dict[int, int]) -> list[Effect]:
        """A reading of a host with one device (see ``observe_devices``)."""
        return self.observe_devices(now, [DeviceUse(used, processes)])

    def observe_devices(self, now: float, readings: Sequence[DeviceUse]) -> list[Effect]:
        """A memory reading of every device: its total use, and the per-process list (memory.py)."""
        memory.observe_devices(self, now, readings)
        return self._decide(now)

    def kept_process(self, name: str, pid: int | None, now: float) -> list[Effect]:
        """The engine's kept service process started (*pid*) or ended (None) (memory.py)."""
        return self._decide_if(memory.kept_process(self, name, pid, now), now)

    def service_memory(self, name: str, generation: int, nbytes: int, now: float) -> list[Effect]:
        """A service's own account of the memory it holds now (Ollama's /api/ps)."""
        return self._decide_if(memory.service_memory(self, name, generation, nbytes), now)

    def control(self, name: str, action: EngineAction, now: float) -> tuple[str | None, list[Effect]]:
        """An admin's load, unload, pin or unpin of engine *name*: None, or why it cannot be done now."""
        problem = lifecycle.control(self, name, action, now)
        return problem, self._decide(now)

    def add_engine(self, profile: EngineProfile, now: float, *, load_s: float | None = None) -> list[Effect]:
        """A reload added a model (its engine task exists already); *load_s*: its load time
        measured before (the state file), as ``create``'s load_times."""
        reload.add_engine(self, profile, load_s)
        return self._decide(now)

    def retire_engine(self, name: str, replacement: EngineProfile | None, now: float) -> list[Effect]:
        """A reload removed (*replacement* None) or changed a model: no new work for its engine,
        the steps on it finish, then it stops and its task is retired. Steps waiting for a
        removed model are answered 404 now; those for a changed one wait for the new engine."""
        reload.retire_engine(self, name, replacement)
        return self._decide(now)

    def engine_replaced(self, name: str, now: float) -> list[Effect]:
        """The changed model's new engine task runs: the next load is the new config's."""
        reload.engine_replaced(self, name)
        return self._decide(now)

    def replace_policy(self, policy: SchedulingPolicy, now: float) -> list[Effect]:
        self.policy = policy
        return self._decide(now)

    def tick(self, now: float) -> list[Effect]:
        """Time passed: deadlines, backoffs, the window and starvation clocks may have come due."""
        return self._decide(now)

    # ---- queries ------------------------------------------------------------------

    def next_wakeup(self) -> float | None:
        """The next time at which a decision may change with no other input."""
        times = []
        if (deadline := jobs.next_deadline(self)) is not None:
            times.append(deadline)
        times += fallback.next_times(self)
        times += self.ledger.awaiting_free.values()
        for engine in self.engines.values():
            if engine.status is EngineStatus.FAILED and (engine.profile.pinned or self.queued_for(engine.name)):
                times.append(engine.retry_at)
            if engine.unhealthy_since is not None and engine.serving:
                times.append(engine.unhealthy_since + self.policy.recover_timeout)
            if lifecycle.may_idle_unload(self, engine):
                times.append(engine.last_used + engine.profile.idle_unload)  # type: ignore[operator]
        if self.running_by_class[RequestClass.INTERACTIVE] == 0:
            times.append(self.last_interactive_end + self.policy.interactive_window)
        if self.policy.lower_class_engines > 0 and any(self.queues[k].size for k in LOWER_CLASSES):
            times.append(self.hot_until())  # rule 3c ends then
        for queue in self.queues.values():
            for head in queue.heads():
                times.append(head.next_report)
                if head.held_until is not None:
                    times.append(head.held_until)  # the hold ends: the load is decided then
        for klass in LOWER_CLASSES:
            if self.policy.gap_step > 0:  # when a short line the guard passes over is left to the gaps no more
                left_for = self.policy.starvation[klass] + self.policy.guard_gap_wait
                times += [h.submitted + left_for for h in self.queues[klass].heads()
                          if h.model is not None and short(self, h.model)]
            start = guard.starved_since(self, klass)
            if start is not None and self.policy.starvation[klass] > 0:
                due = guard.lane_due_at(self, start, klass)
                times += [due, due + self.policy.guard_gap_wait]
        future = [t for t in times if t > self.now]
        return min(future, default=None)

    def lane_class(self) -> RequestClass | None:
        """The lower class whose guard turn holds the lane beside interactive work, if any."""
        return guard.lane_class(self)

    def lower_engines_full(self, klass: RequestClass | str, model: str | None, now: float) -> bool:
        """Rule 3c: whether *model* is past ``lower_class_engines`` for *klass* (classes.py)."""
        return classes.lower_engines_full(self, RequestClass(klass), model, now)

    def lower_class_busy(self) -> set[str]:
        """The engines background or batch steps compute on, or a guard turn's first step waits for."""
        return classes.lower_class_busy(self)

    def reload_cost(self, engine: EngineState, now: float) -> ReloadCost:
        """What evicting *engine* now is expected to cost (the `evict` event's figures)."""
        return eviction.reload_cost(self, engine, now)

    def snapshot(self, *, explained: bool = False) -> SchedulerSnapshot:
        """The state for views; *explained*: with why each line's head waits (it costs a placement
        per line, so only views that show it ask)."""
        devices = tuple(self._device_snapshot(device) for device in self.ledger.devices)
        return SchedulerSnapshot(
            budget=self.ledger.budget, reserved=self.ledger.reserved, outside=sum(d.outside for d in devices),
            mode=self.mode,
            queued=len(self.waiting),
            queued_by_class={k: q.size for k, q in self.queues.items()},
            running_by_class=dict(self.running_by_class),
            releasing=len(self.ledger.awaiting_free),
            exclusive_waiting=sum(1 for job in self.waiting.values() if job.exclusive),
            lines=tuple(self._line_snapshot(line, explained) for queue in self.queues.values()
                        for line in queue.lines.values()),
            devices=devices,
            engines=tuple(self._engine_snapshot(e) for e in self.engines.values()))

    def _device_snapshot(self, device: int) -> DeviceSnapshot:
        budget, reserved = self.ledger.budgets[device], self.ledger.reserved_on(device)
        outside = self.ledger.outside_by_device[device]
        holder = self.exclusive_holder
        if holder is not None and self.ledger.held_on(exclusive_owner(holder), device):
            # The image job's own process (ComfyUI) is outside use to the readings, and within
            # what is reserved for the job: shown once, or the tiers add up past the card.
            outside = min(outside, max(0, budget - reserved))
        return DeviceSnapshot(device, budget, reserved, outside)

    def _engine_snapshot(self, e: EngineState) -> EngineSnapshot:
        hot = e.hot(self.now, self.policy.hot_window)
        return EngineSnapshot(
            # A draining engine still serves its steps: shown as ready, with draining set.
            name=e.name, status=EngineStatus.READY if e.status is EngineStatus.DRAINING else e.status,
            in_flight=e.in_flight, slots=e.profile.slots, memory=e.profile.memory, reserved=self.ledger.held(e.name),
            draining=e.draining, pinned=e.profile.pinned, hot=hot,
            queued=sum(q.count(e.name) for q in self.queues.values()), failures=e.failures,
            healthy=not e.unhealthy, measured=e.measured, engine_running=e.reported_running,
            engine_waiting=e.reported_waiting, engine_kv_usage=e.reported_kv_usage, devices=self.devices_of(e),
            held=dict(self.ledger.shares.get(e.name, {})), generation=e.generation, last_used=e.last_used,
            hot_until=e.last_interactive + self.policy.hot_window if hot else None)

    def _line_snapshot(self, line: list[Job], explained: bool) -> LineSnapshot:
        head = line[0]
        if not explained:
            return LineSnapshot(head.model, head.klass, len(line), head.submitted)
        wait = explain(self, head)
        return LineSnapshot(head.model, head.klass, len(line), head.submitted, wait.reason.value, wait.why)

    # ---- the decision ---------------------------------------------------------------

    def _decide_if(self, news: bool, now: float) -> list[Effect]:
        """Decide after an engine's report, unless it was stale (then nothing changed)."""
        return self._decide(now) if news else self.flush()

    def _decide(self, now: float) -> list[Effect]:
        """One decision: the housekeeping of every rule, then the pinned and admin loads, then
        each class in order, the guard's turn and the gap steps before the lower classes, an
        exclusive job where it blocks, and warming last."""
        self.now = now
        jobs.expire(self, now)
        lifecycle.undo_stale_drains(self)
        memory.release_overdue(self, now)
        lifecycle.restart_unhealthy(self, now)
        lifecycle.unload_idle(self, now)
        guard.drop_stale_guards(self)
        reload.advance_retirements(self, now)
        warming.cancel_warm(self, now)
        fallback.reroute(self, now)
        promised: dict[int, int] = {}  # per device: memory that loads decided earlier in this pass wait for
        wanted: dict[str, Demand] = guard.turn_engines(self)  # earliest demand per engine seen so far
        blocked_from = exclusive_rank(self)
        if blocked_from is None and self.exclusive_holder is None:
            for engine in self.engines.values():
                if engine.profile.pinned and self.may_start(engine, now):
                    load_or_make_room(self, engine, now, promised, wanted, (0, -1), PINNED)
                elif engine.requested and self.may_start(engine, now):
                    if (option := admin_option(self, engine, now, promised)) is not None:
                        carry_out(self, engine, option, now, promised, ADMIN)
        turn = guard.guard_turn(self, now)
        claimed, self.turns.claim = self.turns.claim, None  # decided afresh: only the turn due now claims
        for klass in ALL_CLASSES:
            queue, rank = self.queues[klass], klass.rank
            if klass is RequestClass.BACKGROUND:  # interactive work is served: the lower classes' moments
                guard.serve_turn_first(self, now, turn, blocked_from, promised, wanted, claimed)
                if blocked_from is None and self.exclusive_holder is None:
                    serve_gap(self, now)
            if blocked_from is not None and rank >= blocked_from:
                if rank == blocked_from:
                    advance_exclusive(self, queue.head(), now, wanted)  # type: ignore[arg-type]
                break
            if queue.size:
                gate = guard.gate(self, klass, now, turn)
                if gate is guard.Gate.OPEN:
                    classes.serve_class(self, klass, now, promised, wanted)
                else:
                    guard.serve_guard(self, klass, now, promised, wanted, may_start_new=gate is guard.Gate.GUARD)
            for head in queue.heads():
                if head.model is not None:
                    wanted.setdefault(head.model, (rank, head.seq))
        warming.warm(self, now, promised)
        classes.update_mode(self, now)
        self._report_waits(now)
        return self.flush()

    def _report_waits(self, now: float) -> None:
        """Say why the head of each line waits, once it has waited a while, then at growing intervals."""
        for queue in self.queues.values():
            for head in queue.heads():
                if now >= head.next_report:
                    wait = explain(self, head)
                    self.emit("waiting", "info", job=head.id, request=head.request, model=head.model,
                              **{"class": head.klass}, waited_s=rounded(now - head.submitted),
                              behind=queue.count(head.model) - 1, reason=wait.reason.value, why=wait.why)
                    head.next_report = head.submitted + 2 * (now - head.submitted)
