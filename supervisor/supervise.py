"""Supervision with restart, in the manner of Erlang/OTP, on trio's nursery tree.

A trio nursery ends when any of its tasks raises, and steward's root nursery is the whole
service: without more, a bug in the usage writer or a poller that meets a value nobody
foresaw would stop every project in the home lab. ``supervise`` runs one long-lived task
and decides what its failure means (``OnFailure``):

- ``RESTART``: the failure is an event (``task_failed``, with the error and its traceback),
  the task is started again after a backoff (``Supervision.backoff``: 1 s, doubling up to
  60 s; a task that then ran for as long as the cap starts again from the first delay), and
  its return is an event too (``task_restarted``). ``/healthz`` says ``degraded`` while it
  is down and for ``health.window`` after each failure; ``/metrics`` counts the failures (``steward_task_failures_total``). The event log and usage writers,
  the GPU probe, the key watcher, the health watch, alerts, the node directory, the reloader
  and the upstream probes are supervised so.
- ``STOP_SERVICE``: the failure is an event and then ends the service, as it always did.
  Only the scheduler actor, the listeners and the tree itself are so: without them there is
  no service to keep.

A task that fails before it was started (``task_status.started``) is never restarted:
that is a bad config or a file that cannot be opened, and ``steward run`` says what is
wrong and exits, as before. A task restarted gets a ``task_status`` that ignores what it
hands over: callers keep the handle of the first start, so a task whose state outlives a
restart (the writers' channels and backlogs) keeps it outside what is restarted.
"""

from __future__ import annotations

import enum
import traceback
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import attrs
import trio

from supervisor.backoff import Backoff
from supervisor.observe.events import EventLog

DEFAULT_BACKOFF = Backoff(1.0, 60.0)
_TRACEBACK_LINES = 40  # of a failure's traceback, in its event: the end, where it failed


class OnFailure(enum.Enum):
    RESTART = "restart"
    STOP_SERVICE = "stop_service"


class TaskState(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"  # failed; waiting out its backoff
    ENDED = "ended"  # returned (its work is done, or steward stops)


@attrs.define
class SupervisedTask:
    """What the supervision knows of one task: read by /healthz, /admin/state and the tests."""

    name: str
    on_failure: OnFailure
    state: TaskState = TaskState.STARTING
    failures: int = 0
    last_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state.value, "on_failure": self.on_failure.value, "failures": self.failures,
                "last_error": self.last_error}


@attrs.define(eq=False)
class Supervision:
    """The supervised tasks of one steward, by name."""

    events: EventLog
    backoff: Backoff = DEFAULT_BACKOFF
    tasks: dict[str, SupervisedTask] = attrs.Factory(dict)

    def to_json(self) -> dict[str, dict[str, Any]]:
        return {name: task.to_json() for name, task in self.tasks.items()}


Startable = Callable[..., Awaitable[Any]]  # called with task_status=...


async def supervise(supervision: Supervision, name: str, run: Startable, *,
                    on_failure: OnFailure = OnFailure.RESTART,
                    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
    """Run *run* (started like ``nursery.start(run)``) under *supervision* as *name*; started
    with what *run*'s first start hands over. See the module docstring for what a failure does."""
    if name in supervision.tasks:
        raise ValueError(f"a task named {name!r} is supervised already")
    task = supervision.tasks[name] = SupervisedTask(name, on_failure)
    events = supervision.events
    delays = _Delays(supervision.backoff)
    status: trio.TaskStatus[Any] = task_status
    while True:
        began = trio.current_time()
        try:
            await _run_once(run, status, task, events)
        except Exception as exc:  # noqa: BLE001 - any failure of a task is this one decision
            if task.state is TaskState.STARTING:  # never started: the caller says what is wrong (a config, a file)
                raise _alone(exc) from None
            task.failures += 1
            task.last_error = _words(exc)
            if on_failure is OnFailure.STOP_SERVICE:
                task.state = TaskState.ENDED
                events.emit("task_failed", "error", task=name, error=task.last_error, fatal=True,
                            failures=task.failures, traceback=_traceback(exc),
                            detail="without this task there is no service: steward stops")
                raise
            delay = delays.after(trio.current_time() - began)
            task.state = TaskState.RESTARTING
            events.emit("task_failed", "error", task=name, error=task.last_error, fatal=False,
                        failures=task.failures, restart_in_s=delay, traceback=_traceback(exc),
                        detail=f"restarting it in {delay:g}s; steward serves on")
            await trio.sleep(delay)
            status = trio.TASK_STATUS_IGNORED  # the callers keep the first start's handle
            continue
        task.state = TaskState.ENDED
        return


async def _run_once(run: Startable, status: trio.TaskStatus[Any], task: SupervisedTask, events: EventLog) -> None:
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(run, name=f"steward: {task.name}")  # (a partial's repr may be huge)
        if task.state is TaskState.RESTARTING:
            events.emit("task_restarted", "info", task=task.name, failures=task.failures,
                        detail=f"running again after {task.last_error}")
        else:
            status.started(handle)
        task.state = TaskState.RUNNING


@attrs.define
class _Delays:
    """The backoff's delays; a task that ran for the cap before failing starts again from the first."""

    backoff: Backoff
    _iterator: Iterator[float] | None = None

    def after(self, ran_s: float) -> float:
        if self._iterator is None or ran_s >= self.backoff.maximum:
            self._iterator = self.backoff.delays()
        return next(self._iterator)


def _alone(exc: Exception) -> Exception:
    """The one error inside our nursery's group, as ``nursery.start`` would have raised it."""
    while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _words(exc: BaseException) -> str:
    """``Type: message`` of the failure; of a group, its first leaf (what failed, not the nursery)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _traceback(exc: BaseException) -> str:
    lines = "".join(traceback.format_exception(exc)).splitlines()
    return "\n".join(lines[-_TRACEBACK_LINES:])


@attrs.define(eq=False)
class ContainedNursery:
    """Where short tasks that outlive their request run (an image job): each failure is its own,
    an ``internal_error`` event, and ends neither the others nor steward. Not restarted: a
    job that failed is over; its client was answered by the job's own error handling."""

    nursery: trio.Nursery
    kind: str  # what runs here, for the event: "image job"
    events: EventLog

    def start_soon(self, run: Callable[..., Awaitable[object]], *args: object) -> None:
        self.nursery.start_soon(self._contained, run, args)

    async def _contained(self, run: Callable[..., Awaitable[object]], args: tuple[object, ...]) -> None:
        try:
            await run(*args)
        except Exception as exc:  # noqa: BLE001 - a failed job is an event, never the end of the service
            self.events.emit("internal_error", "error", source=self.kind, error=_words(exc),
                             traceback=_traceback(exc))


async def serve_contained_nursery(kind: str, events: EventLog, *,
                                  task_status: trio.TaskStatus[ContainedNursery] = trio.TASK_STATUS_IGNORED) -> None:
    """A ``ContainedNursery`` for *kind*, open until cancelled."""
    async with trio.open_nursery() as nursery:
        task_status.started(ContainedNursery(nursery, kind, events))
        await trio.sleep_forever()
