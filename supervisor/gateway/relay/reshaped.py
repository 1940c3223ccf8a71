"""Answers read or rewritten on their way to a client of another API's family.

* ``errors_reshaped``: an engine's error object (llama-server's ``{"error": {"code", "message",
  "type"}}``) rewritten in the route's shape, so that an Anthropic client on /v1/messages
  always gets Anthropic's ``{"type": "error", "error": {...}}``, with the engine's status and
  message. Only an error answer (status >= 400, JSON, at most conforming.py's ``MAX_ERROR_BYTES``)
  is held and rewritten, by the reader that puts OpenAI's errors right on the other routes;
  everything else goes through as it came.
* ``StreamErrorsReshaped``: the same inside a Messages or Responses stream that began as a 200:
  an engine's error event (llama-server's ``data: {"error": ...}``, or its Messages ``event: error``
  with the bare error object) becomes that API's own ``error`` event, which Anthropic's and
  OpenAI's clients (the SDKs, Claude Code, Codex CLI) read; a stream that ends without its last
  event (Ollama's, when the model fails mid-answer) gets one too.
  Both tell the request's ``Exchange`` the engine's own error before it is reshaped: the usage
  row records the engine's code, not the type the client got (stream_errors.py has the rule).
* a context refusal (llama-server's 400 ``exceed_context_size_error``) of a model whose slot config
  is known is said in steward's words on every route (context_refusal.py) before it is shaped.
* ``MessagesUsageRead``: a Messages stream's token counts, which it gives in two events
  (``message_start``: the input, ``message_delta``: the output), for the usage log.

``reading_answer`` puts in place what a route's answer needs, the same on every listener: the
readers (answer.py) on the client's ``AnswerTap``.
"""

from __future__ import annotations

import functools
import json
import re
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from supervisor.apis import Api
from supervisor.gateway.openai.api_routes import ApiRoute
from supervisor.gateway.http.asgi import Send
from supervisor.gateway.door import Exchange
from supervisor.gateway.relay.answer import NOTHING_HELD, AnswerHead, AnswerTap, Passed, Reader
from supervisor.gateway.relay.answer_model import ModelHeader
from supervisor.gateway.errors import (
    ErrorShape,
    anthropic_error_event,
    responses_error_event,
    responses_failed_event,
)
from supervisor.gateway.openai.speech import read_speech
from supervisor.gateway.relay.speech_audio import AudioMeasured
from supervisor.gateway.relay.sse import EVENT_END, WholeEvents, event_data, event_name, json_bytes, json_events
from supervisor.gateway.relay.stream_errors import ENGINE_ERROR, Failure, failure_of_event
from supervisor.gateway.relay.context_refusal import ContextWall
from supervisor.gateway.relay.conforming import (
    AnswerConformed,
    ErrorWriter,
    Fix,
    Noted,
    chunks_conformed,
    conformed_chat,
    conformed_completion,
    openai_error,
)
from supervisor.gateway.relay.responses_events import (
    NO_ECHO,
    conformed_response,
    request_echo,
    response_events_conformed,
)
from supervisor.gateway.relay.stream_start import OPENING, StreamOpened
from supervisor.gateway.relay.stream_usage import UsageChunkKept

Counted = Callable[[int | None, int | None], None]  # (prompt, completion) tokens

# Anthropic counts cached input apart from the rest; the usage log's prompt is all of it.
_INPUT_FIELDS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


def reading_answer(send: Send, route: ApiRoute, exchange: Exchange, *, keep_usage_chunk: bool, stream: bool,
                   model: str | None = None, context: ContextWall | None = None,
                   request: Mapping[str, Any] | None = None, fallback: bool = False) -> AnswerTap:
    """The tap on *send* with what reads the answer on its way: the usage it carries (the usage chunk
    steward asked for, a Messages stream's two counts), errors in the route's words (Anthropic's, and
    the error events of Messages and Responses streams), a Messages or Responses stream's opening
    event where the engine left it out (stream_start.py), and what OpenAI's spec requires of an
    answer, its stream's events and its errors where the engine left it out (conforming.py,
    responses_events.py). What it reads goes to *exchange*. Only what the route needs is on it:
    a chat stream whose client asked for its usage reads only the events that hold an error.
    *context*: the model's slot config, which a context refusal is explained by (context_refusal.py);
    *request*: the request's JSON object, whose settings a Responses answer repeats; *fallback*: *model*
    is a fallback of the one asked for (scheduler rule 11), which the ``x-steward-model`` header says."""
    counted = exchange.count_tokens
    if not route.does_work:
        counted(0, 0)  # the answer's input_tokens is what it counted, not what it computed
    readers: list[Reader] = []  # from the upstream's side: the usage is read before the stream is opened
    if stream and route.api in STREAM_ENDS:
        readers.append(StreamErrorsReshaped(route.api, exchange.engine_failed, model or ""))
    errors: ErrorWriter = functools.partial(_reshaped_error, route.error_shape) if route.anthropic else openai_error
    if context is not None:
        errors = functools.partial(_context_explained, errors, context, route.api, exchange)
    echo = request_echo(request) if route.api is Api.RESPONSES else NO_ECHO
    readers.append(AnswerConformed(None if route.anthropic else _whole_fix(route, model or "", echo),
                                   exchange.engine_failed, errors=errors))
    if route.api is Api.SPEECH and (speech := read_speech(request)) is not None:
        readers.append(AudioMeasured(speech, exchange.count_audio))
    if route.api is Api.MESSAGES and stream:
        readers.append(MessagesUsageRead(counted))
    if keep_usage_chunk:
        readers.append(UsageChunkKept(counted))
    if stream and route.api in _CHUNK_FIXES:
        readers.append(chunks_conformed(_CHUNK_FIXES[route.api], exchange.engine_failed))
    if stream and route.api in OPENING:
        readers.append(StreamOpened(route.api, model or ""))  # nearer the client: the usage read sees the engine's
    if stream and route.api is Api.RESPONSES:
        readers.append(response_events_conformed(model or "", echo))  # nearest: it numbers every event sent
    if fallback and model is not None:
        readers.append(ModelHeader(model))
    return AnswerTap(send, readers)


# What a stream's chunks need (conforming.py): a chat stream only its error events put right.
_CHUNK_FIXES: dict[Api, Fix | None] = {Api.CHAT: None, Api.COMPLETIONS: conformed_completion}


def _whole_fix(route: ApiRoute, model: str, echo: Mapping[str, Any]) -> Fix | None:
    """How a route's whole JSON answer is put right (conforming.py); None: only its errors are."""
    if not route.does_work:
        return None  # a count of tokens: no answer of the API's
    if route.api is Api.CHAT:
        return conformed_chat
    if route.api is Api.COMPLETIONS:
        return conformed_completion
    if route.api is Api.RESPONSES:
        return lambda answer: conformed_response(answer, model=model, created_at=int(time.time()), echo=echo)
    return None


def errors_reshaped(shape: ErrorShape, noted: Noted = lambda failure: None) -> AnswerConformed:
    """A reader: an engine's error answer in the route's *shape* (see the module docstring)."""
    return AnswerConformed(None, noted, errors=functools.partial(_reshaped_error, shape))


def _context_explained(errors: ErrorWriter, context: ContextWall, api: Api, exchange: Exchange, status: int,
                       value: dict[str, Any]) -> bytes | None:
    """*errors*, for a context refusal in steward's words (context_refusal.py)."""
    explained = context.explained(status, value, api=api, request_id=exchange.request_id, klass=exchange.klass)
    if explained is None:
        return errors(status, value)
    return errors(status, explained) or json_bytes(explained)  # None: it is in OpenAI's shape already


def _reshaped_error(shape: ErrorShape, status: int, value: dict[str, Any]) -> bytes | None:
    message = _error_message(value)
    return None if message is None else shape(status, message)


def _error_message(value: dict[str, Any]) -> str | None:
    error = value.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]  # OpenAI's, llama-server's, Anthropic's own
    if isinstance(error, str):
        return error  # Ollama's, whisper.cpp's
    return None


# The event a whole Messages or Responses stream ends on; an escaped quote is inside a string.
STREAM_ENDS = {Api.MESSAGES: re.compile(rb'(?<!\\)"type":\s*"message_stop"'),
               Api.RESPONSES: re.compile(rb'(?<!\\)"type":\s*"response\.(completed|incomplete|failed)"')}
# The Responses API numbers its events: an error event steward writes goes on from the last.
_SEQUENCE = re.compile(rb'(?<!\\)"sequence_number":\s*(\d{1,12})')
MAX_HELD_EVENT = 64 * 1024  # an event begun but not ended is held up to this; past it, it goes as it comes


@attrs.define(eq=False)
class StreamErrorsReshaped:
    """Error events in a Messages or Responses stream, in that API's words (see the module docstring).

    Nothing is buffered but the start of an event whose end has not come yet (engines write
    whole events, so that is seldom anything); only a part that holds the word ``error`` is
    split into its events, and only an event that is an error is parsed."""

    api: Api  # MESSAGES or RESPONSES
    noted: Noted
    model: str = ""  # what a response that failed before its response.created names
    reading: bool = False  # a 200 event stream
    _response: dict[str, Any] | None = None  # a Responses stream's own, from its response.created
    _events: WholeEvents = attrs.Factory(lambda: WholeEvents(MAX_HELD_EVENT))
    _ended: bool = False  # its last event, or an error event, went by
    _sequence: int | None = None  # the last sequence_number seen (Responses)

    def start(self, head: AnswerHead) -> AnswerHead:
        self.reading = head.event_stream
        return head

    def body(self, chunk: bytes, more: bool) -> Passed:
        # Nothing passed on, with more to come: all of it held, the rest of its event is still to come.
        return (None, self._read(chunk, more)) if self.reading else (None, chunk)

    def end(self) -> Passed:
        return NOTHING_HELD

    def _read(self, chunk: bytes, more: bool) -> bytes:
        whole = self._events.whole(chunk, more)
        if STREAM_ENDS[self.api].search(whole):
            self._ended = True
        if self.api is Api.RESPONSES and self._response is None and b"response.created" in whole:
            self._response = _created_response(whole)
        if b"error" in whole:
            out = self._reshaped(whole)
        else:
            out = whole
            self._number(whole)
        if not more and not self._ended:
            last = "message_stop" if self.api is Api.MESSAGES else "response.completed"
            out += self._error_event(Failure(502, ENGINE_ERROR, f"The engine ended the stream before its end "
                                                               f"(no {last}): it failed during the answer."))
        return out

    def _reshaped(self, whole: bytes) -> bytes:
        out, start = bytearray(), 0
        for end in [*EVENT_END.finditer(whole), None]:
            event = whole[start:end.start()] if end is not None else whole[start:]
            separator = whole[end.start():end.end()] if end is not None else b""
            start = end.end() if end is not None else len(whole)
            failure = failure_of_event(event) if b"error" in event else None
            if failure is None or self._in_own_words(event):
                out += event + separator
                self._number(event)
                self._ended = self._ended or failure is not None
            else:
                out += self._error_event(failure)
        return bytes(out)

    def _number(self, events: bytes) -> None:
        if self.api is Api.RESPONSES and (numbers := _SEQUENCE.findall(events)):
            self._sequence = int(numbers[-1])

    def _in_own_words(self, event: bytes) -> bool:
        """An error event already as this API's clients read it (Anthropic's, or steward's own numbered one)."""
        value = json.loads(event_data(event) or b"null")  # read whole once already: an error event
        if not isinstance(value, dict):
            return False
        if self.api is Api.RESPONSES and value.get("type") == "response.failed":
            return True  # the Responses API's own end of a failed response
        named = event_name(event) == b"error"  # Anthropic's clients raise on this event, by its name
        if self.api is Api.MESSAGES:
            return named and value.get("type") == "error" and isinstance(value.get("error"), dict)
        number = value.get("sequence_number")
        return (named and value.get("type") == "error" and isinstance(value.get("message"), str)
                and isinstance(number, int) and (self._sequence is None or number > self._sequence))

    def _error_event(self, failure: Failure) -> bytes:
        self.noted(failure)
        self._ended = True
        message = failure.message or f"The engine failed during the answer ({failure.code})."
        if self.api is Api.MESSAGES:
            return anthropic_error_event(failure.status, message)
        self._sequence = 0 if self._sequence is None else self._sequence + 1
        error = responses_error_event(message, code=failure.code, sequence_number=self._sequence)
        self._sequence += 1
        return error + responses_failed_event(self._response or self._new_response(), message,
                                              sequence_number=self._sequence)

    def _new_response(self) -> dict[str, Any]:
        """A response object for a stream that failed before the engine sent one (its required fields)."""
        return {"id": "resp_" + secrets.token_hex(16), "object": "response", "created_at": int(time.time()),
                "model": self.model, "output": [], "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}


def _created_response(events: bytes) -> dict[str, Any] | None:
    """The response object of the ``response.created`` event among *events*, if one is whole there."""
    for value in json_events(events, b"response.created"):
        if value.get("type") == "response.created" and isinstance(value.get("response"), dict):
            return value["response"]
    return None


@attrs.define(eq=False)
class MessagesUsageRead:
    """A reader: a Messages stream's token counts, from its ``message_start`` and ``message_delta``."""

    counted: Counted
    reading: bool = False  # a 200 event stream
    _prompt: int | None = None
    _completion: int | None = None

    def start(self, head: AnswerHead) -> AnswerHead:
        self.reading = head.event_stream
        return head

    def body(self, chunk: bytes, more: bool) -> Passed:
        if self.reading and b'"usage"' in chunk:
            for event in EVENT_END.split(chunk):
                self._read(event)
        return None, chunk

    def end(self) -> Passed:
        return NOTHING_HELD

    def _read(self, event: bytes) -> None:
        data = event_data(event)
        if data is None or b'"usage"' not in data:
            return
        try:
            value = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return  # an event cut across two messages: the door's own reading of the tail remains
        if not isinstance(value, dict):
            return
        holder = value.get("message") if value.get("type") == "message_start" else value
        usage = holder.get("usage") if isinstance(holder, dict) else None
        if not isinstance(usage, dict):
            return
        inputs = [usage[field] for field in _INPUT_FIELDS if _is_count(usage.get(field))]
        if inputs:
            self._prompt = sum(inputs)
        if _is_count(usage.get("output_tokens")):
            self._completion = usage["output_tokens"]
        self.counted(self._prompt, self._completion)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
