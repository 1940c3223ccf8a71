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

from supervisor.gateway.relay.answer import NOTHING_HELD, AnswerHead, Passed
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
    """A reader (answer.py) that takes the usage-only chunk out of an SSE answer and hands its
    counts to *counted*; a message left empty, with more to come, is not sent at all."""

    counted: Callable[[int | None, int | None], None]  # (prompt, completion) tokens
    reading: bool = False  # a 200 event stream

    def start(self, head: AnswerHead) -> AnswerHead:
        self.reading = head.event_stream
        return head

    def body(self, chunk: bytes, more: bool) -> Passed:
        if self.reading and b'"usage"' in chunk:
            return None, self._without_usage_chunk(chunk)
        return None, chunk

    def end(self) -> Passed:
        return NOTHING_HELD

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
