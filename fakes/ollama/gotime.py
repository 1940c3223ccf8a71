"""Go's ``time`` as Ollama's API shows it: ``ParseDuration``, ``keep_alive`` values, RFC 3339 stamps."""

from __future__ import annotations

import datetime as dt
import math
import re
import time

FOREVER = math.inf                  # a negative keep_alive: Ollama stores time.Duration(math.MaxInt64)
MAX_DURATION_S = (2**63 - 1) / 1e9  # what "forever" adds to now in expires_at (~292 years)

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)?")


def parse_go_duration(text: str) -> float:
    """Go's ``time.ParseDuration`` in seconds, a negative value mapped to FOREVER.

    ``"10m"``, ``"1h30m"``, ``"-1m"``, ``"0"``; ``"-1"`` fails with Go's "missing unit".
    """
    quoted = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    body = text[1:] if text[:1] in "+-" else text
    if body == "0":
        return 0.0
    if not body:
        raise ValueError(f"time: invalid duration {quoted}")
    total, pos = 0.0, 0
    while pos < len(body):
        match = _PART.match(body, pos)
        number, unit = (match.group(1), match.group(2)) if match else ("", None)
        if number in ("", "."):
            raise ValueError(f"time: invalid duration {quoted}")
        if unit is None:
            rest = re.match(r"[^0-9.]*", body[match.end():]).group()
            if rest:
                raise ValueError(f'time: unknown unit "{rest}" in duration {quoted}')
            raise ValueError(f"time: missing unit in duration {quoted}")
        total += float(number) * _UNITS[unit]
        pos = match.end()
    return FOREVER if text.startswith("-") and total > 0 else total


def keep_alive_seconds(value: object) -> float | None:
    """A request's ``keep_alive`` (api.Duration.UnmarshalJSON): None when absent or null.

    A JSON number is seconds, a string a Go duration; anything negative means forever.
    Raises ValueError with Go's message for what Ollama answers with 400.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        kind = {bool: "bool", list: "[]interface {}", dict: "map[string]interface {}"}.get(type(value), "?")
        raise ValueError(f"Unsupported type: '{kind}'")
    if isinstance(value, str):
        return parse_go_duration(value)
    try:
        seconds = float(value)
    except OverflowError:  # Go's float64 cannot hold it either
        raise ValueError(f"json: cannot unmarshal number {value} into Go value of type float64") from None
    return FOREVER if seconds < 0 else seconds


def rfc3339(when: float | None = None) -> str:
    """RFC 3339 with nanoseconds in UTC, as Go's time.Time marshals (trailing zeros dropped)."""
    ns = time.time_ns() if when is None else int(when * 1e9)
    seconds, frac = divmod(ns, 10**9)
    try:
        stamp = dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    except (OverflowError, ValueError):
        stamp = "2318-01-01T00:00:00"
    fraction = f"{frac:09d}".rstrip("0")
    return stamp + ("." + fraction if fraction else "") + "Z"


def nanoseconds(seconds: float) -> int:
    return max(0, int(seconds * 1e9))
