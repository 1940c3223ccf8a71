"""Which stopped engines to load ahead of demand, likeliest first (core.py, rule 10).

Pure and small: the core hands over the engines it may warm now (stopped, out of their
backoff, not unloaded for idleness since their last use) and ``scheduler.warm``; this puts
them in order and says why, and the core loads the first that fits in free memory. The
list comes first because a person wrote it down; then recent use, since an engine used
within hot_window is the likeliest to be asked for again (ReloadCost.likely, the same
figure that chooses victims). An engine neither listed nor used lately is never warmed:
loading it would be a guess.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from supervisor.scheduler.types import EngineState, ReloadCost, WarmCause


@attrs.frozen
class WarmChoice:
    """One engine that may be warmed, and the figures its `warm` event carries."""

    engine: str
    listed: int | None  # its place in scheduler.warm (1: first); None: not listed, used lately
    cost: ReloadCost  # its load time, and how likely it is to be needed soon (nothing is queued)

    def why(self, cause: WarmCause, rank: int) -> str:
        if self.listed is not None:
            because = f"{self.engine} is #{self.listed} in scheduler.warm"
        else:
            because = (f"{self.engine} was used lately ({self.cost.recent_uses:g} weighted steps within hot_window: "
                       f"likely {self.cost.likely:.2f})")
        passed = f"; {rank - 1} likelier did not fit in free memory" if rank > 1 else ""
        return f"{cause.words}: {because}{passed}"

    def fields(self, cause: WarmCause, rank: int) -> dict[str, object]:
        return {"engine": self.engine, "reason": cause.value, "why": self.why(cause, rank), "rank": rank,
                "listed": self.listed, "recent_uses": self.cost.recent_uses, "likely": round(self.cost.likely, 3),
                "load_s": round(self.cost.load_s, 3)}


def warm_order(engines: Iterable[EngineState], warm: Sequence[str], now: float, window: float) -> list[WarmChoice]:
    """*engines* likeliest needed first: those in *warm* in its order, then those used within
    *window* by likelihood (the greater expected load time saved on a tie, then the most
    recently used); the others not at all."""
    by_name = {engine.name: engine for engine in engines}
    listed = [WarmChoice(name, place, by_name[name].reload_cost(now, window, queued=False))
              for place, name in enumerate(warm, 1) if name in by_name]
    used = [WarmChoice(engine.name, None, cost) for engine in by_name.values()
            if engine.name not in warm and (cost := engine.reload_cost(now, window, queued=False)).recent_uses > 0]
    used.sort(key=lambda c: (-c.cost.likely, -c.cost.cost, -by_name[c.engine].last_used, c.engine))
    return listed + used
