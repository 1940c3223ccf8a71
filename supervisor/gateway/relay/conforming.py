"""Answers as OpenAI's API reference (its OpenAPI spec) requires them, whatever the engine left out.

Clients and their SDKs read what the spec requires of an answer; each engine leaves something
out, or sends null where the spec wants a value. Steward puts it right on the way through:

==========================  ===============================================  =====================================
answer                      what the engine sends                            what the client gets
==========================  ===============================================  =====================================
chat completion (whole)     llama-server, Ollama: no choice ``logprobs``,    ``"logprobs": null``,
                            no message ``refusal``; vLLM: null message       ``"refusal": null``; a null the spec
                            ``annotations``/``function_call``, null          types otherwise left out (null says
                            ``system_fingerprint`` and usage details         what its absence says)
text completion (whole)     vLLM: null ``system_fingerprint``, usage         the nulls left out
                            details
text completion chunk       Ollama: no choice ``logprobs``                   ``"logprobs": null``
an error (answer or event)  llama-server, vLLM: ``code`` the HTTP status     ``code`` null (the status says it),
                            (an int), no ``param``; ``{"error": "..."}``     ``param`` null; every error in
                            (Ollama's native shape, whisper.cpp's);          OpenAI's ``{"error": {"message",
                            FastAPI's ``{"detail"}``; old vLLM's bare        "type", "param", "code"}}``
                            ``{"object": "error", ...}``
==========================  ===============================================  =====================================

The Responses API's answers and events: responses_events.py.

The readers (answer.py), put on a route's tap by ``reading_answer`` (reshaped.py):

* ``AnswerConformed``: a JSON answer: a 200 is held whole (its length changes) and put right
  by the API's fix, up to ``MAX_HELD_BYTES`` (a larger one goes as it came); an error (>= 400,
  up to ``MAX_ERROR_BYTES``) in OpenAI's shape (on the Messages routes, in Anthropic's:
  reshaped.py). An answer that conforms keeps its bytes.
* ``chunks_conformed``: a chat or text completion stream. Only the start of an event whose end
  is still to come is held; an event is parsed only when it may need something: a chat stream's
  when it holds the word ``"error"`` (an engine's error event), a completion stream's also when
  it has no ``"logprobs"``.

An engine's error is told to the request's ``Exchange`` before it is put right (``noted``), so
that the usage row records the engine's status and code (stream_errors.py), not null.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs

from supervisor.gateway.errors import error_type
from supervisor.gateway.relay.answer import NOTHING_HELD, AnswerHead, Framing, Passed
from supervisor.gateway.relay.sse import EventsRewritten, event_data, json_bytes, json_object, with_data
from supervisor.gateway.relay.stream_errors import Failure, failure_of

Fix = Callable[[dict[str, Any]], bool]  # puts an answer right in place; True if it changed anything
Noted = Callable[[Failure], None]  # the engine's own error, before it is put right
ErrorWriter = Callable[[int, dict[str, Any]], bytes | None]  # (status, the engine's error) -> the client's

MAX_HELD_BYTES = 32 * 2**20
MAX_ERROR_BYTES = 64 * 1024
_DONE = b"[DONE]"


def conformed_chat(answer: dict[str, Any]) -> bool:
    """A whole chat completion (``CreateChatCompletionResponse``) put right in place."""
    changed = _without_nulls(answer, _ANSWER_NULLS)
    for choice in _objects(answer.get("choices")):
        changed |= _put(choice, "logprobs", None)
        message = choice.get("message")
        if isinstance(message, dict):
            changed |= _put(message, "refusal", None) | _put(message, "content", None)
            changed |= _without_nulls(message, _MESSAGE_NULLS)
    return changed | _usage_without_nulls(answer)


def conformed_completion(answer: dict[str, Any]) -> bool:
    """A whole text completion (``CreateCompletionResponse``), or one chunk of its stream, put right in place."""
    changed = _without_nulls(answer, _ANSWER_NULLS)
    for choice in _objects(answer.get("choices")):
        changed |= _put(choice, "logprobs", None)
    return changed | _usage_without_nulls(answer)


def conformed_error(value: dict[str, Any], status: int) -> dict[str, Any] | None:
    """OpenAI's error object (``ErrorResponse``) for an engine's error *value* (an answer's body or
    an event's data) of *status*; None where *value* is one already, or no error we can read."""
    error = value.get("error")
    if isinstance(error, dict):
        fixed, rest = dict(error), {k: v for k, v in value.items() if k != "error"}
    elif isinstance(error, str):  # Ollama's native shape, whisper.cpp's
        fixed, rest = {"message": error}, {k: v for k, v in value.items() if k != "error"}
    elif value.get("object") == "error" and "message" in value:  # older vLLM's, without the envelope
        fixed, rest = {k: v for k, v in value.items() if k != "object"}, {}
    elif "detail" in value:  # FastAPI's (a route vLLM does not have; Kokoro-FastAPI's, Speaches')
        fixed, rest = _fastapi_error(value["detail"]), {}
    else:
        return None
    if not isinstance(fixed.get("message"), str):
        fixed["message"] = "" if fixed.get("message") is None else json.dumps(fixed["message"])
    if not isinstance(fixed.get("type"), str):
        fixed["type"] = error_type(status)
    for key in ("param", "code"):  # a string or null; llama-server's and vLLM's code is the status
        if not isinstance(fixed.get(key), str):
            fixed[key] = None
    if fixed == error:
        return None
    return {**rest, "error": fixed}


def _fastapi_error(detail: Any) -> dict[str, Any]:
    """FastAPI's ``{"detail": ...}`` as OpenAI's error fields: a string (``HTTPException``), an
    object with a ``message`` (Kokoro-FastAPI's ``{"error", "message", "type"}``: its ``error`` is
    the code), or a 422's list of ``{"loc", "msg"}`` (pydantic's: its field is the ``param``)."""
    if isinstance(detail, str):
        return {"message": detail}
    if isinstance(detail, dict) and isinstance(detail.get("message"), str):
        return {"message": detail["message"], **{field: detail[key] for field, key in (("type", "type"), ("code", "error"))
                                                 if isinstance(detail.get(key), str)}}
    if isinstance(detail, list) and detail and all(isinstance(d, dict) and isinstance(d.get("msg"), str) for d in detail):
        places = [".".join(str(part) for part in d["loc"][1:]) if isinstance(d.get("loc"), list) else "" for d in detail]
        message = "; ".join(f"{place}: {d['msg']}" if place else d["msg"] for place, d in zip(places, detail, strict=True))
        return {"message": message, **({"param": places[0]} if len(detail) == 1 and places[0] else {})}
    return {"message": json.dumps(detail)}


# Keys whose null the spec types otherwise (a string, an array, an object): leaving one out says what its null said.
_ANSWER_NULLS = ("system_fingerprint", "usage")
_MESSAGE_NULLS = ("annotations", "function_call", "tool_calls")
_USAGE_NULLS = ("prompt_tokens_details", "completion_tokens_details")


def _usage_without_nulls(answer: dict[str, Any]) -> bool:
    usage = answer.get("usage")
    return _without_nulls(usage, _USAGE_NULLS) if isinstance(usage, dict) else False


def _without_nulls(value: dict[str, Any], keys: tuple[str, ...]) -> bool:
    nulls = [key for key in keys if key in value and value[key] is None]
    for key in nulls:
        del value[key]
    return bool(nulls)


def _put(value: dict[str, Any], key: str, default: Any) -> bool:
    """*key* given its *default* where *value* leaves it out; True if it did."""
    if key in value:
        return False
    value[key] = default
    return True


def _objects(values: object) -> list[dict[str, Any]]:
    return [value for value in values if isinstance(value, dict)] if isinstance(values, list) else []


def _failure_and_error(value: dict[str, Any]) -> tuple[Failure, dict[str, Any]] | None:
    """An engine's error *value*: what it says, and it in OpenAI's shape (None: none to put right)."""
    failure = failure_of(value)
    if failure is None:
        return None
    fixed = conformed_error(value, failure.status)
    return None if fixed is None else (failure, fixed)


def openai_error(status: int, value: dict[str, Any]) -> bytes | None:
    """An engine's error answer of *status* in OpenAI's shape; None where it is in it already."""
    fixed = conformed_error(value, status)
    return None if fixed is None else json_bytes(fixed)


@attrs.define(eq=False)
class AnswerConformed:
    """A reader (answer.py): a JSON answer as the spec requires it (see the module docstring).
    With no *fix*, only an error is read; *errors* writes an engine's error as the route's clients
    read it (None: as it came)."""

    fix: Fix | None
    noted: Noted = lambda failure: None
    errors: ErrorWriter = openai_error
    _start: AnswerHead | None = None  # the head of the answer held, until its body is whole
    _held: list[bytes] = attrs.Factory(list)
    _held_bytes: int = 0

    @property
    def reading(self) -> bool:
        return self._start is not None

    def start(self, head: AnswerHead) -> AnswerHead | None:
        if head.framing is Framing.JSON and (head.status >= 400 or (head.status == 200 and self.fix is not None)):
            self._start = head
            return None
        return head

    def body(self, chunk: bytes, more: bool) -> Passed:
        if self._start is None:
            return None, chunk
        if chunk:
            self._held.append(chunk)
            self._held_bytes += len(chunk)
        limit = MAX_ERROR_BYTES if self._start.status >= 400 else MAX_HELD_BYTES
        if more and self._held_bytes <= limit:
            return NOTHING_HELD
        start, body = self.end()
        if more or start is None:
            return start, body  # too large to hold: as it came
        fixed = self._fixed(start.status, body)
        return (start, body) if fixed is None else (start.with_length(len(fixed)), fixed)

    def end(self) -> Passed:
        """What is held, unchanged, of an answer whose last body message never came."""
        start, body = self._start, b"".join(self._held)
        self._start, self._held, self._held_bytes = None, [], 0
        return start, body

    def _fixed(self, status: int, body: bytes) -> bytes | None:
        value = json_object(body)
        if value is None:
            return None
        if status >= 400:
            written = self.errors(status, value)
            if written is not None and (failure := failure_of(value)) is not None:
                self.noted(failure)
            return written
        assert self.fix is not None
        return json_bytes(value) if self.fix(value) else None


def chunks_conformed(fix: Fix | None, noted: Noted = lambda failure: None) -> EventsRewritten:
    """A reader (answer.py): a chat or text completion stream's events as the spec requires them
    (see the module docstring); *fix* puts a chunk right (None: only its error events are read)."""
    return EventsRewritten(_Chunks(fix, noted).rewrite, only_with=b'"error"' if fix is None else None)


@attrs.frozen
class _Chunks:
    fix: Fix | None
    noted: Noted

    def rewrite(self, event: bytes) -> bytes | None:
        is_error = b'"error"' in event
        if not is_error and (self.fix is None or b'"logprobs"' in event):
            return None
        data = event_data(event)
        value = json_object(data) if data is not None and data.strip() != _DONE else None
        if value is None:
            return None
        if is_error and (found := _failure_and_error(value)) is not None:
            self.noted(found[0])
            fixed = json_bytes(found[1])
        elif self.fix is not None and "error" not in value and self.fix(value):
            fixed = json_bytes(value)
        else:
            return None
        return None if fixed is None else with_data(event, fixed)
