"""llama.cpp's ``llama-server``: one process per model (research/protocols.md §3)."""

from __future__ import annotations

import httpx

from supervisor.config import ModelConfig

# llama-server's `--parallel -1` (its default) means 4 slots sharing a unified KV cache.
AUTO_SLOTS = 4
_PARALLEL_FLAGS = ("-np", "--parallel")


class LlamaServerAdapter:
    name = "llama-server"

    def command(self, model: ModelConfig, host: str, port: int | str) -> list[str]:
        argv = list(model.command)
        if model.model is not None:
            argv += ["--model", model.model]
        argv += ["--host", host, "--port", str(port)]
        if model.parallel is not None:
            argv += ["--parallel", str(model.parallel)]
        return argv + list(model.args)

    def slots(self, model: ModelConfig) -> int:
        if model.parallel is not None:
            return model.parallel
        parallel = _flag_value(model.args, _PARALLEL_FLAGS)
        if parallel is None:
            return AUTO_SLOTS
        count = int(parallel)
        return AUTO_SLOTS if count < 1 else count

    async def is_ready(self, http: httpx.AsyncClient, base_url: str) -> bool:
        # 503 `unavailable_error` while the model loads; 200 {"status":"ok"} once ready.
        try:
            response = await http.get(f"{base_url}/health")
        except httpx.TransportError:
            return False
        return response.status_code == 200


def _flag_value(args: list[str], flags: tuple[str, ...]) -> str | None:
    """The value of the last of *flags* in *args* (``--flag V`` or ``--flag=V``)."""
    value = None
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if name in flags:
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else None)
    return value
