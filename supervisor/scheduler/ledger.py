"""The memory ledger: who holds which bytes of the budget, pure bookkeeping.

A reservation is taken the moment a load is decided (count first, load second) and
given back only after the engine has drained and exited, so two decisions can never
claim the same space.
"""

from __future__ import annotations

import attrs


class LedgerError(Exception):
    pass


@attrs.define
class Ledger:
    budget: int
    # engine name -> bytes reserved; a new reservation must fit in what is free.
    reservations: dict[str, int] = attrs.Factory(dict)
    # Memory the device reports used by processes that are not steward's engines.
    outside: int = 0
    # Owners whose process exited while their memory is not yet observed free: the
    # reservation is still held, until this time at the latest.
    awaiting_free: dict[str, float] = attrs.Factory(dict)

    @property
    def reserved(self) -> int:
        return sum(self.reservations.values())

    @property
    def free(self) -> int:
        return self.budget - self.reserved - self.outside

    def reserve(self, owner: str, nbytes: int, *, count_outside: bool = True) -> None:
        if owner in self.reservations:
            raise LedgerError(f"{owner} already holds a reservation")
        room = self.free if count_outside else self.budget - self.reserved
        if nbytes > room:
            raise LedgerError(f"{owner} needs {nbytes} bytes, only {room} free")
        self.reservations[owner] = nbytes

    def release(self, owner: str) -> int:
        self.awaiting_free.pop(owner, None)
        return self.reservations.pop(owner, 0)

    def await_free(self, owner: str, deadline: float) -> None:
        """Keep *owner*'s reservation until its memory is observed free, or *deadline*."""
        self.awaiting_free[owner] = deadline

    def releasing(self, owner: str) -> bool:
        return owner in self.awaiting_free

    def resize(self, owner: str, nbytes: int) -> int:
        """A measurement replaced an estimate; returns the previous reservation."""
        previous = self.reservations[owner]
        self.reservations[owner] = nbytes
        return previous
