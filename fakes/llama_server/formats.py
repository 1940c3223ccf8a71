"""Response shapes: OpenAI chat and text, llama-server's native /completion, embeddings.

A format turns tokens into stream events and an Outcome into the final events or the whole
(non-streamed) response; generated tokens cycle through ``VOCAB``, each sent as " word".
It also frames its events for the wire: these formats send bare ``data:`` events (the
Responses and Anthropic formats, in their own modules, send named ``event:`` ones).
"""

from __future__ import annotations

import base64
import enum
import hashlib
import math
import random
import secrets
import string
import struct
import time
from typing import Any, Protocol, runtime_checkable

import attrs

from fakes.chat_template import ToolCall
from fakes.http11 import dump_json
from fakes.llama_server.slots import default_params

BUILD_INFO = "b6500-fake0000"
VOCAB = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog",
         "and", "runs", "far", "into", "green", "hills", "today")
PREFILL_TOKENS_PER_S = 4000.0  # only used to report plausible prompt timings
_ALNUM = string.ascii_letters + string.digits


class Finish(enum.StrEnum):
    """Why generation ended, spelled as OpenAI's finish_reason."""

    LENGTH = "length"  # the token budget or the context ran out
    STOP = "stop"      # the model ended its answer (an end-of-generation token)
    TOOL_CALLS = "tool_calls"  # the model ended its answer, a tool call


@attrs.frozen
class Outcome:
    text: str
    n_prompt: int
    n_decoded: int
    finish_reason: Finish
    timings: dict[str, Any]
    slot_id: int
    prompt_text: str
    call: ToolCall | None = None  # the answer is a tool call (arguments as far as they came); text is ""

    def usage(self) -> dict[str, Any]:
        return {"completion_tokens": self.n_decoded, "prompt_tokens": self.n_prompt,
                "total_tokens": self.n_decoded + self.n_prompt, "prompt_tokens_details": {"cached_tokens": 0}}


def token_piece(index: int) -> str:
    return " " + VOCAB[index % len(VOCAB)]


def split_utf8_piece(index: int) -> str:
    """Tokens 0 and 1 of a FAKE_SPLIT_UTF8 answer: "é" as two byte tokens. The first is not
    whole UTF-8, so llama-server sends nothing for it, and the role chunk (sent only when
    n_decoded == 1) never comes: the stream starts with a content chunk."""
    return "" if index == 0 else "é"


def make_timings(n_prompt: int, n_decoded: int, predicted_s: float, cache_n: int = 0) -> dict[str, Any]:
    """*cache_n*: the prompt's tokens found computed in the slot (its cache), not read again."""
    n_prompt -= cache_n
    prompt_ms = n_prompt / PREFILL_TOKENS_PER_S * 1000.0
    predicted_ms = predicted_s * 1000.0
    return {"cache_n": cache_n, "prompt_n": n_prompt, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / n_prompt if n_prompt else 0.0,
            "prompt_per_second": n_prompt / prompt_ms * 1000.0 if prompt_ms else 0.0,
            "predicted_n": n_decoded, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / n_decoded if n_decoded else 0.0,
            "predicted_per_second": n_decoded / predicted_ms * 1000.0 if predicted_ms else 0.0}


def random_id(prefix: str) -> str:
    """llama-server's ids: a prefix and 32 random letters and digits."""
    return prefix + "".join(secrets.choice(_ALNUM) for _ in range(32))


def completion_id() -> str:
    return random_id("chatcmpl-")


def sse_data(value: object) -> bytes:
    return b"data: " + dump_json(value) + b"\n\n"


def sse_event(name: str, value: object) -> bytes:
    return b"event: " + name.encode() + b"\n" + sse_data(value)


class DataEvents:
    """Bare ``data:`` events; a mid-stream error is ``data: {"error": {...}}``."""

    def frame(self, event: dict[str, Any]) -> bytes:
        return sse_data(event)

    def frame_error(self, body: dict[str, Any]) -> bytes:
        return sse_data(body)


class NamedEvents:
    """``event: TYPE`` + ``data:`` (the event's own ``type`` names it); errors stay bare ``data:``."""

    def frame(self, event: dict[str, Any]) -> bytes:
        return sse_event(event["type"], event)

    def frame_error(self, body: dict[str, Any]) -> bytes:
        return sse_data(body)


def _common(cmpl_id: str, model: str, obj: str) -> dict[str, Any]:
    return {"created": int(time.time()), "id": cmpl_id, "model": model,
            "system_fingerprint": BUILD_INFO, "object": obj}


@attrs.define(eq=False)
class ChatFormat(DataEvents):
    """OpenAI chat: role chunk with the first token, content chunks, finish, usage, [DONE]."""

    cmpl_id: str
    model: str
    n_prompt: int
    include_usage: bool
    # A last assistant message the answer continues. llama-server's quirk: it echoes it, as the
    # start of the answer's content (the first content delta is the prefill and the first token).
    prefill: str = ""
    call_started: bool = False  # a tool call's first delta (id, name) has gone out
    ends_with_done = True

    def _chunk(self, choices: list[Any], **extra: Any) -> dict[str, Any]:
        return {"choices": choices, **_common(self.cmpl_id, self.model, "chat.completion.chunk"), **extra}

    def token_events(self, piece: str, n_decoded: int, slot_id: int) -> list[dict[str, Any]]:
        events = []
        if n_decoded == 1:
            events.append(self._chunk([{"finish_reason": None, "index": 0,
                                        "delta": {"role": "assistant", "content": None}}]))
            piece = self.prefill + piece
        events.append(self._chunk([{"finish_reason": None, "index": 0, "delta": {"content": piece}}]))
        return events

    def call_events(self, call: ToolCall, piece: str, n_decoded: int) -> list[dict[str, Any]]:
        """A tool call's token: the role chunk with token 1; each piece of the arguments a delta, the
        first with the call's id and name (llama-server sends nothing for the tokens around them)."""
        events = []
        if n_decoded == 1:
            events.append(self._chunk([{"finish_reason": None, "index": 0,
                                        "delta": {"role": "assistant", "content": None}}]))
        if piece:
            head = {} if self.call_started else {"id": call.id, "type": "function"}
            function = {"arguments": piece} if self.call_started else {"name": call.name, "arguments": piece}
            self.call_started = True
            events.append(self._chunk([{"finish_reason": None, "index": 0,
                                        "delta": {"tool_calls": [{"index": 0, **head, "function": function}]}}]))
        return events

    def final_events(self, out: Outcome) -> list[dict[str, Any]]:
        events = [self._chunk([{"finish_reason": out.finish_reason, "index": 0, "delta": {}}])]
        if self.include_usage:
            events.append(self._chunk([], usage=out.usage()))
        events[-1]["timings"] = out.timings
        return events

    def response(self, out: Outcome) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.prefill + out.text}
        if out.call is not None:
            message["tool_calls"] = [{"type": "function", "function": {"name": out.call.name,
                                                                       "arguments": out.call.arguments},
                                      "id": out.call.id}]
        choice = {"finish_reason": out.finish_reason, "index": 0, "message": message}
        return {"choices": [choice], **_common(self.cmpl_id, self.model, "chat.completion"),
                "usage": out.usage(), "timings": out.timings}


@attrs.define(eq=False)
class TextFormat(DataEvents):
    """OpenAI /v1/completions: ``choices[].text``; the final chunk always carries usage."""

    cmpl_id: str
    model: str
    n_prompt: int
    ends_with_done = True

    def _body(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}
        return {"choices": [choice], **_common(self.cmpl_id, self.model, "text_completion")}

    def token_events(self, piece: str, n_decoded: int, slot_id: int) -> list[dict[str, Any]]:
        return [self._body(piece, None)]

    def final_events(self, out: Outcome) -> list[dict[str, Any]]:
        return [{**self._body("", out.finish_reason), "usage": out.usage(), "timings": out.timings}]

    def response(self, out: Outcome) -> dict[str, Any]:
        return {**self._body(out.text, out.finish_reason), "usage": out.usage(), "timings": out.timings}


@attrs.define(eq=False)
class NativeFormat(DataEvents):
    """llama-server's own /completion: ``content`` pieces, a ``stop: true`` event, no [DONE]."""

    model: str
    n_prompt: int
    ends_with_done = False

    def token_events(self, piece: str, n_decoded: int, slot_id: int) -> list[dict[str, Any]]:
        return [{"index": 0, "content": piece, "tokens": [], "stop": False, "id_slot": slot_id,
                 "tokens_predicted": n_decoded, "tokens_evaluated": self.n_prompt}]

    def final_events(self, out: Outcome) -> list[dict[str, Any]]:
        return [{**self.response(out), "content": ""}]

    def response(self, out: Outcome) -> dict[str, Any]:
        return {"index": 0, "content": out.text, "tokens": [], "id_slot": out.slot_id, "stop": True,
                "model": self.model, "tokens_predicted": out.n_decoded, "tokens_evaluated": out.n_prompt,
                "generation_settings": default_params(), "prompt": out.prompt_text, "has_new_line": False,
                "truncated": False, "stop_type": "eos" if out.finish_reason is Finish.STOP else "limit",
                "stopping_word": "", "tokens_cached": out.n_prompt + out.n_decoded, "timings": out.timings}


class Format(Protocol):
    """What the engine's token loop needs from a response shape."""

    ends_with_done: bool  # a ``data: [DONE]`` after the final events

    def token_events(self, piece: str, n_decoded: int, slot_id: int) -> list[dict[str, Any]]: ...
    def final_events(self, out: Outcome) -> list[dict[str, Any]]: ...
    def response(self, out: Outcome) -> object: ...
    def frame(self, event: dict[str, Any]) -> bytes: ...
    def frame_error(self, body: dict[str, Any]) -> bytes: ...


@runtime_checkable
class ToolFormat(Format, Protocol):
    """A shape of the routes that offer tools (chat, Responses, Messages): it also carries tool calls."""

    def call_events(self, call: ToolCall, piece: str, n_decoded: int) -> list[dict[str, Any]]: ...


def embed(text: str, dim: int) -> list[float]:
    """A unit vector that depends only on *text* (seeded by its hash, not Python's)."""
    rng = random.Random(hashlib.sha256(text.encode()).digest())
    vec = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]


def encode_embedding(vec: list[float], encoding: object) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
    return vec


def native_embeddings(vectors: list[list[float]]) -> list[dict[str, Any]]:
    """Native /embedding(s): each ``embedding`` is a list that holds the one vector."""
    return [{"index": i, "embedding": [v]} for i, v in enumerate(vectors)]


def oai_embeddings(model: str, vectors: list[list[float]], n_tokens: int, encoding: object) -> dict[str, Any]:
    return {
        "model": model, "object": "list",
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        "data": [{"embedding": encode_embedding(v, encoding), "index": i, "object": "embedding"}
                 for i, v in enumerate(vectors)],
    }
