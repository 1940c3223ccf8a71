"""A series of figures as one line of block characters, for ``steward top``'s history.

Pure: the last *width* values, each as one of eight heights scaled to the largest shown (or
to a *ceiling*, such as a device's budget, so that a full card reads as full); a missing
value (a sample steward did not take) is a space, so a gap is not read as zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float | None], width: int, *, ceiling: float | None = None) -> str:
    shown = list(values[-width:]) if width > 0 else []
    known = [v for v in shown if v is not None and math.isfinite(v)]
    top = ceiling if ceiling is not None and ceiling > 0 else max(known, default=0.0)
    return "".join(_block(v, top) for v in shown)


def _block(value: float | None, top: float) -> str:
    if value is None or not math.isfinite(value):
        return " "
    if top <= 0 or value <= 0:
        return BLOCKS[0]
    return BLOCKS[min(len(BLOCKS) - 1, math.ceil(value / top * len(BLOCKS)) - 1)]
