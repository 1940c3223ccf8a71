"""What each key used in the current day and month, as its budgets count it (supervisor/auth/budgets.py).

Two ways in, one rule: ``read_budget_counts`` sums the usage log at start (one query over
the ``ts`` index, so budgets hold across restarts), and ``row_usage`` counts each row
recorded after. A row counts in the periods holding its ``ts`` (when the request arrived);
its tokens are prompt + completion; it is a request if it reached an engine (``engine``
set); its spend is its ``cost``, a column of remote models that an older log lacks (then 0).
"""

from __future__ import annotations

from pathlib import Path

import trio

from supervisor.auth.budgets import BudgetLedger, Period, Used
from supervisor.observe.events import EventLog
from supervisor.usage.report import UsageReadError, read_only, table_columns
from supervisor.usage.row import TABLE, UsageRow
from supervisor.usage.writer import UsageLog

COST = "cost"  # the usage row's money column, where remote models wrote one


def row_usage(row: UsageRow) -> Used:
    cost = getattr(row, COST, None)
    return Used(tokens=(row.prompt_tokens or 0) + (row.completion_tokens or 0),
                requests=int(row.engine is not None),
                spend=cost if isinstance(cost, int | float) and cost > 0 else 0.0)


def read_budget_counts(path: str | None, now: float) -> tuple[dict[str, Used], dict[str, Used]]:
    """Each key's usage in the day and the month holding *now*: ({key: day}, {key: month}).
    Nothing for no usage log, or none written yet. Raises UsageReadError for a file that is
    not a usage log."""
    if path is None or not Path(path).exists():
        return {}, {}
    day_start, month_start = Period.DAY.start(now), Period.MONTH.start(now)
    with read_only(path) as connection:
        if connection is None:
            return {}, {}
        cost = f"MAX(COALESCE({COST}, 0), 0)" if COST in table_columns(connection) else "0"
        tokens = "COALESCE(prompt_tokens, 0) + COALESCE(completion_tokens, 0)"
        rows = connection.execute(
            f"SELECT key, SUM(CASE WHEN ts >= :day THEN {tokens} ELSE 0 END), "
            f"SUM(CASE WHEN ts >= :day AND engine IS NOT NULL THEN 1 ELSE 0 END), "
            f"SUM(CASE WHEN ts >= :day THEN {cost} ELSE 0 END), "
            f"SUM({tokens}), SUM(engine IS NOT NULL), SUM({cost}) "
            f"FROM {TABLE} WHERE ts >= :month AND key IS NOT NULL GROUP BY key",
            {"day": day_start, "month": month_start}).fetchall()
    day, month = {}, {}
    for key, *sums in rows:
        try:
            day[str(key)] = Used(int(sums[0]), int(sums[1]), float(sums[2]))
            month[str(key)] = Used(int(sums[3]), int(sums[4]), float(sums[5]))
        except (TypeError, ValueError) as exc:  # text where a number belongs: a writer's slip
            raise UsageReadError(f"{path}: key {key!r} has counts that are not numbers ({exc})") from None
    return day, month


async def keep_budget_counts(ledger: BudgetLedger, usage: UsageLog, events: EventLog) -> None:
    """Load *ledger* from the usage log, then have it count each row recorded. Call it before
    the listeners serve (no row is recorded between the read and the listener). A log that
    cannot be read is a warning (``budgets_unread``): budgets then count from zero, never stop steward."""
    now = ledger.clock()
    try:
        day, month = await trio.to_thread.run_sync(read_budget_counts, usage.path, now)
    except UsageReadError as exc:
        events.emit("budgets_unread", "warning", path=usage.path, detail=str(exc))
        day, month = {}, {}
    ledger.load(day, month, now)
    usage.listeners.append(lambda row: ledger.observe_row(row.key, row.ts, row_usage(row)))
