"""Ollama as one engine of the scheduler: "start" means it answers, "stop" means unload.

Ollama loads and unloads models by itself; steward lets its inference requests through
the scheduler (so they queue with everyone else by class) and, when the ledger needs the
memory or an exclusive job needs the whole GPU, unloads every model Ollama holds
(`/api/ps`, then `keep_alive: 0` for each, the embedding route for embedding-only
models, polling until `/api/ps` is empty or a timeout: degrade, don't fail). What
`/api/ps` reports is Ollama's memory in the ledger. With `command`, steward also
supervises `ollama serve` as a child; otherwise it attaches to `upstream`.
"""

from __future__ import annotations

import math
import time
from typing import Literal

import attrs
import httpx
import trio

from supervisor.config import OLLAMA_ENGINE, OllamaConfig
from supervisor.events import EventLog
from supervisor.gateway.relay import Backoff
from supervisor.services.probe import probe_upstream
from supervisor.services.process import serve_service_process
from supervisor.scheduler.actor import JobFailed, SchedulerClient


@attrs.frozen
class _Command:
    kind: Literal["start", "stop"]
    generation: int


@attrs.define(eq=False)
class OllamaHandle:
    """The scheduler's remote control for the Ollama service."""

    _mailbox: trio.MemorySendChannel[_Command]
    base_url: str

    def start(self, generation: int) -> None:
        self._mailbox.send_nowait(_Command("start", generation))

    def stop(self, generation: int) -> None:
        self._mailbox.send_nowait(_Command("stop", generation))

    def check(self, generation: int) -> None:
        """Ollama's health is not steward's to judge: it loads and unloads models by itself, so
        a silent stream is reported to its client (504), and Ollama is left alone."""


async def serve_ollama(config: OllamaConfig, scheduler: SchedulerClient, events: EventLog, http: httpx.AsyncClient,
                       *, task_status: trio.TaskStatus[OllamaHandle] = trio.TASK_STATUS_IGNORED) -> None:
    send, receive = trio.open_memory_channel[_Command](math.inf)
    handle = OllamaHandle(send, f"http://{config.upstream}")
    async with trio.open_nursery() as nursery:
        if config.command:
            await nursery.start(serve_service_process, OLLAMA_ENGINE, config.command,
                                {"OLLAMA_HOST": config.upstream}, events,
                                Backoff(config.retry_initial, config.retry_max))
        nursery.start_soon(probe_upstream, http, OLLAMA_ENGINE, f"{handle.base_url}/api/version", events,
                           bool(config.command))
        task_status.started(handle)
        watcher: trio.CancelScope | None = None
        async for command in receive:
            if watcher is not None:
                watcher.cancel(reason="ollama stopping or restarting")
                watcher = None
            if command.kind == "start":
                await _wait_until_up(http, handle.base_url, Backoff(config.retry_initial, config.retry_max), events)
                scheduler.report_ready(OLLAMA_ENGINE, command.generation, handle.base_url)
                watcher = await nursery.start(_watch_memory, config, http, handle.base_url, scheduler,
                                              command.generation)
            else:
                detail = await unload_all(config, http, handle.base_url, events)
                scheduler.report_exited(OLLAMA_ENGINE, command.generation, f"stopped ({detail})")


async def _wait_until_up(http: httpx.AsyncClient, base_url: str, backoff: Backoff, events: EventLog) -> None:
    for delay in backoff.delays():
        try:
            if (await http.get(f"{base_url}/api/version")).status_code == 200:
                return
        except httpx.HTTPError as exc:
            events.emit("upstream_retry", "warning", service="ollama", url=base_url, detail=str(exc),
                        retry_in_s=delay)
        await trio.sleep(delay)


async def _watch_memory(config: OllamaConfig, http: httpx.AsyncClient, base_url: str, scheduler: SchedulerClient,
                        generation: int, *, task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
                        ) -> None:
    """Tell the ledger what Ollama holds, from /api/ps, while it is up."""
    with trio.CancelScope() as scope:
        task_status.started(scope)
        while True:
            models = await loaded_models(http, base_url)
            if models is not None:
                scheduler.report_service_memory(OLLAMA_ENGINE, generation,
                                                sum(int(m.get("size_vram") or m.get("size") or 0) for m in models))
            await trio.sleep(config.ps_poll)


async def loaded_models(http: httpx.AsyncClient, base_url: str) -> list[dict[str, object]] | None:
    try:
        response = await http.get(f"{base_url}/api/ps")
        return list(response.json().get("models") or []) if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None


async def unload_all(config: OllamaConfig, http: httpx.AsyncClient, base_url: str, events: EventLog) -> str:
    """Unload every model Ollama holds; never raises: a misbehaving neighbour must not block steward."""
    started = time.monotonic()
    models = await loaded_models(http, base_url)
    if models is None:
        events.emit("ollama_unload", "warning", models=[], seconds=round(time.monotonic() - started, 3),
                    complete=False, detail="Ollama unreachable; continuing without it")
        return "Ollama unreachable"
    names = [str(m.get("name") or m.get("model")) for m in models]
    for name in names:
        await _unload(http, base_url, name, config.unload_timeout)
    with trio.move_on_after(config.unload_timeout) as waited:
        while (remaining := await loaded_models(http, base_url)) is None or remaining:
            await trio.sleep(config.unload_poll)
    seconds = round(time.monotonic() - started, 3)
    complete = not waited.cancelled_caught
    events.emit("ollama_unload", "info" if complete else "warning", models=names, seconds=seconds,
                complete=complete)
    return f"unloaded {len(names)} model(s) in {seconds}s" if complete else f"unload timed out after {seconds}s"


async def warm_model(config: OllamaConfig, model: str, scheduler: SchedulerClient, http: httpx.AsyncClient,
                     events: EventLog) -> None:
    """Load *model* again after an image job, as batch work: it runs once nothing else waits."""
    try:
        async with scheduler.open_grant(OLLAMA_ENGINE, "batch") as lease:
            response = await http.post(f"http://{config.upstream}/api/generate",
                                       json={"model": model, "keep_alive": -1}, timeout=120)
            lease.status = response.status_code
            events.emit("ollama_warm", "info", model=model, status=response.status_code)
    except (JobFailed, httpx.HTTPError) as exc:
        events.emit("ollama_warm", "warning", model=model, detail=str(exc))


async def _unload(http: httpx.AsyncClient, base_url: str, name: str, timeout: float) -> None:
    try:
        response = await http.post(f"{base_url}/api/generate", json={"model": name, "keep_alive": 0},
                                   timeout=timeout)
        if response.is_success:
            return
        # Embedding-only models refuse generate, but unload through the embedding route.
        await http.post(f"{base_url}/api/embed", json={"model": name, "input": "x", "keep_alive": 0},
                        timeout=timeout)
    except httpx.HTTPError:
        pass  # the poll of /api/ps below tells whether it went
