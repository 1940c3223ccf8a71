"""llama.cpp's ``llama-server``: one process per model (research/protocols.md §3)."""

from __future__ import annotations

import httpx

from supervisor.accounting.llama_logs import LlamaLogAccumulator
from supervisor.config import ModelConfig

# llama-server's `--parallel -1` (its default) means 4 slots sharing a unified KV cache.
AUTO_SLOTS = 4
_PARALLEL_FLAGS = ("-np", "--parallel")
# Its buffer-size lines (`load_tensors: ... model buffer size = X MiB`, ...) are printed
# only from verbosity 4; steward reads them as the engine's own account of its memory.
_VERBOSITY_FLAGS = ("-lv", "--verbosity", "--log-verbosity", "-v", "--verbose", "--log-verbose")
BUFFER_LOG_VERBOSITY = "4"


class LlamaServerAdapter:
    name = "llama-server"

    def command(self, model: ModelConfig, host: str, port: int | str) -> list[str]:
        argv = list(model.command)
        if model.model is not None:
            argv += ["--model", model.model]
        argv += ["--host", host, "--port", str(port)]
        if model.parallel is not None:
            argv += ["--parallel", str(model.parallel)]
        if _flag_value(model.args, _VERBOSITY_FLAGS) is None and not _has(model.args, _VERBOSITY_FLAGS):
            argv += ["-lv", BUFFER_LOG_VERBOSITY]
        return argv + list(model.args)

    def slots(self, model: ModelConfig) -> int:
        if model.parallel is not None:
            return model.parallel
        parallel = _flag_value(model.args, _PARALLEL_FLAGS)
        if parallel is None:
            return AUTO_SLOTS
        count = int(parallel)
        return AUTO_SLOTS if count < 1 else count

    def log_reader(self) -> BufferSizeReader:
        return BufferSizeReader()

    async def is_ready(self, http: httpx.AsyncClient, base_url: str) -> bool:
        # 503 `unavailable_error` while the model loads; 200 {"status":"ok"} once ready.
        try:
            response = await http.get(f"{base_url}/health")
        except httpx.TransportError:
            return False
        return response.status_code == 200

    async def check_health(self, http: httpx.AsyncClient, base_url: str, timeout: float) -> str | None:
        # Answered by llama-server's HTTP threads even while every slot computes; a frozen
        # or wedged server does not answer (its socket still accepts: the kernel does that).
        try:
            response = await http.get(f"{base_url}/health", timeout=timeout)
        except httpx.TimeoutException:
            return f"/health did not answer within {timeout:g}s"
        except httpx.TransportError as exc:
            return f"/health: {exc or type(exc).__name__}"
        if response.status_code != 200:
            return f"/health answered {response.status_code}"
        return None


class BufferSizeReader:
    """llama-server's buffer-size log lines (`load_tensors: ... model buffer size = X MiB`, ...)."""

    def __init__(self) -> None:
        self._accumulator = LlamaLogAccumulator()

    def feed(self, line: str) -> None:
        self._accumulator.feed(line)

    def summary(self) -> dict[str, dict[str, int]]:
        return self._accumulator.breakdown().devices()


def _has(args: list[str], flags: tuple[str, ...]) -> bool:
    return any(arg.partition("=")[0] in flags for arg in args)


def _flag_value(args: list[str], flags: tuple[str, ...]) -> str | None:
    """The value of the last of *flags* in *args* (``--flag V`` or ``--flag=V``)."""
    value = None
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if name in flags:
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else None)
    return value
