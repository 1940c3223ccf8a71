"""The fake model as an agent sees it: a tool call when asked for one, an answer after its result.

Deterministic rules, on a ``Chat`` whose request offers tools (and whose ``tool_choice`` is not
``none``), by its last message other than a system message (Claude Code sends its environment as a
system message after the user's):

* the last message is a tool result -> a text answer that names the tool and quotes the result's
  first line ("read_file returned: ...");
* the last message is the user's and ``tool_choice`` names a function, or is ``required``, or the
  user's text asks for one of the offered tools by name: "call", "use", "run" or "invoke", then
  the name as a word ("use the `grep` tool", "call read_file with ..."; the first one asked for
  wins; a tool merely named, "Write a test", is not asked for; ``required`` without a name takes
  the first tool) -> a call of that tool. Its arguments are the first JSON object written in the
  user's text, when there is one; else every required property of the tool's schema with a
  plausible value of its type (``path``: ``README.md``, an enum's first value, ...);
* else nothing: the fake model talks as it does without tools.

One more rule, with tools or without: the latest user message says ``Reply exactly:`` and then a
JSON string (``Reply exactly: "Done."``) -> the answer is that string, to the character
(``dictated_reply``): a model that does as it is told, for a test that dictates, say, the edit
aider's edit format asks for (a file's name on a line, then its new text in a fenced block).
"""

from __future__ import annotations

import json
import re
import secrets
import string
from typing import Any

from fakes.chat_template import Chat, ChatMessage, ToolCall

_ALNUM = string.ascii_letters + string.digits
_EXCERPT_CHARS = 80
_DICTATED = re.compile(r"Reply exactly:\s*")
# Plausible strings by property name: an agent's usual arguments.
_STRING_EXAMPLES = (("path", "README.md"), ("file", "README.md"), ("dir", "."), ("command", "ls"),
                    ("url", "https://example.com"), ("pattern", "TODO"), ("query", "TODO"), ("glob", "*.py"),
                    ("content", "hello"), ("text", "hello"))


def call_id() -> str:
    """llama-server's tool call ids: 32 random letters and digits, no prefix."""
    return "".join(secrets.choice(_ALNUM) for _ in range(32))


def tool_reply(chat: Chat) -> ToolCall | str | None:
    """The fake model's answer to *chat*: a tool call, a text about a tool's result, or None (no tool work)."""
    if not chat.tools or chat.tool_choice.mode == "none" or not chat.messages:
        return None
    last = next((m for m in reversed(chat.messages) if m.role != "system"), chat.messages[-1])
    if last.role == "tool":
        return _result_answer(chat.messages, last)
    if last.role != "user":
        return None
    name = _chosen_tool(chat, last.content)
    if name is None:
        return None
    tool = chat.tool(name) or {}
    arguments = _written_arguments(last.content)
    if arguments is None:
        arguments = example_value(tool.get("parameters", {}))
    return ToolCall(name, json.dumps(arguments, ensure_ascii=False), call_id())


def _chosen_tool(chat: Chat, text: str) -> str | None:
    names = chat.tool_names()
    if chat.tool_choice.name in names:
        return chat.tool_choice.name
    named = [(match.start(), name) for name in names if (match := re.search(
        rf"\b(?i:call|use|run|invoke)\s+(?i:the\s+)?`?{re.escape(name)}(?![\w-])", text))]
    if named:
        return min(named)[1]
    return names[0] if chat.tool_choice.mode == "required" else None


def _written_arguments(text: str) -> dict[str, Any] | None:
    """The first JSON object in *text* ("... with {"path": "src/main.py"}"), if any."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def example_value(schema: object, name: str = "") -> Any:
    """A plausible value for a JSON schema: an object gets its required properties."""
    if not isinstance(schema, dict):
        return {}
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    kind = schema.get("type")
    kind = next((k for k in kind if k != "null"), "string") if isinstance(kind, list) else kind
    if kind == "object" or (kind is None and "properties" in schema):
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        required = [key for key in schema.get("required", []) if isinstance(key, str)]
        return {key: example_value(properties.get(key, {}), key) for key in required}
    if kind == "array":
        return [example_value(schema.get("items", {}), name)] if schema.get("minItems", 0) else []
    if kind == "integer":
        return int(schema.get("minimum", 1))
    if kind == "number":
        return float(schema.get("minimum", 1.0))
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    lowered = name.lower()
    return next((example for key, example in _STRING_EXAMPLES if key in lowered), "example")


def _result_answer(messages: tuple[ChatMessage, ...], result: ChatMessage) -> str:
    calls = [call for message in messages for call in message.tool_calls]
    name = next((call.name for call in calls if call.id == result.tool_call_id), calls[-1].name if calls else "tool")
    first = result.content.strip().split("\n", 1)[0]
    excerpt = first if len(first) <= _EXCERPT_CHARS else first[:_EXCERPT_CHARS] + "..."
    return f"{name} returned: {excerpt}" if excerpt else f"{name} returned nothing."


def dictated_reply(chat: Chat) -> str | None:
    """The JSON string after ``Reply exactly:`` in the latest user message, if it has one."""
    text = next((message.content for message in reversed(chat.messages) if message.role == "user"), "")
    marker = _DICTATED.search(text)
    if marker is None:
        return None
    try:
        value, _ = json.JSONDecoder().raw_decode(text, marker.end())
    except ValueError:
        return None
    return value if isinstance(value, str) else None
