"""A real model's speed direct and through steward: decode tokens/s and time to first token.

Run from the repository root::

    .venv/bin/python tests/benchmarks/bench_real_model.py [--streams 1,2,4] [--rounds 3]
        [--max-tokens 96] [--threads 2] [--json]

Method: start the REAL llama-server (the CPU build the tests use, ``fakes/llama_binary.py``) with
SmolLM2-135M-Instruct (Q4_1, ``fakes/real_model.py``), ``--parallel`` the largest of --streams,
then ``steward run`` attached to that same server (runtime openai, upstream): both targets talk
to one engine process, so what differs is steward's path alone. For each count of concurrent
streams, rounds alternate direct and through steward (direct first in odd rounds, steward first
in even ones: the engine's own drift falls on both). A round starts that many streamed chat
completions at once, each of exactly --max-tokens tokens (``ignore_eos``, greedy), and records
per stream the time to first token (request sent → first delta with text) and its decode rate
(tokens after the first / time from the first to the last). Per target and count: the median
of the streams' TTFT and the sum of the streams' decode rates (aggregate tokens/s), as medians
over rounds. Steward's share of the direct rate and its added TTFT (p50 over all streams) are
the figures the README quotes (target: >= 98 % and <= 5 ms).

Everything this script starts is stopped at its end, on errors and on Ctrl-C too.
Exit status: 0, 1 if a stream failed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import trio
from bench_processes import free_port
from bench_streaming import BenchError, answers, percentile, running, wait_until

from fakes.llama_binary import llama_server_path
from fakes.real_model import smollm2_gguf

MODEL = "smollm2"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
REQUEST_TIMEOUT_S = 120.0
CONFIG_TEMPLATE = """\
listen: 127.0.0.1:{port}
log: {{file: {events}, terminal: warning}}
gpu: {{probe: none, budget: 16GiB}}
models:
  {model}: {{runtime: openai, upstream: "127.0.0.1:{upstream_port}", memory: 1GiB, parallel: {parallel}}}
"""


@dataclass
class Stream:
    ttft_s: float
    decode_tps: float


@dataclass
class Row:
    streams: int
    direct_tps: float
    steward_tps: float
    direct_ttft_ms: float
    steward_ttft_ms: float
    steward_cpu_us_per_token: float

    @property
    def share(self) -> float:
        return self.steward_tps / self.direct_tps

    @property
    def added_ttft_ms(self) -> float:
        return self.steward_ttft_ms - self.direct_ttft_ms


def request_body(max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "stream": True,
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}


async def one_stream(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Stream:
    sent = time.perf_counter()
    first = last = None
    tokens = 0
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                raise BenchError(f"{url}: HTTP {response.status_code}: {(await response.aread())[:300]!r}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if any((choice.get("delta") or {}).get("content") for choice in chunk.get("choices") or ()):
                    last = time.perf_counter()
                    first = first or last
                    tokens += 1
    except httpx.TransportError as error:
        raise BenchError(f"{url}: {type(error).__name__}: {error} after {tokens} tokens") from error
    if first is None or last is None or tokens < 2:
        raise BenchError(f"{url}: a stream of {tokens} tokens")
    return Stream(first - sent, (tokens - 1) / (last - first))


async def one_round(client: httpx.AsyncClient, url: str, streams: int, max_tokens: int) -> list[Stream]:
    done: list[Stream] = []

    async def run() -> None:
        done.append(await one_stream(client, url, request_body(max_tokens)))

    async with trio.open_nursery() as nursery:
        for _ in range(streams):
            nursery.start_soon(run)
    return done


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(targets: dict[str, str], steward_pid: int, args: argparse.Namespace) -> list[Row]:
    rows = []
    # A fresh connection per request to both targets: llama-server closes an idle keep-alive
    # connection after 5 s, and a pooled one reused at that moment fails with no answer.
    limits = httpx.Limits(max_connections=max(args.streams) * 2, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        for url in targets.values():  # warm: the engine's first answer pays for its caches
            await one_round(client, url, 1, 8)
        for streams in args.streams:
            tps: dict[str, list[float]] = {name: [] for name in targets}
            steward_cpu_s = 0.0
            ttft: dict[str, list[float]] = {name: [] for name in targets}
            for index in range(args.rounds):
                order = list(targets) if index % 2 == 0 else list(reversed(targets))
                for name in order:
                    cpu_before = cpu_seconds(steward_pid)
                    result = await one_round(client, targets[name], streams, args.max_tokens)
                    if name == "steward":
                        steward_cpu_s += cpu_seconds(steward_pid) - cpu_before
                    tps[name].append(sum(stream.decode_tps for stream in result))
                    ttft[name].extend(stream.ttft_s for stream in result)
            print(f"bench: {streams} stream(s) done", file=sys.stderr, flush=True)
            rows.append(Row(streams, statistics.median(tps["direct"]), statistics.median(tps["steward"]),
                            percentile(sorted(ttft["direct"]), 50) * 1000,
                            percentile(sorted(ttft["steward"]), 50) * 1000,
                            steward_cpu_s * 1e6 / (args.rounds * streams * args.max_tokens)))
    return rows


def run_benchmark(args: argparse.Namespace, workdir: Path) -> list[Row]:
    engine_port, steward_port = free_port(), free_port()
    engine_argv = [str(llama_server_path()), "--model", str(smollm2_gguf()), "--host", "127.0.0.1",
                   "--port", str(engine_port), "--parallel", str(max(args.streams)), "--threads", str(args.threads),
                   "-c", str(max(args.streams) * 1024), "--alias", MODEL]
    config = workdir / "steward.yaml"
    config.write_text(CONFIG_TEMPLATE.format(port=steward_port, events=json.dumps(str(workdir / "events.jsonl")),
                                             model=MODEL, upstream_port=engine_port, parallel=max(args.streams)))
    targets = {"direct": f"http://127.0.0.1:{engine_port}", "steward": f"http://127.0.0.1:{steward_port}"}
    print(f"bench: {targets}", file=sys.stderr, flush=True)
    with running("llama-server", engine_argv, workdir / "llama-server.log") as engine:
        wait_until(engine, "llama-server", workdir / "llama-server.log",
                   lambda: answers(f"{targets['direct']}/health"), "llama-server did not answer /health")
        steward_argv = [sys.executable, "-m", "supervisor.cli", "run", str(config)]
        with running("steward", steward_argv, workdir / "steward.log") as steward:
            wait_until(steward, "steward", workdir / "steward.log",
                       lambda: answers(f"{targets['steward']}/v1/models"), "steward did not answer /v1/models")
            return trio.run(measure, targets, steward.pid, args)


def print_table(rows: list[Row], args: argparse.Namespace) -> None:
    print(f"SmolLM2-135M-Instruct Q4_1 on llama-server (CPU, --threads {args.threads}), {args.max_tokens} tokens "
          f"per stream, median of {args.rounds} rounds")
    print(f"{'streams':>7}  {'direct tok/s':>12}  {'steward tok/s':>13}  {'share':>6}  "
          f"{'TTFT p50 direct':>15}  {'steward':>8}  {'added':>7}  {'steward CPU/token':>17}")
    for row in rows:
        print(f"{row.streams:>7}  {row.direct_tps:>12.1f}  {row.steward_tps:>13.1f}  {row.share:>6.1%}  "
              f"{row.direct_ttft_ms:>12.1f} ms  {row.steward_ttft_ms:>5.1f} ms  {row.added_ttft_ms:>+4.1f} ms  {row.steward_cpu_us_per_token:>14.0f} µs")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=lambda v: [int(n) for n in v.split(",")], default=[1, 2, 4],
                        help="comma-separated counts of concurrent streams (default 1,2,4)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per target and count (default 3)")
    parser.add_argument("--max-tokens", type=int, default=96, help="tokens per stream (default 96)")
    parser.add_argument("--threads", type=int, default=2, help="llama-server's --threads (default 2)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-real-model-") as tmp:
        try:
            rows = run_benchmark(args, Path(tmp))
        except BenchError as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps([asdict(row) | {"share": row.share, "added_ttft_ms": row.added_ttft_ms} for row in rows]))
    else:
        print_table(rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
