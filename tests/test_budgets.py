"""Per-key budgets: refused exactly at the limit, reset at the period (UTC calendar day and
month), counted from the usage log across restarts.

The rules are pure (supervisor/auth/budgets.py) and tested at exact instants; the counts
are read back from a database the UsageLog writer wrote; tests/test_front_door.py has
the budgets in a real steward.
"""

from __future__ import annotations

import io
import json
import sqlite3
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import pytest
import trio

from supervisor.auth.budgets import Budget, BudgetLedger, Period, Used, exhausted, standings
from supervisor.auth.keys import ApiKey, KeyCommandError, KeyHash, KeyName, add_key, list_keys
from supervisor.observe.events import EventLog, serve_event_log
from supervisor.usage.budget_report import budget_standings, budgets_json, format_budgets
from supervisor.usage.counted import keep_budget_counts, read_budget_counts, row_usage
from supervisor.usage.writer import UsageLog
from tests.test_usage_log import open_usage_log, usage_row


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def key(**budgets: float) -> ApiKey:
    return ApiKey(name=KeyName("alice"), hash=KeyHash("0" * 64), created=datetime(2026, 1, 1, tzinfo=UTC), **budgets)


class Clock:
    """Wall time a test sets."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# --- the pure rules ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("now", "day", "month", "day_end", "month_end"), [
    ("2026-12-04T13:05:00", "2026-12-04T00:00:00", "2026-12-01T00:00:00", "2026-12-05T00:00:00", "2027-01-01T00:00:00"),
    ("2026-12-31T23:59:59.999", "2026-12-31T00:00:00", "2026-12-01T00:00:00", "2027-01-01T00:00:00",
     "2027-01-01T00:00:00"),
    ("2028-02-29T00:00:00", "2028-02-29T00:00:00", "2028-02-01T00:00:00", "2028-03-01T00:00:00", "2028-03-01T00:00:00"),
])
def test_periods_are_utc_calendar_days_and_months(now: str, day: str, month: str, day_end: str,
                                                   month_end: str) -> None:
    assert Period.DAY.start(at(now)) == at(day) and Period.MONTH.start(at(now)) == at(month)
    assert Period.DAY.end(at(now)) == at(day_end) and Period.MONTH.end(at(now)) == at(month_end)


def test_refused_exactly_at_the_limit() -> None:
    alice, now = key(requests_per_day=3, tokens_per_day=1000), at("2026-12-04T13:05:00")
    assert exhausted(alice, Used(tokens=999, requests=2), Used(), now) is None
    spent = exhausted(alice, Used(tokens=999, requests=3), Used(), now)
    assert spent is not None and spent.budget is Budget.REQUESTS_PER_DAY and spent.left == 0
    over = exhausted(alice, Used(tokens=1004, requests=1), Used(), now)  # a long answer overshot
    assert over is not None and over.message == ("tokens_per_day 1000 of key alice used: 1004; "
                                                 "resets at 2026-12-05T00:00:00Z")
    assert over.retry_after(now) == 10 * 3600 + 55 * 60  # to midnight, UTC
    assert over.retry_after(at("2026-12-04T23:59:59.5")) == 1


def test_of_several_spent_budgets_the_one_that_resets_last_refuses() -> None:
    alice, now = key(tokens_per_day=10, tokens_per_month=100), at("2026-12-04T13:05:00")
    spent = exhausted(alice, Used(tokens=10), Used(tokens=100), now)
    assert spent is not None and spent.budget is Budget.TOKENS_PER_MONTH
    assert spent.resets_at == at("2027-01-01T00:00:00")


def test_spend_per_month() -> None:
    alice, now = key(spend_per_month=5.0), at("2026-12-04T13:05:00")
    assert exhausted(alice, Used(), Used(spend=4.99), now) is None
    spent = exhausted(alice, Used(), Used(spend=5.0), now)
    assert spent is not None and spent.message == ("spend_per_month 5.00 of key alice used: 5.00; "
                                                   "resets at 2027-01-01T00:00:00Z")
    (standing,) = standings(alice, Used(), Used(spend=1.25), now)
    assert standing.left == pytest.approx(3.75)


def test_the_ledger_resets_at_the_day_and_the_month() -> None:
    clock = Clock(at("2026-11-30T23:59:58"))
    ledger = BudgetLedger(clock)
    alice = key(requests_per_day=1, tokens_per_month=50)
    assert ledger.check(alice) is None
    ledger.observe_row("alice", clock.now, Used(tokens=40, requests=1))
    spent = ledger.check(alice)
    assert spent is not None and spent.budget is Budget.REQUESTS_PER_DAY and spent.retry_after(clock.now) == 2
    clock.now = at("2026-11-30T23:59:59.999")
    assert ledger.check(alice) is not None
    clock.now = at("2026-12-01T00:00:00")  # a new day and a new month: both reset
    assert ledger.check(alice) is None and ledger.used("alice", Period.MONTH) == Used()
    ledger.observe_row("alice", clock.now, Used(tokens=50, requests=1))
    clock.now = at("2026-12-02T00:00:00")  # the day resets, the month does not
    spent = ledger.check(alice)
    assert spent is not None and spent.budget is Budget.TOKENS_PER_MONTH
    assert spent.resets_at == at("2027-01-01T00:00:00")
    # A request that arrived yesterday and ended today counts in yesterday's day, not today's.
    ledger.observe_row("alice", at("2026-12-01T23:59:00"), Used(tokens=1, requests=1))
    assert ledger.used("alice", Period.DAY) == Used() and ledger.used("alice", Period.MONTH).tokens == 51


def test_a_row_counts_tokens_always_and_a_request_only_if_it_reached_an_engine() -> None:
    assert row_usage(usage_row(0, prompt_tokens=10, completion_tokens=None)) == Used(tokens=10, requests=1)
    refused = usage_row(0, engine=None, status=429, error="rate_limited", prompt_tokens=None, completion_tokens=None)
    assert row_usage(refused) == Used()


# --- budgets on the command line and in the key file --------------------------------------------------------


def test_add_key_with_budgets_and_bad_ones(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    with pytest.raises(KeyCommandError) as bad:
        add_key(path, "alice", budgets={"tokens_per_day": 0, "tokens_per_month": 2**64,
                                        "spend_per_month": float("nan"), "requests_per_day": -3})
    assert str(bad.value).splitlines() == [
        "--tokens-per-day: must be a positive integer, got 0",
        "--tokens-per-month: must be a positive integer less than 2**63, got 18446744073709551616",
        "--spend-per-month: must be a positive amount below 1e+12, like 5.00, got nan",
        "--requests-per-day: must be a positive integer, got -3"]
    with pytest.raises(KeyCommandError, match="--spend-per-month: .* got inf"):
        add_key(path, "alice", budgets={"spend_per_month": float("inf")})
    add_key(path, "alice", budgets={"tokens_per_day": 100_000, "spend_per_month": 5.0})
    add_key(path, "bob")
    alice, bob = list_keys(path)
    assert (alice.tokens_per_day, alice.spend_per_month, alice.requests_per_day) == (100_000, 5.0, None)
    written = json.loads(path.read_text())["keys"]
    assert "tokens_per_month" not in written[0] and "tokens_per_day" not in written[1]  # no budget: not written


# --- counted from the usage log, across a restart -----------------------------------------------------------


async def test_counts_are_read_back_from_the_usage_log(tmp_path: Path) -> None:
    db, now = tmp_path / "usage.db", at("2026-12-04T13:05:00")
    async with open_usage_log(db) as (usage, _):
        for number, (ts, fields) in enumerate([
            ("2026-12-04T00:00:00", {}),  # today: 30 tokens, a request
            ("2026-12-04T12:00:00", {"key": "bob"}),
            ("2026-12-04T12:30:00", {"engine": None, "status": 429, "prompt_tokens": None,
                                     "completion_tokens": None}),  # refused by steward: nothing
            ("2026-12-03T23:59:59", {}),  # yesterday: this month only
            ("2026-11-30T23:59:59", {}),  # last month: nothing
            ("2026-12-04T12:00:00", {"key": None}),  # no key
        ]):
            usage.record(usage_row(number, ts=at(ts), **fields))
    day, month = read_budget_counts(str(db), now)
    assert day == {"alice": Used(30, 1, 0.0), "bob": Used(30, 1, 0.0)}
    assert month == {"alice": Used(60, 2, 0.0), "bob": Used(30, 1, 0.0)}

    # A restart: a new ledger loads the counts, then counts each row recorded after.
    clock = Clock(now)
    ledger = BudgetLedger(clock)
    async with open_usage_log(db) as (usage, events):
        await keep_budget_counts(ledger, usage, events)
        assert ledger.check(key(requests_per_day=2)) is None
        usage.record(usage_row(9, ts=now))
        spent = ledger.check(key(requests_per_day=2))
        assert spent is not None and spent.used == 2
    assert ledger.used("alice", Period.MONTH) == Used(90, 3, 0.0)


def test_spend_is_the_cost_column_and_a_log_older_than_it_spends_nothing(tmp_path: Path) -> None:
    db, now = tmp_path / "usage.db", at("2026-12-04T13:05:00")
    assert read_budget_counts(str(db), now) == ({}, {})  # no log yet
    trio.run(_write_rows, db, now)
    day, month = read_budget_counts(str(db), now)
    assert day["alice"].spend == 1.25 and month["alice"].spend == 2.5
    with sqlite3.connect(db) as connection:  # a log of a steward before remote models (schema version 3)
        connection.execute("ALTER TABLE requests DROP COLUMN cost")
    assert read_budget_counts(str(db), now)[1]["alice"].spend == 0.0


async def _write_rows(db: Path, now: float) -> None:
    async with open_usage_log(db) as (usage, _):
        usage.record(usage_row(0, ts=now, cost=1.25))
        usage.record(usage_row(1, ts=at("2026-12-01T00:00:00"), cost=1.25))


async def test_an_unreadable_log_is_a_warning_and_budgets_count_from_zero(tmp_path: Path) -> None:
    not_a_log = tmp_path / "other.db"
    with sqlite3.connect(not_a_log) as connection:
        connection.execute("CREATE TABLE other (x)")
    async with trio.open_nursery() as nursery:
        events: EventLog = await nursery.start(partial(serve_event_log, None, terminal=io.StringIO()))
        ledger = BudgetLedger()
        usage = UsageLog(None, events, str(not_a_log))
        await keep_budget_counts(ledger, usage, events)
        (warning,) = [event for event in events.recent if event.name == "budgets_unread"]
        assert "not a usage log" in warning.fields["detail"]
        assert ledger.check(key(requests_per_day=1)) is None
        events.close()


def test_the_budgets_report(tmp_path: Path) -> None:
    now = at("2026-12-04T13:05:00")
    keys = [key(tokens_per_day=100, spend_per_month=5.0),
            ApiKey(name=KeyName("bob"), hash=KeyHash("1" * 64), created=datetime(2026, 1, 1, tzinfo=UTC))]
    found = budget_standings(keys, {"alice": Used(tokens=120)}, {"alice": Used(tokens=120, spend=1.5)}, now)
    text = format_budgets("usage.db", found, now).splitlines()
    assert text[0] == "budgets from usage.db: day 2026-12-04, month 2026-12 (UTC)"
    assert text[2].split() == ["alice", "tokens_per_day", "100", "120", "0", "(spent)", "2026-12-05T00:00:00Z"]
    assert text[3].split() == ["alice", "spend_per_month", "5.00", "1.50", "3.50", "2027-01-01T00:00:00Z"]
    assert budgets_json("usage.db", found, now)["budgets"][0] == {
        "key": "alice", "budget": "tokens_per_day", "limit": 100, "used": 120, "left": 0, "exhausted": True,
        "resets_at": "2026-12-05T00:00:00Z"}
    assert format_budgets("usage.db", [], now).startswith("no key has a budget")
