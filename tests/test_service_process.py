"""A supervised service (ollama serve, ComfyUI) restarted with backoff, with real processes."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import trio

from supervisor.backoff import Backoff
from supervisor.observe.events import EventLog
from supervisor.engines.service import serve_service_process

pytestmark = pytest.mark.slow  # the test here starts a service as a real process


async def test_the_restart_backoff_starts_over_after_a_service_ran_for_a_while(tmp_path: Path) -> None:
    """Found by `steward loadtest --chaos`: a ComfyUI up for minutes was restarted after the
    longest delay, as if it had been failing all along."""
    counter = tmp_path / "starts"
    counter.write_text("0")
    # Exits at once three times, then runs 3 s (longer than the 2 s cap) and exits again.
    script = (f'n=$(cat {counter}); echo $((n + 1)) > {counter}; '
              f'if [ "$n" -eq 3 ]; then sleep 3; fi; exit 1')
    send, _receive = trio.open_memory_channel[Any](math.inf)
    events = EventLog(send, recent_max=1000)
    delays: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_service_process, "svc", ["sh", "-c", script], {}, events, Backoff(0.1, 2.0))
        while len(delays) < 5:
            await trio.sleep(0.05)
            delays = [e.fields["restart_in_s"] for e in events.recent if e.name == "restart"]
        nursery.cancel_scope.cancel()
    assert delays[:5] == [0.1, 0.2, 0.4, 0.1, 0.2]
