"""``steward usage``: who used the GPUs, who waited, who was turned away.

It reads the usage log a steward writes (its own or a running one's: the read is
read-only) and prints one line per key, model, class, status, listener or route. Exit
status: 0 with a report (an empty log included), 2 when there is nothing to read (no
file, not a usage log, a config that does not load).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from supervisor.usage.report import Grouping, UsageReadError, format_report, parse_since, read_usage, report_json

EXIT_UNREADABLE = 2
DEFAULT_DB = "steward-usage.db"


def add_usage_parser(commands: argparse._SubParsersAction) -> None:
    usage = commands.add_parser("usage", help="requests per key, model or class from the usage log")
    where = usage.add_mutually_exclusive_group()
    where.add_argument("--db", metavar="PATH",
                       help=f"the usage log (default: the config's usage.db, or ./{DEFAULT_DB})")
    where.add_argument("--config", metavar="CONFIG", help="read the usage log this steward config names (usage.db)")
    usage.add_argument("--since", type=_since, default="24h", metavar="DURATION",
                       help="requests that arrived in the last DURATION: 30m, 24h, 7d (24h)")
    usage.add_argument("--by", choices=[grouping.value for grouping in Grouping], default=Grouping.KEY.value,
                       help="one line per what (key)")
    usage.add_argument("--json", action="store_true", help="print one JSON object")
    usage.add_argument("--budgets", action="store_true",
                       help="each key's budgets today and this month (UTC): used and left (needs --config)")


def run_usage(args: argparse.Namespace) -> int:
    path = _usage_db(args)
    if path is None:
        return EXIT_UNREADABLE
    if args.budgets:
        return _run_budgets(args, path)
    try:
        report = read_usage(path, by=Grouping(args.by), since_s=args.since, now=time.time())
    except UsageReadError as exc:
        print(f"steward: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    print(json.dumps(report_json(report), indent=2) if args.json else format_report(report))
    return 0


def _run_budgets(args: argparse.Namespace, path: str) -> int:
    """The budgets' table: the keys from the config's key file, their counts from the usage log."""
    from supervisor.auth.keys import KeyFileError, list_keys
    from supervisor.config import load_config_for_command
    from supervisor.usage.budget_report import budget_standings, budgets_json, format_budgets
    from supervisor.usage.counted import read_budget_counts

    if args.config is None:
        print("steward: --budgets needs --config: the budgets are in its key file (auth.keys_file)", file=sys.stderr)
        return EXIT_UNREADABLE
    config = load_config_for_command(args.config)
    if config is None:
        return EXIT_UNREADABLE
    now = time.time()
    try:
        keys = list_keys(config.auth.keys_file)
        day, month = read_budget_counts(path, now)
    except (KeyFileError, UsageReadError) as exc:
        print(f"steward: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    found = budget_standings(keys, day, month, now)
    print(json.dumps(budgets_json(path, found, now), indent=2) if args.json else format_budgets(path, found, now))
    return 0


def _usage_db(args: argparse.Namespace) -> str | None:
    """The database to read; None (said on stderr) when the config names none or does not load."""
    if args.db is not None:
        return str(args.db)
    if args.config is None:
        return DEFAULT_DB
    from supervisor.config import load_config_for_command

    config = load_config_for_command(args.config)
    if config is None:
        return None
    if config.usage.db is None:
        print(f"steward: {args.config} keeps no usage log (usage.db is null)", file=sys.stderr)
        return None
    return str(config.usage.db)


def _since(text: str) -> float:
    try:
        return parse_since(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
