"""One supervisor task per engine, for every runtime: start, wait ready, serve, stop, report.

The scheduler decides *when* an engine loads and unloads; this task does it, through the
engine's runtime (``adapters/``), and reports back what happened (ready, asleep, or gone
and why). What loading means depends on where the engine's process lives
(``adapters.base.Residence``): a spawned engine is a process per load; a service's process
(``ollama serve``, a vLLM that sleeps) and an attached server stay up, and loading waits
for them (waking them), unloading asks them to unload or sleep. Everything that happens to
the engine arrives in one mailbox — the scheduler's commands and the notices of the
engine's helper tasks (ready, exited, too slow) — and is handled in order, so the engine's
state has one owner.
"""

from __future__ import annotations

import collections
import enum
import functools
import math
import traceback
from collections.abc import Awaitable, Callable

import attrs
import httpx
import trio

from adapters import LogReader, Residence
from supervisor.address import Address, pick_port
from supervisor.engines.process import (
    ChildProcess,
    SpawnError,
    describe_exit,
    open_child,
    pump_lines,
    report_reaper,
    stop_child,
)
from supervisor.engines.service import ServiceProcess, serve_service_process
from supervisor.engines.spec import EngineSpec
from supervisor.observe.engine_output import output_to_events
from supervisor.observe.events import EventLog
from supervisor.scheduler.actor import SchedulerClient
from supervisor.scheduler.types import Placement
from supervisor.slot_cache.keeper import SlotKeeper

# What arrives in an engine's mailbox: the scheduler's commands (Start, Stop, Check) and the
# notices of the engine's helper tasks (Ready, Exited, TooSlow), each about one generation.


@attrs.frozen
class _Message:
    generation: int


@attrs.frozen
class Start(_Message):
    placement: Placement | None = None  # where its process puts its memory


@attrs.frozen
class Stop(_Message):
    """Unload it: stop its process, or put a kept one to sleep."""


@attrs.frozen
class Check(_Message):
    """Check its health now (a request on it stalled)."""


@attrs.frozen
class Ready(_Message):
    """It answers (woken first, if it slept)."""


@attrs.frozen
class Exited(_Message):
    detail: str = ""  # how its process ended


@attrs.frozen
class TooSlow(_Message):
    """Not ready within its start_timeout."""


Message = Start | Stop | Check | Ready | Exited | TooSlow


class EndKind(enum.Enum):
    STOPPED = "stopped"  # steward stopped it (evicted, restarted, shutting down)
    ASLEEP = "asleep"  # steward put it to sleep: its process stays, holding less
    TOO_SLOW = "too_slow"  # steward stopped it: not ready within start_timeout
    EXITED = "exited"  # it exited, was killed or failed on its own

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
    _mailbox: trio.MemorySendChannel[Message]
    pid: int | None = None  # the root of its process tree, when steward runs its process
    port: int | None = None
    output_tail: collections.deque[str] = attrs.Factory(collections.deque)
    generation: int = 0  # the one running now (or last)

    def start(self, generation: int, placement: Placement | None = None) -> None:
        self._mailbox.send_nowait(Start(generation, placement))

    def stop(self, generation: int) -> None:
        self._mailbox.send_nowait(Stop(generation))

    def check(self, generation: int) -> None:
        """Check its health now (a request on it stalled)."""
        self._mailbox.send_nowait(Check(generation))

    # From the engine's own helpers: about the generation running now.

    def ready(self) -> None:
        self._notify(Ready(self.generation))

    def exited(self, detail: str = "") -> None:
        self._notify(Exited(self.generation, detail))

    def too_slow(self) -> None:
        self._notify(TooSlow(self.generation))

    def _notify(self, notice: Ready | Exited | TooSlow) -> None:
        try:
            self._mailbox.send_nowait(notice)
        except trio.ClosedResourceError:
            pass  # retired by a reload: its task is ending, nothing is listening

    def retire(self) -> None:
        """End the engine's task (a reload removed or changed it; its process is gone): a
        process it keeps (a service) is stopped as the task ends."""
        self._mailbox.close()


@attrs.define(eq=False)
class _Engine:
    """The state one engine task owns, and what it talks to."""

    spec: EngineSpec
    handle: EngineHandle
    receive: trio.MemoryReceiveChannel[Message]
    scheduler: SchedulerClient
    events: EventLog
    http: httpx.AsyncClient
    service: ServiceProcess | None = None
    asleep: bool = False  # its kept process was unloaded by steward: wake it before serving
    unhealthy: bool = False  # its last health check failed
    serving: bool = False  # the generation running now became ready (its slots may hold caches)
    slot_keeper: SlotKeeper | None = None  # models.NAME.keep_cache: saves its slots on a stop, restores on load

    @property
    def name(self) -> str:
        return self.spec.name


async def serve_engine(spec: EngineSpec, scheduler: SchedulerClient, events: EventLog, http: httpx.AsyncClient,
                       *, task_status: trio.TaskStatus[EngineHandle] = trio.TASK_STATUS_IGNORED) -> None:
    send, receive = trio.open_memory_channel[Message](math.inf)
    handle = EngineHandle(spec.name, send, output_tail=collections.deque(maxlen=spec.tail_lines))
    engine = _Engine(spec, handle, receive, scheduler, events, http,
                     slot_keeper=None if spec.slot_cache is None else SlotKeeper(spec.slot_cache, events))
    async with trio.open_nursery() as nursery:
        residence = spec.runtime.residence
        if residence is Residence.SERVICE and (argv := _service_argv(spec, handle)) is not None:
            service = ServiceProcess(on_exit=handle.exited,
                                     on_line=handle.output_tail.append)
            if spec.runtime.measured:  # its process tree's memory is the engine's (Ollama says its own)
                service.on_spawn = functools.partial(_kept_process_spawned, handle, scheduler)
            env = {**spec.runtime.env, **device_env(spec.devices)}  # a kept process stays where it started
            engine.service = await nursery.start(functools.partial(
                serve_service_process, spec.name, argv, env, events, spec.retry, service,
                poll_paths=spec.runtime.poll_paths))
        task_status.started(handle)
        async for message in receive:
            match message:
                case Start():
                    handle.generation = message.generation
                    ended = await _run_contained(engine, message)
                    if ended.kind is EndKind.ASLEEP:
                        scheduler.report_asleep(spec.name, message.generation, ended.detail)
                    else:
                        scheduler.report_exited(spec.name, message.generation, ended.detail)
                case Exited() if engine.asleep and message.generation == handle.generation:
                    # Its kept process went while it slept: it holds nothing now.
                    engine.asleep = False
                    scheduler.report_exited(spec.name, message.generation, f"its process ended while asleep "
                                            f"({message.detail})")
                case _:
                    pass  # anything else refers to a generation that is already over
        nursery.cancel_scope.cancel(reason="engine mailbox closed")


def _kept_process_spawned(handle: EngineHandle, scheduler: SchedulerClient, pid: int | None) -> None:
    """Its memory is the engine's from the start, loaded or not (scheduler/memory.py)."""
    handle.pid = pid
    scheduler.report_kept_process(handle.name, pid)


async def _run_contained(engine: _Engine, start: Start) -> Ended:
    """One generation of the engine; a bug of steward's while driving it (its process is stopped
    on the way out, as on every path) ends that generation as a crash: an ``internal_error``
    event, then the scheduler's usual backoff and restart. The engine's task, and steward, go on."""
    try:
        if engine.spec.runtime.residence is Residence.SPAWNED:
            return await _run_spawned(engine, start.generation, start.placement)
        return await _run_kept(engine, start.generation)
    except Exception as exc:  # noqa: BLE001 - contained here, like any other way a generation ends
        error = f"{type(exc).__name__}: {exc}"
        engine.events.emit("internal_error", "error", source=f"engine {engine.name}", error=error,
                           traceback="".join(traceback.format_exception(exc))[-4000:])
        return Ended(EndKind.EXITED, f"steward failed while driving it ({error})")


def _service_argv(spec: EngineSpec, handle: EngineHandle) -> list[str] | None:
    port = spec.port or pick_port(spec.host)
    handle.port = port
    return spec.command(port)


def device_env(devices: tuple[int, ...] | None) -> dict[str, str]:
    """The environment that keeps a process to *devices*, numbered as NVML (and steward) number them."""
    if devices is None:
        return {}
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(map(str, devices))}


def placed_command(spec: EngineSpec, argv: list[str], placement: Placement | None) -> tuple[list[str], dict[str, str]]:
    """The command and environment of one process of *spec*, on the devices the scheduler chose.

    On a host with one device nothing changes; on several the process sees only its own
    devices, and one split over several is told the split (llama-server's --tensor-split)."""
    if placement is None or not placement.chosen:
        return argv, {**spec.runtime.env, **device_env(spec.devices)}
    env = {**spec.runtime.env, **device_env(placement.devices)}
    if placement.split:
        argv = argv + spec.runtime.split_args([placement.shares[device] for device in placement.devices])
    return argv, env


async def _run_spawned(engine: _Engine, generation: int, placement: Placement | None) -> Ended:
    """Run one process of the engine from spawn to exit."""
    spec, handle = engine.spec, engine.handle
    try:
        port = spec.port or pick_port(spec.host)
    except OSError as exc:  # engines.host is no address of this machine: a failed start, like a missing program
        detail = f"cannot pick a port on {spec.host}: {exc.strerror or exc}"
        engine.events.emit("spawn_failed", "error", engine=spec.name, argv=[], detail=detail)
        return Ended(EndKind.EXITED, detail)
    command = spec.command(port)
    assert command is not None  # a spawned runtime always has a command
    argv, env = placed_command(spec, command, placement)
    handle.output_tail.clear()
    if engine.slot_keeper is not None:
        engine.slot_keeper.before_spawn()
    try:
        process = open_child(argv, env, cpus=None if spec.cpus is None else spec.cpus.cpus)
    except SpawnError as exc:
        engine.events.emit("spawn_failed", "error", engine=spec.name, argv=argv, detail=str(exc))
        return Ended(EndKind.EXITED, str(exc))
    handle.pid, handle.port = process.pid, port
    engine.scheduler.report_spawned(spec.name, generation, process.pid)
    engine.events.emit("spawn", "info", engine=spec.name, pid=process.pid, port=port, argv=argv,
                       generation=generation, devices=env.get("CUDA_VISIBLE_DEVICES"))
    report_reaper(process, engine.events, spec.name)
    address = Address(spec.host, port)
    log_reader = spec.runtime.log_reader()
    buffers = _BuffersReport(engine, log_reader)

    to_events = output_to_events(engine.events, spec.name, spec.runtime.poll_paths)

    def on_line(line: str) -> None:
        handle.output_tail.append(line)
        to_events(line)
        buffers.read(line)

    stop_requested = False
    try:
        async with trio.open_nursery() as nursery:
            output_done = trio.Event()
            nursery.start_soon(_pump_output, process, on_line, output_done)
            nursery.start_soon(_notify_exit, process, output_done, handle)

            async def stop() -> Ended:
                await _save_slots(engine, generation, address)
                await stop_child(process, spec.stop_grace)
                return Ended(EndKind.STOPPED, f"stopped ({describe_exit(process.returncode)})")

            def exited(detail: str) -> str:
                return f"{describe_exit(process.returncode)}; last output: {_tail(handle)}"

            ended = await _serve_generation(engine, generation, address, lambda: process.pid, nursery, stop,
                                            exited, buffers)
            if ended.kind is EndKind.TOO_SLOW:
                await stop_child(process, spec.stop_grace)
            stop_requested = ended.kind.requested
            nursery.cancel_scope.cancel(reason="engine process ended")
        return ended
    finally:
        with trio.CancelScope(shield=True):
            # Reached on every path, shutdown included: the process never outlives this task.
            if process.returncode is None:
                stop_requested = True  # steward is shutting down
                await stop_child(process, spec.stop_grace)
            engine.events.emit("exit", "info" if stop_requested else "warning", engine=spec.name, pid=process.pid,
                               status=describe_exit(process.returncode), requested=stop_requested)
            report_reaper(process, engine.events, spec.name)
            handle.pid = handle.port = None
            await process.output.aclose()


async def _run_kept(engine: _Engine, generation: int) -> Ended:
    """Serve one load of an engine whose process stays: a service of steward's, or attached."""
    spec, handle = engine.spec, engine.handle
    port = handle.port if engine.service is not None else spec.port
    assert port is not None  # an attached server's address is configured; a service's port is picked once
    address = Address(spec.host, port)
    async with trio.open_nursery() as nursery:

        async def unload() -> Ended:
            if engine.service is not None and engine.unhealthy:
                # Stopped because it stopped answering: a fresh process, not a sleep.
                await engine.service.restart()
                engine.asleep = False
                return Ended(EndKind.STOPPED, "its process was replaced (it failed its health checks)")
            detail = await spec.runtime.unload(engine.http, address.url, engine.events)
            # Asleep, it still holds some memory and must be woken; emptied (Ollama), it is simply stopped.
            engine.asleep = spec.runtime.sleeps
            return Ended(EndKind.ASLEEP if spec.runtime.sleeps else EndKind.STOPPED, detail)

        def exited(detail: str) -> str:
            return f"its process {detail}; last output: {_tail(handle)}"

        service = engine.service

        def pid() -> int | None:
            # Ollama says what it holds itself (its runners are not ours to name); others are measured.
            return service.pid if service is not None and spec.runtime.measured else None

        no_log = _BuffersReport(engine, None)  # a kept service's output is not steward's to read
        ended = await _serve_generation(engine, generation, address, pid, nursery, unload, exited, no_log)
        nursery.cancel_scope.cancel(reason="load ended")
    if ended.kind in (EndKind.EXITED, EndKind.TOO_SLOW) and engine.service is not None:
        # A failed wake or start: the next load gets a fresh process, which is awake.
        await engine.service.restart()
        engine.asleep = False
    return ended


@attrs.define(eq=False)
class _BuffersReport:
    """The ``buffers`` event: the engine's own account of its memory, from its log, once it is
    ready and its log has told the whole load (the output is read apart from the readiness
    probe: on a busy host the probe may see it ready before the last buffer line is read)."""

    engine: _Engine
    reader: LogReader | None
    ready: bool = False
    sent: bool = False

    def read(self, line: str) -> None:
        if self.reader is not None:
            self.reader.feed(line)
            self._send_when_whole()

    def engine_ready(self) -> None:
        self.ready = True
        self._send_when_whole()

    def _send_when_whole(self) -> None:
        if self.sent or not self.ready or self.reader is None or not self.reader.complete:
            return
        self.sent = True
        if devices := self.reader.summary():
            self.engine.events.emit("buffers", "info", engine=self.engine.spec.name, devices=devices)


async def _serve_generation(engine: _Engine, generation: int, address: Address, pid: Callable[[], int | None],
                            nursery: trio.Nursery, unload: Callable[[], Awaitable[Ended]], exited: Callable[[str], str],
                            buffers: _BuffersReport) -> Ended:
    """Wait until the engine is ready, serve until it is unloaded or gone; returns why it ended."""
    spec, handle = engine.spec, engine.handle
    engine.unhealthy = engine.serving = False
    watch = _HealthWatch(spec, engine.http, address.url, engine.scheduler, generation, engine)
    nursery.start_soon(_notify_ready, engine, address, handle)
    if spec.runtime.residence is not Residence.ATTACHED:  # someone else's server: waited for, never restarted
        nursery.start_soon(_notify_too_slow, spec.start_timeout, handle)
    if spec.runtime.checks_health:
        nursery.start_soon(watch.run)
    nursery.start_soon(_watch_usage, engine, address, generation, watch.ready)
    ready = False
    async for message in engine.receive:
        if message.generation != generation:
            continue
        match message:
            case Ready() if not ready:
                ready = engine.serving = True
                engine.asleep = False
                engine.scheduler.report_ready(spec.name, generation, address, pid())
                watch.ready.set()
                buffers.engine_ready()
            case Check():
                watch.check_now()
            case TooSlow() if not ready:
                engine.events.emit("start_timeout", "error", engine=spec.name, timeout_s=spec.start_timeout)
                return Ended(EndKind.TOO_SLOW, f"did not become ready within {spec.start_timeout:g}s; last output: "
                                               f"{_tail(handle)}")
            case Stop():
                return await unload()
            case Exited():
                return Ended(EndKind.EXITED, exited(message.detail))
            case _:
                pass  # a second Ready, a TooSlow once ready: nothing to do
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
    engine: _Engine
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
            problem = await self.spec.runtime.check_health(self.http, self.base_url, checks.timeout)
            self.engine.unhealthy = problem is not None
            self.scheduler.report_health(self.spec.name, self.generation, problem)
            wait = checks.interval if problem is None else min(checks.retry, checks.interval)


async def _watch_usage(engine: _Engine, address: Address, generation: int, ready: trio.Event) -> None:
    """Tell the scheduler what the runtime says it holds (Ollama) and how loaded it is (vLLM's queue and
    KV cache, llama-server's KV cache): asked every ``usage_poll`` once it is ready, each ask bounded."""
    await ready.wait()
    while True:
        usage = await engine.spec.runtime.read_usage(engine.http, address.url)
        if usage is not None and usage.memory is not None:
            engine.scheduler.report_service_memory(engine.name, generation, usage.memory)
        if usage is not None and usage.says_load:
            engine.scheduler.report_load(engine.name, generation, usage.running, usage.waiting, usage.kv_usage)
        await trio.sleep(engine.spec.usage_poll)


async def _pump_output(process: ChildProcess, on_line: Callable[[str], None], done: trio.Event) -> None:
    try:
        await pump_lines(process.output, on_line)
    finally:
        done.set()


async def _notify_exit(process: ChildProcess, output_done: trio.Event, handle: EngineHandle) -> None:
    await process.wait()
    # Let the last lines it printed (its reason for dying) reach the tail first.
    with trio.move_on_after(0.5):
        await output_done.wait()
    handle.exited()


async def _notify_ready(engine: _Engine, address: Address, handle: EngineHandle) -> None:
    """Poll until it answers; a server steward put to sleep is woken first."""
    spec = engine.spec
    delays = spec.retry.delays() if spec.runtime.residence is Residence.ATTACHED else None
    while not await spec.runtime.is_ready(engine.http, address.url):
        if delays is None:
            await trio.sleep(spec.health_interval)
            continue
        delay = next(delays)  # someone else's server: say so while it does not answer
        engine.events.emit("upstream_retry", "warning", service=spec.name, url=address.url,
                           detail="not answering yet", retry_in_s=delay)
        await trio.sleep(delay)
    if engine.asleep:
        if (problem := await spec.runtime.wake(engine.http, address.url)) is not None:
            engine.events.emit("wake_failed", "error", engine=spec.name, detail=problem)
            handle.exited(f"could not be woken: {problem}")
            return
        engine.events.emit("woken", "info", engine=spec.name)
    if engine.slot_keeper is not None:  # before it takes work: the first request finds its conversation
        await engine.slot_keeper.restore(engine.http, address.url)
    handle.ready()


async def _save_slots(engine: _Engine, generation: int, address: Address) -> None:
    """Drained and told to stop: save its slots first (keep_cache), and tell the scheduler how long
    that took, which evicting it costs from now on (ReloadCost.save_s)."""
    if engine.slot_keeper is None or not engine.serving or engine.unhealthy:  # a sick one is restarted at once
        return
    seconds = await engine.slot_keeper.save(engine.http, address.url)
    engine.scheduler.report_cache_saved(engine.name, generation, seconds)


async def _notify_too_slow(timeout: float, handle: EngineHandle) -> None:
    await trio.sleep(timeout)
    handle.too_slow()


def _tail(handle: EngineHandle, lines: int = 2) -> str:
    """The engine's own words on why it stopped: its first error line, then its last lines."""
    output = [line.strip() for line in handle.output_tail if line.strip()]
    if not output:
        return "(none)"
    cause = next((line for line in output if "error" in line.lower()), None)
    tail = output[-lines:]
    return " | ".join(([cause] if cause and cause not in tail else []) + tail)
