"""Where a load may go on a host with several devices: the candidate placements, pure.

A model goes on one device when one can hold it (``CUDA_VISIBLE_DEVICES``); one that no
single device can hold is split over all it may use, in proportion to their budgets
(llama-server's ``--tensor-split``); ``models.NAME.devices`` limits the choice, and a
list of several splits it over them. A sleeping engine wakes where its process is. Which
candidate wins (free memory first, then the device it ran on last) is the scheduler's
call, since it depends on what would have to be evicted (``eviction.place``).
"""

from __future__ import annotations

from supervisor.scheduler.ledger import Ledger, scale
from supervisor.scheduler.types import EngineProfile, Placement


def allowed_devices(profile: EngineProfile, ledger: Ledger) -> tuple[int, ...]:
    if profile.devices is None:
        return tuple(ledger.devices)
    return tuple(device for device in profile.devices if device in ledger.devices)


def candidate_placements(profile: EngineProfile, ledger: Ledger, kept: Placement | None) -> list[Placement]:
    """Every placement a load of *profile* may take; *kept*: where its sleeping process is."""
    count = len(ledger.budgets)
    if kept is not None:
        return [Placement.of(scale(kept.share, profile.memory), count)]
    devices = allowed_devices(profile, ledger)
    if not devices:
        return []
    if len(devices) > 1 and profile.devices is not None:  # pinned to several: split over them
        return [split_over(profile.memory, devices, ledger)]
    single = [Placement.of({device: profile.memory}, count) for device in devices
              if ledger.budgets[device] >= profile.memory]
    if single:
        return single
    if profile.splittable and len(devices) > 1:
        return [split_over(profile.memory, devices, ledger)]
    return []  # nothing can ever hold it (submit refuses its requests)


def split_over(nbytes: int, devices: tuple[int, ...], ledger: Ledger) -> Placement:
    """*nbytes* over *devices* in proportion to their budgets (what --tensor-split is told)."""
    return Placement.of(scale({device: ledger.budgets[device] for device in devices}, nbytes), len(ledger.budgets))


def most_memory(profile: EngineProfile, ledger: Ledger, taken: dict[int, int]) -> int:
    """The most *profile* could ever be given, with *taken* held on each device by others."""
    devices = allowed_devices(profile, ledger)
    room = [max(0, ledger.budgets[device] - taken.get(device, 0)) for device in devices]
    if not room:
        return 0
    if len(devices) > 1 and (profile.splittable or profile.devices is not None):
        return sum(room)
    return max(room)
