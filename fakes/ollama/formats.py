"""Response shapes: native NDJSON generate/chat, OpenAI-compatible chat/text (SSE), the model catalogue.

A format (:class:`Format`) frames stream events (an NDJSON line, an SSE ``data:`` event or a
named SSE ``event:``), builds the token events, the final events and the whole non-streamed
response from an :class:`Outcome`. The Responses and Anthropic Messages formats live in
``openai_responses`` and ``anthropic_messages``.
"""

from __future__ import annotations

import random
import time
from typing import Any, ClassVar, Protocol

import attrs

from fakes.http11 import dump_json
from fakes.ollama.cli import ModelSpec
from fakes.ollama.errors import ErrorShape, OllamaError
from fakes.ollama.gotime import nanoseconds, rfc3339

NO_METRICS = ("load", "unload")


@attrs.frozen
class Outcome:
    text: str
    n_prompt: int
    n_eval: int
    done_reason: str          # stop | length | load | unload
    total_s: float = 0.0
    load_s: float = 0.0
    prompt_s: float = 0.0
    eval_s: float = 0.0

    def metrics(self) -> dict[str, int]:
        """Ollama's ``Metrics`` (all ``omitempty``: zero values are left out), in nanoseconds."""
        if self.done_reason in NO_METRICS:
            return {}
        values = {"total_duration": nanoseconds(self.total_s), "load_duration": nanoseconds(self.load_s),
                  "prompt_eval_count": self.n_prompt, "prompt_eval_duration": nanoseconds(self.prompt_s),
                  "eval_count": self.n_eval, "eval_duration": nanoseconds(self.eval_s)}
        return {k: v for k, v in values.items() if v}

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.n_prompt, "completion_tokens": self.n_eval,
                "total_tokens": self.n_prompt + self.n_eval}


class Format(Protocol):
    """What the engine needs of a response shape; one instance serves one request (it may keep state)."""

    error_shape: ClassVar[ErrorShape]
    content_type: ClassVar[bytes]
    trailer: ClassVar[bytes]           # after the final events of a stream

    def frame(self, value: dict[str, Any]) -> bytes: ...

    def error_frame(self, message: str) -> bytes:
        """What a stream that fails after it started sends last (b"": nothing)."""
        ...

    def token_events(self, piece: str) -> list[dict[str, Any]]: ...

    def final_events(self, out: Outcome) -> list[dict[str, Any]]: ...

    def response(self, out: Outcome) -> dict[str, Any]: ...


class NdjsonFraming:
    error_shape = ErrorShape.NATIVE
    content_type = b"application/x-ndjson"
    trailer = b""

    def frame(self, value: object) -> bytes:
        return dump_json(value) + b"\n"

    def error_frame(self, message: str) -> bytes:
        return self.frame({"error": message})


class SseFraming:
    error_shape = ErrorShape.OPENAI
    content_type = b"text/event-stream"
    trailer = b"data: [DONE]\n\n"

    def frame(self, value: object) -> bytes:
        return b"data: " + dump_json(value) + b"\n\n"

    def error_frame(self, message: str) -> bytes:
        return self.frame(OllamaError(500, message).openai())


class NamedEventFraming:
    """``event: <type>`` + ``data: <json>`` (the Responses and Anthropic writers' ``writeEvent``), no trailer.

    A failure after the stream started: Ollama's chat handler writes ``{"error": ...}`` through the
    middleware, which reads it as an empty chat chunk that makes no event, so the stream just ends
    without its closing events.
    """

    error_shape: ClassVar[ErrorShape]
    content_type = b"text/event-stream"
    trailer = b""

    def frame(self, value: dict[str, Any]) -> bytes:
        return b"event: " + str(value["type"]).encode() + b"\ndata: " + dump_json(value) + b"\n\n"

    def error_frame(self, message: str) -> bytes:
        return b""


class NativeFormat(NdjsonFraming):
    """Ollama's own routes: one line per piece; the last line (``_done``) has the metrics."""

    def _line(self, text: str, done: bool) -> dict[str, Any]:
        raise NotImplementedError

    def _done(self, out: Outcome, text: str) -> dict[str, Any]:
        raise NotImplementedError

    def token_events(self, piece: str) -> list[dict[str, Any]]:
        return [self._line(piece, False)]

    def final_events(self, out: Outcome) -> list[dict[str, Any]]:
        return [self._done(out, "")]

    def response(self, out: Outcome) -> dict[str, Any]:
        return self._done(out, out.text)


@attrs.define(eq=False)
class GenerateFormat(NativeFormat):
    """/api/generate: ``response`` pieces; the last line has ``context`` and the metrics."""

    model: str  # as the request named it

    def _line(self, text: str, done: bool) -> dict[str, Any]:
        return {"model": self.model, "created_at": rfc3339(), "response": text, "done": done}

    def _done(self, out: Outcome, text: str) -> dict[str, Any]:
        line = {**self._line(text, True), "done_reason": out.done_reason}
        if out.done_reason not in NO_METRICS:
            line["context"] = list(range(1, out.n_prompt + out.n_eval + 1))
        return {**line, **out.metrics()}


@attrs.define(eq=False)
class ChatFormat(NativeFormat):
    """/api/chat: ``message`` pieces from the assistant; the last line has the metrics."""

    model: str

    def _line(self, text: str, done: bool) -> dict[str, Any]:
        return {"model": self.model, "created_at": rfc3339(), "message": {"role": "assistant", "content": text},
                "done": done}

    def _done(self, out: Outcome, text: str) -> dict[str, Any]:
        return {**self._line(text, True), "done_reason": out.done_reason, **out.metrics()}


def _oai_id(prefix: str) -> str:
    return f"{prefix}-{random.randrange(1000)}"  # Ollama: rand.Intn(999)


@attrs.define(eq=False)
class OpenAIChatFormat(SseFraming):
    """/v1/chat/completions: every chunk carries ``delta.role``; finish chunk; usage chunk if asked."""

    model: str
    include_usage: bool = False
    cmpl_id: str = attrs.field(factory=lambda: _oai_id("chatcmpl"))
    created: int = attrs.field(factory=lambda: int(time.time()))  # pinned to the first chunk's

    def _chunk(self, choices: list[Any], **extra: Any) -> dict[str, Any]:
        return {"id": self.cmpl_id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "system_fingerprint": "fp_ollama", "choices": choices, **extra}

    def token_events(self, piece: str) -> list[dict[str, Any]]:
        return [self._chunk([{"index": 0, "delta": {"role": "assistant", "content": piece}, "finish_reason": None}])]

    def final_events(self, out: Outcome) -> list[dict[str, Any]]:
        events = [self._chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                "finish_reason": out.done_reason}])]
        if self.include_usage:
            events.append(self._chunk([], usage=out.usage()))
        return events

    def response(self, out: Outcome) -> dict[str, Any]:
        choice = {"index": 0, "message": {"role": "assistant", "content": out.text}, "finish_reason": out.done_reason}
        return {"id": self.cmpl_id, "object": "chat.completion", "created": self.created, "model": self.model,
                "system_fingerprint": "fp_ollama", "choices": [choice], "usage": out.usage()}


@attrs.define(eq=False)
class OpenAITextFormat(SseFraming):
    """/v1/completions: ``text_completion`` with ``choices[].text``."""

    model: str
    include_usage: bool = False
    cmpl_id: str = attrs.field(factory=lambda: _oai_id("cmpl"))
    created: int = attrs.field(factory=lambda: int(time.time()))

    def _body(self, choices: list[Any], **extra: Any) -> dict[str, Any]:
        return {"id": self.cmpl_id, "object": "text_completion", "created": self.created, "model": self.model,
                "system_fingerprint": "fp_ollama", "choices": choices, **extra}

    def token_events(self, piece: str) -> list[dict[str, Any]]:
        return [self._body([{"text": piece, "index": 0, "finish_reason": None}])]

    def final_events(self, out: Outcome) -> list[dict[str, Any]]:
        events = [self._body([{"text": "", "index": 0, "finish_reason": out.done_reason}])]
        if self.include_usage:
            events.append(self._body([], usage=out.usage()))
        return events

    def response(self, out: Outcome) -> dict[str, Any]:
        choice = {"text": out.text, "index": 0, "logprobs": None, "finish_reason": out.done_reason}
        return self._body([choice], usage=out.usage())


# ---- the catalogue


def tags_entry(spec: ModelSpec, modified: float) -> dict[str, Any]:
    return {"name": spec.name, "model": spec.name, "modified_at": rfc3339(modified), "size": spec.size,
            "digest": spec.digest, "details": spec.details()}


def show(spec: ModelSpec, modified: float) -> dict[str, Any]:
    family = str(spec.details()["family"])
    info = {"general.architecture": family, "general.parameter_count": int(spec.size / 0.6),
            f"{family}.context_length": spec.context_length, f"{family}.embedding_length": spec.embedding_dim}
    return {"license": "", "modelfile": f"# Modelfile generated by fakes.ollama\nFROM {spec.name}\n",
            "parameters": "", "template": "{{ .Prompt }}", "details": spec.details(), "model_info": info,
            "capabilities": spec.capabilities, "modified_at": rfc3339(modified)}


def openai_model(spec: ModelSpec, modified: float) -> dict[str, Any]:
    owner = spec.name.split("/")[-2] if "/" in spec.name else "library"
    return {"id": spec.name, "object": "model", "created": int(modified), "owned_by": owner}
