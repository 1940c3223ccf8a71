"""Work on the scheduler's runners: generation (streamed or not, with the test hook) and embeddings.

Everything runs while the client stays: it leaves -> the work (or the wait for a turn) is
cancelled and the runner released.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from fakes.http11 import Exchange
from fakes.llama_server.formats import PREFILL_TOKENS_PER_S, token_piece
from fakes.llama_server.formats import embed as embedding_vector
from fakes.ollama.cli import Config, ModelSpec
from fakes.ollama.errors import ErrorShape, OllamaError, respond_error
from fakes.ollama.formats import Format, Outcome
from fakes.ollama.parsing import Job
from fakes.ollama.sched import Scheduler

HOOK_AFTER_TOKENS = 2
HOOK_MESSAGE = "an error was encountered while running the model: fake mid-stream failure (FAKE_ERROR_MIDSTREAM)"
EMBED_TIME_FACTOR = 0.1       # one embedding input costs a tenth of a generated token

Render = Callable[[list[list[float]], int, Outcome], Any]  # (vectors, prompt tokens, timings) -> body


@attrs.define(eq=False)
class Engine:
    cfg: Config
    sched: Scheduler

    async def generate(self, ex: Exchange, spec: ModelSpec, keep_alive: float | None, job: Job, fmt: Format) -> None:
        await self._while_client_stays(ex, fmt.error_shape, lambda: self._generate(ex, spec, keep_alive, job, fmt))

    async def load_only(self, ex: Exchange, spec: ModelSpec, keep_alive: float | None, fmt: Format, *,
                        stream: bool = False) -> None:
        """An empty prompt: schedule (load) the model, answer ``done_reason: "load"``.

        The handler writes one JSON object; only a middleware writer that was asked to stream
        (Responses, Anthropic) turns it into a stream of its events, hence *stream*.
        """
        async def work() -> None:
            async with self.sched.use(spec, keep_alive):
                pass
            if stream:
                await ex.start_stream(fmt.content_type)
            await self._answer(ex, fmt, Outcome("", 0, 0, "load"), streaming=stream)
        await self._while_client_stays(ex, fmt.error_shape, work)

    async def embed(self, ex: Exchange, spec: ModelSpec, keep_alive: float | None, texts: list[str],
                    render: Render, *, shape: ErrorShape = ErrorShape.NATIVE) -> None:
        """*render(vectors, n_tokens, outcome)* builds the answer; no inputs: load only."""
        async def work() -> None:
            started = trio.current_time()
            async with self.sched.use(spec, keep_alive) as use:
                if texts:
                    self.sched.stats.started += 1
                    await trio.sleep(len(texts) * EMBED_TIME_FACTOR * spec.token_interval)
                    self.sched.stats.completed += 1
            n_tokens = sum(len(t.split()) for t in texts)
            outcome = Outcome("", n_tokens, 0, "stop", total_s=trio.current_time() - started, load_s=use.load_seconds)
            vectors = [embedding_vector(text, spec.embedding_dim) for text in texts]
            await ex.respond_json(200, render(vectors, n_tokens, outcome))
        await self._while_client_stays(ex, shape, work)

    async def _while_client_stays(self, ex: Exchange, shape: ErrorShape,
                                  work: Callable[[], Awaitable[None]]) -> None:
        finished = False

        async def guarded() -> None:
            nonlocal finished
            try:
                await work()
            except OllamaError as err:  # raised before anything was sent (503 from the queue)
                await respond_error(ex, err, shape)
            finished = True
        if await ex.run_until_client_leaves(guarded) and not finished:
            self.sched.stats.cancelled += 1

    async def _generate(self, ex: Exchange, spec: ModelSpec, keep_alive: float | None, job: Job,
                        fmt: Format) -> None:
        arrived = trio.current_time()
        async with self.sched.use(spec, keep_alive) as use:
            outcome = await self._tokens(ex, spec, job, fmt, use.load_seconds, arrived)
        if outcome is not None:  # None: failed on purpose, the error has been sent
            await self._answer(ex, fmt, outcome, streaming=job.stream)

    @staticmethod
    async def _answer(ex: Exchange, fmt: Format, outcome: Outcome, *, streaming: bool) -> None:
        """The end of an answer: the final events of a stream already started, or the whole response."""
        if not streaming:
            await ex.respond_json(200, fmt.response(outcome))
            return
        for event in fmt.final_events(outcome):
            await ex.send_raw(fmt.frame(event))
        if fmt.trailer:
            await ex.send_raw(fmt.trailer)
        await ex.end_stream()

    async def _tokens(self, ex: Exchange, spec: ModelSpec, job: Job, fmt: Format, load_s: float,
                      arrived: float) -> Outcome | None:
        """Produce the tokens (streaming them if asked); None after the injected failure."""
        stats = self.sched.stats
        limit = self.cfg.num_predict
        n_target = limit if job.num_predict is None else min(job.num_predict, limit)
        done_reason = "length" if job.num_predict is not None and job.num_predict <= limit else "stop"
        hook_at = min(HOOK_AFTER_TOKENS, n_target) if job.error_hook else -1
        stats.started += 1
        if job.stream:
            await ex.start_stream(fmt.content_type)  # headers go out once the runner serves us
        start, interval, pieces = trio.current_time(), spec.token_interval, []
        for i in range(n_target + 1):
            if i == hook_at:
                return await self._fail(ex, job, fmt)
            if i == n_target:
                break
            await trio.sleep_until(start + (i + 1) * interval)
            pieces.append(token_piece(i))
            if job.stream:
                for event in fmt.token_events(pieces[-1]):
                    await ex.send_raw(fmt.frame(event))
        stats.completed += 1
        now = trio.current_time()
        return Outcome("".join(pieces), job.n_prompt, len(pieces), done_reason, total_s=now - arrived,
                       load_s=load_s, prompt_s=job.n_prompt / PREFILL_TOKENS_PER_S, eval_s=now - start)

    async def _fail(self, ex: Exchange, job: Job, fmt: Format) -> None:
        self.sched.stats.failed += 1
        if job.stream:  # status 200 already went out: the format's error line (if it has one), then the end
            if last := fmt.error_frame(HOOK_MESSAGE):
                await ex.send_raw(last)
            await ex.end_stream()
        else:
            await respond_error(ex, OllamaError(500, HOOK_MESSAGE), fmt.error_shape)
