"""llama.cpp's ``llama-server``: one process per model (research/protocols.md §3)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from adapters.base import USAGE_TIMEOUT_S, EngineUsage, Residence, probe_path
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
# Whether its slots share one KV cache (research: llama.cpp's common/arg.cpp and tools/server/server.cpp
# at llama-cpp-python 0.3.36): `-kvu` / `-no-kvu` (or LLAMA_ARG_KV_UNIFIED), else shared exactly when
# the number of slots is left to it (`--parallel -1`, its default: 4 slots, one cache). `/slots`
# does not say, and it decides the capacity: a shared cache's every slot may fill it (each slot's
# `n_ctx` is the whole cache), separate ones add up (each slot's `n_ctx` is its share).
_UNIFIED_FLAGS, _SEPARATE_FLAGS = ("-kvu", "--kv-unified"), ("-no-kvu", "--no-kv-unified")
# `--kv-unified-per-slot N` caps each slot of a shared cache to N tokens (the cache: N per slot).
_PER_SLOT_CAP_FLAGS = ("--kv-unified-per-slot",)
_SLOTS_ENDPOINT_FLAGS = ("--slots", "--no-slots")
_TRUE, _FALSE = ("on", "enabled", "true", "1"), ("off", "disabled", "false", "0")  # its boolean env values


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
    poll_paths = frozenset({"/health", "/slots"})

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

    @property
    def shared_kv(self) -> bool:
        """Whether its slots share one KV cache (``kv_unified``), as its flags and environment decide."""
        args, env = self.model.args, self.model.env
        last = _last_flag(args, _UNIFIED_FLAGS + _SEPARATE_FLAGS)
        if last is not None:
            return last in _UNIFIED_FLAGS
        said = env.get("LLAMA_ARG_KV_UNIFIED", "").lower()
        if said in _TRUE or said in _FALSE:
            return said in _TRUE
        return self.model.parallel is None and _auto_parallel(_flag_value(args, _PARALLEL_FLAGS))

    @property
    def slots_endpoint(self) -> bool:
        """Whether it serves ``GET /slots`` (on unless ``--no-slots`` or LLAMA_ARG_ENDPOINT_SLOTS turns it off)."""
        last = _last_flag(self.model.args, _SLOTS_ENDPOINT_FLAGS)
        if last is not None:
            return last == "--slots"
        return self.model.env.get("LLAMA_ARG_ENDPOINT_SLOTS", "").lower() not in _FALSE

    async def read_usage(self, http: httpx.AsyncClient, base_url: str) -> EngineUsage | None:
        """Its KV-cache use from ``GET /slots`` (its memory is measured and read from its log; its
        slots are steward's). Answered by its task loop, so a long prompt may hold the answer up:
        bounded, and None (the last figure kept) when it does not answer in time."""
        import httpx
        if not self.slots_endpoint:
            return None
        try:
            response = await http.get(f"{base_url}/slots", timeout=USAGE_TIMEOUT_S)
        except httpx.HTTPError:
            return None  # busy or down for now; its health check judges that
        if response.status_code != 200:
            return None
        try:
            slots = response.json()
        except ValueError:
            return None
        capped = _has(self.model.args, _PER_SLOT_CAP_FLAGS) or "LLAMA_ARG_KV_UNIFIED_PER_SLOT" in self.model.env
        kv = kv_in_use(slots, shared=self.shared_kv and not capped)
        return None if kv is None else EngineUsage(kv_usage=kv)


def kv_in_use(slots: object, shared: bool) -> float | None:
    """The share of llama-server's KV cache its computing slots hold, 0..1, from its ``/slots``
    answer; None when the answer is not a list of slots with a context.

    A computing slot (``is_processing``) holds ``n_prompt_tokens`` cells: the tokens of its
    sequence, the prompt and what it has decoded so far (llama.cpp: ``prompt.tokens.size()``).
    An idle slot's cache (the last conversation kept, or one restored from disk) counts as
    free, as vLLM counts its prefix cache: llama-server overwrites it (separate caches) or
    purges it (a shared one) as soon as new work needs the room, so it never makes work wait.
    The capacity: the one cache's size when *shared* (each slot's ``n_ctx`` is all of it), else
    the sum of the slots' ``n_ctx`` (with ``--kv-unified-per-slot`` too: each slot's cap, the cache
    their sum).
    """
    if not isinstance(slots, list) or not slots:
        return None
    contexts, used = [], 0
    for slot in slots:
        if not isinstance(slot, dict):
            return None
        n_ctx = _count(slot.get("n_ctx"))
        if not n_ctx:
            return None
        contexts.append(n_ctx)
        if slot.get("is_processing") is True:
            used += _count(slot.get("n_prompt_tokens")) or 0
    capacity = max(contexts) if shared else sum(contexts)
    return min(1.0, used / capacity)


def _count(value: object) -> int | None:
    """A token count from an engine's JSON: a non-negative int (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _auto_parallel(value: str | None) -> bool:
    """Whether `--parallel VALUE` leaves the number of slots to llama-server (absent, or below 1)."""
    try:
        return value is None or int(value) < 1
    except ValueError:
        return False


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


def _last_flag(args: list[str], flags: tuple[str, ...]) -> str | None:
    """Which of *flags* comes last in *args* (the one llama.cpp's parser keeps)."""
    found = None
    for arg in args:
        if arg.partition("=")[0] in flags:
            found = arg.partition("=")[0]
    return found


def _flag_value(args: list[str], flags: tuple[str, ...]) -> str | None:
    """The value of the last of *flags* in *args* (``--flag V`` or ``--flag=V``)."""
    value = None
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if name in flags:
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else None)
    return value
