"""``steward usage --budgets``: each key's budgets, what it used of them and what is left.

A table of its own rather than columns of the ``--by key`` report: that report covers a
window (``--since 24h``) and budgets cover calendar periods (today, this month, UTC), so
beside each other the two would show numbers that look alike and are not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from supervisor.auth.budgets import NOTHING, Period, Standing, Used, amount, standings, utc_text
from supervisor.auth.keys import ApiKey

_HEADERS = ("key", "budget", "limit", "used", "left", "resets at (UTC)")


def budget_standings(keys: Sequence[ApiKey], day: Mapping[str, Used], month: Mapping[str, Used],
                     now: float) -> list[Standing]:
    """Every budget of every key, in the key file's order."""
    return [standing for key in keys
            for standing in standings(key, day.get(key.name, NOTHING), month.get(key.name, NOTHING), now)]


def format_budgets(path: str, found: Sequence[Standing], now: float) -> str:
    day, month = utc_text(Period.DAY.start(now))[:10], utc_text(Period.MONTH.start(now))[:7]
    if not found:
        return "no key has a budget (steward keys add NAME --tokens-per-day N ...)"
    lines = [[standing.key, str(standing.budget), amount(standing.budget, standing.limit),
              amount(standing.budget, standing.used), amount(standing.budget, standing.left) +
              (" (spent)" if standing.exhausted else ""), utc_text(standing.resets_at)] for standing in found]
    widths = [max(len(line[column]) for line in [list(_HEADERS), *lines]) for column in range(len(_HEADERS))]
    text = [f"budgets from {path}: day {day}, month {month} (UTC)"]
    for line in [list(_HEADERS), *lines]:
        text.append("  ".join(cell.rjust(widths[column]) if 2 <= column <= 4 else cell.ljust(widths[column])
                              for column, cell in enumerate(line)).rstrip())
    return "\n".join(text)


def budgets_json(path: str, found: Sequence[Standing], now: float) -> dict[str, Any]:
    return {"db": path, "now": now, "budgets": [
        {"key": standing.key, "budget": str(standing.budget), "limit": standing.limit, "used": standing.used,
         "left": standing.left, "exhausted": standing.exhausted, "resets_at": utc_text(standing.resets_at)}
        for standing in found]}
