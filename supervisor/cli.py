"""The ``steward`` command: run, check, demo, keys, usage, and the tools around them."""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import os
import shlex
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

import attrs
import httpx
import trio

from adapters.llama_server import fits_itself
from supervisor.auth.commands import add_keys_parser, run_keys
from supervisor.auth.keys import KeyFileError, load_key_file
from supervisor.config import Config, ConfigError, ModelConfig, load_config_for_command
from supervisor.accounting.cpu_share import describe_share, usable_cpus
from supervisor.config_policy import (
    compute_shares,
    engine_profiles,
    engine_specs,
    exposed_listeners,
    exposure_problem,
    listen_addresses,
)
from supervisor.dry_start import dry_start_problems
from supervisor.events import EventLogUnavailable
from supervisor.gateway.server import ListenError
from supervisor.measurements import MeasurementStore
from supervisor.memory_plan import budget_problems, plan_all
from supervisor.probes import ProbeUnavailable, open_probe
from supervisor.top.command import add_top_parser, run_top
from supervisor.tree import (
    Steward,
    StopSignals,
    budgets_beyond_devices,
    memory_device,
    resolve_budgets,
    run_steward,
)
from supervisor.units import format_duration, format_size, parse_duration
from supervisor.usage.commands import add_usage_parser, run_usage
from supervisor.usage.writer import UsageLogUnavailable

EXIT_CONFIG = 2
E = TypeVar("E", bound=BaseException)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="steward", description="One OpenAI-compatible front door for your GPUs.")
    parser.add_argument("--version", action="version", version=f"steward {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="run the gateway and its engines")
    run.add_argument("config", help="path to the YAML config")
    check = commands.add_parser("check", help="validate a config and print the resolved plan")
    check.add_argument("config", help="path to the YAML config")
    reload = commands.add_parser("reload", help="make a running steward read its config again (as SIGHUP does)")
    reload.add_argument("config", help="path to the YAML config the steward runs (its file is read again)")
    reload.add_argument("--key", default=os.environ.get("STEWARD_KEY"),
                        help="an admin key, once keys are configured (default: $STEWARD_KEY)")
    demo = commands.add_parser("demo", help="run on a simulated GPU with fake engines (no GPU, no config)")
    demo.add_argument("--port", type=int, default=8080, help="port to listen on (0 picks a free one)")
    demo.add_argument("--keep", action="store_true",
                      help="keep the demo's folder (event log, simulated GPU) after it stops")
    demo.add_argument("--real", action="store_true",
                      help="real llama-server engines (CPU) with tiny models written on the fly")
    load = commands.add_parser("loadtest", help="the GridCore client mix against steward, in real time")
    load.add_argument("--scenario", choices=("mix", "overload", "thrash", "real"), default="mix",
                      help="mix: the client mix below for --duration; overload: the home-lab seed's test, "
                           "--clients requests at once against an engine of fixed --capacity; thrash: the "
                           "simulator's thrash scenario (three agents, three models, room for two) on fake "
                           "engines for --duration, its loads against the simulator's; real: issue 27's mix "
                           "on real llama-servers with SmolLM2 (chats alone, then the mix, --duration each), "
                           "beside the simulator with this host's calibration (mix)")
    load.add_argument("--calibration", metavar="STATE_FILE",
                      help="real: a state file `steward calibrate` wrote for this mix, instead of calibrating first")
    load.add_argument("--clients", type=int, default=256, help="overload: requests sent at once (256)")
    load.add_argument("--capacity", type=float, default=20.0, help="overload: the engine's requests per second (20)")
    load.add_argument("--url", help="a running steward (default: start one on the demo's fake engines)")
    load.add_argument("--real", action="store_true",
                      help="start the steward on real llama-server engines (steward demo --real)")
    load.add_argument("--duration", type=parse_duration, default=None,
                      help="how long clients keep asking (mix 30s, thrash 90s, real 300s a run)")
    load.add_argument("--time-scale", type=float, default=None, metavar="F",
                      help="thrash: every time of the scenario x F, every speed / F (0.25)")
    for kind, count, model in (("chat", 3, "gemma4-12b"), ("background", 4, "gemma4-e4b"),
                               ("batch", 2, "gemma4-e2b"), ("embedding", 1, "nomic-embed")):
        load.add_argument(f"--{kind}", type=int, default=count, metavar="N", help=f"{kind} clients ({count})")
        load.add_argument(f"--{kind}-model", default=model, metavar="NAME", help=f"model they use ({model})")
    load.add_argument("--ollama", type=int, default=None, metavar="N",
                      help="Ollama clients, /api/chat on the Ollama listener (2 with --chaos, else 0)")
    load.add_argument("--ollama-model", default="llama3.2:3b", metavar="NAME", help="model they use (llama3.2:3b)")
    load.add_argument("--image", type=int, default=None, metavar="N",
                      help="image clients, /prompt on the ComfyUI listener (1 with --chaos, else 0)")
    load.add_argument("--seed", type=int, default=7, help="the clients' and the chaos's random choices (7)")
    load.add_argument("--json", action="store_true", help="print one JSON object")
    load.add_argument("--disconnects", action="store_true",
                      help="clients leave early now and then: a stream after a few chunks, others after a moment")
    load.add_argument("--disconnect-rate", type=float, default=0.2, metavar="P",
                      help="with --disconnects: the share of requests whose client leaves (0.2)")
    load.add_argument("--keep", action="store_true", help="keep steward's folder (config, event log, its stderr)")
    chaos = load.add_argument_group("chaos", "stop, freeze and kill the engines and upstreams steward "
                                             "supervises while the load runs, then check the invariants")
    chaos.add_argument("--chaos", action="store_true", help="needs the loadtest's own steward (no --url)")
    chaos.add_argument("--chaos-interval", type=parse_duration, default=5.0, metavar="DURATION",
                       help="mean time between two actions (5s)")
    chaos.add_argument("--chaos-actions", default="stop,freeze,kill", metavar="LIST",
                       help="which of stop (SIGTERM), freeze (SIGSTOP, then SIGCONT), kill (SIGKILL) (all)")
    chaos.add_argument("--freeze-max", type=parse_duration, default=15.0, metavar="DURATION",
                       help="a freeze lasts 1s to this long (15s)")
    chaos.add_argument("--warmup", type=parse_duration, default=None, metavar="DURATION",
                       help="no chaos before; steward's fd baseline is taken then (10%% of the duration, 2s-60s)")
    chaos.add_argument("--client-timeout", type=parse_duration, default=300.0, metavar="DURATION",
                       help="a client gives up after this long without a byte: the request counts as lost (300s)")
    chaos.add_argument("--idle-timeout", type=parse_duration, default=120.0, metavar="DURATION",
                       help="after the load, steward must be at rest within this (120s)")
    chaos.add_argument("--fd-tolerance", type=int, default=5, metavar="N",
                       help="steward's own fds at rest may exceed those after warm-up by this many (5)")
    chaos.add_argument("--sample-interval", type=parse_duration, default=5.0, metavar="DURATION",
                       help="how often steward's RSS and fds are sampled (5s)")
    simulate = commands.add_parser("simulate", help="replay a workload in virtual time: steward vs baseline policies")
    simulate.add_argument("scenario", nargs="?", help="scenario YAML (default: the built-in GridCore load test)")
    simulate.add_argument("--scenario", dest="builtin", metavar="NAME",
                          help="a built-in scenario: gridcore, thrash, family, or all (one after another)")
    simulate.add_argument("--seeds", metavar="SEEDS",
                          help="replay on each of these seeds (1-8, or 1,3,5): one row per seed, targets on every seed")
    simulate.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    simulate.add_argument("--policies", help="comma-separated subset of steward,fifo,swap,collate,lru-count,keepalive")
    simulate.add_argument("--calibration", metavar="STATE_FILE",
                          help="a state file `steward calibrate` wrote: its measured sharing (alpha, batching gain) "
                               "and, for engines of the same name, speeds and load times replace the scenario's")
    calibrate = commands.add_parser("calibrate", help="measure this host: the engines' speeds alone, with two "
                                    "slots and two at once, and their load times, into the state file")
    calibrate.add_argument("config", help="path to the YAML config")
    calibrate.add_argument("--engine", metavar="NAME", help="only this engine (default: every llama-server model)")
    calibrate.add_argument("--json", action="store_true", help="print one JSON object")
    estimate = commands.add_parser("estimate", help="memory a llama-server would take: GGUF header + its flags",
                                   usage="steward estimate [--json] [--device {gpu,cpu}] [--gpus N] "
                                         "MODEL.gguf [-- LLAMA_SERVER_ARGS ...]")
    estimate.add_argument("--json", action="store_true", help="print one JSON object (bytes)")
    estimate.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                          help="gpu: layers offloaded as the flags say; cpu: a CPU-only server, all host RAM")
    estimate.add_argument("--gpus", type=int, default=1, metavar="N", help="GPUs to spread layers over (1)")
    estimate.add_argument("model", help="the GGUF model file")
    estimate.add_argument("server_args", nargs=argparse.REMAINDER, help="llama-server flags after --")
    add_keys_parser(commands)
    add_usage_parser(commands)
    add_top_parser(commands)
    args = parser.parse_args(argv)

    if args.command == "demo":
        return _demo(args.port, real=args.real, keep=args.keep)
    if args.command == "loadtest":
        return _loadtest(args)
    if args.command == "simulate":
        return _simulate(args)
    if args.command == "estimate":
        return _estimate(args, estimate, argv)
    if args.command == "keys":
        return run_keys(args)
    if args.command == "usage":
        return run_usage(args)
    if args.command == "top":
        return run_top(args)
    config = load_config_for_command(args.config)
    if config is None:
        return EXIT_CONFIG
    if args.command == "calibrate":
        return _calibrate(config, args)
    if args.command == "check":
        return _check(config)
    if args.command == "reload":
        return _reload(config, args.key)
    return _run(config, on_ready=None, config_path=Path(args.config))


def _version() -> str:
    try:
        return importlib.metadata.version("gpu-steward")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "(unknown version: gpu-steward is not installed)"


def _check(config: Config) -> int:
    try:
        probe, note = open_probe(config.gpu)
        readings = probe.read() if probe else []
    except ProbeUnavailable as exc:
        print(f"steward: gpu.probe: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    specs = engine_specs(config)
    try:
        budgets = resolve_budgets(config, readings)
        plans = plan_all(config, {name: specs[name].command(0) for name in config.models},
                         MeasurementStore.open(config.state_file), memory_device(probe))
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"steward: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    host = usable_cpus()
    compute = compute_shares(config, host)
    print(f"listen   {config.listen}")
    print(f"probe    {note}")
    print(f"cpus     {host.count} for the engines ({host.cpus}), shared so that those computing at once never "
          f"oversubscribe them")
    budget = sum(device.nbytes for device in budgets)
    if len(budgets) == 1:
        print(f"budget   {format_size(budget)} ({budget} bytes) from {budgets[0].source}")
    else:
        print(f"budget   {format_size(budget)} over {len(budgets)} devices")
        for index, device in enumerate(budgets):
            print(f"  device {index}  {format_size(device.nbytes)} ({device.nbytes} bytes) from {device.source}")
    for name, model in config.models.items():
        spec, plan = specs[name], plans[name]
        aliases = [alias for alias, target in config.alias_table().items() if target == name and alias != name]
        print(f"\nmodel {name}  ({model.runtime}, {_tier(model)})")
        if model.upstream is not None:
            print(f"  attach   {model.upstream.url} (someone else runs it; steward waits for {model.health})")
        else:
            print(f"  command  {shlex.join(spec.command('<port>') or [])}")
        print(f"  memory   {format_size(plan.nbytes)} ({plan.nbytes} bytes) reserved while loaded, "
              f"{_SOURCES[plan.source]}")
        print(f"  slots    {spec.slots}" + ("" if model.runtime == "llama-server" else
                                             " (requests steward sends at once; the rest wait in its queue)"))
        if model.devices is not None:
            print(f"  devices  {', '.join(map(str, model.devices))}" + (
                " (split over them)" if len(model.devices) > 1 else ""))
        if model.upstream is None:
            print(f"  compute  {describe_share(compute.shares[name])}")
        if model.sleep is not None:
            held = (f"holds {format_size(model.sleep.memory)} asleep" if model.sleep.memory is not None
                    else "what it holds asleep is measured")
            print(f"  sleep    unloading is POST /sleep?level={model.sleep.level}, loading POST /wake_up; {held}")
        if model.idle_unload is not None:
            print(f"  idle     unloaded after {format_duration(model.idle_unload)} without a request")
        if model.runtime == "llama-server":
            print("  fit      llama-server's own --fit is " + (
                "on (set in args): it may change unset parameters to fit the memory it sees free"
                if fits_itself(model) else "off: steward plans the memory (set --fit in args to let it)"))
        if aliases:
            print(f"  aliases  {', '.join(aliases)}")
        if model.command is not None and shutil.which(model.command[0]) is None:
            print(f"  warning  {model.command[0]} is not an executable program here")
        if model.model is not None and not os.path.exists(model.model):
            print(f"  warning  model file {model.model} does not exist here")
    for name, service in (("ollama", config.ollama), ("comfyui", config.comfyui)):
        if service is not None:
            how = f"supervised: {shlex.join(service.command)}" if service.command else "attached"
            print(f"\n{name:<8} listen {service.listen or '(off)'} -> upstream {service.upstream} ({how})")
    if config.ollama is not None:
        print(f"  memory   {format_size(config.ollama.memory)} reserved while Ollama may hold models "
              f"(grows to what /api/ps reports), {config.ollama.parallel} request(s) at once")
    if config.comfyui is not None:
        need = config.comfyui.memory or budgets[0].nbytes
        print(f"  images   exclusive jobs in the {config.comfyui.job_class} class, {format_size(need)} each")
        for name, image in config.image_models.items():
            also = f" ({', '.join(image.aliases)})" if image.aliases else ""
            print(f"  model    {name}{also}: /v1/images/generations from {image.workflow}, {image.size}, "
                  f"{image.steps} steps by default")
    for name, node in config.nodes.items():
        key = f"key from ${node.key_env}" if node.key_env else "no key"
        wake = node.wake
        woken = (f"; wakes {wake.mac} via {wake.broadcast}:{wake.port}, waits {format_duration(wake.timeout)}"
                 if wake is not None else "")
        print(f"\nnode {name}  {node.url.url} ({key}{woken})")
        print(f"  models   {', '.join(node.models) + ' (configured)' if node.models else 'what it says it serves'}")
        if node.key_env and not os.environ.get(node.key_env):
            print(f"  warning  ${node.key_env} is not set here: `steward run` would refuse to start")
    for capability, models in config.capabilities.items():
        print(f"\ncapability {capability} -> {', '.join(models)} (the first resident, else the first that fits)")
    total = sum(plan.nbytes for plan in plans.values())
    pinned = sum(plans[name].nbytes for name, model in config.models.items() if model.resident)
    print(f"\nall models {format_size(total)}, pinned {format_size(pinned)}, budget {format_size(budget)}")
    profiles = engine_profiles(config, specs, plans)
    problems = budgets_beyond_devices(budgets, readings, memory_device(probe))
    problems += budget_problems(config, profiles, [device.nbytes for device in budgets]) + _auth_problems(config)
    problems += dry_start_problems(config)  # what run opens at start, opened here the same way
    problems += compute.problems
    for problem in problems:
        print(f"steward: {problem}", file=sys.stderr)
    return EXIT_CONFIG if problems else 0


def _auth_problems(config: Config) -> list[str]:
    """Print who may call steward; what would make `run` refuse to start."""
    try:
        keys = load_key_file(config.auth.keys_file).keys
    except KeyFileError as exc:
        return [str(exc)]
    exposed = exposed_listeners(config)
    if keys:
        print(f"keys     {len(keys)} in {config.auth.keys_file}: every request needs one")
    elif exposed:
        print(f"keys     none in {config.auth.keys_file}")
    elif config.auth.allow_unauthenticated:
        print(f"keys     none in {config.auth.keys_file}: auth.allow_unauthenticated lets anyone who can reach the "
              f"listeners use them")
    else:
        print(f"keys     none in {config.auth.keys_file}: open to this machine only (loopback)")
    if config.auth.allow_unauthenticated and not keys and any(
            not address.is_loopback for address in listen_addresses(config).values()):
        print("warning  auth.allow_unauthenticated with a listener beyond loopback: keep it unreachable from other "
              "machines (publish on 127.0.0.1) or add a key")
    print(f"usage    {config.usage.db or '(no usage log)'}")
    problem = exposure_problem(config, has_keys=bool(keys))
    return [] if problem is None else [problem]


def _tier(model: ModelConfig) -> str:
    if model.pinned:
        return "pinned"
    return "always on" if model.resident else "on demand"


_SOURCES = {"config": "set by hand", "measured": "measured on an earlier load",
            "estimate": "estimated from the GGUF header (replaced by a measurement after the first load)"}


def _reload(config: Config, key: str | None) -> int:
    """POST /admin/reload to the steward this config runs; say what changed, or why not."""
    url = f"http://{config.listen.host if config.listen.host not in ('0.0.0.0', '::') else '127.0.0.1'}:" \
          f"{config.listen.port}/admin/reload"
    try:
        answer = httpx.post(url, headers={"authorization": f"Bearer {key}"} if key else {}, timeout=60)
    except httpx.HTTPError as exc:
        print(f"steward: no steward answers at {url}: {exc}", file=sys.stderr)
        return 1
    body = answer.json() if answer.headers.get("content-type", "").startswith("application/json") else {}
    if answer.status_code == 200:
        for what in ("added", "removed", "changed"):
            if body.get(what):
                print(f"{what:<8} {', '.join(body[what])}")
        print("reloaded" + ("" if any(body.get(w) for w in ("added", "removed", "changed", "rules_changed"))
                            else ": nothing changed"))
        return 0
    if answer.status_code == 422:
        print("steward: the new config is refused; the running one is kept:", file=sys.stderr)
        for problem in body.get("problems", []):
            print(f"  {problem}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"steward: {url} answered {answer.status_code}: {body.get('error', {}).get('message', answer.text)}",
          file=sys.stderr)
    return 1


def _run(config: Config, on_ready: Callable[[Steward], None] | None, config_path: Path | None = None) -> int:
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


def _loadtest(args: argparse.Namespace) -> int:
    from supervisor import loadtest

    if args.scenario == "overload":
        from supervisor.overload import report_overload

        return report_overload(clients=args.clients, capacity_per_s=args.capacity, as_json=args.json, keep=args.keep)
    if args.scenario == "thrash":
        return _loadtest_thrash(args)
    if args.scenario == "real":
        return _loadtest_real(args)
    if args.calibration is not None:
        print("steward: loadtest: --calibration is for --scenario real", file=sys.stderr)
        return EXIT_CONFIG
    if args.time_scale is not None:
        print("steward: loadtest: --time-scale is for --scenario thrash", file=sys.stderr)
        return EXIT_CONFIG

    kinds = ("chat", "background", "batch", "embedding", "ollama")
    counts = {kind: getattr(args, kind) for kind in (*kinds, "image")}
    for kind, with_chaos in (("ollama", 2), ("image", 1)):
        if counts[kind] is None:
            counts[kind] = with_chaos if args.chaos and not args.real else 0  # the real demo has neither
    models = {kind: getattr(args, f"{kind}_model") for kind in kinds}
    options = None
    if args.chaos:
        actions = tuple(a.strip() for a in args.chaos_actions.split(",") if a.strip())
        if not actions or set(actions) - set(loadtest.chaos.ACTIONS):
            print(f"steward: loadtest: --chaos-actions: choose from {','.join(loadtest.chaos.ACTIONS)}, "
                  f"got {args.chaos_actions!r}", file=sys.stderr)
            return EXIT_CONFIG
        options = loadtest.ChaosOptions(
            interval=args.chaos_interval, actions=actions, freeze=(min(1.0, args.freeze_max), args.freeze_max),
            warmup=args.warmup, client_timeout=args.client_timeout, idle_timeout=args.idle_timeout,
            fd_tolerance=args.fd_tolerance, sample_interval=args.sample_interval)
    try:
        report = loadtest.run_loadtest(args.url, counts, 30.0 if args.duration is None else args.duration, models,
                                       args.seed, real=args.real,
                                       disconnect_rate=args.disconnect_rate if args.disconnects else 0.0,
                                       chaos_options=options, keep=args.keep)
    except RuntimeError as exc:
        print(f"steward: loadtest: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(json.dumps(report.to_json()) if args.json else loadtest.format_report(report))
    return 0 if report.passed else 1


def _loadtest_thrash(args: argparse.Namespace) -> int:
    from supervisor import loadtest_thrash

    # It compares with the simulator, so it runs only as the simulator does: its own steward on fakes.
    unsupported = [flag for flag, given in (("--url", args.url), ("--real", args.real), ("--chaos", args.chaos),
                                            ("--disconnects", args.disconnects)) if given]
    if unsupported:
        print(f"steward: loadtest: --scenario thrash runs its own steward on fake engines, as the simulator "
              f"replays it; leave out {', '.join(unsupported)}", file=sys.stderr)
        return EXIT_CONFIG
    duration = loadtest_thrash.DEFAULT_DURATION if args.duration is None else args.duration
    scale = loadtest_thrash.DEFAULT_SCALE if args.time_scale is None else args.time_scale
    try:
        report = loadtest_thrash.run_thrash_loadtest(duration, scale=scale, seed=args.seed, keep=args.keep)
    except (ValueError, RuntimeError) as exc:
        print(f"steward: loadtest: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(json.dumps(report.to_json()) if args.json else loadtest_thrash.format_thrash_report(report))
    return 0 if report.passed else 1


def _calibrate(config: Config, args: argparse.Namespace) -> int:
    from supervisor import calibrate

    try:
        result = calibrate.run_calibrate(config, args.engine)
    except (calibrate.CalibrationError, EventLogUnavailable) as exc:
        print(f"steward: calibrate: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(json.dumps(result.to_json()) if args.json else calibrate.format_calibration(result))
    return 0 if result.engines and result.write_problem is None else 1


def _loadtest_real(args: argparse.Namespace) -> int:
    from supervisor import loadtest_real

    # Its own stewards on real engines, compared with the simulator: nothing else to point it at.
    unsupported = [flag for flag, given in (("--url", args.url), ("--chaos", args.chaos),
                                            ("--disconnects", args.disconnects),
                                            ("--time-scale", args.time_scale is not None)) if given]
    if unsupported:
        print(f"steward: loadtest: --scenario real runs its own stewards on real engines; leave out "
              f"{', '.join(unsupported)}", file=sys.stderr)
        return EXIT_CONFIG
    duration = loadtest_real.DEFAULT_DURATION if args.duration is None else args.duration
    calibration = None if args.calibration is None else Path(args.calibration)
    try:
        report = loadtest_real.run_real_loadtest(duration, seed=args.seed, calibration=calibration, keep=args.keep)
    except (ValueError, RuntimeError, ConfigError) as exc:
        detail = "; ".join(exc.problems) if isinstance(exc, ConfigError) else str(exc)
        print(f"steward: loadtest: {detail}", file=sys.stderr)
        return EXIT_CONFIG
    print(json.dumps(report.to_json()) if args.json else loadtest_real.format_real_report(report))
    return 0 if report.passed else 1


def _demo(port: int, *, real: bool = False, keep: bool = False) -> int:
    from supervisor import demo
    from supervisor.config import parse_config

    with demo.open_workdir("demo", keep=keep) as workdir:
        try:
            raw = demo.real_demo_config_dict(workdir, port) if real else demo.demo_config_dict(workdir, port)
        except demo.RealEnginesUnavailable as exc:
            print(f"steward: demo --real needs a llama-server binary: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        config = parse_config(raw)

        def announce(steward: Steward) -> None:
            print(demo.banner(steward.url, workdir, real=real, keep=keep,
                              ollama=steward.ollama_urls[0] if steward.ollama_urls else None,
                              comfyui=steward.comfyui_urls[0] if steward.comfyui_urls else None), flush=True)

        return _run(config, on_ready=announce)


def _simulate(args: argparse.Namespace) -> int:
    import json

    from supervisor.simulate import (
        BUILTIN_SCENARIOS,
        builtin_scenario,
        format_report,
        load_scenario,
        parse_seeds,
        simulate,
        simulate_seeds,
    )
    from supervisor.simulate.policies import POLICIES

    chosen = list(POLICIES) if args.policies is None else [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in POLICIES]
    if unknown or not chosen:
        print(f"steward: --policies: unknown {', '.join(unknown) or '(none given)'}; choose from "
              f"{', '.join(POLICIES)}", file=sys.stderr)
        return EXIT_CONFIG
    if args.scenario is not None and args.builtin is not None:
        print("steward: simulate takes a scenario file or --scenario NAME, not both", file=sys.stderr)
        return EXIT_CONFIG
    if args.builtin == "all":
        names = list(BUILTIN_SCENARIOS)
    else:
        names = [BUILTIN_SCENARIOS[0] if args.builtin is None else args.builtin]
    if not set(names) <= set(BUILTIN_SCENARIOS):
        print(f"steward: --scenario: no built-in scenario {args.builtin!r}; choose from "
              f"{', '.join(BUILTIN_SCENARIOS)} or all (a scenario file of your own is the positional argument)",
              file=sys.stderr)
        return EXIT_CONFIG
    try:
        seeds = None if args.seeds is None else parse_seeds(args.seeds)
    except ValueError as exc:
        print(f"steward: --seeds: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        scenarios = [load_scenario(args.scenario)] if args.scenario is not None else list(map(builtin_scenario, names))
    except ConfigError as exc:
        print(f"steward: {args.scenario} is not a valid scenario:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return EXIT_CONFIG
    if args.calibration is not None:
        from supervisor.simulate.scenario import Calibration

        try:
            calibration = Calibration.from_state_file(args.calibration)
        except ConfigError as exc:
            print(f"steward: --{exc.problems[0]}", file=sys.stderr)
            return EXIT_CONFIG
        scenarios = [calibration.apply(s) for s in scenarios]
    results = [simulate(s, chosen) if seeds is None else simulate_seeds(s, seeds, chosen) for s in scenarios]
    if args.json:
        objects = [result.as_json() for result in results]
        print(json.dumps(objects[0] if len(objects) == 1 else {"scenarios": objects}))
    else:
        print("\n\n".join(map(format_report, results)))
    return 0


def _estimate(args: argparse.Namespace, parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    from supervisor.accounting.estimate import estimate, format_estimate
    from supervisor.accounting.gguf_header import GGUFError

    # argparse keeps `--` (and our own options) in the remainder only when options follow
    # MODEL; the raw argv says where the llama-server flags start.
    raw = sys.argv[1:] if argv is None else argv
    server_args = raw[raw.index("--") + 1:] if "--" in raw else []
    own = args.server_args[:len(args.server_args) - len(server_args)]
    own = own[:-1] if own[-1:] == ["--"] else own
    if own:
        args = parser.parse_args([*own, args.model], namespace=args)
    try:
        result = estimate(args.model, server_args, device=args.device, n_gpu=args.gpus)
    except GGUFError as exc:
        print(f"steward: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except (OSError, ValueError) as exc:
        print(f"steward: cannot estimate {args.model}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(json.dumps(result.to_json()) if args.json else format_estimate(result))
    return 0


def entry_point() -> None:
    try:
        sys.exit(main())
    except BrokenPipeError:
        # `steward check config.yaml | head` closed our stdout early: not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)


if __name__ == "__main__":
    entry_point()
