"""Request bodies -> Job, checked the way vLLM's pydantic models and serving classes check them.

Prompts cost what a real engine counts (``fakes.chat_tokens``): a chat is rendered by the fake
model's chat template first (``fakes.chat_template``: ChatML, the tools' JSON schemas in the
system message), a text prompt is counted as it is; a token-id prompt is its length.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs

from fakes.chat_template import openai_chat
from fakes.chat_tokens import count_tokens
from fakes.openai_server.cli import Config
from fakes.openai_server.errors import ApiError, bad_request, model_not_found, validation_error

InvalidField = Callable[..., ApiError]  # (kind, loc, msg, given[, ctx]): errors.validation_error's


@attrs.frozen
class Job:
    model: str            # as the answer names it: the first served name
    n_prompt: int
    max_tokens: int
    stream: bool
    include_usage: bool   # stream_options.include_usage: a last chunk with empty choices
    continuous_usage: bool  # stream_options.continuous_usage_stats: usage in every chunk


def body_json(raw: bytes, invalid: InvalidField = validation_error) -> dict[str, Any]:
    """The body as a JSON object; else the error *invalid* makes (the route's validation shape)."""
    try:
        body = json.loads(raw)
    except ValueError as exc:  # also bytes that are not UTF-8
        position, why = (exc.pos, exc.msg) if isinstance(exc, json.JSONDecodeError) else (0, str(exc))
        raise invalid("json_invalid", (position,), "JSON decode error", {}, {"error": why}) from None
    if not isinstance(body, dict):
        raise invalid("model_attributes_type", (),
                      "Input should be a valid dictionary or object to extract fields from", body)
    return body


def chat_tokens(body: dict[str, Any]) -> int:
    messages = body.get("messages")
    if "messages" not in body:
        raise validation_error("missing", ("messages",), "Field required", body)
    if not isinstance(messages, list):
        raise validation_error("list_type", ("messages",), "Input should be a valid list", messages)
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            raise validation_error("missing", ("messages", i, "role"), "Field required", message)
    return openai_chat(body).n_tokens


def prompt_tokens(body: dict[str, Any]) -> int:
    prompt = body.get("prompt")
    if "prompt" not in body:
        raise validation_error("missing", ("prompt",), "Field required", body)
    if isinstance(prompt, str):
        return max(1, count_tokens(prompt))
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return max(1, count_tokens(prompt[0]))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)  # token ids
    if isinstance(prompt, list) and prompt == []:
        raise bad_request("Prompt cannot be empty")
    raise ApiError(400, "the fake vLLM takes one prompt (a string or token ids) per request", "BadRequestError")


def build_job(body: dict[str, Any], cfg: Config, n_prompt: int, *, chat: bool) -> Job:
    model = body.get("model")
    if model is not None and model not in cfg.served_model_names:
        raise model_not_found(model)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise validation_error("bool_type", ("stream",), "Input should be a valid boolean", stream)
    options = body.get("stream_options")
    if options is not None and not stream:
        raise bad_request("Stream options can only be defined when `stream=True`.")
    options = options if isinstance(options, dict) else {}
    max_tokens = _max_tokens(body, cfg, n_prompt, chat=chat)
    return Job(model=cfg.model_name, n_prompt=n_prompt, max_tokens=max_tokens, stream=stream,
               include_usage=bool(options.get("include_usage")),
               continuous_usage=bool(options.get("continuous_usage_stats")))


def _max_tokens(body: dict[str, Any], cfg: Config, n_prompt: int, *, chat: bool) -> int:
    limit = cfg.max_model_len
    if n_prompt >= limit:
        raise bad_request(f"This model's maximum context length is {limit} tokens. However, your request has "
                          f"{n_prompt} input tokens. Please reduce the length of the input messages.")
    value = body.get("max_completion_tokens") if chat else None
    if value is None:
        value = body.get("max_tokens")
    if value is None:
        return min(cfg.default_max_tokens, limit - n_prompt)
    if not isinstance(value, int) or isinstance(value, bool):
        raise validation_error("int_type", ("max_tokens",), "Input should be a valid integer", value)
    if value < 1:
        raise bad_request(f"max_tokens must be at least 1, got {value}.")
    if value > limit - n_prompt:
        raise bad_request(f"'max_tokens' or 'max_completion_tokens' is too large: {value}. This model's maximum "
                          f"context length is {limit} tokens and your request has {n_prompt} input tokens "
                          f"({value} > {limit} - {n_prompt}).")
    return value
