"""Response shapes of vLLM's OpenAI server: chat and text completions, whole or as SSE chunks.

Like vLLM (pydantic ``model_dump_json(exclude_unset=True)`` for chunks), a stream's chunks carry
only the fields that were set; the whole answers carry all of them, nulls included.

Every route's answer is an ``AnswerShape`` (this module's ``Format``, ``messages.MessagesFormat``):
the server generates and the shape says what goes out around each token, so one loop serves all.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Protocol

import attrs

from fakes.http11 import dump_json
from fakes.openai_server.parsing import Job

VOCAB = (" the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog",
         " and", " runs", " far", " into", " green", " hills", " today")


def token_piece(index: int) -> str:
    return VOCAB[index % len(VOCAB)]


DONE = b"data: [DONE]\n\n"


def sse(value: object, event: str | None = None) -> bytes:
    """One SSE event; vLLM names it (an ``event:`` line) on the Messages routes only."""
    head = b"" if event is None else b"event: " + event.encode() + b"\n"
    return head + b"data: " + dump_json(value) + b"\n\n"


class AnswerShape(Protocol):
    """What one request's answer looks like; each event is written apart, as vLLM yields them."""

    job: Job

    def opening(self) -> list[bytes]:
        """The events that go out with the first token, before it."""
        ...

    def token(self, piece: str, n_done: int, last: bool) -> list[bytes]: ...

    def closing(self, n_completion: int) -> list[bytes]:
        """The events after the last token; the stream ends after them."""
        ...

    def response(self, text: str, n_completion: int) -> dict[str, Any]:
        """The whole answer of a request that did not ask to stream."""
        ...


def usage(n_prompt: int, n_completion: int) -> dict[str, Any]:
    return {"prompt_tokens": n_prompt, "total_tokens": n_prompt + n_completion, "completion_tokens": n_completion}


@attrs.define
class Format:
    """One request's answer: ids and timestamps fixed when it starts."""

    job: Job
    chat: bool
    id: str = attrs.field(init=False)
    created: int = attrs.field(factory=lambda: int(time.time()), init=False)

    def __attrs_post_init__(self) -> None:
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"

    @property
    def object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def _chunk(self, choices: list[dict[str, Any]], n_completion: int | None = None) -> dict[str, Any]:
        chunk: dict[str, Any] = {"id": self.id, "object": self.object, "created": self.created,
                                 "model": self.job.model, "choices": choices}
        if n_completion is not None and self.job.continuous_usage and self.job.include_usage:
            chunk["usage"] = usage(self.job.n_prompt, n_completion)
        return chunk

    def opening(self) -> list[bytes]:
        """Chat streams open with the role, before any token."""
        if not self.chat:
            return []
        return [sse(self._chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                  "logprobs": None, "finish_reason": None}], 0))]

    def token(self, piece: str, n_done: int, last: bool) -> list[bytes]:
        finish_reason = "length" if last else None  # the fake only stops at max_tokens
        choice: dict[str, Any]
        if self.chat:
            choice = {"index": 0, "delta": {"content": piece}, "logprobs": None, "finish_reason": finish_reason}
            if finish_reason is not None:
                choice["stop_reason"] = None
        else:
            choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish_reason,
                      "stop_reason": None}
        return [sse(self._chunk([choice], n_done))]

    def closing(self, n_completion: int) -> list[bytes]:
        if not self.job.include_usage:
            return [DONE]
        return [sse({**self._chunk([]), "usage": usage(self.job.n_prompt, n_completion)}), DONE]

    def response(self, text: str, n_completion: int) -> dict[str, Any]:
        whole_usage = {**usage(self.job.n_prompt, n_completion), "prompt_tokens_details": None}
        if self.chat:
            message = {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
                       "function_call": None, "tool_calls": [], "reasoning_content": None}
            return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.job.model,
                    "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": "length",
                                 "stop_reason": None, "token_ids": None}],
                    "service_tier": None, "system_fingerprint": None, "usage": whole_usage,
                    "prompt_logprobs": None, "prompt_token_ids": None, "kv_transfer_params": None}
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.job.model,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length",
                             "stop_reason": None, "token_ids": None, "prompt_logprobs": None,
                             "prompt_token_ids": None}],
                "service_tier": None, "system_fingerprint": None, "usage": whole_usage, "kv_transfer_params": None}


def model_cards(names: tuple[str, ...], root: str, max_model_len: int, created: int) -> dict[str, Any]:
    """``GET /v1/models``: one card per served name, each with the model path as its root."""
    def card(name: str) -> dict[str, Any]:
        permission = {"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": created,
                      "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                      "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                      "organization": "*", "group": None, "is_blocking": False}
        return {"id": name, "object": "model", "created": created, "owned_by": "vllm", "root": root,
                "parent": None, "max_model_len": max_model_len, "permission": [permission]}

    return {"object": "list", "data": [card(name) for name in names]}
