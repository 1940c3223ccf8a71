"""What steward's streaming relay costs in time to first token and chunks per second.

Run from the repository root::

    .venv/bin/python tests/benchmarks/bench_streaming.py [--clients 64] [--duration 10] [--warmup 3]
        [--max-tokens 64] [--tokens-per-second 15] [--json]

Method: start the fake vLLM (``python -m fakes.openai_server``, one token per SSE chunk at
--tokens-per-second per stream, access log off), then ``steward run`` on a temporary config
that attaches to it (runtime openai, upstream; an always-on engine, loaded at start), and wait
until steward's ``/healthz`` shows the engine ready. Then, for each target in turn (direct =
the fake's ``/v1/chat/completions``, steward = steward's), run --clients concurrent clients,
each POSTing ``stream: true`` chat requests with --max-tokens back to back (one ~4.3 s stream
each with the defaults: 960 chunks/s asked, which a 2-core machine can deliver, so the
relay is what is measured, not a saturated client). Clients start staggered over one stream's length (at most the
warmup) so requests arrive spread out, as in a steady state, not in lockstep; streams started
during the first --warmup seconds are not measured, and no stream starts after warmup +
--duration. Per stream it records the time to first token (from sending the request to the
first SSE chunk whose delta has content; it includes the fake's one token interval) and its
chunks; per run, the chunks that arrived inside the measured window
divided by its length. Steward's added TTFT is its percentile minus the direct one. An error
is a non-200 answer, a transport error, or a stream that ends without ``data: [DONE]``.

All clients live in this one process (httpx on trio), for both targets in turn, so both runs
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
PATH = "/v1/chat/completions"
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


def has_content(payload: str) -> bool:
    with contextlib.suppress(ValueError, KeyError, IndexError, TypeError, AttributeError):
        return bool(json.loads(payload)["choices"][0]["delta"].get("content"))
    return False


async def one_stream(client: httpx.AsyncClient, url: str, body: bytes, window: tuple[float, float],
                     tally: Tally, measured: bool) -> bool:
    """One streaming request; False if it failed. Only a *measured* stream's TTFT and errors count."""
    sent = time.perf_counter()
    ttft: float | None = None
    chunks, done = 0, False
    try:
        async with client.stream("POST", url, content=body, headers={"Content-Type": "application/json"}) as reply:
            if reply.status_code != 200:
                await reply.aread()
                return _failed(tally, measured, f"HTTP {reply.status_code}: {reply.text[:200]}")
            async for line in reply.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                now = time.perf_counter()
                chunks += 1
                if window[0] <= now < window[1]:  # throughput: every chunk in the window, warmup streams' too
                    tally.window_chunks += 1
                if ttft is None and has_content(line[6:]):  # JSON only until the first token: client CPU
                    ttft = now - sent
    except httpx.HTTPError as exc:
        return _failed(tally, measured, f"{type(exc).__name__}: {exc}")
    if not done:
        return _failed(tally, measured, f"a stream ended without data: [DONE] after {chunks} chunks")
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


async def client_loop(client: httpx.AsyncClient, url: str, body: bytes, delay_s: float,
                      window: tuple[float, float], tally: Tally) -> None:
    """Streams back to back from *delay_s* on; none starts after the window ends."""
    await trio.sleep(delay_s)
    while (started := time.perf_counter()) < window[1]:
        if not await one_stream(client, url, body, window, tally, measured=started >= window[0]):
            await trio.sleep(ERROR_PAUSE_S)


async def measure(url: str, args: argparse.Namespace, pids: dict[str, int]) -> RunResult:
    """One target: --clients clients for warmup + duration seconds, then until their last streams end."""
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
                nursery.start_soon(client_loop, client, url, body, stagger_s * i / args.clients, window, tally)
        wall_s = time.perf_counter() - start
        cpu = {name: (cpu_seconds(pid) - cpu_start[name]) / wall_s for name, pid in pids.items()}
    return RunResult.of(tally, args.duration, cpu)


async def smoke_test(url: str, args: argparse.Namespace) -> None:
    """One stream, so a broken setup fails loudly instead of benchmarking errors."""
    tally = Tally()
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
        ok = await one_stream(client, url, request_body(args.max_tokens), (0.0, 0.0), tally, measured=True)
    if not ok or not tally.ttfts_s:
        raise BenchError(f"a stream from POST {url} failed: {tally.first_error or 'no chunk had content'}")


async def measure_all(urls: dict[str, str], args: argparse.Namespace,
                      pids: dict[str, int]) -> dict[str, RunResult]:
    """Each target in turn; SIGINT or SIGTERM cancels it all and raises Interrupted."""
    results: dict[str, RunResult] = {}
    received: list[int] = []
    failed: BenchError | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_signals, nursery.cancel_scope, received)
        try:
            for url in urls.values():
                await smoke_test(url, args)
            for target, url in urls.items():
                _progress(args, f"{target} {url}")
                results[target] = await measure(url, args, pids)
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


def run_benchmark(args: argparse.Namespace, workdir: Path) -> dict[str, RunResult]:
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
            return trio.run(measure_all, {"direct": direct + PATH, "steward": steward + PATH}, args, pids)


# --------------------------------------------------------------------------- output

def report(results: dict[str, RunResult], args: argparse.Namespace) -> dict[str, Any]:
    direct, steward = results["direct"], results["steward"]
    ratio = steward.chunks_per_s / direct.chunks_per_s if direct.chunks_per_s else math.nan
    asked = args.clients * args.tokens_per_second if args.tokens_per_second > 0 else None  # None: instant
    return {"added_ttft_p50_ms": steward.ttft_p50_ms - direct.ttft_p50_ms,
            "added_ttft_p99_ms": steward.ttft_p99_ms - direct.ttft_p99_ms, "steward_chunks_per_s_ratio": ratio,
            "asked_chunks_per_s": asked,
            "direct_saturated": asked is not None and direct.chunks_per_s < SATURATED * asked}


def print_table(results: dict[str, RunResult], args: argparse.Namespace) -> None:
    d, s, added = results["direct"], results["steward"], report(results, args)
    print(f"\nstreaming POST {PATH}: {args.clients} clients, max_tokens {args.max_tokens}, "
          f"{args.tokens_per_second:g} tokens/s per stream, {args.duration:g}s measured after {args.warmup:g}s "
          f"warmup\ndirect = the fake vLLM alone, steward = through steward\n")
    print(f"{'':22} {'direct':>9} {'steward':>9} {'added':>9}")
    print(f"{'TTFT p50 (ms)':22} {d.ttft_p50_ms:>9.2f} {s.ttft_p50_ms:>9.2f} {added['added_ttft_p50_ms']:>+9.2f}")
    print(f"{'TTFT p99 (ms)':22} {d.ttft_p99_ms:>9.2f} {s.ttft_p99_ms:>9.2f} {added['added_ttft_p99_ms']:>+9.2f}")
    print(f"{'TTFT max (ms)':22} {d.ttft_max_ms:>9.2f} {s.ttft_max_ms:>9.2f}")
    print(f"{'chunks/s':22} {d.chunks_per_s:>9.0f} {s.chunks_per_s:>9.0f} "
          f"{added['steward_chunks_per_s_ratio']:>8.1%}")
    print(f"{'streams measured':22} {d.streams:>9} {s.streams:>9}")
    print(f"{'chunks per stream':22} {d.chunks_per_stream:>9.1f} {s.chunks_per_stream:>9.1f}")
    print(f"{'errors':22} {d.errors:>9} {s.errors:>9}")
    for name in d.cpu:
        print(f"{name + ' CPU':22} {d.cpu[name]:>9.0%} {s.cpu[name]:>9.0%}")
    for target, result in results.items():
        if result.first_error:
            print(f"  note: {target}: first error: {result.first_error}")
    if added["direct_saturated"]:
        print(f"  note: direct delivered {d.chunks_per_s / added['asked_chunks_per_s']:.0%} of the chunks/s asked: "
              f"the client or the fake is saturated (see CPU),\n  so TTFT includes queueing behind it; lower "
              f"--clients or --tokens-per-second to measure the relay itself")
    asked = "" if added["asked_chunks_per_s"] is None else f"; the clients ask for {added['asked_chunks_per_s']:.0f}"
    print(f"\nadded = steward minus direct (chunks/s: steward as a share of direct{asked});\n"
          f"CPU = each process's own CPU seconds per wall second over the run (100% = one core; "
          f"client = this script; {os.cpu_count()} cores)\n")


# --------------------------------------------------------------------------- main

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
        print(json.dumps({"clients": args.clients, "duration_s": args.duration, "warmup_s": args.warmup,
                          "max_tokens": args.max_tokens, "tokens_per_second": args.tokens_per_second,
                          "path": PATH, **{t: asdict(r) for t, r in results.items()}, **report(results, args)},
                         indent=2))
    else:
        print_table(results, args)
    return 1 if any(r.errors for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
