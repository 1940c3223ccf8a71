"""How much latency and CPU steward's proxy adds in front of an engine.

Run from the repository root (needs ``wrk``: ``apt-get install wrk``)::

    .venv/bin/python tests/benchmarks/bench_proxy.py [--duration 10] [--warmup 3] [--connections 1,64] [--json]

Method: start ``steward run`` on a temporary config whose one pinned model's engine is
``fakes.fast_upstream`` (a raw-asyncio fake that answers every POST with a fixed ~300-byte
chat.completion, so the engine itself costs next to nothing). Once ``/healthz`` shows the
engine ready, read the engine's own address from the ``ready`` event in the event log.
Then, for each connection count, run ``wrk -t1 --latency`` (one thread leaves the CPUs to
the system under test) POSTing a small chat request to ``/v1/chat/completions``, first
straight at the fake upstream (the baseline) and then through steward, each as a warmup
run followed by a measured run. wrk reports its figures through a Lua ``done`` hook as one
JSON line, in microseconds, so nothing is lost to rounding in its text output.
Steward's added latency is steward's percentile minus the baseline's. The serving
process's own CPU time (utime + stime from /proc/<pid>/stat) is read around each measured
run and divided by the requests completed: the fake upstream's for the direct runs,
steward's (its engine not included) for the steward runs.

Targets (PASS/MISS is printed for each; the exit status is 1 if any is missed):

* 1 connection: added p50 <= 2.5 ms and added p99 <= 4 ms;
* 64 connections: steward >= 400 req/s and steward p99 <= 2 x steward p50.

Targets for a connection count not measured are skipped. Steward is always stopped
(SIGTERM, up to 15 s, then SIGKILL; its engine dies with it), on errors and Ctrl-C too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench_processes import cpu_seconds, free_port, get_json, stop

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = "fast"
PATH = "/v1/chat/completions"
REQUEST_BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, separators=(",", ":"))
READY_TIMEOUT_S = 30.0
WRK_SOCKET_TIMEOUT = "10s"  # a slow answer counts as latency, not as a timeout error
WRK_MARKER = "WRK_JSON "

CONFIG_TEMPLATE = """\
listen: 127.0.0.1:{port}
log: {{file: {events}, terminal: warning}}
gpu: {{probe: none, budget: 1GiB}}
classes: {{interactive: {{queue_timeout: 60s}}}}
models:
  {model}:
    command: [{python}, -m, fakes.fast_upstream]
    memory: 1MiB
    parallel: 128
    pinned: true
"""

# wrk's Lua hooks: POST the body; at the end print every figure as one JSON line.
WRK_SCRIPT = """\
wrk.method = "POST"
wrk.body = {body}
wrk.headers["Content-Type"] = "application/json"

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{marker}{{"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,"timeout":%d,"status":%d,'
    .. '"p50_us":%.1f,"p75_us":%.1f,"p90_us":%.1f,"p99_us":%.1f,"max_us":%.1f}}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.timeout, e.status,
    latency:percentile(50), latency:percentile(75), latency:percentile(90), latency:percentile(99), latency.max))
end
"""


class BenchError(Exception):
    """The benchmark could not run; the message says why."""


# --------------------------------------------------------------------------- results

@dataclass
class WrkResult:
    requests: int
    duration_s: float
    rps: float
    p50_ms: float
    p75_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    errors: dict[str, int]  # socket errors (connect, read, write, timeout) and non-2xx/3xx ("status")

    @property
    def total_errors(self) -> int:
        return sum(self.errors.values())


@dataclass
class CpuUsage:
    """One process's own CPU time (utime + stime) over a measured run."""

    cpu_s: float
    wall_s: float
    requests: int

    @property
    def ms_per_request(self) -> float:
        return 1000 * self.cpu_s / self.requests if self.requests else float("nan")

    @property
    def utilisation(self) -> float:
        """CPU seconds per wall second; 1.0 is one core busy."""
        return self.cpu_s / self.wall_s if self.wall_s else float("nan")


@dataclass
class Comparison:
    connections: int
    direct: WrkResult
    steward: WrkResult
    upstream_cpu: CpuUsage  # the fake upstream's, during the direct run
    steward_cpu: CpuUsage   # steward's (its engine not included), during the steward run

    @property
    def added_p50_ms(self) -> float:
        return self.steward.p50_ms - self.direct.p50_ms

    @property
    def added_p99_ms(self) -> float:
        return self.steward.p99_ms - self.direct.p99_ms

    def to_json(self) -> dict[str, Any]:
        return {"connections": self.connections, "direct": asdict(self.direct), "steward": asdict(self.steward),
                "added_p50_ms": self.added_p50_ms, "added_p99_ms": self.added_p99_ms,
                "upstream_cpu": _cpu_json(self.upstream_cpu), "steward_cpu": _cpu_json(self.steward_cpu)}


def _cpu_json(cpu: CpuUsage) -> dict[str, float]:
    return {**asdict(cpu), "ms_per_request": cpu.ms_per_request, "utilisation": cpu.utilisation}


@dataclass(frozen=True)
class Target:
    connections: int
    name: str
    limit: float
    unit: str
    measure: Callable[[Comparison], float]
    at_least: bool = False  # else: at most

    def check(self, comparison: Comparison) -> dict[str, Any]:
        value = self.measure(comparison)
        passed = value >= self.limit if self.at_least else value <= self.limit
        return {"connections": self.connections, "target": self.name, "value": value,
                "limit": f"{'>=' if self.at_least else '<='} {self.limit:g} {self.unit}".rstrip(), "pass": passed}


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("inf")


TARGETS = (
    Target(1, "added p50", 2.5, "ms", lambda c: c.added_p50_ms),
    Target(1, "added p99", 4.0, "ms", lambda c: c.added_p99_ms),
    Target(64, "steward req/s", 400, "", lambda c: c.steward.rps, at_least=True),
    Target(64, "steward p99 / p50", 2.0, "x", lambda c: _ratio(c.steward.p99_ms, c.steward.p50_ms)),
)


def check_targets(comparisons: list[Comparison]) -> list[dict[str, Any]]:
    by_connections = {c.connections: c for c in comparisons}
    return [target.check(by_connections[target.connections])
            for target in TARGETS if target.connections in by_connections]


# --------------------------------------------------------------------------- wrk

def run_wrk(url: str, connections: int, duration_s: int, script: Path) -> WrkResult:
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{duration_s}s", "--latency", "--timeout", WRK_SOCKET_TIMEOUT,
            "-s", str(script), url]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=duration_s + 60)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith(WRK_MARKER)), None)
    if done.returncode != 0 or line is None:
        raise BenchError(f"wrk failed (exit {done.returncode}) against {url}:\n{done.stdout}{done.stderr}")
    return parse_wrk_json(line.removeprefix(WRK_MARKER))


def parse_wrk_json(text: str) -> WrkResult:
    raw = json.loads(text)
    duration_s = raw["duration_us"] / 1e6
    return WrkResult(requests=raw["requests"], duration_s=duration_s, rps=raw["requests"] / duration_s,
                     p50_ms=raw["p50_us"] / 1000, p75_ms=raw["p75_us"] / 1000, p90_ms=raw["p90_us"] / 1000,
                     p99_ms=raw["p99_us"] / 1000, max_ms=raw["max_us"] / 1000,
                     errors={key: raw[key] for key in ("connect", "read", "write", "timeout", "status")})


def measure(url: str, connections: int, args: argparse.Namespace, script: Path,
            server_pid: int) -> tuple[WrkResult, CpuUsage]:
    """A warmup run, then the measured run, with the CPU time *server_pid* spent on it."""
    if args.warmup > 0:
        run_wrk(url, connections, args.warmup, script)
    cpu_before, wall_before = cpu_seconds(server_pid), time.monotonic()
    result = run_wrk(url, connections, args.duration, script)
    cpu = CpuUsage(cpu_seconds(server_pid) - cpu_before, time.monotonic() - wall_before, result.requests)
    return result, cpu


# --------------------------------------------------------------------------- steward

def write_config(workdir: Path, port: int) -> Path:
    config = workdir / "steward.yaml"
    config.write_text(CONFIG_TEMPLATE.format(port=port, events=json.dumps(str(workdir / "events.jsonl")),
                                             model=MODEL, python=json.dumps(sys.executable)))
    return config


@contextlib.contextmanager
def running_steward(workdir: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """Start steward on a fresh config; yields (process, base URL); always stops it."""
    port = free_port()
    config = write_config(workdir, port)
    log = (workdir / "steward.log").open("wb")
    # Its own session: a Ctrl-C in the terminal reaches this script only, which then stops steward once.
    process = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "run", str(config)], cwd=REPO_ROOT,
                               stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        yield process, f"http://127.0.0.1:{port}"
    finally:
        stop("steward", process)  # steward stops its engines; SIGKILLed, they die with it
        log.close()


def wait_until_ready(process: subprocess.Popen[bytes], base_url: str, workdir: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BenchError(f"steward exited ({process.returncode}) while starting:\n{_log_tail(workdir)}")
        with contextlib.suppress(OSError, ValueError):
            engine = get_json(f"{base_url}/healthz")["engines"][MODEL]
            if engine["status"] == "ready":
                return
        time.sleep(0.1)
    raise BenchError(f"the engine was not ready within {READY_TIMEOUT_S:g}s:\n{_log_tail(workdir)}")


def engine_event(events: Path, name: str) -> dict[str, Any]:
    """The last *name* event of the engine in the event log (written shortly after it happens)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            records = [json.loads(line) for line in events.read_text().splitlines()]
            matches = [r for r in records if r.get("event") == name and r.get("engine") == MODEL]
            if matches:
                return matches[-1]
        time.sleep(0.1)
    raise BenchError(f"no {name!r} event for {MODEL!r} in {events}")


def smoke_test(url: str) -> None:
    """One request, so a broken setup fails loudly instead of benchmarking error responses."""
    request = urllib.request.Request(url, data=REQUEST_BODY.encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            reply = json.load(response)
    except (OSError, ValueError) as exc:
        raise BenchError(f"POST {url} failed: {exc}") from None
    if reply.get("object") != "chat.completion":
        raise BenchError(f"POST {url} answered {reply!r}, not a chat.completion")


def _log_tail(workdir: Path, lines: int = 20) -> str:
    path = workdir / "steward.log"
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:]) or "(steward printed nothing)"


# --------------------------------------------------------------------------- output

def _ms(value: float, signed: bool = False) -> str:
    return f"{value:+.2f}" if signed else f"{value:.2f}"


def print_table(comparisons: list[Comparison], checks: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\nPOST {PATH} via wrk -t1, {args.duration}s measured after {args.warmup}s warmup; "
          f"direct = the fake upstream alone, steward = through steward\n")
    print(f"{'':4} {'req/s':^15}    {'p50 (ms)':^22}   {'p99 (ms)':^22}   {'errors':^15}   "
          f"{'CPU ms/req':^15}   {'CPU util':^15}")
    pair = f"{'direct':>7} {'steward':>7}"
    print(f"{'c':>4} {pair} {'':1}  {'direct':>6} {'steward':>7} {'added':>7}   "
          f"{'direct':>6} {'steward':>7} {'added':>7}   {pair}   {pair}   {pair}")
    for c in comparisons:
        d, s, ucpu, scpu = c.direct, c.steward, c.upstream_cpu, c.steward_cpu
        print(f"{c.connections:>4} {d.rps:>7.0f} {s.rps:>7.0f}    "
              f"{_ms(d.p50_ms):>6} {_ms(s.p50_ms):>7} {_ms(c.added_p50_ms, True):>7}   "
              f"{_ms(d.p99_ms):>6} {_ms(s.p99_ms):>7} {_ms(c.added_p99_ms, True):>7}   "
              f"{d.total_errors:>7} {s.total_errors:>7}   "
              f"{ucpu.ms_per_request:>7.3f} {scpu.ms_per_request:>7.3f}   "
              f"{ucpu.utilisation:>7.0%} {scpu.utilisation:>7.0%}")
    for c in comparisons:
        for label, result in (("direct", c.direct), ("steward", c.steward)):
            if result.total_errors:
                detail = ", ".join(f"{key} {n}" for key, n in result.errors.items() if n)
                print(f"  note: c={c.connections} {label}: {detail} (status = non-2xx/3xx responses)")
    print("\nsteward p75/p90 (ms): " + "; ".join(
        f"c={c.connections} {_ms(c.steward.p75_ms)}/{_ms(c.steward.p90_ms)}" for c in comparisons))
    print("CPU = the own CPU time (utime+stime) of the process serving the run: the fake upstream for direct,\n"
          "steward alone (not its engine) for steward; util = CPU seconds per wall second (100% = one core)\n")
    for check in checks:
        verdict = "PASS" if check["pass"] else "MISS"
        print(f"{verdict}  c={check['connections']:<3} {check['target']:<18} {check['value']:>9.2f}  "
              f"(target {check['limit']})")


def report_json(comparisons: list[Comparison], checks: list[dict[str, Any]], args: argparse.Namespace) -> str:
    return json.dumps({"duration_s": args.duration, "warmup_s": args.warmup, "path": PATH,
                       "results": [c.to_json() for c in comparisons], "targets": checks,
                       "pass": all(check["pass"] for check in checks)}, indent=2)


# --------------------------------------------------------------------------- main

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=10, help="seconds per measured run (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="seconds of warmup before each run (default 3)")
    parser.add_argument("--connections", default="1,64", help="comma-separated connection counts (default 1,64)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    try:
        args.connections = [int(c) for c in args.connections.split(",")]
    except ValueError:
        parser.error(f"--connections: expected numbers like 1,64, got {args.connections!r}")
    if args.duration < 1 or args.warmup < 0 or min(args.connections) < 1:
        parser.error("--duration and each connection count must be >= 1, --warmup >= 0")
    return args


def run_benchmark(args: argparse.Namespace, workdir: Path) -> list[Comparison]:
    script = workdir / "post.lua"
    script.write_text(WRK_SCRIPT.format(body=json.dumps(REQUEST_BODY), marker=WRK_MARKER))
    with running_steward(workdir) as (process, base_url):
        wait_until_ready(process, base_url, workdir)
        events = workdir / "events.jsonl"
        upstream_pid = engine_event(events, "spawn")["pid"]
        urls = {"direct": engine_event(events, "ready")["endpoint"] + PATH, "steward": base_url + PATH}
        for url in urls.values():
            smoke_test(url)
        comparisons = []
        for connections in args.connections:
            _progress(args, f"c={connections}: direct {urls['direct']}")
            direct, upstream_cpu = measure(urls["direct"], connections, args, script, upstream_pid)
            _progress(args, f"c={connections}: steward {urls['steward']}")
            steward, steward_cpu = measure(urls["steward"], connections, args, script, process.pid)
            comparisons.append(Comparison(connections, direct, steward, upstream_cpu, steward_cpu))
        return comparisons


def _progress(args: argparse.Namespace, message: str) -> None:
    print(f"bench: {message} ({args.warmup}s warmup + {args.duration}s)", file=sys.stderr, flush=True)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop steward


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("wrk") is None:
        print("bench: wrk is not installed; install it with `apt-get install wrk`", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        with tempfile.TemporaryDirectory(prefix="steward-bench-") as tmp:
            comparisons = run_benchmark(args, Path(tmp))
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    checks = check_targets(comparisons)
    if args.json:
        print(report_json(comparisons, checks, args))
    else:
        print_table(comparisons, checks, args)
    return 0 if all(check["pass"] for check in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
