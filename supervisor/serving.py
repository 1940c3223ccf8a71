"""``steward run`` (and ``steward demo``): the nursery tree under trio until signals stop it.

SIGINT and SIGTERM drain, then stop (a second cuts the requests in flight, a third stops at
once); SIGHUP reloads the config. The command line imports this module only to serve, so
``steward check`` and ``--version`` start without the gateway.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

import attrs
import trio

from supervisor.auth.keys import KeyFileError
from supervisor.config import Config, ConfigError
from supervisor.observe.events import EventLogUnavailable
from supervisor.exit_status import EXIT_CONFIG
from supervisor.gateway.http.server import ListenError
from supervisor.engines.probes import ProbeUnavailable
from supervisor.tree import Steward, StopSignals, run_steward
from supervisor.usage.writer import UsageLogUnavailable

E = TypeVar("E", bound=BaseException)


def run_until_signalled(config: Config, on_ready: Callable[[Steward], None] | None,
                        config_path: Path | None = None) -> int:
    """Serve *config* until signals stop it; the exit status (EXIT_CONFIG: refused at start)."""
    try:
        trio.run(_serve_until_signalled, config, on_ready, config_path)
    except (ProbeUnavailable, EventLogUnavailable, UsageLogUnavailable, KeyFileError, ConfigError, OSError,
            BaseExceptionGroup) as exc:
        # Startup failures arrive wrapped in the nursery tree's exception groups.
        config_error = _find(exc, ConfigError)
        if config_error is not None:
            for problem in config_error.problems:
                print(f"steward: {problem}", file=sys.stderr)
            return EXIT_CONFIG
        probe_error = _find(exc, ProbeUnavailable)
        if probe_error is not None:
            print(f"steward: gpu.probe: {probe_error}", file=sys.stderr)
            return EXIT_CONFIG
        for kind in (EventLogUnavailable, UsageLogUnavailable, KeyFileError):
            if (unavailable := _find(exc, kind)) is not None:
                print(f"steward: {unavailable}", file=sys.stderr)
                return EXIT_CONFIG
        listen_error = _find(exc, ListenError)
        if listen_error is not None:
            print(f"steward: {listen_error}", file=sys.stderr)
            return 1
        raise
    return 0


def _find(exc: BaseException, kind: type[E]) -> E | None:
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find(inner, kind)
            if found is not None:
                return found
    return None


async def _serve_until_signalled(config: Config, on_ready: Callable[[Steward], None] | None,
                                 config_path: Path | None = None) -> None:
    stop = StopSignals()
    running = _Running(had_terminal=_has_terminal())
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_signals, signals, stop, nursery.cancel_scope, running)
            steward = await nursery.start(_run_then_stop, config, stop, nursery.cancel_scope, config_path)
            running.steward = steward
            _tune_gc()
            if on_ready is not None:
                on_ready(steward)


def _tune_gc() -> None:
    """Keep garbage collection pauses out of the latency tail.

    Everything alive after startup (modules, apps, the tree) is moved out of the
    collector's view, and young collections run less often. Measured with
    tests/benchmarks/bench_proxy.py at 64 connections: p99/p50 went from 2.2-2.3 to
    about 1.3, and throughput rose by a tenth.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)


async def _run_then_stop(config: Config, stop: StopSignals, everything: trio.CancelScope,
                         config_path: Path | None = None, *,
                         task_status: trio.TaskStatus[Steward] = trio.TASK_STATUS_IGNORED) -> None:
    await run_steward(config, stop, config_path=config_path, task_status=task_status)
    everything.cancel(reason="steward stopped")


@attrs.define
class _Running:
    had_terminal: bool  # steward started with a controlling terminal (a tmux pane, a shell)
    steward: Steward | None = None  # once started


def _has_terminal() -> bool:
    """Whether the controlling terminal is there (it is gone once a tmux pane or ssh session hangs up)."""
    try:
        os.close(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY))
    except OSError:
        return False
    return True


async def _watch_signals(signals: AsyncIterator[int], stop: StopSignals, everything: trio.CancelScope,
                         running: _Running) -> None:
    """SIGINT, SIGTERM: drain and stop (again: cut, a third time: at once). SIGHUP: reload the
    config, unless it is the hangup of steward's own terminal (tmux kill-session, a closed ssh
    session), which stops steward the way Ctrl-C does."""
    async with trio.open_nursery() as reloads:
        async for signum in signals:
            if signum == signal.SIGHUP and not (running.had_terminal and not _has_terminal()):
                steward = running.steward
                if steward is not None and steward.reload is not None and not stop.requested.is_set():
                    reloads.start_soon(steward.reload)
                else:
                    _say("steward: SIGHUP: no config file to read again (or not started yet); ignored")
                continue
            if not _stop_further(signum, stop, everything):
                return


def _stop_further(signum: int, stop: StopSignals, everything: trio.CancelScope) -> bool:
    """One more stop signal; False once steward is to stop at once."""
    name = "SIGHUP (its terminal hung up)" if signum == signal.SIGHUP else signal.Signals(signum).name
    if not stop.requested.is_set():
        _say(f"steward: {name}: draining requests in flight, then stopping engines (send it again to stop at once)")
        stop.requested.set()
    elif not stop.hurried.is_set():
        # A second signal: cut the requests still running (each gets an error it can
        # read); engines are still stopped cleanly.
        _say(f"steward: {name} again: cutting requests in flight, stopping engines")
        stop.hurried.set()
    else:
        everything.cancel(reason=f"third {name}")  # engines are still stopped (shielded)
        return False
    return True


def _say(line: str) -> None:
    """A line on stderr, which may be a terminal that hung up (then the event log has it all)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
