"""The engine: at most --max-num-seqs requests generate at once, the rest wait inside; sleep
holds them all; the request-count faults (crash, hang) fire as a request arrives.

A request that comes while the engine sleeps waits (counted as waiting) until wake-up; one
that was generating pauses at its next token and stays counted as running.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Awaitable, Callable

import attrs
import trio

from fakes.openai_server.cli import Config, Log
from fakes.openai_server.formats import token_piece
from fakes.openai_server.memory import ALL_TAGS, EngineMemory
from fakes.openai_server.parsing import Job

FINISH_REASONS = ("stop", "length", "abort", "error")
EmitToken = Callable[[str, int, bool], Awaitable[None]]  # (piece, tokens so far, last?)


@attrs.define
class Stats:
    started: int = 0              # generation requests that arrived
    running: int = 0
    waiting: int = 0
    max_running: int = 0          # the fake's peak gauge: the most ever running at once
    max_waiting: int = 0
    kv_blocks: int = 0            # the KV blocks the running requests hold (their prompt and generated tokens)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: collections.Counter[str] = attrs.field(factory=collections.Counter)


@attrs.define(eq=False)
class Engine:
    cfg: Config
    log: Log
    memory: EngineMemory
    stats: Stats = attrs.field(factory=Stats)
    sleep_level: int = 0          # 0 awake; else the level /sleep was given
    hung: bool = False
    _limiter: trio.CapacityLimiter = attrs.field(init=False)
    _awake: trio.Event = attrs.field(factory=trio.Event, init=False)  # set while awake

    def __attrs_post_init__(self) -> None:
        self._limiter = trio.CapacityLimiter(self.cfg.max_num_seqs)
        self._awake.set()

    # ---- lifecycle

    async def load(self) -> None:
        """Weights first, the KV cache once the "profiling" (the start delay) is done."""
        await self.memory.set_parts({"weights"})
        await trio.sleep(self.cfg.start_delay)
        await self.memory.set_parts(set(ALL_TAGS))

    @property
    def sleeping(self) -> bool:
        return self.sleep_level > 0

    @property
    def kv_cache_usage(self) -> float:
        """vLLM's vllm:kv_cache_usage_perc: the blocks held over the cache's (a request holds a block per
        --block-size tokens begun; a finished one's blocks are free, as vLLM's prefix-cached ones are)."""
        return min(1.0, self.stats.kv_blocks / self.cfg.num_gpu_blocks)

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.cfg.block_size)

    async def sleep(self, level: int) -> None:
        if self.sleeping:
            self.log.vllm("abstract.py:97", "Executor is already sleeping.", "WARNING")
            await trio.lowlevel.checkpoint()
            return
        self.sleep_level = level
        self._awake = trio.Event()
        await self.memory.set_parts(set())
        self.log.vllm("gpu_worker.py:117", f"Sleep mode freed {self._freed_gib():.2f} GiB memory, "
                                          f"{self.memory.held / 2**30:.2f} GiB memory is still in use.")

    def _freed_gib(self) -> float:
        return (self.cfg.memory - self.memory.held) / 2**30

    async def wake_up(self, tags: set[str] | None) -> None:
        if not self.sleeping:
            self.log.vllm("abstract.py:107", "Executor is not sleeping.", "WARNING")
            await trio.lowlevel.checkpoint()
            return
        await trio.sleep(self.cfg.wake_delay)
        await self.memory.set_parts(self.memory.awake_parts | (tags if tags else set(ALL_TAGS)))
        if self.memory.awake_parts >= ALL_TAGS:
            self.sleep_level = 0
            self._awake.set()

    # ---- requests

    def arrive(self) -> None:
        """A generation request came in: the faults keyed on the request count fire here."""
        self.stats.started += 1
        n = self.stats.started - 1  # requests served before this one
        if self.cfg.crash_after_requests is not None and n >= self.cfg.crash_after_requests:
            self.crash()
        if self.cfg.hang_after_requests is not None and n >= self.cfg.hang_after_requests:
            self.hung = True

    def crash(self) -> None:
        self.log.vllm("core.py:709", "EngineCore encountered a fatal error.", "ERROR")
        self.memory.crash()
        self.log.vllm("core_client.py:564", "Engine core proc EngineCore_DP0 died unexpectedly, "
                                           "shutting down client.", "ERROR")
        os._exit(1)  # like a dead engine: no cleanup, the simulated memory lingers

    async def wait_usable(self) -> None:
        """Until awake (and forever once hung)."""
        if self.hung:
            await trio.sleep_forever()
        await self._awake.wait()
        if self.hung:
            await trio.sleep_forever()

    async def generate(self, job: Job, emit: EmitToken) -> tuple[str, int]:
        """Generate job.max_tokens tokens, emitting each; the text and the token count."""
        stats = self.stats
        stats.waiting += 1
        stats.max_waiting = max(stats.max_waiting, stats.waiting)
        try:
            await self.wait_usable()
            await self._limiter.acquire()
        finally:
            stats.waiting -= 1
        stats.running += 1
        stats.max_running = max(stats.max_running, stats.running)
        stats.kv_blocks += self._blocks(job.n_prompt)
        stats.prompt_tokens += job.n_prompt
        pieces: list[str] = []
        finished = False
        try:
            next_at = trio.current_time()
            for i in range(job.max_tokens):
                next_at += self.cfg.token_interval
                await trio.sleep_until(next_at)
                if self.hung or self.sleeping:
                    await self.wait_usable()
                    next_at = trio.current_time()
                pieces.append(token_piece(i))
                stats.kv_blocks += self._blocks(job.n_prompt + i + 1) - self._blocks(job.n_prompt + i)
                stats.generation_tokens += 1
                await emit(pieces[-1], i + 1, i + 1 == job.max_tokens)
            finished = True
        finally:
            # Not finished: the client left, or we are shutting down.
            stats.finished["length" if finished else "abort"] += 1  # the fake only stops at max_tokens
            stats.running -= 1
            stats.kv_blocks -= self._blocks(job.n_prompt + len(pieces))
            self._limiter.release()
        return "".join(pieces), len(pieces)
