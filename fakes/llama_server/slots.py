"""The slot pool (FIFO wait beyond ``n`` slots) and the counters behind /metrics and /fake/stats."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio


@attrs.define(eq=False)
class Slot:
    id: int
    n_ctx: int
    id_task: int = -1
    n_decoded: int = 0
    n_remain: int = -1
    n_predict: int = -1  # the last task's budget: llama-server's /slots shows the params of a slot's last task
    # Its "KV cache": the prompt of its last task (or a restored one) and its token count.
    cached_text: str = ""
    n_cached: int = 0
    ran: bool = False  # it ran a task: /slots then says its sequence's token count, as llama-server does

    @property
    def is_processing(self) -> bool:
        return self.id_task >= 0

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "id_task": self.id_task, "n_ctx": self.n_ctx, "speculative": False,
            "is_processing": self.is_processing, "prompt": "",
            "params": {**default_params(), "n_predict": self.n_predict, "max_tokens": self.n_predict},
            "next_token": {"has_next_token": self.is_processing, "has_new_line": False,
                           "n_remain": self.n_remain, "n_decoded": self.n_decoded},
            **({"n_prompt_tokens": self.n_tokens} if self.ran else {}),
        }

    @property
    def n_tokens(self) -> int:
        """The tokens of its sequence in the KV cache, what llama-server's /slots calls ``n_prompt_tokens``
        (``prompt.tokens.size()``): while it computes, the prompt and the tokens decoded so far but the
        last (llama.cpp feeds a sampled token to the cache with the next batch); idle, its cached prompt."""
        return self.n_cached + max(0, self.n_decoded - 1) if self.is_processing else self.n_cached

    def cached_for(self, prompt: str) -> int:
        """The tokens of *prompt* this slot holds computed: its cached prompt's, if *prompt* continues it."""
        return self.n_cached if self.cached_text and prompt.startswith(self.cached_text) else 0


def default_params() -> dict[str, Any]:
    return {"n_predict": -1, "seed": 4294967295, "temperature": 0.8, "dynatemp_range": 0.0, "top_k": 40,
            "top_p": 0.95, "min_p": 0.05, "typical_p": 1.0, "repeat_last_n": 64, "repeat_penalty": 1.0,
            "presence_penalty": 0.0, "frequency_penalty": 0.0, "stop": [], "max_tokens": -1, "n_keep": 0,
            "ignore_eos": False, "stream": False, "n_probs": 0, "min_keep": 0,
            "samplers": ["penalties", "dry", "top_k", "typ_p", "top_p", "min_p", "temperature"],
            "timings_per_token": False, "post_sampling_probs": False}


@attrs.define(eq=False)
class SlotPool:
    """``n`` slots; requests beyond them wait FIFO (trio's Semaphore wakes waiters in order)."""

    slots: list[Slot]
    _free: deque[Slot]
    _sem: trio.Semaphore
    deferred: int = 0
    _task_ids: Iterator[int] = attrs.field(factory=itertools.count)

    @classmethod
    def create(cls, n: int, n_ctx: int) -> SlotPool:
        slots = [Slot(i, n_ctx) for i in range(n)]
        return cls(slots, deque(slots), trio.Semaphore(n))

    @property
    def active(self) -> int:
        return len(self.slots) - len(self._free)

    @asynccontextmanager
    async def slot(self, prompt: str = "") -> AsyncIterator[Slot]:
        """A free slot: the one whose cache *prompt* continues furthest (llama-server's choice by
        prompt similarity), else an empty one, else the one free longest."""
        try:
            self._sem.acquire_nowait()
        except trio.WouldBlock:
            # Only a request that really waits counts as deferred (acquire() yields even when
            # a slot is free, and /fake/stats could see that moment).
            self.deferred += 1
            try:
                await self._sem.acquire()
            finally:
                self.deferred -= 1
        slot = max(self._free, key=lambda s: s.cached_for(prompt)) if prompt else self._free[0]
        if not slot.cached_for(prompt):
            slot = next((s for s in self._free if not s.cached_text), self._free[0])
        self._free.remove(slot)
        slot.id_task, slot.n_decoded, slot.n_remain = next(self._task_ids), 0, -1
        try:
            yield slot
        finally:
            slot.id_task, slot.n_remain = -1, -1
            self._free.append(slot)
            self._sem.release()


@attrs.define
class Stats:
    started: int = 0
    completed: int = 0
    cancelled: int = 0
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    predicted_tokens: int = 0
    predicted_seconds: float = 0.0
