"""An upstream across the network, over HTTPS with its certificate checked (httpx): a cloud API.

Engines on this machine are reached by the lean h11 client (upstream.py); a cloud needs TLS,
which that client does not speak. This opener answers the same way (an ``UpstreamResponse``-like
object, the same three errors), so the relay, its answer readers and its error shapes are one
for both. Only a refused connection is ``UpstreamUnreachable`` (nothing was sent: a retry is
safe); a failed handshake or a certificate that does not check out is an ``UpstreamError``
that names it, and silence past the timeouts is ``UpstreamStalled``.
"""

from __future__ import annotations

import errno
import math
import ssl
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import attrs
import httpx

from supervisor.gateway.relay.upstream import (
    NO_TIMEOUTS,
    StreamedBody,
    Timeouts,
    UpstreamError,
    UpstreamStalled,
    UpstreamUnreachable,
)

# The body is relayed byte for byte and read by steward's answer readers: never compressed.
_IDENTITY = (b"accept-encoding", b"identity")
# A cloud's own request id would stand beside steward's X-Request-Id (the usage row's): it goes
# on under a name of its own; its cookies are the cloud's business, not the client's.
_RENAMED = {b"x-request-id": b"x-remote-request-id"}
_DROPPED = frozenset({b"set-cookie"})


def _relayed_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(_RENAMED.get(name.lower(), name), value) for name, value in raw if name.lower() not in _DROPPED]


@attrs.define(eq=False)
class HttpsResponse:
    status: int
    headers: list[tuple[bytes, bytes]]
    _response: httpx.Response

    async def iter_body(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive; UpstreamError if it is cut short, UpstreamStalled if silent."""
        try:
            async for chunk in self._response.aiter_raw():
                yield chunk
        except httpx.TimeoutException as exc:
            raise UpstreamStalled(f"nothing between two chunks for too long ({type(exc).__name__})") from None
        except httpx.HTTPError as exc:
            raise UpstreamError(f"the answer broke off: {_said(exc)}") from None


@attrs.frozen
class HttpsOpener:
    """Opens one request to ``scheme://host:port`` (a fresh connection each, as the h11 client)."""

    scheme: str  # "https", or "http" to a loopback address (checked by the config)
    context: ssl.SSLContext = attrs.field(eq=False)

    @asynccontextmanager
    async def __call__(self, host: str, port: int, method: bytes, target: bytes,
                       headers: Sequence[tuple[bytes, bytes]], body: bytes | StreamedBody,
                       timeouts: Timeouts = NO_TIMEOUTS) -> AsyncIterator[HttpsResponse]:
        if not isinstance(body, bytes):
            raise UpstreamError("a streamed request body is not sent to a cloud")
        wait = max(timeouts.first_byte, timeouts.chunk)
        timeout = httpx.Timeout(None if math.isinf(wait) else wait)
        name = f"[{host}]" if ":" in host else host
        url = f"{self.scheme}://{name}:{port}{target.decode('latin-1')}"
        # trust_env=False: no proxy or CA bundle from the environment; the config says what is trusted.
        async with httpx.AsyncClient(verify=self.context, timeout=timeout, trust_env=False) as client:
            request = client.build_request(method.decode(), url, headers=[*headers, _IDENTITY], content=body)
            try:
                response = await client.send(request, stream=True)
            except httpx.ConnectError as exc:
                if _refused(exc):
                    raise UpstreamUnreachable(f"cannot connect to {host}:{port}: connection refused") from None
                raise UpstreamError(f"cannot connect to {host}:{port}: {_said(exc)}") from None
            except httpx.TimeoutException as exc:
                raise UpstreamStalled(f"no answer within {wait:g}s ({type(exc).__name__})") from None
            except httpx.HTTPError as exc:
                raise UpstreamError(f"request to {host}:{port} failed: {_said(exc)}") from None
            try:
                yield HttpsResponse(response.status_code, _relayed_headers(response.headers.raw), response)
            finally:
                await response.aclose()


def _refused(exc: BaseException) -> bool:
    """Whether the connection was refused (nothing listens): the one failure worth trying again.
    anyio words a failed connect as an OSError over a group of one error per address tried."""
    if isinstance(exc, ConnectionRefusedError) or (isinstance(exc, OSError) and exc.errno == errno.ECONNREFUSED):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_refused(inner) for inner in exc.exceptions)
    cause = exc.__cause__ or exc.__context__
    return cause is not None and _refused(cause)


def _said(exc: BaseException) -> str:
    """What went wrong, in the words of the deepest cause that has some (a certificate check's reason)."""
    words = str(exc) or type(exc).__name__
    seen = exc.__cause__ or exc.__context__
    while seen is not None:
        if isinstance(seen, ssl.SSLError) or str(seen):
            words = str(seen) or words
        seen = seen.__cause__ or seen.__context__
    return words
