"""A minimal, very fast fake OpenAI-compatible upstream, for benchmarks.

Run it from the repository root::

    python -m fakes.fast_upstream --port 8081 [--host 127.0.0.1] [other flags, ignored]

It accepts and ignores any other flag (``--model X --parallel 64`` ...), so steward can
launch it as a llama-server engine. Unlike ``fakes.llama_server`` it models nothing: it
exists to cost as little CPU per request as possible, so a benchmark measures the proxy
in front of it rather than the fake. Plain asyncio with a raw ``asyncio.Protocol``:

* ``GET /health`` (or ``/v1/health``) answers 200 ``{"status":"ok"}``;
* any ``POST`` answers 200 with one fixed ``chat.completion`` body (about 300 bytes);
* anything else answers 404 with llama-server's error envelope.

HTTP/1.1 only as far as a benchmark needs it: Content-Length framing both ways (a body
may arrive over several TCP segments), keep-alive by default, ``Connection: close``
honoured (HTTP/1.0 closes unless it asks for keep-alive), pipelined requests answered
in order. A chunked request body is refused with 411. SIGTERM or SIGINT stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal

MAX_HEAD_BYTES = 65536

CHAT_COMPLETION = json.dumps({
    "id": "chatcmpl-fast-upstream",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "fast",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "Hello! A canned reply from the fast fake upstream."}}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 11, "total_tokens": 20},
}, separators=(",", ":")).encode()
HEALTH = b'{"status":"ok"}'
HEALTH_PATHS = frozenset({"/health", "/v1/health"})


def _error(code: int, message: str, kind: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message, "type": kind}}, separators=(",", ":")).encode()


def _encode(status: str, body: bytes, keep_alive: bool) -> bytes:
    head = (f"HTTP/1.1 {status}\r\nServer: fast-upstream\r\nContent-Type: application/json; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n")
    return head.encode("latin-1") + body


_BODIES = {
    "chat": ("200 OK", CHAT_COMPLETION),
    "health": ("200 OK", HEALTH),
    "not_found": ("404 Not Found", _error(404, "File Not Found", "not_found_error")),
    "bad_request": ("400 Bad Request", _error(400, "Malformed request", "invalid_request_error")),
    "length_required": ("411 Length Required", _error(411, "Content-Length required", "invalid_request_error")),
    "too_large": ("431 Request Header Fields Too Large", _error(431, "Request head too large",
                                                                 "invalid_request_error")),
}
# Every response this server can send, encoded once: (kind, keep_alive) -> bytes.
RESPONSES = {(kind, keep_alive): _encode(status, body, keep_alive)
             for kind, (status, body) in _BODIES.items() for keep_alive in (True, False)}


class _BadRequest(Exception):
    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class _Head:
    """The parsed request line and headers of the request being received."""

    __slots__ = ("kind", "keep_alive", "body_length")

    def __init__(self, kind: str, keep_alive: bool, body_length: int) -> None:
        self.kind, self.keep_alive, self.body_length = kind, keep_alive, body_length


def parse_head(head: bytes) -> _Head:
    """Parse a request head (without its blank line); raises _BadRequest."""
    request_line, *header_lines = head.decode("latin-1").split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _BadRequest("bad_request")
    method, target, version = parts
    headers: dict[str, str] = {}
    for line in header_lines:
        name, colon, value = line.partition(":")
        if not colon:
            raise _BadRequest("bad_request")
        headers[name.strip().lower()] = value.strip().lower()
    if "chunked" in headers.get("transfer-encoding", ""):
        raise _BadRequest("length_required")
    try:
        body_length = int(headers.get("content-length", "0"))
    except ValueError:
        raise _BadRequest("bad_request") from None
    if body_length < 0:
        raise _BadRequest("bad_request")
    tokens = {token.strip() for token in headers.get("connection", "").split(",")}
    keep_alive = "close" not in tokens if version == "HTTP/1.1" else "keep-alive" in tokens
    return _Head(_route(method, target.partition("?")[0]), keep_alive, body_length)


def _route(method: str, path: str) -> str:
    if method == "POST":
        return "chat"
    if method in ("GET", "HEAD") and path in HEALTH_PATHS:
        return "health"
    return "not_found"


class _Connection(asyncio.Protocol):
    """One client connection: buffer bytes, answer each complete request in order."""

    def __init__(self, open_transports: set[asyncio.Transport]) -> None:
        self._open = open_transports
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._head: _Head | None = None  # parsed, waiting for the rest of its body

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._open.add(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._open.discard(self._transport)
        self._transport = None

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while self._transport is not None and not self._transport.is_closing():
            try:
                head = self._next_head()
            except _BadRequest as exc:
                self._respond(exc.kind, keep_alive=False)
                return
            if head is None or len(self._buffer) < head.body_length:
                return  # wait for more bytes
            del self._buffer[:head.body_length]
            self._head = None
            self._respond(head.kind, head.keep_alive)

    def _next_head(self) -> _Head | None:
        if self._head is not None:
            return self._head
        while self._buffer.startswith(b"\r\n"):  # stray CRLF between pipelined requests
            del self._buffer[:2]
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > MAX_HEAD_BYTES:
                raise _BadRequest("too_large")
            return None
        self._head = parse_head(bytes(self._buffer[:end]))
        del self._buffer[:end + 4]
        return self._head

    def _respond(self, kind: str, keep_alive: bool) -> None:
        assert self._transport is not None
        self._transport.write(RESPONSES[kind, keep_alive])
        if not keep_alive:
            self._buffer.clear()
            self._transport.close()  # after the buffered response is written

    # Backpressure: a client that pipelines without reading stops being read.
    def pause_writing(self) -> None:
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        if self._transport is not None:
            self._transport.resume_reading()


async def serve(host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    open_transports: set[asyncio.Transport] = set()
    server = await loop.create_server(lambda: _Connection(open_transports), host, port, backlog=1024)
    print(f"fast_upstream: listening on http://{host}:{port}", flush=True)
    async with server:
        await stop.wait()
    for transport in list(open_transports):
        transport.abort()
    print("fast_upstream: stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fakes.fast_upstream", allow_abbrev=False,
                                     description="A very fast fake OpenAI-compatible upstream for benchmarks.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args, _ignored = parser.parse_known_args(argv)  # llama-server flags steward passes along
    asyncio.run(serve(args.host, args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
