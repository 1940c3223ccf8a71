"""OpenAI's ``POST /v1/audio/speech`` body, checked by steward before anything is queued.

A speech request that an engine would refuse should not wait in steward's queue (nor load a
model) to be refused there: steward reads the body as OpenAI's ``CreateSpeechRequest`` says
(``input`` 1..4096 characters, ``voice`` a name or ``{"id": ...}``, ``response_format`` one of
six, ``speed`` 0.25..4, ``stream_format`` ``audio`` or ``sse``) and answers a 400 in OpenAI's
shape naming the parameter. Where the model's config lists its ``voices``, a voice not among
them is refused too; without a list the engine says which voices it has. Fields beyond the
spec's (Kokoro-FastAPI's ``lang_code``, ``normalization_options``) go to the engine as they came.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import attrs

from supervisor.gateway.http.asgi import RequestError

E = TypeVar("E", bound=enum.Enum)
MAX_INPUT_CHARS = 4096  # OpenAI's maxLength for input and instructions
MIN_SPEED, MAX_SPEED = 0.25, 4.0


class AudioFormat(enum.Enum):
    """``response_format``: what the audio is encoded as (OpenAI's default: mp3)."""

    MP3 = "mp3"
    OPUS = "opus"
    AAC = "aac"
    FLAC = "flac"
    WAV = "wav"
    PCM = "pcm"  # raw 16-bit little-endian mono samples at 24 kHz, as OpenAI sends it


class StreamFormat(enum.Enum):
    AUDIO = "audio"  # the audio file's bytes, as they are made
    SSE = "sse"  # server-sent events: speech.audio.delta (base64 audio), then speech.audio.done


@attrs.frozen
class SpeechRequest:
    """What steward reads of a speech request: what the usage row and the audio meter need."""

    input_chars: int
    voice: str
    audio_format: AudioFormat
    stream_format: StreamFormat


def check_speech(payload: Mapping[str, Any], voices: Sequence[str] | None = None) -> SpeechRequest:
    """*payload* as a speech request, the model's configured *voices* (None: any) checked.

    Raises:
        RequestError: a 400 naming the parameter that is missing or wrong.
    """
    text = _text(payload, "input", required=True)
    _text(payload, "instructions", required=False)
    voice = _voice(payload.get("voice"), voices)
    audio_format = _choice(payload, "response_format", AudioFormat, AudioFormat.MP3)
    stream_format = _choice(payload, "stream_format", StreamFormat, StreamFormat.AUDIO)
    speed = payload.get("speed")
    if speed is not None:
        if isinstance(speed, bool) or not isinstance(speed, int | float):
            raise RequestError(400, f"Invalid type for 'speed': expected a number, but got {_kind(speed)}.",
                               param="speed", code="invalid_type")
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise RequestError(400, f"Invalid 'speed': {speed!r}. It must be from {MIN_SPEED} to {MAX_SPEED}.",
                               param="speed", code="invalid_value")
    return SpeechRequest(len(text), voice, audio_format, stream_format)


def read_speech(payload: Mapping[str, Any] | None) -> SpeechRequest | None:
    """*payload* as a speech request, or None if it is none (the answer's reader then measures nothing)."""
    if payload is None:
        return None
    try:
        return check_speech(payload)
    except RequestError:
        return None


def _text(payload: Mapping[str, Any], name: str, *, required: bool) -> str:
    value = payload.get(name)
    if value is None and not required:
        return ""
    if value is None:
        raise RequestError(400, f"Missing required parameter: '{name}'.", param=name,
                           code="missing_required_parameter")
    if not isinstance(value, str):
        raise RequestError(400, f"Invalid type for '{name}': expected a string, but got {_kind(value)}.",
                           param=name, code="invalid_type")
    if required and not value:
        raise RequestError(400, f"Invalid '{name}': empty string. Expected a string with minimum length 1.",
                           param=name, code="empty_string")
    if len(value) > MAX_INPUT_CHARS:
        raise RequestError(400, f"Invalid '{name}': string too long. Expected a string with maximum length "
                                f"{MAX_INPUT_CHARS}, but got a string with length {len(value)} instead.",
                           param=name, code="string_above_max_length")
    return value


def _voice(value: object, voices: Sequence[str] | None) -> str:
    """The voice's name: a string, or a custom voice's ``id``."""
    if isinstance(value, dict) and set(value) == {"id"}:
        value = value["id"]
    if value is None:
        raise RequestError(400, "Missing required parameter: 'voice'.", param="voice",
                           code="missing_required_parameter")
    if not isinstance(value, str) or not value:
        raise RequestError(400, "Invalid 'voice': expected a voice name, or an object {\"id\": NAME}.",
                           param="voice", code="invalid_type" if not isinstance(value, str) else "invalid_value")
    if voices is not None and value not in voices:
        shown = value if len(value) <= 64 else value[:64] + "..."
        raise RequestError(400, f"Invalid 'voice': {shown!r} is not a voice of this model. Supported values are: "
                                f"{', '.join(repr(v) for v in voices)}.", param="voice", code="invalid_value")
    return value


def _choice(payload: Mapping[str, Any], name: str, kind: type[E], default: E) -> E:
    value = payload.get(name)
    if value is None:
        return default
    try:
        return kind(value)
    except ValueError:
        shown = repr(value) if isinstance(value, str) and len(value) <= 64 else _kind(value)
        raise RequestError(400, f"Invalid '{name}': {shown}. Supported values are: "
                                f"{', '.join(repr(m.value) for m in kind)}.", param=name, code="invalid_value") \
            from None


def _kind(value: object) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "an object"}.get(type(value), "null" if value is None else "a value")
