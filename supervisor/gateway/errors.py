"""Error objects in each listener's own shape.

OpenAI's ``{"error": {"message", "type", "param", "code"}}`` (all four keys) on the OpenAI
listener and Ollama's /v1 routes; Anthropic's ``{"type": "error", "error": {"type", "message"}}``
on the Messages routes (/v1/messages, on either listener); Ollama's ``{"error": message}`` on
its native /api routes;
ComfyUI's ``{"error": {"type", "message", "details", "extra_info"}, "node_errors": {}}``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

ErrorShape = Callable[..., bytes]  # (status, message, *, code=None, param=None) -> body

_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 405: "invalid_request_error",
          408: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error"}


def error_type(status: int) -> str:
    """The type of OpenAI's error object for an error of *status*."""
    return _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str, *, code: str | None = None, param: str | None = None,
               type: str | None = None) -> bytes:  # noqa: A002 - the OpenAI field is called `type`
    kind = type or error_type(status)
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}}).encode()


# Anthropic's error types by status (docs: "Errors"); 529 is its overload, steward's is 503.
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 405: "invalid_request_error", 408: "timeout_error",
                    413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
                    504: "timeout_error", 529: "overloaded_error"}


def anthropic_error_body(status: int, message: str, *, code: str | None = None, param: str | None = None) -> bytes:
    """Anthropic's error shape; steward's own code has no field there (the usage log keeps it)."""
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


# The status each Anthropic error type stands for, read back from an error event (stream_errors.py);
# api_error, and any type not named here, is an engine's failure: 502.
ANTHROPIC_STATUS = {"invalid_request_error": 400, "authentication_error": 401, "billing_error": 402,
                    "permission_error": 403, "not_found_error": 404, "request_too_large": 413,
                    "rate_limit_error": 429, "overloaded_error": 503, "timeout_error": 504}


def anthropic_stream_error(content_type: bytes, message: str, *, code: str = "engine_error") -> bytes:
    """The end of a Messages stream that cannot be completed: Anthropic's ``error`` event."""
    if not content_type.startswith(b"text/event-stream"):
        return error_in_stream(content_type, message, code=code)
    return anthropic_error_event(stream_status(code), message)


def anthropic_error_event(status: int, message: str) -> bytes:
    """Anthropic's ``error`` event inside a Messages stream; its type says the *status* (the 200 is sent)."""
    return b"event: error\ndata: " + anthropic_error_body(status, message) + b"\n\n"


def responses_stream_error(content_type: bytes, message: str, *, code: str = "engine_error") -> bytes:
    """The end of a Responses stream that cannot be completed: the Responses API's ``error`` event."""
    if not content_type.startswith(b"text/event-stream"):
        return error_in_stream(content_type, message, code=code)
    return responses_error_event(message, code=code)


def responses_error_event(message: str, *, code: str | None, sequence_number: int = 0) -> bytes:
    """The Responses API's ``error`` event (the openai SDK's ``ResponseErrorEvent``). Where in the
    stream it comes is for the caller to say: steward's own errors do not know it, and say 0
    (``StreamErrorsReshaped`` numbers them on from the stream's events where it reads them)."""
    event = {"type": "error", "code": code, "message": message, "param": None, "sequence_number": sequence_number}
    return b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"


def responses_failed_event(response: dict[str, Any], message: str, *, sequence_number: int) -> bytes:
    """The Responses API's ``response.failed`` (the openai SDK's ``ResponseFailedEvent``): *response*
    (the stream's own, from its ``response.created``) failed with *message*. Codex CLI reads a
    failed stream's message only here, not in the ``error`` event; without it, it retries."""
    failed = {**response, "status": "failed", "error": {"code": "server_error", "message": message}}
    event = {"type": "response.failed", "sequence_number": sequence_number, "response": failed}
    return b"event: response.failed\ndata: " + json.dumps(event).encode() + b"\n\n"


def ollama_error_body(status: int, message: str, *, code: str | None = None, param: str | None = None) -> bytes:
    """Ollama's own error shape on its native /api routes: {"error": message}."""
    return json.dumps({"error": message}).encode()


def comfy_error_body(status: int, message: str, *, code: str | None = None, param: str | None = None,
                     details: str = "") -> bytes:
    """ComfyUI's error shape, as its /prompt answers a prompt it refuses."""
    error = {"type": code or _COMFY_TYPES.get(status, "steward_error"), "message": message, "details": details,
             "extra_info": {}}
    return json.dumps({"error": error, "node_errors": {}}).encode()


def comfy_refusal_body(kind: str, message: str, details: str, node_errors: dict[str, Any]) -> bytes:
    """ComfyUI's answer to a prompt its validation refuses, each failing node's errors with it."""
    error = {"type": kind, "message": message, "details": details, "extra_info": {}}
    return json.dumps({"error": error, "node_errors": node_errors}).encode()


_COMFY_TYPES = {400: "invalid_prompt", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
                408: "request_timeout", 413: "request_too_large"}


JSON_TYPE = b"application/json"
# ComfyUI's errors are aiohttp's json_response, which names the charset: steward's own errors on
# the ComfyUI listener say the same, as ComfyUI's clients see ComfyUI say it.
COMFY_JSON_TYPE = b"application/json; charset=utf-8"


def content_type_of(shape: ErrorShape) -> bytes:
    """The Content-Type of an error in *shape*: ComfyUI's as its server writes it, the others' plain."""
    return COMFY_JSON_TYPE if shape is comfy_error_body else JSON_TYPE


def error_headers(body: bytes, retry_after: float | None = None, *,
                  shape: ErrorShape = error_body) -> list[tuple[bytes, bytes]]:
    """The headers of an error *body* in *shape*."""
    headers = [(b"content-type", content_type_of(shape)), (b"content-length", str(len(body)).encode())]
    if retry_after is not None:
        headers.append((b"retry-after", str(max(1, math.ceil(retry_after))).encode()))
    return headers


StreamError = Callable[..., bytes]  # (content_type, message, *, code) -> the stream's last bytes

# The status each of steward's own codes for a stream it cannot complete stands for; any other
# code is the engine's failure (engine_error, engine_unhealthy): 502. The stream's 200 is sent:
# this status is what the error event says (Anthropic's type) and what the usage row records.
STREAM_STATUS = {"engine_timeout": 504, "shutting_down": 503}


def stream_status(code: str | None) -> int:
    return STREAM_STATUS.get(code or "", 502)


def error_in_stream(content_type: bytes, message: str, *, code: str = "engine_error") -> bytes:
    """The last bytes of an answer that cannot be completed, in the stream's own framing."""
    if content_type.startswith(b"text/event-stream"):
        return sse_error_event(message, code=code)  # as llama-server does: no [DONE] after it
    if content_type.startswith(b"application/x-ndjson"):
        return json.dumps({"error": message}).encode() + b"\n"  # as Ollama does mid-stream
    return b""  # a plain body cut short: the client sees it was incomplete


def sse_error_event(message: str, *, code: str | None = None) -> bytes:
    """An error inside an open SSE stream, as llama-server sends one (no [DONE] after it)."""
    body = error_body(stream_status(code), message, code=code)
    return b"data: " + body + b"\n\n"
