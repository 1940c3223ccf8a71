"""The APIs a model may serve, and what that makes the model for.

Steward's OpenAI listener speaks several APIs (chat completions, OpenAI's Responses,
Anthropic's Messages, embeddings, rerank, transcription, speech). Not every engine serves every
one: an embedding model (a BERT) in llama-server answers chat with a 500, and a server
started without ``--embeddings`` answers embeddings with a 501. So each model has the set of APIs it serves (its config's
``serves``, else its runtime's default from its arguments), and a request on a route its
model does not serve is refused by steward with a clear 400, never sent to the engine.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Api(enum.Enum):
    CHAT = "chat"  # /v1/chat/completions
    COMPLETIONS = "completions"  # /v1/completions
    RESPONSES = "responses"  # /v1/responses (and its input_tokens)
    MESSAGES = "messages"  # Anthropic's /v1/messages (and its count_tokens)
    EMBEDDINGS = "embeddings"  # /v1/embeddings
    RERANK = "rerank"  # /v1/rerank, /rerank, /v1/reranking
    TRANSCRIPTION = "transcription"  # /v1/audio/transcriptions
    SPEECH = "speech"  # /v1/audio/speech: text in, audio out (an OpenAI-compatible speech server)


# What a model that generates text serves: every generating API speaks to the same engine.
GENERATION = frozenset({Api.CHAT, Api.COMPLETIONS, Api.RESPONSES, Api.MESSAGES})


class ModelKind(enum.Enum):
    """What a model is for, as /v1/models tells clients such as Open WebUI."""

    CHAT = "chat"
    EMBEDDING = "embedding"
    RERANK = "rerank"
    TRANSCRIPTION = "transcription"
    SPEECH = "speech"
    IMAGE = "image"  # a ComfyUI workflow (runtime: comfyui): /v1/images/generations
    VIDEO = "video"  # a ComfyUI workflow with a video section: /v1/videos


def model_kind(apis: Iterable[Api]) -> ModelKind:
    served = set(apis)
    if served & GENERATION:
        return ModelKind.CHAT
    if Api.EMBEDDINGS in served:
        return ModelKind.EMBEDDING
    if Api.RERANK in served:
        return ModelKind.RERANK
    if Api.SPEECH in served:
        return ModelKind.SPEECH
    return ModelKind.TRANSCRIPTION


def api_names(apis: Iterable[Api]) -> list[str]:
    """In the enum's order, for messages and JSON."""
    served = set(apis)
    return [api.value for api in Api if api in served]
