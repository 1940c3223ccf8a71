"""Response shapes of vLLM's OpenAI server: chat and text completions, whole or as SSE chunks.

Like vLLM (pydantic ``model_dump_json(exclude_unset=True)`` for chunks), a stream's chunks carry
only the fields that were set; the whole answers carry all of them, nulls included.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import attrs

from fakes.openai_server.parsing import Job

VOCAB = (" the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog",
         " and", " runs", " far", " into", " green", " hills", " today")


def token_piece(index: int) -> str:
    return VOCAB[index % len(VOCAB)]


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

    def first_chunks(self) -> list[dict[str, Any]]:
        """Chat streams open with the role, before any token."""
        if not self.chat:
            return []
        return [self._chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                              "logprobs": None, "finish_reason": None}], 0)]

    def token_chunk(self, piece: str, n_done: int, finish_reason: str | None) -> dict[str, Any]:
        choice: dict[str, Any]
        if self.chat:
            choice = {"index": 0, "delta": {"content": piece}, "logprobs": None, "finish_reason": finish_reason}
            if finish_reason is not None:
                choice["stop_reason"] = None
        else:
            choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish_reason,
                      "stop_reason": None}
        return self._chunk([choice], n_done)

    def usage_chunk(self, n_completion: int) -> dict[str, Any] | None:
        if not self.job.include_usage:
            return None
        return {**self._chunk([]), "usage": usage(self.job.n_prompt, n_completion)}

    def response(self, text: str, n_completion: int, finish_reason: str) -> dict[str, Any]:
        whole_usage = {**usage(self.job.n_prompt, n_completion), "prompt_tokens_details": None}
        if self.chat:
            message = {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
                       "function_call": None, "tool_calls": [], "reasoning_content": None}
            return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.job.model,
                    "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason,
                                 "stop_reason": None, "token_ids": None}],
                    "service_tier": None, "system_fingerprint": None, "usage": whole_usage,
                    "prompt_logprobs": None, "prompt_token_ids": None, "kv_transfer_params": None}
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.job.model,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
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
