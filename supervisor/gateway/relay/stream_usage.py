"""Token counts for streamed answers whose clients did not ask for them.

An OpenAI-style stream carries its usage only when the request says
``stream_options.include_usage`` (llama-server and vLLM alike), and the usage log wants the
tokens of every request. So steward asks for it, and keeps the extra chunk it brings
(``"choices": []`` with the ``usage``) from a client that did not ask: that client gets the
stream it would have got without steward (research/protocols.md, "include_usage").

Nothing is buffered: a body message without ``"usage"`` in it (all but the last) goes through
as it came; only the one that holds it is split into its events and looked at.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs

from supervisor.gateway.http.asgi import Send
from supervisor.gateway.relay.sse import EVENT_END


def ask_for_usage(payload: dict[str, Any]) -> bool:
    """Ask a streamed request's server for its usage chunk; True if steward asked (the client did not)."""
    if payload.get("stream") is not True:
        return False
    options = payload.get("stream_options")
    if options is None:
        payload["stream_options"] = {"include_usage": True}
        return True
    if isinstance(options, dict) and "include_usage" not in options:
        options["include_usage"] = True
        return True
    return False  # the client said what it wants, either way


@attrs.define(eq=False)
class UsageChunkKept:
    """A send that takes the usage-only chunk out of an SSE answer and hands its counts to *counted*."""

    send: Send
    counted: Callable[[int | None, int | None], None]  # (prompt, completion) tokens
    _streaming: bool = False

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            content_type = next((v for k, v in message.get("headers", ()) if k == b"content-type"), b"")
            self._streaming = message["status"] == 200 and content_type.startswith(b"text/event-stream")
        elif message["type"] == "http.response.body" and self._streaming and b'"usage"' in message.get("body", b""):
            message = {**message, "body": self._without_usage_chunk(message["body"])}
            if not message["body"] and message.get("more_body", False):
                return  # nothing left of it to send
        await self.send(message)

    def _without_usage_chunk(self, body: bytes) -> bytes:
        kept = []
        start = 0
        for end in EVENT_END.finditer(body):
            event = body[start:end.end()]
            start = end.end()
            if not self._is_usage_chunk(event):
                kept.append(event)
        kept.append(body[start:])  # an event cut across two messages stays as it is
        return b"".join(kept)

    def _is_usage_chunk(self, event: bytes) -> bool:
        line = event.strip()
        if not line.startswith(b"data:") or b'"usage"' not in line:
            return False
        try:
            chunk = json.loads(line[5:])
        except (ValueError, UnicodeDecodeError, RecursionError):
            return False
        if not isinstance(chunk, dict) or chunk.get("choices") != [] or not isinstance(chunk.get("usage"), dict):
            return False
        usage = chunk["usage"]
        self.counted(_count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")))
        return True


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
