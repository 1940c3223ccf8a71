"""Request bodies as Ollama's Go structs read them: JSON, fields, keep_alive, prompts, embedding inputs.

Deterministic "tokenizer" (shared with the fake llama-server): one token per word, +4 per chat message.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from fakes.http11 import Request
from fakes.llama_server.parsing import ERROR_HOOK, count_words, message_text
from fakes.ollama.errors import OllamaError, bad_request
from fakes.ollama.gotime import keep_alive_seconds

_GO_KINDS = {bool: "bool", int: "number", float: "number", str: "string", list: "array", dict: "object"}


def go_kind(value: object) -> str:
    """The JSON kind Go's decoder names in its errors: ``string``, ``number``, ``object``..."""
    return _GO_KINDS.get(type(value), "value")


def body_json(request: Request, struct: str) -> dict[str, Any]:
    """The body as a JSON object; Go's errors (as gin's ShouldBindJSON reports them) otherwise."""
    if not request.body.strip():
        raise bad_request("missing request body")
    try:
        # Go's decoder turns bytes that are not UTF-8 into U+FFFD; Python's would keep them as surrogates.
        value = json.loads(request.body.decode("utf-8", "replace"))
    except ValueError as exc:
        raise bad_request(f"invalid character in JSON body: {getattr(exc, 'msg', exc)}") from None
    except RecursionError:
        # Go's decoder message; it gives it past 10,000 levels, the fake past what Python parses (~1,000).
        raise bad_request("exceeded max depth") from None
    if not isinstance(value, dict):
        raise bad_request(f"json: cannot unmarshal {go_kind(value)} into Go value of type {struct}")
    return value


def typed_field(body: dict[str, Any], key: str, where: str, go_type: str, kinds: tuple[type, ...]) -> Any:
    """``body[key]`` if its JSON type is one of *kinds* (exactly: a bool is no number); None when absent or null.

    Otherwise Go's decoder error as gin's ShouldBindJSON reports it, *where* naming the struct field
    (``MessagesRequest.max_tokens``) and *go_type* its Go type.
    """
    value = body.get(key)
    if value is None or type(value) in kinds:
        return value
    raise bad_request(f"json: cannot unmarshal {go_kind(value)} into Go struct field {where} of type {go_type}")


def string_field(body: dict[str, Any], key: str, struct: str) -> str:
    return typed_field(body, key, f"{struct.rsplit('.', 1)[-1]}.{key}", "string", (str,)) or ""


def model_name(body: dict[str, Any], struct: str) -> str:
    name = string_field(body, "model", struct) or string_field(body, "name", struct)  # "name": older clients
    if not name:
        raise bad_request("model is required")
    return name


def keep_alive(body: dict[str, Any]) -> float | None:
    try:
        return keep_alive_seconds(body.get("keep_alive"))
    except ValueError as exc:
        raise bad_request(str(exc)) from None


def stream_flag(body: dict[str, Any], default: bool) -> bool:
    value = body.get("stream")
    return default if value is None else bool(value)


def num_predict(value: object) -> int | None:
    """``options.num_predict`` / OpenAI ``max_tokens``: None (or negative) = until the model stops."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return int(value)
    return None


@attrs.frozen
class Job:
    """A generation request, validated."""

    n_prompt: int
    num_predict: int | None
    stream: bool
    prompt_text: str

    @property
    def error_hook(self) -> bool:
        return ERROR_HOOK in self.prompt_text


def chat_messages(body: dict[str, Any]) -> tuple[str, int, int]:
    """(prompt text, prompt tokens, number of messages) of a ``messages`` list."""
    messages = body.get("messages") or []
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise bad_request("json: cannot unmarshal messages: expected an array of objects")
    return conversation([message_text(m.get("content")) for m in messages])


def conversation(texts: list[str]) -> tuple[str, int, int]:
    """(prompt text, prompt tokens, number of messages) of the messages' texts, as the chat handler gets them."""
    text = "\n".join(texts)
    return text, count_words(text) + 4 * len(texts), len(texts)


def embed_inputs(value: object, *, openai: bool = False) -> list[str]:
    """``input`` of /api/embed or /v1/embeddings: a string or a list of strings ([] = load only)."""
    if value is None or value == "":
        if openai:
            raise OllamaError(400, "invalid input")
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    if openai and isinstance(value, list) and all(isinstance(v, int) for v in value):
        return [" ".join(map(str, value))]  # one input given as token ids
    raise bad_request("invalid input type")


__all__ = ["Job", "body_json", "chat_messages", "conversation", "count_words", "embed_inputs", "go_kind",
           "keep_alive", "model_name", "num_predict", "stream_flag", "string_field", "typed_field"]
