"""A service steward supervises as a child for as long as steward runs (Ollama, ComfyUI).

Unlike an engine, its process is not started and stopped with its models: it stays up,
and it is restarted with backoff if it exits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import trio

from supervisor.events import EventLog
from supervisor.gateway.relay import Backoff
from supervisor.engine import report_reaper
from supervisor.process import describe_exit, open_child, pump_lines, stop_child


async def serve_service_process(name: str, argv: Sequence[str], env: Mapping[str, str], events: EventLog,
                                backoff: Backoff, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
                                ) -> None:
    task_status.started()
    delays = backoff.delays()
    while True:
        started = trio.current_time()
        try:
            process = open_child(argv, env)
        except OSError as exc:
            events.emit("spawn_failed", "error", engine=name, argv=list(argv), detail=str(exc))
        else:
            events.emit("spawn", "info", engine=name, pid=process.pid, argv=list(argv))
            report_reaper(process, events, name)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(pump_lines, process.output,
                                       lambda line: events.emit("engine_output", "debug", engine=name, line=line))
                    status = await process.wait()
                events.emit("exit", "error", engine=name, pid=process.pid, status=describe_exit(status),
                            requested=False)
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
