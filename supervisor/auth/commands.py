"""``steward keys add|list|remove``: the key file by hand, without editing JSON.

The commands only read and write ``auth.keys_file``; a running steward sees the change at its
next look at the file (``auth.reload_interval``), so no restart is needed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from supervisor.auth.budgets import Budget, amount
from supervisor.auth.keys import BUDGET_FIELDS, ApiKey, KeyCommandError, KeyFileError, add_key, list_keys, remove_key, unknown_models
from supervisor.config import COMFYUI_SCOPE, load_config_for_command
from supervisor.request_class import RequestClass

EXIT_OK = 0
EXIT_ERROR = 2
_COLUMNS = ("NAME", "MODELS", "CLASSES", "DEFAULT", "RPM", "CONCURRENCY", "ADMIN", "REMOTE", "BUDGETS", "CREATED")


def add_keys_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    keys = commands.add_parser("keys", help="add, list and remove API keys (auth.keys_file)")
    actions = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="make a new key and print it once")
    add.add_argument("name", metavar="NAME", help="who uses the key: 1-64 letters, digits and ._-")
    add.add_argument("--models", type=_names, metavar="A,B",
                     help=f"models or aliases it may use, and {COMFYUI_SCOPE} for the ComfyUI listener (any workflow) "
                          f"(default: all, the ComfyUI listener included)")
    add.add_argument("--classes", type=_names, metavar="A,B",
                     help=f"classes it may ask for, of {','.join(RequestClass)} (default: all)")
    add.add_argument("--default-class", choices=[klass.value for klass in RequestClass], metavar="CLASS",
                     help="class of its requests that name none (default: its highest class; with all classes, "
                          "the listener's default)")
    add.add_argument("--rpm", type=int, metavar="N", help="at most N requests in any minute (default: no limit)")
    add.add_argument("--concurrency", type=int, metavar="N", help="at most N requests at once (default: no limit)")
    add.add_argument("--admin", action="store_true", help="may use steward's admin endpoints")
    for field, kind, what in (("tokens_per_day", int, "prompt + completion tokens per day"),
                              ("tokens_per_month", int, "prompt + completion tokens per month"),
                              ("requests_per_day", int, "requests that reach an engine per day"),
                              ("spend_per_month", float, "remote models' cost per month, e.g. 5.00")):
        add.add_argument(f"--{field.replace('_', '-')}", dest=field, type=kind, metavar="N",
                         help=f"a budget: at most {what} (calendar day or month, UTC; default: none)")
    remote = add.add_mutually_exclusive_group()
    remote.add_argument("--no-remote", dest="no_remote", action="store_const", const=True,
                        help="may never use a remote model (a cloud), even one --models names (default for a key "
                             "whose --models names none)")
    remote.add_argument("--remote", dest="no_remote", action="store_const", const=False,
                        help="may use remote models (a key without --models: all of them)")
    listing = actions.add_parser("list", help="the keys, without their secrets")
    remove = actions.add_parser("remove", help="remove a key (a running steward stops accepting it)")
    remove.add_argument("name", metavar="NAME")
    for action in (add, listing, remove):
        action.add_argument("--config", required=True, metavar="CONFIG", help="steward's YAML config")


def run_keys(args: argparse.Namespace) -> int:
    config = load_config_for_command(args.config)
    if config is None:
        return EXIT_ERROR
    path = config.auth.keys_file
    try:
        if args.keys_command == "add":
            first = not list_keys(path)
            known = {**config.alias_table(), **config.image_alias_table(), **config.remote_alias_table(),
                     **({COMFYUI_SCOPE: COMFYUI_SCOPE} if config.comfyui is not None else {})}
            text = add_key(path, args.name, models=args.models, classes=args.classes,
                           default_class=args.default_class, rpm=args.rpm, concurrency=args.concurrency,
                           admin=args.admin, known_models=known, ollama=config.ollama is not None,
                           budgets={field: value for field in BUDGET_FIELDS
                                    if (value := getattr(args, field)) is not None},
                           no_remote=args.no_remote)
            print(text)
            _say(f"key {args.name!r} added to {path}. Store it now: it is not shown again.")
            if first:
                for line in first_key_warning(admin=args.admin):
                    _say(line)
            if args.models and config.ollama is not None and (unknown := unknown_models(args.models, known)):
                _say(f"note: not a model or alias in the config: {', '.join(unknown)}; accepted as Ollama's own "
                     f"model names")
        elif args.keys_command == "list":
            print(format_key_table(list_keys(path)) or f"no keys in {path}")
        else:
            remove_key(path, args.name)
            print(f"key {args.name!r} removed from {path}")
    except (KeyCommandError, KeyFileError) as exc:
        for line in str(exc).splitlines():
            _say(line)
        return EXIT_ERROR
    return EXIT_OK


def first_key_warning(*, admin: bool) -> list[str]:
    """What the first key changes: no request is let in without a key any more, loopback's neither."""
    return ["this is the first key: from now on every client needs a key, loopback clients too, and so do "
            "`steward top`, `ps`, `load`, `unload`, `pin`, `unpin` and `reload` (an admin key).",
            "those tools find the key in $STEWARD_KEY (or --key): export STEWARD_KEY=<an admin key>" +
            ("" if admin else "; this key is not one: make one with `steward keys add NAME --admin --config CONFIG`")]


def format_key_table(keys: Sequence[ApiKey]) -> str:
    """One row per key (never its hash), and what ``comfyui`` in MODELS means if a key names it; empty for no keys."""
    if not keys:
        return ""
    rows = [_COLUMNS, *(_row(key) for key in keys)]
    widths = [max(len(row[column]) for row in rows) for column in range(len(_COLUMNS))]
    table = "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                      for row in rows)
    if any(COMFYUI_SCOPE in (key.models or ()) for key in keys):
        table += (f"\n\n{COMFYUI_SCOPE} in MODELS: the key may use the ComfyUI listener (any workflow). A key with all "
                  f"models may too; one whose MODELS leave out {COMFYUI_SCOPE} may not.")
    return table


def _row(key: ApiKey) -> tuple[str, ...]:
    return (key.name, _listed(key.models), _listed(key.classes), key.default_class or "(listener's)",
            _limit(key.rpm), _limit(key.concurrency), "yes" if key.admin else "no", _remote(key), _budgets(key),
            key.created.strftime("%Y-%m-%d %H:%M:%SZ"))


def _remote(key: ApiKey) -> str:
    """Whether it may use remote models: yes, no, or those MODELS lists."""
    return "listed" if key.no_remote is None and key.models is not None else "yes" if key.may_reach_remote else "no"


def _budgets(key: ApiKey) -> str:
    """``tokens_per_day=100000,spend_per_month=5.00``, or ``-``."""
    return ",".join(f"{budget}={amount(budget, limit)}" for budget in Budget
                    if (limit := budget.limit_of(key)) is not None) or "-"


def _listed(names: Sequence[str] | None) -> str:
    return "all" if names is None else ",".join(names)


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def _say(line: str) -> None:
    print(f"steward: {line}", file=sys.stderr)
