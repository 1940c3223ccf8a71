"""How each fake runtime's process runs: one trio run, memory handed back on the way out."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from fakes import simgpu


def run_fake(run_server: Callable[[Any, Any], Awaitable[int]], cfg: Any, log: Any) -> int:
    """Run *run_server(cfg, log)*; a clean exit frees the simulated GPU memory it registered."""
    try:
        return trio.run(run_server, cfg, log)
    except KeyboardInterrupt:  # a SIGINT before the signal receiver was installed
        return 0
    finally:
        if cfg.sim_gpu:
            simgpu.unregister(cfg.sim_gpu)
