"""llama.cpp's ``llama-server``: one process per model (research/protocols.md §3)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from adapters.base import EngineUsage, Residence, probe_path
from supervisor.accounting.cpu_share import sets_threads
from supervisor.accounting.gguf_header import GGUFError, read_gguf_header
from supervisor.accounting.hparams import NO_LM_HEAD_ARCHS
from supervisor.accounting.llama_logs import LlamaLogAccumulator
from supervisor.apis import GENERATION, Api
from supervisor.config.schema import PORT_PLACEHOLDER, ModelConfig
from supervisor.observe.events import EventLog

if TYPE_CHECKING:  # imported where a request is made: `steward check` imports the adapters, and needs no client
    import httpx

# llama-server's `--parallel -1` (its default) means 4 slots sharing a unified KV cache.
AUTO_SLOTS = 4
_PARALLEL_FLAGS = ("-np", "--parallel")
# Its buffer-size lines (`load_tensors: ... model buffer size = X MiB`, ...) are printed
# only from verbosity 4; steward reads them as the engine's own account of its memory.
_VERBOSITY_FLAGS = ("-lv", "--verbosity", "--log-verbosity", "-v", "--verbose", "--log-verbose")
_ALIAS_FLAGS = ("-a", "--alias")
BUFFER_LOG_VERBOSITY = "4"
# `--fit` (on by default) changes unset parameters (context, layers offloaded) to fit the
# memory it sees free at start, which can differ from what steward reserved: steward owns
# that decision, so fitting is off unless the model's args set it.
FIT_FLAGS = ("-fit", "--fit")
# What the server answers follows from these (research/real_runtimes.md): without --embeddings
# it answers embeddings with a 501, and rerank without --reranking; audio needs a projector.
_EMBEDDING_FLAGS = ("--embedding", "--embeddings")
_RERANK_FLAGS = ("--reranking", "--rerank")
_PROJECTOR_FLAGS = ("-mm", "--mmproj", "-mmu", "--mmproj-url")
_SPLIT_FLAGS = ("-ts", "--tensor-split", "-sm", "--split-mode", "-dev", "--device", "-mg", "--main-gpu")


def fits_itself(model: ModelConfig) -> bool:
    """Whether the model's args leave llama-server's own fitting on (steward turns it off otherwise)."""
    return _has(model.args, FIT_FLAGS) or "LLAMA_ARG_FIT" in model.env


@attrs.frozen
class LlamaServerRuntime:
    model: ModelConfig
    # Its share of the host's cores (supervisor/accounting/cpu_share.py), passed as -t and -tb;
    # None: none passed (llama.cpp takes every core, or the model's args say how many).
    threads: int | None = None
    # The model's name in steward, passed as --alias (unless its args give one), so that its
    # answers' "model" names it rather than the GGUF's path; None: none passed.
    served_as: str | None = None
    # Where it saves and restores its slots' KV caches (models.NAME.keep_cache; supervisor/slot_cache/),
    # passed as --slot-save-path; None: not passed (the slot save API stays off).
    slot_save_path: str | None = None
    name = "llama-server"
    residence = Residence.SPAWNED
    checks_health = True
    measured = True
    checks_model_name = False  # it answers whatever name it is sent
    sleeps = False
    splits = True
    poll_paths = frozenset({"/health"})

    def command(self, host: str, port: int) -> list[str]:
        model = self.model
        assert model.command is not None  # the config requires it for llama-server
        argv = list(model.command)
        if model.model is not None:
            argv += ["--model", model.model]
        placeholder = any(PORT_PLACEHOLDER in part for part in [*model.command, *model.args])
        argv += ["--host", host] + ([] if placeholder else ["--port", str(port)])
        if model.parallel is not None:
            argv += ["--parallel", str(model.parallel)]
        if _flag_value(model.args, _VERBOSITY_FLAGS) is None and not _has(model.args, _VERBOSITY_FLAGS):
            argv += ["-lv", BUFFER_LOG_VERBOSITY]
        if not fits_itself(model):
            argv += ["--fit", "off"]
        if self.threads is not None and not sets_threads(model.args, model.env):  # theirs win, never twice
            argv += ["--threads", str(self.threads), "--threads-batch", str(self.threads)]
        if self.served_as is not None and not _has(model.args, _ALIAS_FLAGS) and "LLAMA_ARG_ALIAS" not in model.env:
            argv += ["--alias", self.served_as]
        if self.slot_save_path is not None:
            argv += ["--slot-save-path", self.slot_save_path]
        return [part.replace(PORT_PLACEHOLDER, str(port)) for part in argv + list(model.args)]

    @property
    def slots(self) -> int:
        if self.model.parallel is not None:
            return self.model.parallel
        parallel = _flag_value(self.model.args, _PARALLEL_FLAGS)
        if parallel is None:
            return AUTO_SLOTS
        count = int(parallel)
        return AUTO_SLOTS if count < 1 else count

    @property
    def env(self) -> dict[str, str]:
        return self.model.env

    @property
    def apis(self) -> frozenset[Api]:
        args = [*(self.model.command or [])[1:], *self.model.args]
        embeds = _has(args, _EMBEDDING_FLAGS)
        if _has(args, _RERANK_FLAGS) or (embeds and _flag_value(args, ("--pooling",)) == "rank"):
            return frozenset({Api.RERANK})
        generation = GENERATION | ({Api.TRANSCRIPTION} if _has(args, _PROJECTOR_FLAGS) else frozenset())
        if not embeds:
            return generation
        # An encoder (BERT and kin) has no LM head: asked to generate, it answers 500. A decoder
        # started with --embeddings does both; a model whose header cannot be read is taken to embed.
        return frozenset({Api.EMBEDDINGS}) | (generation if _is_decoder(self.model.model) else frozenset())

    def split_args(self, shares: list[int]) -> list[str]:
        if _has(self.model.args, _SPLIT_FLAGS):
            return []  # the model's args place it: theirs win
        mib = [str(max(1, round(share / 1024**2))) for share in shares]
        return ["--split-mode", "layer", "--tensor-split", ",".join(mib)]

    def log_reader(self) -> BufferSizeReader:
        return BufferSizeReader()

    async def is_ready(self, http: httpx.AsyncClient, base_url: str) -> bool:
        # 503 `unavailable_error` while the model loads; 200 {"status":"ok"} once ready.
        return await probe_path(http, f"{base_url}/health") is None

    async def check_health(self, http: httpx.AsyncClient, base_url: str, timeout: float) -> str | None:
        # Answered by llama-server's HTTP threads even while every slot computes; a frozen
        # or wedged server does not answer (its socket still accepts: the kernel does that).
        return await probe_path(http, f"{base_url}/health", timeout)

    async def unload(self, http: httpx.AsyncClient, base_url: str, events: EventLog) -> str:
        return "nothing to unload: its process is stopped"

    async def wake(self, http: httpx.AsyncClient, base_url: str) -> str | None:
        return None

    async def read_usage(self, http: httpx.AsyncClient, base_url: str) -> EngineUsage | None:
        return None  # its memory is measured (and read from its log); its slots are steward's


class BufferSizeReader:
    """llama-server's buffer-size log lines (`load_tensors: ... model buffer size = X MiB`, ...)."""

    def __init__(self) -> None:
        self._accumulator = LlamaLogAccumulator()

    def feed(self, line: str) -> None:
        self._accumulator.feed(line)

    def summary(self) -> dict[str, dict[str, int]]:
        return self._accumulator.breakdown().devices()

    @property
    def complete(self) -> bool:
        return self._accumulator.loaded


def _is_decoder(path: str | None) -> bool:
    if path is None:
        return False
    try:
        return read_gguf_header(path, check_size=False).arch not in NO_LM_HEAD_ARCHS
    except GGUFError:
        return False


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
