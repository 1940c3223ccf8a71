"""Ollama as one engine of the scheduler: "loaded" means it answers, "unloaded" means empty.

Ollama loads and unloads models by itself; steward lets its inference requests through
the scheduler (so they queue with everyone else by class) and, when the ledger needs the
memory or an exclusive job needs the whole GPU, unloads every model Ollama holds
(`/api/ps`, then `keep_alive: 0` for each, the embedding route for embedding-only
models, polling until `/api/ps` is empty or a timeout: degrade, don't fail). What
`/api/ps` reports is Ollama's memory in the ledger. With `command`, steward also
supervises `ollama serve` (OLLAMA_HOST set to `upstream`); otherwise it attaches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import time

import trio

from adapters.base import EngineUsage, Residence, probe_path
from supervisor.apis import GENERATION, Api
from supervisor.config.schema import OllamaConfig
from supervisor.observe.events import EventLog

if TYPE_CHECKING:  # imported where a request is made: `steward check` imports the adapters, and needs no client
    import httpx


class OllamaRuntime:
    name = "ollama"
    # Its health is not steward's to judge: it loads and unloads models by itself, so a
    # silent stream is reported to its client (504), and Ollama is left alone.
    checks_health = False
    measured = False  # /api/ps says what it holds
    checks_model_name = False  # its models are the names clients send
    sleeps = False
    splits = False  # it spreads its models over the GPUs it sees by itself
    poll_paths = frozenset({"/api/version", "/api/ps"})

    def __init__(self, config: OllamaConfig) -> None:
        self.config = config
        self.residence = Residence.SERVICE if config.command else Residence.ATTACHED
        self.slots = config.parallel

    def command(self, host: str, port: int) -> list[str] | None:
        return list(self.config.command) if self.config.command else None

    @property
    def env(self) -> dict[str, str]:
        return {"OLLAMA_HOST": str(self.config.upstream)}

    @property
    def apis(self) -> frozenset[Api]:
        return GENERATION | {Api.EMBEDDINGS}  # on its own listener, which routes by Ollama's models

    def split_args(self, shares: list[int]) -> list[str]:
        return []

    def log_reader(self) -> None:
        return None

    async def is_ready(self, http: httpx.AsyncClient, base_url: str) -> bool:
        return await probe_path(http, f"{base_url}/api/version") is None

    async def check_health(self, http: httpx.AsyncClient, base_url: str, timeout: float) -> str | None:
        return None

    async def unload(self, http: httpx.AsyncClient, base_url: str, events: EventLog) -> str:
        return await unload_all(self.config, http, base_url, events)

    async def wake(self, http: httpx.AsyncClient, base_url: str) -> str | None:
        return None

    async def read_usage(self, http: httpx.AsyncClient, base_url: str) -> EngineUsage | None:
        models = await loaded_models(http, base_url)
        if models is None:
            return None
        return EngineUsage(memory=sum(int(m.get("size_vram") or m.get("size") or 0) for m in models))  # type: ignore[call-overload]


async def loaded_models(http: httpx.AsyncClient, base_url: str) -> list[dict[str, object]] | None:
    import httpx
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


async def _unload(http: httpx.AsyncClient, base_url: str, name: str, timeout: float) -> None:
    import httpx
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
