"""What one proxied request costs steward in trio tasks, cancel scopes, worker threads and CPU.

Run from the repository root (no wrk needed; ~3 minutes a checkout with the defaults)::

    .venv/bin/python tests/benchmarks/count_per_request.py [--tree PATH | --before PATH --after PATH]
        [--requests 2000] [--streams 500] [--connections 1,64] [--idle 8] [--sample-hz 1000]
        [--sampling-scale 2] [--json]

``--before A --after B`` runs checkout A, then B, and prints them side by side; ``--tree PATH``
runs one (default: this script's checkout). The script itself runs from any checkout that has
``bench_proxy.py``, whose config and helpers it imports.

Engines: as ``bench_proxy.py``, ``steward run`` on a temporary config whose pinned engines cost
next to nothing: ``fast`` is ``fakes.fast_upstream`` (a fixed ~300-byte ``chat.completion`` for
every POST); ``sse`` is the same fake with its POST answer made an event stream
(``text/event-stream``, chunked: a role chunk, 8 content chunks, a finish chunk with usage,
``data: [DONE]``; 11 events 1 ms apart), because the fast fake answers ``stream: true`` with
plain JSON, which steward relays without its stream path.

Steward runs the checkout's code (``PYTHONPATH`` and working directory = the tree; checked)
through a wrapper written to the temporary directory, which needs only
``supervisor.cli.entry_point`` and ``steward run CONFIG``. Each checkout is measured twice:

* counting pass: before importing steward, the wrapper wraps ``trio.run`` to add a
  ``trio.abc.Instrument`` counting ``task_spawned``, and wraps ``trio.CancelScope.__enter__``
  (nurseries included), ``trio.to_thread.run_sync``, trio's thread cache
  (``ThreadCache.start_thread_soon``: every job run by a worker thread, whatever the API) and
  ``threading.Thread.start`` (new OS threads); each count is also kept by code site (the
  task's coroutine, the caller of the ``with``, the function run in the thread);
* sampling pass (``--sampling-scale`` times the requests, no counters, which would cost CPU):
  ``setitimer(ITIMER_PROF)`` sends SIGPROF every 1/``--sample-hz`` s of steward's CPU time
  (the kernel sends at most one a clock tick, so the samples column says how many were
  taken); the handler, run by Python in the main thread at its next bytecode, counts the file
  of the frame it interrupted (C code counts to its Python caller; a syscall, e.g. trio's
  epoll wait, to the code that made it), grouped as trio/_core, trio (the rest of trio), h11,
  hypercorn, supervisor, stdlib, other (other installed packages). The main thread's CPU
  time is split in proportion to the samples; the other threads' CPU time is "workers".

The wrapper writes its counters as JSON on SIGUSR1 (a snapshot) and when steward exits
(``final.json``; SIGTERM, steward's graceful stop). Sequence of a pass: wait for both engines,
one smoke request, a warmup (50 + 50 at c=1, 128 + 128 at c=64), an idle period (``--idle``
seconds, no requests), then for each connection count ``--requests`` non-streamed chat
completions to ``fast`` and ``--streams`` streamed ones to ``sse`` (c client threads, each
with one keep-alive connection for the whole phase: opening it is included, amortised over
requests / c), then a second idle period. A snapshot is taken around every phase. Per
request: a phase's figure minus the idle rate (both idle periods: the health watch and other
background work) times the phase's duration, divided by its requests. CPU ms: steward's own
utime + stime from /proc (its engines not included), idle rate subtracted likewise.

Counts per request barely depend on load (what does: how often a loop turns, e.g. how many
reads a stream takes, and timers that race the requests); CPU figures do: compare runs on the
same machine. Everything is bounded (``--phase-timeout``, socket timeouts, a 15 s graceful
stop, then SIGKILL of steward and of every process it started). Exit status: 0, or 1 if the
run failed or any request failed.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.client
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_processes import cpu_seconds, free_port, get_json, stop
from bench_proxy import MODEL, PATH, REQUEST_BODY, REPO_ROOT, BenchError, smoke_test, write_config

SSE_MODEL = "sse"
STREAM_BODY = json.dumps({"model": SSE_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True},
                         separators=(",", ":"))
READY_TIMEOUT_S = 40.0
SNAPSHOT_TIMEOUT_S = 10.0
SOCKET_TIMEOUT_S = 30.0
WARMUP = ((1, 50), (64, 128))  # (connections, requests of each kind)
GROUPS = ("trio/_core", "trio", "h11", "hypercorn", "supervisor", "stdlib", "other", "workers")
COUNTING = "(counting)"  # the wrapper's own counting code: left out of the shares

# The second engine: fakes.fast_upstream with its POST answer made an event stream. Run as
# `python sse_upstream.py [llama-server flags]` from the tree (fakes.fast_upstream is unchanged
# between the checkouts compared); serve() looks _Connection up when it starts.
SSE_UPSTREAM_SOURCE = r'''
import asyncio, json, sys
from fakes import fast_upstream

GAP_S = 0.001

def _event(data):
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"

def _chunk(choice, **extra):
    return {"id": "chatcmpl-sse", "object": "chat.completion.chunk", "created": 1700000000, "model": "sse",
            "choices": [choice], **extra}

EVENTS = ([_event(_chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}))]
          + [_event(_chunk({"index": 0, "delta": {"content": f"tok{i} "}, "finish_reason": None})) for i in range(8)]
          + [_event(_chunk({"index": 0, "delta": {}, "finish_reason": "stop"},
                           usage={"prompt_tokens": 9, "completion_tokens": 8, "total_tokens": 17}))]
          + [b"data: [DONE]\n\n"])
HEAD = (b"HTTP/1.1 200 OK\r\nServer: sse-upstream\r\nContent-Type: text/event-stream\r\n"
        b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nConnection: %s\r\n\r\n")

def _framed(event):
    return b"%x\r\n%s\r\n" % (len(event), event)

class _Streaming(fast_upstream._Connection):
    def _respond(self, kind, keep_alive):
        if kind != "chat":
            return super()._respond(kind, keep_alive)
        transport, loop = self._transport, asyncio.get_running_loop()
        transport.write(HEAD % (b"keep-alive" if keep_alive else b"close") + _framed(EVENTS[0]))
        for i, event in enumerate(EVENTS[1:], 1):
            loop.call_later(GAP_S * i, self._send, transport, _framed(event))
        loop.call_later(GAP_S * len(EVENTS), self._end, transport, keep_alive)

    def _send(self, transport, data):
        if not transport.is_closing():
            transport.write(data)

    def _end(self, transport, keep_alive):
        self._send(transport, b"0\r\n\r\n")
        if not keep_alive:
            transport.close()

fast_upstream._Connection = _Streaming
sys.exit(fast_upstream.main())
'''

# The steward wrapper: `python steward_counting.py OUT_DIR SAMPLE_HZ run CONFIG`. Depends only on
# supervisor.cli.entry_point, so it runs any checkout.
WRAPPER_SOURCE = r'''
import collections, json, os, re, signal, sys, sysconfig, threading, time
__file__ = os.path.abspath(__file__).replace(os.sep, "/")

OUT = sys.argv[1]
SAMPLE_HZ = float(sys.argv[2])  # 0: no CPU sampling
COUNT = sys.argv[3] == "count"  # else no counters (the sampling pass)
sys.argv = ["steward", *sys.argv[4:]]
STDLIB = sysconfig.get_paths()["stdlib"].replace(os.sep, "/") + "/"

counts = collections.Counter()
sites = collections.defaultdict(collections.Counter)
NOT_OURS = ("/site-packages/trio/", "/contextlib.py", "/outcome/", "/async_generator/")

def where(code):
    f = code.co_filename.replace(os.sep, "/")
    for mark in ("/site-packages/", "/supervisor/", "/fakes/"):
        if mark in f:
            f = f.split(mark, 1)[1] if mark == "/site-packages/" else mark[1:] + f.split(mark, 1)[1]
            break
    else:
        f = f[len(STDLIB):] if f.startswith(STDLIB) else os.path.basename(f)
    return f"{f}:{getattr(code, 'co_qualname', code.co_name)}"

# ---- CPU sampler: SIGPROF every 1/SAMPLE_HZ s of the process's CPU time; Python runs the handler in
# the main thread at its next bytecode, with the frame it was in (C code counts to its Python caller).
samples = collections.Counter()

def group_of(frame):
    f = frame.f_code.co_filename.replace(os.sep, "/") if frame is not None else ""
    for mark, name in (("/hypercorn/", "hypercorn"), ("/h11/", "h11"), ("/site-packages/trio/_core/", "trio/_core"),
                       ("/site-packages/trio/", "trio"), ("/supervisor/", "supervisor")):
        if mark in f:
            return name
    if f == __file__:
        return "(counting)"  # this wrapper's own counting code
    if f.startswith(STDLIB) and "site-packages" not in f:
        return "stdlib"
    return "other"

def on_tick(signum, frame):
    samples[group_of(frame)] += 1
    if frame is not None:
        sites["cpu_samples"][where(frame.f_code).split(":", 1)[0]] += 1  # by file

if SAMPLE_HZ > 0:
    signal.signal(signal.SIGPROF, on_tick)
    signal.setitimer(signal.ITIMER_PROF, 1 / SAMPLE_HZ, 1 / SAMPLE_HZ)

import trio
import trio.to_thread
from trio._core import _thread_cache

def caller(frame):
    """The innermost frame outside trio and contextlib, as file:function."""
    for _ in range(12):
        if frame is None:
            return "?"
        if not any(mark in frame.f_code.co_filename.replace(os.sep, "/") for mark in NOT_OURS):
            return where(frame.f_code)
        frame = frame.f_back
    return "?"

def fn_name(fn):
    fn = getattr(fn, "func", fn)  # functools.partial
    code = getattr(fn, "__code__", None) or getattr(getattr(fn, "__func__", None), "__code__", None)
    return where(code) if code else f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}"

def install_counters():
    """Wrap trio.run (an Instrument), CancelScope.__enter__, to_thread.run_sync, the thread cache and
    Thread.start; each count also by code site."""
    class Counting(trio.abc.Instrument):
        def task_spawned(self, task):
            counts["tasks"] += 1
            code = getattr(task.coro, "cr_code", None)
            sites["tasks"][where(code) if code else re.sub(r"\d+", "N", task.name)] += 1

    _run = trio.run
    def run(*args, **kwargs):
        kwargs["instruments"] = [*kwargs.get("instruments", ()), Counting()]
        return _run(*args, **kwargs)
    trio.run = run

    _enter = trio.CancelScope.__enter__
    def enter(self):
        counts["cancel_scopes"] += 1
        frame = sys._getframe(1)
        nursery = frame.f_code.co_name == "__aenter__" and "trio/_core/_run.py" in frame.f_code.co_filename
        kind = "nursery" if nursery else "scope"
        sites["cancel_scopes"][f"{kind} @ {caller(frame)}"] += 1
        return _enter(self)
    trio.CancelScope.__enter__ = enter

    _run_sync = trio.to_thread.run_sync
    async def run_sync(sync_fn, *args, **kwargs):
        counts["to_thread"] += 1
        sites["to_thread"][f"{fn_name(sync_fn)} <- {caller(sys._getframe(1))}"] += 1
        return await _run_sync(sync_fn, *args, **kwargs)
    trio.to_thread.run_sync = run_sync

    _start_soon = _thread_cache.ThreadCache.start_thread_soon
    def start_thread_soon(self, fn, deliver, name=None):
        counts["thread_jobs"] += 1
        return _start_soon(self, fn, deliver, name)
    _thread_cache.ThreadCache.start_thread_soon = start_thread_soon

    _thread_start = threading.Thread.start
    def thread_start(self):
        counts["thread_starts"] += 1
        sites["thread_starts"][re.sub(r"\d+", "N", self.name)] += 1
        return _thread_start(self)
    threading.Thread.start = thread_start

if COUNT:
    install_counters()

def state():
    for _ in range(5):
        try:  # a worker thread may add to a counter meanwhile
            return {"pid": os.getpid(), "monotonic": time.monotonic(), "process_cpu_s": time.process_time(),
                    "main_cpu_s": time.thread_time(),  # signal handlers run in the main thread
                    "counts": dict(counts), "sites": {k: dict(v) for k, v in sites.items()}, "samples": dict(samples),
                    "supervisor_file": getattr(sys.modules.get("supervisor"), "__file__", None)}
        except RuntimeError:
            continue
    raise RuntimeError("counters kept changing")

def write(name):
    path = os.path.join(OUT, name)
    with open(path + ".tmp", "w") as f:
        json.dump(state(), f)
    os.replace(path + ".tmp", path)

snapshots = iter(range(1, 1 << 30))
signal.signal(signal.SIGUSR1, lambda signum, frame: write(f"snapshot-{next(snapshots)}.json"))

from supervisor.cli import entry_point
try:
    entry_point()
finally:
    signal.setitimer(signal.ITIMER_PROF, 0)
    write("final.json")
'''


# --------------------------------------------------------------------------- results

@dataclass
class Phase:
    name: str  # "idle", "idle-after", "chat", "stream"
    connections: int
    requests: int = 0
    errors: int = 0
    wall_s: float = 0.0
    steward_cpu_s: float = 0.0  # /proc utime + stime over the phase
    counts: dict[str, float] = field(default_factory=dict)  # deltas over the phase
    sites: dict[str, dict[str, float]] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds by group (the sampling pass)
    samples: int = 0


@dataclass
class Pass:
    """One steward process, counting or sampling, through the same sequence of phases."""

    phases: list[Phase] = field(default_factory=list)
    final_written: bool = False
    leftovers: list[int] = field(default_factory=list)

    def idle_rate(self) -> Phase:
        """Per second, over all the idle periods."""
        idle = [p for p in self.phases if p.name.startswith("idle")]
        wall = sum(p.wall_s for p in idle) or float("inf")
        rate = Phase("idle-rate", 0, wall_s=1.0, steward_cpu_s=sum(p.steward_cpu_s for p in idle) / wall)
        rate.counts = _scaled(_summed(p.counts for p in idle), 1 / wall)
        rate.cpu_s = _scaled(_summed(p.cpu_s for p in idle), 1 / wall)
        rate.sites = {k: _scaled(_summed(p.sites.get(k, {}) for p in idle), 1 / wall)
                      for k in {k for p in idle for k in p.sites}}
        return rate

    def phase(self, key: tuple[int, str]) -> Phase | None:
        return next((p for p in self.phases if (p.connections, p.name) == key), None)

    def per_request(self, phase: Phase) -> dict[str, Any]:
        """The phase's figures less the idle rate over its duration, per request."""
        idle = self.idle_rate()
        n = phase.requests or 1

        def net(values: dict[str, float], rates: dict[str, float]) -> dict[str, float]:
            return {k: (values.get(k, 0) - rates.get(k, 0) * phase.wall_s) / n for k in values.keys() | rates.keys()}

        cpu = {g: max(v, 0.0) for g, v in net(phase.cpu_s, idle.cpu_s).items()}
        counting = cpu.pop(COUNTING, 0.0)
        total = sum(cpu.values())
        return {"counts": net(phase.counts, idle.counts),
                "sites": {k: net(phase.sites.get(k, {}), idle.sites.get(k, {}))
                          for k in phase.sites.keys() | idle.sites.keys()},
                "cpu_ms": 1000 * (phase.steward_cpu_s - idle.steward_cpu_s * phase.wall_s) / n,
                "shares": {g: cpu.get(g, 0.0) / total if total else float("nan") for g in GROUPS},
                "sampled_ms": 1000 * total, "counting_ms": 1000 * counting, "samples": phase.samples}

    def to_json(self) -> dict[str, Any]:
        idle = self.idle_rate()
        return {"final_written": self.final_written, "leftovers": self.leftovers,
                "idle_per_s": {"counts": idle.counts, "cpu_s": idle.steward_cpu_s},
                "phases": [{"name": p.name, "connections": p.connections, "requests": p.requests, "errors": p.errors,
                            "wall_s": p.wall_s, "samples": p.samples,
                            **({} if p.name.startswith("idle") else {"per_request": self.per_request(p)})}
                           for p in self.phases]}


@dataclass
class TreeRun:
    label: str
    tree: str
    commit: str
    counted: Pass  # counters on, no sampling
    sampled: Pass  # CPU sampling on, no counters

    def passes(self) -> tuple[Pass, Pass]:
        return self.counted, self.sampled


def _summed(dicts: Iterable[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def _scaled(d: dict[str, float], factor: float) -> dict[str, float]:
    return {k: v * factor for k, v in d.items()}


def _delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, float]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in after.keys() | before.keys()}


def _cpu_by_group(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """CPU seconds by group between two snapshots: the main thread's CPU split in proportion to the
    samples of each group, every other thread's (process minus main thread) as "workers"."""
    samples = _delta(after["samples"], before["samples"])
    main_s = after["main_cpu_s"] - before["main_cpu_s"]
    total = sum(samples.values())
    cpu = {group: main_s * n / total for group, n in samples.items()} if total else {}
    cpu["workers"] = (after["process_cpu_s"] - after["main_cpu_s"]) - (before["process_cpu_s"] - before["main_cpu_s"])
    return cpu


# --------------------------------------------------------------------------- load

def drive(port: int, body: str, expect: bytes, total: int, connections: int, timeout_s: float) -> tuple[int, int]:
    """*total* POSTs over *connections* keep-alive clients (threads); (completed, failed).
    A response counts as completed if it is a 200 whose body contains *expect*."""
    issued = itertools.count()
    lock = threading.Lock()
    done = [0, 0]
    deadline = time.monotonic() + timeout_s
    headers = {"Content-Type": "application/json"}

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=SOCKET_TIMEOUT_S)
        try:
            while time.monotonic() < deadline:
                with lock:
                    if next(issued) >= total:
                        return
                ok = False
                try:
                    conn.request("POST", PATH, body, headers)
                    response = conn.getresponse()
                    data = response.read()
                    ok = response.status == 200 and expect in data
                except (OSError, http.client.HTTPException):
                    conn.close()  # reconnects on the next request
                with lock:
                    done[0 if ok else 1] += 1
        finally:
            conn.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline + SOCKET_TIMEOUT_S - time.monotonic()))
    if any(thread.is_alive() for thread in threads) or sum(done) < total:
        raise BenchError(f"{total} requests at c={connections} did not finish within {timeout_s:g}s "
                         f"({done[0]} ok, {done[1]} failed)")
    return done[0], done[1]


# --------------------------------------------------------------------------- steward

class Steward:
    """``steward run`` from one checkout, under the wrapper (counting, or sampling CPU)."""

    def __init__(self, tree: Path, workdir: Path, count: bool, sample_hz: float) -> None:
        self.workdir, self.out = workdir, workdir / "counts"
        self.out.mkdir()
        wrapper, sse = workdir / "steward_counting.py", workdir / "sse_upstream.py"
        wrapper.write_text(WRAPPER_SOURCE)
        sse.write_text(SSE_UPSTREAM_SOURCE)
        self.port = free_port()
        config = write_config(workdir, self.port)  # bench_proxy's config: one pinned fast_upstream
        with config.open("a") as f:
            f.write(f"  {SSE_MODEL}:\n    command: [{json.dumps(sys.executable)}, {json.dumps(str(sse))}]\n"
                    "    memory: 1MiB\n    parallel: 128\n    pinned: true\n")
        self.log = (workdir / "steward.log").open("wb")
        argv = [sys.executable, str(wrapper), str(self.out), str(sample_hz), "count" if count else "sample",
                "run", str(config)]
        # Its own session: a Ctrl-C in the terminal reaches this script only, which then stops steward.
        self.process = subprocess.Popen(argv, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                                        stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        self._snapshots = 0
        self.descendants: set[int] = set()

    def wait_until_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BenchError(f"steward exited ({self.process.returncode}) while starting:\n{self.log_tail()}")
            with contextlib.suppress(OSError, ValueError, KeyError):
                engines = get_json(f"http://127.0.0.1:{self.port}/healthz")["engines"]
                if all(engines[m]["status"] == "ready" for m in (MODEL, SSE_MODEL)):
                    self.descendants = _descendants(self.process.pid)
                    return
            time.sleep(0.1)
        raise BenchError(f"the engines were not ready within {READY_TIMEOUT_S:g}s:\n{self.log_tail()}")

    def snapshot(self) -> dict[str, Any]:
        """SIGUSR1: the wrapper writes its counters; read them, with steward's CPU time from /proc."""
        self._snapshots += 1
        path = self.out / f"snapshot-{self._snapshots}.json"
        self.process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + SNAPSHOT_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError, ValueError):
                state = json.loads(path.read_text())
                state["proc_cpu_s"] = cpu_seconds(self.process.pid)
                return state
            if self.process.poll() is not None:
                raise BenchError(f"steward exited ({self.process.returncode}):\n{self.log_tail()}")
            time.sleep(0.02)
        raise BenchError(f"steward wrote no snapshot within {SNAPSHOT_TIMEOUT_S:g}s")

    def stop(self) -> tuple[bool, list[int]]:
        """SIGTERM (a graceful stop), up to 15 s, then SIGKILL; then SIGKILL whatever it started that
        outlived it. Returns (the final counts were written, the pids that had to be killed)."""
        if self.process.poll() is None:
            self.descendants |= _descendants(self.process.pid)
        stop("steward", self.process)
        self.log.close()
        leftovers = []
        for pid in sorted(self.descendants):
            if _alive(pid):
                leftovers.append(pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return (self.out / "final.json").exists(), leftovers

    def log_tail(self, lines: int = 20) -> str:
        path = self.workdir / "steward.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:]) or "(steward printed nothing)"


def _descendants(pid: int) -> set[int]:
    """Every live process under *pid* (from the ppid in /proc/*/stat)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


# --------------------------------------------------------------------------- one checkout

def run_pass(label: str, tree: Path, args: argparse.Namespace, count: bool) -> Pass:
    """Start steward, warm it up, then the idle and load phases, a snapshot around each; stop it."""
    result = Pass()
    what = "counting" if count else f"sampling CPU ({args.sampling_scale}x the requests)"
    scale = 1 if count else args.sampling_scale
    kinds = {"chat": (REQUEST_BODY, b'"chat.completion"', args.requests * scale),
             "stream": (STREAM_BODY, b"data: [DONE]", args.streams * scale)}
    with tempfile.TemporaryDirectory(prefix="steward-count-") as tmp:
        steward = Steward(tree, Path(tmp), count, 0 if count else args.sample_hz)
        try:
            _progress(f"{label}: steward from {tree}, {what}")
            steward.wait_until_ready()
            smoke_test(f"http://127.0.0.1:{steward.port}{PATH}")
            first = steward.snapshot()
            if not str(first.get("supervisor_file", "")).startswith(str(tree) + os.sep):
                raise BenchError(f"steward ran {first.get('supervisor_file')}, not the code in {tree}")
            for connections, n in WARMUP:
                for body, expect, _ in kinds.values():
                    _, failed = drive(steward.port, body, expect, n, connections, args.phase_timeout)
                    if failed:
                        raise BenchError(f"warmup: {failed} of {n} requests failed at c={connections}:\n"
                                         f"{steward.log_tail()}")

            def phase(name: str, connections: int, work: Callable[[], tuple[int, int]]) -> None:
                before = steward.snapshot()
                measured = Phase(name, connections)
                measured.requests, measured.errors = work()
                after = steward.snapshot()
                measured.wall_s = after["monotonic"] - before["monotonic"]
                measured.steward_cpu_s = after["proc_cpu_s"] - before["proc_cpu_s"]
                measured.counts = _delta(after["counts"], before["counts"])
                measured.sites = {k: _delta(after["sites"].get(k, {}), before["sites"].get(k, {}))
                                  for k in after["sites"].keys() | before["sites"].keys()}
                measured.cpu_s = _cpu_by_group(before, after)
                measured.samples = int(sum(_delta(after["samples"], before["samples"]).values()))
                result.phases.append(measured)

            def idle() -> tuple[int, int]:
                time.sleep(args.idle)
                return 0, 0

            phase("idle", 0, idle)
            for connections in args.connections:
                for name, (body, expect, n) in kinds.items():
                    _progress(f"{label}: c={connections}, {n} x {name}")
                    phase(name, connections, functools.partial(drive, steward.port, body, expect, n, connections,
                                                               args.phase_timeout))
            phase("idle-after", 0, idle)
        finally:
            result.final_written, result.leftovers = steward.stop()
    return result


def measure_tree(label: str, tree: Path, args: argparse.Namespace) -> TreeRun:
    commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, timeout=30).stdout.strip() or "?"
    counted = run_pass(label, tree, args, count=True)
    sampled = run_pass(label, tree, args, count=False) if args.sample_hz > 0 else Pass()
    return TreeRun(label, str(tree), commit, counted, sampled)


# --------------------------------------------------------------------------- output

COUNT_COLUMNS = (("tasks", "tasks"), ("cancel_scopes", "cancel scopes"), ("to_thread", "to_thread"),
                 ("thread_jobs", "thread jobs"), ("thread_starts", "new threads"))
SITE_KINDS = ("tasks", "cancel_scopes", "to_thread", "thread_starts")


def print_tables(runs: list[TreeRun], args: argparse.Namespace) -> None:
    labels = [r.label for r in runs]
    width = max(7, *(len(x) for x in labels))
    keys = _phase_keys(runs)
    print("\n" + "; ".join(f"{r.label} = {r.tree} @ {r.commit}" for r in runs))
    print(f"chat = non-streamed POST {PATH} to fakes.fast_upstream ({args.requests} a phase); stream = stream:true "
          f"to the SSE fake, 11 events ({args.streams} a phase)")
    print("\nPer proxied request (counting pass, idle rate subtracted)")
    head = f"{'c':>3} {'kind':<6}"
    for _, title in COUNT_COLUMNS:
        head += " | " + f"{title:^{len(runs) * (width + 1) - 1}}"
    print(head)
    print(f"{'':>3} {'':<6}" + (" | " + " ".join(f"{x:>{width}}" for x in labels)) * len(COUNT_COLUMNS))
    for key in keys:
        rows = [_per_request(r.counted, key) for r in runs]
        line = f"{key[0]:>3} {key[1]:<6}"
        for column, _ in COUNT_COLUMNS:
            line += " | " + " ".join(_figure(row["counts"].get(column, 0), width) if row else f"{'-':>{width}}"
                                     for row in rows)
        print(line)
    print("to_thread = trio.to_thread.run_sync calls; thread jobs = jobs run by trio's worker threads (any API);\n"
          "new threads = threading.Thread.start calls")

    if args.sample_hz > 0:
        print("\nSteward's CPU per request (sampling pass, no counters; idle rate subtracted): its own utime+stime\n"
              "(engines not included) and the shares: where the main thread was when sampled; workers = other threads")
        print(f"{'c':>3} {'kind':<6} {'run':<{width}} {'CPU ms':>7} "
              + " ".join(f"{g:>10}" for g in GROUPS) + f" {'samples':>7}")
        for key in keys:
            for r in runs:
                row = _per_request(r.sampled, key)
                if row:
                    print(f"{key[0]:>3} {key[1]:<6} {r.label:<{width}} {row['cpu_ms']:>7.3f} "
                          + " ".join(f"{row['shares'][g]:>10.1%}" for g in GROUPS) + f" {row['samples']:>7}")

    for r in runs:
        print(f"\n{r.label}:")
        for name, one in (("counting", r.counted), ("sampling", r.sampled)):
            if not one.phases:
                continue
            idle = one.idle_rate()
            periods = [f"{p.wall_s:.1f}s" for p in one.phases if p.name.startswith("idle")]
            print(f"  {name} pass, idle per second (over {' + '.join(periods)}): "
                  + ", ".join(f"{t} {idle.counts.get(k, 0):.2f}" for k, t in COUNT_COLUMNS)
                  + f", CPU {1000 * idle.steward_cpu_s:.1f} ms")
            for p in one.phases:
                if p.errors:
                    print(f"  note: c={p.connections} {p.name}: {p.errors} of {p.requests + p.errors} requests failed")
            if one.leftovers:
                print(f"  note: killed processes steward left behind: {one.leftovers}")
            if not one.final_written:
                print("  note: steward wrote no final counts when it stopped")
        for key in keys:
            row = _per_request(r.counted, key)
            if not row or key[0] != min(args.connections):
                continue
            print(f"  where, per request at c={key[0]} {key[1]} (>= {args.min_site:g}):")
            for kind in SITE_KINDS:
                top = sorted(((v, s) for s, v in row["sites"].get(kind, {}).items() if abs(v) >= args.min_site),
                             reverse=True)
                for value, site in top[:args.top]:
                    print(f"    {kind:<13} {value:6.2f}  {site}")
            sampled = _per_request(r.sampled, key)
            files = sampled["sites"].get("cpu_samples", {}) if sampled else {}
            total = sum(v for v in files.values() if v > 0)
            for value, site in sorted(((v / total, s) for s, v in files.items() if v > 0), reverse=True)[:args.top]:
                print(f"    {'CPU by file':<13} {value:6.1%}  {site}")


def _figure(value: float, width: int) -> str:
    return f"{value:>{width}.2f}".replace("-0.00", " 0.00")


def _phase_keys(runs: list[TreeRun]) -> list[tuple[int, str]]:
    keys: list[tuple[int, str]] = []
    for r in runs:
        for p in r.counted.phases + r.sampled.phases:
            if not p.name.startswith("idle") and (p.connections, p.name) not in keys:
                keys.append((p.connections, p.name))
    return keys


def _per_request(one: Pass, key: tuple[int, str]) -> dict[str, Any] | None:
    phase = one.phase(key)
    return one.per_request(phase) if phase else None


def report_json(runs: list[TreeRun], args: argparse.Namespace) -> str:
    return json.dumps({"requests": args.requests, "streams": args.streams, "connections": args.connections,
                       "idle_s": args.idle, "sample_hz": args.sample_hz,
                       "runs": [{"label": r.label, "tree": r.tree, "commit": r.commit,
                                 "counting": r.counted.to_json(), "sampling": r.sampled.to_json()} for r in runs]},
                      indent=2)


# --------------------------------------------------------------------------- main

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, help="the checkout to run (default: this script's)")
    parser.add_argument("--before", type=Path, help="a checkout to compare: run first, labelled before")
    parser.add_argument("--after", type=Path, help="the other checkout: run second, labelled after")
    parser.add_argument("--requests", type=int, default=2000, help="non-streamed requests a phase (default 2000)")
    parser.add_argument("--streams", type=int, default=500, help="streamed requests a phase (default 500)")
    parser.add_argument("--connections", default="1,64", help="comma-separated connection counts (default 1,64)")
    parser.add_argument("--idle", type=float, default=8, help="seconds of each idle period (default 8)")
    parser.add_argument("--sample-hz", type=float, default=1000,
                        help="CPU samples a second of steward's CPU time; 0: no sampling pass (default 1000)")
    parser.add_argument("--sampling-scale", type=int, default=2,
                        help="the sampling pass sends this many times the requests, for more samples (default 2)")
    parser.add_argument("--phase-timeout", type=float, default=300, help="seconds a phase may take (default 300)")
    parser.add_argument("--top", type=int, default=10, help="code sites listed a count (default 10)")
    parser.add_argument("--min-site", type=float, default=0.05, help="smallest per-request site listed")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the tables")
    args = parser.parse_args(argv)
    try:
        args.connections = [int(c) for c in args.connections.split(",")]
    except ValueError:
        parser.error(f"--connections: expected numbers like 1,64, got {args.connections!r}")
    if min(args.connections) < 1 or args.requests < 1 or args.streams < 1 or args.idle <= 0 or args.sample_hz < 0 \
            or args.sampling_scale < 1:
        parser.error("connection counts, --requests, --streams and --sampling-scale must be >= 1, --idle > 0, "
                     "--sample-hz >= 0")
    if args.tree and (args.before or args.after):
        parser.error("--tree or --before/--after, not both")
    if args.before or args.after:
        args.trees = [(label, path) for label, path in (("before", args.before), ("after", args.after)) if path]
    else:
        args.trees = [("run", args.tree or REPO_ROOT)]
    args.trees = [(label, path.resolve()) for label, path in args.trees]
    for _, path in args.trees:
        if not (path / "supervisor" / "cli.py").is_file():
            parser.error(f"{path} is not a steward checkout (no supervisor/cli.py)")
    return args


def _progress(message: str) -> None:
    print(f"count: {message}", file=sys.stderr, flush=True)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop steward


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        runs = [measure_tree(label, path, args) for label, path in args.trees]
    except BenchError as exc:
        print(f"count: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("count: interrupted", file=sys.stderr)
        return 130
    if args.json:
        print(report_json(runs, args))
    else:
        print_tables(runs, args)
    failed = any(p.errors for r in runs for one in r.passes() for p in one.phases)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
