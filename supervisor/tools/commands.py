"""The tools' commands on the ``steward`` command line: demo, loadtest, simulate, calibrate, gpu-check.

Their flags and how each command reads them live here, beside the tools; a tool's own
module (and the fakes, the simulator, numpy) is imported only when its command runs,
so ``steward --version``, ``check`` and ``run`` start without them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from supervisor.config import Config, ConfigError, load_config_for_command, parse_config
from supervisor.observe.events import EventLogUnavailable
from supervisor.exit_status import EXIT_CONFIG
from supervisor.units import parse_duration

if TYPE_CHECKING:
    from supervisor.tree import Steward

TOOL_COMMANDS = ("demo", "loadtest", "simulate", "calibrate", "gpu-check")


def add_tool_parsers(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """The tools' subcommands, in the order ``steward --help`` lists them."""
    demo = commands.add_parser("demo", help="run on a simulated GPU with fake engines (no GPU, no config)")
    demo.add_argument("--port", type=int, default=8080, help="port to listen on (0 picks a free one)")
    demo.add_argument("--keep", action="store_true",
                      help="keep the demo's folder (event log, simulated GPU) after it stops")
    demo.add_argument("--real", action="store_true",
                      help="real llama-server engines (CPU): SmolLM2-135M-Instruct under the chat names, each "
                           "slot at its trained context of 8,192 tokens (fetched once, 93 MB), and a tiny "
                           "random-weight embedder")
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
                          help="a built-in scenario: gridcore, thrash, family, pressure, or all (one after another)")
    simulate.add_argument("--seeds", metavar="SEEDS",
                          help="replay on each of these seeds (1-8, or 1,3,5): one row per seed, targets on every seed")
    simulate.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    simulate.add_argument("--policies", help="comma-separated, of steward,fifo,swap,collate,lru-count,keepalive (the default: all "
                                               "of them) and no-fallback (steward without its fallback chains)")
    simulate.add_argument("--calibration", metavar="STATE_FILE",
                          help="a state file `steward calibrate` wrote: its measured sharing (alpha, batching gain) "
                               "and, for engines of the same name, speeds and load times replace the scenario's")
    calibrate = commands.add_parser("calibrate", help="measure this host: the engines' speeds alone, with two "
                                    "slots and two at once, and their load times, into the state file")
    calibrate.add_argument("config", help="path to the YAML config")
    calibrate.add_argument("--engine", metavar="NAME", help="only this engine (default: every llama-server model)")
    calibrate.add_argument("--json", action="store_true", help="print one JSON object")
    gpu = commands.add_parser("gpu-check", help="steward on this host's NVIDIA GPU: the ledger against NVML, "
                              "the estimates against the CUDA buffers, the phantom-memory guard on a real exit")
    gpu.add_argument("--simulated", action="store_true",
                     help="the same steps on a simulated GPU with the CPU llama-server (no GPU needed)")
    gpu.add_argument("--llama-server", type=Path, metavar="PATH",
                     help="this llama-server instead of the CUDA build (deploy/build-llama-server.sh --cuda)")
    gpu.add_argument("--save", type=Path, metavar="DIR",
                     help="write the report, the config, the event log and steward's output into DIR")
    gpu.add_argument("--keep", action="store_true", help="keep the check's folder (models, config, event log)")


def run_tool(args: argparse.Namespace) -> int:
    """Run the tool command *args* names (one of TOOL_COMMANDS); its exit status."""
    if args.command == "demo":
        return _demo(args.port, real=args.real, keep=args.keep)
    if args.command == "loadtest":
        return _loadtest(args)
    if args.command == "simulate":
        return _simulate(args)
    if args.command == "gpu-check":
        from supervisor.tools import gpu_check

        return gpu_check.main(simulated=args.simulated, llama_server=args.llama_server, keep=args.keep,
                              save=args.save)
    config = load_config_for_command(args.config)
    if config is None:
        return EXIT_CONFIG
    return _calibrate(config, args)


def _loadtest(args: argparse.Namespace) -> int:
    from supervisor.tools import chaos, loadtest, loadtest_chaos, loadtest_report

    if args.scenario == "overload":
        from supervisor.tools.overload import report_overload

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
        if not actions or set(actions) - set(chaos.ACTIONS):
            print(f"steward: loadtest: --chaos-actions: choose from {','.join(chaos.ACTIONS)}, "
                  f"got {args.chaos_actions!r}", file=sys.stderr)
            return EXIT_CONFIG
        options = loadtest_chaos.ChaosOptions(
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
    print(json.dumps(report.to_json()) if args.json else loadtest_report.format_report(report))
    return 0 if report.passed else 1


def _loadtest_thrash(args: argparse.Namespace) -> int:
    from supervisor.tools import loadtest_thrash

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
    from supervisor.tools import calibrate

    try:
        result = calibrate.run_calibrate(config, args.engine)
    except (calibrate.CalibrationError, EventLogUnavailable) as exc:
        print(f"steward: calibrate: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(json.dumps(result.to_json()) if args.json else calibrate.format_calibration(result))
    return 0 if result.engines and result.write_problem is None else 1


def _loadtest_real(args: argparse.Namespace) -> int:
    from supervisor.tools import loadtest_real

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
    from supervisor.serving import run_until_signalled
    from supervisor.tools import demo

    with demo.open_workdir("demo", keep=keep) as workdir:
        try:
            raw = demo.real_demo_config_dict(workdir, port) if real else demo.demo_config_dict(workdir, port)
        except demo.RealEnginesUnavailable as exc:
            print(f"steward: demo --real needs a llama-server binary and SmolLM2: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        config = parse_config(raw)

        def announce(steward: Steward) -> None:
            print(demo.banner(steward.url, workdir, real=real, keep=keep,
                              ollama=steward.ollama_urls[0] if steward.ollama_urls else None,
                              comfyui=steward.comfyui_urls[0] if steward.comfyui_urls else None), flush=True)

        return run_until_signalled(config, on_ready=announce)


def _simulate(args: argparse.Namespace) -> int:
    from supervisor.tools.simulate import (
        BUILTIN_SCENARIOS,
        builtin_scenario,
        format_report,
        load_scenario,
        parse_seeds,
        simulate,
        simulate_seeds,
    )
    from supervisor.tools.simulate.policies import DEFAULT_POLICIES, POLICIES

    chosen = list(DEFAULT_POLICIES) if args.policies is None else [p.strip() for p in args.policies.split(",") if p.strip()]
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
        from supervisor.tools.simulate.scenario import Calibration

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
