"""The inference routes: which API each path speaks, and in whose words its errors are.

Every route goes through the same handler (``supervisor.gateway.openai.inference``): model and
class, queue, slots, unbuffered relay, usage. What differs is told here: the API (which
models serve it, ``supervisor.apis``), the error shape and the stream's error event
(OpenAI's, Anthropic's on the Messages routes, the Responses API's error event), the body
(JSON, or a multipart form for transcriptions), and the client headers the engine needs.
The Ollama listener uses the same table for its /v1 routes.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

import attrs

from supervisor.apis import Api
from supervisor.gateway.http.asgi import Scope
from supervisor.gateway.errors import (
    ErrorShape,
    StreamError,
    anthropic_error_body,
    anthropic_stream_error,
    error_body,
    error_in_stream,
    responses_stream_error,
)


class BodyKind(enum.Enum):
    JSON = "json"
    MULTIPART = "multipart"  # multipart/form-data: a file and its fields


@attrs.frozen
class ApiRoute:
    api: Api
    error_shape: ErrorShape = error_body
    stream_error: StreamError = error_in_stream
    body: BodyKind = BodyKind.JSON
    # Streams carry their usage only when asked (stream_options.include_usage): steward asks.
    asks_usage: bool = False
    # The client's headers the engine reads, beyond Accept (Anthropic's version and betas).
    forwarded: frozenset[bytes] = frozenset()
    # False for the token-counting routes: the count they answer is no work done (the usage log says 0).
    does_work: bool = True

    @property
    def anthropic(self) -> bool:
        return self.error_shape is anthropic_error_body


ANTHROPIC_HEADERS = frozenset({b"anthropic-version", b"anthropic-beta"})
_CHAT = ApiRoute(Api.CHAT, asks_usage=True)
_RESPONSES = ApiRoute(Api.RESPONSES, stream_error=responses_stream_error)
_MESSAGES = ApiRoute(Api.MESSAGES, anthropic_error_body, anthropic_stream_error, forwarded=ANTHROPIC_HEADERS)
_RERANK = ApiRoute(Api.RERANK)
_COUNTING = {"does_work": False}

API_ROUTES: Mapping[str, ApiRoute] = {
    "/v1/chat/completions": _CHAT,
    "/v1/completions": ApiRoute(Api.COMPLETIONS, asks_usage=True),
    "/v1/embeddings": ApiRoute(Api.EMBEDDINGS),
    "/v1/responses": _RESPONSES,
    "/v1/responses/input_tokens": attrs.evolve(_RESPONSES, **_COUNTING),
    "/v1/messages": _MESSAGES,
    "/v1/messages/count_tokens": attrs.evolve(_MESSAGES, **_COUNTING),
    "/v1/rerank": _RERANK,
    "/v1/reranking": _RERANK,
    "/rerank": _RERANK,
    "/v1/audio/transcriptions": ApiRoute(Api.TRANSCRIPTION, body=BodyKind.MULTIPART),
    "/v1/audio/speech": ApiRoute(Api.SPEECH),
}

# The paths each API is asked on, for messages that name the right one.
API_PATHS: Mapping[Api, str] = {Api.CHAT: "/v1/chat/completions", Api.COMPLETIONS: "/v1/completions",
                                Api.RESPONSES: "/v1/responses", Api.MESSAGES: "/v1/messages",
                                Api.EMBEDDINGS: "/v1/embeddings", Api.RERANK: "/v1/rerank",
                                Api.TRANSCRIPTION: "/v1/audio/transcriptions", Api.SPEECH: "/v1/audio/speech"}


def api_route(scope: Scope) -> ApiRoute:
    """The route of an inference path (chat completions' for a path outside the table)."""
    return API_ROUTES.get(scope.get("path", ""), _CHAT)


def error_shape_for(scope: Scope) -> ErrorShape:
    """The error shape a path's clients read: Anthropic's on the Messages routes and any path that
    begins as theirs (an Anthropic client asking for ``/v1/messages/batches`` reads Anthropic's
    404), else OpenAI's."""
    path = scope.get("path", "")
    route = API_ROUTES.get(path)
    if route is not None:
        return route.error_shape
    return anthropic_error_body if path.startswith(_MESSAGES_PREFIX) else error_body


_MESSAGES_PREFIX = "/v1/messages"


def stream_error_for(scope: Scope) -> StreamError:
    """How a path's open stream ends on an error (OpenAI's data event unless its API has its own)."""
    route = API_ROUTES.get(scope.get("path", ""))
    return route.stream_error if route is not None else error_in_stream
