"""Relaying one request to an upstream and its answer back, unbuffered.

Shared by the OpenAI gateway (to engines) and the service listeners (to Ollama and
ComfyUI). One fresh upstream connection per request. If the upstream cannot be reached
at all (down, restarting), the request may be retried with exponential backoff until it
answers, the client goes, or steward shuts down: no byte was sent, so that is safe. An
upstream that breaks mid-answer ends the answer with an error in the stream's own framing;
one that goes silent past its timeouts is answered 504 (the caller is told, to check it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs

from supervisor.backoff import Backoff
from supervisor.gateway.errors import ErrorShape, StreamError, error_body, error_headers, error_in_stream
from supervisor.gateway.relay.upstream import (
    NO_TIMEOUTS,
    StreamedBody,
    Timeouts,
    UpstreamError,
    UpstreamStalled,
    UpstreamUnreachable,
    open_upstream_request,
)
from supervisor.scheduler.actor import Abort

Send = Callable[[dict[str, Any]], Awaitable[None]]

# Headers of one connection, not of the message: never relayed (Content-Length is, when the
# body goes through unchanged: clients such as curl --http1.0 need it to know the answer ended).
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade",
                        b"proxy-connection", b"host"})
# What steward's upstream client sets itself on a request it forwards.
REQUEST_FRAMING = HOP_BY_HOP | {b"content-length"}


@attrs.frozen
class UpstreamRequest:
    host: str
    port: int
    method: bytes
    target: bytes
    headers: Sequence[tuple[bytes, bytes]]
    body: bytes | StreamedBody


@attrs.frozen
class UpstreamFailure:
    """How an upstream's failure is answered: the status, the error's code, and the words that
    say what happened (before the detail); one table for every caller (relay, embedding steps)."""

    status: int
    code: str
    happened: str

    @classmethod
    def of(cls, exc: UpstreamError) -> UpstreamFailure:
        if isinstance(exc, UpstreamUnreachable):
            return cls(502, "engine_error", "cannot be reached")
        if isinstance(exc, UpstreamStalled):
            return cls(504, "engine_timeout", "stalled")
        return cls(502, "engine_error", "failed during the request")

    @classmethod
    def aborted(cls, code: str) -> UpstreamFailure:
        """The scheduler ended the request (its engine is unhealthy): *code* says why."""
        return cls(502, code, "")

    def message(self, what: str, detail: object) -> str:
        return f"{what} {self.happened}: {detail}" if self.happened else f"{what} {detail}"


# Told why the upstream cannot be reached; the request to send elsewhere and what to call it, or None.
Reroute = Callable[[str], Awaitable[tuple[UpstreamRequest, str] | None]]


async def relay(send: Send, request: UpstreamRequest, *, what: str, on_status: Callable[[int], None],
                retry: Backoff | None = None, on_retry: Callable[[float, str], None] | None = None,
                error_shape: ErrorShape = error_body, stream_error: StreamError = error_in_stream,
                timeouts: Timeouts = NO_TIMEOUTS,
                on_stall: Callable[[str], None] | None = None, abort: Abort | None = None,
                reroute: Reroute | None = None) -> None:
    """Send *request* upstream and stream the answer to *send*; *what* names the upstream in
    errors, which *error_shape* writes (OpenAI's shape unless the route speaks another), and
    *stream_error* once a stream has begun.

    An upstream silent past *timeouts* gets 504 (or an error event in an open stream) and
    *on_stall* is told; *abort* lets the scheduler end the request early (its engine is unhealthy).
    An upstream that cannot be reached is retried with *retry*, or, with *reroute*, replaced by
    the request it returns (another node), until it returns None."""
    answer = _Answer(send, error_shape, stream_error, on_status)
    with abort.scope if abort is not None else contextlib.nullcontext():
        await _relay_with_retries(answer, request, what, retry, on_retry, timeouts, on_stall, reroute)
    if abort is not None and abort.scope.cancelled_caught:
        failure = UpstreamFailure.aborted(abort.code)
        await answer.fail(failure.status, failure.message(what, abort.reason), failure.code)


async def _relay_with_retries(answer: _Answer, request: UpstreamRequest, what: str, retry: Backoff | None,
                              on_retry: Callable[[float, str], None] | None, timeouts: Timeouts,
                              on_stall: Callable[[str], None] | None, reroute: Reroute | None) -> None:
    delays = retry.delays() if retry is not None else None
    while True:
        try:
            await _relay_once(answer, request, what, timeouts)
            return
        except UpstreamUnreachable as exc:
            if reroute is not None:
                elsewhere = await reroute(str(exc))
                if elsewhere is not None:
                    request, what = elsewhere
                    continue
            if delays is None:
                await answer.fail_with(UpstreamFailure.of(exc), what, exc)
                return
            delay = next(delays)
            if on_retry is not None:
                on_retry(delay, str(exc))
            if not await retry.sleep(delay):  # type: ignore[union-attr]  # the client leaving cancels this wait
                await answer.fail(503, f"steward is shutting down and {what} cannot be reached: {exc}",
                                  "shutting_down")
                return
        except UpstreamError as exc:
            if isinstance(exc, UpstreamStalled) and on_stall is not None:
                on_stall(str(exc))
            await answer.fail_with(UpstreamFailure.of(exc), what, exc)
            return


@attrs.define(eq=False)
class _Answer:
    """The client's side of a relay: what was sent so far, and how to end it with an error."""

    send: Send
    error_shape: ErrorShape
    stream_error: StreamError
    on_status: Callable[[int], None]
    headers: list[tuple[bytes, bytes]] | None = None  # the answer's, once it started
    length_declared: bool = False  # by the upstream: the body must then go through whole
    complete: bool = False

    async def start(self, status: int, headers: list[tuple[bytes, bytes]], length: int | None) -> None:
        self.on_status(status)
        self.headers = headers  # read only if the answer fails
        self.length_declared = length is not None
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, chunk: bytes, *, more: bool = True) -> None:
        self.complete = not more
        await self.send({"type": "http.response.body", "body": chunk, "more_body": more})

    async def fail_with(self, failure: UpstreamFailure, what: str, detail: object) -> None:
        await self.fail(failure.status, failure.message(what, detail), failure.code)

    async def fail(self, status: int, message: str, code: str) -> None:
        if self.complete:
            return
        self.on_status(status)
        if self.headers is None:
            body = self.error_shape(status, message, code=code)
            self.headers = error_headers(body, shape=self.error_shape)
            await self.send({"type": "http.response.start", "status": status, "headers": self.headers})
            await self.body(body, more=False)
        elif not self.length_declared:
            framing = next((v for k, v in self.headers if k == b"content-type"), b"")
            await self.body(self.stream_error(framing, message, code=code), more=False)
        else:
            # A body of announced length cannot take an error; ending here without its last
            # bytes closes the connection, so the client sees the answer is incomplete.
            self.complete = True


async def _relay_once(answer: _Answer, request: UpstreamRequest, what: str, timeouts: Timeouts) -> None:
    async with open_upstream_request(request.host, request.port, request.method, request.target,
                                     request.headers, request.body, timeouts) as upstream:
        headers = [(k, v) for k, v in upstream.headers if k not in HOP_BY_HOP]
        await answer.start(upstream.status, headers, upstream.content_length)
        async for chunk in upstream.iter_body():
            await answer.body(chunk)
        await answer.body(b"", more=False)
