"""What steward needs to know of a runtime: how to start it, when it is ready, how many slots."""

from __future__ import annotations

from typing import Protocol

import httpx

from supervisor.config import ModelConfig


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
