"""Ollama's errors in the three shapes its routes answer with.

Native routes write ``{"error": "<message>"}``; the OpenAI middleware (``openai.NewError``) and
the Anthropic middleware (``anthropic.NewError``) turn that same message and status into their
own envelopes. Which one a request gets follows its route: :class:`ErrorShape`.
"""

from __future__ import annotations

import enum
import secrets

from fakes.http11 import Exchange

MAX_QUEUE_MESSAGE = "server busy, please try again.  maximum pending requests exceeded"  # ErrMaxQueue

_OPENAI_TYPES = {400: "invalid_request_error", 404: "not_found_error"}
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 429: "rate_limit_error", 503: "overloaded_error",
                    529: "overloaded_error"}


class ErrorShape(enum.Enum):
    NATIVE = "native"          # /api/*: {"error": "..."}
    OPENAI = "openai"          # /v1/* except /v1/messages: {"error": {"message", "type", "param", "code"}}
    ANTHROPIC = "anthropic"    # /v1/messages: {"type": "error", "error": {"type", "message"}, "request_id"}


class OllamaError(Exception):
    """An error answered before any byte of the response was sent; ``status`` is the HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def native(self) -> dict[str, object]:
        return {"error": self.message}

    def openai(self) -> dict[str, object]:
        """``openai.NewError``: the type follows the status code, which is kept."""
        kind = _OPENAI_TYPES.get(self.status, "api_error")
        return {"error": {"message": self.message, "type": kind, "param": None, "code": None}}

    def anthropic(self) -> dict[str, object]:
        """``anthropic.NewError``: a type per status and a fresh ``req_<24 hex>`` request id."""
        kind = _ANTHROPIC_TYPES.get(self.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": self.message},
                "request_id": "req_" + secrets.token_hex(12)}

    def body(self, shape: ErrorShape) -> dict[str, object]:
        match shape:
            case ErrorShape.NATIVE:
                return self.native()
            case ErrorShape.OPENAI:
                return self.openai()
            case ErrorShape.ANTHROPIC:
                return self.anthropic()


async def respond_error(ex: Exchange, err: OllamaError, shape: ErrorShape = ErrorShape.NATIVE) -> None:
    await ex.respond_json(err.status, err.body(shape))


def bad_request(message: str) -> OllamaError:
    return OllamaError(400, message)


def model_not_found(name: str) -> OllamaError:
    """GetModel failing in the generate/chat/show handlers."""
    return OllamaError(404, f"model '{name}' not found")


def model_not_pulled(name: str) -> OllamaError:
    """The scheduler's ``handleScheduleError`` (embed routes)."""
    return OllamaError(404, f'model "{name}" not found, try pulling it first')


def unsupported(name: str, what: str) -> OllamaError:
    """An embedding-only model asked to generate or chat: ``"<m>" does not support generate``."""
    return OllamaError(400, f'"{name}" does not support {what}')


def server_busy() -> OllamaError:
    return OllamaError(503, MAX_QUEUE_MESSAGE)
