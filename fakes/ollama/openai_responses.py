"""``POST /v1/responses`` as Ollama serves it (ollama/ollama ``openai/responses.go``, ``middleware/openai.go``).

Ollama's ``ResponsesMiddleware`` turns the request into a chat request (``instructions`` -> a
system message, ``input`` -> messages, ``max_output_tokens`` -> ``num_predict``; no keep_alive)
that the chat handler runs; its ``ResponsesWriter`` turns the chat answer back into either one
``response`` object (``stream`` is false by default) or a stream of named SSE events, each with
a ``sequence_number``::

    response.created, response.in_progress                       (first chunk)
    response.output_item.added, response.content_part.added      (first text)
    response.output_text.delta ...                                (one per token)
    response.output_text.done, response.content_part.done,
    response.output_item.done, response.completed                 (the done chunk)

Quirks kept: ``status`` is ``"completed"`` also when ``max_output_tokens`` cut the answer (no
``incomplete_details``); usage is ``input_tokens``/``output_tokens``/``total_tokens`` with zero
cached and reasoning tokens, in ``response.completed`` only (``null`` before); the streamed
objects are Go maps (keys sorted), the whole response a Go struct (field order); a stream that
produced no text completes with ``"output": null``; a stream that fails midway just ends.
Errors use OpenAI's envelope (``ErrorShape.OPENAI``).
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

import attrs

from fakes.ollama.errors import ErrorShape, bad_request
from fakes.ollama.formats import NamedEventFraming, Outcome
from fakes.ollama.parsing import go_kind, typed_field

STRUCT = "openai.ResponsesRequest"
EFFORTS = ("high", "medium", "low", "max", "none")
TEXT_PARTS = ("input_text", "output_text")


@attrs.frozen
class ResponsesRequest:
    """What the middleware reads of a request: the conversation, the limit, and what the answer echoes."""

    model: str
    messages: tuple[str, ...]          # the chat messages' texts, the instructions' system message first
    stream: bool = False
    max_output_tokens: int | None = None
    instructions: str = ""
    temperature: float | None = None
    top_p: float | None = None
    truncation: str | None = None
    tools: tuple[dict[str, Any], ...] = ()
    text_format: dict[str, Any] | None = None
    effort: str = ""
    summary: str = ""
    background: bool = False


def parse_responses_request(body: dict[str, Any]) -> ResponsesRequest:
    """The request as ``ShouldBindJSON`` + ``FromResponsesRequest`` take it; their 400 messages otherwise."""
    def field(key: str, go_type: str, *kinds: type) -> Any:
        return typed_field(body, key, f"ResponsesRequest.{key}", go_type, kinds)

    model = field("model", "string", str) or ""
    if not model:
        raise bad_request("model is required")
    instructions = field("instructions", "string", str) or ""
    reasoning = field("reasoning", "openai.ResponsesReasoning", dict) or {}
    effort = typed_field(reasoning, "effort", "ResponsesRequest.reasoning.effort", "string", (str,)) or ""
    summary = typed_field(reasoning, "summary", "ResponsesRequest.reasoning.summary", "string", (str,)) or ""
    if effort and effort not in EFFORTS:
        raise bad_request(f'invalid reasoning value: "{effort}" (must be "high", "medium", "low", "max", or "none")')
    text = field("text", "openai.ResponsesText", dict) or {}
    text_format = typed_field(text, "format", "ResponsesRequest.text.format", "openai.ResponsesTextFormat", (dict,))
    tools = field("tools", "[]openai.ResponsesTool", list) or []
    messages = ([instructions] if instructions else []) + _input_messages(body.get("input"))
    return ResponsesRequest(
        model=model, messages=tuple(messages), stream=bool(field("stream", "bool", bool)),
        max_output_tokens=field("max_output_tokens", "int", int), instructions=instructions,
        temperature=field("temperature", "float64", int, float), top_p=field("top_p", "float64", int, float),
        truncation=field("truncation", "string", str), tools=tuple(_tool(t, i) for i, t in enumerate(tools)),
        text_format=_text_format(text_format) if text_format is not None else None, effort=effort, summary=summary,
        background=bool(field("background", "bool", bool)))


def _input_messages(value: object) -> list[str]:
    """``ResponsesInput``: a string (one user message) or a list of items, as chat messages' texts."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise bad_request(f"input must be a string or array: json: cannot unmarshal {go_kind(value)} "
                          "into Go value of type []json.RawMessage")
    roles: list[str] = []
    texts: list[str] = []
    thinking = False  # reasoning waiting for the next assistant message (FromResponsesRequest's pendingThinking)
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise bad_request(f"input[{i}]: json: cannot unmarshal {go_kind(item)} into Go value of type "
                              "openai.ResponsesInputItem")
        kind = item.get("type") or ("message" if item.get("role") else "")
        if kind == "message":
            role = item.get("role") if isinstance(item.get("role"), str) else ""
            roles.append(role)
            texts.append(_content_text(item.get("content"), f"input[{i}]", "content"))
            thinking = thinking and role != "assistant"
        elif kind == "function_call":
            _check_arguments(item.get("arguments"))
            if not roles or roles[-1] != "assistant":  # otherwise the call joins that assistant message
                roles.append("assistant")
                texts.append("")
            thinking = False
        elif kind == "function_call_output":
            roles.append("tool")
            texts.append(_content_text(item.get("output"), f"input[{i}]", "output"))
        elif kind == "reasoning":
            thinking = bool(item.get("encrypted_content"))
        elif not kind:
            raise bad_request(f"input[{i}]: input item missing required 'type' field")
        else:
            raise bad_request(f"input[{i}]: unknown input item type: {json.dumps(kind)}")
    if thinking:  # trailing reasoning becomes an assistant message of its own
        texts.append("")
    return texts


def _content_text(value: object, where: str, name: str) -> str:
    """A message's ``content`` (or a call output's ``output``): a string or a list of content parts."""
    if value is None or isinstance(value, str):
        return value or ""
    if not isinstance(value, list):
        raise bad_request(f"{where}: {name} must be a string or array: json: cannot unmarshal {go_kind(value)} "
                          "into Go value of type []json.RawMessage")
    text = ""
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS:
            piece = part.get("text")
            text += piece if isinstance(piece, str) else ""
        elif kind == "input_file":
            raise bad_request("file inputs are not currently supported")
        elif kind != "input_image":  # images cost the fake nothing
            raise bad_request(f"{where}: {name}[{j}]: unknown content type: {kind if isinstance(kind, str) else ''}")
    return text


def _check_arguments(arguments: object) -> None:
    if not arguments:
        return
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else None
    except ValueError as exc:
        raise bad_request(f"failed to parse function call arguments: {exc}") from None
    if not isinstance(parsed, dict):
        raise bad_request("failed to parse function call arguments: not a JSON object")


def _tool(value: object, index: int) -> dict[str, Any]:
    """One ``ResponsesTool``, as the answer echoes it."""
    if not isinstance(value, dict):
        raise bad_request(f"json: cannot unmarshal {go_kind(value)} into Go struct field ResponsesRequest.tools "
                          "of type openai.ResponsesTool")
    where = "ResponsesRequest.tools."
    return {"type": typed_field(value, "type", where + "type", "string", (str,)) or "",
            "name": typed_field(value, "name", where + "name", "string", (str,)) or "",
            "description": typed_field(value, "description", where + "description", "string", (str,)),
            "strict": typed_field(value, "strict", where + "strict", "bool", (bool,)),
            "parameters": typed_field(value, "parameters", where + "parameters", "map[string]interface {}", (dict,))}


def _text_format(value: dict[str, Any]) -> dict[str, Any]:
    """``ResponsesTextFormat``: ``type`` always, ``name``/``schema``/``strict`` when set."""
    where = "ResponsesRequest.text.format."
    echoed: dict[str, Any] = {"type": typed_field(value, "type", where + "type", "string", (str,)) or ""}
    if name := typed_field(value, "name", where + "name", "string", (str,)):
        echoed["name"] = name
    if value.get("schema") is not None:
        echoed["schema"] = value["schema"]
    if (strict := typed_field(value, "strict", where + "strict", "bool", (bool,))) is not None:
        echoed["strict"] = strict
    return echoed


def _go_float(value: float | None, default: float) -> float:
    """A float64 as Go's encoder writes it: 1, not 1.0."""
    number = default if value is None else value
    return int(number) if float(number).is_integer() else number


def _go_maps(value: Any) -> Any:
    """What ``json.Marshal`` of ``map[string]any`` writes: keys in sorted order, all the way down."""
    if isinstance(value, dict):
        return {key: _go_maps(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_go_maps(item) for item in value]
    return value


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


@attrs.define(eq=False)
class ResponsesFormat(NamedEventFraming):
    """One /v1/responses answer: the ``ResponsesStreamConverter`` (its state) and ``ToResponse``."""

    error_shape = ErrorShape.OPENAI

    request: ResponsesRequest
    response_id: str = attrs.field(factory=lambda: f"resp_{random.randrange(999999)}")
    item_id: str = attrs.field(factory=lambda: f"msg_{random.randrange(999999)}")
    sequence: int = attrs.field(default=0, init=False)
    text: str = attrs.field(default="", init=False)
    opened: bool = attrs.field(default=False, init=False)         # response.created and .in_progress sent
    text_started: bool = attrs.field(default=False, init=False)   # the message item and its part added

    def frame(self, value: dict[str, Any]) -> bytes:
        return super().frame(_go_maps(value))

    def token_events(self, piece: str) -> list[dict[str, Any]]:
        events = self._open()
        if not self.text_started:
            self.text_started = True
            events.append(self._event("response.output_item.added", output_index=0, item={
                "id": self.item_id, "type": "message", "status": "in_progress", "role": "assistant", "content": []}))
            events.append(self._event("response.content_part.added", item_id=self.item_id, output_index=0,
                                      content_index=0, part=_output_text("")))
        self.text += piece
        events.append(self._event("response.output_text.delta", item_id=self.item_id, output_index=0,
                                  content_index=0, delta=piece, logprobs=[]))
        return events

    def final_events(self, out: Outcome) -> list[dict[str, Any]]:
        events = self._open()
        output = None
        if self.text_started:
            output = [self._message(self.text)]
            events += [self._event("response.output_text.done", item_id=self.item_id, output_index=0,
                                   content_index=0, text=self.text, logprobs=[]),
                       self._event("response.content_part.done", item_id=self.item_id, output_index=0,
                                   content_index=0, part=_output_text(self.text)),
                       self._event("response.output_item.done", output_index=0, item=output[0])]
        completed = self._object("completed", output, _usage(out), streamed=True)
        completed["completed_at"] = int(time.time())
        events.append(self._event("response.completed", response=completed))
        return events

    def response(self, out: Outcome) -> dict[str, Any]:
        """``ToResponse``: always one message item, even an empty one."""
        whole = self._object("completed", [self._message(out.text)], _usage(out), streamed=False)
        whole["completed_at"] = int(time.time())
        return whole

    def _open(self) -> list[dict[str, Any]]:
        if self.opened:
            return []
        self.opened = True
        return [self._event(kind, response=self._object("in_progress", [], None, streamed=True))
                for kind in ("response.created", "response.in_progress")]

    def _event(self, kind: str, **data: Any) -> dict[str, Any]:
        event = {**data, "type": kind, "sequence_number": self.sequence}
        self.sequence += 1
        return event

    def _message(self, text: str) -> dict[str, Any]:
        return {"id": self.item_id, "type": "message", "status": "completed", "role": "assistant",
                "content": [_output_text(text)]}

    def _object(self, status: str, output: list[Any] | None, usage: dict[str, Any] | None, *,
                streamed: bool) -> dict[str, Any]:
        """The response object, in ``ResponsesResponse``'s field order; what the request set is echoed."""
        req = self.request
        reasoning: dict[str, Any] | None = None
        if req.effort or req.summary:  # the streamed map names both keys, the struct only those set
            given = {"effort": req.effort or None, "summary": req.summary or None}
            reasoning = given if streamed else {k: v for k, v in given.items() if v}
        return {
            "id": self.response_id, "object": "response", "created_at": int(time.time()), "completed_at": None,
            "status": status, "incomplete_details": None, "model": req.model, "previous_response_id": None,
            "instructions": req.instructions or None, "output": output, "error": None, "tools": list(req.tools),
            "tool_choice": "auto", "truncation": "disabled" if req.truncation is None else req.truncation,
            "parallel_tool_calls": True,
            "text": {"format": req.text_format or {"type": "text"}}, "top_p": _go_float(req.top_p, 1.0),
            "presence_penalty": 0, "frequency_penalty": 0, "top_logprobs": 0,
            "temperature": _go_float(req.temperature, 1.0), "reasoning": reasoning, "usage": usage,
            "max_output_tokens": req.max_output_tokens, "max_tool_calls": None, "store": False,
            "background": req.background, "service_tier": "default", "metadata": {}, "safety_identifier": None,
            "prompt_cache_key": None,
        }


def _usage(out: Outcome) -> dict[str, Any]:
    return {"input_tokens": out.n_prompt, "output_tokens": out.n_eval, "total_tokens": out.n_prompt + out.n_eval,
            "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}


__all__ = ["ResponsesFormat", "ResponsesRequest", "STRUCT", "parse_responses_request"]
