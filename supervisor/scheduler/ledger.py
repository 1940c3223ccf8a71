"""The memory ledger: who holds which bytes of which device, pure bookkeeping.

A reservation is taken the moment a load is decided (count first, load second) and
given back only after the engine has drained and exited, so two decisions can never
claim the same space. Each device has its own budget and its own outside use: an engine
on one card holds nothing of the other, and one split over several (llama.cpp's
``--tensor-split``) holds a share of each.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

Share = Mapping[int, int]  # device index -> bytes


class LedgerError(Exception):
    pass


def _budgets(value: int | Sequence[int]) -> tuple[int, ...]:
    return (value,) if isinstance(value, int) else tuple(value)


@attrs.define
class Ledger:
    # What may be reserved on each device (index = device); one entry on a host with one
    # GPU, or on a CPU-only host (its RAM).
    budgets: tuple[int, ...] = attrs.field(converter=_budgets)
    # owner -> device -> bytes reserved; a new reservation must fit in what each device has free.
    shares: dict[str, dict[int, int]] = attrs.Factory(dict)
    # Memory each device reports used by processes that are not steward's engines.
    outside_by_device: list[int] = attrs.field()
    # Owners whose process exited while their memory is not yet observed free: the
    # reservation is still held, until this time at the latest.
    awaiting_free: dict[str, float] = attrs.Factory(dict)

    @outside_by_device.default
    def _no_outside(self) -> list[int]:
        return [0] * len(self.budgets)

    @property
    def devices(self) -> range:
        return range(len(self.budgets))

    @property
    def budget(self) -> int:
        return sum(self.budgets)

    @property
    def reserved(self) -> int:
        return sum(sum(share.values()) for share in self.shares.values())

    @property
    def outside(self) -> int:
        return sum(self.outside_by_device)

    @property
    def free(self) -> int:
        return self.budget - self.reserved - self.outside

    @property
    def totals(self) -> dict[str, int]:
        """owner -> bytes reserved over all devices."""
        return {owner: sum(share.values()) for owner, share in self.shares.items()}

    def reserved_on(self, device: int) -> int:
        return sum(share.get(device, 0) for share in self.shares.values())

    def free_on(self, device: int) -> int:
        return self.budgets[device] - self.reserved_on(device) - self.outside_by_device[device]

    def held(self, owner: str) -> int:
        return sum(self.shares.get(owner, {}).values())

    def held_on(self, owner: str, device: int) -> int:
        return self.shares.get(owner, {}).get(device, 0)

    def holds(self, owner: str) -> bool:
        return owner in self.shares

    def reserve(self, owner: str, share: Share, *, count_outside: bool = True) -> None:
        if owner in self.shares:
            raise LedgerError(f"{owner} already holds a reservation")
        for device, nbytes in share.items():
            room = self.free_on(device) if count_outside else self.budgets[device] - self.reserved_on(device)
            if nbytes > room:
                raise LedgerError(f"{owner} needs {nbytes} bytes on device {device}, only {room} free")
        self.shares[owner] = {device: nbytes for device, nbytes in share.items() if nbytes}

    def release(self, owner: str) -> int:
        self.awaiting_free.pop(owner, None)
        return sum(self.shares.pop(owner, {}).values())

    def await_free(self, owner: str, deadline: float) -> None:
        """Keep *owner*'s reservation until its memory is observed free, or *deadline*."""
        self.awaiting_free[owner] = deadline

    def releasing(self, owner: str) -> bool:
        return owner in self.awaiting_free

    def resize(self, owner: str, share: Share) -> int:
        """A measurement replaced an estimate; returns the previous reservation (all devices)."""
        previous = self.held(owner)
        self.shares[owner] = {device: nbytes for device, nbytes in share.items() if nbytes}
        return previous

    def rescale(self, owner: str, nbytes: int) -> int:
        """*owner* holds *nbytes* now, over the devices it holds, in the same proportions."""
        return self.resize(owner, scale(self.shares[owner], nbytes))


def scale(share: Share, nbytes: int) -> dict[int, int]:
    """*nbytes* spread over *share*'s devices in its proportions (the last takes the rounding)."""
    total = sum(share.values())
    devices = sorted(share)
    if total <= 0 or len(devices) == 1:
        return {devices[0] if devices else 0: nbytes}
    scaled = {device: nbytes * share[device] // total for device in devices[:-1]}
    scaled[devices[-1]] = nbytes - sum(scaled.values())
    return scaled
