"""From a replay's records to what the report shows: per class, latencies and errors."""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from supervisor.scheduler.types import CLASSES
from supervisor.simulate.runner import Outcome, Record


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest rank: the smallest value with at least *fraction* of all at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(fraction * len(ordered)) - 1, 0)]


@attrs.frozen
class ClassStats:
    completed: int
    p50_s: float | None
    p95_s: float | None
    max_s: float | None
    errors: int

    @classmethod
    def of(cls, records: Sequence[Record]) -> ClassStats:
        latencies = [r.latency for r in records if r.latency is not None]
        return cls(len(latencies), _round(percentile(latencies, 0.50)), _round(percentile(latencies, 0.95)),
                   _round(max(latencies, default=None)), len(records) - len(latencies))


@attrs.frozen
class PolicyResult:
    classes: dict[str, ClassStats]
    loads: int
    unnecessary_loads: int
    peak_memory_bytes: int

    @classmethod
    def of(cls, outcome: Outcome) -> PolicyResult:
        classes = {k: ClassStats.of([r for r in outcome.records if r.klass == k]) for k in CLASSES}
        return cls(classes, outcome.loads, outcome.unnecessary_loads, outcome.peak_memory)

    @property
    def errors(self) -> int:
        return sum(c.errors for c in self.classes.values())


@attrs.frozen
class Alone:
    p50_s: float | None
    p95_s: float | None


def _round(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)
