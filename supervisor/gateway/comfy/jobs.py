"""The GPU held for ComfyUI: one image job at a time, whoever asked for it.

Both ComfyUI's own clients (``POST /prompt`` on the ComfyUI listener) and OpenAI's
(``POST /v1/images/generations``) get the GPU the same way: an exclusive job in steward's
scheduler (its class waits, the LLM engines drain and unload), then the prompts go to
ComfyUI, steward follows each to its end, ``POST /free``\\ s, waits for the memory, and
releases the GPU; then a chat model may be warmed again. An operator can end every held
job (``/steward/release``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import attrs
import httpx
import trio

from supervisor.config import OLLAMA_ENGINE, ComfyConfig, OllamaConfig
from supervisor.observe.events import EventLog
from supervisor.gateway.comfy.api import follow_prompt, free_gpu, used_vram
from supervisor.gateway.door import Exchange
from supervisor.request_class import RequestClass
from supervisor.scheduler.actor import JobFailed, Lease, SchedulerClient, StepAccount
from supervisor.supervise import ContainedNursery

COMFY_ENGINE = "comfyui"  # how image jobs are named in the usage log


@attrs.define(eq=False)
class HeldGpu:
    """One granted image job: its lease, and what it ran."""

    lease: Lease
    scope: trio.CancelScope  # an operator's force-release cancels it
    baseline: int | None = None  # the device's used memory before the first prompt
    prompt_ids: list[str] = attrs.Factory(list)

    @property
    def force_released(self) -> bool:
        return self.scope.cancel_called


@attrs.define(eq=False)
class ComfyTurnstile:
    config: ComfyConfig
    scheduler: SchedulerClient
    events: EventLog
    http: httpx.AsyncClient
    jobs: ContainedNursery  # where a warm-up runs once a job is done
    warm: Callable[[], Awaitable[None]] | None = None  # reload a chat model once the GPU is idle
    running: set[HeldGpu] = attrs.Factory(set)

    @property
    def base_url(self) -> str:
        return self.config.upstream.url

    @asynccontextmanager
    async def open_gpu(self, klass: RequestClass, exchange: Exchange | None, *,
                       account: StepAccount | None = None) -> AsyncIterator[HeldGpu]:
        """Wait for the GPU as an exclusive job of *klass*, hold it for the body, release it after.
        *account* (default: the *exchange*) is told the wait and the time held.
        Raises JobFailed if the scheduler refuses; a force-release ends the body (``force_released``)."""
        queued = time.monotonic()
        self.events.emit("image_queued", "info", klass=klass)
        with trio.CancelScope() as scope:
            async with self.scheduler.open_grant(None, klass, exclusive_memory=self.config.memory,
                                                 account=account if account is not None else exchange) as lease:
                if exchange is not None:
                    exchange.engine = COMFY_ENGINE
                held = HeldGpu(lease, scope)
                self.running.add(held)
                granted = time.monotonic()
                try:
                    self.events.emit("image_granted", "info", waited_s=round(granted - queued, 3))
                    held.baseline = await used_vram(self.http, self.base_url)
                    yield held
                finally:
                    self.running.discard(held)
                    self.events.emit("image_released", "info", prompt_id=held.prompt_ids[-1] if held.prompt_ids
                                     else None, held_s=round(time.monotonic() - granted, 3))
        if held.prompt_ids and self.warm is not None:
            self.jobs.start_soon(self.warm)

    async def follow(self, held: HeldGpu, prompt_id: str) -> str:
        """Wait for a prompt ComfyUI accepted to end: "success", "error", "vanished" or "timeout"."""
        held.prompt_ids.append(prompt_id)
        outcome = await follow_prompt(self.config, self.http, self.base_url, prompt_id)
        self.events.emit("image_finished", "info" if outcome in ("success", "error") else "warning",
                         prompt_id=prompt_id, outcome=outcome)
        return outcome

    async def free(self, held: HeldGpu) -> None:
        """ComfyUI unloads its models; the job ends once the memory is back (or a timeout)."""
        prompt_id = held.prompt_ids[-1] if held.prompt_ids else None
        freed = await free_gpu(self.config, self.http, self.base_url, held.baseline, self.events, prompt_id)
        self.events.emit("image_freed", "info" if freed else "warning", prompt_id=prompt_id, observed_free=freed)

    def force_release(self) -> int:
        """Admin: end every image job steward holds the GPU for (a stuck lock)."""
        for held in list(self.running):
            held.scope.cancel(reason="force-released by an operator")
        return len(self.running)


async def warm_model(config: OllamaConfig, model: str, scheduler: SchedulerClient, http: httpx.AsyncClient,
                     events: EventLog) -> None:
    """Load *model* again after an image job, as batch work: it runs once nothing else waits."""
    try:
        async with scheduler.open_grant(OLLAMA_ENGINE, RequestClass.BATCH) as lease:
            response = await http.post(f"{config.upstream.url}/api/generate",
                                       json={"model": model, "keep_alive": -1}, timeout=120)
            lease.status = response.status_code
            events.emit("ollama_warm", "info", model=model, status=response.status_code)
    except (JobFailed, httpx.HTTPError) as exc:
        events.emit("ollama_warm", "warning", model=model, detail=str(exc))
