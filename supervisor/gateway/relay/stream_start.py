"""A Messages or Responses stream that began without its opening event, opened by steward.

llama-server sends a Messages stream's ``message_start`` only with the partial result of
token 1 (server-task.cpp: ``n_decoded == 1``), and holds a token back while the text ends
in half a character (server-context.cpp, ``process_token``). An answer whose first token
is half a character (an emoji or an accented letter in byte tokens) therefore never gets
its ``message_start``; an answer with no whole character at all (``max_tokens`` reached
mid-character) has only the final events, a Responses stream then no ``response.created``
either. The official clients' stream helpers fail on such a stream: anthropic's
``get_final_message()`` has no message to build on, and openai's ``responses.stream()``
raises "Expected to have received `response.created`".

``StreamOpened`` reads a stream up to its first event with data. When that is not the
opening one (nor a Messages error, which stays as it came: Anthropic's clients raise on it
whatever came before), the opening events go first, in llama-server's own shape (the
response's id taken from that event where it has one, so that the client's check of the
response's identity holds); the rest goes through as it came. An event whose data begins
with its ``type`` (every engine's, and Anthropic's) is told by that, unparsed: the opening
event is parsed once, by whoever reads it for what it carries (its usage, its response).
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

import attrs

from supervisor.apis import Api
from supervisor.gateway.relay.answer import NOTHING_HELD, AnswerHead, Passed
from supervisor.gateway.relay.sse import EVENT_END, event_data, json_events

# How much is held while looking for the first event; past it the stream goes as it came.
MAX_HELD = 64 * 1024
OPENING = {Api.MESSAGES: ("message_start",), Api.RESPONSES: ("response.created", "response.queued")}
# The type an event's data begins with (an escaped quote would be inside the string: none in a type).
_LEADING_TYPE = re.compile(rb'\{\s*"type"\s*:\s*"([^"\\]*)"\s*[,}]')


@attrs.define(eq=False)
class StreamOpened:
    """A reader (answer.py): a Messages or Responses stream opened where the engine did not."""

    api: Api  # MESSAGES or RESPONSES
    model: str  # what a synthesized message_start names
    reading: bool = False  # an event stream whose first event has not been read yet
    _held: bytearray = attrs.Factory(bytearray)

    def start(self, head: AnswerHead) -> AnswerHead:
        self.reading = head.event_stream
        return head

    def body(self, chunk: bytes, more: bool) -> Passed:
        if not self.reading:
            return None, chunk
        self._held += chunk
        first = self._first_event(bytes(self._held))
        if first is None and more and len(self._held) <= MAX_HELD:
            return NOTHING_HELD
        body, self.reading = bytes(self._held), False
        self._held.clear()
        return None, (b"" if first is None else self._opening(first, body)) + body

    def end(self) -> Passed:
        return NOTHING_HELD

    def _first_event(self, stream: bytes) -> dict[str, Any] | None:
        """The data of the first whole event that has data (comments and pings pass over): {} when
        it is not a JSON object; None: none is whole yet. Data that begins with a type that leaves
        the stream as it came is not parsed: ``{"type": ...}`` is all that is read of it."""
        *whole, _rest = EVENT_END.split(stream)
        for event in whole:
            data = event_data(event)
            if data is None:
                continue
            leading = _LEADING_TYPE.match(data)
            if leading is not None and self._opened(kind := leading.group(1).decode("latin-1")):
                return {"type": kind}
            try:
                value = json.loads(data)
            except (ValueError, UnicodeDecodeError, RecursionError):
                return {}
            return value if isinstance(value, dict) else {}
        return None

    def _opened(self, kind: str) -> bool:
        return kind in OPENING[self.api] or (kind == "error" and self.api is Api.MESSAGES)

    def _opening(self, first: dict[str, Any], held: bytes) -> bytes:
        kind = first.get("type")
        if not first or self._opened(kind):  # type: ignore[arg-type]
            return b""  # opened already, a Messages error, or data we cannot read: as it came
        # A Responses error first is opened too: the openai SDK's stream helper reads no event before
        # response.created (it raises "Expected to have received `response.created` before `error`").
        if self.api is Api.MESSAGES:
            return frame("message_start", {"type": "message_start", "message": {
                "id": "msg_" + secrets.token_hex(16), "type": "message", "role": "assistant", "content": [],
                "model": self.model, "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 0}}})
        known = response_id(held)  # the first event's, or a response.failed's that follows an error
        status = {"id": known if known is not None else "resp_" + secrets.token_hex(16),
                  "object": "response", "status": "in_progress"}
        return b"".join(frame(kind, {"type": kind, "response": status})
                        for kind in ("response.created", "response.in_progress"))


def response_id(stream: bytes) -> str | None:
    """The id of the first response object among the whole events of *stream* that have one."""
    for value in json_events(stream, b'"response"'):
        response = value.get("response")
        if isinstance(response, dict) and isinstance(response.get("id"), str):
            return response["id"]
    return None


def frame(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"
