"""``POST /v1/messages`` as Ollama serves it (ollama/ollama ``anthropic/anthropic.go``, ``middleware/anthropic.go``).

Ollama's ``AnthropicMessagesMiddleware`` checks ``model``, ``max_tokens > 0`` and a non-empty
``messages``, turns the request into a chat request (``system`` -> a system message, content
blocks -> messages, tool results -> tool messages, ``max_tokens`` -> ``num_predict``; no
keep_alive) that the chat handler runs, and its ``AnthropicWriter`` turns the chat answer back
into one ``message`` object (``stream`` is false by default) or named SSE events::

    message_start                                   (first chunk; input_tokens is an estimate)
    content_block_start, content_block_delta ...    (text, one delta per token)
    content_block_stop, message_delta, message_stop (the done chunk; the real usage)

No ``ping`` events. ``stop_reason``: ``stop`` -> ``end_turn``, ``length`` -> ``max_tokens``, any
other -> ``stop_sequence``. Usage is ``input_tokens``/``output_tokens``. ``message_start``
reports ``EstimateInputTokens`` (the request's text bytes / 4, at least 1), ``message_delta``
the counts of the done chunk. An answer without text has ``"content": null``; a stream that
fails midway just ends (no ``error`` event). Errors use Anthropic's envelope
(``ErrorShape.ANTHROPIC``, with a ``request_id``).
"""

from __future__ import annotations

import base64
import binascii
import secrets
from typing import Any

import attrs

from fakes.anthropic_events import text_piece_events
from fakes.http11 import dump_json
from fakes.ollama.errors import ErrorShape, bad_request
from fakes.ollama.formats import NamedEventFraming, Outcome
from fakes.ollama.parsing import go_kind, typed_field

STRUCT = "anthropic.MessagesRequest"
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}

Block = dict[str, Any]


@attrs.frozen
class MessagesRequest:
    """What the middleware reads of a request: the conversation, the limit, the token estimate."""

    model: str
    max_tokens: int
    messages: tuple[str, ...]          # the chat messages' texts, the system message first
    stream: bool = False
    estimated_input_tokens: int = 0


def parse_messages_request(body: dict[str, Any]) -> MessagesRequest:
    """In the middleware's order: binding, ``model``, ``max_tokens``, ``messages``, then the conversion."""
    def field(key: str, go_type: str, *kinds: type) -> Any:
        return typed_field(body, key, f"MessagesRequest.{key}", go_type, kinds)

    model = field("model", "string", str) or ""
    max_tokens = field("max_tokens", "int", int) or 0
    stream = bool(field("stream", "bool", bool))
    params = [_message_param(m) for m in field("messages", "[]anthropic.MessageParam", list) or []]
    tools = [_tool(t) for t in field("tools", "[]anthropic.Tool", list) or []]
    system = body.get("system")
    if not model:
        raise bad_request("model is required")
    if max_tokens <= 0:
        raise bad_request("max_tokens is required and must be positive")
    if not params:
        raise bad_request("messages is required")
    texts = _system_texts(system) + [text for role, blocks in params for text in _converted(role, blocks)]
    for tool in tools:
        _check_schema(tool)
    return MessagesRequest(model, max_tokens, tuple(texts), stream, estimate_input_tokens(system, params, tools))


# ---- binding (``MessageParam.UnmarshalJSON``)


def _message_param(value: object) -> tuple[str, list[Block]]:
    if not isinstance(value, dict):
        raise bad_request(f"json: cannot unmarshal {go_kind(value)} into Go struct field MessagesRequest.messages "
                          "of type anthropic.MessageParam")
    role = value.get("role")
    if role is not None and not isinstance(role, str):
        raise bad_request(f"json: cannot unmarshal {go_kind(role)} into Go struct field .role of type string")
    if "content" not in value:
        raise bad_request("unexpected end of JSON input")  # Go unmarshals the empty raw content
    content = value["content"]
    if content is None or isinstance(content, str):  # a string is one text block (null: an empty one)
        return role or "", [{"type": "text", "text": content or ""}]
    if not isinstance(content, list):
        raise bad_request(f"json: cannot unmarshal {go_kind(content)} into Go value of type []anthropic.ContentBlock")
    for block in content:
        if not isinstance(block, dict):
            raise bad_request(f"json: cannot unmarshal {go_kind(block)} into Go value of type anthropic.ContentBlock")
        for key in ("type", "text", "id", "name", "tool_use_id", "thinking", "signature"):
            typed_field(block, key, f"ContentBlock.{key}", "string", (str,))
    return role or "", content


def _tool(value: object) -> Block:
    if not isinstance(value, dict):
        raise bad_request(f"json: cannot unmarshal {go_kind(value)} into Go struct field MessagesRequest.tools "
                          "of type anthropic.Tool")
    for key in ("type", "name", "description"):
        typed_field(value, key, f"MessagesRequest.tools.{key}", "string", (str,))
    return value


# ---- conversion (``FromMessagesRequest``, ``convertMessage``)


def _system_texts(system: object) -> list[str]:
    if isinstance(system, str):
        return [system] if system else []
    if isinstance(system, list):
        text = "".join(b["text"] for b in system
                       if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str))
        return [text] if text else []
    return []


def _converted(role: str, blocks: list[Block]) -> list[str]:
    """One message's blocks as chat messages' texts: its own message (if it has anything) and tool results."""
    text, other, results = "", False, []
    for block in blocks:
        match block.get("type"):
            case "text":
                text += block.get("text") or ""
            case "image":
                _check_image(block.get("source"), "invalid image source")
                other = True
            case "tool_use":
                for key in ("id", "name"):
                    if not block.get(key):
                        raise bad_request(f"tool_use block missing required '{key}' field")
                other = True
            case "tool_result":
                results.append(_tool_result_text(block.get("content")))
            case "thinking":
                other = other or bool(block.get("thinking"))
            case "server_tool_use":
                other = True
            case "web_search_tool_result":
                content = block.get("content")
                results.append(content if isinstance(content, str) else "")
    own = [text] if text or other else []
    # a user's tool results come before what else it says (they answer the previous assistant turn)
    return results + own if role.lower() == "user" else own + results


def _tool_result_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    text = ""
    for block in content:
        if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
            text += block["text"]
        elif isinstance(block, dict) and block.get("type") == "image":
            _check_image(block.get("source"), "invalid tool_result image source")
    return text


def _check_image(source: object, missing: str) -> None:
    if not isinstance(source, dict):
        raise bad_request(missing)
    if source.get("type") != "base64":
        kind = source.get("type") if isinstance(source.get("type"), str) else ""
        raise bad_request(f"invalid image source type: {kind}. Only base64 images are supported.")
    data = source.get("data") if isinstance(source.get("data"), str) else ""
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise bad_request(f"invalid base64 image data: {exc}") from None


def _check_schema(tool: Block) -> None:
    schema = tool.get("input_schema")
    if str(tool.get("type") or "").startswith("web_search") or schema is None or isinstance(schema, dict):
        return
    raise bad_request(f'invalid input_schema for tool "{tool.get("name") or ""}": json: cannot unmarshal '
                      f"{go_kind(schema)} into Go value of type api.ToolFunctionParameters")


# ---- EstimateInputTokens: len/4 of the request's text (Go's len: bytes)


def estimate_input_tokens(system: object, params: list[tuple[str, list[Block]]], tools: list[Block]) -> int:
    total = _system_length(system)
    total += sum(_length(role) + sum(_block_length(b) for b in blocks) for role, blocks in params)
    total += sum(_length(t.get("name")) + _length(t.get("description"))
                 + (len(dump_json(t["input_schema"])) if "input_schema" in t else 0) for t in tools)
    tokens = total // 4
    return 1 if tokens == 0 and (params or system is not None) else tokens


def _length(text: object) -> int:
    return len(text.encode()) if isinstance(text, str) else 0


def _block_length(block: Block) -> int:
    extra = len(dump_json(block)) if block.get("type") in ("tool_use", "tool_result") else 0
    return _length(block.get("text")) + _length(block.get("thinking")) + extra


def _system_length(system: object) -> int:
    if system is None:
        return 0
    if isinstance(system, str):
        return _length(system)
    if isinstance(system, list):
        return sum(_block_length(b) for b in system if isinstance(b, dict))
    return len(dump_json(system))


# ---- the answer


@attrs.define(eq=False)
class MessagesFormat(NamedEventFraming):
    """One /v1/messages answer: the ``StreamConverter`` (its state) and ``ToMessagesResponse``."""

    error_shape = ErrorShape.ANTHROPIC

    model: str                          # as the request named it
    estimated_input_tokens: int
    message_id: str = attrs.field(factory=lambda: "msg_" + secrets.token_hex(12))
    opened: bool = attrs.field(default=False, init=False)         # message_start sent
    text_started: bool = attrs.field(default=False, init=False)   # the text block started

    def token_events(self, piece: str) -> list[dict[str, Any]]:
        events = self._open(0) + text_piece_events(piece, first=not self.text_started)
        self.text_started = True
        return events

    def final_events(self, out: Outcome) -> list[dict[str, Any]]:
        events = self._open(out.n_prompt)
        if self.text_started:
            events.append({"type": "content_block_stop", "index": 0})
        events.append({"type": "message_delta", "delta": _stop(out),
                       "usage": {"input_tokens": out.n_prompt, "output_tokens": out.n_eval}})
        events.append({"type": "message_stop"})
        return events

    def response(self, out: Outcome) -> dict[str, Any]:
        content = [{"type": "text", "text": out.text}] if out.text else None
        return {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model,
                "content": content, **_stop(out),
                "usage": {"input_tokens": out.n_prompt, "output_tokens": out.n_eval}}

    def _open(self, prompt_tokens: int) -> list[dict[str, Any]]:
        """message_start, on the first chunk: its prompt count if it has one (a done chunk), else the estimate."""
        if self.opened:
            return []
        self.opened = True
        usage = {"input_tokens": prompt_tokens or self.estimated_input_tokens, "output_tokens": 0}
        return [{"type": "message_start", "message": {"id": self.message_id, "type": "message", "role": "assistant",
                                                      "model": self.model, "content": [], "usage": usage}}]


def _stop(out: Outcome) -> dict[str, str]:
    """``mapStopReason`` as an ``omitempty`` field."""
    reason = STOP_REASONS.get(out.done_reason, "stop_sequence") if out.done_reason else ""
    return {"stop_reason": reason} if reason else {}


__all__ = ["MessagesFormat", "MessagesRequest", "STRUCT", "estimate_input_tokens", "parse_messages_request"]
