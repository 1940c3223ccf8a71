"""A chat as an engine's chat template renders it, and what that prompt costs in tokens.

The fake engines stand for a ChatML model whose template renders tools the way most agent
models' templates do: ``chatml_tools.jinja`` beside this module (SmolLM2's ChatML and default
system prompt with Qwen2.5's tool section: every tool's JSON schema on a line of the system
message, calls as ``<tool_call>`` JSON, tool results as ``<tool_response>`` in a user turn).
``render`` is that template in Python; the tests run the real llama-server with the same file
(``--chat-template-file``) and hold the fake's counts to the real ones.

A request of any API is first turned into a ``Chat`` (llama-server turns Anthropic Messages and
Responses requests into chat requests the same way), then rendered and counted.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from fakes.chat_tokens import count_tokens

TEMPLATE_PATH = Path(__file__).with_name("chatml_tools.jinja")
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
TOOLS_HEAD = ("\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
              "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_TAIL = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
              "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
              '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n')
ASSISTANT_START = "<|im_start|>assistant\n"


@attrs.frozen
class ToolCall:
    """A function call: in an assistant message of the conversation, or the fake model's answer."""

    name: str
    arguments: str  # JSON text (a model's, so perhaps unfinished)
    id: str = ""


@attrs.frozen
class ChatMessage:
    role: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""  # a tool message: the call it answers


@attrs.frozen
class ToolChoice:
    """``tool_choice`` of any API: ``auto``, ``none``, ``required``, or one function by *name*."""

    mode: str = "auto"
    name: str = ""


@attrs.frozen
class Chat:
    """A conversation as the template sees it; ``tools`` are OpenAI function tools, normalized."""

    messages: tuple[ChatMessage, ...]
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: ToolChoice = ToolChoice()

    @property
    def prompt(self) -> str:
        return render(self.messages, self.tools)

    @property
    def n_tokens(self) -> int:
        return count_tokens(self.prompt)

    def tool_names(self) -> list[str]:
        return [tool["function"]["name"] for tool in self.tools]

    def tool(self, name: str) -> dict[str, Any] | None:
        return next((tool["function"] for tool in self.tools if tool["function"]["name"] == name), None)


def function_tool(name: object, description: object, parameters: object) -> dict[str, Any]:
    """A tool as llama-server hands it to the template: name, description ("" if none), parameters."""
    if not isinstance(parameters, dict) or not parameters:
        parameters = {"type": "object", "properties": {}}
    return {"type": "function", "function": {"name": name if isinstance(name, str) else "",
                                             "description": description if isinstance(description, str) else "",
                                             "parameters": parameters}}


def text_of(content: object, joiner: str = "\n") -> str:
    """A message's text: a string, or its text parts joined (llama-server joins them with newlines)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return joiner.join(str(part.get("text", "")) for part in content
                           if isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"))
    return ""


def openai_tool_choice(value: object) -> ToolChoice:
    """OpenAI's ``tool_choice``: a mode, or ``{"type": "function", "function": {"name": ...}}``."""
    if isinstance(value, str):
        return ToolChoice(value)
    if not isinstance(value, dict):
        return ToolChoice()
    function = value.get("function")
    name = function.get("name") if isinstance(function, dict) else value.get("name")
    return ToolChoice("required", name) if isinstance(name, str) else ToolChoice()


def openai_chat(body: dict[str, Any]) -> Chat:
    """An OpenAI chat request as a Chat (leniently: each fake checks its body first)."""
    messages = body.get("messages")
    tools = body.get("tools")
    return Chat(tuple(_openai_message(m) for m in messages) if isinstance(messages, list) else (),
                tuple(_openai_tool(t) for t in tools if isinstance(t, dict)) if isinstance(tools, list) else (),
                openai_tool_choice(body.get("tool_choice")))


def _openai_message(message: object) -> ChatMessage:
    if not isinstance(message, dict):
        return ChatMessage("user")
    role = message.get("role")
    role = "system" if role == "developer" else role if isinstance(role, str) else "user"
    calls = message.get("tool_calls") if isinstance(message.get("tool_calls"), list) else []
    return ChatMessage(role, text_of(message.get("content")), tuple(_openai_call(c) for c in calls),
                       str(message.get("tool_call_id") or ""))


def _openai_call(call: object) -> ToolCall:
    function = call.get("function") if isinstance(call, dict) else None
    function = function if isinstance(function, dict) else {}
    arguments = function.get("arguments", "")
    return ToolCall(str(function.get("name", "")), arguments if isinstance(arguments, str) else json.dumps(arguments),
                    str(call.get("id", "")) if isinstance(call, dict) else "")


def _openai_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    return function_tool(function.get("name"), function.get("description"), function.get("parameters"))


def call_head(name: str) -> str:
    """What a model writes before a call's arguments; ``CALL_TAIL`` comes after them."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": '


CALL_TAIL = "}\n</tool_call>"


def _to_json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)  # the template's ``tojson``: ", " and ": ", no escapes


def _arguments_json(arguments: str) -> str:
    """Arguments as an object where they parse (llama-server hands the template objects), else a string."""
    try:
        return _to_json(json.loads(arguments))
    except ValueError:
        return _to_json(arguments)


def render(messages: Sequence[ChatMessage], tools: Sequence[dict[str, Any]] = ()) -> str:
    """``chatml_tools.jinja`` with ``add_generation_prompt``; a last assistant message is continued."""
    messages = list(messages)
    continued = messages.pop().content if messages and messages[-1].role == "assistant" else None
    system = messages[0].content if messages and messages[0].role == "system" else DEFAULT_SYSTEM
    if tools:
        out = ["<|im_start|>system\n", system, TOOLS_HEAD, *("\n" + _to_json(tool) for tool in tools), TOOLS_TAIL]
    else:
        out = [f"<|im_start|>system\n{system}<|im_end|>\n"]
    for i, message in enumerate(messages):
        before = messages[i - 1].role if i > 0 else None
        after = messages[i + 1].role if i + 1 < len(messages) else None
        if message.role == "system" and i == 0:
            continue  # rendered above
        if message.role in ("user", "system") or (message.role == "assistant" and not message.tool_calls):
            out.append(f"<|im_start|>{message.role}\n{message.content}<|im_end|>\n")
        elif message.role == "assistant":
            out.append("<|im_start|>assistant" + (f"\n{message.content}" if message.content else ""))
            out += [f"\n{call_head(call.name)}{_arguments_json(call.arguments)}{CALL_TAIL}"
                    for call in message.tool_calls]
            out.append("<|im_end|>\n")
        elif message.role == "tool":
            out.append(("<|im_start|>user" if before != "tool" else "") + f"\n<tool_response>\n{message.content}\n"
                       "</tool_response>" + ("<|im_end|>\n" if after != "tool" else ""))
    out.append(ASSISTANT_START + (continued or ""))
    return "".join(out)
