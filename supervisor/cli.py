"""The ``steward`` command: run, check, demo, keys, usage, and the tools around them.

It imports what a command needs when that command runs: ``--version`` and ``check``
start without the gateway (serving.py), the tools (tools/commands.py) or numpy.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shlex
import shutil
import sys
from pathlib import Path

import httpx

from adapters.llama_server import fits_itself
from supervisor.accounting.cpu_share import describe_share, usable_cpus
from supervisor.auth.commands import add_keys_parser, run_keys
from supervisor.auth.keys import KeyFileError, load_key_file
from supervisor.budgets import budgets_beyond_devices, memory_device, resolve_budgets
from supervisor.config import Config, ConfigError, ModelConfig, load_config_for_command
from supervisor.config_policy import (
    compute_shares,
    engine_profiles,
    engine_specs,
    exposed_listeners,
    exposure_problem,
    listen_addresses,
)
from supervisor.dry_start import dry_start_problems
from supervisor.exit_status import EXIT_CONFIG
from supervisor.measurements import MeasurementStore
from supervisor.memory_plan import budget_problems, plan_all
from supervisor.probes import ProbeUnavailable, open_probe
from supervisor.tools.commands import TOOL_COMMANDS, add_tool_parsers, run_tool
from supervisor.top.command import add_top_parser, run_top
from supervisor.units import format_duration, format_size
from supervisor.usage.commands import add_usage_parser, run_usage


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
    add_tool_parsers(commands)
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

    if args.command in TOOL_COMMANDS:
        return run_tool(args)
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
    if args.command == "check":
        return _check(config)
    if args.command == "reload":
        return _reload(config, args.key)
    from supervisor.serving import run_until_signalled  # the gateway: only to serve

    return run_until_signalled(config, on_ready=None, config_path=Path(args.config))


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
