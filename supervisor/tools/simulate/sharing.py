"""How engines share one GPU: processor sharing, in seconds of work alone.

A step's work is measured in the seconds it would take on an idle GPU with nothing
else running; its rate is the fraction of that speed it gets now. Rates change only
when the set of busy engines, busy slots or loads changes, or a step ends reading its
prompt, and the simulated GPU recomputes them at exactly those moments.

Reading a prompt (prefill) is bound by compute, decoding by memory: they share
differently (issue 27: on a 2-core host two slots decoding did 1.5x the work of one,
two reading prompts 1x). With its own figures set, a step reading its prompt contends
with other engines by ``prefill_alpha``, and an engine with any slot reading a prompt
batches by ``prefill_batching_gain`` (its decoding slots wait in the same batches);
unset, decoding's figures stand for them.
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
    # Reading prompts: its own alpha and batching gain (None: decoding's).
    prefill_alpha: float | None = None
    prefill_batching_gain: float | None = None

    def engine_share(self, computing: int, loading: int, *, prefill: bool = False) -> float:
        """The fraction of its speed alone that each computing engine gets (*prefill*: a step
        reading its prompt)."""
        contenders = computing + self.load_weight * loading
        alpha = self.prefill_alpha if prefill and self.prefill_alpha is not None else self.alpha
        return 1.0 / max(contenders, 1.0) ** alpha

    def slot_share(self, busy_slots: int, *, prefill: bool = False) -> float:
        """The fraction of the engine's speed that each of its busy slots gets (*prefill*: one
        of them reads a prompt)."""
        gain = self.prefill_batching_gain if prefill and self.prefill_batching_gain is not None else self.batching_gain
        return (1.0 + gain * (busy_slots - 1)) / busy_slots

    def step_rate(self, busy_slots: int, computing: int, loading: int, *, prefill: bool = False,
                  engine_prefills: bool = False) -> float:
        """Seconds of work alone done per second by one step on an engine with *busy_slots*
        (*prefill*: this step reads its prompt; *engine_prefills*: a slot of its engine does)."""
        return (self.engine_share(computing, loading, prefill=prefill)
                * self.slot_share(busy_slots, prefill=engine_prefills))

    def problems(self, path: str) -> list[str]:
        problems = []
        for name, alpha in (("alpha", self.alpha), ("prefill_alpha", self.prefill_alpha)):
            if alpha is not None and alpha < 0:
                problems.append(f"{path}.{name}: must not be negative, got {alpha}")
        for name, gain in (("batching_gain", self.batching_gain), ("prefill_batching_gain", self.prefill_batching_gain)):
            if gain is not None and not 0 <= gain <= 1:
                problems.append(f"{path}.{name}: must be between 0 and 1, got {gain}")
        if self.load_weight < 0:
            problems.append(f"{path}.load_weight: must not be negative, got {self.load_weight}")
        return problems
