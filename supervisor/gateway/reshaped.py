"""Answers read or rewritten on their way to a client of another API's family.

* ``ErrorsReshaped``: an engine's error object (llama-server's ``{"error": {"code", "message",
  "type"}}``) rewritten in the route's shape, so that an Anthropic client on /v1/messages
  always gets Anthropic's ``{"type": "error", "error": {...}}``, with the engine's status and
  message. Only an error answer (status >= 400, JSON, at most ``MAX_ERROR_BYTES``) is held
  and rewritten; everything else goes through as it came.
* ``MessagesUsageRead``: a Messages stream's token counts, which it gives in two events
  (``message_start``: the input, ``message_delta``: the output), for the usage log.

``reading_answer`` puts in place what a route's answer needs, the same on every listener.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs

from supervisor.apis import Api
from supervisor.gateway.api_routes import ApiRoute
from supervisor.gateway.asgi import Send
from supervisor.gateway.errors import ErrorShape, error_headers
from supervisor.gateway.sse import EVENT_END, event_data
from supervisor.gateway.stream_start import OPENING, StreamOpened
from supervisor.gateway.stream_usage import UsageChunkKept

Counted = Callable[[int | None, int | None], None]  # (prompt, completion) tokens

MAX_ERROR_BYTES = 64 * 1024
# Anthropic counts cached input apart from the rest; the usage log's prompt is all of it.
_INPUT_FIELDS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


def reading_answer(send: Send, route: ApiRoute, counted: Counted, *, keep_usage_chunk: bool, stream: bool,
                   model: str | None = None) -> Send:
    """*send* with what reads the answer on its way: the usage it carries (the usage chunk steward
    asked for, a Messages stream's two counts), errors in the route's words (Anthropic's), and a
    Messages or Responses stream's opening event where the engine left it out (stream_start.py)."""
    if not route.does_work:
        counted(0, 0)  # the answer's input_tokens is what it counted, not what it computed
    if stream and route.api in OPENING:
        send = StreamOpened(send, route.api, model or "")  # nearest the client: the usage read sees the engine's
    if keep_usage_chunk:
        send = UsageChunkKept(send, counted)
    if route.api is Api.MESSAGES and stream:
        send = MessagesUsageRead(send, counted)
    if route.anthropic:
        send = ErrorsReshaped(send, route.error_shape)
    return send


@attrs.define(eq=False)
class ErrorsReshaped:
    send: Send
    shape: ErrorShape
    _start: dict[str, Any] | None = None  # an error answer's start, held until its body is whole
    _held: list[bytes] = attrs.Factory(list)

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and _is_error(message):
            self._start = message
            return
        if message["type"] == "http.response.body" and self._start is not None:
            self._held.append(message.get("body", b""))
            if message.get("more_body", False) and sum(map(len, self._held)) <= MAX_ERROR_BYTES:
                return
            await self._flush(message.get("more_body", False))
            return
        await self.send(message)

    async def _flush(self, more: bool) -> None:
        assert self._start is not None
        start, body = self._start, b"".join(self._held)
        self._start, self._held = None, []
        status = start["status"]
        message = None if more else _error_message(body)
        if message is None:  # not an error object we can read (or too large): as it came
            await self.send(start)
            await self.send({"type": "http.response.body", "body": body, "more_body": more})
            return
        body = self.shape(status, message)
        # The engine's other headers stay (its Server names who answered); the body's are new.
        kept = [(k, v) for k, v in start.get("headers", ()) if k not in (b"content-type", b"content-length")]
        await self.send({**start, "headers": kept + error_headers(body)})
        await self.send({"type": "http.response.body", "body": body, "more_body": False})


def _is_error(start: dict[str, Any]) -> bool:
    content_type = next((v for k, v in start.get("headers", ()) if k == b"content-type"), b"")
    return start["status"] >= 400 and content_type.startswith(b"application/json")


def _error_message(body: bytes) -> str | None:
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    error = value.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]  # OpenAI's, llama-server's, Anthropic's own
    if isinstance(error, str):
        return error  # Ollama's, whisper.cpp's
    return None


@attrs.define(eq=False)
class MessagesUsageRead:
    send: Send
    counted: Counted
    _streaming: bool = False
    _prompt: int | None = None
    _completion: int | None = None

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            content_type = next((v for k, v in message.get("headers", ()) if k == b"content-type"), b"")
            self._streaming = message["status"] == 200 and content_type.startswith(b"text/event-stream")
        elif message["type"] == "http.response.body" and self._streaming and b'"usage"' in message.get("body", b""):
            for event in EVENT_END.split(message["body"]):
                self._read(event)
        await self.send(message)

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
