"""One supervisor task per engine: spawn, wait ready, serve, stop, report.

The scheduler decides *when* an engine starts and stops; this task does it and
reports back what happened (ready, or exited and why). Everything that happens
to the engine arrives in one mailbox — the scheduler's commands and the notices
of the engine's own helper tasks (ready, exited, too slow) — and is handled in
order, so the engine's state has one owner.
"""

from __future__ import annotations

import collections
import enum
import math
import socket
from collections.abc import Callable
from typing import Literal

import attrs
import httpx
import trio

from adapters import ADAPTERS, RuntimeAdapter
from adapters.base import LogReader
from supervisor.config import Config, ModelConfig
from supervisor.events import EventLog
from supervisor.process import ChildProcess, describe_exit, open_child, pump_lines, stop_child
from supervisor.scheduler.actor import SchedulerClient


@attrs.frozen
class HealthChecks:
    """How often a ready engine's health is checked, and how long one check may take."""

    interval: float = 10.0
    timeout: float = 5.0
    # After a failed check the next comes sooner, so that a frozen engine is found in
    # seconds, not in several intervals.
    retry: float = 1.0


@attrs.frozen
class EngineSpec:
    """Everything needed to run one model's engine, resolved from the config."""

    name: str
    model: ModelConfig
    adapter: RuntimeAdapter
    host: str
    slots: int
    start_timeout: float
    stop_grace: float
    health_interval: float  # readiness polling while it loads
    tail_lines: int
    checks: HealthChecks = attrs.Factory(HealthChecks)

    @classmethod
    def from_config(cls, name: str, config: Config) -> EngineSpec:
        model = config.models[name]
        adapter = ADAPTERS[model.runtime]
        return cls(name=name, model=model, adapter=adapter, host=config.engines.host,
                   slots=adapter.slots(model), start_timeout=config.engines.start_timeout,
                   stop_grace=config.engines.stop_grace, health_interval=config.engines.health_interval,
                   tail_lines=config.engines.stderr_tail_lines,
                   checks=HealthChecks(config.engines.health_check_interval, config.engines.health_check_timeout))

    def command(self, port: int) -> list[str]:
        return self.adapter.command(self.model, self.host, port)


@attrs.frozen
class _Command:
    kind: Literal["start", "stop", "check", "ready", "exited", "too_slow"]
    generation: int


class EndKind(enum.Enum):
    STOPPED = "stopped"  # steward stopped it (evicted, restarted, shutting down)
    TOO_SLOW = "too_slow"  # steward stopped it: not ready within start_timeout
    EXITED = "exited"  # it exited, or was killed, on its own

    @property
    def requested(self) -> bool:
        return self is not EndKind.EXITED


@attrs.frozen
class Ended:
    kind: EndKind
    detail: str


@attrs.define(eq=False)
class EngineHandle:
    """The scheduler's remote control for one engine, plus what it is running now."""

    name: str
    _mailbox: trio.MemorySendChannel[_Command]
    pid: int | None = None
    port: int | None = None
    output_tail: collections.deque[str] = attrs.Factory(collections.deque)

    def start(self, generation: int) -> None:
        self._mailbox.send_nowait(_Command("start", generation))

    def stop(self, generation: int) -> None:
        self._mailbox.send_nowait(_Command("stop", generation))

    def check(self, generation: int) -> None:
        """Check its health now (a request on it stalled)."""
        self._mailbox.send_nowait(_Command("check", generation))


def pick_port(host: str) -> int:
    """A port that is free right now (the engine may still lose a race; then it fails and restarts)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


async def serve_engine(spec: EngineSpec, scheduler: SchedulerClient, events: EventLog, http: httpx.AsyncClient,
                       *, task_status: trio.TaskStatus[EngineHandle] = trio.TASK_STATUS_IGNORED) -> None:
    send, receive = trio.open_memory_channel[_Command](math.inf)
    handle = EngineHandle(spec.name, send, output_tail=collections.deque(maxlen=spec.tail_lines))
    task_status.started(handle)
    async for command in receive:
        if command.kind == "start":
            detail = await _run_once(spec, command.generation, handle, receive, send, events, http, scheduler)
            scheduler.report_exited(spec.name, command.generation, detail)
        # Anything else refers to a process that is already gone.


async def _run_once(spec: EngineSpec, generation: int, handle: EngineHandle,
                    receive: trio.MemoryReceiveChannel[_Command], send: trio.MemorySendChannel[_Command],
                    events: EventLog, http: httpx.AsyncClient, scheduler: SchedulerClient) -> str:
    """Run one process of the engine from spawn to exit; returns why it ended."""
    port = spec.model.port or pick_port(spec.host)
    argv = spec.command(port)
    handle.output_tail.clear()
    try:
        process = open_child(argv, spec.model.env)
    except OSError as exc:
        detail = f"cannot run {argv[0]!r}: {exc.strerror or exc}"
        events.emit("spawn_failed", "error", engine=spec.name, argv=argv, detail=detail)
        return detail
    handle.pid, handle.port = process.pid, port
    scheduler.report_spawned(spec.name, generation, process.pid)
    events.emit("spawn", "info", engine=spec.name, pid=process.pid, port=port, argv=argv, generation=generation)
    report_reaper(process, events, spec.name)
    base_url = f"http://{spec.host}:{port}" if ":" not in spec.host else f"http://[{spec.host}]:{port}"

    log_reader = spec.adapter.log_reader()

    def on_line(line: str) -> None:
        handle.output_tail.append(line)
        if log_reader is not None:
            log_reader.feed(line)
        events.emit("engine_output", "debug", engine=spec.name, line=line)

    stop_requested = False
    try:
        async with trio.open_nursery() as nursery:
            output_done = trio.Event()
            watch = _HealthWatch(spec, http, base_url, scheduler, generation)
            nursery.start_soon(_pump_output, process, on_line, output_done)
            nursery.start_soon(_notify_exit, process, output_done, send, generation)
            nursery.start_soon(_notify_ready, spec, http, base_url, send, generation)
            nursery.start_soon(_notify_too_slow, spec.start_timeout, send, generation)
            nursery.start_soon(watch.run)
            ended = await _follow(spec, generation, process, handle, receive, events, scheduler, base_url,
                                  log_reader, watch)
            stop_requested = ended.kind.requested
            nursery.cancel_scope.cancel(reason="engine process ended")
        return ended.detail
    finally:
        with trio.CancelScope(shield=True):
            # Reached on every path, shutdown included: the process never outlives this task.
            if process.returncode is None:
                stop_requested = True  # steward is shutting down
                await stop_child(process, spec.stop_grace)
            events.emit("exit", "info" if stop_requested else "warning", engine=spec.name, pid=process.pid,
                        status=describe_exit(process.returncode), requested=stop_requested)
            report_reaper(process, events, spec.name)
            handle.pid = handle.port = None
            await process.output.aclose()


async def _follow(spec: EngineSpec, generation: int, process: ChildProcess, handle: EngineHandle,
                  receive: trio.MemoryReceiveChannel[_Command], events: EventLog, scheduler: SchedulerClient,
                  base_url: str, log_reader: LogReader | None, watch: _HealthWatch) -> Ended:
    """Handle the engine's mailbox until its process is gone; returns why it ended."""
    ready = False
    async for command in receive:
        if command.generation != generation:
            continue
        if command.kind == "ready" and not ready:
            ready = True
            scheduler.report_ready(spec.name, generation, base_url, process.pid)
            watch.ready.set()
            if log_reader is not None and (buffers := log_reader.summary()):
                # The engine's own account of its memory, from its log: the measured breakdown.
                events.emit("buffers", "info", engine=spec.name, devices=buffers)
        elif command.kind == "check":
            watch.check_now()
        elif command.kind == "too_slow" and not ready:
            events.emit("start_timeout", "error", engine=spec.name, timeout_s=spec.start_timeout)
            await stop_child(process, spec.stop_grace)
            return Ended(EndKind.TOO_SLOW, f"did not become ready within {spec.start_timeout:g}s; last output: "
                                           f"{_tail(handle)}")
        elif command.kind == "stop":
            await stop_child(process, spec.stop_grace)
            return Ended(EndKind.STOPPED, f"stopped ({describe_exit(process.returncode)})")
        elif command.kind == "exited":
            return Ended(EndKind.EXITED, f"{describe_exit(process.returncode)}; last output: {_tail(handle)}")
    raise AssertionError("the engine's mailbox closed while it ran")


@attrs.define(eq=False)
class _HealthWatch:
    """Checks a ready engine's health every ``checks.interval``, and at once when asked;
    every result goes to the scheduler, which decides what it means."""

    spec: EngineSpec
    http: httpx.AsyncClient
    base_url: str
    scheduler: SchedulerClient
    generation: int
    ready: trio.Event = attrs.Factory(trio.Event)
    _wake: trio.Event = attrs.Factory(trio.Event)

    def check_now(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        await self.ready.wait()
        checks = self.spec.checks
        wait = checks.interval
        while True:
            with trio.move_on_after(wait):
                await self._wake.wait()
            self._wake = trio.Event()
            problem = await self.spec.adapter.check_health(self.http, self.base_url, checks.timeout)
            self.scheduler.report_health(self.spec.name, self.generation, problem)
            wait = checks.interval if problem is None else min(checks.retry, checks.interval)


async def _pump_output(process: ChildProcess, on_line: Callable[[str], None], done: trio.Event) -> None:
    try:
        await pump_lines(process.output, on_line)
    finally:
        done.set()


async def _notify_exit(process: ChildProcess, output_done: trio.Event, send: trio.MemorySendChannel[_Command],
                       generation: int) -> None:
    await process.wait()
    # Let the last lines it printed (its reason for dying) reach the tail first.
    with trio.move_on_after(0.5):
        await output_done.wait()
    send.send_nowait(_Command("exited", generation))


async def _notify_ready(spec: EngineSpec, http: httpx.AsyncClient, base_url: str,
                        send: trio.MemorySendChannel[_Command], generation: int) -> None:
    while not await spec.adapter.is_ready(http, base_url):
        await trio.sleep(spec.health_interval)
    send.send_nowait(_Command("ready", generation))


async def _notify_too_slow(timeout: float, send: trio.MemorySendChannel[_Command], generation: int) -> None:
    await trio.sleep(timeout)
    send.send_nowait(_Command("too_slow", generation))


def report_reaper(process: ChildProcess, events: EventLog, name: str) -> None:
    """What went wrong with the reaper for this child (it was replaced, could not start)."""
    for warning in process.take_reaper_warnings():
        events.emit("reaper", "warning", engine=name, detail=warning)


def _tail(handle: EngineHandle, lines: int = 2) -> str:
    """The engine's own words on why it stopped: its first error line, then its last lines."""
    output = [line.strip() for line in handle.output_tail if line.strip()]
    if not output:
        return "(none)"
    cause = next((line for line in output if "error" in line.lower()), None)
    tail = output[-lines:]
    return " | ".join(([cause] if cause and cause not in tail else []) + tail)
