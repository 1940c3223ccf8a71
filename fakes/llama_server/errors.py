"""llama-server's JSON error envelope: ``{"error": {"code", "message", "type", ...}}``."""

from __future__ import annotations

from typing import Any

from fakes.http11 import Exchange


class ApiError(Exception):
    """An error answered in llama-server's envelope; the HTTP status equals ``code``."""

    def __init__(self, code: int, message: str, type_: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.body = {"error": {"code": code, "message": message, "type": type_, **extra}}


async def respond_error(ex: Exchange, err: ApiError) -> None:
    await ex.respond_json(err.code, err.body)


def invalid_request(message: str) -> ApiError:
    return ApiError(400, message, "invalid_request_error")


def not_supported(what: str, flag: str) -> ApiError:
    return ApiError(501, f"This server does not support {what}. Start it with `{flag}`", "not_supported_error")


def no_audio() -> ApiError:
    """A transcription on a model without a multimodal projector that hears (the fake: no ``--mmproj``)."""
    return ApiError(501, "The current model does not support audio input.", "not_supported_error")


def server_error(message: str) -> ApiError:
    """What llama-server's handler wrapper answers for an exception that is not an invalid_argument."""
    return ApiError(500, message, "server_error")


def no_logits() -> ApiError:
    """Any generation on an encoder (embedding or rerank) model: it has no KV memory to decode with."""
    return server_error("the current context does not support logits computation. skipping")


def loading() -> ApiError:
    return ApiError(503, "Loading model", "unavailable_error")


NOT_FOUND_BODY = {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}


def exceed_context(n_prompt: int, n_ctx: int) -> ApiError:
    return ApiError(400, f"request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens), "
                         "try increasing it", "exceed_context_size_error", n_prompt_tokens=n_prompt, n_ctx=n_ctx)


def input_too_large(n_tokens: int, n_ctx: int) -> ApiError:
    return ApiError(400, f"input ({n_tokens} tokens) is larger than the max context size ({n_ctx} tokens). skipping",
                    "exceed_context_size_error", n_prompt_tokens=n_tokens, n_ctx=n_ctx)
