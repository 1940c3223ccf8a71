"""The requests a front door holds while the node they need wakes: who waits, for which
node, since when, until when, and what ends the wait.

A request is held in one place only (``NodeRouter._wait_for``), so the registry has one
way in: ``hold``, a context manager around the wait. Its entry is there while the request
waits and gone the moment it proceeds, gives up at its deadline, or is cancelled (its client
left, steward stops), whichever way the ``with`` block is left. The entries are immutable;
the registry is changed only by ``hold`` and read as a tuple, so under trio (one thread, no
await inside a change) readers never see half an entry.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
from collections.abc import Iterator

import attrs

from supervisor.request_class import RequestClass


class HoldBound(enum.Enum):
    """What ends the wait if the node does not wake first: the earlier of the two."""

    WAKE_TIMEOUT = "wake_timeout"  # the node's wake.timeout
    QUEUE_TIMEOUT = "queue_timeout"  # the request's class's queue timeout


@attrs.frozen
class HeldRequest:
    request_id: str
    node: str
    model: str
    klass: RequestClass
    since: float  # trio's clock
    deadline: float  # trio's clock: answered 503 node_asleep then
    bound: HoldBound

    @property
    def limit(self) -> float:
        """How long it may wait in all."""
        return self.deadline - self.since


@attrs.define(eq=False)
class HeldRequests:
    """The requests held now, oldest first."""

    _held: dict[int, HeldRequest] = attrs.Factory(dict)
    _numbers: Iterator[int] = attrs.Factory(itertools.count)

    @contextlib.contextmanager
    def hold(self, request: HeldRequest) -> Iterator[None]:
        number = next(self._numbers)
        self._held[number] = request
        try:
            yield
        finally:
            del self._held[number]

    def entries(self) -> tuple[HeldRequest, ...]:
        return tuple(self._held.values())  # a dict keeps the order of arrival
