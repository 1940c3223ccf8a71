"""``steward loadtest --chaos``: the client load on its own steward while its engines and upstreams are hurt.

While the load runs (supervisor/tools/loadtest_clients.py) it stops, freezes and kills the
engines and upstreams that steward supervises, on a seeded schedule, and samples
steward's memory and fds (supervisor/tools/chaos.py has the actions and the checks).
Afterwards it checks that nothing was lost: steward alive and stopped cleanly, every
request answered, steward at rest, the ledger adding up, no process left, no fds gained.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from supervisor.engines.process import become_subreaper
from supervisor.engines.process_tree import rss_bytes
from supervisor.tools import chaos
from supervisor.tools.loadtest_clients import ClientKind, Endpoints, LoadTally, Outcome, load_line, run_clients
from supervisor.tools.loadtest_report import ChaosReport, LoadReport, ResourceSample, count_problems, summarize_events
from supervisor.tools.loadtest_steward import (
    STEWARD_OUTPUT,
    demo_steward_config,
    engines_in_words,
    listener_endpoints,
    start_steward,
    started_line,
    stop_as_planned,
)


@attrs.frozen
class ChaosOptions:
    """What ``--chaos`` does, and the bounds of the checks after it."""

    interval: float = 5.0  # mean seconds between two actions
    actions: tuple[str, ...] = chaos.ACTIONS
    freeze: tuple[float, float] = (1.0, 15.0)  # SIGSTOP lasts this long, uniformly drawn
    warmup: float | None = None  # no chaos before; the fd baseline is taken then (default: 10%, 2..60 s)
    # Longer than anything steward itself waits for (CHAOS_CONFIG: queue 60 s, start 30 s,
    # first byte 30 s, retries 5 s apart): a request that times out here is lost.
    client_timeout: float = 300.0
    idle_timeout: float = 120.0  # after the load, steward must be at rest within this
    fd_tolerance: int = 5
    sample_interval: float = 5.0  # steward's RSS and fds

    def warmup_for(self, duration: float) -> float:
        return self.warmup if self.warmup is not None else min(60.0, max(2.0, 0.1 * duration))


# Steward's own timeouts in the chaos config, small, so that it notices frozen and dead
# engines and upstreams within seconds (engines.health_check_* and the response timeouts
# are read by the health checks, issue 9).
CHAOS_CONFIG: dict[str, Any] = {
    "engines": {"health_check_interval": "1s", "health_check_timeout": "1s", "unhealthy_after": 2,
                "recover_timeout": "5s", "first_byte_timeout": "30s", "chunk_timeout": "10s",
                "start_timeout": "30s", "restart_backoff_max": "5s"},
    "classes": {"interactive": {"queue_timeout": "30s"}, "background": {"queue_timeout": "60s"},
                "batch": {"queue_timeout": "60s"}},
    "ollama": {"retry_max": "5s", "unload_timeout": "10s", "first_byte_timeout": "30s", "chunk_timeout": "10s"},
    "comfyui": {"retry_max": "5s", "job_timeout": "60s", "free_timeout": "10s"},
}


def run_chaos_loadtest(workdir: Path, kinds: Mapping[ClientKind, int], duration: float, seed: int,
                       options: ChaosOptions, *, real: bool, keep: bool, disconnect_rate: float,
                       announce: Callable[[chaos.ChaosRecord], None], say: Callable[[str], None]) -> LoadReport:
    """The load on a steward of its own in *workdir*, under chaos, then the invariants in its report.

    *announce* gets each chaos action as it is done; the other arguments are run_loadtest's.
    """
    # Orphans of a dying steward are re-parented here rather than to init, so the last
    # check (no process left) sees every descendant.
    become_subreaper()
    ours = os.getpid()
    before = {pid for pid, _ in chaos.descendants(ours)}
    output = workdir / STEWARD_OUTPUT
    config = demo_steward_config(workdir, real=real, overrides=CHAOS_CONFIG)
    process, steward_url, events = start_steward(workdir, config, stderr=output)
    watch = chaos.ProcessWatch(events)
    tally = LoadTally.of(kinds)
    try:
        say(started_line(steward_url, output, engines=engines_in_words(real), keep=keep))
        say(load_line(kinds, duration, steward_url))
        watch.poll()
        endpoints = listener_endpoints(events, steward_url)
        session = trio.run(_chaos_session, process, endpoints, watch, kinds, duration, seed, options,
                           disconnect_rate, announce, tally, say)
    finally:
        stop_started = time.monotonic()
        status = stop_as_planned(process, say)
        stop_s = time.monotonic() - stop_started
    watch.poll()
    left = _wait_for_no_descendants(ours, before, watch, deadline=time.monotonic() + 10.0)
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)  # the check has seen them; do not leave them running
        except ProcessLookupError:
            pass
    session.report.invariants = [
        chaos.check_alive(session.exited, None if session.exited is not None else status,
                          None if session.exited is not None else stop_s),
        chaos.check_answers(session.outcomes),
        session.idle,
        chaos.check_ledger(session.health),
        chaos.check_processes(left),
        chaos.check_fds(session.report.warm_fds, session.report.end_fds, options.fd_tolerance),
    ]
    session.report.problems = count_problems(events)
    session.report.workdir = str(workdir) if keep else None
    return LoadReport(duration, session.outcomes, summarize_events(events), session.report, tally=tally)


def _wait_for_no_descendants(root: int, before: set[int], watch: chaos.ProcessWatch,
                             deadline: float) -> list[tuple[int, str]]:
    """Descendants of *root* that were not there before steward, and every process steward spawned still alive."""
    while True:
        left = {pid: cmd for pid, cmd in chaos.descendants(root) if pid not in before}
        for incarnation in watch.spawned:
            if incarnation.pid not in left and chaos.is_running(incarnation):
                left[incarnation.pid] = f"({incarnation.name}, spawned by steward)"
        if not left or time.monotonic() > deadline:
            return sorted(left.items())
        time.sleep(0.1)


@attrs.define
class _Session:
    outcomes: list[Outcome]
    report: ChaosReport
    idle: chaos.Invariant
    health: dict[str, Any] | None  # the main listener's /healthz once steward was at rest
    exited: int | None  # steward's exit status if it died during the load


async def _chaos_session(process: subprocess.Popen[bytes], endpoints: Endpoints, watch: chaos.ProcessWatch,
                         kinds: Mapping[ClientKind, int], duration: float, seed: int, options: ChaosOptions,
                         disconnect_rate: float, announce: Callable[[chaos.ChaosRecord], None], tally: LoadTally,
                         say: Callable[[str], None]) -> _Session:
    started = trio.current_time()
    warmup = options.warmup_for(duration)
    targets = [*(name for name in _engine_names(watch)),
               *(name for name, url in (("ollama", endpoints.ollama), ("comfyui", endpoints.comfyui)) if url)]
    schedule = chaos.chaos_schedule(seed, targets, start=warmup, end=duration, mean_interval=options.interval,
                                    actions=options.actions, freeze=options.freeze)
    report = ChaosReport(seed, schedule, [], [], [])
    outcomes: list[Outcome] = []
    ports = watch.listener_ports()
    exited: int | None = None
    load = trio.CancelScope()

    def sample() -> None:
        rss, fds = rss_bytes(process.pid), chaos.count_fds(process.pid, ports)
        if rss is not None and fds is not None:
            report.samples.append(ResourceSample(round(trio.current_time() - started, 1), rss, fds.total,
                                                 fds.own_total))

    async def watch_steward() -> None:
        nonlocal exited
        next_sample = trio.current_time()
        while True:
            watch.poll()  # early, so that each spawned process's start time is read while it runs
            if process.poll() is not None:
                exited = process.returncode
                load.cancel(reason="steward exited")
                return
            if trio.current_time() >= next_sample:
                sample()
                next_sample += options.sample_interval
            await trio.sleep(0.25)

    def log(record: chaos.ChaosRecord) -> None:
        with (watch.path.parent / "chaos.jsonl").open("a") as f:  # beside steward's own log
            f.write(json.dumps(record.to_json()) + "\n")
        announce(record)

    async def chaos_after_warmup() -> None:
        await trio.sleep_until(started + warmup)
        report.warm_fds = chaos.count_fds(process.pid, ports)
        await chaos.run_chaos(schedule, watch, process.pid, started, report.records, log)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_steward)
        with load:
            async with trio.open_nursery() as load_nursery:
                load_nursery.start_soon(functools.partial(run_clients, endpoints, kinds, duration, seed,
                                                          timeout=options.client_timeout,
                                                          disconnect_rate=disconnect_rate, outcomes=outcomes,
                                                          tally=tally, say=say))
                load_nursery.start_soon(chaos_after_warmup)
        health = None
        if exited is None:
            idle, health = await _wait_idle(endpoints, options.idle_timeout)
            report.end_fds = await _settled_fds(process.pid, ports)
            sample()
        else:
            idle = chaos.check_idle(False, 0.0, [f"steward exited with status {exited}"])
        nursery.cancel_scope.cancel(reason="the load is over")
    return _Session(outcomes, report, idle, health, exited)


def _engine_names(watch: chaos.ProcessWatch) -> list[str]:
    models = (watch.listening or {}).get("models") or []
    return [str(m) for m in models]


async def _wait_idle(endpoints: Endpoints, bound: float) -> tuple[chaos.Invariant, dict[str, Any] | None]:
    """Poll every listener's /healthz until steward is at rest twice in a row, at most *bound* seconds."""
    started = trio.current_time()
    calm = 0
    busy: list[str] = []
    health = None
    async with httpx.AsyncClient(timeout=10.0) as http:
        while True:
            busy, health = await _busy(http, endpoints)
            calm = calm + 1 if not busy else 0
            waited = trio.current_time() - started
            if calm >= 2:
                return chaos.check_idle(True, waited, []), health
            if waited > bound:
                return chaos.check_idle(False, waited, busy), health
            await trio.sleep(0.5)


async def _busy(http: httpx.AsyncClient, endpoints: Endpoints) -> tuple[list[str], dict[str, Any] | None]:
    """What keeps steward from being at rest, by /healthz; empty when at rest."""
    busy: list[str] = []
    try:
        health = (await http.get(f"{endpoints.openai}/healthz")).json()
    except (httpx.HTTPError, ValueError) as exc:
        return [f"/healthz: {exc!r}"], None
    if health.get("mode") != "idle":
        busy.append(f"mode {health.get('mode')}")
    if health.get("queued"):
        busy.append(f"{health['queued']} queued")
    for klass, row in (health.get("classes") or {}).items():
        if row.get("running"):
            busy.append(f"{klass}: {row['running']} running")
    for name, engine in (health.get("engines") or {}).items():
        if engine.get("in_flight"):
            busy.append(f"{name}: {engine['in_flight']} in flight")
        if engine.get("status") in ("starting", "stopping"):
            busy.append(f"{name}: {engine['status']}")
        elif engine.get("status") in ("stopped", "failed") and engine.get("reserved"):
            busy.append(f"{name}: {engine['status']}, memory not yet released")
    for service, url in (("ollama", endpoints.ollama), ("comfyui", endpoints.comfyui)):
        if url is None:
            continue
        try:
            turnstile = (await http.get(f"{url}/healthz")).json()
        except (httpx.HTTPError, ValueError) as exc:
            busy.append(f"{service} /healthz: {exc!r}")
            continue
        if turnstile.get("state") != "idle" or turnstile.get("image_running") or turnstile.get("image_pending"):
            busy.append(f"{service} listener: state {turnstile.get('state')}, image running "
                        f"{turnstile.get('image_running', 0)}, pending {turnstile.get('image_pending')}")
    return busy, health


async def _settled_fds(pid: int, ports: set[int]) -> chaos.FdCount | None:
    """Steward's fds once the client connections it still held are closed (at most 10 s)."""
    with trio.move_on_after(10.0):
        while (fds := chaos.count_fds(pid, ports)) is not None and fds.clients:
            await trio.sleep(0.2)
        return fds
    return chaos.count_fds(pid, ports)
