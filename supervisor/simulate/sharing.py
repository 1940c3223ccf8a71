"""How engines share one GPU: processor sharing, in seconds of work alone.

A step's work is measured in the seconds it would take on an idle GPU with nothing
else running; its rate is the fraction of that speed it gets now. Rates change only
when the set of busy engines, busy slots or loads changes, and the simulated GPU
recomputes them at exactly those moments.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class SharingModel:
    # k engines computing at once each run at (speed alone) / k**alpha: 1.0 is an even
    # time split of a saturated GPU, below 1.0 some overlap (one engine's idle gaps).
    alpha: float = 1.0
    # n busy slots of one engine decode as one batch: together they do
    # (1 + batching_gain * (n - 1)) times the work of one slot alone, split evenly.
    batching_gain: float = 0.5
    # A load in progress (weights copied in, KV cache built) counts as this many engines.
    load_weight: float = 0.5

    def engine_share(self, computing: int, loading: int) -> float:
        """The fraction of its speed alone that each computing engine gets."""
        contenders = computing + self.load_weight * loading
        return 1.0 / max(contenders, 1.0) ** self.alpha

    def slot_share(self, busy_slots: int) -> float:
        """The fraction of the engine's speed that each of its busy slots gets."""
        return (1.0 + self.batching_gain * (busy_slots - 1)) / busy_slots

    def step_rate(self, busy_slots: int, computing: int, loading: int) -> float:
        """Seconds of work alone done per second by one step on an engine with *busy_slots*."""
        return self.engine_share(computing, loading) * self.slot_share(busy_slots)

    def problems(self, path: str) -> list[str]:
        problems = []
        if self.alpha < 0:
            problems.append(f"{path}.alpha: must not be negative, got {self.alpha}")
        if not 0 <= self.batching_gain <= 1:
            problems.append(f"{path}.batching_gain: must be between 0 and 1, got {self.batching_gain}")
        if self.load_weight < 0:
            problems.append(f"{path}.load_weight: must not be negative, got {self.load_weight}")
        return problems
