"""Sizes and durations as people write them in config files and on command lines."""

from __future__ import annotations

import re

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_DURATION_UNITS = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(value: object) -> int:
    """``16GiB`` -> 17179869184, ``8.3GB`` -> 8300000000; a bare number is bytes."""
    if isinstance(value, bool):
        raise ValueError(f"must be a size like 16GiB or 8.3GB, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"must not be negative, got {value!r}")
        return value
    if isinstance(value, str):
        match = _NUMBER_UNIT.match(value)
        if match and match.group(2).lower() in _SIZE_UNITS:
            return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])
    raise ValueError(f"must be a size like 16GiB or 8.3GB, got {value!r}")


def parse_duration(value: object) -> float:
    """``2s`` -> 2.0, ``5m`` -> 300.0, ``250ms`` -> 0.25; a bare number is seconds."""
    if isinstance(value, bool):
        raise ValueError(f"must be a duration like 2s or 5m, got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"must not be negative, got {value!r}")
        return float(value)
    if isinstance(value, str):
        match = _NUMBER_UNIT.match(value)
        if match and match.group(2).lower() in _DURATION_UNITS:
            return float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]
    raise ValueError(f"must be a duration like 2s or 5m, got {value!r}")


def format_size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def format_duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    if seconds < 120:
        return f"{seconds:g}s"
    return f"{seconds / 60:g}m"
