"""What steward's streaming relay costs in time to first token and chunks per second.

Run from the repository root::

    .venv/bin/python tests/benchmarks/bench_streaming.py [--clients 64] [--duration 10] [--warmup 3]
        [--max-tokens 64] [--tokens-per-second 100] [--json]

Method: start the fake vLLM (``python -m fakes.openai_server``, one token per SSE chunk at
--tokens-per-second per stream, access log off), then ``steward run`` on a temporary config
that attaches to it (runtime openai, upstream; an always-on engine, loaded at start), and wait
until steward's ``/healthz`` shows the engine ready. Then, for each target in turn (direct =
the fake's ``/v1/chat/completions``, steward = steward's), run --clients concurrent clients,
each POSTing ``stream: true`` chat requests with --max-tokens back to back (one ~0.6 s stream
each with the defaults). Clients start staggered over one stream's length so requests arrive
spread out, as in a steady state, not in lockstep; streams started during the first --warmup
seconds are not measured, and no stream starts after warmup + --duration. Per stream it
records the time to first token (from sending the request to the first SSE chunk whose delta
has content) and its chunks; per run, the chunks that arrived inside the measured window
divided by its length. Steward's added TTFT is its percentile minus the direct one. An error
is a non-200 answer, a transport error, or a stream that ends without ``data: [DONE]``.

All clients live in this one process (httpx on trio), for both targets in turn, so both runs
pay the same client costs. On a small machine (2 cores) the client, the fake and steward
share the CPUs: the client's own CPU use is printed so a saturated client shows, and figures
are only comparable between runs on the same, otherwise idle, machine.

Steward and the fake are always stopped (SIGTERM, up to 15 s, then SIGKILL), on errors,
Ctrl-C and SIGTERM too. Exit status: 0, 1 if the run failed or any stream had an error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = "shared"
PATH = "/v1/chat/completions"
READY_TIMEOUT_S = 30.0
STOP_GRACE_S = 15.0
REQUEST_TIMEOUT_S = 30.0  # a slow stream counts as latency, not as an error
ERROR_PAUSE_S = 0.1       # after a failed stream, so a refused connection does not spin a client

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
    client_cpu: float  # this process's CPU seconds per wall second over the run (1.0 = one core)

    @classmethod
    def of(cls, tally: Tally, window_s: float, client_cpu: float) -> RunResult:
        ttfts = sorted(tally.ttfts_s)
        counts = tally.chunks_per_stream
        return cls(streams=tally.streams, errors=tally.errors, first_error=tally.first_error,
                   ttft_p50_ms=1000 * percentile(ttfts, 50), ttft_p99_ms=1000 * percentile(ttfts, 99),
                   ttft_max_ms=1000 * ttfts[-1] if ttfts else math.nan,
                   chunks_per_stream=sum(counts) / len(counts) if counts else math.nan,
                   chunks_per_s=tally.window_chunks / window_s, client_cpu=client_cpu)


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


async def one_stream(client: httpx.AsyncClient, url: str, body: bytes,
                     window: tuple[float, float], tally: Tally | None) -> str | None:
    """One streaming request; its figures go to *tally* (None: a warmup stream). The error, or None."""
    sent = time.perf_counter()
    ttft: float | None = None
    chunks, done = 0, False
    async with client.stream("POST", url, content=body, headers={"Content-Type": "application/json"}) as response:
        if response.status_code != 200:
            await response.aread()
            return f"HTTP {response.status_code}: {response.text[:200]}"
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            chunks += 1
            now = time.perf_counter()
            if tally is not None or window[0] <= now < window[1]:  # a warmup stream's late chunks count too
                if window[0] <= now < window[1] and tally is not None or tally is None:
                    pass
            if ttft is None and has_content(line[6:]):  # JSON only until the first token: the client's CPU
                ttft = now - sent
    if not done:
        return "a stream ended without data: [DONE]"
    if tally is not None:
        tally.streams += 1
        tally.chunks_per_stream.append(chunks)
        if ttft is not None:
            tally.ttfts_s.append(ttft)
    return None
