"""The slots at work: token generation (streamed or not), the test hooks, encoder tasks.

Work runs while the client stays: it leaves -> the work is cancelled and its slot freed.
Every generating route (chat, completions, Responses, Anthropic Messages, transcription) runs
the same token loop; only its Format differs. Encoder tasks (embeddings, rerank) hold one
slot for all their inputs.

A server in embedding mode (``--embeddings``/``--reranking``) stands for an encoder model: it
has no KV memory, so, like llama-server, it fails every generation with a 500 once a slot
picks the task up (a plain JSON error even for ``stream: true``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio

from fakes.http11 import Exchange
from fakes.llama_server.cli import Config, Log
from fakes.llama_server.errors import ApiError, exceed_context, input_too_large, no_logits, respond_error
from fakes.llama_server.formats import (
    PREFILL_TOKENS_PER_S,
    Finish,
    Format,
    Outcome,
    ToolFormat,
    make_timings,
    split_utf8_piece,
    token_piece,
)
from fakes.llama_server.parsing import Job
from fakes.llama_server.slots import Slot, SlotPool, Stats

HOOK_AFTER_TOKENS = 2
EMBED_TIME_FACTOR = 0.1       # one encoder input (embedding, rerank pair) costs a tenth of a generated token


@attrs.define(eq=False)
class Engine:
    """The slot pool, the counters, and the work done on the slots."""

    cfg: Config
    log: Log
    pool: SlotPool = attrs.field(init=False)
    stats: Stats = attrs.field(factory=Stats, init=False)

    def __attrs_post_init__(self) -> None:
        self.pool = SlotPool.create(self.cfg.n_slots, self.cfg.slot_n_ctx)

    # ---- completions

    async def complete(self, ex: Exchange, job: Job, fmt: Format) -> None:
        await ex.run_until_client_leaves(lambda: self._run_job(ex, job, fmt))

    async def _run_job(self, ex: Exchange, job: Job, fmt: Format) -> None:
        async with self.pool.slot(job.prompt_text) as slot:
            # Checked when a slot picks the task up, so an oversized request waits its turn too.
            if self.cfg.embeddings and job.n_prompt > 0:
                error: ApiError | None = no_logits()
                outcome = None
            elif job.n_prompt >= slot.n_ctx:
                error = exceed_context(job.n_prompt, slot.n_ctx)
                outcome = None
            else:
                error = None
                outcome = await self._generate(ex, job, fmt, slot)
        if error is not None:
            await respond_error(ex, error)  # plain JSON even for stream=true: nothing was sent yet
        elif outcome is None:
            return  # failed on purpose; the error has been sent
        elif job.stream:
            for event in fmt.final_events(outcome):
                await ex.send_raw(fmt.frame(event))
            if fmt.ends_with_done:
                await ex.send_raw(b"data: [DONE]\n\n")
            await ex.end_stream()
        else:
            await ex.respond_json(200, fmt.response(outcome))

    async def _generate(self, ex: Exchange, job: Job, fmt: Format, slot: Slot) -> Outcome | None:
        """Produce the tokens, streaming them if asked. None after an injected failure."""
        room = slot.n_ctx - job.n_prompt
        limit = room if job.budget < 0 else min(job.budget, room)
        if job.answer is not None and len(job.answer) < limit:
            # The scripted answer fits: an end-of-generation token follows it (counted, shown as nothing).
            n_target, finished = len(job.answer) + 1, True
        else:
            n_target, finished = limit, False
        if job.n_prompt == 0:
            n_target, finished = 0, False  # an empty prompt gives an empty answer
        hook_at = min(HOOK_AFTER_TOKENS, n_target) if (job.error_hook or job.crash_hook) else -1
        self.stats.started += 1
        cache_n = slot.cached_for(job.prompt_text)
        slot.cached_text, slot.n_cached, slot.ran = job.prompt_text, job.n_prompt, True
        slot.n_remain, slot.n_predict = n_target, job.budget
        interval = self.cfg.token_interval
        start = trio.current_time()
        pieces: list[str] = []
        try:
            if job.stream:
                await ex.start_stream()  # headers go out once a slot has the task
            if hook_at == 0:
                return await self._inject_failure(ex, job, fmt)
            for i in range(n_target):
                await self._wait_for_token(ex, job, start + (i + 1) * interval)
                pieces.append(_piece(job, i))
                slot.n_decoded, slot.n_remain = i + 1, n_target - i - 1
                if job.stream:
                    for event in _token_events(job, fmt, pieces[-1], i + 1, slot.id):
                        await ex.send_raw(fmt.frame(event))
                if i + 1 == hook_at:
                    return await self._inject_failure(ex, job, fmt)
        except (trio.Cancelled, trio.BrokenResourceError, trio.ClosedResourceError):
            self.stats.cancelled += 1  # the client left (or we are shutting down)
            raise
        elapsed = trio.current_time() - start
        self._account(job.n_prompt, len(pieces), elapsed)
        self.stats.completed += 1
        text, call = "".join(pieces), job.call
        if call is not None:
            text, call = "", attrs.evolve(call, arguments=text)
        finish = Finish.LENGTH if not finished else Finish.STOP if call is None else Finish.TOOL_CALLS
        return Outcome(text, job.n_prompt, len(pieces), finish, make_timings(job.n_prompt, len(pieces), elapsed, cache_n),
                       slot.id, job.prompt_text, call)

    async def _wait_for_token(self, ex: Exchange, job: Job, deadline: float) -> None:
        """Sleep until the next token is due, sending SSE pings if that takes long."""
        if job.stream and job.ping_interval > 0:
            while (next_ping := ex.last_send + job.ping_interval) < deadline:
                await trio.sleep_until(next_ping)
                await ex.send_raw(b":\n\n")
        await trio.sleep_until(deadline)

    async def _inject_failure(self, ex: Exchange, job: Job, fmt: Format) -> None:
        if job.crash_hook:
            self.log("ggml/src/ggml.c:1234: GGML_ASSERT(fake) failed (FAKE_CRASH)")
            os._exit(134)  # like abort(): no cleanup, the simulated GPU memory lingers
        error = ApiError(500, "fake mid-stream failure", "server_error")
        if job.stream:
            await ex.send_raw(fmt.frame_error(error.body))
            await ex.end_stream()  # no [DONE], as llama-server does after an error
        else:
            await respond_error(ex, error)

    def _account(self, n_prompt: int, n_decoded: int, elapsed: float) -> None:
        s = self.stats
        s.prompt_tokens += n_prompt
        s.prompt_seconds += n_prompt / PREFILL_TOKENS_PER_S
        s.predicted_tokens += n_decoded
        s.predicted_seconds += elapsed

    # ---- encoder tasks (embeddings, rerank)

    async def encode(self, ex: Exchange, n_tokens: Sequence[int], answer: Callable[[], object]) -> None:
        """Run one encoder task per input on a slot, then answer ``answer()`` (400 if an input is too long)."""
        await ex.run_until_client_leaves(lambda: self._run_encoder(ex, n_tokens, answer))

    async def _run_encoder(self, ex: Exchange, n_tokens: Sequence[int], answer: Callable[[], object]) -> None:
        async with self.pool.slot() as slot:
            too_long = next((n for n in n_tokens if n > slot.n_ctx), None)
            if too_long is None:
                self.stats.started += 1
                try:
                    await trio.sleep(len(n_tokens) * EMBED_TIME_FACTOR * self.cfg.token_interval)
                except trio.Cancelled:
                    self.stats.cancelled += 1
                    raise
                self.stats.completed += 1
        if too_long is not None:
            await respond_error(ex, input_too_large(too_long, slot.n_ctx))
        else:
            await ex.respond_json(200, answer())


def _token_events(job: Job, fmt: Format, piece: str, n_decoded: int, slot_id: int) -> list[dict[str, Any]]:
    """What one token sends: a tool call's (each format says), or its text (an incomplete character,
    "", is held back, as llama-server does)."""
    if job.call is not None:
        assert isinstance(fmt, ToolFormat), "tool calls are made only on the routes that offer tools"
        return fmt.call_events(job.call, piece, n_decoded)
    return fmt.token_events(piece, n_decoded, slot_id) if piece else []


def _piece(job: Job, index: int) -> str:
    """The text of generated token *index*."""
    if job.answer is not None:
        return job.answer[index] if index < len(job.answer) else ""  # "": the end-of-generation token
    if job.split_utf8_hook and index < 2:
        return split_utf8_piece(index)
    return token_piece(job.offset + index)
