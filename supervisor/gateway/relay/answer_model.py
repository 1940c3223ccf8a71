"""The answer names the model that served it: the top-level ``"model"`` of a routed answer.

OpenAI's answers say in ``model`` which model produced them (Anthropic's stream in its
``message_start``'s message, the Responses API's events in their response); a node's engine says its own
name there (llama-server its alias or GGUF path), and a client that asked for a capability
would never learn what served it. So the front door rewrites that one field to steward's
name of the model, in the answer's own framing:

* a JSON answer (200, ``application/json``) is held whole, since its length changes: the
  start message waits for the last body message, and its ``content-length`` is fixed.
  One larger than ``MAX_HELD_BYTES`` (an embeddings answer of thousands of vectors) goes
  through unchanged rather than be held in memory;
* an event stream (200, ``text/event-stream``) is rewritten event by event as it comes.
  Only the one event cut across two body messages is held back until its end arrives
  (events are split as ``supervisor.gateway.relay.stream_usage`` splits them); an event longer
  than ``MAX_HELD_BYTES`` ends the rewriting, and the rest of the stream goes as it came;
* anything else (an error, another content type, a stream of announced length, which
  could not change length) goes through untouched.

A body that is not a JSON object, or has no ``"model"``, or names the model already, keeps
its bytes.
"""

from __future__ import annotations

import enum
import json
from typing import Any

import attrs

from supervisor.gateway.relay.answer import NOTHING_HELD, AnswerHead, Framing, Passed
from supervisor.gateway.relay.sse import EVENT_END, json_bytes

MAX_HELD_BYTES = 32 * 2**20


class _Framing(enum.Enum):
    AS_IS = enum.auto()  # not rewritten
    JSON = enum.auto()  # held whole, then rewritten
    EVENTS = enum.auto()  # rewritten event by event


@attrs.define(eq=False)
class ModelNamed:
    """A reader (answer.py) that names *model* in the top-level ``"model"`` of the answer.

    An upstream that broke off a body of announced length leaves it unfinished: what was held
    comes out of ``end`` unchanged (incomplete, so that the client sees the answer was cut)."""

    model: str
    _framing: _Framing = _Framing.AS_IS
    _start: AnswerHead | None = None  # a JSON answer's head, until its body is complete
    _held: list[bytes] = attrs.Factory(list)  # JSON: the body so far; events: the incomplete last event
    _held_bytes: int = 0

    @property
    def reading(self) -> bool:
        return self._framing is not _Framing.AS_IS

    def start(self, head: AnswerHead) -> AnswerHead | None:
        self._framing = _framing_of(head)
        if self._framing is _Framing.JSON:
            self._start = head
            return None
        return head

    def body(self, chunk: bytes, more: bool) -> Passed:
        if self._framing is _Framing.JSON:
            return self._json_body(chunk, more=more)
        if self._framing is _Framing.EVENTS:
            return None, self._events_body(chunk, more=more)  # nothing, with more: its event's end is to come
        return None, chunk

    def end(self) -> Passed:
        """What is held, unchanged, of an answer whose last body message never came."""
        start, self._start = self._start, None
        self._framing = _Framing.AS_IS
        return start, self._take_held()

    def _json_body(self, chunk: bytes, *, more: bool) -> Passed:
        self._hold(chunk)
        if more and self._held_bytes <= MAX_HELD_BYTES:
            return NOTHING_HELD
        if more:  # too large to hold: it goes as it came
            return self.end()
        assert self._start is not None
        body = self._take_held()
        start, self._start = self._start, None
        renamed = _renamed(body, self.model)
        if renamed is not None:
            body = renamed
            start = start.with_length(len(body))
        self._framing = _Framing.AS_IS
        return start, body

    def _events_body(self, chunk: bytes, *, more: bool) -> bytes:
        seam = self._held_end(3)  # an event's end may begin before *chunk*: at most 3 bytes before
        self._hold(chunk)
        if more and self._held_bytes <= MAX_HELD_BYTES and not EVENT_END.search(seam + chunk):
            return b""  # still inside one event (not looked at again for each piece of it)
        data = self._take_held()
        parts = []
        start = 0
        for end in EVENT_END.finditer(data):
            parts.append(_renamed_event(data[start:end.start()], self.model))
            parts.append(end.group())
            start = end.end()
        rest = data[start:]
        if more and len(rest) <= MAX_HELD_BYTES:
            self._hold(rest)  # an event cut across two messages waits for its end
        else:
            # The stream's end (an unfinished event is no event: it goes as it came), or an event
            # too long to hold: the rest of the stream goes as it comes.
            parts.append(rest)
            self._framing = _Framing.AS_IS
        return b"".join(parts)

    def _hold(self, chunk: bytes) -> None:
        if chunk:
            self._held.append(chunk)
            self._held_bytes += len(chunk)

    def _held_end(self, size: int) -> bytes:
        end = b""
        for piece in reversed(self._held):  # pieces may be shorter than *size*
            end = piece[-(size - len(end)):] + end
            if len(end) == size:
                break
        return end

    def _take_held(self) -> bytes:
        held = b"".join(self._held)
        self._held.clear()
        self._held_bytes = 0
        return held


@attrs.frozen
class ModelHeader:
    """A reader (answer.py): the answer's ``x-steward-model`` header names *model*, whatever the answer."""

    model: str

    @property
    def reading(self) -> bool:
        return False

    def start(self, head: AnswerHead) -> AnswerHead:
        return attrs.evolve(head, headers=[*head.headers, (b"x-steward-model", self.model.encode())])

    def body(self, chunk: bytes, more: bool) -> Passed:
        return None, chunk

    def end(self) -> Passed:
        return NOTHING_HELD


def _framing_of(head: AnswerHead) -> _Framing:
    if head.status != 200:
        return _Framing.AS_IS
    if head.framing is Framing.JSON:
        return _Framing.JSON
    if head.framing is Framing.EVENT_STREAM and not head.length_declared:
        return _Framing.EVENTS
    return _Framing.AS_IS


def _renamed_event(event: bytes, model: str) -> bytes:
    """*event* (without its blank line) with its one ``data:`` line's object renamed, if it has one."""
    if b'"model"' not in event:
        return event  # most of a stream: nothing to parse
    lines = event.split(b"\n")
    data = [number for number, line in enumerate(lines) if line.startswith(b"data:")]
    if len(data) != 1:
        return event  # JSON across several data lines: no engine sends that
    line = lines[data[0]]
    value = line[5:].removesuffix(b"\r")
    renamed = _renamed(value, model)
    if renamed is None:
        return event
    lines[data[0]] = (b"data: " if value.startswith(b" ") else b"data:") + renamed + line[5 + len(value):]
    return b"\n".join(lines)


def _renamed(text: bytes, model: str) -> bytes | None:
    """The JSON object *text* with its top-level ``"model"`` set to *model*; None to keep *text* as it is."""
    try:
        value = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    holder = _model_holder(value)
    if holder is None or holder["model"] == model:
        return None
    holder["model"] = model  # in its place: the keys keep their order
    return json_bytes(value)


def _model_holder(value: Any) -> dict[str, Any] | None:
    """The object whose ``model`` names the model: the answer itself, or the message (Anthropic's
    ``message_start``) or response (the Responses API's events) it carries."""
    if not isinstance(value, dict):
        return None
    if "model" in value:
        return value
    for key in _NESTED_HOLDERS:
        if isinstance(value.get(key), dict) and "model" in value[key]:
            return value[key]
    return None


_NESTED_HOLDERS = ("message", "response")

