"""keep_cache measured: the next turn of a ~4k-token conversation after its model was evicted and
loaded again, with the slot's KV cache restored against without, in one run.

Run from the repository root::

    .venv/bin/python tests/benchmarks/bench_kv_cache.py [--notes 215] [--threads 2] [--json]

Method: one ``steward run`` with two models on the REAL llama-server (the CPU build the tests use)
and SmolLM2-135M-Instruct, alike in everything but ``keep_cache``: ``kept`` has it, ``plain`` has
not. The memory budget holds one of them, so each request for the other evicts the one loaded (a
drain, then, for ``kept``, its slot's save, then the stop). Turn 1 of one conversation on each (a
system prompt of --notes numbered notes, ~18 tokens each: 215 make ~3.9k tokens), then turn 2 of
each (turn 1, its answer, a new question), in the order kept, plain, kept, plain: every request
loads its model again after the other evicted it. A turn's TTFT is the time from the request to
its whole answer of one token (``max_tokens: 1``): the load, the restore where there is one, the
prompt's prefill and one token. Printed: each turn's TTFT, load (the ``ready`` event's ``load_s``,
decision to ready, the restore included), prompt tokens read (``timings.prompt_n``) and found
cached (``cache_n``), prefill ms; the save's and restore's times and the file's size (its events);
and turn 2's TTFT kept/plain (target: <= 1/5).

Everything this script starts is stopped at its end. Exit status: 0, 1 if the run failed or the
target is missed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from bench_processes import free_port
from bench_streaming import BenchError, answers, running, wait_until

from fakes.llama_binary import llama_server_path
from fakes.real_model import smollm2_gguf

TARGET = 0.2  # turn 2's TTFT with restore / without
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()


def system_prompt(notes: int) -> str:
    lines = [f"Note {i}: {WORDS[i % 16]} {WORDS[i * 7 % 16]} {WORDS[i * 3 % 16]} measured {i * 13 % 97} units."
             for i in range(notes)]
    return "You are a helpful assistant. Answer from these notes.\n" + "\n".join(lines)


def config(port: int, events: Path, cache: Path, threads: int) -> str:
    binary, model = llama_server_path(), smollm2_gguf()
    engine = {"command": str(binary), "model": str(model), "memory": "1GiB", "parallel": 1,
              "args": ["-c", "8192", "--threads", str(threads), "--threads-batch", str(threads)]}
    return json.dumps({
        "listen": f"127.0.0.1:{port}", "log": {"file": str(events), "terminal": "warning"},
        "gpu": {"probe": "none", "budget": "1.5GiB"},  # room for one of the two
        "scheduler": {"swap_hold": "0s"},
        "kv_cache": {"dir": str(cache), "save_within": "30s", "restore_within": "60s"},
        "models": {"kept": {**engine, "keep_cache": {"slots": 1}}, "plain": engine}})


def ask(url: str, model: str, messages: list[dict[str, str]]) -> tuple[float, dict[str, Any]]:
    start = time.monotonic()
    answer = httpx.post(f"{url}/v1/chat/completions", timeout=600,
                        json={"model": model, "messages": messages, "max_tokens": 1, "temperature": 0})
    took = time.monotonic() - start
    if answer.status_code != 200:
        raise BenchError(f"{model}: {answer.status_code} {answer.text[:300]}")
    return took, answer.json()


def events_of(path: Path, name: str, engine: str) -> list[dict[str, Any]]:
    records = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return [r for r in records if r["event"] == name and r.get("engine") == engine]


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    port, events = free_port(), workdir / "events.jsonl"
    config_path = workdir / "config.json"
    config_path.write_text(config(port, events, workdir / "kv", args.threads))
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "supervisor.cli", "run", str(config_path)]
    system = system_prompt(args.notes)
    first = [{"role": "system", "content": system}, {"role": "user", "content": "What is note 5?"}]
    turns: dict[str, Any] = {}
    with running("steward", argv, workdir / "steward.log") as steward:
        wait_until(steward, "steward", workdir / "steward.log", lambda: answers(f"{url}/livez"), "steward not up")
        for turn, model in ((1, "kept"), (1, "plain"), (2, "kept"), (2, "plain")):
            messages = first
            if turn == 2:
                reply = turns[f"{model} 1"]["answer"]
                messages = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "And note 6?"}]
            ttft, answer = ask(url, model, messages)
            timings = answer.get("timings", {})
            load = events_of(events, "ready", model)[-1]["load_s"]
            turns[f"{model} {turn}"] = {
                "ttft_s": round(ttft, 3), "load_s": load, "prompt_tokens": answer["usage"]["prompt_tokens"],
                "prompt_n": timings.get("prompt_n"), "cache_n": timings.get("cache_n"),
                "prefill_ms": round(timings.get("prompt_ms", 0.0)), "answer": answer["choices"][0]["message"]["content"]}
        saved, restored = events_of(events, "cache_saved", "kept"), events_of(events, "cache_restored", "kept")
        skipped = events_of(events, "cache_skipped", "kept")
    ratio = turns["kept 2"]["ttft_s"] / turns["plain 2"]["ttft_s"]
    return {"turns": turns, "saves": [{k: s[k] for k in ("tokens", "bytes", "seconds")} for s in saved],
            "restores": [{k: r[k] for k in ("tokens", "bytes", "seconds")} for r in restored],
            "skipped": [{k: s[k] for k in ("action", "why", "detail")} for s in skipped],
            "ratio": round(ratio, 4), "target": TARGET, "pass": ratio <= TARGET}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notes", type=int, default=215, help="notes in the system prompt (~18 tokens each)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-kv-") as folder:
            results = run(args, Path(folder))
    except (BenchError, FileNotFoundError) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"{'turn':<8} {'TTFT s':>8} {'load s':>7} {'prompt':>7} {'cached':>7} {'read':>6} {'prefill ms':>10}")
        for name, t in results["turns"].items():
            print(f"{name:<8} {t['ttft_s']:>8.2f} {t['load_s']:>7.2f} {t['prompt_tokens']:>7} {t['cache_n']:>7} "
                  f"{t['prompt_n']:>6} {t['prefill_ms']:>10}")
        for save in results["saves"]:
            print(f"save     {save['tokens']} tokens, {save['bytes'] / 2**20:.1f} MiB in {save['seconds'] * 1000:.0f} ms")
        for restore in results["restores"]:
            print(f"restore  {restore['tokens']} tokens, {restore['bytes'] / 2**20:.1f} MiB in "
                  f"{restore['seconds'] * 1000:.0f} ms")
        for skip in results["skipped"]:
            print(f"skipped  {skip['action']}: {skip['why']} ({skip['detail']})")
        verdict = "PASS" if results["pass"] else "MISS"
        print(f"turn 2 TTFT kept/plain: {results['ratio']:.3f} (target <= {TARGET}): {verdict}")
    return 0 if results["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
