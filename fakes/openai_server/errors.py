"""vLLM's error shapes: ``{"error": {"message", "type", "param", "code"}}``, and FastAPI's ``{"detail"}``.

Two shapes of a request that fails validation: the chat and text routes keep the one the
fake's tests pin (``validation_error``: pydantic's list as text, type ``BadRequestError``);
the Messages routes give vLLM 0.32's (``invalid_request``: "N validation errors:" with the
locations dotted, type ``Bad Request``). Past validation, vLLM's Messages handler answers in
Anthropic's shape, ``{"type": "error", "error": {"type", "message"}}`` (``anthropic_error``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MAX_INPUT_CHARS = 200  # vLLM 0.32 echoes at most this much of a bad value


class ApiError(Exception):
    """An error answered as vLLM's ErrorResponse; the HTTP status equals ``code``."""

    def __init__(self, code: int, message: str, type_: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.body: dict[str, Any] = {"error": {"message": message, "type": type_, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "BadRequestError", param)


def validation_error(kind: str, loc: tuple[object, ...], msg: str, given: object,
                     ctx: dict[str, object] | None = None) -> ApiError:
    """FastAPI's RequestValidationError, which vLLM turns into a 400 with pydantic's error list as text."""
    detail: dict[str, object] = {"type": kind, "loc": ("body", *loc), "msg": msg, "input": given}
    if ctx:
        detail["ctx"] = ctx
    return bad_request(str([detail]))


def problem(kind: str, loc: tuple[object, ...], msg: str, given: object,
            ctx: dict[str, object] | None = None) -> dict[str, object]:
    """One pydantic error as vLLM 0.32 reports it: the location dotted, a container only described."""
    if isinstance(given, (list, tuple, dict)):
        shown = f"<{type(given).__name__} of {len(given)} items>"
    else:
        text = str(given)
        shown = text[:MAX_INPUT_CHARS] + "...[truncated]" if len(text) > MAX_INPUT_CHARS else text
    found: dict[str, object] = {"type": kind, "loc": ".".join(map(str, ("body", *loc))), "msg": msg, "input": shown}
    if ctx:
        found["ctx"] = ctx
    return found


def invalid_request(problems: Sequence[dict[str, object] | str]) -> ApiError:
    """vLLM 0.32's answer to a request that fails validation; param is the first problem's location."""
    label = "error" if len(problems) == 1 else "errors"
    message = f"{len(problems)} validation {label}:\n" + "".join(f"  {p}\n" for p in problems)
    first = problems[0]
    return ApiError(400, message.rstrip(), "Bad Request", str(first["loc"]) if isinstance(first, dict) else None)


def invalid_field(kind: str, loc: tuple[object, ...], msg: str, given: object,
                  ctx: dict[str, object] | None = None) -> ApiError:
    return invalid_request([problem(kind, loc, msg, given, ctx)])


def model_not_found(name: object, served: Sequence[str] = ()) -> ApiError:
    """vLLM 0.32 names the served models (*served*); the chat routes' pinned message does not."""
    aliases = f" Valid aliases: {', '.join(served)}." if served else ""
    return ApiError(404, f"The model `{name}` does not exist.{aliases}", "NotFoundError", "model")


def server_error(message: str) -> ApiError:
    return ApiError(500, message, "InternalServerError")


def anthropic_error(err: ApiError) -> ApiError:
    """*err* in Anthropic's shape, as vLLM's Messages route translates its handler's errors."""
    error = err.body["error"]
    translated = ApiError(err.code, error["message"], error["type"])
    translated.body = {"type": "error", "error": {"type": error["type"], "message": error["message"]}}
    return translated


# FastAPI's own answers for a path it has no route for, or a method the route does not take.
NOT_FOUND = {"detail": "Not Found"}
METHOD_NOT_ALLOWED = {"detail": "Method Not Allowed"}
UNAUTHORIZED = {"error": "Unauthorized"}  # vLLM's --api-key middleware
