"""Anthropic's Messages API (``/v1/messages``) the way llama-server serves it.

llama-server turns the request into a chat request: ``system`` (a string or text blocks)
becomes a system message, a message's text blocks its text, ``tool_result`` blocks tool
messages, ``tool_use`` blocks the assistant's tool calls, ``tools`` function tools (``input_schema``
their parameters), ``tool_choice`` ``any`` and ``tool`` "required" (the fake calls the named
tool), and ``max_tokens`` defaults to 4096 (Anthropic requires it, llama-server does not).
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
(stop_reason, usage.output_tokens), ``message_stop``. A tool call is a ``tool_use`` block
(``stop_reason`` ``tool_use``); streamed, its ``content_block_start`` names the tool (id and name,
no ``input``) and each piece of the arguments is an ``input_json_delta``. A mid-stream error is
``event: error`` with the bare error object. ``/v1/messages/count_tokens`` counts the prompt.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from fakes.anthropic_events import text_piece_events
from fakes.chat_template import Chat, ChatMessage, ToolCall, ToolChoice, function_tool, text_of
from fakes.llama_server.cli import Config
from fakes.llama_server.errors import server_error
from fakes.llama_server.formats import Finish, NamedEvents, Outcome, sse_event
from fakes.llama_server.parsing import Job, chat_job, default_reply

DEFAULT_MAX_TOKENS = 4096  # llama-server's when the request has none
_STOP_REASONS = {Finish.LENGTH: "max_tokens", Finish.STOP: "end_turn", Finish.TOOL_CALLS: "tool_use"}


def messages_job(body: dict[str, Any], cfg: Config) -> Job:
    # Only these survive llama-server's conversion (n_predict, sse_ping_interval, ... do not).
    chat = {"max_tokens": body.get("max_tokens", DEFAULT_MAX_TOKENS), "stream": body.get("stream", False)}
    job = chat_job(messages_chat(body), chat, cfg)
    if "max_tokens" not in body and job.answer is None:
        job = attrs.evolve(job, answer=default_reply(cfg))
    return job


def count_tokens(body: dict[str, Any]) -> dict[str, Any]:
    """``/v1/messages/count_tokens``: no ``object`` field, unlike the OpenAI counters."""
    return {"input_tokens": messages_chat(body).n_tokens}


# --------------------------------------------------------------------------- the request


def messages_chat(body: dict[str, Any]) -> Chat:
    """The chat llama-server makes of a Messages request."""
    messages = []
    if body.get("system") is not None:
        messages.append(ChatMessage("system", _system_text(body["system"])))
    if "messages" not in body:
        raise server_error("'messages' is required")
    given = body["messages"]
    for message in given if isinstance(given, list) else []:
        messages += _chat_messages(message)
    tools = body.get("tools")
    return Chat(tuple(messages),
                tuple(function_tool(t.get("name"), t.get("description"), t.get("input_schema"))
                      for t in tools if isinstance(t, dict)) if isinstance(tools, list) else (),
                _tool_choice(body.get("tool_choice")))


def _tool_choice(value: object) -> ToolChoice:
    """``{"type": "auto" | "any" | "tool" | "none"}``; llama-server makes ``any`` and ``tool`` "required"."""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "tool" and isinstance(value, dict) and isinstance(value.get("name"), str):
        return ToolChoice("required", value["name"])
    return ToolChoice("required") if kind in ("any", "tool") else ToolChoice("none" if kind == "none" else "auto")


def _string(value: object) -> str:
    return value if isinstance(value, str) else ""


def _blocks(value: object, kind: str) -> list[dict[str, Any]]:
    return [b for b in value if isinstance(b, dict) and b.get("type") == kind] if isinstance(value, list) else []


def _system_text(system: object) -> str:
    if isinstance(system, str):
        return system
    return "".join(_string(block.get("text")) for block in _blocks(system, "text"))


def _chat_messages(message: object) -> list[ChatMessage]:
    """A message (its text and tool calls), then one tool message per tool result."""
    if not isinstance(message, dict):
        return [ChatMessage("user")]  # kept as it is
    role = _string(message.get("role")) or "user"
    if "content" not in message:
        return [] if role == "assistant" else [ChatMessage(role)]
    content = message["content"]
    if not isinstance(content, list):
        return [ChatMessage(role, _string(content))]
    images = [b for b in _blocks(content, "image")
              if isinstance(b.get("source"), dict) and b["source"].get("type") in ("base64", "url")]
    calls = tuple(ToolCall(_string(b.get("name")), json.dumps(b.get("input", {}), separators=(",", ":")),
                           _string(b.get("id"))) for b in _blocks(content, "tool_use"))
    reasoning = [b for b in _blocks(content, "thinking") if _string(b.get("thinking"))]
    own = [ChatMessage(role, text_of(_blocks(content, "text")), calls)] if (
        _blocks(content, "text") or images or calls or reasoning) else []
    return own + [ChatMessage("tool", _tool_result_text(block.get("content")), tool_call_id=_string(
        block.get("tool_use_id"))) for block in _blocks(content, "tool_result")]


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
    block_started: bool = False
    ends_with_done = False

    def _usage(self, n_output: int) -> dict[str, int]:
        return {"cache_read_input_tokens": 0, "input_tokens": self.n_prompt, "output_tokens": n_output}

    def _start(self) -> dict[str, Any]:
        return {"type": "message_start", "message": {
            "id": self.cmpl_id, "type": "message", "role": "assistant", "content": [], "model": self.model,
            "stop_reason": None, "stop_sequence": None, "usage": self._usage(0)}}

    def token_events(self, piece: str, n_decoded: int, slot_id: int) -> list[dict[str, Any]]:
        events = [self._start()] if n_decoded == 1 else []
        events += text_piece_events(piece, first=not self.block_started)
        self.block_started = True
        return events

    def call_events(self, call: ToolCall, piece: str, n_decoded: int) -> list[dict[str, Any]]:
        events = [self._start()] if n_decoded == 1 else []
        if piece and not self.block_started:
            events.append({"type": "content_block_start", "index": 0,
                           "content_block": {"type": "tool_use", "id": call.id, "name": call.name}})
            self.block_started = True
        if piece:
            events.append({"type": "content_block_delta", "index": 0,
                           "delta": {"type": "input_json_delta", "partial_json": piece}})
        return events

    def final_events(self, out: Outcome) -> list[dict[str, Any]]:
        events = [{"type": "content_block_stop", "index": 0}] if self.block_started else []
        return [*events,
                {"type": "message_delta", "delta": {"stop_reason": _STOP_REASONS[out.finish_reason],
                                                    "stop_sequence": None},
                 "usage": {"output_tokens": out.n_decoded}},
                {"type": "message_stop"}]

    def response(self, out: Outcome) -> dict[str, Any]:
        content: list[dict[str, Any]] = [{"type": "text", "text": out.text}] if out.text else []
        if out.call is not None:
            content.append({"type": "tool_use", "id": out.call.id, "name": out.call.name,
                            "input": _arguments(out.call.arguments)})
        return {"id": self.cmpl_id, "type": "message", "role": "assistant", "content": content, "model": self.model,
                "stop_reason": _STOP_REASONS[out.finish_reason], "stop_sequence": None,
                "usage": self._usage(out.n_decoded)}

    def frame_error(self, body: dict[str, Any]) -> bytes:
        return sse_event("error", body["error"])


def _arguments(arguments: str) -> object:
    try:
        return json.loads(arguments)
    except ValueError:
        return {}  # a call cut short by the budget
