"""The async shell around the decision core: one task owns all scheduling state.

Handlers, engine supervisors and the GPU probe only send messages through a
``SchedulerClient``; the actor applies each to the pure core and carries out the
effects it returns.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import ClassVar, Protocol

import attrs
import trio

from supervisor.address import Address
from supervisor.observe.events import EventLog
from supervisor.scheduler.core import Scheduler
from supervisor.scheduler.readiness import Readiness, model_readiness
from supervisor.request_class import RequestClass
from supervisor.scheduler.types import (
    CheckEngine,
    DeviceUse,
    Effect,
    Emit,
    EngineAction,
    EngineProfile,
    Fail,
    Grant,
    Measured,
    Placement,
    RetireEngine,
    Revoke,
    SchedulerSnapshot,
    SchedulingPolicy,
    StartEngine,
    StopEngine,
)


class StepAccount(Protocol):
    """Who is told what a step cost: its wait for a grant, and how long it held what it was
    granted (an engine's slot, or the whole GPU for an exclusive job). A request's steps add up."""

    def waited(self, seconds: float) -> None: ...

    def held(self, seconds: float) -> None: ...


class EngineControl(Protocol):
    def start(self, generation: int, placement: Placement | None = None) -> None: ...
    def stop(self, generation: int) -> None: ...
    def check(self, generation: int) -> None: ...


class JobFailed(Exception):
    """The scheduler refused or gave up on a job; ``failure`` says why."""

    def __init__(self, failure: Fail) -> None:
        super().__init__(failure.message)
        self.failure = failure


@attrs.define(eq=False)
class Abort:
    """Lets the scheduler end a granted step whose engine went bad: the handler's relay
    (which runs inside ``scope``) stops and answers with ``reason``."""

    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    reason: str | None = None
    code: ClassVar[str] = "engine_unhealthy"  # the only reason the scheduler revokes a step

    def __call__(self, reason: str) -> None:
        self.reason = reason
        self.scope.cancel(reason=reason)


@attrs.define(eq=False)
class Ticket:
    """The one-shot reply to a submitted step (written once by the actor)."""

    job_id: int
    done: trio.Event = attrs.Factory(trio.Event)
    outcome: Grant | Fail | None = None
    abort: Abort = attrs.Factory(Abort)


@attrs.define(eq=False)
class Request:
    """A client request's place in line; all its steps share it."""

    id: int
    seq: int
    # A finished step whose slot passes straight to the request's next step: its
    # Finish travels with the next Submit, so no newer request can take the slot between.
    handoff: tuple[int, int | None] | None = None


@attrs.frozen
class Submit:
    ticket: Ticket
    model: str | None
    klass: RequestClass
    request: Request
    step: int
    steps: int | None  # None: not known until the request ends (a generation cut into chunks)
    exclusive_memory: int | None
    handoff: tuple[int, int | None] | None  # (job id, status) of the request's previous step
    may_use: frozenset[str] | None = None  # the models its key may use (None: any): a fallback stays within


@attrs.frozen
class Finish:
    job_id: int
    status: int | None  # what the client got, for the log; None if it never got a grant


@attrs.frozen
class EngineSpawned:
    engine: str
    generation: int
    pid: int


@attrs.frozen
class EngineReady:
    engine: str
    generation: int
    endpoint: Address
    pid: int | None


@attrs.frozen
class EngineAsleep:
    engine: str
    generation: int
    detail: str


@attrs.frozen
class EngineLoad:
    engine: str
    generation: int
    running: int | None
    waiting: int | None
    kv_usage: float | None = None


@attrs.frozen
class EngineExited:
    engine: str
    generation: int
    detail: str


@attrs.frozen
class CacheSaved:
    engine: str
    generation: int
    seconds: float  # its slots' save (keep_cache) took this long, after its drain, before its stop


@attrs.frozen
class KeptProcess:
    engine: str
    pid: int | None  # None: it ended


@attrs.frozen
class ServiceMemory:
    engine: str
    generation: int
    nbytes: int


@attrs.frozen
class EngineChecked:
    engine: str
    generation: int
    problem: str | None  # None: it answered its health check


@attrs.frozen
class EngineStalled:
    engine: str
    generation: int
    detail: str


@attrs.frozen
class MemoryReading:
    devices: tuple[DeviceUse, ...]  # index = device


@attrs.frozen
class Control:
    engine: str
    action: EngineAction
    answer: Callable[[str | None], None]  # told None when done, or why it cannot be done now


@attrs.frozen
class EngineAdded:
    profile: EngineProfile
    load_s: float | None = None  # measured before (the state file)


@attrs.frozen
class EngineRetiring:
    engine: str
    replacement: EngineProfile | None


@attrs.frozen
class EngineReplaced:
    engine: str


@attrs.frozen
class PolicyReplaced:
    policy: SchedulingPolicy


@attrs.frozen
class Close:
    """Shutdown began."""


Message = (Submit | Finish | EngineSpawned | EngineReady | EngineExited | EngineAsleep | EngineLoad | EngineChecked
           | EngineStalled | CacheSaved | KeptProcess | ServiceMemory | MemoryReading | Control | EngineAdded | EngineRetiring | EngineReplaced
           | PolicyReplaced | Close)


@attrs.define(eq=False)
class Lease:
    """A granted step, held by its handler; ``status`` is what the client was answered."""

    grant: Grant
    abort: Abort
    status: int = 499  # stays so if the client goes away first


@attrs.define(eq=False)
class SchedulerClient:
    """What handlers, engine supervisors and the probe hold: a mailbox, never the state."""

    _send: trio.MemorySendChannel[Message]
    _snapshot: Callable[..., SchedulerSnapshot]
    # model -> whether it may be sent work now (readiness.py), read from the core as the snapshot is.
    _readiness: Callable[[str, float], Readiness | None] | None = None
    _ids: itertools.count[int] = attrs.Factory(lambda: itertools.count(1))

    @asynccontextmanager
    async def open_request(self) -> AsyncIterator[Request]:
        """A place in line for a request of several steps (``open_grant(..., request=...)``)."""
        number = next(self._ids)
        request = Request(number, number)
        try:
            yield request
        finally:
            if request.handoff is not None:
                self._post(Finish(*request.handoff))
                request.handoff = None

    @asynccontextmanager
    async def open_grant(self, model: str | None, klass: RequestClass, *, request: Request | None = None,
                         step: int = 1, steps: int | None = 1, exclusive_memory: int | None = None,
                         account: StepAccount | None = None,
                         may_use: frozenset[str] | None = None) -> AsyncIterator[Lease]:
        """Wait for a slot on *model*'s engine (or, with *model* None, for the GPU itself);
        hold it for the ``async with`` body.

        Leaving early (the client went away) withdraws the step from the queue; leaving
        after the grant frees the slot. Raises ``JobFailed`` on refusal. *account* is told how long
        the step waited, however the wait ended (the usage log's seconds queued): a granted step's
        wait on the scheduler's clock (0 when granted as it was taken: the dispatch event's
        ``waited_s``, so /healthz and the usage log say alike who waited), else as measured; and,
        once a granted step ends, how long it held its grant (the usage log's GPU-seconds).
        *may_use*: the models its caller may use (None: any); a fallback (scheduler rule 11) stays
        within them, and the lease's ``grant.engine`` names the model that serves it.
        A step of a *request* hands its slot to the next (one that is not its last; any, with
        *steps* None: the last one's slot is freed when the request ends).
        """
        ticket = Ticket(next(self._ids))
        lease = None
        handoff = None
        if request is not None:
            handoff, request.handoff = request.handoff, None
        self._post(Submit(ticket, model, klass, request or Request(ticket.job_id, ticket.job_id), step,
                          steps, exclusive_memory, handoff, may_use))
        finished_cleanly = False
        submitted = trio.current_time()
        try:
            try:
                await ticket.done.wait()
            finally:
                if account is not None:
                    outcome = ticket.outcome
                    account.waited(outcome.waited_s if isinstance(outcome, Grant) else trio.current_time() - submitted)
            if isinstance(ticket.outcome, Fail):
                raise JobFailed(ticket.outcome)
            assert ticket.outcome is not None
            lease = Lease(ticket.outcome, ticket.abort)
            granted = trio.current_time()
            try:
                yield lease
            finally:
                if account is not None and not lease.grant.remote:  # a cloud's time is no GPU time here
                    account.held(trio.current_time() - granted)
            finished_cleanly = True
        finally:
            if isinstance(ticket.outcome, Fail):
                pass
            elif finished_cleanly and request is not None and (steps is None or step < steps):
                request.handoff = (ticket.job_id, lease.status if lease else None)
            else:
                self._post(Finish(ticket.job_id, lease.status if lease else None))

    def report_spawned(self, engine: str, generation: int, pid: int) -> None:
        self._post(EngineSpawned(engine, generation, pid))

    def report_ready(self, engine: str, generation: int, endpoint: Address, pid: int | None = None) -> None:
        self._post(EngineReady(engine, generation, endpoint, pid))

    def report_asleep(self, engine: str, generation: int, detail: str) -> None:
        self._post(EngineAsleep(engine, generation, detail))

    def report_load(self, engine: str, generation: int, running: int | None, waiting: int | None,
                    kv_usage: float | None = None) -> None:
        """What the engine says of its own queue and KV cache (vLLM's metrics, llama-server's
        /slots); shown, not decided on."""
        self._post(EngineLoad(engine, generation, running, waiting, kv_usage))

    def report_exited(self, engine: str, generation: int, detail: str) -> None:
        self._post(EngineExited(engine, generation, detail))

    def report_health(self, engine: str, generation: int, problem: str | None) -> None:
        self._post(EngineChecked(engine, generation, problem))

    def report_stall(self, engine: str, generation: int, detail: str) -> None:
        self._post(EngineStalled(engine, generation, detail))

    def report_cache_saved(self, engine: str, generation: int, seconds: float) -> None:
        """Its slots' save before its stop took *seconds*: what evicting it costs from now on."""
        self._post(CacheSaved(engine, generation, seconds))

    def report_kept_process(self, engine: str, pid: int | None) -> None:
        """The engine's kept service process started (its pid), or ended (None)."""
        self._post(KeptProcess(engine, pid))

    def report_service_memory(self, engine: str, generation: int, nbytes: int) -> None:
        self._post(ServiceMemory(engine, generation, nbytes))

    def report_memory(self, devices: Sequence[DeviceUse]) -> None:
        """A reading of every device (index = device)."""
        self._post(MemoryReading(tuple(devices)))

    async def control(self, engine: str, action: EngineAction) -> str | None:
        """An admin's action on *engine*, through the actor: None once done, else why not."""
        done, outcome = trio.Event(), []

        def answer(problem: str | None) -> None:
            outcome.append(problem)
            done.set()

        self._post(Control(engine, action, answer))
        await done.wait()
        return outcome[0]

    # A reload's changes (supervisor/reloader.py).
    def add_engine(self, profile: EngineProfile, load_s: float | None = None) -> None:
        self._post(EngineAdded(profile, load_s))

    def retire_engine(self, engine: str, replacement: EngineProfile | None) -> None:
        self._post(EngineRetiring(engine, replacement))

    def report_replaced(self, engine: str) -> None:
        self._post(EngineReplaced(engine))

    def replace_policy(self, policy: SchedulingPolicy) -> None:
        self._post(PolicyReplaced(policy))

    def close(self) -> None:
        """Shutdown began: waiting requests that have not started get 503, new ones too."""
        self._post(Close())

    def snapshot(self, *, explained: bool = False) -> SchedulerSnapshot:
        """*explained*: with why each line's head waits."""
        return self._snapshot(explained=explained)

    def readiness(self, model: str) -> Readiness | None:
        """Whether *model* may be sent work now (``/healthz/models/NAME``); None: no such model."""
        return None if self._readiness is None else self._readiness(model, trio.current_time())

    def _post(self, message: Message) -> None:
        try:
            self._send.send_nowait(message)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass  # the actor is gone: steward is shutting down


def open_scheduler_mailbox(core: Scheduler) -> tuple[SchedulerClient, trio.MemoryReceiveChannel[Message]]:
    """The actor's mailbox, made before the actor so engines can hold the client first."""
    send, receive = trio.open_memory_channel[Message](math.inf)
    return SchedulerClient(send, core.snapshot, functools.partial(model_readiness, core)), receive


async def serve_scheduler(core: Scheduler, mailbox: trio.MemoryReceiveChannel[Message],
                          engines: Mapping[str, EngineControl], events: EventLog, *,
                          on_measured: Callable[[str, int], None] | None = None,
                          on_retired: Callable[[str, bool], None] | None = None,
                          task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Own the scheduler state: apply each message to the core and carry out its effects.

    *on_measured* is told when an engine's measured memory replaces its estimate; *on_retired*
    when a reload's removed or changed engine has stopped and its task may go (replaced or not).
    """
    tickets: dict[int, Ticket] = {}  # submitted, not yet answered
    granted: dict[int, Ticket] = {}  # granted, not yet finished

    def perform(effects: list[Effect]) -> None:
        for effect in effects:
            match effect:
                case Emit(event, level, fields):
                    events.emit(event, level, **fields)
                case Grant(job_id) | Fail(job_id):
                    ticket = tickets.pop(job_id, None)
                    if ticket is not None:
                        ticket.outcome = effect
                        ticket.done.set()
                        if isinstance(effect, Grant):
                            granted[job_id] = ticket
                case Revoke(job_id, reason):
                    if (ticket := granted.get(job_id)) is not None:
                        ticket.abort(reason)
                case StartEngine(engine, generation, placement):
                    engines[engine].start(generation, placement)
                case StopEngine(engine, generation):
                    engines[engine].stop(generation)
                case CheckEngine(engine, generation):
                    engines[engine].check(generation)
                case Measured(engine, nbytes):
                    if on_measured is not None:
                        on_measured(engine, nbytes)
                case RetireEngine(engine, replaced):
                    if on_retired is not None:
                        on_retired(engine, replaced)

    def apply(message: Message) -> list[Effect]:
        now = trio.current_time()
        match message:
            case Submit(ticket, model, klass, request, step, steps, exclusive_memory, handoff, may_use):
                tickets[ticket.job_id] = ticket
                if handoff is not None:
                    granted.pop(handoff[0], None)
                # The core's events say "step/steps"; an unknown count is said as 0 ("3/0").
                return core.submit(ticket.job_id, model, klass, now, seq=request.seq, request=request.id,
                                   step=step, steps=steps or 0, exclusive_memory=exclusive_memory, handoff=handoff,
                                   may_use=may_use)
            case Finish(job_id, status):
                tickets.pop(job_id, None)
                granted.pop(job_id, None)
                return core.finish(job_id, now, status)
            case EngineSpawned(engine, generation, pid):
                return core.engine_spawned(engine, generation, pid, now)
            case EngineReady(engine, generation, endpoint, pid):
                return core.engine_ready(engine, generation, endpoint, now, pid)
            case EngineExited(engine, generation, detail):
                return core.engine_exited(engine, generation, now, detail)
            case EngineAsleep(engine, generation, detail):
                return core.engine_asleep(engine, generation, now, detail)
            case EngineLoad(engine, generation, running, waiting, kv_usage):
                return core.engine_load(engine, generation, running, waiting, kv_usage)
            case EngineChecked(engine, generation, problem):
                return core.engine_checked(engine, generation, now, problem)
            case EngineStalled(engine, generation, detail):
                return core.engine_stalled(engine, generation, now, detail)
            case CacheSaved(engine, generation, seconds):
                return core.cache_saved(engine, generation, seconds)
            case KeptProcess(engine, pid):
                return core.kept_process(engine, pid, now)
            case ServiceMemory(engine, generation, nbytes):
                return core.service_memory(engine, generation, nbytes, now)
            case MemoryReading(devices):
                return core.observe_devices(now, devices)
            case Control(engine, action, answer):
                problem, effects = core.control(engine, action, now)
                answer(problem)
                return effects
            case EngineAdded(profile, load_s):
                return core.add_engine(profile, now, load_s=load_s)
            case EngineRetiring(engine, replacement):
                return core.retire_engine(engine, replacement, now)
            case EngineReplaced(engine):
                return core.engine_replaced(engine, now)
            case PolicyReplaced(policy):
                return core.replace_policy(policy, now)
            case Close():
                return core.close(now)
        raise AssertionError(message)

    core.wall_offset = time.time() - trio.current_time()  # so that the times it says are the wall clock's
    task_status.started()
    perform(core.start(trio.current_time()))
    while True:
        wakeup = core.next_wakeup()
        with trio.move_on_at(math.inf if wakeup is None else wakeup):
            message = await mailbox.receive()
            perform(apply(message))
            # Apply everything already waiting before the next checkpoint.
            while True:
                try:
                    message = mailbox.receive_nowait()
                except trio.WouldBlock:
                    break
                perform(apply(message))
        if wakeup is not None and trio.current_time() >= wakeup:
            perform(core.tick(trio.current_time()))
