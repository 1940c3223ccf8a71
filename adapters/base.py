"""The one shape of a runtime, as supervisor/engines/driver.py drives it.

A runtime is a kind of inference server. ``supervisor/engines/driver.py`` starts it (spawns its
process, or attaches to an address), waits until it is ready, checks its health, reads
what it says of its memory and load, and stops it (stops the process, or asks the server
to unload or sleep). Each runtime is one module in ``adapters/``; adding one is that
module, its config keys, and one line in ``adapters/__init__.py``.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Protocol

import attrs

from supervisor.apis import Api
from supervisor.observe.events import EventLog

if TYPE_CHECKING:  # imported where a request is made: `steward check` imports the adapters, and needs no client
    import httpx

# How long one read of an engine's load (read_usage) may take: a busy engine that answers
# later is asked again at the next poll, its last figure kept meanwhile.
USAGE_TIMEOUT_S = 2.0


class Residence(enum.Enum):
    """Where the engine's process lives, which says what loading and unloading mean."""

    # A process per load: loading spawns it, unloading stops it (its memory goes with it).
    SPAWNED = "spawned"
    # A process steward keeps running for as long as it runs (restarted with backoff):
    # loading waits for it (and wakes it), unloading asks it to unload (Ollama) or sleep.
    SERVICE = "service"
    # Someone else's server at an address: the same, minus the process.
    ATTACHED = "attached"


@attrs.frozen
class EngineUsage:
    """What a runtime says of itself; None: it does not say."""

    memory: int | None = None  # bytes it holds (Ollama's /api/ps)
    running: int | None = None  # requests it computes now (vLLM's vllm:num_requests_running)
    waiting: int | None = None  # requests queued inside it
    # The share of its KV cache that work in progress holds, 0..1 (vLLM's vllm:kv_cache_usage_perc;
    # llama-server's computing slots' tokens over its context, /slots).
    kv_usage: float | None = None

    @property
    def says_load(self) -> bool:
        """Whether it says anything of its load (not only of its memory)."""
        return self.running is not None or self.waiting is not None or self.kv_usage is not None


class LogReader(Protocol):
    """Reads an engine's output line by line for what it says about its memory."""

    def feed(self, line: str) -> None: ...

    def summary(self) -> dict[str, dict[str, int]]:
        """device -> component -> bytes, as the engine reported them."""
        ...

    @property
    def complete(self) -> bool:
        """Whether the log has said all it says of the load (its output is read apart from the
        readiness probe, so on a busy host the probe may see the engine ready first)."""
        ...


class Runtime(Protocol):
    """One engine's runtime, made from its config."""

    name: str
    residence: Residence
    slots: int  # how many requests it runs at once; steward never sends more
    # Whether steward judges its health (Ollama loads and unloads by itself: not ours to judge).
    checks_health: bool
    # Whether it refuses a request for a model name it does not serve (vLLM: 404), so that
    # steward sends it its own name, whatever alias the client used.
    checks_model_name: bool
    # Whether unloading puts it to sleep (it keeps some memory, and is woken to load again).
    sleeps: bool
    # Whether its memory is measured from its process tree (False: it says what it holds, Ollama).
    measured: bool
    # Whether it splits one model over several devices when told how (a model no single one holds).
    splits: bool
    # The paths steward GETs of it on its own (readiness, health, usage): its access log's lines
    # for them are counted, not logged (supervisor/observe/engine_output.py).
    poll_paths: frozenset[str]

    @property
    def apis(self) -> frozenset[Api]:
        """What it serves when the model's config does not say (``serves``)."""
        ...

    @property
    def env(self) -> dict[str, str]:
        """Set in its process's environment, over steward's own."""
        ...

    def command(self, host: str, port: int) -> list[str] | None:
        """The full command line of its process, steward assigning host and port; None when
        steward runs no process for it (attached)."""
        ...

    def split_args(self, shares: list[int]) -> list[str]:
        """The arguments that split its model over its visible devices in these proportions
        (bytes each); [] when it splits by its own arguments (or does not)."""
        ...

    def log_reader(self) -> LogReader | None:
        """A fresh reader of one process's output, or None if the runtime says nothing useful."""
        ...

    async def is_ready(self, http: httpx.AsyncClient, base_url: str) -> bool:
        """One readiness probe; False while loading or not yet listening."""
        ...

    async def check_health(self, http: httpx.AsyncClient, base_url: str, timeout: float) -> str | None:
        """One health check of a ready engine: None if it answered as it should, else what went wrong."""
        ...

    async def unload(self, http: httpx.AsyncClient, base_url: str, events: EventLog) -> str:
        """Make a server whose process stays (service, attached) give its memory back: unload
        its models or put it to sleep. Never raises; says what happened."""
        ...

    async def wake(self, http: httpx.AsyncClient, base_url: str) -> str | None:
        """Undo a sleep before serving again; None when it is awake (or never sleeps), else why not."""
        ...

    async def read_usage(self, http: httpx.AsyncClient, base_url: str) -> EngineUsage | None:
        """What it says of its memory and load now; None if it says nothing (or cannot be asked)."""
        ...


async def probe_path(http: httpx.AsyncClient, url: str, timeout: float | None = None) -> str | None:
    """GET *url*: None on a 200, else what went wrong, in words for the event log."""
    import httpx
    try:
        response = await (http.get(url) if timeout is None else http.get(url, timeout=timeout))
    except httpx.TimeoutException:
        return f"{_path(url)} did not answer within {timeout:g}s" if timeout else f"{_path(url)} timed out"
    except httpx.TransportError as exc:
        return f"{_path(url)}: {exc or type(exc).__name__}"
    if response.status_code != 200:
        return f"{_path(url)} answered {response.status_code}"
    return None


def _path(url: str) -> str:
    return "/" + url.split("://", 1)[-1].partition("/")[2]
