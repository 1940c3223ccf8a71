"""A scheduler actor in virtual time with scripted engines, for MockClock tests."""

from __future__ import annotations

import math

import attrs
import trio

from supervisor.observe.events import EventLog
from supervisor.request_class import RequestClass
from supervisor.scheduler.actor import JobFailed, SchedulerClient, open_scheduler_mailbox, serve_scheduler
from supervisor.scheduler.core import Scheduler
from supervisor.scheduler.types import BackoffPolicy, EngineProfile, SchedulingPolicy

GIB = 1024**3
LOAD_S = 2.0
STOP_S = 0.5


@attrs.define(eq=False)
class ScriptedEngine:
    """Loads in LOAD_S, stops in STOP_S, reports like the real engine supervisor."""

    name: str
    nursery: trio.Nursery
    client: SchedulerClient | None = None
    starts: list[float] = attrs.Factory(list)
    checks: list[tuple[int, float]] = attrs.Factory(list)  # (generation, when) of each check asked for

    def start(self, generation: int, placement: object = None) -> None:
        self.starts.append(trio.current_time())
        self.nursery.start_soon(self._report_after, LOAD_S, "ready", generation)

    def stop(self, generation: int) -> None:
        self.nursery.start_soon(self._report_after, STOP_S, "exited", generation)

    def check(self, generation: int) -> None:
        self.checks.append((generation, trio.current_time()))

    def crash(self, generation: int) -> None:
        assert self.client is not None
        self.client.report_exited(self.name, generation, "killed by SIGKILL")

    async def _report_after(self, delay: float, what: str, generation: int) -> None:
        await trio.sleep(delay)
        assert self.client is not None
        if what == "ready":
            self.client.report_ready(self.name, generation, f"http://127.0.0.1:1/{self.name}")
        else:
            self.client.report_exited(self.name, generation, "stopped")


@attrs.define
class Harness:
    client: SchedulerClient
    engines: dict[str, ScriptedEngine]
    events: EventLog

    def names(self, event: str) -> list[dict[str, object]]:
        return [e.fields | {"at": e.mono} for e in self.events.recent if e.name == event]

    def log(self, *names: str) -> list[tuple[float, str, dict[str, object]]]:
        """(time, event, fields) of the chosen events, in order."""
        return [(e.mono, e.name, e.fields) for e in self.events.recent if e.name in names]


async def start_harness(nursery: trio.Nursery, budget_gib: float, *profiles: EngineProfile,
                        queue_timeout: float = 60.0, policy: SchedulingPolicy | None = None) -> Harness:
    policy = policy or SchedulingPolicy(
        backoff=BackoffPolicy(1.0, 8.0),
        queue_timeout={"interactive": queue_timeout, "background": 600, "batch": 3600})
    core = Scheduler.create(int(budget_gib * GIB), profiles, policy)
    client, mailbox = open_scheduler_mailbox(core)
    send, _receive = trio.open_memory_channel(math.inf)
    events = EventLog(send, recent_max=10_000)
    engines = {p.name: ScriptedEngine(p.name, nursery, client) for p in profiles}
    await nursery.start(serve_scheduler, core, mailbox, engines, events)
    return Harness(client, engines, events)


async def hold(client: SchedulerClient, model: str | None, seconds: float, log: list[tuple[str, float]],
               klass: str = "interactive") -> None:
    try:
        async with client.open_grant(model, RequestClass(klass)) as lease:
            log.append((f"granted {model} {lease.grant.engine}", trio.current_time()))
            await trio.sleep(seconds)
    except JobFailed as exc:
        log.append((f"failed {exc.failure.code}", trio.current_time()))




async def client_loop(client: SchedulerClient, model: str, klass: str, service: float, think: float,
                      log: list[tuple[str, float]], until: float) -> None:
    """A client that asks, holds its grant for *service*, thinks, and asks again."""
    while trio.current_time() < until:
        await hold(client, model, service, log, klass)
        await trio.sleep(think)


async def hold_steps(client: SchedulerClient, model: str, klass: str, steps: int, service: float,
                     log: list[tuple[str, float]]) -> None:
    """A request of several steps (an embeddings request cut into chunks)."""
    async with client.open_request() as request:
        for step in range(1, steps + 1):
            async with client.open_grant(model, RequestClass(klass), request=request, step=step, steps=steps):
                log.append((f"step {step}/{steps}", trio.current_time()))
                await trio.sleep(service)
