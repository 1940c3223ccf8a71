"""The ``steward`` command: run, check, demo, keys, usage, and the tools around them.

Each command imports what it needs when it runs (check.py, serving.py, the tools'
modules through tools/commands.py), so ``--version`` starts with next to nothing and
``check`` without the gateway, the tools or numpy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


from supervisor.auth.commands import add_keys_parser, run_keys
from supervisor.config import Config, load_config_for_command
from supervisor.control.command import CONTROL_COMMANDS, add_control_parsers, run_control
from supervisor.exit_status import EXIT_CONFIG
from supervisor.tools.commands import TOOL_COMMANDS, add_tool_parsers, run_tool
from supervisor.top.command import add_top_parser, admin_key, run_top
from supervisor.usage.commands import add_usage_parser, run_usage


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="steward", description="One OpenAI-compatible front door for your GPUs.")
    parser.add_argument("--version", action=_Version)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="run the gateway and its engines")
    run.add_argument("config", help="path to the YAML config")
    check = commands.add_parser("check", help="validate a config and print the resolved plan")
    check.add_argument("config", help="path to the YAML config")
    reload = commands.add_parser("reload", help="make a running steward read its config again (as SIGHUP does)")
    reload.add_argument("config", help="path to the YAML config the steward runs (its file is read again)")
    reload.add_argument("--key", help="an admin key, once keys are configured (default: $STEWARD_KEY)")
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
    add_control_parsers(commands)
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
    if args.command in CONTROL_COMMANDS:
        return run_control(args)
    config = load_config_for_command(args.config)
    if config is None:
        return EXIT_CONFIG
    if args.command == "check":
        from supervisor.check import run_check  # the engines' plans: adapters, estimates

        return run_check(config)
    if args.command == "reload":
        return _reload(config, admin_key(args.key))
    from supervisor.serving import run_until_signalled  # the gateway: only to serve

    return run_until_signalled(config, on_ready=None, config_path=Path(args.config))


class _Version(argparse._VersionAction):
    """``--version``: the installed version, read only when asked (importlib.metadata is slow to import)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        self.version = f"steward {_version()}"
        super().__call__(parser, namespace, values, option_string)


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("gpu-steward")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "(unknown version: gpu-steward is not installed)"


def _reload(config: Config, key: str | None) -> int:
    """POST /admin/reload to the steward this config runs; say what changed, or why not."""
    url = f"http://{config.listen.host if config.listen.host not in ('0.0.0.0', '::') else '127.0.0.1'}:" \
          f"{config.listen.port}/admin/reload"
    import httpx  # only this command makes a request: --version and check start without it

    from supervisor.top.client import error_message, refusal_hint

    try:
        answer = httpx.post(url, headers={"authorization": f"Bearer {key}"} if key else {}, timeout=60)
    except httpx.HTTPError as exc:
        print(f"steward: no steward answers at {url}: {exc}", file=sys.stderr)
        return 1
    body = answer.json() if answer.headers.get("content-type", "").startswith("application/json") else {}
    if answer.status_code == 200:
        for what in ("added", "removed"):
            if body.get(what):
                print(f"{what:<8} {', '.join(body[what])}")
        for name in body.get("changed") or ():
            print(f"changed  {name}: {'; '.join(body.get('changes', {}).get(name) or ['its config'])}")
        print("reloaded" + ("" if any(body.get(w) for w in ("added", "removed", "changed", "rules_changed"))
                            else ": nothing changed"))
        return 0
    if answer.status_code == 422:
        print("steward: the new config is refused; the running one is kept:", file=sys.stderr)
        for problem in body.get("problems", []):
            print(f"  {problem}", file=sys.stderr)
        return EXIT_CONFIG
    said = error_message(answer)
    if answer.status_code in (401, 403):
        said = f"{refusal_hint(answer.status_code, has_key=key is not None, command='reload')} (steward says: {said})"
    print(f"steward: {url} answered {answer.status_code}: {said}", file=sys.stderr)
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
