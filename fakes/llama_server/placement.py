"""Where the fake's ``--memory`` goes on a simulated host with several GPUs, as llama.cpp places a model.

The devices it may use, in order:

1. ``CUDA_VISIBLE_DEVICES`` (``fakes.simgpu.visible_devices``): unset, all; "" or "-1", none.
   ``CUDA<i>`` is the i-th *visible* device, as in CUDA.
2. ``--device CUDA0,CUDA1`` (``-dev``) picks and orders among them; ``none``: none. A name
   that is no visible device fails the load ("invalid device").
3. ``--split-mode none`` keeps only the ``--main-gpu`` one (index among those; < 0: none, too
   large: the load fails with llama.cpp's "invalid value for main_gpu").

No device left: a CPU run, nothing on any GPU. Otherwise the bytes are split over the
devices in proportion to ``--tensor-split`` (missing entries are 0, extra ones ignored),
or, without one (or all zero), to each device's total memory.

Where llama.cpp differs: it splits whole *layers* (so shares are uneven), by *free* memory
rather than total, keeps the input layer in host RAM, puts compute buffers and a CUDA
context (~300 MiB) on every device it uses, reads the flags' ``LLAMA_ARG_*`` variables too,
and rejects a bad ``--device`` while parsing flags, before binding its port. ``-ngl`` and
``-sm row`` (split like ``layer`` here) are not modelled.
"""

from __future__ import annotations

import argparse
import enum
import os
from collections.abc import Mapping, Sequence
from fractions import Fraction
from pathlib import Path

import attrs

from fakes import simgpu


class SplitMode(enum.Enum):
    NONE = "none"
    LAYER = "layer"
    ROW = "row"


@attrs.frozen
class PlacementFlags:
    devices: tuple[str, ...] | None = None  # --device; None: every visible device, (): none
    split_mode: SplitMode = SplitMode.LAYER
    tensor_split: tuple[Fraction, ...] = ()
    main_gpu: int = 0


class PlacementError(Exception):
    """The load fails; the message is llama.cpp's."""


def parse_devices(value: str) -> tuple[str, ...]:
    """``--device``: ``CUDA0,CUDA1`` or ``none``."""
    names = tuple(name.strip() for name in value.split(","))
    if names == ("none",):
        return ()
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected device names like CUDA0,CUDA1 or none, got {value!r}")
    return names


def parse_tensor_split(value: str) -> tuple[Fraction, ...]:
    """``--tensor-split``: ``3,1`` or ``0.75/0.25``, non-negative proportions."""
    error = argparse.ArgumentTypeError(f"expected non-negative proportions like 3,1, got {value!r}")
    try:
        shares = tuple(Fraction(part.strip()) for part in value.replace("/", ",").split(","))
    except ValueError:
        raise error from None
    if any(share < 0 for share in shares):
        raise error
    return shares


def split(nbytes: int, totals: Sequence[int], flags: PlacementFlags) -> list[tuple[int, int]]:
    """(visible device index, bytes) for each device used; empty for a CPU run. Bytes add up to *nbytes*."""
    used = list(range(len(totals))) if flags.devices is None else [_device_index(n, len(totals)) for n in flags.devices]
    if len(set(used)) < len(used):
        raise PlacementError(f"invalid device list: {','.join(flags.devices or ())} (a device twice)")
    if flags.split_mode is SplitMode.NONE:
        if flags.main_gpu < 0:
            used = []
        elif flags.main_gpu >= len(used):
            raise PlacementError(f"invalid value for main_gpu: {flags.main_gpu} (available devices: {len(used)})")
        else:
            used = [used[flags.main_gpu]]
    weights = [*flags.tensor_split[:len(used)], *[Fraction(0)] * (len(used) - len(flags.tensor_split))]
    if not any(weights):
        weights = [Fraction(totals[i]) for i in used]
    if not any(weights):
        weights = [Fraction(1)] * len(used)  # devices of size 0: an even split, not a division by zero
    # Cut at the cumulative proportions: each cut rounds down, the shares add up exactly.
    whole, running, cuts = sum(weights), Fraction(0), [0]
    for weight in weights:
        running += weight
        cuts.append(int(nbytes * running / whole))
    return [(index, cuts[k + 1] - cuts[k]) for k, index in enumerate(used)]


def _device_index(name: str, n_visible: int) -> int:
    # ggml looks device names up case-insensitively.
    if name.upper().startswith("CUDA") and name[4:].isdigit() and int(name[4:]) < n_visible:
        return int(name[4:])
    raise PlacementError(f"invalid device: {name}")


def place_on_sim_gpu(directory: str, nbytes: int, flags: PlacementFlags,
                     environ: Mapping[str, str] = os.environ) -> list[tuple[Path, int]]:
    """(device directory, bytes) to register. A single device (``create_device``) takes it all, flags or not."""
    if not simgpu.is_multi_device(directory):
        return [(Path(directory), nbytes)]
    try:
        devices = simgpu.visible_devices(directory, environ.get("CUDA_VISIBLE_DEVICES"))
        totals = [simgpu.device_total(device) for device in devices]
    except (OSError, ValueError, KeyError) as exc:
        raise PlacementError(f"simulated GPUs in {directory}: {exc}") from None
    return [(devices[index], share) for index, share in split(nbytes, totals, flags)]
