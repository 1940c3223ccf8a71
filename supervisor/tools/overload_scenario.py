"""The overload scenario (supervisor/tools/overload.py): the mix of callers, and steward's config and keys for it.

``OverloadPlan.for_clients`` derives from the number of clients and the engine's capacity
who sends what (the mix of the overload module's docstring) and the limits that make each
kind of rejection happen: the guests' concurrency, the batch queue's size, the background
queue's timeout. ``OverloadPlan.config`` is steward's config for the run, one fake engine
with one slot; ``make_keys`` writes its key file. Pure but for that file.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import attrs

from supervisor.auth.keys import add_key

MODEL = "chat"
SLOTS = 1
MIN_CLIENTS = 64  # below this some callers of the mix would be no one
# After interactive work the engine is kept from lower classes this long (default 2 s, scaled down).
INTERACTIVE_WINDOW_S = 0.25
GUEST_CONCURRENCY = 2


@attrs.frozen
class Caller:
    """One kind of client in the mix: whose key it sends, and the class it asks for (None: the key's default)."""

    name: str
    key: str | None  # a key's name in the key file; None: an unknown key
    count: int
    klass: str | None = None


@attrs.frozen
class OverloadPlan:
    """The mix and the limits, derived from the number of clients and the engine's capacity. Pure."""

    clients: int
    capacity_per_s: float
    max_tokens: int
    callers: tuple[Caller, ...]
    guest_concurrency: int
    batch_max_queue: int
    background_queue_timeout: float
    interactive_slo_wait: float
    interactive_window: float = INTERACTIVE_WINDOW_S
    health_window: float = 120.0  # longer than the whole run: every rejection counts until the end

    @classmethod
    def for_clients(cls, clients: int, capacity_per_s: float, max_tokens: int = 10) -> OverloadPlan:
        """Raises ValueError for a mix that cannot be made."""
        if not isinstance(clients, int) or clients < MIN_CLIENTS:
            raise ValueError(f"clients must be an integer of at least {MIN_CLIENTS}, got {clients!r}")
        if not capacity_per_s > 0 or not math.isfinite(capacity_per_s):
            raise ValueError(f"capacity_per_s must be a positive number, got {capacity_per_s!r}")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        guest, stranger, climbing = clients // 32, clients // 32, clients // 64
        family, background = clients * 3 // 16, clients * 3 // 8 - climbing
        jobs = clients - family - guest - stranger - background - climbing
        callers = (Caller("family", "family", family), Caller("guest", "guest", guest),
                   Caller("stranger", None, stranger), Caller("agents", "agents", background),
                   Caller("agents asking interactive", "agents", climbing, "interactive"),
                   Caller("jobs", "jobs", jobs, "batch"))
        interactive_s = (family + GUEST_CONCURRENCY) / capacity_per_s  # what gets past the door, served first
        return cls(clients, capacity_per_s, max_tokens, callers, guest_concurrency=GUEST_CONCURRENCY,
                   batch_max_queue=max(1, jobs // 4),
                   # Background times out once about half of it was served: some served, some turned away.
                   background_queue_timeout=round(interactive_s + INTERACTIVE_WINDOW_S
                                                  + background / 2 / capacity_per_s, 2),
                   # Some 20 requests' worth of waiting (1 s at 20/s): the interactive queue is longer.
                   interactive_slo_wait=round(min(20, family / 2) / capacity_per_s, 3))

    @property
    def tokens_per_second(self) -> float:
        return self.capacity_per_s * self.max_tokens

    def config(self, workdir: Path, webhook: str) -> dict[str, Any]:
        """Steward's config: one fake engine, the classes' limits, keys, usage log, health, alerts."""
        engine_args = ["--memory", "1GiB", "--load-time", "0.2s", "--tokens-per-second", f"{self.tokens_per_second:g}"]
        return {
            "listen": "127.0.0.1:0",
            "models": {MODEL: {"command": [sys.executable, "-m", "fakes.llama_server"], "args": engine_args,
                               "memory": "1GiB", "parallel": SLOTS, "always_on": True}},
            "gpu": {"probe": "none", "budget": "8GiB"},
            "engines": {"stop_grace": "3s", "restart_backoff": "0.2s"},
            "scheduler": {"interactive_window": f"{self.interactive_window}s"},
            "classes": {"interactive": {"slo_wait": f"{self.interactive_slo_wait}s"},
                        "background": {"queue_timeout": f"{self.background_queue_timeout}s"},
                        "batch": {"max_queue": self.batch_max_queue, "queue_timeout": "10m"}},
            "auth": {"keys_file": str(workdir / "keys.json")},
            "usage": {"db": str(workdir / "usage.db")},
            "health": {"window": f"{self.health_window:g}s", "interval": "0.2s"},
            "alerts": {"webhook": webhook, "min_interval": "10m"},
            "log": {"file": str(workdir / "events.jsonl"), "terminal": "warning", "max_size": 0},  # read whole after
            "state_file": str(workdir / "state.json"),
        }

    def make_keys(self, path: Path) -> dict[str, str]:
        """The key file at *path*: name -> key text, and ``monitor`` for the scrapes of /metrics."""
        limits: dict[str, dict[str, Any]] = {
            "family": {"classes": ["interactive"]},
            "guest": {"classes": ["interactive"], "concurrency": self.guest_concurrency},
            "agents": {"classes": ["background", "batch"], "default_class": "background"},
            "jobs": {"classes": ["batch"]},
            "monitor": {},
        }
        return {name: add_key(path, name, known_models=(MODEL,), **options) for name, options in limits.items()}
