"""Relaying one request to an upstream and its answer back, unbuffered.

Shared by the OpenAI gateway (to engines) and the service listeners (to Ollama and
ComfyUI). One fresh upstream connection per request. If the upstream cannot be reached
at all (down, restarting), the request may be retried with exponential backoff until it
answers, the client goes, or steward shuts down: no byte was sent, so that is safe. An
upstream that breaks mid-answer ends the answer with an error in the stream's own framing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs
import trio

from supervisor.gateway.errors import error_body, error_headers, error_in_stream
from supervisor.gateway.upstream import UpstreamError, UpstreamUnreachable, open_upstream_request

Send = Callable[[dict[str, Any]], Awaitable[None]]
ErrorShape = Callable[..., bytes]  # (status, message, *, code) -> the error body a client of the route expects

HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade",
                        b"proxy-connection", b"host", b"content-length"})


@attrs.frozen
class Backoff:
    initial: float = 1.0
    maximum: float = 60.0
    # Set when retrying must end (steward shuts down): a request that never reached its
    # upstream must not hold the drain open for the whole shutdown timeout.
    until: trio.Event | None = attrs.field(default=None, eq=False)

    def delays(self) -> Any:
        delay = self.initial
        while True:
            yield delay
            delay = min(delay * 2, self.maximum)

    async def sleep(self, delay: float) -> bool:
        """Wait *delay* seconds before the next try; False when retrying must end instead."""
        if self.until is None:
            await trio.sleep(delay)
            return True
        with trio.move_on_after(delay):
            await self.until.wait()
        return not self.until.is_set()


@attrs.frozen
class UpstreamRequest:
    host: str
    port: int
    method: bytes
    target: bytes
    headers: Sequence[tuple[bytes, bytes]]
    body: bytes


async def relay(send: Send, request: UpstreamRequest, *, what: str, on_status: Callable[[int], None],
                retry: Backoff | None = None, on_retry: Callable[[float, str], None] | None = None,
                error_shape: ErrorShape = error_body) -> None:
    """Send *request* upstream and stream the answer to *send*; *what* names the upstream in
    errors, which *error_shape* writes (OpenAI's shape unless the route speaks another)."""
    delays = retry.delays() if retry is not None else None
    while True:
        try:
            await _relay_once(send, request, what=what, on_status=on_status, error_shape=error_shape)
            return
        except UpstreamUnreachable as exc:
            if delays is None:
                on_status(502)
                await _send_error(send, 502, f"{what} cannot be reached: {exc}", error_shape)
                return
            delay = next(delays)
            if on_retry is not None:
                on_retry(delay, str(exc))
            if not await retry.sleep(delay):  # the client leaving cancels this wait
                on_status(503)
                await _send_error(send, 503, f"steward is shutting down and {what} cannot be reached: {exc}",
                                  error_shape, code="shutting_down")
                return


async def _relay_once(send: Send, request: UpstreamRequest, *, what: str, on_status: Callable[[int], None],
                      error_shape: ErrorShape) -> None:
    started = False
    framing = b""
    try:
        async with open_upstream_request(request.host, request.port, request.method, request.target,
                                         request.headers, request.body) as upstream:
            headers = [(k, v) for k, v in upstream.headers if k not in HOP_BY_HOP]
            framing = next((v for k, v in headers if k == b"content-type"), b"")
            on_status(upstream.status)
            await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
            started = True
            async for chunk in upstream.iter_body():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    except UpstreamUnreachable:
        raise
    except UpstreamError as exc:
        on_status(502)
        message = f"{what} failed during the request: {exc}"
        if not started:
            await _send_error(send, 502, message, error_shape)
        else:
            await send({"type": "http.response.body", "body": error_in_stream(framing, message), "more_body": False})


async def _send_error(send: Send, status: int, message: str, error_shape: ErrorShape, *,
                      code: str = "engine_error") -> None:
    body = error_shape(status, message, code=code)
    await send({"type": "http.response.start", "status": status, "headers": error_headers(body)})
    await send({"type": "http.response.body", "body": body, "more_body": False})
