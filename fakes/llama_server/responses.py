"""OpenAI's Responses API (``/v1/responses``, ``/responses``) the way llama-server serves it.

llama-server turns a Responses request into a chat request (``instructions`` becomes a system
message, ``input`` the messages, ``max_output_tokens`` the ``max_tokens``; errors in ``input``
are 400s) and the chat answer back into a Response. A stream is named events and no
``[DONE]``: ``response.created`` and ``response.in_progress`` with the first token,
``response.output_item.added`` and ``response.content_part.added`` with the first text,
``response.output_text.delta`` per token, then ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done`` (these three only when there
is text) and ``response.completed`` with usage and timings. A JSON answer has no timings.
A tool call is a ``function_call`` item (id ``fc_X``, ``call_id`` ``call_X``); streamed, it is
announced by ``response.output_item.added`` with the first piece of its arguments, each piece is
a ``response.function_call_arguments.delta``, then ``response.output_item.done`` (llama-server
sends no ``function_call_arguments.done``). Function tools become chat tools.
``/v1/responses/input_tokens`` counts the prompt without generating.
"""

from __future__ import annotations

import time
from typing import Any

import attrs

from fakes.chat_template import Chat, ChatMessage, ToolCall, openai_chat
from fakes.llama_server.cli import Config
from fakes.llama_server.errors import invalid_request
from fakes.llama_server.formats import NamedEvents, Outcome, random_id
from fakes.llama_server.parsing import Job, chat_job

_INPUT_ROLES = ("user", "system", "developer")
_NOT_CHAT = ("input", "instructions", "max_output_tokens")  # what the conversion takes out of the body


def responses_job(body: dict[str, Any], cfg: Config) -> Job:
    chat = {k: v for k, v in body.items() if k not in _NOT_CHAT}
    if "max_output_tokens" in body:
        chat["max_tokens"] = body["max_output_tokens"]
    return chat_job(responses_chat(body), chat, cfg)


def input_tokens(chat: Chat) -> dict[str, Any]:
    """``/v1/responses/input_tokens``; llama-server answers ``/v1/chat/completions/input_tokens`` alike."""
    return {"input_tokens": chat.n_tokens, "object": "response.input_tokens"}


# --------------------------------------------------------------------------- the request


def responses_chat(body: dict[str, Any]) -> Chat:
    """The chat llama-server makes of a Responses request (its function tools as chat tools)."""
    if "input" not in body:
        raise invalid_request("'input' is required")
    previous = body.get("previous_response_id")
    if isinstance(previous, str) and previous:
        raise invalid_request("llama.cpp does not support 'previous_response_id'.")
    messages: list[ChatMessage] = []
    if "instructions" in body:
        messages.append(ChatMessage("system", _string(body["instructions"])))
    value = body["input"]
    if isinstance(value, str):
        messages.append(ChatMessage("user", value))
    elif isinstance(value, list):
        for item in value:
            _add_item(messages, item)
    else:
        raise invalid_request("'input' must be a string or array of objects")
    tools = body.get("tools", [])
    if not isinstance(tools, list):
        raise invalid_request("'tools' must be an array of objects")
    functions = [tool for tool in tools if isinstance(tool, dict) and tool.get("type") == "function"]
    return attrs.evolve(openai_chat({"tools": functions, "tool_choice": body.get("tool_choice")}),
                        messages=tuple(messages))


def _string(value: object) -> str:
    return value if isinstance(value, str) else ""


def _add_item(messages: list[ChatMessage], item: object) -> None:
    """One input item -> a message, or more text for the assistant message before it."""
    if not isinstance(item, dict):
        raise invalid_request("Cannot determine type of 'item'")
    if isinstance(item.get("content"), str):  # a plain string is one input_text part
        item = {**item, "content": [{"type": "input_text", "text": item["content"]}]}
    role, kind, content = item.get("role"), item.get("type"), item.get("content")
    if isinstance(content, list) and role in _INPUT_ROLES:
        messages.append(ChatMessage("system" if role == "developer" else role, _input_text(content)))
    elif role == "assistant" and kind == "message":
        _add_assistant(messages, ChatMessage("assistant", _output_text(content if isinstance(content, list) else [])))
    elif kind == "function_call" and all(isinstance(item.get(k), str) for k in ("arguments", "call_id", "name")):
        call = ToolCall(item["name"], item["arguments"], item["call_id"])
        _add_assistant(messages, ChatMessage("assistant", tool_calls=(call,)))
    elif kind == "function_call_output" and isinstance(item.get("call_id"), str) and isinstance(
            item.get("output"), str | list):
        messages.append(ChatMessage("tool", _tool_output_text(item["output"]), tool_call_id=item["call_id"]))
    elif kind == "reasoning" and isinstance(item.get("summary"), list):
        _reasoning_text(content)  # checked; the template does not show reasoning
        _add_assistant(messages, ChatMessage("assistant"))
    else:
        raise invalid_request("Cannot determine type of 'item'")


def _add_assistant(messages: list[ChatMessage], message: ChatMessage) -> None:
    # Consecutive assistant items (text, tool calls, reasoning) merge into one message.
    if messages and messages[-1].role == "assistant":
        last = messages[-1]
        messages[-1] = attrs.evolve(last, content="\n".join(t for t in (last.content, message.content) if t),
                                    tool_calls=last.tool_calls + message.tool_calls)
    else:
        messages.append(message)


def _part_type(part: object) -> object:
    return part.get("type") if isinstance(part, dict) else None


def _input_text(parts: list[Any]) -> str:
    texts = []
    for part in parts:
        kind = _part_type(part)
        if kind == "input_text":
            if "text" not in part:
                raise invalid_request("'Input text' requires 'text'")
            texts.append(_string(part["text"]))
        elif kind == "input_image":
            if "image_url" not in part:
                raise invalid_request("'image_url' is required")
        elif kind == "input_file":
            raise invalid_request("'input_file' is not supported by llamacpp at this moment")
        else:
            raise invalid_request("'type' must be one of 'input_text', 'input_image', or 'input_file'")
    return "\n".join(texts)


def _output_text(parts: list[Any]) -> str:
    texts = []
    for part in parts:
        kind = _part_type(part)
        if kind in ("output_text", "input_text"):
            if not isinstance(part.get("text"), str):
                raise invalid_request("'Output text' requires 'text'")
            texts.append(part["text"])
        elif kind == "refusal":
            if not isinstance(part.get("refusal"), str):
                raise invalid_request("'Refusal' requires 'refusal'")
            texts.append(part["refusal"])
        else:
            raise invalid_request("'type' must be one of 'output_text' or 'refusal'")
    return "\n".join(texts)


def _tool_output_text(output: str | list[Any]) -> str:
    if isinstance(output, str):
        return output
    texts = []
    for part in output:
        if not isinstance(part, dict) or "type" not in part:
            raise invalid_request("Output of tool call missing 'type' field")
        if part["type"] == "input_text":
            texts.append(_string(part.get("text")))
        elif part["type"] != "input_image":
            raise invalid_request("Output of tool call should be 'Input text' or 'Input image'")
        elif "image_url" not in part:
            raise invalid_request("'image_url' is required")
    return "\n".join(texts)


def _reasoning_text(content: object) -> str:
    if not isinstance(content, list):
        raise invalid_request("item['content'] is not an array")
    if not content:
        raise invalid_request("item['content'] is empty")
    if not isinstance(content[0], dict) or not isinstance(content[0].get("text"), str):
        raise invalid_request("item['content']['text'] is not a string")
    return content[0]["text"]


# --------------------------------------------------------------------------- the answer


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def _usage(out: Outcome) -> dict[str, Any]:
    return {"input_tokens": out.n_prompt, "output_tokens": out.n_decoded, "total_tokens": out.n_prompt + out.n_decoded,
            "input_tokens_details": {"cached_tokens": 0}}


@attrs.define(eq=False)
class ResponsesFormat(NamedEvents):
    """A Response, streamed as named events."""

    model: str
    resp_id: str = attrs.field(factory=lambda: random_id("resp_"))
    msg_id: str = attrs.field(factory=lambda: random_id("msg_"))
    call_id: str = attrs.field(factory=lambda: random_id(""))  # a tool call's item is fc_ID, its call_id call_ID
    created: bool = False       # response.created is behind us
    text_started: bool = False  # the message item and its text part (or the function call item) are announced
    ends_with_done = False

    def _status(self, kind: str) -> dict[str, Any]:
        return {"type": kind, "response": {"id": self.resp_id, "object": "response", "status": "in_progress"}}

    def _created(self, n_decoded: int) -> list[dict[str, Any]]:
        if self.created:
            return []
        # llama-server notes the response as created only with token 1's event: when token 1 was
        # half a character (nothing sent), every later token announces the response again.
        self.created = n_decoded == 1
        return [self._status("response.created"), self._status("response.in_progress")]

    def _call_item(self, call: ToolCall, status: str) -> dict[str, Any]:
        return {"id": "fc_" + self.call_id, "type": "function_call", "status": status, "arguments": call.arguments,
                "call_id": "call_" + self.call_id, "name": call.name}

    def call_events(self, call: ToolCall, piece: str, n_decoded: int) -> list[dict[str, Any]]:
        """A function call item: announced with the first piece of its arguments, each piece a delta
        (llama-server sends no ``response.function_call_arguments.done``)."""
        events = self._created(n_decoded)
        if piece and not self.text_started:
            self.text_started = True
            events.append({"type": "response.output_item.added",
                           "item": self._call_item(attrs.evolve(call, arguments=""), "in_progress")})
        if piece:
            events.append({"type": "response.function_call_arguments.delta", "delta": piece,
                           "item_id": "fc_" + self.call_id})
        return events

    def _output(self, out: Outcome, msg_id: str) -> list[dict[str, Any]]:
        if out.call is not None:
            return [self._call_item(out.call, "completed")]
        return [{"content": [_text_part(out.text)], "id": msg_id, "role": "assistant", "status": "completed",
                 "type": "message"}] if out.text else []

    def token_events(self, piece: str, n_decoded: int, slot_id: int) -> list[dict[str, Any]]:
        events = self._created(n_decoded)
        if not self.text_started:
            self.text_started = True
            events.append({"type": "response.output_item.added", "item": {
                "content": [], "id": self.msg_id, "role": "assistant", "status": "in_progress", "type": "message"}})
            events.append({"type": "response.content_part.added", "item_id": self.msg_id,
                           "part": {"type": "output_text", "text": ""}})
        events.append({"type": "response.output_text.delta", "item_id": self.msg_id, "delta": piece})
        return events

    def final_events(self, out: Outcome) -> list[dict[str, Any]]:
        events, output = [], self._output(out, self.msg_id)
        if out.text:
            events += [{"type": "response.output_text.done", "item_id": self.msg_id, "text": out.text},
                       {"type": "response.content_part.done", "item_id": self.msg_id, "part": _text_part(out.text)}]
        events += [{"type": "response.output_item.done", "item": item} for item in output]
        events.append({"type": "response.completed", "response": {
            "id": self.resp_id, "object": "response", "created_at": int(time.time()), "status": "completed",
            "model": self.model, "output": output, "usage": _usage(out)}, "timings": out.timings})
        return events

    def response(self, out: Outcome) -> dict[str, Any]:
        now = int(time.time())
        output = self._output(out, random_id("msg_"))
        return {"completed_at": now, "created_at": now, "id": self.resp_id, "model": self.model, "object": "response",
                "output": output, "status": "completed", "usage": _usage(out)}
