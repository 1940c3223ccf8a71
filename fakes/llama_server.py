"""A fake llama.cpp ``llama-server`` for tests, demos and load tests.

Run it from the repository root::

    python -m fakes.llama_server --port 8080 [-m model.gguf] [llama-server flags] [fake flags]

It is a real HTTP/1.1 server in its own process (trio + h11, no framework) that copies
the behaviour a proxy in front of llama-server has to cope with (see
``shared/research/protocols.md`` section 3):

* the port is bound *before* the "model" loads; until then every route answers 503
  ``unavailable_error`` ("Loading model");
* OpenAI ``/v1/chat/completions`` (also ``/chat/completions``), ``/v1/completions`` and
  ``/v1/embeddings``; like llama-server, ``/completion``, ``/completions``, ``/embedding``
  and ``/embeddings`` are its *native* (non-OpenAI) shapes; ``/v1/models``, ``/slots``,
  ``/props``, ``/metrics``, llama-server's error envelope;
* a fixed number of slots with continuous batching; further requests wait, FIFO,
  inside the server ("deferred") instead of being rejected;
* a context overflow is a plain 400 JSON even for ``stream: true``;
* cpp-httplib's connection habits: ``Connection: close`` and a close after every
  response >= 400, a close after ``--keepalive-max`` requests, an idle close after
  ``--keepalive-timeout``;
* a client that goes away stops its generation at once and frees its slot.

Deterministic "tokenizer": a prompt costs one token per whitespace-separated word
(+4 per chat message); generated tokens cycle through ``VOCAB``, each sent as " word".

Test hooks in the prompt text: ``FAKE_ERROR_MIDSTREAM`` sends an error event after two
tokens and ends the stream without ``[DONE]``; ``FAKE_CRASH`` aborts the process
(exit status 134) after two tokens.

``GET /fake/stats`` -> ``{"started","completed","cancelled","active","deferred","connections"}``:
requests that got a slot, that finished, that the client abandoned while generating,
that generate now, that wait for a slot, and TCP connections accepted. A request failed
by ``FAKE_ERROR_MIDSTREAM`` counts as started only.

Startup and shutdown are logged to stderr like llama.cpp; one line per request only with
``-v`` (a busy fake must not fill a stderr pipe nobody drains).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import http
import itertools
import json
import math
import os
import random
import re
import secrets
import signal
import string
import struct
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import h11
import trio

from fakes import simgpu
from supervisor.units import parse_duration, parse_size

BUILD_INFO = "b6500-fake0000"
VOCAB = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog",
         "and", "runs", "far", "into", "green", "hills", "today")
N_CTX_TRAIN = 131072          # the fake model's training context; caps the slot context
AUTO_SLOTS = 4                # what --parallel -1 ("auto") means in llama-server
PREFILL_TOKENS_PER_S = 4000.0  # only used to report plausible prompt timings
EMBED_TIME_FACTOR = 0.1       # one embedding input costs a tenth of a generated token
HOOK_AFTER_TOKENS = 2
ERROR_HOOK = "FAKE_ERROR_MIDSTREAM"
CRASH_HOOK = "FAKE_CRASH"
RECV_BYTES = 65536
READ_TIMEOUT_S = 600.0        # once a request has started arriving
SERVER_HEADER = (b"server", b"llama.cpp")
JSON_TYPE = b"application/json; charset=utf-8"
PUBLIC_PATHS = frozenset({"/health", "/v1/health", "/models", "/v1/models", "/fake/stats"})
_ALNUM = string.ascii_letters + string.digits


# --------------------------------------------------------------------------- config


@attrs.frozen
class Config:
    host: str
    port: int
    model_id: str
    model_path: str
    n_slots: int
    slot_n_ctx: int
    embeddings: bool
    metrics: bool
    slots_endpoint: bool
    api_key: str | None
    sse_ping_interval: float
    verbose: bool
    log_disabled: bool
    load_time: float
    memory: int
    tokens_per_second: float
    sim_gpu: str | None
    keepalive_max: int
    keepalive_timeout: float
    embedding_dim: int
    fail_load: str | None
    max_tokens_default: int

    @property
    def token_interval(self) -> float:
        return 1.0 / self.tokens_per_second if self.tokens_per_second > 0 else 0.0

    @property
    def keep_alive_header(self) -> bytes:
        return f"timeout={self.keepalive_timeout:g}, max={self.keepalive_max}".encode()


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: a real flag such as --mem... must never be taken for one of ours.
    p = argparse.ArgumentParser(prog="python -m fakes.llama_server", allow_abbrev=False,
                                description="Fake llama-server. Unknown flags are ignored.")
    g = p.add_argument_group("llama-server flags")
    g.add_argument("-m", "--model", default=None)
    g.add_argument("-a", "--alias", default=None)
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, required=True)
    g.add_argument("-np", "--parallel", type=int, default=-1)
    g.add_argument("-c", "--ctx-size", type=int, default=4096)
    g.add_argument("--embedding", "--embeddings", dest="embeddings", action="store_true")
    g.add_argument("--metrics", action="store_true")
    g.add_argument("--slots", dest="slots", action="store_true", default=True)
    g.add_argument("--no-slots", dest="slots", action="store_false")
    g.add_argument("-kvu", "--kv-unified", dest="kv_unified", action="store_true", default=None)
    g.add_argument("-no-kvu", "--no-kv-unified", dest="kv_unified", action="store_false")
    g.add_argument("--api-key", default=None)
    g.add_argument("--sse-ping-interval", type=float, default=30.0)
    g.add_argument("-v", "--verbose", "--log-verbose", dest="verbose", action="store_true")
    g.add_argument("--log-disable", action="store_true")
    for flags in (("-ngl", "--gpu-layers", "--n-gpu-layers"), ("-t", "--threads"),
                  ("-tb", "--threads-batch"), ("-b", "--batch-size"), ("-ub", "--ubatch-size"),
                  ("--threads-http",), ("-to", "--timeout")):
        g.add_argument(*flags, nargs="?", help=argparse.SUPPRESS)  # accepted, ignored
    f = p.add_argument_group("fake-only flags")
    f.add_argument("--load-time", type=parse_duration, default=0.0, help="time to 'load' the model")
    f.add_argument("--memory", type=parse_size, default=0, help="bytes held on the simulated GPU")
    f.add_argument("--tokens-per-second", type=float, default=40.0, help="per request; <= 0: instant")
    f.add_argument("--sim-gpu", default=None, metavar="DIR", help="fakes.simgpu device to register with")
    f.add_argument("--keepalive-max", type=int, default=5, help="requests per connection")
    f.add_argument("--keepalive-timeout", type=parse_duration, default=5.0, help="idle close")
    f.add_argument("--embedding-dim", type=int, default=16)
    f.add_argument("--fail-load", default=None, metavar="MESSAGE", help="fail loading, exit 1")
    f.add_argument("--max-tokens-default", type=int, default=16)
    return p


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def shield_short_flags(argv: Sequence[str], known: set[str]) -> list[str]:
    """Rename llama.cpp's multi-letter single-dash flags that we do not know.

    argparse would read ``-md draft.gguf`` as ``-m d`` and ``-ctk q8_0`` as ``-c tk``;
    renamed to a long form they become plain unknown flags that parse_known_args drops.
    """
    out = []
    for arg in argv:
        if (arg.startswith("-") and not arg.startswith("--") and len(arg) > 2 and arg not in known
                and "=" not in arg and not _NEGATIVE_NUMBER.match(arg)):
            arg = "--ignored-short" + arg
        out.append(arg)
    return out


def parse_config(argv: Sequence[str] | None = None) -> Config:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args, _unknown = parser.parse_known_args(shield_short_flags(argv, _option_strings(parser)))
    if args.parallel <= 0:
        n_slots, unified = AUTO_SLOTS, args.kv_unified is not False
    else:
        n_slots, unified = args.parallel, bool(args.kv_unified)
    ctx_size = args.ctx_size if args.ctx_size > 0 else N_CTX_TRAIN
    slot_n_ctx = min(ctx_size if unified else ctx_size // n_slots, N_CTX_TRAIN)
    return Config(
        host=args.host, port=args.port,
        model_id=args.alias or args.model or "fake-model", model_path=args.model or "fake-model.gguf",
        n_slots=n_slots, slot_n_ctx=slot_n_ctx, embeddings=args.embeddings, metrics=args.metrics,
        slots_endpoint=args.slots, api_key=args.api_key, sse_ping_interval=args.sse_ping_interval,
        verbose=args.verbose, log_disabled=args.log_disable, load_time=args.load_time,
        memory=args.memory, tokens_per_second=args.tokens_per_second, sim_gpu=args.sim_gpu,
        keepalive_max=max(1, args.keepalive_max), keepalive_timeout=args.keepalive_timeout,
        embedding_dim=max(1, args.embedding_dim), fail_load=args.fail_load,
        max_tokens_default=args.max_tokens_default,
    )


@attrs.define
class Log:
    """llama.cpp-style lines on stderr, flushed at once (steward and tests read them live)."""

    enabled: bool = True

    def __call__(self, line: str) -> None:
        if self.enabled:
            try:
                sys.stderr.write(line + "\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass  # nobody reads our stderr any more; keep serving


# --------------------------------------------------------------------------- errors


class ApiError(Exception):
    """An error answered in llama-server's envelope; the HTTP status equals ``code``."""

    def __init__(self, code: int, message: str, type_: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.body = {"error": {"code": code, "message": message, "type": type_, **extra}}


def invalid_request(message: str) -> ApiError:
    return ApiError(400, message, "invalid_request_error")


def not_supported(what: str, flag: str) -> ApiError:
    return ApiError(501, f"This server does not support {what}. Start it with `{flag}`", "not_supported_error")


def loading() -> ApiError:
    return ApiError(503, "Loading model", "unavailable_error")
NOT_FOUND_BODY = {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}


def exceed_context(n_prompt: int, n_ctx: int) -> ApiError:
    return ApiError(400, f"request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens), "
                         "try increasing it", "exceed_context_size_error", n_prompt_tokens=n_prompt, n_ctx=n_ctx)


def dump_json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


# --------------------------------------------------------------------------- HTTP layer


@attrs.frozen
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    client: str
    keep_alive: bool  # what the client allows

    @classmethod
    def from_h11(cls, head: h11.Request, body: bytes, client: str) -> Request:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in head.headers}
        target = head.target.decode("latin-1")
        path, _, query = target.partition("?")
        tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        # h11 never keeps an HTTP/1.0 connection alive, so neither do we.
        keep_alive = head.http_version == b"1.1" and "close" not in tokens
        return cls(head.method.decode(), path, query, headers, body, client, keep_alive)

    def json(self) -> dict[str, Any]:
        try:
            value = json.loads(self.body or b"{}")
        except ValueError as exc:
            line, col = getattr(exc, "lineno", 1), getattr(exc, "colno", 1)
            raise invalid_request(f"[json.exception.parse_error.101] parse error at line {line}, column {col}: "
                                  f"syntax error while parsing value - {getattr(exc, 'msg', exc)}") from None
        if not isinstance(value, dict):
            raise invalid_request("request body must be a JSON object")
        return value


@attrs.define(eq=False)
class HttpConnection:
    stream: trio.SocketStream
    client: str
    h11: h11.Connection = attrs.field(factory=lambda: h11.Connection(h11.SERVER))

    async def send(self, *events: h11.Event) -> None:
        await self.stream.send_all(b"".join(self.h11.send(e) or b"" for e in events))

    async def _receive(self) -> bytes:
        try:
            return await self.stream.receive_some(RECV_BYTES)
        except trio.BrokenResourceError:
            return b""  # reset by peer reads as EOF

    async def read_request(self, idle_timeout: float) -> Request | None:
        """The next full request, or None when the client closed or stayed idle too long."""
        head: h11.Request | None = None
        body: list[bytes] = []
        deadline = trio.current_time() + idle_timeout
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                if self.h11.they_are_waiting_for_100_continue:
                    await self.send(h11.InformationalResponse(status_code=100, headers=[]))
                with trio.move_on_at(deadline):
                    self.h11.receive_data(await self._receive())
                    continue
                return None  # idle keep-alive timeout (or a stalled upload): just close
            if isinstance(event, h11.Request):
                head, deadline = event, trio.current_time() + READ_TIMEOUT_S
            elif isinstance(event, h11.Data):
                body.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                return Request.from_h11(head, b"".join(body), self.client)
            else:  # ConnectionClosed
                return None

    async def wait_peer_closed(self) -> None:
        """Return once the client has closed (or reset) its end of the connection."""
        while data := await self._receive():
            self.h11.receive_data(data)  # a pipelined request: h11 keeps it for the next cycle

    @property
    def reusable(self) -> bool:
        return self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE


@attrs.define(eq=False)
class Exchange:
    """One request and its response, with cpp-httplib's rules for the connection."""

    conn: HttpConnection
    request: Request
    cfg: Config
    keep_alive: bool
    status: int = 0
    last_send: float = 0.0

    def _connection_headers(self, status: int) -> list[tuple[bytes, bytes]]:
        if status >= 400:
            self.keep_alive = False  # cpp-httplib never reuses a connection after an error
        if self.keep_alive:
            return [(b"keep-alive", self.cfg.keep_alive_header)]
        return [(b"connection", b"close")]

    def _head(self, status: int, content_type: bytes, length: int | None) -> h11.Response:
        self.status = status
        headers = [(b"content-type", content_type), SERVER_HEADER]
        if length is not None:
            headers.append((b"content-length", str(length).encode()))
        headers += self._connection_headers(status)
        return h11.Response(status_code=status, headers=headers, reason=http.HTTPStatus(status).phrase.encode())

    async def respond(self, status: int, body: bytes, content_type: bytes = JSON_TYPE) -> None:
        events: list[h11.Event] = [self._head(status, content_type, len(body))]
        if body:
            events.append(h11.Data(data=body))
        await self.conn.send(*events, h11.EndOfMessage())

    async def respond_json(self, status: int, value: object) -> None:
        await self.respond(status, dump_json(value))

    async def respond_error(self, err: ApiError) -> None:
        await self.respond_json(err.code, err.body)

    async def start_stream(self) -> None:
        await self.conn.send(self._head(200, b"text/event-stream", None))  # h11 picks chunked
        self.last_send = trio.current_time()

    async def send_raw(self, data: bytes) -> None:
        await self.conn.send(h11.Data(data=data))
        self.last_send = trio.current_time()

    async def send_event(self, value: object) -> None:
        await self.send_raw(b"data: " + dump_json(value) + b"\n\n")

    async def end_stream(self) -> None:
        await self.conn.send(h11.EndOfMessage())

    async def run_until_client_leaves(self, work: Callable[[], Awaitable[None]]) -> bool:
        """Run *work*, cancelling it as soon as the client disconnects. True if it did."""
        gone = False
        async with trio.open_nursery() as nursery:
            async def watch() -> None:
                nonlocal gone
                await self.conn.wait_peer_closed()
                gone = True
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            try:
                await work()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                gone = True
            nursery.cancel_scope.cancel()
        if gone:
            self.keep_alive = False
        return gone


# --------------------------------------------------------------------------- slots and stats


@attrs.define(eq=False)
class Slot:
    id: int
    n_ctx: int
    id_task: int = -1
    n_decoded: int = 0
    n_remain: int = -1

    @property
    def is_processing(self) -> bool:
        return self.id_task >= 0

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "id_task": self.id_task, "n_ctx": self.n_ctx, "speculative": False,
            "is_processing": self.is_processing, "params": default_params(), "prompt": "",
            "next_token": {"has_next_token": self.is_processing, "has_new_line": False,
                           "n_remain": self.n_remain, "n_decoded": self.n_decoded},
        }


def default_params() -> dict[str, Any]:
    return {"n_predict": -1, "seed": 4294967295, "temperature": 0.8, "dynatemp_range": 0.0, "top_k": 40,
            "top_p": 0.95, "min_p": 0.05, "typical_p": 1.0, "repeat_last_n": 64, "repeat_penalty": 1.0,
            "presence_penalty": 0.0, "frequency_penalty": 0.0, "stop": [], "max_tokens": -1, "n_keep": 0,
            "ignore_eos": False, "stream": False, "n_probs": 0, "min_keep": 0,
            "samplers": ["penalties", "dry", "top_k", "typ_p", "top_p", "min_p", "temperature"],
            "timings_per_token": False, "post_sampling_probs": False}


@attrs.define(eq=False)
class SlotPool:
    """``n`` slots; requests beyond them wait FIFO (trio's Semaphore wakes waiters in order)."""

    slots: list[Slot]
    _free: deque[Slot]
    _sem: trio.Semaphore
    deferred: int = 0
    _task_ids: Iterator[int] = attrs.field(factory=itertools.count)

    @classmethod
    def create(cls, n: int, n_ctx: int) -> SlotPool:
        slots = [Slot(i, n_ctx) for i in range(n)]
        return cls(slots, deque(slots), trio.Semaphore(n))

    @property
    def active(self) -> int:
        return len(self.slots) - len(self._free)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[Slot]:
        self.deferred += 1
        try:
            await self._sem.acquire()
        finally:
            self.deferred -= 1
        slot = self._free.popleft()
        slot.id_task, slot.n_decoded, slot.n_remain = next(self._task_ids), 0, -1
        try:
            yield slot
        finally:
            slot.id_task, slot.n_remain = -1, -1
            self._free.append(slot)
            self._sem.release()


@attrs.define
class Stats:
    started: int = 0
    completed: int = 0
    cancelled: int = 0
    connections: int = 0
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    predicted_tokens: int = 0
    predicted_seconds: float = 0.0


# --------------------------------------------------------------------------- generation


@attrs.frozen
class Job:
    """What a completion request asks for, already validated."""

    n_prompt: int
    budget: int          # tokens to generate unless the context fills first; -1 = until it does
    stream: bool
    ping_interval: float
    prompt_text: str

    @property
    def error_hook(self) -> bool:
        return ERROR_HOOK in self.prompt_text

    @property
    def crash_hook(self) -> bool:
        return CRASH_HOOK in self.prompt_text


@attrs.frozen
class Outcome:
    text: str
    n_prompt: int
    n_decoded: int
    finish_reason: str
    timings: dict[str, Any]
    slot_id: int
    prompt_text: str

    def usage(self) -> dict[str, Any]:
        return {"completion_tokens": self.n_decoded, "prompt_tokens": self.n_prompt,
                "total_tokens": self.n_decoded + self.n_prompt, "prompt_tokens_details": {"cached_tokens": 0}}


def token_piece(index: int) -> str:
    return " " + VOCAB[index % len(VOCAB)]


def make_timings(n_prompt: int, n_decoded: int, predicted_s: float) -> dict[str, Any]:
    prompt_ms = n_prompt / PREFILL_TOKENS_PER_S * 1000.0
    predicted_ms = predicted_s * 1000.0
    return {"cache_n": 0, "prompt_n": n_prompt, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / n_prompt if n_prompt else 0.0,
            "prompt_per_second": n_prompt / prompt_ms * 1000.0 if prompt_ms else 0.0,
            "predicted_n": n_decoded, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / n_decoded if n_decoded else 0.0,
            "predicted_per_second": n_decoded / predicted_ms * 1000.0 if predicted_ms else 0.0}


def completion_id() -> str:
    return "chatcmpl-" + "".join(secrets.choice(_ALNUM) for _ in range(32))


def _common(cmpl_id: str, model: str, obj: str) -> dict[str, Any]:
    return {"created": int(time.time()), "id": cmpl_id, "model": model,
            "system_fingerprint": BUILD_INFO, "object": obj}


@attrs.define(eq=False)
class ChatFormat:
    """OpenAI chat: role chunk with the first token, content chunks, finish, usage, [DONE]."""

    cmpl_id: str
    model: str
    n_prompt: int
    include_usage: bool
    ends_with_done = True

    def _chunk(self, choices: list[Any], **extra: Any) -> dict[str, Any]:
        return {"choices": choices, **_common(self.cmpl_id, self.model, "chat.completion.chunk"), **extra}

    def token_events(self, piece: str, n_decoded: int, slot_id: int) -> list[dict[str, Any]]:
        events = []
        if n_decoded == 1:
            events.append(self._chunk([{"finish_reason": None, "index": 0,
                                        "delta": {"role": "assistant", "content": None}}]))
        events.append(self._chunk([{"finish_reason": None, "index": 0, "delta": {"content": piece}}]))
        return events

    def final_events(self, out: Outcome) -> list[dict[str, Any]]:
        events = [self._chunk([{"finish_reason": out.finish_reason, "index": 0, "delta": {}}])]
        if self.include_usage:
            events.append(self._chunk([], usage=out.usage()))
        events[-1]["timings"] = out.timings
        return events

    def response(self, out: Outcome) -> dict[str, Any]:
        choice = {"finish_reason": out.finish_reason, "index": 0,
                  "message": {"role": "assistant", "content": out.text}}
        return {"choices": [choice], **_common(self.cmpl_id, self.model, "chat.completion"),
                "usage": out.usage(), "timings": out.timings}


@attrs.define(eq=False)
class TextFormat:
    """OpenAI /v1/completions: ``choices[].text``; the final chunk always carries usage."""

    cmpl_id: str
    model: str
    n_prompt: int
    ends_with_done = True

    def _body(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}
        return {"choices": [choice], **_common(self.cmpl_id, self.model, "text_completion")}

    def token_events(self, piece: str, n_decoded: int, slot_id: int) -> list[dict[str, Any]]:
        return [self._body(piece, None)]

    def final_events(self, out: Outcome) -> list[dict[str, Any]]:
        return [{**self._body("", out.finish_reason), "usage": out.usage(), "timings": out.timings}]

    def response(self, out: Outcome) -> dict[str, Any]:
        return {**self._body(out.text, out.finish_reason), "usage": out.usage(), "timings": out.timings}


@attrs.define(eq=False)
class NativeFormat:
    """llama-server's own /completion: ``content`` pieces, a ``stop: true`` event, no [DONE]."""

    model: str
    n_prompt: int
    ends_with_done = False

    def token_events(self, piece: str, n_decoded: int, slot_id: int) -> list[dict[str, Any]]:
        return [{"index": 0, "content": piece, "tokens": [], "stop": False, "id_slot": slot_id,
                 "tokens_predicted": n_decoded, "tokens_evaluated": self.n_prompt}]

    def final_events(self, out: Outcome) -> list[dict[str, Any]]:
        return [{**self.response(out), "content": ""}]

    def response(self, out: Outcome) -> dict[str, Any]:
        return {"index": 0, "content": out.text, "tokens": [], "id_slot": out.slot_id, "stop": True,
                "model": self.model, "tokens_predicted": out.n_decoded, "tokens_evaluated": out.n_prompt,
                "generation_settings": default_params(), "prompt": out.prompt_text, "has_new_line": False,
                "truncated": False, "stop_type": "eos" if out.finish_reason == "stop" else "limit",
                "stopping_word": "", "tokens_cached": out.n_prompt + out.n_decoded, "timings": out.timings}


Format = ChatFormat | TextFormat | NativeFormat


# --------------------------------------------------------------------------- request parsing


def count_words(text: str) -> int:
    return len(text.split())


def message_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts; only text parts cost tokens here
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def chat_prompt(body: dict[str, Any]) -> tuple[str, int]:
    messages = body.get("messages")
    if messages is None:
        raise invalid_request("'messages' is required")
    if not isinstance(messages, list):
        raise invalid_request("Expected 'messages' to be an array")
    texts = [message_text(m.get("content")) if isinstance(m, dict) else "" for m in messages]
    text = "\n".join(texts)
    return text, sum(count_words(t) for t in texts) + 4 * len(messages)


def text_prompt(body: dict[str, Any]) -> tuple[str, int]:
    prompt = body.get("prompt")
    if prompt is None:
        raise invalid_request('"prompt" must be provided')
    pieces = prompt if isinstance(prompt, list) else [prompt]
    texts, n_tokens = [], 0
    for piece in pieces:
        if isinstance(piece, str):
            texts.append(piece)
            n_tokens += count_words(piece)
        elif isinstance(piece, int) and not isinstance(piece, bool):
            n_tokens += 1  # already a token id
        elif isinstance(piece, list) and all(isinstance(t, int) for t in piece):
            n_tokens += len(piece)
        else:
            raise invalid_request('"prompt" must be a string, a list of strings or a list of tokens')
    return " ".join(texts), n_tokens


def int_field(body: dict[str, Any], *names: str) -> int | None:
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or (
                isinstance(value, float) and not value.is_integer()):
            raise invalid_request(f"'{name}' must be an integer")
        return int(value)
    return None


def build_job(body: dict[str, Any], cfg: Config, prompt_text: str, n_prompt: int) -> Job:
    requested = int_field(body, "max_tokens", "max_completion_tokens", "n_predict")
    ping = body.get("sse_ping_interval", cfg.sse_ping_interval)
    if isinstance(ping, bool) or not isinstance(ping, int | float):
        raise invalid_request("'sse_ping_interval' must be a number")
    return Job(n_prompt=n_prompt, budget=cfg.max_tokens_default if requested is None else requested,
               stream=bool(body.get("stream", False)), ping_interval=float(ping), prompt_text=prompt_text)


def embedding_inputs(body: dict[str, Any]) -> list[tuple[str, int]]:
    """(text, n_tokens) per input: a string, a list of strings, tokens or lists of tokens."""
    raw = body.get("input", body.get("content"))
    if raw is None:
        raise invalid_request('"input" or "content" must be provided')
    if isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        raw = [raw]
    items = raw if isinstance(raw, list) else [raw]
    if not items:
        raise invalid_request("Input content cannot be empty")
    inputs = []
    for item in items:
        if isinstance(item, str):
            inputs.append((item, max(1, count_words(item))))
        elif isinstance(item, list) and item and all(isinstance(t, int) for t in item):
            inputs.append((" ".join(map(str, item)), len(item)))
        else:
            raise invalid_request('"input" must be a string, a list of strings or a list of tokens')
    return inputs


def embed(text: str, dim: int) -> list[float]:
    """A unit vector that depends only on *text* (seeded by its hash, not Python's)."""
    rng = random.Random(hashlib.sha256(text.encode()).digest())
    vec = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]


def encode_embedding(vec: list[float], encoding: object) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
    return vec


# --------------------------------------------------------------------------- the server


@attrs.define(eq=False)
class FakeLlamaServer:
    cfg: Config
    log: Log
    pool: SlotPool = attrs.field(init=False)
    stats: Stats = attrs.field(factory=Stats, init=False)
    ready: bool = attrs.field(default=False, init=False)
    created: int = attrs.field(factory=lambda: int(time.time()), init=False)
    routes: dict[tuple[str, str], Callable[[Exchange], Awaitable[None]]] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.pool = SlotPool.create(self.cfg.n_slots, self.cfg.slot_n_ctx)
        chat, text, native = self.chat_completions, self.completions, self.native_completion
        self.routes = {
            ("GET", "/health"): self.health, ("GET", "/v1/health"): self.health,
            ("GET", "/v1/models"): self.models, ("GET", "/models"): self.models,
            ("GET", "/props"): self.props, ("POST", "/props"): self.props_update,
            ("GET", "/slots"): self.slots, ("GET", "/metrics"): self.metrics,
            ("POST", "/v1/chat/completions"): chat, ("POST", "/chat/completions"): chat,
            ("POST", "/v1/completions"): text,
            ("POST", "/completion"): native, ("POST", "/completions"): native,
            ("POST", "/v1/embeddings"): self.oai_embeddings,
            ("POST", "/embeddings"): self.native_embeddings, ("POST", "/embedding"): self.native_embeddings,
            ("GET", "/fake/stats"): self.fake_stats,
        }

    # ---- lifecycle

    async def load(self, port: int) -> bool:
        cfg, log = self.cfg, self.log
        log("main: loading model")
        log(f"srv    load_model: loading model '{cfg.model_path}'")
        if cfg.sim_gpu:
            simgpu.register(cfg.sim_gpu, cfg.memory, label=cfg.model_id)
        await trio.sleep(cfg.load_time)
        if cfg.fail_load is not None:
            log(f"llama_model_load: error loading model: {cfg.fail_load}")
            log("llama_model_load_from_file_impl: failed to load model")
            log(f"srv    load_model: failed to load model, '{cfg.model_path}'")
            log("srv    operator(): operator(): cleaning up before exit...")
            log("main: exiting due to model loading error")
            return False
        log(f"srv    load_model: initializing slots, n_slots = {cfg.n_slots}")
        for slot in self.pool.slots:
            log(f"slot   load_model: id  {slot.id} | task -1 | new slot, n_ctx = {slot.n_ctx}")
        log("main: model loaded")
        self.ready = True
        log(f"main: server is listening on http://{cfg.host}:{port} - starting the main loop")
        log("srv  update_slots: all slots are idle")
        return True

    # ---- connections

    async def serve_connection(self, stream: trio.SocketStream) -> None:
        self.stats.connections += 1
        try:
            client = stream.socket.getpeername()[0]
        except OSError:
            client = "?"
        conn = HttpConnection(stream, client)
        try:
            await self._serve_requests(conn)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away mid-response
        except Exception as exc:  # a bug here must not take the whole server down
            self.log(f"srv  fake: connection from {client} failed: {exc!r}")
        finally:
            await trio.aclose_forcefully(stream)

    async def _serve_requests(self, conn: HttpConnection) -> None:
        for served in itertools.count(1):
            try:
                request = await conn.read_request(self.cfg.keepalive_timeout)
            except h11.RemoteProtocolError:
                await self._bad_request(conn)
                return
            if request is None:
                return
            # cpp-httplib's counter: the keepalive_max-th response says "Connection: close".
            ex = Exchange(conn, request, self.cfg, keep_alive=request.keep_alive and served < self.cfg.keepalive_max)
            await self.dispatch(ex)
            if not (ex.keep_alive and conn.reusable):
                return
            conn.h11.start_next_cycle()

    async def _bad_request(self, conn: HttpConnection) -> None:
        try:
            await conn.send(h11.Response(status_code=400, headers=[SERVER_HEADER, (b"content-length", b"0"),
                                                                    (b"connection", b"close")]),
                            h11.EndOfMessage())
        except (h11.LocalProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def dispatch(self, ex: Exchange) -> None:
        req = ex.request
        try:
            if not self.ready:
                raise loading()
            self._check_api_key(req)
            handler = self.routes.get((req.method, req.path))
            if handler is None:
                await ex.respond_json(404, NOT_FOUND_BODY)
            else:
                await handler(ex)
        except ApiError as err:  # raised before anything was sent
            await ex.respond_error(err)
        if self.cfg.verbose:
            self.log(f"srv  log_server_r: request: {req.method} {req.path} {req.client} {ex.status}")

    def _check_api_key(self, req: Request) -> None:
        if self.cfg.api_key is None or req.path in PUBLIC_PATHS:
            return
        auth = req.headers.get("authorization", "")
        given = auth[7:] if auth.startswith("Bearer ") else req.headers.get("x-api-key")
        if given != self.cfg.api_key:
            raise ApiError(401, "Invalid API Key", "authentication_error")

    # ---- simple routes

    async def health(self, ex: Exchange) -> None:
        await ex.respond_json(200, {"status": "ok"})

    async def fake_stats(self, ex: Exchange) -> None:
        s = self.stats
        await ex.respond_json(200, {"started": s.started, "completed": s.completed, "cancelled": s.cancelled,
                                    "active": self.pool.active, "deferred": self.pool.deferred,
                                    "connections": s.connections})

    async def models(self, ex: Exchange) -> None:
        cfg = self.cfg
        details = {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                   "parameter_size": "", "quantization_level": ""}
        meta = {"vocab_type": 2, "n_vocab": 32000, "n_ctx_train": N_CTX_TRAIN, "n_embd": cfg.embedding_dim,
                "n_params": 1_000_000_000, "size": cfg.memory}
        await ex.respond_json(200, {
            "models": [{"name": cfg.model_id, "model": cfg.model_id, "modified_at": "", "size": "", "digest": "",
                        "type": "model", "description": "", "tags": [""], "capabilities": ["completion"],
                        "parameters": "", "details": details}],
            "object": "list",
            "data": [{"id": cfg.model_id, "object": "model", "created": self.created, "owned_by": "llamacpp",
                      "meta": meta}],
        })

    async def props(self, ex: Exchange) -> None:
        cfg = self.cfg
        await ex.respond_json(200, {
            "default_generation_settings": Slot(0, cfg.slot_n_ctx).to_json(),
            "total_slots": cfg.n_slots, "model_alias": cfg.model_id, "model_path": cfg.model_path,
            "modalities": {"vision": False, "audio": False}, "chat_template": "{{ messages }}",
            "chat_template_caps": {}, "bos_token": "<s>", "eos_token": "</s>", "media_marker": "<__media__>",
            "build_info": BUILD_INFO, "is_sleeping": False,
        })

    async def props_update(self, ex: Exchange) -> None:
        raise not_supported("changing global properties", "--props")

    async def slots(self, ex: Exchange) -> None:
        if not self.cfg.slots_endpoint:
            raise not_supported("slots endpoint", "--slots")
        if "fail_on_no_slot=1" in ex.request.query and self.pool.active == len(self.pool.slots):
            raise ApiError(503, "no slot available", "unavailable_error")
        await ex.respond_json(200, [slot.to_json() for slot in self.pool.slots])

    async def metrics(self, ex: Exchange) -> None:
        if not self.cfg.metrics:
            raise not_supported("metrics endpoint", "--metrics")
        s = self.stats
        rows = [
            ("prompt_tokens_total", "counter", "Number of prompt tokens processed.", s.prompt_tokens),
            ("prompt_seconds_total", "counter", "Prompt process time", s.prompt_seconds),
            ("tokens_predicted_total", "counter", "Number of generation tokens processed.", s.predicted_tokens),
            ("tokens_predicted_seconds_total", "counter", "Predict process time", s.predicted_seconds),
            ("n_decode_total", "counter", "Total number of llama_decode() calls", s.predicted_tokens),
            ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.",
             s.prompt_tokens / s.prompt_seconds if s.prompt_seconds else 0.0),
            ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.",
             s.predicted_tokens / s.predicted_seconds if s.predicted_seconds else 0.0),
            ("requests_processing", "gauge", "Number of requests processing.", self.pool.active),
            ("requests_deferred", "gauge", "Number of requests deferred.", self.pool.deferred),
        ]
        text = "".join(f"# HELP llamacpp:{name} {doc}\n# TYPE llamacpp:{name} {kind}\nllamacpp:{name} {value}\n"
                       for name, kind, doc, value in rows)
        await ex.respond(200, text.encode(), b"text/plain; version=0.0.4")

    # ---- completions

    async def chat_completions(self, ex: Exchange) -> None:
        body = ex.request.json()
        prompt_text, n_prompt = chat_prompt(body)
        job = build_job(body, self.cfg, prompt_text, n_prompt)
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        await self._complete(ex, job, ChatFormat(completion_id(), self.cfg.model_id, n_prompt, include_usage))

    async def completions(self, ex: Exchange) -> None:
        body = ex.request.json()
        prompt_text, n_prompt = text_prompt(body)
        job = build_job(body, self.cfg, prompt_text, n_prompt)
        await self._complete(ex, job, TextFormat(completion_id(), self.cfg.model_id, n_prompt))

    async def native_completion(self, ex: Exchange) -> None:
        body = ex.request.json()
        prompt_text, n_prompt = text_prompt(body)
        job = build_job(body, self.cfg, prompt_text, n_prompt)
        await self._complete(ex, job, NativeFormat(self.cfg.model_id, n_prompt))

    async def _complete(self, ex: Exchange, job: Job, fmt: Format) -> None:
        await ex.run_until_client_leaves(lambda: self._run_job(ex, job, fmt))

    async def _run_job(self, ex: Exchange, job: Job, fmt: Format) -> None:
        async with self.pool.slot() as slot:
            # Checked when a slot picks the task up, so an oversized request waits its turn too.
            if job.n_prompt >= slot.n_ctx:
                error: ApiError | None = exceed_context(job.n_prompt, slot.n_ctx)
                outcome = None
            else:
                error = None
                outcome = await self._generate(ex, job, fmt, slot)
        if error is not None:
            await ex.respond_error(error)  # plain JSON even for stream=true: nothing was sent yet
        elif outcome is None:
            return  # failed on purpose; the error has been sent
        elif job.stream:
            for event in fmt.final_events(outcome):
                await ex.send_event(event)
            if fmt.ends_with_done:
                await ex.send_raw(b"data: [DONE]\n\n")
            await ex.end_stream()
        else:
            await ex.respond_json(200, fmt.response(outcome))

    async def _generate(self, ex: Exchange, job: Job, fmt: Format, slot: Slot) -> Outcome | None:
        """Produce the tokens, streaming them if asked. None after an injected failure."""
        room = slot.n_ctx - job.n_prompt
        n_target = room if job.budget < 0 else min(job.budget, room)
        if job.n_prompt == 0:
            n_target = 0  # an empty prompt gives an empty answer
        hook_at = min(HOOK_AFTER_TOKENS, n_target) if (job.error_hook or job.crash_hook) else -1
        self.stats.started += 1
        slot.n_remain = n_target
        interval = self.cfg.token_interval
        start = trio.current_time()
        pieces: list[str] = []
        try:
            if job.stream:
                await ex.start_stream()  # headers go out once a slot has the task
            if hook_at == 0:
                return await self._inject_failure(ex, job)
            for i in range(n_target):
                await self._wait_for_token(ex, job, start + (i + 1) * interval)
                pieces.append(token_piece(i))
                slot.n_decoded, slot.n_remain = i + 1, n_target - i - 1
                if job.stream:
                    for event in fmt.token_events(pieces[-1], i + 1, slot.id):
                        await ex.send_event(event)
                if i + 1 == hook_at:
                    return await self._inject_failure(ex, job)
        except (trio.Cancelled, trio.BrokenResourceError, trio.ClosedResourceError):
            self.stats.cancelled += 1  # the client left (or we are shutting down)
            raise
        elapsed = trio.current_time() - start
        self._account(job.n_prompt, len(pieces), elapsed)
        self.stats.completed += 1
        # Generation only ever ends on its token budget or a full context: "length".
        return Outcome("".join(pieces), job.n_prompt, len(pieces), "length",
                       make_timings(job.n_prompt, len(pieces), elapsed), slot.id, job.prompt_text)

    async def _wait_for_token(self, ex: Exchange, job: Job, deadline: float) -> None:
        """Sleep until the next token is due, sending SSE pings if that takes long."""
        if job.stream and job.ping_interval > 0:
            while (next_ping := ex.last_send + job.ping_interval) < deadline:
                await trio.sleep_until(next_ping)
                await ex.send_raw(b":\n\n")
        await trio.sleep_until(deadline)

    async def _inject_failure(self, ex: Exchange, job: Job) -> None:
        if job.crash_hook:
            self.log("ggml/src/ggml.c:1234: GGML_ASSERT(fake) failed (FAKE_CRASH)")
            os._exit(134)  # like abort(): no cleanup, the simulated GPU memory lingers
        error = ApiError(500, "fake mid-stream failure", "server_error")
        if job.stream:
            await ex.send_event(error.body)
            await ex.end_stream()  # no [DONE], as llama-server does after an error
        else:
            await ex.respond_error(error)

    def _account(self, n_prompt: int, n_decoded: int, elapsed: float) -> None:
        s = self.stats
        s.prompt_tokens += n_prompt
        s.prompt_seconds += n_prompt / PREFILL_TOKENS_PER_S
        s.predicted_tokens += n_decoded
        s.predicted_seconds += elapsed

    # ---- embeddings

    async def oai_embeddings(self, ex: Exchange) -> None:
        await self._embeddings(ex, oai=True)

    async def native_embeddings(self, ex: Exchange) -> None:
        await self._embeddings(ex, oai=False)

    async def _embeddings(self, ex: Exchange, *, oai: bool) -> None:
        if not self.cfg.embeddings:
            raise not_supported("embeddings", "--embeddings")
        body = ex.request.json()
        inputs = embedding_inputs(body)
        encoding = body.get("encoding_format", "float")
        await ex.run_until_client_leaves(lambda: self._run_embeddings(ex, inputs, encoding, oai))

    async def _run_embeddings(self, ex: Exchange, inputs: list[tuple[str, int]], encoding: object,
                              oai: bool) -> None:
        async with self.pool.slot() as slot:
            too_long = next((n for _, n in inputs if n > slot.n_ctx), None)
            if too_long is None:
                self.stats.started += 1
                try:
                    await trio.sleep(len(inputs) * EMBED_TIME_FACTOR * self.cfg.token_interval)
                except trio.Cancelled:
                    self.stats.cancelled += 1
                    raise
                self.stats.completed += 1
        if too_long is not None:
            await ex.respond_error(ApiError(
                400, f"input ({too_long} tokens) is larger than the max context size ({slot.n_ctx} tokens). skipping",
                "exceed_context_size_error", n_prompt_tokens=too_long, n_ctx=slot.n_ctx))
            return
        vectors = [embed(text, self.cfg.embedding_dim) for text, _ in inputs]
        if not oai:
            await ex.respond_json(200, [{"index": i, "embedding": [v]} for i, v in enumerate(vectors)])
            return
        n_tokens = sum(n for _, n in inputs)
        await ex.respond_json(200, {
            "model": self.cfg.model_id, "object": "list",
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            "data": [{"embedding": encode_embedding(v, encoding), "index": i, "object": "embedding"}
                     for i, v in enumerate(vectors)],
        })


# --------------------------------------------------------------------------- main


async def _watch_signals(cancel_scope: trio.CancelScope, log: Log,
                         task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for _ in signals:
            log("srv    operator(): operator(): cleaning up before exit...")
            cancel_scope.cancel()
            return


async def run_server(cfg: Config, log: Log) -> int:
    """Serve until SIGTERM/SIGINT (0) or a failed load (1). Binding comes before loading."""
    async with trio.open_nursery() as nursery:
        await nursery.start(_watch_signals, nursery.cancel_scope, log)
        try:
            listeners = await trio.open_tcp_listeners(cfg.port, host=cfg.host)
        except OSError as exc:
            log(f"main: couldn't bind HTTP server socket, hostname: {cfg.host}, port: {cfg.port} ({exc.strerror})")
            nursery.cancel_scope.cancel()
            return 1
        port = listeners[0].socket.getsockname()[1]
        log(f"main: HTTP server is listening, hostname: {cfg.host}, port: {port}, http threads: {cfg.n_slots + 4}")
        server = FakeLlamaServer(cfg, log)
        nursery.start_soon(trio.serve_listeners, server.serve_connection, listeners)
        if not await server.load(port):
            nursery.cancel_scope.cancel()
            return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_config(argv)
    log = Log(enabled=not cfg.log_disabled)
    log(f"build: {BUILD_INFO.split('-')[0][1:]} ({BUILD_INFO.split('-')[1]}) with fakes.llama_server")
    try:
        return trio.run(run_server, cfg, log)
    except KeyboardInterrupt:  # a SIGINT before the signal receiver was installed
        return 0
    finally:
        if cfg.sim_gpu:
            simgpu.unregister(cfg.sim_gpu)  # a clean exit frees the "GPU" memory at once


if __name__ == "__main__":
    sys.exit(main())
