"""Sizes, durations and host names as people write them in config files and on command lines."""

from __future__ import annotations

import ipaddress
import math
import re

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_DURATION_UNITS = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")
# Sizes are byte counts in 64-bit fields everywhere downstream (NVML, the ledger, JSON).
_SIZE_LIMIT = 2**63
_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def show(value: object) -> str:
    """*value* as an error message quotes it: short, and never failing (a 5,000-digit int, a deep list)."""
    if isinstance(value, str):
        return repr(value if len(value) <= 60 else value[:57] + "...")
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"a {int(value.bit_length() * math.log10(2)) + 1}-digit integer"
    if isinstance(value, bool | int | float) or value is None:
        return repr(value)
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def parse_size(value: object) -> int:
    """``16GiB`` -> 17179869184, ``8.3GB`` -> 8300000000; a bare number is bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        nbytes: float = value
    elif isinstance(value, str) and (match := _NUMBER_UNIT.match(value)) and match.group(2).lower() in _SIZE_UNITS:
        nbytes = float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
    else:
        raise ValueError(f"must be a size like 16GiB or 8.3GB, got {show(value)}")
    if nbytes < 0:
        raise ValueError(f"must not be negative, got {show(value)}")
    if not nbytes < _SIZE_LIMIT:  # also inf: a string of 400 digits
        raise ValueError(f"must be less than 8 EiB, got {show(value)}")
    return int(nbytes)


def parse_duration(value: object) -> float:
    """``2s`` -> 2.0, ``5m`` -> 300.0, ``250ms`` -> 0.25; a bare number is seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = _as_float(value)
    elif isinstance(value, str) and (match := _NUMBER_UNIT.match(value)) and match.group(2).lower() in _DURATION_UNITS:
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]
    else:
        raise ValueError(f"must be a duration like 2s or 5m, got {show(value)}")
    if not math.isfinite(seconds):  # YAML's .nan and .inf, or more digits than a float holds
        raise ValueError(f"must be a finite duration like 2s or 5m, got {show(value)}")
    if seconds < 0:
        raise ValueError(f"must not be negative, got {show(value)}")
    return seconds


def _as_float(number: float) -> float:
    try:
        return float(number)
    except OverflowError:  # an int beyond any float
        return math.inf


def is_host(text: str) -> bool:
    """An IP address, or a host name as RFC 1123 has them (labels of letters, digits and inner hyphens)."""
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        pass
    labels = text.removesuffix(".").split(".")
    # RFC 1123 2.1: the top-level label is never all digits, so 999.1.1.1 is no name (and no address).
    return (len(text) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels)
            and not labels[-1].isdigit())


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


def format_elapsed(seconds: float) -> str:
    """A measured span as a person reads it: ``1.2s``, ``45s``, ``22m`` (never ``1.20438s``)."""
    if seconds < 10:
        return format_duration(round(seconds, 1))
    return format_duration(round(seconds) if seconds < 120 else round(seconds / 60) * 60)


def format_age(seconds: float) -> str:
    """How long ago, or for how long, as a person reads it: ``<1s`` (not ``0ms``), then as ``format_elapsed``."""
    return "<1s" if seconds < 1 else format_elapsed(seconds)
