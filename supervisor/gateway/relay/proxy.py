"""Relaying one request to an upstream and its answer back, unbuffered.

Shared by the OpenAI gateway (to engines) and the service listeners (to Ollama and
ComfyUI). One fresh upstream connection per request. If the upstream cannot be reached
at all (down, restarting), the request may be retried with exponential backoff until it
answers, the client goes, or steward shuts down: no byte was sent, so that is safe. An
upstream that breaks mid-answer ends the answer with an error in the stream's own framing;
one that goes silent past its timeouts is answered 504 (the caller is told, to check it).

The upstream's head is read once, into an ``AnswerHead`` (answer.py), and the answer is written
into an ``Answer``: the client's tap with the route's readers on it, or a caller's own (the
steps of a generation, an embeddings step), who may say a failure in its own words.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import attrs

from supervisor.backoff import Backoff
from supervisor.gateway.errors import ErrorShape, StreamError, error_body, error_headers, error_in_stream
from supervisor.gateway.http.asgi import Send
from supervisor.gateway.relay.answer import Answer, AnswerHead, AnswerTap
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

# Opens one request upstream: (host, port, method, target, headers, body, timeouts) -> its response.
Opener = Callable[..., AbstractAsyncContextManager[Any]]

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
    # How the connection is opened: the h11 client to an engine here, or HTTPS to a cloud
    # (https_upstream.py); both answer alike.
    opener: Opener = open_upstream_request


@attrs.frozen
class UpstreamFailure:
    """How an upstream's failure is answered: the status, the error's code, and the words that
    say what happened (before the detail); one table for every caller (relay, embedding steps)."""

    status: int
    code: str
    happened: str
    before: str = ""  # words before the upstream's name

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

    @classmethod
    def shutting_down(cls) -> UpstreamFailure:
        """An upstream that cannot be reached while steward stops: its retries end."""
        return cls(503, "shutting_down", "cannot be reached", before="steward is shutting down and ")

    def message(self, what: str, detail: object) -> str:
        return f"{self.before}{what} {self.happened}: {detail}" if self.happened else f"{what} {detail}"


@attrs.frozen
class Failed:
    """How a relay failed: the table's entry, what the upstream is called, and what happened."""

    failure: UpstreamFailure
    what: str
    detail: object

    @property
    def message(self) -> str:
        return self.failure.message(self.what, self.detail)


# Told why the upstream cannot be reached; the request to send elsewhere and what to call it, or None.
Reroute = Callable[[str], Awaitable[tuple[UpstreamRequest, str] | None]]


async def relay(send: Send | Answer, request: UpstreamRequest, *, what: str, on_status: Callable[[int], None],
                retry: Backoff | None = None, on_retry: Callable[[float, str], None] | None = None,
                error_shape: ErrorShape = error_body, stream_error: StreamError = error_in_stream,
                timeouts: Timeouts = NO_TIMEOUTS,
                on_stall: Callable[[str], None] | None = None, abort: Abort | None = None,
                reroute: Reroute | None = None, write_failure: bool = True) -> Failed | None:
    """Send *request* upstream and write the answer into *send* (an ``Answer``, or a bare ASGI send:
    the answer goes through as it comes); *what* names the upstream in errors, which *error_shape*
    writes (OpenAI's shape unless the route speaks another), and *stream_error* once a stream has begun.

    An upstream silent past *timeouts* gets 504 (or an error event in an open stream) and
    *on_stall* is told; *abort* lets the scheduler end the request early (its engine is unhealthy).
    An upstream that cannot be reached is retried with *retry*, or, with *reroute*, replaced by
    the request it returns (another node), until it returns None.

    Returns how it failed, or None; the failure is written into the answer unless *write_failure*
    is False (the caller says it in its own words: an embeddings step)."""
    relayed = _Relayed(send if isinstance(send, Answer) else AnswerTap(send), error_shape, stream_error, on_status)
    with abort.scope if abort is not None else contextlib.nullcontext():
        failed = await _relay_with_retries(relayed, request, what, retry, on_retry, timeouts, on_stall, reroute)
    if abort is not None and abort.scope.cancelled_caught:
        failed = Failed(UpstreamFailure.aborted(abort.code), what, abort.reason)
    if failed is not None and write_failure:
        await relayed.fail(failed)
    return failed


async def _relay_with_retries(relayed: _Relayed, request: UpstreamRequest, what: str, retry: Backoff | None,
                              on_retry: Callable[[float, str], None] | None, timeouts: Timeouts,
                              on_stall: Callable[[str], None] | None, reroute: Reroute | None) -> Failed | None:
    delays = retry.delays() if retry is not None else None
    while True:
        try:
            await _relay_once(relayed, request, timeouts)
            return None
        except UpstreamUnreachable as exc:
            if reroute is not None:
                elsewhere = await reroute(str(exc))
                if elsewhere is not None:
                    request, what = elsewhere
                    continue
            if delays is None:
                return Failed(UpstreamFailure.of(exc), what, exc)
            delay = next(delays, None)
            if delay is None:  # as many tries as the backoff allows, all refused
                return Failed(UpstreamFailure.of(exc), what, exc)
            if on_retry is not None:
                on_retry(delay, str(exc))
            if not await retry.sleep(delay):  # type: ignore[union-attr]  # the client leaving cancels this wait
                return Failed(UpstreamFailure.shutting_down(), what, exc)
        except UpstreamError as exc:
            if isinstance(exc, UpstreamStalled) and on_stall is not None:
                on_stall(str(exc))
            return Failed(UpstreamFailure.of(exc), what, exc)


@attrs.define(eq=False)
class _Relayed:
    """What a relay wrote into its answer so far, and how to end it with an error."""

    answer: Answer
    error_shape: ErrorShape
    stream_error: StreamError
    on_status: Callable[[int], None]
    head: AnswerHead | None = None  # the upstream's, once the answer started
    complete: bool = False

    async def start(self, head: AnswerHead) -> None:
        self.on_status(head.status)
        self.head = head
        await self.answer.start(head)

    async def fail(self, failed: Failed) -> None:
        if self.complete:
            return
        status, code = failed.failure.status, failed.failure.code
        self.on_status(status)
        if self.head is None:
            body = self.error_shape(status, failed.message, code=code)
            self.head = AnswerHead.of(status, error_headers(body, shape=self.error_shape))
            await self.answer.start(self.head)
            await self.end(body)
        elif not self.head.length_declared:
            await self.end(self.stream_error(self.head.content_type, failed.message, code=code))
        else:
            # A body of announced length cannot take an error; ending here without its last
            # bytes closes the connection, so the client sees the answer is incomplete.
            self.complete = True

    async def end(self, last: bytes = b"") -> None:
        self.complete = True
        await self.answer.body(last, more=False)


async def _relay_once(relayed: _Relayed, request: UpstreamRequest, timeouts: Timeouts) -> None:
    async with request.opener(request.host, request.port, request.method, request.target,
                              request.headers, request.body, timeouts) as upstream:
        await relayed.start(AnswerHead.of(upstream.status, upstream.headers, HOP_BY_HOP))
        body = relayed.answer.body  # each chunk straight to the answer: complete only at its end
        async for chunk in upstream.iter_body():
            await body(chunk, True)
        await relayed.end()
