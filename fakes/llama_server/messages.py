"""Anthropic's Messages API (``/v1/messages``) the way llama-server serves it.

llama-server turns the request into a chat request: ``system`` (a string or text blocks)
becomes a system message, a message's text blocks its text, ``tool_result`` blocks tool
messages, and ``max_tokens`` defaults to 4096 (Anthropic requires it, llama-server does not).
Quirks kept: a missing ``messages`` is a 500 (llama-server throws a runtime_error, not an
invalid_argument); a ``messages`` that is not a list is an empty conversation, answered 200.

The answer: ``stop_reason`` is ``max_tokens`` when the budget ran out and ``end_turn`` when the
model finished; usage is ``cache_read_input_tokens`` (the fake caches nothing: 0),
``input_tokens`` (the prompt minus the cached part) and ``output_tokens``. Without
``max_tokens`` the fake model finishes by itself after ``--max-tokens-default`` tokens (then an
end-of-generation token), as a real model does long before 4096 tokens: ``end_turn``.

A stream is named events, no ``ping`` and no ``[DONE]``: ``message_start`` (with token 1's
event only, so none at all when token 1 was half a character), ``content_block_start`` with
the first text, ``content_block_delta`` per token, ``content_block_stop``, ``message_delta``
(stop_reason, usage.output_tokens), ``message_stop``. A mid-stream error is
``event: error`` with the bare error object. ``/v1/messages/count_tokens`` counts the prompt.
"""

from __future__ import annotations

from typing import Any

import attrs

from fakes.anthropic_events import text_piece_events
from fakes.llama_server.cli import Config
from fakes.llama_server.errors import server_error
from fakes.llama_server.formats import Finish, NamedEvents, Outcome, sse_event, token_piece
from fakes.llama_server.parsing import Job, build_job, conversation

DEFAULT_MAX_TOKENS = 4096  # llama-server's when the request has none
_STOP_REASONS = {Finish.LENGTH: "max_tokens", Finish.STOP: "end_turn"}


def messages_job(body: dict[str, Any], cfg: Config) -> Job:
    prompt_text, n_prompt = conversation(messages_conversation(body))
    # Only these survive llama-server's conversion (n_predict, sse_ping_interval, ... do not).
    chat = {"max_tokens": body.get("max_tokens", DEFAULT_MAX_TOKENS), "stream": body.get("stream", False)}
    job = build_job(chat, cfg, prompt_text, n_prompt)
    if "max_tokens" not in body:
        job = attrs.evolve(job, answer=tuple(token_piece(i) for i in range(cfg.max_tokens_default)))
    return job


def count_tokens(body: dict[str, Any]) -> dict[str, Any]:
    """``/v1/messages/count_tokens``: no ``object`` field, unlike the OpenAI counters."""
    _, n_prompt = conversation(messages_conversation(body))
    return {"input_tokens": n_prompt}


# --------------------------------------------------------------------------- the request


def messages_conversation(body: dict[str, Any]) -> list[str]:
    """The texts of the chat messages llama-server makes of a Messages request."""
    texts = []
    if body.get("system") is not None:
        texts.append(_system_text(body["system"]))
    if "messages" not in body:
        raise server_error("'messages' is required")
    messages = body["messages"]
    for message in messages if isinstance(messages, list) else []:
        texts += _message_texts(message)
    return texts


def _string(value: object) -> str:
    return value if isinstance(value, str) else ""


def _blocks(value: object, kind: str) -> list[dict[str, Any]]:
    return [b for b in value if isinstance(b, dict) and b.get("type") == kind] if isinstance(value, list) else []


def _system_text(system: object) -> str:
    if isinstance(system, str):
        return system
    return "".join(_string(block.get("text")) for block in _blocks(system, "text"))


def _message_texts(message: object) -> list[str]:
    """A message's text, then one text per tool result (each becomes a tool message)."""
    if not isinstance(message, dict):
        return [""]  # kept as it is
    if "content" not in message:
        return [] if message.get("role") == "assistant" else [""]
    content = message["content"]
    if not isinstance(content, list):
        return [_string(content)]
    texts = [_string(block.get("text")) for block in _blocks(content, "text")]
    images = [b for b in _blocks(content, "image")
              if isinstance(b.get("source"), dict) and b["source"].get("type") in ("base64", "url")]
    tool_calls = _blocks(content, "tool_use")
    reasoning = [b for b in _blocks(content, "thinking") if _string(b.get("thinking"))]
    own = [" ".join(texts)] if texts or images or tool_calls or reasoning else []
    return own + [_tool_result_text(block.get("content")) for block in _blocks(content, "tool_result")]


def _tool_result_text(content: object) -> str:
    if isinstance(content, str):
        return content
    return "".join(_string(block.get("text")) for block in _blocks(content, "text"))


# --------------------------------------------------------------------------- the answer


@attrs.define(eq=False)
class MessagesFormat(NamedEvents):
    """An Anthropic message, streamed as named events."""

    cmpl_id: str
    model: str
    n_prompt: int
    text_started: bool = False
    ends_with_done = False

    def _usage(self, n_output: int) -> dict[str, int]:
        return {"cache_read_input_tokens": 0, "input_tokens": self.n_prompt, "output_tokens": n_output}

    def token_events(self, piece: str, n_decoded: int, slot_id: int) -> list[dict[str, Any]]:
        events = []
        if n_decoded == 1:
            events.append({"type": "message_start", "message": {
                "id": self.cmpl_id, "type": "message", "role": "assistant", "content": [], "model": self.model,
                "stop_reason": None, "stop_sequence": None, "usage": self._usage(0)}})
        events += text_piece_events(piece, first=not self.text_started)
        self.text_started = True
        return events

    def final_events(self, out: Outcome) -> list[dict[str, Any]]:
        events = [{"type": "content_block_stop", "index": 0}] if out.text else []
        return [*events,
                {"type": "message_delta", "delta": {"stop_reason": _STOP_REASONS[out.finish_reason],
                                                    "stop_sequence": None},
                 "usage": {"output_tokens": out.n_decoded}},
                {"type": "message_stop"}]

    def response(self, out: Outcome) -> dict[str, Any]:
        return {"id": self.cmpl_id, "type": "message", "role": "assistant",
                "content": [{"type": "text", "text": out.text}] if out.text else [], "model": self.model,
                "stop_reason": _STOP_REASONS[out.finish_reason], "stop_sequence": None,
                "usage": self._usage(out.n_decoded)}

    def frame_error(self, body: dict[str, Any]) -> bytes:
        return sse_event("error", body["error"])
