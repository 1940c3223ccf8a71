"""What steward needs to know of a runtime: how to start it, when it is ready, how many slots."""

from __future__ import annotations

from typing import Protocol

import httpx

from supervisor.config import ModelConfig


class LogReader(Protocol):
    """Reads an engine's output line by line for what it says about its memory."""

    def feed(self, line: str) -> None: ...

    def summary(self) -> dict[str, dict[str, int]]:
        """device -> component -> bytes, as the engine reported them."""
        ...


class RuntimeAdapter(Protocol):
    name: str

    def command(self, model: ModelConfig, host: str, port: int | str) -> list[str]:
        """The full command line; steward assigns host and port."""
        ...

    def slots(self, model: ModelConfig) -> int:
        """How many requests the engine runs at once; steward never sends more."""
        ...

    async def is_ready(self, http: httpx.AsyncClient, base_url: str) -> bool:
        """One readiness probe; False while loading or not yet listening."""
        ...

    async def check_health(self, http: httpx.AsyncClient, base_url: str, timeout: float) -> str | None:
        """One health check of a ready engine: None if it answered as it should, else what went wrong."""
        ...

    def log_reader(self) -> LogReader | None:
        """A fresh reader of one process's output, or None if the runtime says nothing useful."""
        ...
