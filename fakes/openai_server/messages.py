"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``) as vLLM 0.32 serves it.

vLLM turns a Messages request into a chat completion (streamed with ``include_usage`` and
``continuous_usage_stats``) and its chat stream back into Anthropic's events, each with an
``event:`` line: ``message_start`` (input tokens, output 0) and ``content_block_start`` with
the first token, one ``content_block_delta`` per token, then ``content_block_stop``,
``message_delta`` (``stop_reason`` and the usage) and ``message_stop``; no ``ping``, no
``data: [DONE]``. The whole answer is ``model_dump(exclude_none=True)``: no ``stop_sequence``.

Errors: a body that fails validation gets vLLM 0.32's validation answer (its own shape, not
Anthropic's); what the handler refuses after that (an unknown model, naming the served ones;
a prompt or max_tokens past the context) comes in Anthropic's ``{"type": "error", ...}``.
The prompt is counted as the chat it becomes: the ``system`` field is one system message.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import attrs

from fakes.http11 import Request
from fakes.openai_server.cli import Config
from fakes.openai_server.errors import (
    ApiError,
    anthropic_error,
    invalid_field,
    invalid_request,
    model_not_found,
    problem,
)
from fakes.openai_server.formats import sse
from fakes.openai_server.parsing import Job, body_json, build_job, chat_tokens

ROLES = ("user", "assistant", "system")
UNSUPPORTED_MEDIA = "Unsupported Media Type: Only 'application/json' is allowed"  # vLLM's validate_json_request
_BOOLS = {"true": True, "false": False, "yes": True, "no": False, "on": True, "off": False,
          "1": True, "0": False, "t": True, "f": False, "y": True, "n": False}  # pydantic's lax booleans


def messages_body(request: Request) -> dict[str, Any]:
    """A Messages request's body, checked as vLLM's pydantic model checks it."""
    body = _json_body(request)
    _raise_problems([*_conversation_problems(body), *_generation_problems(body)])
    return body


def count_body(request: Request) -> dict[str, Any]:
    """A count_tokens request's body: a conversation, nothing about generating."""
    body = _json_body(request)
    _raise_problems(list(_conversation_problems(body)))
    return body


def _json_body(request: Request) -> dict[str, Any]:
    if request.headers.get("content-type", "").lower().split(";", 1)[0] != "application/json":
        raise invalid_request([UNSUPPORTED_MEDIA])
    return body_json(request.body, invalid_field)


def _raise_problems(problems: list[dict[str, object]]) -> None:
    if problems:
        raise invalid_request(problems)


def _conversation_problems(body: dict[str, Any]) -> Iterator[dict[str, object]]:
    model = body.get("model")
    if "model" not in body:
        yield problem("missing", ("model",), "Field required", body)
    elif not isinstance(model, str):
        yield problem("string_type", ("model",), "Input should be a valid string", model)
    elif not model:
        yield _value_error(("model",), "Model is required", model)
    messages = body.get("messages")
    if "messages" not in body:
        yield problem("missing", ("messages",), "Field required", body)
    elif not isinstance(messages, list):
        yield problem("list_type", ("messages",), "Input should be a valid list", messages)
    else:
        for i, message in enumerate(messages):
            yield from _message_problems(i, message)


def _generation_problems(body: dict[str, Any]) -> Iterator[dict[str, object]]:
    if "max_tokens" not in body:
        yield problem("missing", ("max_tokens",), "Field required", body)
    elif (tokens := _lax_int(body["max_tokens"])) is None:
        yield problem("int_type", ("max_tokens",), "Input should be a valid integer", body["max_tokens"])
    elif tokens <= 0:
        yield _value_error(("max_tokens",), "max_tokens must be positive", body["max_tokens"])
    if _lax_bool(body.get("stream")) is None:
        yield problem("bool_parsing", ("stream",), "Input should be a valid boolean, unable to interpret input",
                      body["stream"])


def _message_problems(i: int, message: object) -> Iterator[dict[str, object]]:
    if not isinstance(message, dict):
        yield problem("model_type", ("messages", i), "Input should be a valid dictionary or instance of "
                      "AnthropicMessage", message, {"class_name": "AnthropicMessage"})
        return
    if "role" not in message:
        yield problem("missing", ("messages", i, "role"), "Field required", message)
    elif message["role"] not in ROLES:
        expected = "'user', 'assistant' or 'system'"
        yield problem("literal_error", ("messages", i, "role"), f"Input should be {expected}", message["role"],
                      {"expected": expected})
    if "content" not in message:
        yield problem("missing", ("messages", i, "content"), "Field required", message)


def _value_error(loc: tuple[object, ...], why: str, given: object) -> dict[str, object]:
    # pydantic puts the validator's exception itself in ctx; vLLM prints it with its repr.
    return problem("value_error", loc, f"Value error, {why}", given, {"error": ValueError(why)})


def _lax_int(value: object) -> int | None:
    """pydantic's lax int: a bool, a whole float and a number in a string count too."""
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return int(value)
    return None


def _lax_bool(value: object) -> bool | None:
    """pydantic's lax bool (None: not given, so False); None back when it is not one."""
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    return _BOOLS.get(value.lower()) if isinstance(value, str) else None


def input_tokens(body: dict[str, Any]) -> int:
    """The chat it becomes: the ``system`` field, then the messages (only text blocks count), the tools."""
    system = body.get("system")
    tools = body.get("tools") if isinstance(body.get("tools"), list) else []
    return chat_tokens({"messages": [{"role": "system", "content": system}] * bool(system) + body["messages"],
                        "tools": [{"name": tool.get("name"), "description": tool.get("description"),
                                   "parameters": tool.get("input_schema")} for tool in tools if isinstance(tool, dict)]})


def checked_model(body: dict[str, Any], cfg: Config) -> None:
    if body["model"] not in cfg.served_model_names:
        raise anthropic_error(model_not_found(body["model"], cfg.served_model_names))


def messages_job(body: dict[str, Any], cfg: Config) -> Job:
    """A validated Messages body -> the job of the chat completion vLLM makes of it."""
    checked_model(body, cfg)
    stream = _lax_bool(body.get("stream"))
    chat: dict[str, Any] = {"model": body["model"], "max_tokens": _lax_int(body["max_tokens"]), "stream": stream}
    if stream:
        chat["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    try:
        return build_job(chat, cfg, input_tokens(body), chat=True)
    except ApiError as err:  # the context checks: the handler's errors, so Anthropic's shape
        raise anthropic_error(err) from None


def token_count(body: dict[str, Any], cfg: Config) -> dict[str, Any]:
    """``/v1/messages/count_tokens``: the prompt the request would have."""
    checked_model(body, cfg)
    n = input_tokens(body)
    return {"input_tokens": n, "context_management": {"original_input_tokens": n}}


@attrs.define
class MessagesFormat:
    """One Messages answer (an ``AnswerShape``); its id is the chat completion's, as in vLLM."""

    job: Job
    id: str = attrs.field(factory=lambda: f"chatcmpl-{uuid.uuid4().hex}", init=False)

    def _usage(self, n_completion: int) -> dict[str, int]:
        return {"input_tokens": self.job.n_prompt, "output_tokens": n_completion}

    def opening(self) -> list[bytes]:
        message = {"id": self.id, "type": "message", "role": "assistant", "content": [], "model": self.job.model,
                   "stop_reason": None, "stop_sequence": None, "usage": self._usage(0)}
        return [sse({"type": "message_start", "message": message}, "message_start"),
                sse({"type": "content_block_start", "content_block": {"type": "text", "text": ""}, "index": 0},
                    "content_block_start")]

    def token(self, piece: str, n_done: int, last: bool) -> list[bytes]:
        return [sse({"type": "content_block_delta", "delta": {"type": "text_delta", "text": piece}, "index": 0},
                    "content_block_delta")]

    def closing(self, n_completion: int) -> list[bytes]:
        # The fake only stops at max_tokens: vLLM's "length", Anthropic's "max_tokens".
        delta = {"stop_reason": "max_tokens", "stop_sequence": None}
        return [sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
                sse({"type": "message_delta", "delta": delta, "usage": self._usage(n_completion)}, "message_delta"),
                sse({"type": "message_stop"}, "message_stop")]

    def response(self, text: str, n_completion: int) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "content": [{"type": "text", "text": text}],
                "model": self.job.model, "stop_reason": "max_tokens", "usage": self._usage(n_completion)}
