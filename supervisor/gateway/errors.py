"""OpenAI-shaped error objects: ``{"error": {"message", "type", "param", "code"}}``, all four keys."""

from __future__ import annotations

import json
import math

_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 405: "invalid_request_error",
          413: "invalid_request_error", 429: "rate_limit_error"}


def error_body(status: int, message: str, *, code: str | None = None, param: str | None = None,
               type: str | None = None) -> bytes:  # noqa: A002 - the OpenAI field is called `type`
    kind = type or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}}).encode()


def ollama_error_body(status: int, message: str, *, code: str | None = None) -> bytes:
    """Ollama's own error shape on its native /api routes: {"error": message}."""
    return json.dumps({"error": message}).encode()


def error_headers(body: bytes, retry_after: float | None = None) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after is not None:
        headers.append((b"retry-after", str(max(1, math.ceil(retry_after))).encode()))
    return headers


def error_in_stream(content_type: bytes, message: str, *, code: str = "engine_error") -> bytes:
    """The last bytes of an answer that cannot be completed, in the stream's own framing."""
    if content_type.startswith(b"text/event-stream"):
        return sse_error_event(message, code=code)  # as llama-server does: no [DONE] after it
    if content_type.startswith(b"application/x-ndjson"):
        return json.dumps({"error": message}).encode() + b"\n"  # as Ollama does mid-stream
    return b""  # a plain body cut short: the client sees it was incomplete


def sse_error_event(message: str, *, code: str | None = None) -> bytes:
    """An error inside an open SSE stream, as llama-server sends one (no [DONE] after it)."""
    body = error_body(502, message, code=code)
    return b"data: " + body + b"\n\n"
