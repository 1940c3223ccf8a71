"""How ``limits.max_connections`` is shared between the listeners.

One pool for all listeners let one listener's clients starve the others: 300 uploads trickling
into the ComfyUI listener filled it, and chat and ``/livez`` on the OpenAI listener answered
503 for as long as they lasted. So the cap is split:

- each listener keeps a reserve of ``max_connections // (2 * listeners)`` connections that no
  other listener can take: whatever the others' clients do, it always has that many;
- the rest (at least half the cap) is shared: a listener whose reserve is in use takes from it,
  first come, first served, so one busy listener may still use most of the cap;
- beyond the cap, each listener has ``HEALTH_SEATS`` connections that may only ask ``/livez``
  or ``/healthz`` (and close after the answer): a probe is answered even when every other
  connection is taken. Any other request on such a connection gets the 503 the cap gives.
  They are few and within the file descriptors kept out of the cap (server.py).

A listener with several addresses (IPv4 and IPv6) is one listener here. The budget is plain
counters changed only on trio's thread, so taking and giving back a seat is a few integer
operations per connection, no lock.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import attrs

# Per listener, beyond the cap: enough for a few health probes at once, too few to matter as descriptors.
HEALTH_SEATS = 4


class Seat(enum.Enum):
    """What an accepted connection may ask."""

    ANY = "any"  # within the cap: any request
    HEALTH = "health"  # beyond it: /livez and /healthz only


@attrs.define(eq=False)
class ConnectionBudget:
    reserve: int  # per listener, for it alone
    shared: int  # beyond the reserves, for whichever listener needs it
    health_seats: int  # per listener, beyond the cap
    _open: dict[str, int]  # connections within the cap, per listener
    _health_open: dict[str, int]
    _shared_taken: int = 0  # always the sum over listeners of what they hold beyond their reserve

    @classmethod
    def split(cls, capacity: int, listeners: Iterable[str], health_seats: int = HEALTH_SEATS) -> ConnectionBudget:
        names = sorted(set(listeners))
        reserve = capacity // (2 * len(names)) if names else 0
        return cls(reserve, capacity - reserve * len(names), health_seats, dict.fromkeys(names, 0),
                   dict.fromkeys(names, 0))

    @property
    def capacity(self) -> int:
        return self.shared + self.reserve * len(self._open)

    @property
    def open(self) -> int:
        """Connections open on all listeners, health seats included."""
        return sum(self._open.values()) + sum(self._health_open.values())

    def open_on(self, listener: str) -> int:
        return self._open[listener] + self._health_open[listener]

    def take(self, listener: str) -> Seat | None:
        """A seat for a new connection on *listener*, or None: it must be refused."""
        held = self._open[listener]
        if held >= self.reserve:
            if self._shared_taken >= self.shared:
                if self._health_open[listener] >= self.health_seats:
                    return None
                self._health_open[listener] += 1
                return Seat.HEALTH
            self._shared_taken += 1
        self._open[listener] = held + 1
        return Seat.ANY

    def give_back(self, listener: str, seat: Seat) -> None:
        if seat is Seat.HEALTH:
            self._health_open[listener] -= 1
            return
        held = self._open[listener] - 1
        self._open[listener] = held
        if held >= self.reserve:
            self._shared_taken -= 1
