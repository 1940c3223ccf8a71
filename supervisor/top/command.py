"""``steward top [URL]``: its arguments, and which steward it watches.

Kept apart from the view and the loop so that ``steward``'s other commands never import rich.
"""

from __future__ import annotations

import argparse
import os
import sys

import attrs

from supervisor.config import load_config_for_command

DEFAULT_URL = "http://127.0.0.1:8080"
KEY_ENV = "STEWARD_KEY"
EXIT_USAGE = 2


def add_top_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    top = commands.add_parser("top", help="a live view of a running steward: memory, engines, queues, why they wait",
                              description="A live full-screen view of a running steward (keys: q quit, p pause, "
                                          "e events only).")
    top.add_argument("url", nargs="?", metavar="URL",
                     help=f"steward's address (default: the listen address of --config, else {DEFAULT_URL})")
    top.add_argument("--config", metavar="CONFIG", help="watch the steward this config describes (its listen)")
    top.add_argument("--key", metavar="KEY", help=f"an admin key, once keys are configured (default: ${KEY_ENV})")
    top.add_argument("--once", action="store_true", help="print one frame and exit (no full screen, no keys)")


def run_top(args: argparse.Namespace) -> int:
    url = steward_url(args.url, args.config)
    if url is None:
        return EXIT_USAGE
    from supervisor.top.app import print_once, run_live

    key = admin_key(args.key)
    return print_once(url, key) if args.once else run_live(url, key)


def admin_key(given: str | None) -> str | None:
    """The key a command sends to the admin API: --key, else $STEWARD_KEY, else none."""
    return given or os.environ.get(KEY_ENV) or None


def steward_url(url: str | None, config_path: str | None, command: str = "top") -> str | None:
    """The root URL of the steward ``steward COMMAND`` talks to: *url* as given, else the
    listen address of the config at *config_path*, else DEFAULT_URL; None (said) if neither works."""
    if url is None and config_path is not None:
        config = load_config_for_command(config_path)
        if config is None:
            return None
        address = config.listen
        # A steward listening on every address is reached on this machine's loopback.
        loopback = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(address.host, address.host)  # noqa: S104
        url = attrs.evolve(address, host=loopback).url
    from supervisor.top.client import admin_url  # httpx (and with it rich): only when top runs

    try:
        return admin_url(url or DEFAULT_URL)
    except ValueError as exc:
        print(f"steward {command}: {exc}", file=sys.stderr)
        return None
