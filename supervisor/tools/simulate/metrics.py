"""From a replay's records to what the report shows: per class, latencies, waits and errors.

A request's *wait* runs from its arrival to the start of its first step; one that never
started counts until it failed or the run ended. Its *overtake* is how long it was held
back: from the first younger request of its own class that started before it, until it
started itself or, if it arrived with its model off the card, until the load of its
model was decided, whichever came first. That is what ``scheduler.swap_hold`` bounds (a
collating scheduler has no bound): the price one request paid for another's turn, not
the drain, stop and load that follow once its swap is decided.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from supervisor.request_class import RequestClass
from supervisor.tools.simulate.runner import Outcome, Record, Wait


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest rank: the smallest value with at least *fraction* of all at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(fraction * len(ordered)) - 1, 0)]


def largest_overtake(waits: Sequence[Wait]) -> float | None:
    """The longest any request was held back after a younger one (later in *waits*, which
    are in arrival order, all of one class) had started; None for no requests."""
    if not waits:
        return None
    largest = 0.0
    earliest_younger = math.inf  # the earliest start among the requests after this one
    for wait in reversed(waits):
        held_until = wait.until if wait.load_decided is None else min(wait.until, wait.load_decided)
        largest = max(largest, held_until - earliest_younger)
        if wait.started is not None:
            earliest_younger = min(earliest_younger, wait.started)
    return largest


def loads_per_100(loads: int, completed: int) -> float | None:
    """Loads per 100 completed requests: closed-loop clients of a faster policy ask more often."""
    return None if completed == 0 else 100 * loads / completed


@attrs.frozen
class ClassStats:
    completed: int
    p50_s: float | None
    p95_s: float | None
    max_s: float | None
    errors: int
    wait_p50_s: float | None
    wait_p95_s: float | None
    wait_max_s: float | None
    overtake_max_s: float | None

    @classmethod
    def of(cls, records: Sequence[Record], waits: Sequence[Wait]) -> ClassStats:
        latencies = [r.latency for r in records if r.latency is not None]
        waited = [w.until - w.arrival for w in waits]
        return cls(len(latencies), _round(percentile(latencies, 0.50)), _round(percentile(latencies, 0.95)),
                   _round(max(latencies, default=None)), len(records) - len(latencies),
                   _round(percentile(waited, 0.50)), _round(percentile(waited, 0.95)),
                   _round(max(waited, default=None)), _round(largest_overtake(waits)))


@attrs.frozen
class PolicyResult:
    classes: dict[str, ClassStats]
    loads: int
    unnecessary_loads: int
    peak_memory_bytes: int
    loads_per_100: float | None
    busy_share: float
    fallbacks: int = 0  # requests sent along their model's fallback chain (steward's rule 11)

    @classmethod
    def of(cls, outcome: Outcome) -> PolicyResult:
        classes = {k: ClassStats.of([r for r in outcome.records if r.klass == k],
                                    [w for w in outcome.waits if w.klass == k]) for k in RequestClass}
        completed = sum(c.completed for c in classes.values())
        return cls(classes, outcome.loads, outcome.unnecessary_loads, outcome.peak_memory,
                   _round(loads_per_100(outcome.loads, completed)), round(outcome.busy_share, 4), outcome.fallbacks)

    @property
    def errors(self) -> int:
        return sum(c.errors for c in self.classes.values())

    @property
    def completed(self) -> int:
        return sum(c.completed for c in self.classes.values())

    @property
    def overtake_max_s(self) -> float | None:
        """The largest overtake in any class."""
        return max((c.overtake_max_s for c in self.classes.values() if c.overtake_max_s is not None), default=None)


@attrs.frozen
class Alone:
    """The interactive clients replayed alone: their latency, and the time they leave the card
    idle, with the most lower-class requests that time could hold (room.py)."""

    p50_s: float | None
    p95_s: float | None
    idle_s: float | None = None  # of the whole run (its warmup too) no step computed
    lower_room: float | None = None  # None: the scenario has no lower-class client


def _round(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)
