"""A process steward supervises for as long as it runs (Ollama, ComfyUI, a sleeping vLLM).

Unlike a spawned engine, its process is not started and stopped with its models: it stays
up, and it is restarted with backoff if it exits.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

import attrs
import trio

from supervisor.backoff import Backoff
from supervisor.observe.engine_output import output_to_events
from supervisor.observe.events import EventLog
from supervisor.engines.process import (
    ChildProcess,
    SpawnError,
    describe_exit,
    open_child,
    pump_lines,
    report_reaper,
    stop_child,
    terminate_child,
)


@attrs.define(eq=False)
class ServiceProcess:
    """The service's process now, for whoever serves through it (its engine)."""

    on_spawn: Callable[[int | None], None] = lambda pid: None  # told each new process's pid (None: gone)
    on_exit: Callable[[str], None] = lambda detail: None  # told why each process ended
    on_line: Callable[[str], None] = lambda line: None
    _current: ChildProcess | None = None
    _gone: trio.Event = attrs.Factory(trio.Event)  # set once the current process has exited

    @property
    def pid(self) -> int | None:
        return self._current.pid if self._current is not None and self._current.returncode is None else None

    def began(self, process: ChildProcess) -> None:
        self._current, self._gone = process, trio.Event()
        self.on_spawn(process.pid)

    def ended(self, status: int) -> None:
        self._gone.set()
        self.on_spawn(None)
        self.on_exit(describe_exit(status))

    async def restart(self) -> None:
        """End the current process and wait until it is gone; the supervisor starts a fresh one
        (after its backoff), so nothing that answers before then is the old one."""
        if self._current is not None and self._current.returncode is None:
            terminate_child(self._current)
            await self._gone.wait()


async def serve_service_process(name: str, argv: Sequence[str], env: Mapping[str, str], events: EventLog,
                                backoff: Backoff, service: ServiceProcess | None = None, *,
                                poll_paths: Collection[str] = (),
                                task_status: trio.TaskStatus[ServiceProcess] = trio.TASK_STATUS_IGNORED) -> None:
    """*service*: its callbacks set by the caller before the first process starts; *poll_paths*:
    what steward GETs of it itself (its access log's lines for them are counted, not logged)."""
    service = service or ServiceProcess()
    to_events = output_to_events(events, name, poll_paths)
    task_status.started(service)
    delays = backoff.delays()
    while True:
        started = trio.current_time()
        try:
            process = open_child(argv, env)
        except SpawnError as exc:
            events.emit("spawn_failed", "error", engine=name, argv=list(argv), detail=str(exc))
            service.on_exit(str(exc))
        else:
            service.began(process)
            events.emit("spawn", "info", engine=name, pid=process.pid, argv=list(argv))
            report_reaper(process, events, name)

            def on_line(line: str) -> None:
                service.on_line(line)
                to_events(line)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(pump_lines, process.output, on_line)
                    status = await process.wait()
                events.emit("exit", "error", engine=name, pid=process.pid, status=describe_exit(status),
                            requested=False)
                service.ended(status)
            finally:
                with trio.CancelScope(shield=True):
                    if process.returncode is None:  # steward is stopping: so does the service
                        status = await stop_child(process, 10.0)
                        events.emit("exit", "info", engine=name, pid=process.pid, status=describe_exit(status),
                                    requested=True)
                    await process.output.aclose()
        if trio.current_time() - started >= backoff.maximum:
            delays = backoff.delays()  # it ran long enough: this is a new failure, not a loop
        delay = next(delays)
        events.emit("restart", "info", engine=name, restart_in_s=delay)
        await trio.sleep(delay)
