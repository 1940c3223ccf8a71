"""vLLM's error shapes: ``{"error": {"message", "type", "param", "code"}}``, and FastAPI's ``{"detail"}``."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error answered as vLLM's ErrorResponse; the HTTP status equals ``code``."""

    def __init__(self, code: int, message: str, type_: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.body: dict[str, Any] = {"error": {"message": message, "type": type_, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "BadRequestError", param)


def validation_error(kind: str, loc: tuple[object, ...], msg: str, given: object) -> ApiError:
    """FastAPI's RequestValidationError, which vLLM turns into a 400 with pydantic's error list as text."""
    detail: dict[str, object] = {"type": kind, "loc": ("body", *loc), "msg": msg, "input": given}
    return bad_request(str([detail]))


def model_not_found(name: object) -> ApiError:
    return ApiError(404, f"The model `{name}` does not exist.", "NotFoundError", "model")


def server_error(message: str) -> ApiError:
    return ApiError(500, message, "InternalServerError")


# FastAPI's own answers for a path it has no route for, or a method the route does not take.
NOT_FOUND = {"detail": "Not Found"}
METHOD_NOT_ALLOWED = {"detail": "Method Not Allowed"}
UNAUTHORIZED = {"error": "Unauthorized"}  # vLLM's --api-key middleware
