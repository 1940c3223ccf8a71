"""What one long speech stream costs steward: its CPU time and memory while it relays the audio.

Run from the repository root::

    .venv/bin/python tests/benchmarks/bench_speech.py [--seconds 60] [--format pcm] [--chunk-seconds 0.25]
        [--idle 5] [--json]

Method: start the fake Kokoro-FastAPI (``python -m fakes.speech_server``) making audio in real
time (``--real-time-factor 1``: a chunk of --chunk-seconds of audio every --chunk-seconds), then
``steward run`` on a temporary config that attaches to it (runtime openai, ``serves: [speech]``),
and wait until steward's ``/healthz`` shows it ready. Steward's own CPU time (/proc/<pid>/stat,
not its children's) is read over --idle seconds with nothing asked (its own polling: the
baseline), then over one ``POST /v1/audio/speech`` whose input makes --seconds of audio,
read by this script as it comes. Its resident memory (VmRSS) is sampled every 0.1 s: before
the stream, its peak during it, and after. Printed: the stream's wall time, its first byte,
the largest gap between chunks, steward's CPU seconds over the stream and over as long idle,
the memory, and the seconds of audio steward's usage row says it sent (its ``request`` event's
``audio_s``: None for flac, whose header says no length). Whether the audio was all there: pcm and wav by their bytes,
the encoded formats (mp3, opus, aac, flac: PyAV, the test extra) decoded back.
Steward and the fake are always stopped (bench_streaming.py's ``running``).
Exit status: 0, 1 if the run failed or the audio was not all there.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from bench_processes import cpu_seconds, free_port, get_json
from bench_streaming import BenchError, answers, running, wait_until

CHARS_PER_SECOND = 15  # the fake's: one second of audio per 15 characters of input
BYTES_PER_SECOND = {"pcm": 48_000, "wav": 48_000}  # 16-bit mono at 24 kHz
FORMATS = ("pcm", "wav", "mp3", "opus", "aac", "flac")
CONFIG_TEMPLATE = """\
listen: 127.0.0.1:{port}
log: {{file: {events}, terminal: warning}}
gpu: {{probe: none, budget: 4GiB}}
models:
  tts: {{runtime: openai, upstream: "127.0.0.1:{upstream_port}", memory: 1GiB, parallel: 2, serves: [speech],
        served_name: kokoro}}
"""


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ProcessLookupError(pid)


class RssSampler(threading.Thread):
    """The peak of *pid*'s resident memory while it runs."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.done = pid, 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.1):
            self.peak = max(self.peak, rss_bytes(self.pid))


def stream(url: str, args: argparse.Namespace) -> dict[str, Any]:
    body = {"model": "tts", "voice": "af_heart", "input": "a" * (args.seconds * CHARS_PER_SECOND),
            "response_format": args.format}
    started = time.monotonic()
    first = last = None
    gap, chunks, audio = 0.0, 0, bytearray()
    with httpx.stream("POST", f"{url}/v1/audio/speech", json=body, timeout=args.seconds + 60) as answer:
        if answer.status_code != 200:
            raise BenchError(f"steward answered {answer.status_code}: {answer.read()[:300]!r}")
        for piece in answer.iter_raw():
            now = time.monotonic()
            first = now if first is None else first
            gap = max(gap, now - last) if last is not None else gap
            last, chunks = now, chunks + 1
            audio += piece
    return {"wall_s": round(time.monotonic() - started, 3), "first_byte_s": round((first or started) - started, 3),
            "largest_gap_s": round(gap, 3), "chunks": chunks, "bytes": len(audio),
            "complete": complete(bytes(audio), args)}


def complete(audio: bytes, args: argparse.Namespace) -> bool:
    """Whether *audio* is all of the --seconds asked: pcm and wav by their length, the others decoded."""
    if args.format in BYTES_PER_SECOND:
        return len(audio) == args.seconds * BYTES_PER_SECOND[args.format] + (44 if args.format == "wav" else 0)
    import av  # the test extra's; only the encoded formats need it

    with av.open(io.BytesIO(audio)) as container:
        decoded = sum(frame.samples / frame.sample_rate for frame in container.decode(audio=0))
    return decoded >= args.seconds - 1e-6  # mp3 and aac: and the encoder's delay and padding


def speech_request(events: Path) -> dict[str, Any] | None:
    """The speech request's ``request`` event (written once its answer ended), if it is there yet."""
    records = (json.loads(line) for line in events.read_text().splitlines())
    return next((r for r in records if r.get("event") == "request" and r.get("route") == "/v1/audio/speech"), None)


def run_benchmark(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    fake_port, steward_port = free_port(), free_port()
    fake_argv = [sys.executable, "-m", "fakes.speech_server", "--port", str(fake_port), "--real-time-factor", "1",
                 "--chunk-seconds", str(args.chunk_seconds), "--chars-per-second", str(CHARS_PER_SECOND)]
    config = workdir / "steward.yaml"
    config.write_text(CONFIG_TEMPLATE.format(port=steward_port, events=json.dumps(str(workdir / "events.jsonl")),
                                             upstream_port=fake_port))
    base = f"http://127.0.0.1:{steward_port}"
    fake_log, steward_log = workdir / "fake.log", workdir / "steward.log"
    with running("the fake", fake_argv, fake_log) as fake:
        wait_until(fake, "the fake", fake_log, lambda: answers(f"http://127.0.0.1:{fake_port}/health"),
                   "the fake did not answer /health")
        argv = [sys.executable, "-m", "supervisor.cli", "run", str(config)]
        with running("steward", argv, steward_log) as process:
            wait_until(process, "steward", steward_log,
                       lambda: get_json(f"{base}/healthz")["engines"]["tts"]["status"] == "ready",
                       "the attached engine was not ready")
            pid = process.pid
            idle_from = cpu_seconds(pid)
            time.sleep(args.idle)
            idle_cpu = cpu_seconds(pid) - idle_from
            rss_before = rss_bytes(pid)
            sampler = RssSampler(pid)
            sampler.start()
            cpu_from, fake_from = cpu_seconds(pid), cpu_seconds(fake.pid)
            result = stream(base, args)
            cpu, fake_cpu = cpu_seconds(pid) - cpu_from, cpu_seconds(fake.pid) - fake_from
            sampler.done.set()
            sampler.join()
            rss_after = rss_bytes(pid)
            events = workdir / "events.jsonl"
            wait_until(process, "steward", steward_log, lambda: speech_request(events), "no request event")
            measured = (speech_request(events) or {}).get("audio_s")
    return {**result, "audio_s": args.seconds, "format": args.format, "steward_audio_s": measured,
            "steward_cpu_s": round(cpu, 3), "steward_cpu_share": round(cpu / result["wall_s"], 4),
            "steward_idle_cpu_s": round(idle_cpu * result["wall_s"] / args.idle, 3),
            "fake_cpu_s": round(fake_cpu, 3), "steward_rss_before": rss_before,
            "steward_rss_peak": max(sampler.peak, rss_before), "steward_rss_after": rss_after}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=int, default=60, help="of audio (at most 273: OpenAI's 4096 characters)")
    p.add_argument("--format", choices=FORMATS, default="pcm")
    p.add_argument("--chunk-seconds", type=float, default=0.25)
    p.add_argument("--idle", type=float, default=5.0, help="seconds of steward idle, for its baseline CPU")
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        with tempfile.TemporaryDirectory(prefix="steward-bench-") as tmp:
            result = run_benchmark(args, Path(tmp))
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        mib = 2**20
        print(f"{result['audio_s']} s of {result['format']} audio in {result['chunks']} chunks over "
              f"{result['wall_s']} s (first byte {result['first_byte_s']} s, largest gap {result['largest_gap_s']} s, "
              f"{'complete' if result['complete'] else 'INCOMPLETE'}; steward counted "
              f"{result['steward_audio_s']} s)")
        print(f"steward CPU  {result['steward_cpu_s']} s over the stream ({result['steward_cpu_share']:.2%} of a core); "
              f"{result['steward_idle_cpu_s']} s over as long idle; the fake {result['fake_cpu_s']} s")
        print(f"steward RSS  {result['steward_rss_before'] / mib:.1f} MiB before, "
              f"{result['steward_rss_peak'] / mib:.1f} MiB peak, {result['steward_rss_after'] / mib:.1f} MiB after")
    return 0 if result["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
