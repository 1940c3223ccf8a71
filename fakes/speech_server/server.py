"""The fake Kokoro-FastAPI: its routes, its checks in its own words, the audio streamed in chunks.

Kokoro-FastAPI (FastAPI under uvicorn) checks the request with pydantic first (a 422
``{"detail": [...]}`` for a ``response_format`` outside its six, a ``speed`` outside 0.25..4, a
missing ``input``), then the model against its OpenAI names (a 400 ``invalid_model``), then the
voice (a 400 ``validation_error`` listing its voices; OpenAI's voice names map to its own).
``stream`` is true unless the body says false: the audio goes out chunked, each chunk when it is
made, with ``X-Accel-Buffering: no``; ``stream: false`` gets the whole file with its length.
``stream_format`` is not one of its fields: it answers audio whatever is asked. A piece of audio
its encoder made nothing of yet is not sent (Kokoro skips empty chunks).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from fakes import simgpu
from fakes.http11 import ConnectionPolicy, Exchange, HttpServer, watch_signals
from fakes.openai_server.cli import Log
from fakes.openai_server.reply import Reply
from fakes.runner import run_fake
from fakes.speech_server.audio import SAMPLE_RATE, frames
from fakes.speech_server.encode import ENCODED, WRITTEN, AudioWriter
from supervisor.units import parse_size

MODELS = ("tts-1", "tts-1-hd", "kokoro")  # Kokoro-FastAPI's openai_mappings.json
VOICES = ("af_heart", "af_bella", "af_nicole", "af_sky", "am_adam", "am_michael", "bf_emma", "bm_george")
OPENAI_VOICES = {"alloy": "am_adam", "ash": "af_nicole", "coral": "bf_emma", "echo": "af_bella",
                 "fable": "af_sky", "onyx": "bm_george", "nova": "af_heart", "sage": "am_michael",
                 "shimmer": "af_sky"}
FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
MADE = WRITTEN | ENCODED  # all six where PyAV is installed (the test extra); else wav and pcm
CONTENT_TYPES = {"mp3": b"audio/mpeg", "opus": b"audio/opus", "aac": b"audio/aac", "flac": b"audio/flac",
                 "wav": b"audio/wav", "pcm": b"audio/pcm"}


@attrs.frozen
class Config:
    host: str
    port: int
    chars_per_second: float  # how much input makes one second of audio (at speed 1)
    chunk_seconds: float  # audio in each chunk
    real_time_factor: float  # audio seconds made per wall-clock second; <= 0: at once
    hold_last: Path | None  # the last chunk waits until this file exists (a test releases it)
    memory: int
    sim_gpu: str | None


def parse_config(argv: Sequence[str] | None = None) -> Config:
    p = argparse.ArgumentParser(prog="fakes.speech_server", allow_abbrev=False)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8880)  # Kokoro-FastAPI's
    p.add_argument("--chars-per-second", type=float, default=15.0)
    p.add_argument("--chunk-seconds", type=float, default=0.25)
    p.add_argument("--real-time-factor", type=float, default=50.0)
    p.add_argument("--hold-last", type=Path, default=None, metavar="FILE")
    p.add_argument("--memory", type=parse_size, default=0, help="bytes held on the simulated GPU")
    p.add_argument("--simulated-dir", "--sim-gpu", dest="sim_gpu", default=None, metavar="DIR")
    a = p.parse_args(argv)
    return Config(a.host, a.port, a.chars_per_second, max(0.01, a.chunk_seconds), a.real_time_factor, a.hold_last,
                  a.memory, a.sim_gpu)


class Refused(Exception):
    def __init__(self, status: int, body: object) -> None:
        super().__init__(status)
        self.status, self.body = status, body


@attrs.define
class Stats:
    started: int = 0
    finished: int = 0
    cancelled: int = 0  # the client left before the last chunk
    running: int = 0
    last_chunks_sent: int = 0  # chunks of the last stream written so far


@attrs.frozen
class Speech:
    voice: str
    response_format: str
    stream: bool
    seconds: float


def validation_error(field: str, kind: str, msg: str, value: object, ctx: dict[str, Any] | None = None) -> Refused:
    """pydantic's 422, as FastAPI answers a body that does not fit the model."""
    error = {"type": kind, "loc": ["body", field], "msg": msg, "input": value, **({"ctx": ctx} if ctx else {})}
    return Refused(422, {"detail": [error]})


def http_error(status: int, error: str, message: str, kind: str = "invalid_request_error") -> Refused:
    """Kokoro-FastAPI's HTTPException(detail={...})."""
    return Refused(status, {"detail": {"error": error, "message": message, "type": kind}})


def read_speech(body: bytes, cfg: Config) -> Speech:
    try:
        payload = json.loads(body)
    except ValueError:
        raise Refused(422, {"detail": [{"type": "json_invalid", "loc": ["body", 0], "msg": "JSON decode error",
                                        "input": {}, "ctx": {"error": "Expecting value"}}]}) from None
    if not isinstance(payload, dict):
        raise validation_error("", "model_attributes_type", "Input should be a valid dictionary or object to "
                                                            "extract fields from", payload)
    text = payload.get("input")
    if not isinstance(text, str):
        raise validation_error("input", "missing" if text is None else "string_type",
                               "Field required" if text is None else "Input should be a valid string", text)
    response_format = payload.get("response_format", "mp3")
    if response_format not in FORMATS:
        expected = "'mp3', 'opus', 'aac', 'flac', 'wav' or 'pcm'"
        raise validation_error("response_format", "literal_error", f"Input should be {expected}", response_format,
                               {"expected": expected})
    speed = payload.get("speed", 1.0)
    if not isinstance(speed, int | float) or not 0.25 <= speed <= 4.0:
        raise validation_error("speed", "greater_than_equal", "Input should be greater than or equal to 0.25",
                               speed, {"ge": 0.25})
    model = payload.get("model", "kokoro")
    if model not in MODELS:
        raise http_error(400, "invalid_model", f"Unsupported model: {model}")
    voice = payload.get("voice", "af_heart")
    voice = OPENAI_VOICES.get(voice, voice) if isinstance(voice, str) else voice
    if voice not in VOICES:
        raise http_error(400, "validation_error",
                         f"Voice '{voice}' not found. Available voices: {', '.join(sorted(VOICES))}")
    if response_format not in MADE:
        raise http_error(500, "processing_error", f"fake: no {response_format} encoder here (PyAV is not installed: "
                                                  f"the test extra has it; the fake makes {' and '.join(sorted(MADE))})",
                         "server_error")
    seconds = max(cfg.chunk_seconds, len(text) / cfg.chars_per_second) / speed
    return Speech(voice, response_format, payload.get("stream", True) is not False, seconds)


@attrs.define(eq=False)
class FakeKokoro:
    cfg: Config
    log: Log
    stats: Stats = attrs.Factory(Stats)
    http: HttpServer = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.http = HttpServer(self.dispatch, ConnectionPolicy(server=b"uvicorn", idle_timeout=5.0))

    async def dispatch(self, ex: Exchange) -> None:
        reply = Reply(ex, self.log)
        route = (ex.request.method, ex.request.path)
        try:
            if route == ("GET", "/health"):
                await reply.json(200, {"status": "healthy"})
            elif route == ("GET", "/v1/models"):
                await reply.json(200, {"object": "list", "data": [
                    {"id": m, "object": "model", "created": 1686935002, "owned_by": "kokoro"} for m in MODELS]})
            elif route == ("GET", "/v1/audio/voices"):
                await reply.json(200, {"voices": list(VOICES)})
            elif route == ("GET", "/fake/stats"):
                await reply.json(200, attrs.asdict(self.stats))
            elif route == ("POST", "/v1/audio/speech"):
                await self.speech(reply)
            else:
                await reply.json(404, {"detail": "Not Found"})
        except Refused as refused:
            await reply.json(refused.status, refused.body)

    async def speech(self, reply: Reply) -> None:
        speech = read_speech(reply.ex.request.body, self.cfg)
        self.stats.started += 1
        self.stats.running += 1
        self.stats.last_chunks_sent = 0
        ended = False

        async def answer() -> None:
            nonlocal ended
            await self._answer(reply, speech)
            ended = True  # a client that closes once it has it all did not cancel it

        try:
            await reply.ex.run_until_client_leaves(answer)
        finally:
            self.stats.running -= 1
        if ended:
            self.stats.finished += 1
        else:
            self.stats.cancelled += 1
            self.log.write("INFO:     Client disconnected, stopping audio generation")

    async def _answer(self, reply: Reply, speech: Speech) -> None:
        ex, cfg = reply.ex, self.cfg
        total = frames(speech.seconds)
        per_chunk = frames(cfg.chunk_seconds)
        ex.headers += [(b"content-disposition", f"attachment; filename=speech.{speech.response_format}".encode()),
                       (b"cache-control", b"no-cache")]
        content_type = CONTENT_TYPES[speech.response_format]
        writer = AudioWriter(speech.response_format, total)
        try:
            if not speech.stream:
                await self._pace(total)
                await reply.text(200, writer.write(total) + writer.finish(), content_type)
                return
            ex.headers.append((b"x-accel-buffering", b"no"))
            await reply.start_stream(content_type)
            while writer.made < total:
                count = min(per_chunk, total - writer.made)
                last = writer.made + count >= total
                await self._pace(count)
                if last and cfg.hold_last is not None:
                    while not cfg.hold_last.exists():
                        await trio.sleep(0.02)
                data = writer.write(count) + (writer.finish() if last else b"")
                if data:  # Kokoro skips the pieces its encoder made nothing of yet
                    await reply.send(data)
                    self.stats.last_chunks_sent += 1
            await reply.end()
        finally:
            writer.close()

    async def _pace(self, count: int) -> None:
        if self.cfg.real_time_factor > 0:
            await trio.sleep(count / SAMPLE_RATE / self.cfg.real_time_factor)


async def run_server(cfg: Config, log: Log) -> int:
    log.write(f"{time.strftime('%H:%M:%S')} | INFO | Loading TTS model and voice packs...")
    if cfg.sim_gpu and cfg.memory:
        simgpu.register(cfg.sim_gpu, cfg.memory, label="kokoro")
    server = FakeKokoro(cfg, log)
    async with trio.open_nursery() as nursery:
        await nursery.start(watch_signals, nursery.cancel_scope, lambda _: log.uvicorn("Shutting down"))
        port = await nursery.start(server.http.serve, cfg.host, cfg.port)
        log.uvicorn(f"Started server process [{os.getpid()}]")
        log.uvicorn("Application startup complete.")
        log.uvicorn(f"Uvicorn running on http://{cfg.host}:{port} (Press CTRL+C to quit)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_fake(run_server, parse_config(argv), Log())
