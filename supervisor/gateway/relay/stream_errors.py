"""Errors inside answers that began as a success: how one is read, and what it stands for.

An engine that fails mid-answer cannot take back the 200 it sent: it ends the stream with an
error in the stream's framing, and so does steward when the engine crashes or stalls
(errors.py). What they write, by who writes it:

* llama-server, vLLM, steward on the OpenAI routes: ``data: {"error": {"code", "message", "type"}}``
  (llama-server's ``code`` is the HTTP status as an int; steward's is its own code, a string);
  older vLLM: ``data: {"object": "error", "code", "message", "type"}``;
* llama-server on /v1/messages: ``event: error`` + ``data: {"code", "message", "type"}`` (the bare
  error object); steward and Anthropic: ``event: error`` + ``{"type": "error", "error": {"type", "message"}}``;
* the Responses API (steward, Ollama): ``event: error`` + ``{"type": "error", "code", "message", "param"}``,
  or its failed end, ``response.failed`` with the response's ``error`` (``{"code", "message"}``);
* Ollama's native NDJSON streams (Ollama, steward): one more line ``{"error": "..."}``.

``Failure`` is what such an event says, for the usage row: its status is the HTTP status the
error names (llama-server's and vLLM's integer ``code``; the status an Anthropic error type or
one of steward's own codes stands for) and otherwise 502, an engine's failure; its code is the
error's code, else its type, else ``engine_error``. An event is parsed, never searched for the
word: a model that writes ``"error"`` in its answer has written content, not an error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import attrs

from supervisor.gateway.errors import ANTHROPIC_STATUS, stream_status
from supervisor.gateway.relay.sse import EVENT_END, event_data, event_name

ENGINE_ERROR = "engine_error"  # the code of a failure that names none (Ollama's bare message)
_CODE_MAX = 64  # a code longer than this is cut: it is a name, not a message
_DONE = b"[DONE]"


@attrs.frozen
class Failure:
    status: int  # the HTTP status it stands for: always an error's (400-599)
    code: str  # what the usage row's error column says
    message: str


def failure_of_event(event: bytes) -> Failure | None:
    """The failure one SSE event (its lines, without the blank line) tells, or None."""
    data = event_data(event)
    if data is None or data.strip() == _DONE:
        return None
    return failure_of_data(data, named_error=event_name(event) == b"error")


def failure_of_data(data: bytes, *, named_error: bool = False) -> Failure | None:
    """The failure one JSON value tells (an SSE event's data, an NDJSON line), or None;
    *named_error*: it came in an SSE event named ``error`` (whose data may be the bare error object)."""
    if not named_error and b"error" not in data:
        return None  # every other shape above has the word: nothing to parse
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return failure_of(value, named_error=named_error)


def failure_of(value: object, *, named_error: bool = False) -> Failure | None:
    """The failure a parsed JSON value tells (see the module docstring), or None."""
    if not isinstance(value, dict):
        return None
    error = value.get("error")
    if value.get("type") == "response.failed":  # the Responses API's end of a failed response
        response = value.get("response")
        failed = response.get("error") if isinstance(response, dict) else None
        return _failure_of_object(failed) if isinstance(failed, dict) else Failure(502, ENGINE_ERROR, "")
    if value.get("type") == "error":
        if isinstance(error, dict):  # Anthropic's
            kind = _code(error.get("type")) or "api_error"
            return Failure(ANTHROPIC_STATUS.get(kind, 502), kind, _message(error))
        if "message" in value:  # the Responses API's
            return _failure_of_object({"code": value.get("code"), "message": value.get("message")})
        return None
    if isinstance(error, dict):  # OpenAI's, llama-server's, vLLM's, steward's own
        return _failure_of_object(error)
    if isinstance(error, str) and error:  # Ollama's
        return Failure(502, ENGINE_ERROR, error)
    if (named_error or value.get("object") == "error") and "message" in value:
        return _failure_of_object(value)  # llama-server's Messages event (the bare object); older vLLM's
    return None


def _failure_of_object(error: Mapping[str, object]) -> Failure:
    code, kind = error.get("code"), _code(error.get("type"))
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599:
        return Failure(code, kind or ENGINE_ERROR, _message(error))  # the status itself: the type names it
    if isinstance(code, str) and code:
        return Failure(stream_status(code), code[:_CODE_MAX], _message(error))
    return Failure(502, kind or ENGINE_ERROR, _message(error))


def _code(value: object) -> str:
    return value[:_CODE_MAX] if isinstance(value, str) else ""


def _message(error: Mapping[str, object]) -> str:
    message = error.get("message")
    return message if isinstance(message, str) else ""


def final_failure(tail: bytes, *, lines: bool) -> Failure | None:
    """The failure a stream ended on: its last event with data (SSE) or its last line (NDJSON,
    *lines*), if that is an error; a ``[DONE]`` after it (vLLM sends one) is passed over. *tail*
    is the stream's end; its first event may be cut, and then reads as no failure."""
    if lines:
        last = next((line for line in reversed(tail.split(b"\n")) if line.strip()), None)
        return failure_of_data(last) if last is not None else None
    for event in reversed(EVENT_END.split(tail)):
        data = event_data(event)
        if data is None or data.strip() == _DONE:
            continue
        return failure_of_event(event)
    return None
