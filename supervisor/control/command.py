"""``steward ps``, ``steward load|unload|pin|unpin NAME`` and ``steward logs NAME [-f]``: their
arguments and their entry.

Which steward and which key are found as ``steward top`` finds them (top/command.py); httpx
and trio are imported only when one of these commands runs.
"""

from __future__ import annotations

import argparse
import sys

from supervisor.scheduler.types import EngineAction, EngineStatus
from supervisor.top.command import KEY_ENV, admin_key, steward_url

PS = "ps"
LOGS = "logs"
CONTROL_COMMANDS = frozenset({PS, LOGS, *(action.value for action in EngineAction)})
DEFAULT_LOG_LINES = 100
EXIT_OK = 0
EXIT_NOT_DONE = 1  # unreachable, refused by steward's rules, failed, or not done in time
EXIT_REFUSED = 2  # the admin API refused the key (as top), or the address is not usable
EXIT_INTERRUPTED = 130  # as a shell says of a command ended by Ctrl-C
# Ctrl-C lands at a checkpoint (a request's read, the wait's sleep) as any cancellation would, never
# inside the HTTP client's own bookkeeping: once, under load, one raised there left the command
# hanging on its connection pool's cleanup (test_control's Ctrl-C test, 30 s).
_AT_CHECKPOINTS = {"restrict_keyboard_interrupt_to_checkpoints": True}
DEFAULT_WAIT_S = 300.0
# What an action waits for: the engine in one of these states (none: done once steward accepts it).
DONE_AT: dict[EngineAction, frozenset[EngineStatus]] = {
    EngineAction.LOAD: frozenset({EngineStatus.READY}),
    EngineAction.PIN: frozenset({EngineStatus.READY}),
    EngineAction.UNLOAD: frozenset({EngineStatus.STOPPED, EngineStatus.SLEEPING}),
    EngineAction.UNPIN: frozenset(),
}
_HELP = {
    EngineAction.LOAD: "load an engine now and wait until it is ready (as a request would, by the same rules)",
    EngineAction.UNLOAD: "unload an engine (its requests in flight finish first) and wait until it is stopped",
    EngineAction.PIN: "keep an engine loaded: never evicted, loaded now if it is not",
    EngineAction.UNPIN: "let a pinned engine be evicted again (it stays loaded until then)",
}


def add_control_parsers(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    ps = commands.add_parser(PS, help="the engines of a running steward: state, memory, slots, queue, idle, pinned/hot")
    _target_options(ps)
    logs = commands.add_parser(LOGS, help="an engine's own output (its last lines; -f: then each new one until Ctrl-C)")
    logs.add_argument("name", metavar="NAME", help="the engine (a model's name in the config)")
    logs.add_argument("-f", "--follow", action="store_true", help="go on printing each new line until Ctrl-C")
    logs.add_argument("-n", "--lines", type=int, default=DEFAULT_LOG_LINES, metavar="N",
                      help=f"how many of the last lines to print first ({DEFAULT_LOG_LINES}; steward keeps "
                           "2000 per engine at most)")
    _target_options(logs)
    for action in EngineAction:
        parser = commands.add_parser(action.value, help=_HELP[action])
        parser.add_argument("name", metavar="NAME", help="the engine (a model's name in the config)")
        _target_options(parser)
        if DONE_AT[action]:
            parser.add_argument("--wait", type=float, default=DEFAULT_WAIT_S, metavar="SECONDS",
                                help=f"give up waiting after SECONDS ({DEFAULT_WAIT_S:g}; the action goes on)")


def _target_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", metavar="URL", help="steward's address (default: the listen address of --config, "
                                                     "else http://127.0.0.1:8080)")
    parser.add_argument("--config", metavar="CONFIG", help="the steward this config describes (its listen)")
    parser.add_argument("--key", metavar="KEY", help=f"an admin key, once keys are configured (default: ${KEY_ENV})")


def run_control(args: argparse.Namespace) -> int:
    command = args.command
    url = steward_url(args.url, args.config, command=command)
    if url is None:
        return EXIT_REFUSED
    import trio

    from supervisor.control.calls import ActionNotDone, act, engine_logs, engines_state, follow_engine_logs
    from supervisor.control.table import format_engines
    from supervisor.top.client import AdminRefused, Unreachable

    key = admin_key(args.key)
    try:
        if command == PS:
            print(format_engines(trio.run(engines_state, url, key, **_AT_CHECKPOINTS)))
            return EXIT_OK
        if command == LOGS:
            if args.follow:
                trio.run(follow_engine_logs, url, key, args.name, args.lines, _print_line, **_AT_CHECKPOINTS)
                _say(command, "steward ended the stream (it is stopping)")
                return EXIT_NOT_DONE
            for line in trio.run(engine_logs, url, key, args.name, args.lines, **_AT_CHECKPOINTS):
                _print_line(line)
            return EXIT_OK
        action = EngineAction(command)
        done = trio.run(act, url, key, args.name, action, DONE_AT[action], getattr(args, "wait", 0.0),
                        **_AT_CHECKPOINTS)
    except AdminRefused as exc:
        _say(command, str(exc))
        return EXIT_REFUSED
    except (Unreachable, ActionNotDone) as exc:
        _say(command, str(exc))
        return EXIT_NOT_DONE
    except KeyboardInterrupt:  # Ctrl-C while waiting: an action was asked for and goes on in steward
        if command != LOGS:
            _say(command, "stopped waiting; steward goes on with it (`steward ps` shows how it goes)")
        return EXIT_INTERRUPTED
    engine = done.engine
    pinned = "pinned, " if engine.get("pinned") else ""
    took = f" ({done.took_s:.1f}s)" if DONE_AT[action] else ""
    print(f"{args.name}: {pinned}{engine['status']}{took}")
    return EXIT_OK


def _print_line(line: str) -> None:
    print(line, flush=True)  # at once: a follower (or a pipe to grep) sees each line as it comes


def _say(command: str, line: str) -> None:
    print(f"steward {command}: {line}", file=sys.stderr)
