"""What steward's streaming relay costs in time to first token and chunks per second, per API.

Run from the repository root::

    .venv/bin/python tests/benchmarks/bench_streaming.py [--routes chat,messages] [--clients 64]
        [--duration 10] [--warmup 3] [--max-tokens 64] [--tokens-per-second 15] [--json]

Method: start the fake vLLM (``python -m fakes.openai_server``, one token per SSE event at
--tokens-per-second per stream, access log off), then ``steward run`` on a temporary config
that attaches to it (runtime openai, upstream; an always-on engine, loaded at start), and wait
until steward's ``/healthz`` shows the engine ready. Then, for each route of --routes (``chat``:
``/v1/chat/completions``; ``messages``: Anthropic's ``/v1/messages``) and each target in turn
(direct = the fake, steward = through steward), run --clients concurrent clients, each POSTing
``stream: true`` requests with --max-tokens back to back (one ~4.3 s stream each with the
defaults: 960 tokens/s asked, which a 2-core machine can deliver, so the relay is what is
measured, not a saturated client). Clients start staggered over one stream's length (at most the
warmup) so requests arrive spread out, as in a steady state, not in lockstep; streams started
during the first --warmup seconds are not measured, and no stream starts after warmup +
--duration. Per stream it records the time to first token (from sending the request to the
first SSE event that carries text: chat's first delta with content, messages' first
``content_block_delta``; it includes the fake's one token interval) and its chunks (its SSE
``data:`` events, the end marker aside); per run, the chunks that arrived inside the measured
window divided by its length. Steward's added TTFT is its percentile minus the direct one, per
route. An error is a non-200 answer, a transport error, or a stream that ends incomplete
(chat: without ``data: [DONE]``; messages: without a ``message_stop`` event).

What differs between the routes is one small table (``ROUTES``: path, headers, how the first
token and the end are recognised); the request body is the same JSON for both APIs.

All clients live in this one process (httpx on trio), for every run in turn, so all runs
pay the same client costs. On a small machine (2 cores) the client, the fake and steward
share the CPUs: each one's own CPU use (/proc/<pid>/stat) is printed, so a saturated process
shows, and figures are only comparable between runs on the same, otherwise idle, machine. When
chunks/s falls short of clients x tokens-per-second even direct, the fake (or the client) is
the limit and TTFT includes queueing behind it.

Steward and the fake are always stopped (SIGTERM, up to 15 s, then SIGKILL), on errors,
Ctrl-C and SIGTERM too. Exit status: 0, 1 if the run failed or any stream had an error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio
from bench_processes import cpu_seconds, free_port, get_json, stop

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = "shared"
READY_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_S = 30.0  # a slow stream counts as latency, not as an error
ERROR_PAUSE_S = 0.1       # after a failed stream, so a refused connection does not spin a client
SATURATED = 0.8           # direct below this share of the chunks/s asked: the fake or the client is the limit

# parallel = --clients: steward admits every client at once, so its queue is not what is measured.
CONFIG_TEMPLATE = """\
listen: 127.0.0.1:{port}
log: {{file: {events}, terminal: warning}}
gpu: {{probe: none, budget: 16GiB}}
models:
  {model}: {{runtime: openai, upstream: "127.0.0.1:{upstream_port}", memory: 2GiB, parallel: {parallel}}}
"""


class BenchError(Exception):
    """The benchmark could not run; the message says why."""


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# --------------------------------------------------------------------------- routes

def _chat_token(event: dict[str, Any]) -> bool:
    return bool(event["choices"][0]["delta"].get("content"))


def _messages_token(event: dict[str, Any]) -> bool:
    return event["type"] == "content_block_delta" and bool(event["delta"].get("text"))


@dataclass(frozen=True)
class Route:
    """What differs between the streaming APIs measured; the request body is the same JSON for both."""

    path: str
    headers: dict[str, str]
    first_token: Callable[[dict[str, Any]], bool]  # on a data event's JSON: does it carry text?
    end: str                                       # the line that says the stream is complete


ROUTES = {
    "chat": Route("/v1/chat/completions", {}, _chat_token, "data: [DONE]"),
    "messages": Route("/v1/messages", {"anthropic-version": "2023-06-01"}, _messages_token, "event: message_stop"),
}


# --------------------------------------------------------------------------- results

@dataclass
class Tally:
    """What one target's clients saw inside the measured window."""

    ttfts_s: list[float] = field(default_factory=list)
    streams: int = 0
    chunks_per_stream: list[int] = field(default_factory=list)
    window_chunks: int = 0  # chunks that arrived inside the window, whichever stream carried them
    errors: int = 0
    first_error: str | None = None

    def fail(self, why: str) -> None:
        self.errors += 1
        self.first_error = self.first_error or why


@dataclass
class RunResult:
    streams: int
    errors: int
    first_error: str | None
    ttft_p50_ms: float
    ttft_p99_ms: float
    ttft_max_ms: float
    chunks_per_stream: float
    chunks_per_s: float
    cpu: dict[str, float]  # CPU seconds per wall second over the run (1.0 = one core): client, fake, steward

    @classmethod
    def of(cls, tally: Tally, window_s: float, cpu: dict[str, float]) -> RunResult:
        ttfts = sorted(tally.ttfts_s)
        counts = tally.chunks_per_stream
        return cls(streams=tally.streams, errors=tally.errors, first_error=tally.first_error,
                   ttft_p50_ms=1000 * percentile(ttfts, 50), ttft_p99_ms=1000 * percentile(ttfts, 99),
                   ttft_max_ms=1000 * ttfts[-1] if ttfts else math.nan,
                   chunks_per_stream=sum(counts) / len(counts) if counts else math.nan,
                   chunks_per_s=tally.window_chunks / window_s, cpu=cpu)


def percentile(ordered: list[float], p: float) -> float:
    """Nearest rank: the smallest value with at least p% of the values at or below it."""
    if not ordered:
        return math.nan
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


# --------------------------------------------------------------------------- clients

def request_body(max_tokens: int) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": max_tokens, "stream": True}, separators=(",", ":")).encode()


def carries_text(route: Route, payload: str) -> bool:
    with contextlib.suppress(ValueError, KeyError, IndexError, TypeError, AttributeError):
        return route.first_token(json.loads(payload))
    return False


async def one_stream(client: httpx.AsyncClient, route: Route, url: str, body: bytes, window: tuple[float, float],
                     tally: Tally, measured: bool) -> bool:
    """One streaming request; False if it failed. Only a *measured* stream's TTFT and errors count."""
    sent = time.perf_counter()
    ttft: float | None = None
    chunks, done = 0, False
    headers = {"Content-Type": "application/json", **route.headers}
    try:
        async with client.stream("POST", url, content=body, headers=headers) as reply:
            if reply.status_code != 200:
                await reply.aread()
                return _failed(tally, measured, f"HTTP {reply.status_code}: {reply.text[:200]}")
            async for line in reply.aiter_lines():
                if line == route.end:
                    done = True
                if done or not line.startswith("data: "):
                    continue  # an event's name, or the end marker's own data
                now = time.perf_counter()
                chunks += 1
                if window[0] <= now < window[1]:  # throughput: every chunk in the window, warmup streams' too
                    tally.window_chunks += 1
                if ttft is None and carries_text(route, line[6:]):  # JSON only until the first token: client CPU
                    ttft = now - sent
    except httpx.HTTPError as exc:
        return _failed(tally, measured, f"{type(exc).__name__}: {exc}")
    if not done:
        return _failed(tally, measured, f"a stream ended without {route.end!r} after {chunks} chunks")
    if measured:
        tally.streams += 1
        tally.chunks_per_stream.append(chunks)
        if ttft is not None:
            tally.ttfts_s.append(ttft)
    return True


def _failed(tally: Tally, measured: bool, why: str) -> bool:
    if measured:
        tally.fail(why)
    return False


async def client_loop(client: httpx.AsyncClient, route: Route, url: str, body: bytes, delay_s: float,
                      window: tuple[float, float], tally: Tally) -> None:
    """Streams back to back from *delay_s* on; none starts after the window ends."""
    await trio.sleep(delay_s)
    while (started := time.perf_counter()) < window[1]:
        if not await one_stream(client, route, url, body, window, tally, measured=started >= window[0]):
            await trio.sleep(ERROR_PAUSE_S)


async def measure(route: Route, url: str, args: argparse.Namespace, pids: dict[str, int]) -> RunResult:
    """One route at one target: --clients clients for warmup + duration seconds, then until their last streams end."""
    body = request_body(args.max_tokens)
    stream_s = args.max_tokens / args.tokens_per_second if args.tokens_per_second > 0 else 0.0
    stagger_s = min(stream_s, args.warmup)
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    tally = Tally()
    async with httpx.AsyncClient(limits=limits, timeout=REQUEST_TIMEOUT_S) as client:
        start, cpu_start = time.perf_counter(), {name: cpu_seconds(pid) for name, pid in pids.items()}
        window = (start + args.warmup, start + args.warmup + args.duration)
        async with trio.open_nursery() as nursery:
            for i in range(args.clients):
                # Staggered over one stream (within the warmup): arrivals spread out as in a steady state.
                nursery.start_soon(client_loop, client, route, url, body, stagger_s * i / args.clients, window,
                                   tally)
        wall_s = time.perf_counter() - start
        cpu = {name: (cpu_seconds(pid) - cpu_start[name]) / wall_s for name, pid in pids.items()}
    return RunResult.of(tally, args.duration, cpu)


async def smoke_test(route: Route, url: str, args: argparse.Namespace) -> None:
    """One stream, so a broken setup fails loudly instead of benchmarking errors."""
    tally = Tally()
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
        ok = await one_stream(client, route, url, request_body(args.max_tokens), (0.0, 0.0), tally, measured=True)
    if not ok or not tally.ttfts_s:
        raise BenchError(f"a stream from POST {url} failed: {tally.first_error or 'no event carried text'}")


Results = dict[str, dict[str, RunResult]]  # route -> target (direct, steward) -> result


async def measure_all(bases: dict[str, str], args: argparse.Namespace, pids: dict[str, int]) -> Results:
    """Each route at each target in turn; SIGINT or SIGTERM cancels it all and raises Interrupted."""
    results: Results = {}
    received: list[int] = []
    failed: BenchError | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_signals, nursery.cancel_scope, received)
        try:
            for name in args.routes:
                for base in bases.values():
                    await smoke_test(ROUTES[name], base + ROUTES[name].path, args)
            for name in args.routes:
                route = ROUTES[name]
                for target, base in bases.items():
                    _progress(args, f"{name}: {target} {base}{route.path}")
                    results.setdefault(name, {})[target] = await measure(route, base + route.path, args, pids)
        except BenchError as exc:
            failed = exc  # raised out here, not wrapped in the nursery's ExceptionGroup
        nursery.cancel_scope.cancel()
    if received:
        raise Interrupted(received[0])
    if failed is not None:
        raise failed
    return results


async def _watch_signals(scope: trio.CancelScope, received: list[int]) -> None:
    # A signal handler that raises inside trio.run could land in trio's own code; cancel cleanly instead.
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            received.append(signum)
            scope.cancel()
            return


def _progress(args: argparse.Namespace, message: str) -> None:
    print(f"bench: {message} ({args.clients} clients, {args.warmup:g}s warmup + {args.duration:g}s)",
          file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- processes

@contextlib.contextmanager
def running(name: str, argv: list[str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Start *argv*; always stop it. Its own session: a Ctrl-C reaches this script only, which stops it once."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield process
        finally:
            stop(name, process)


def answers(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status == 200


def wait_until(process: subprocess.Popen[bytes], name: str, log_path: Path, ready: Callable[[], object],
               what: str) -> None:
    """Poll *ready()* until true; fail if *process* exits or READY_TIMEOUT_S passes."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BenchError(f"{name} exited ({process.returncode}) while starting:\n{_log_tail(log_path)}")
        with contextlib.suppress(OSError, ValueError, KeyError):
            if ready():
                return
        time.sleep(0.1)
    raise BenchError(f"{what} within {READY_TIMEOUT_S:g}s:\n{_log_tail(log_path)}")


def _log_tail(path: Path, lines: int = 20) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:]) or f"({path.name} is empty)"


def run_benchmark(args: argparse.Namespace, workdir: Path) -> Results:
    fake_port, steward_port = free_port(), free_port()
    fake_argv = [sys.executable, "-m", "fakes.openai_server", "--host", "127.0.0.1", "--port", str(fake_port),
                 "--served-model-name", MODEL, "--max-num-seqs", str(max(256, args.clients)),
                 "--tokens-per-second", str(args.tokens_per_second), "--disable-uvicorn-access-log"]
    config = workdir / "steward.yaml"
    config.write_text(CONFIG_TEMPLATE.format(port=steward_port, events=json.dumps(str(workdir / "events.jsonl")),
                                             model=MODEL, upstream_port=fake_port, parallel=args.clients))
    direct, steward = f"http://127.0.0.1:{fake_port}", f"http://127.0.0.1:{steward_port}"
    fake_log, steward_log = workdir / "fake.log", workdir / "steward.log"
    with running("the fake", fake_argv, fake_log) as fake:
        wait_until(fake, "the fake", fake_log, lambda: answers(f"{direct}/health"),
                   "the fake did not answer /health")
        argv = [sys.executable, "-m", "supervisor.cli", "run", str(config)]
        with running("steward", argv, steward_log) as process:
            wait_until(process, "steward", steward_log,
                       lambda: get_json(f"{steward}/healthz")["engines"][MODEL]["status"] == "ready",
                       "the attached engine was not ready")
            pids = {"client": os.getpid(), "fake": fake.pid, "steward": process.pid}
            return trio.run(measure_all, {"direct": direct, "steward": steward}, args, pids)


# --------------------------------------------------------------------------- output

def asked_chunks_per_s(args: argparse.Namespace) -> float | None:
    """What the clients ask for, one chunk per token (None: the fake paces nothing)."""
    return args.clients * args.tokens_per_second if args.tokens_per_second > 0 else None


def report(runs: dict[str, RunResult], asked: float | None) -> dict[str, Any]:
    """One route's comparison: steward's added TTFT, its share of direct's chunks/s."""
    direct, steward = runs["direct"], runs["steward"]
    ratio = steward.chunks_per_s / direct.chunks_per_s if direct.chunks_per_s else math.nan
    return {"added_ttft_p50_ms": steward.ttft_p50_ms - direct.ttft_p50_ms,
            "added_ttft_p99_ms": steward.ttft_p99_ms - direct.ttft_p99_ms, "steward_chunks_per_s_ratio": ratio,
            "direct_saturated": asked is not None and direct.chunks_per_s < SATURATED * asked}


def _rows(d: RunResult, s: RunResult, added: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(label, direct, steward, added) of one route, each figure formatted."""
    return [("TTFT p50 (ms)", f"{d.ttft_p50_ms:.2f}", f"{s.ttft_p50_ms:.2f}", f"{added['added_ttft_p50_ms']:+.2f}"),
            ("TTFT p99 (ms)", f"{d.ttft_p99_ms:.2f}", f"{s.ttft_p99_ms:.2f}", f"{added['added_ttft_p99_ms']:+.2f}"),
            ("TTFT max (ms)", f"{d.ttft_max_ms:.2f}", f"{s.ttft_max_ms:.2f}", ""),
            ("chunks/s", f"{d.chunks_per_s:.0f}", f"{s.chunks_per_s:.0f}", f"{added['steward_chunks_per_s_ratio']:.1%}"),
            ("streams measured", f"{d.streams}", f"{s.streams}", ""),
            ("chunks per stream", f"{d.chunks_per_stream:.1f}", f"{s.chunks_per_stream:.1f}", ""),
            ("errors", f"{d.errors}", f"{s.errors}", ""),
            *((f"{name} CPU", f"{d.cpu[name]:.0%}", f"{s.cpu[name]:.0%}", "") for name in d.cpu)]


def print_table(results: Results, args: argparse.Namespace) -> None:
    asked = asked_chunks_per_s(args)
    added = {name: report(runs, asked) for name, runs in results.items()}
    tables = [_rows(runs["direct"], runs["steward"], added[name]) for name, runs in results.items()]
    print(f"\nstreaming, {args.clients} clients, max_tokens {args.max_tokens}, {args.tokens_per_second:g} tokens/s "
          f"per stream, {args.duration:g}s measured after {args.warmup:g}s warmup, per route and target\n"
          f"direct = the fake vLLM alone, steward = through steward\n")
    print(f"{'':18}" + "".join(f"  {f'{name} {ROUTES[name].path}':^29}" for name in results))
    print(f"{'':18}" + f"  {'direct':>9}{'steward':>10}{'added':>10}" * len(results))
    for i, (label, *_) in enumerate(tables[0]):
        print(f"{label:18}" + "".join(f"  {t[i][1]:>9}{t[i][2]:>10}{t[i][3]:>10}" for t in tables))
    for name, runs in results.items():
        for target, result in runs.items():
            if result.first_error:
                print(f"  note: {name} {target}: first error: {result.first_error}")
        if added[name]["direct_saturated"] and asked is not None:
            print(f"  note: {name} direct delivered {runs['direct'].chunks_per_s / asked:.0%} of the chunks/s asked: "
                  f"the client or the fake is saturated (see CPU),\n  so TTFT includes queueing behind it; lower "
                  f"--clients or --tokens-per-second to measure the relay itself")
    asked_note = "" if asked is None else f"; the clients ask for {asked:.0f}, one per token"
    print(f"\nadded = steward minus direct (chunks/s: steward as a share of direct{asked_note});\n"
          f"chunks = a stream's SSE data events but its end marker (tokens + 1 for chat, + 4 for messages);\n"
          f"CPU = each process's own CPU seconds per wall second over the run (100% = one core; "
          f"client = this script; {os.cpu_count()} cores)\n")


def as_json(results: Results, args: argparse.Namespace) -> dict[str, Any]:
    asked = asked_chunks_per_s(args)
    return {"clients": args.clients, "duration_s": args.duration, "warmup_s": args.warmup,
            "max_tokens": args.max_tokens, "tokens_per_second": args.tokens_per_second, "asked_chunks_per_s": asked,
            "routes": {name: {"path": ROUTES[name].path, **{t: asdict(r) for t, r in runs.items()},
                              **report(runs, asked)} for name, runs in results.items()}}


# --------------------------------------------------------------------------- main

def route_names(value: str) -> list[str]:
    """``chat,messages`` -> the names, each once, in the order given."""
    names = list(dict.fromkeys(name.strip() for name in value.split(",") if name.strip()))
    if unknown := [name for name in names if name not in ROUTES]:
        raise argparse.ArgumentTypeError(f"unknown route {unknown[0]!r}: the routes are {', '.join(ROUTES)}")
    if not names:
        raise argparse.ArgumentTypeError(f"no route given: the routes are {', '.join(ROUTES)}")
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--routes", type=route_names, default=list(ROUTES),
                        help=f"the APIs measured, comma-separated (default {','.join(ROUTES)})")
    parser.add_argument("--clients", type=int, default=64, help="concurrent streaming clients (default 64)")
    parser.add_argument("--duration", type=float, default=10, help="seconds measured per target (default 10)")
    parser.add_argument("--warmup", type=float, default=3, help="seconds of warmup before each (default 3)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per stream (default 64)")
    parser.add_argument("--tokens-per-second", type=float, default=15,
                        help="the fake's pace per stream (default 15; <= 0: instant)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    if args.clients < 1 or args.duration <= 0 or args.warmup < 0 or args.max_tokens < 1:
        parser.error("--clients and --max-tokens must be >= 1, --duration > 0, --warmup >= 0")
    return args


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise Interrupted(signum)  # unwinds through the finally blocks that stop steward and the fake


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # while measuring, _watch_signals takes over
    try:
        with tempfile.TemporaryDirectory(prefix="steward-bench-") as tmp:
            results = run_benchmark(args, Path(tmp))
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Interrupted) as exc:
        print("bench: interrupted", file=sys.stderr)
        return 128 + (exc.signum if isinstance(exc, Interrupted) else signal.SIGINT)
    if args.json:
        print(json.dumps(as_json(results, args), indent=2))
    else:
        print_table(results, args)
    return 1 if any(r.errors for runs in results.values() for r in runs.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
