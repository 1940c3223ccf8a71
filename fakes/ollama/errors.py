"""Ollama's errors: ``{"error": "<message>"}`` natively, OpenAI's envelope on ``/v1``."""

from __future__ import annotations

from fakes.http11 import Exchange

MAX_QUEUE_MESSAGE = "server busy, please try again.  maximum pending requests exceeded"  # ErrMaxQueue


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
        kind = {400: "invalid_request_error", 404: "not_found_error"}.get(self.status, "api_error")
        return {"error": {"message": self.message, "type": kind, "param": None, "code": None}}


async def respond_error(ex: Exchange, err: OllamaError, *, openai: bool = False) -> None:
    await ex.respond_json(err.status, err.openai() if openai else err.native())


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
