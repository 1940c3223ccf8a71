"""The engines of an admin state document as ``steward ps`` prints them: one row per engine."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from supervisor.units import format_elapsed, format_size

COLUMNS = ("NAME", "STATE", "MEMORY", "SLOTS", "QUEUE", "IDLE", "KEPT")


def format_engines(state: Mapping[str, Any]) -> str:
    """A table of the engines in *state* (``GET /admin/state``), aligned, one row each.

    MEMORY is what steward holds for the engine now (``-``: none); SLOTS in use/total; IDLE
    since its last request, of an engine that holds memory (``-`` while it works, or holds
    none: a stopped engine's idle time means nothing); KEPT
    says why it is not evicted: ``pinned``, or hot and until when."""
    engines = state.get("engines") or []
    if not engines:
        return "no engines"
    rows = [COLUMNS, *(_row(engine) for engine in engines)]
    widths = [max(len(row[column]) for row in rows) for column in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


def _row(engine: Mapping[str, Any]) -> tuple[str, ...]:
    status = str(engine.get("status", "?"))
    if engine.get("draining") and status != "draining":
        status += ", draining"
    if engine.get("healthy") is False and status == "ready":
        status = "unhealthy"
    reserved = engine.get("reserved") or 0
    idle = engine.get("idle_s")
    return (str(engine.get("name", "?")), status, format_size(reserved) if reserved else "-",
            f"{engine.get('in_flight', 0)}/{engine.get('slots', 0)}", str(engine.get("queued", 0)),
            "-" if idle is None or not reserved else format_elapsed(idle), _kept(engine))


def _kept(engine: Mapping[str, Any]) -> str:
    if engine.get("pinned"):
        return "pinned"
    until = engine.get("hot_until")
    if engine.get("hot") and until is not None:
        return f"hot until {time.strftime('%H:%M:%S', time.localtime(until))}"
    return "-"
