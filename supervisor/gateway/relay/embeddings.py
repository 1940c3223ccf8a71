"""Embeddings as steps: a long input list is cut into chunks, each scheduled on its own,
and the client gets one response with every embedding in input order (rule 2).

Each step is relayed like any request (the relay's timeouts, stalls, aborts and failures), into
an ``AssembledStep``: its answer is held whole, and a 200 is parsed once, into the assembly."""

from __future__ import annotations

import json
from typing import Any

import attrs

from supervisor.gateway.relay.answer import Answer, AnswerHead


def split_inputs(payload: dict[str, Any], chunk: int) -> list[list[Any]] | None:
    """The input list cut into chunks, or None when the request is a single step.

    ``input`` may be a string, a list of strings, a list of token ids (one input) or a
    list of token-id lists; only lists of several inputs are cut.
    """
    inputs = payload.get("input")
    if not isinstance(inputs, list) or len(inputs) <= chunk:
        return None
    if all(isinstance(item, int) for item in inputs):
        return None  # one tokenized input, not many
    return [inputs[i:i + chunk] for i in range(0, len(inputs), chunk)]


@attrs.define
class EmbeddingsAssembly:
    """Collects the steps' answers into one OpenAI embeddings response."""

    data: list[dict[str, Any]] = attrs.Factory(list)
    usage: dict[str, int] = attrs.Factory(lambda: {"prompt_tokens": 0, "total_tokens": 0})
    model: str | None = None

    def add(self, answer: dict[str, Any]) -> None:
        offset = len(self.data)
        for item in sorted(answer["data"], key=lambda d: d["index"]):
            self.data.append({**item, "index": offset + item["index"]})
        for key in self.usage:
            self.usage[key] += int((answer.get("usage") or {}).get(key, 0))
        self.model = self.model or answer.get("model")

    def response(self) -> bytes:
        return json.dumps({"object": "list", "data": self.data, "model": self.model, "usage": self.usage}).encode()


@attrs.define(eq=False)
class AssembledStep(Answer):
    """One step's answer, held whole; a 200 goes into *assembly* (or, not an embeddings
    response, ``unreadable`` says why), anything else is ``held`` for the client as it came."""

    assembly: EmbeddingsAssembly
    head: AnswerHead | None = None
    unreadable: Exception | None = None
    _chunks: list[bytes] = attrs.Factory(list)

    @property
    def held(self) -> bytes:
        return b"".join(self._chunks)

    async def start(self, head: AnswerHead) -> None:
        self.head = head

    async def body(self, chunk: bytes, more: bool) -> None:
        self._chunks.append(chunk)
        if more or self.head is None or self.head.status != 200:
            return
        try:
            self.assembly.add(json.loads(self.held))
        except (ValueError, KeyError, TypeError) as exc:
            self.unreadable = exc
