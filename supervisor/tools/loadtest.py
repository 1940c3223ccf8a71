"""``steward loadtest``: the GridCore client mix against a running steward, in real time.

Chat clients (interactive, streaming), background agents, batch jobs and embedding
indexers each loop: ask, wait for the whole answer, think, ask again, until the
duration is over. Ollama clients (``/api/chat``) and image clients (ComfyUI's
``/prompt``) can join them. Bounded in count and time, loopback only. Without ``--url``
it starts its own steward on the demo's simulated GPU and fake engines (a child process,
so the load generator does not share steward's CPU time slice), and reads steward's
event log afterwards for loads, evictions and peak memory.

While it runs it prints a plain progress line every few seconds on stderr (``LoadTally``:
requests done, failed and in flight per client kind, and how long the oldest has waited),
so that a long wait reads as one in a tmux pane or a log, not as a hang. Its own steward's
terminal output goes to ``steward.stderr`` in its folder (``--keep`` keeps it): the
loadtest says itself when it stops that steward, and names its warning and error events
in the report. The report has one row per client kind started, a kind that finished no
request included, with the reason.

``--chaos`` (supervisor/tools/chaos.py) also stops, freezes and kills the engines and
upstreams that steward supervises while the load runs, and checks afterwards that
nothing was lost: every request answered, the ledger adding up, no process left, no
fds gained; steward's memory and fds are sampled throughout.

This module is the command's run; its parts are the client workload
(loadtest_clients.py), the loadtest's own steward (loadtest_steward.py), the report
(loadtest_report.py) and the chaos session (loadtest_chaos.py).
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import trio

from supervisor.tools import chaos
from supervisor.tools.demo import open_workdir
from supervisor.tools.loadtest_chaos import ChaosOptions, run_chaos_loadtest
from supervisor.tools.loadtest_clients import ClientKind, LoadTally, default_kinds, load_line, run_clients
from supervisor.tools.loadtest_report import LoadReport, count_problems, summarize_events
from supervisor.tools.loadtest_steward import (
    STEWARD_OUTPUT,
    demo_steward_config,
    engines_in_words,
    listener_endpoints,
    output_tail,
    start_steward,
    started_line,
    stop_as_planned,
)


def run_loadtest(url: str | None, counts: Mapping[str, int], duration: float, models: Mapping[str, str],
                 seed: int = 7, *, real: bool = False, disconnect_rate: float = 0.0,
                 chaos_options: ChaosOptions | None = None, keep: bool = False,
                 announce: Callable[[chaos.ChaosRecord], None] | None = None,
                 say: Callable[[str], None] | None = None) -> LoadReport:
    """The client mix for *duration* seconds; with *chaos_options*, under chaos, then the invariants.

    *disconnect_rate*: the share of requests whose client leaves early (a stream after a
    few chunks, any other request after a moment). *say* gets the loadtest's own lines as
    it goes (its steward started and stopped, progress every few seconds); default: stderr.

    Raises:
        RuntimeError: steward could not be started, or chaos was asked of a steward at *url*.
    """
    say = say or _say
    kinds = {kind: counts[kind.name] for kind in default_kinds(models) if counts.get(kind.name)}
    services = [kind.name for kind in kinds if kind.api != "openai"]
    if url is not None:
        if chaos_options is not None:
            raise RuntimeError("--chaos needs a steward the loadtest starts itself (it signals the engines "
                               "that steward spawned, as its event log names them); leave out --url")
        if services:
            raise RuntimeError(f"{' and '.join(services)} clients need the loadtest's own steward "
                               f"(its Ollama and ComfyUI listeners); leave out --url or set them to 0")
        say(load_line(kinds, duration, url))
        tally = LoadTally.of(kinds)
        outcomes = trio.run(functools.partial(run_clients, url.rstrip("/"), kinds, duration, seed,
                                              disconnect_rate=disconnect_rate, tally=tally, say=say))
        return LoadReport(duration, outcomes, tally=tally)
    if real and services:
        raise RuntimeError(f"{' and '.join(services)} clients need the fake demo (no Ollama or ComfyUI with --real)")
    with open_workdir("loadtest", keep=keep) as workdir:
        if chaos_options is not None:
            return run_chaos_loadtest(workdir, kinds, duration, seed, chaos_options, real=real, keep=keep,
                                      disconnect_rate=disconnect_rate, announce=announce or _announce, say=say)
        return run_on_own_steward(workdir, demo_steward_config(workdir, real=real), kinds, duration, seed,
                                  engines=engines_in_words(real), keep=keep, disconnect_rate=disconnect_rate,
                                  say=say)


def run_on_own_steward(workdir: Path, config: dict[str, Any], kinds: Mapping[ClientKind, int], duration: float,
                       seed: int, *, engines: str, keep: bool, disconnect_rate: float = 0.0,
                       say: Callable[[str], None] | None = None, drain: float = math.inf) -> LoadReport:
    """Start a steward on *config* in *workdir*, run the clients against it, stop it, read its event log.

    *engines* says in words what it runs on (the line that says it is up); *say* as
    run_loadtest's; *drain* as run_clients'.
    """
    say = say or _say
    output = workdir / STEWARD_OUTPUT
    process, steward_url, events = start_steward(workdir, config, stderr=output)
    tally = LoadTally.of(kinds)
    try:
        say(started_line(steward_url, output, engines=engines, keep=keep))
        say(load_line(kinds, duration, steward_url))
        endpoints = listener_endpoints(events, steward_url)
        outcomes = trio.run(functools.partial(run_clients, endpoints, kinds, duration, seed,
                                              disconnect_rate=disconnect_rate, tally=tally, say=say, drain=drain))
    finally:
        status = stop_as_planned(process, say)
    say("loadtest: its steward has stopped" if status == 0
        else f"loadtest: its steward exited with status {status}" + output_tail(output))
    return LoadReport(duration, outcomes, summarize_events(events), tally=tally, problems=count_problems(events))


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)  # stderr: stdout may be the JSON report


def _announce(record: chaos.ChaosRecord) -> None:
    print(record.to_line(), file=sys.stderr, flush=True)
