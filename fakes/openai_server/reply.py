"""One answer through fakes.http11, with uvicorn's habits: a Date header, bodyless answers
without a Content-Type (Starlette's ``Response(status_code=200)``), and the access-log line
written when the response head goes out (so a stream is logged when it starts).
"""

from __future__ import annotations

import http
from email.utils import formatdate

import attrs
import h11

from fakes.http11 import Exchange, dump_json
from fakes.openai_server.cli import Log

JSON = b"application/json"
SSE = b"text/event-stream; charset=utf-8"
TEXT = b"text/plain; charset=utf-8"


@attrs.define(eq=False)
class Reply:
    ex: Exchange
    log: Log | None  # None: --disable-uvicorn-access-log

    def __attrs_post_init__(self) -> None:
        self.ex.headers.append((b"date", formatdate(usegmt=True).encode()))

    @property
    def started(self) -> bool:
        return self.ex.status != 0

    def _access(self, status: int) -> None:
        if self.log is None:
            return
        req = self.ex.request
        try:
            host, port = self.ex.conn.stream.socket.getpeername()[:2]
        except OSError:
            host, port = req.client, 0
        target = req.path + (f"?{req.query}" if req.query else "")
        phrase = http.HTTPStatus(status).phrase
        self.log.uvicorn(f'{host}:{port} - "{req.method} {target} HTTP/1.1" {status} {phrase}')

    async def json(self, status: int, value: object, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.ex.headers += headers or []
        self._access(status)
        await self.ex.respond(status, dump_json(value), JSON)

    async def text(self, status: int, body: bytes, content_type: bytes = TEXT) -> None:
        self._access(status)
        await self.ex.respond(status, body, content_type)

    async def empty(self, status: int) -> None:
        """No body and no Content-Type: what vLLM's ``/health`` answers."""
        ex = self.ex
        self._access(status)
        ex.status = status
        headers = [(b"server", ex.conn.policy.server), (b"content-length", b"0"), *ex.headers]
        if not ex.keep_alive:
            headers.append((b"connection", b"close"))
        await ex.conn.send(h11.Response(status_code=status, headers=headers,
                                        reason=http.HTTPStatus(status).phrase.encode()), h11.EndOfMessage())

    async def start_stream(self, content_type: bytes = SSE) -> None:
        self._access(200)
        await self.ex.start_stream(content_type)

    async def send(self, data: bytes) -> None:
        """Part of a started stream (one SSE event: one write, as each of vLLM's yields is)."""
        await self.ex.send_raw(data)

    async def end(self) -> None:
        await self.ex.end_stream()
