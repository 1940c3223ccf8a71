"""The nursery tree of ``steward run`` (DESIGN.md, "The nursery tree").

    steward run
    └─ root nursery
       ├─ event log writer          (owns the JSONL file; outlives everything else)     restarted
       ├─ usage log writer          (owns the SQLite usage log; outlives the listeners) restarted
       ├─ key file watcher          (reloads the keys the front door checks)            restarted
       ├─ GPU probe                 (polls NVML or the simulated GPU)                   restarted
       ├─ ledger + scheduler actor  (owns all scheduling and memory state)              fatal
       ├─ engine supervisors        (one task per engine; a reload adds and retires them)
       ├─ reloader                  (owns the running config: SIGHUP, steward reload)   restarted
       ├─ health watch, alerts      (logs each change of /healthz; posts to the webhook) restarted
       ├─ history                   (samples the last hour for /admin/history and /ui)   restarted
       ├─ node directory            (one poller per node)                               restarted, each
       ├─ upstream probes, image jobs                                                  contained
       └─ HTTP server               (Hypercorn serving the Quart-Trio apps)             fatal

Every long-lived task runs under ``supervise`` (supervise.py), which decides what its failure
means: "restarted" ones come back after a backoff, as a ``task_failed`` and a
``task_restarted`` event, with ``/healthz`` degraded meanwhile; only the actor, the listeners
and the tree itself end the service. Engine supervisors restart their engine's process
themselves (with ``engines.restart_backoff``).

Startup is a sequence of ``nursery.start`` calls. Shutdown: the HTTP server stops
accepting and lets requests in flight finish (bounded by limits.shutdown_timeout),
then everything else is cancelled; engine supervisors stop their processes on the
way out; the event log is written to the last line.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from supervisor.address import Address
from supervisor.observe.alerts import AlertPolicy, serve_alerts
from supervisor.auth.watch import serve_key_file
from supervisor.backoff import Backoff
from supervisor.budgets import budgets_beyond_devices, memory_device, resolve_budgets
from supervisor.config import OLLAMA_ENGINE, Config, ConfigError
from supervisor.config_policy import (
    build_scheduler,
    check_remote_keys,
    compute_shares,
    engine_profiles,
    engine_specs,
    exposed_listeners,
    exposure_problem,
    node_specs,
    scheduling_policy,
    slo_waits,
)
from supervisor.engines.driver import EngineHandle, serve_engine
from supervisor.observe.events import Event, EventLog, open_event_log
from supervisor.gateway.openai import app as gateway_app
from supervisor.gateway.comfy import app as comfy_app
from supervisor.gateway.ollama import app as ollama_app
from supervisor.gateway.openai.api_routes import error_shape_for
from supervisor.gateway.openai.app import create_app
from supervisor.gateway.services import Services, body_limits
from supervisor.gateway.http.asgi import Scope
from supervisor.gateway.catalog import ModelCatalog
from supervisor.gateway.comfy.api import NodeCatalog
from supervisor.gateway.comfy.app import create_comfy_app
from supervisor.gateway.comfy.jobs import ComfyTurnstile, warm_model
from supervisor.gateway.http.cross_site import CrossSitePolicy, cross_site_guard
from supervisor.gateway.door import FrontDoor, front_door
from supervisor.gateway.errors import ErrorShape, comfy_error_body, error_body, ollama_error_body
from supervisor.gateway.http.gate import CUT_GRACE_S, RequestGate
from supervisor.gateway.openai.images import ImageHandler
from supervisor.gateway.openai.videos import VideoHandler
from supervisor.videos.service import VideoService, serve_videos
from supervisor.videos.store import VideoStore
from supervisor.gateway.ollama.app import create_ollama_app
from supervisor.gateway.ollama.app import error_shape as ollama_route_shape
from supervisor.gateway.remote import NodeRouter
from supervisor.gateway.http.server import Listener, serve_http
from supervisor.gateway.relay.upstream import Timeouts
from supervisor.observe.history import History, Totals, serve_history
from supervisor.observe.health import HealthWatch, RecentActivity, StandingFaults, serve_health
from supervisor.engines.measurements import MeasurementStore
from supervisor.engines.memory_plan import budget_problems, plan_all
from supervisor.observe.metrics import StewardMetrics
from supervisor.nodes.directory import serve_node_directory
from supervisor.engines.probes import GpuProbe, GpuReading, open_probe
from supervisor.engines.process_tree import fold_to_roots, read_parents
from supervisor.reload import Reload
from supervisor.reloader import Reloader, serve_reloads
from supervisor.scheduler.actor import SchedulerClient, open_scheduler_mailbox, serve_scheduler
from supervisor.scheduler.types import DeviceUse
from supervisor.engines.service_probe import probe_upstream
from supervisor.engines.service import serve_service_process
from supervisor.observe.slowdown import ComputeCompany, PaceMeter, SpeedBook
from supervisor.supervise import OnFailure, Supervision, serve_contained_nursery, supervise
from supervisor.units import format_size
from supervisor.usage.counted import keep_budget_counts
from supervisor.usage.writer import UsageLog, serve_usage_log


@attrs.define(eq=False)
class Steward:
    """Handles to a running steward, for the CLI and for tests."""

    urls: list[str]
    events: EventLog
    scheduler: SchedulerClient
    engines: dict[str, EngineHandle]
    probe: GpuProbe | None
    readings: list[GpuReading]
    ollama_urls: list[str] = attrs.Factory(list)
    comfyui_urls: list[str] = attrs.Factory(list)
    reload: Reload | None = None  # read the config file again and apply it (None: not started from a file)

    @property
    def url(self) -> str:
        return self.urls[0]


@attrs.define(eq=False)
class StopSignals:
    """How steward is told to stop: ``requested`` drains the requests in flight (bounded by
    limits.shutdown_timeout), ``hurried`` cuts the ones still running at once."""

    requested: trio.Event = attrs.Factory(trio.Event)
    hurried: trio.Event = attrs.Factory(trio.Event)


async def run_steward(config: Config, stop: StopSignals, *, config_path: Path | None = None,
                      task_status: trio.TaskStatus[Steward] = trio.TASK_STATUS_IGNORED) -> None:
    """Run until *stop* is requested, then drain and stop everything. With *config_path* (the
    file *config* was read from) the config can be reloaded (``Steward.reload``)."""
    events, log_writer = open_event_log(config.log.file, terminal_level=config.log.terminal,
                                        max_size=config.log.max_size, keep=config.log.keep)
    # Health hears from the first event on: a task or a file that fails at once is degraded health too.
    health = HealthInputs(RecentActivity(config.health.window), StandingFaults(), Supervision(events))
    events.listeners += [health.recent.observe, health.standing.observe]
    try:
        async with trio.open_nursery() as outer:
            await outer.start(supervise, health.supervision, "event log writer", log_writer.serve)
            try:
                async with trio.open_nursery() as writing:  # left once the usage log's last rows are written
                    usage = await writing.start(functools.partial(serve_usage_log, config.usage.db, events,
                                                                  supervision=health.supervision))
                    try:
                        await _run_tree(config, stop, events, usage, health, config_path, task_status)
                    finally:
                        usage.close()  # the listeners are gone: its writer writes the last rows and ends
            finally:
                events.emit("shutdown_complete", "info")
                events.close()
    finally:
        log_writer.close()


@attrs.frozen
class HealthInputs:
    """What /healthz reads besides the scheduler, there from the first event on."""

    recent: RecentActivity
    standing: StandingFaults
    supervision: Supervision


async def _run_tree(config: Config, stop: StopSignals, events: EventLog, usage: UsageLog, inputs: HealthInputs,
                    config_path: Path | None, task_status: trio.TaskStatus[Steward]) -> None:
    supervision = inputs.supervision
    engines: dict[str, EngineHandle] = {}
    probe, probe_note = open_probe(config.gpu, lambda: engine_pids(engines))
    readings = probe.read() if probe else []
    budgets = resolve_budgets(config, readings)
    if problems := budgets_beyond_devices(budgets, readings, memory_device(probe)):
        raise ConfigError(problems)  # what `steward check` refuses, `run` refuses too
    budget = sum(device.nbytes for device in budgets)
    events.emit("probe", "info", probe=probe.kind if probe else None, note=probe_note,
                budget=budget, budget_text=format_size(budget), budget_source=budgets[0].source,
                devices=[{"budget": device.nbytes, "source": device.source} for device in budgets])
    compute = compute_shares(config)  # each engine's threads and CPUs, as engine_specs passes them
    if compute.problems:
        raise ConfigError(compute.problems)  # what `steward check` refuses, `run` refuses too
    for name, share in compute.shares.items():
        events.emit("compute_share", "info", engine=name, threads=share.threads, source=share.source.value,
                    cpus=None if share.cpus is None else str(share.cpus), how=share.how)
    check_remote_keys(config, os.environ)  # what `steward check` refuses, `run` refuses too
    specs = engine_specs(config)
    store = MeasurementStore.open(config.state_file)
    plans = plan_all(config, {name: specs[name].command(0) for name in config.models}, store, memory_device(probe))
    for name, plan in plans.items():
        events.emit("memory_plan", "info", engine=name, memory=plan.nbytes, memory_text=format_size(plan.nbytes),
                    source=plan.source)
    if problems := budget_problems(config, engine_profiles(config, specs, plans), [d.nbytes for d in budgets]):
        raise ConfigError(problems)  # what `steward check` refuses, `run` refuses too
    load_times = {name: seconds for name, plan in plans.items() if (seconds := store.load_time(plan.key)) is not None}
    core = build_scheduler(config, specs, plans, [d.nbytes for d in budgets], observe_memory=probe is not None,
                           load_times=load_times)
    client, mailbox = open_scheduler_mailbox(core)
    catalog = ModelCatalog.of(config)
    door = FrontDoor(events, usage, exposed=exposed_listeners(config), open_paths=frozenset(config.auth.open_paths),
                     aliases=catalog.names)
    await keep_budget_counts(door.budgets, usage, events)  # what each key used today and this month
    async with httpx.AsyncClient(timeout=2.0) as http, trio.open_nursery() as root:
        reloader = Reloader(config_path or Path(), config, [d.nbytes for d in budgets], memory_device(probe), store,
                            plans, engines, catalog, client, events, http, root)

        def kept(problem: str | None) -> None:
            if problem is not None:
                events.emit("state_write_failed", "warning", path=config.state_file, detail=problem)

        # The running config's plans (a reload replaces them) say where each figure is kept.
        def remember(engine: str, nbytes: int) -> None:
            if (plan := reloader.plans.get(engine)) is not None:
                kept(store.record(plan.key, engine, nbytes))

        def remember_load(event: Event) -> None:
            """Each load's time (a `ready` that is not a wake's) tells what evicting it costs."""
            if event.name == "ready" and not event.fields.get("wake"):
                engine = str(event.fields["engine"])
                if (plan := reloader.plans.get(engine)) is not None:
                    kept(store.record_load_time(plan.key, engine, float(event.fields["load_s"])))

        events.listeners.append(remember_load)
        # Each answer's slowdown against its engine alone, and what computed beside it (slowdown.py).
        company = ComputeCompany()
        events.listeners.append(company.observe)
        speeds = SpeedBook(store, lambda: {name: plan.key for name, plan in reloader.plans.items()}, kept)
        door.pace = PaceMeter(company, speeds)

        keys = await root.start(supervise, supervision, "key file watcher", functools.partial(
            serve_key_file, config.auth.keys_file, events, door.replace_keys, interval=config.auth.reload_interval))
        if (problem := exposure_problem(config, has_keys=not keys.empty)) is not None:
            raise ConfigError([problem])
        for name, spec in specs.items():
            engines[name] = await root.start(serve_engine, spec, client, events, http)
        if config.ollama is not None:
            root.start_soon(supervise, supervision, "ollama probe", functools.partial(
                probe_upstream, http, OLLAMA_ENGINE, f"{config.ollama.upstream.url}/api/version", events,
                bool(config.ollama.command)))
        await root.start(functools.partial(supervise, supervision, "scheduler actor", functools.partial(
            serve_scheduler, core, mailbox, engines, events, on_measured=remember, on_retired=reloader.on_retired),
            on_failure=OnFailure.STOP_SERVICE))
        reload = await root.start(serve_reloads, reloader, supervision) if config_path is not None else None
        steward = Steward([], events, client, engines, probe, readings, reload=reload)
        if probe is not None:
            await root.start(supervise, supervision, "gpu probe", functools.partial(
                serve_probe, probe, config.gpu.poll_interval, steward, client))
        gate = RequestGate()
        health = HealthWatch(client, inputs.recent, slo_waits(config), inputs.standing, supervision,
                             slowdown_limit=config.health.slowdown)
        await root.start(supervise, supervision, "health watch", functools.partial(
            serve_health, health, events, config.health.interval))
        if config.alerts.webhook is not None:
            alerts = config.alerts  # the alerter follows the event log from here on
            await root.start(supervise, supervision, "alerts", functools.partial(
                serve_alerts, alerts.webhook, AlertPolicy(alerts.min_interval, alerts.crash_loop), events, http,
                timeout=alerts.timeout))
        metrics = StewardMetrics()
        metrics.watch(client, health, memory_device(probe), speeds)
        events.listeners.append(metrics.observe)
        usage.listeners.append(metrics.observe_usage)
        history = await root.start(supervise, supervision, "history", functools.partial(
            serve_history, History(), client.snapshot, lambda: Totals(metrics.completion_tokens(),
                                                                       metrics.rejections()),
            memory_device(probe), time.time))
        limits = body_limits(config)
        nodes = await _start_nodes(config, root, http, events, supervision) if config.nodes else None
        if nodes is not None:
            metrics.watch_fleet(nodes.fleet)
        turnstile = comfy_nodes = None
        if config.comfyui is not None:
            warm = None
            if config.ollama is not None and config.comfyui.warm_model is not None:
                warm = functools.partial(warm_model, config.ollama, config.comfyui.warm_model, client, http, events)
            turnstile = ComfyTurnstile(config.comfyui, client, events, http,
                                       await root.start(serve_contained_nursery, "image job", events), warm)
            comfy_nodes = NodeCatalog(http, config.comfyui.upstream.url)
        images = (ImageHandler(turnstile, comfy_nodes, catalog, door, limits, gate.closed)
                  if turnstile is not None and comfy_nodes is not None else None)
        videos = None
        if images is not None:
            store = VideoStore(Path(config.videos.dir), config.videos.max_bytes, config.videos.keep)
            service = await root.start(supervise, supervision, "video jobs", functools.partial(
                serve_videos, VideoService(store, images, events, usage=door.usage)))
            videos = VideoHandler(service, catalog, door, limits)
        services = Services(scheduler=client, events=events, gate=gate, metrics=metrics, door=door, health=health,
                            body_limits=limits, device=memory_device(probe), nodes=nodes, catalog=catalog,
                            reload=reload, images=images, videos=videos, history=history, usage_db=config.usage.db)
        openai_app = create_app(config, services)
        listeners = [_listener(config, events, door, "openai", openai_app, config.listen, error_body,
                               error_shape_for, gateway_app.is_admin_route)]
        if config.ollama is not None and config.ollama.listen is not None:
            app = create_ollama_app(config.ollama, services)
            listeners.append(_listener(config, events, door, "ollama", app, config.ollama.listen, ollama_error_body,
                                       ollama_route_shape, ollama_app.is_admin_route))
        if config.comfyui is not None and config.comfyui.command:
            await root.start(serve_service_process, "comfyui", config.comfyui.command, {}, events,
                             Backoff(config.comfyui.retry_initial, config.comfyui.retry_max))
        if config.comfyui is not None:
            root.start_soon(supervise, supervision, "comfyui probe", functools.partial(
                probe_upstream, http, "comfyui", f"{config.comfyui.upstream.url}/system_stats", events,
                bool(config.comfyui.command)))
        if turnstile is not None and comfy_nodes is not None and config.comfyui.listen is not None:
            app = create_comfy_app(turnstile, comfy_nodes, services)
            listeners.append(_listener(config, events, door, "comfyui", app, config.comfyui.listen, comfy_error_body,
                                       lambda scope: comfy_error_body, comfy_app.is_admin_route))

        async def shutdown_trigger() -> None:
            await stop.requested.wait()
            events.emit("shutdown", "info", detail="no new connections; draining requests in flight",
                        timeout_s=config.limits.shutdown_timeout)
            client.close()  # requests still waiting for their turn are answered now

        def on_cut(requests: int, reason: str) -> None:
            events.emit("shutdown_cut", "warning", requests=requests, reason=reason)

        urls = await root.start(functools.partial(
            supervise, supervision, "listeners", functools.partial(
                _serve_gateway_then_stop, listeners, gate, config, events, shutdown_trigger, stop.hurried, on_cut,
                root.cancel_scope), on_failure=OnFailure.STOP_SERVICE))
        steward.urls = urls["openai"]
        steward.ollama_urls = urls.get("ollama", [])
        steward.comfyui_urls = urls.get("comfyui", [])
        events.emit("listening", "info", urls=steward.urls, pid=os.getpid(), models=list(config.models),
                    ollama=steward.ollama_urls or None, comfyui=steward.comfyui_urls or None)
        task_status.started(steward)


async def _start_nodes(config: Config, root: trio.Nursery, http: httpx.AsyncClient, events: EventLog,
                       supervision: Supervision) -> NodeRouter:
    """A front door's nodes: their directory (polled, woken), and the router that sends requests to them."""
    remembered = None if config.state_file is None else Path(config.state_file).with_name("steward-nodes.json")
    directory = await root.start(functools.partial(serve_node_directory, node_specs(config, os.environ), http,
                                                   events, remembered=remembered, supervision=supervision))
    return NodeRouter(directory, config.capabilities, events, scheduling_policy(config).queue_timeout,
                      {name: node.wake.timeout for name, node in config.nodes.items() if node.wake is not None},
                      Timeouts(config.engines.first_byte_timeout, config.engines.chunk_timeout), http=http)


def _listener(config: Config, events: EventLog, door: FrontDoor, name: str, app: object, address: Address,
              shape: ErrorShape, shape_for: Callable[[Scope], ErrorShape],
              is_admin_route: Callable[[Scope], bool] = lambda scope: False) -> Listener:
    """One listener behind the front door (keys, usage rows) and the cross-site guard."""
    policy = CrossSitePolicy.create(address, config.security.allowed_hosts, config.security.allowed_origins)

    def refused(scope: dict[str, Any], problem: str) -> None:
        events.emit("cross_site_refused", "info", listener=name, path=scope.get("path"), detail=problem)

    guarded = cross_site_guard(app, policy, shape_for, refused)  # type: ignore[arg-type]
    return Listener(name, front_door(guarded, door, name, shape_for, is_admin_route), address, shape, shape_for)


async def _serve_gateway_then_stop(listeners: list[Listener], gate: RequestGate, config: Config, events: EventLog,
                                   shutdown: Callable[[], Awaitable[object]], hurried: trio.Event,
                                   on_cut: Callable[[int, str], None], root: trio.CancelScope, *,
                                   task_status: trio.TaskStatus[dict[str, list[str]]] = trio.TASK_STATUS_IGNORED,
                                   ) -> None:
    await serve_gateway(listeners, gate, config, events, shutdown, hurried, on_cut, task_status=task_status)
    # The gateway has drained: no request is in flight, so the engines may go.
    root.cancel(reason="gateway drained")


async def serve_gateway(listeners: list[Listener], gate: RequestGate, config: Config, events: EventLog,
                        shutdown: Callable[[], Awaitable[object]], hurried: trio.Event,
                        on_cut: Callable[[int, str], None],
                        *, task_status: trio.TaskStatus[dict[str, list[str]]] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve every listener until *shutdown* returns; then stop accepting and wait for the
    requests in flight on all of them, until the shutdown timeout or *hurried*; whatever
    still runs then is cut, each request with an error its client can read."""
    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_http, listeners, config.limits.max_connections, events)
        task_status.started(server.urls)
        await shutdown()
        gate.close()
        await server.stop_accepting()
        # Idle keep-alive connections close at once; one with a request on it closes after its
        # answer, the answer to a request already sent as we stopped too (503: the gate is closed).
        with trio.move_on_after(config.limits.shutdown_timeout) as waiting:
            async with trio.open_nursery() as race:
                race.start_soon(_cancel_when, server.all_closed.wait, race.cancel_scope)
                race.start_soon(_cancel_when, hurried.wait, race.cancel_scope)
        if gate.in_flight:
            on_cut(gate.cut(), "shutdown_timeout" if waiting.cancelled_caught else "second_signal")
            with trio.move_on_after(CUT_GRACE_S + 1.0):
                await gate.wait_drained()
        nursery.cancel_scope.cancel(reason="requests drained")


async def _cancel_when(event: Callable[[], Awaitable[object]], scope: trio.CancelScope) -> None:
    await event()
    scope.cancel(reason="done waiting")


async def serve_probe(probe: GpuProbe, interval: float, steward: Steward, scheduler: SchedulerClient, *,
                      task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Read the GPU and tell the scheduler; faster while an engine's memory is awaited free."""
    task_status.started()
    while True:
        try:
            steward.readings = probe.read()
            roots, parents = engine_pids(steward.engines), read_parents()
            # An engine's memory is its whole process tree's (vLLM's is in its child processes).
            devices = [DeviceUse(device.used_bytes, fold_to_roots(device.processes, roots, parents))
                       for device in steward.readings]
        except Exception as exc:  # a flaky driver must not take steward down
            steward.events.emit("probe_error", "warning", probe=probe.kind, detail=str(exc))
        else:
            scheduler.report_memory(devices)
        snapshot = scheduler.snapshot()
        settling = snapshot.releasing or any(e.status == "stopping" for e in snapshot.engines)
        await trio.sleep(min(interval, FAST_POLL_S) if settling else interval)


def engine_pids(engines: Mapping[str, EngineHandle]) -> list[int]:
    """The roots of the engines' process trees (the processes steward runs for them)."""
    return [handle.pid for handle in engines.values() if handle.pid is not None]


FAST_POLL_S = 0.1
