"""Per-key budgets: tokens per day and month, requests per day, remote spend per month.

Periods are calendar periods in UTC, like every time steward writes (the key file's
``created``, the event log): a day runs from 00:00:00Z to the next 00:00:00Z, a month from
the 1st at 00:00:00Z. UTC rather than local time so that a budget resets at the same
instant whatever the host's time zone, and never twice (or not at all) on a DST change.

What counts (the same rule for the usage log read at start, ``read_budget_counts``, and for
each row recorded after, ``BudgetLedger.observe``), by the time a request *arrived* (the
usage row's ``ts``):

- tokens: prompt + completion tokens of every row;
- requests: rows that reached an engine (``engine`` set): a request steward itself turned
  away (no key, over a limit or a budget, queue full) costs no budget;
- spend: the ``cost`` of each row, where the usage log has that column (remote models).

A request is refused when, at its start, what its key used in the period is at or over the
limit. Tokens are known only when an answer ends, so requests already running when the
limit is reached still finish, and a key may end a little over its token or spend budget.

Pure: ``now`` is an argument (Unix seconds), so the rules are tested at exact instants.
The ``BudgetLedger`` is the one owner of the counts; the door calls it on trio's thread.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

import attrs

from supervisor.auth.keys import ApiKey


class Period(enum.StrEnum):
    DAY = "day"
    MONTH = "month"

    def start(self, now: float) -> float:
        """When the period holding *now* began (UTC)."""
        moment = datetime.fromtimestamp(now, UTC)
        begins = moment.replace(hour=0, minute=0, second=0, microsecond=0)
        if self is Period.MONTH:
            begins = begins.replace(day=1)
        return begins.timestamp()

    def end(self, now: float) -> float:
        """When the period holding *now* ends: the next one's start."""
        begins = datetime.fromtimestamp(self.start(now), UTC)
        if self is Period.DAY:
            return begins.timestamp() + 86400
        year, month = (begins.year + 1, 1) if begins.month == 12 else (begins.year, begins.month + 1)
        return begins.replace(year=year, month=month).timestamp()


class Measure(enum.Enum):
    TOKENS = "tokens"
    REQUESTS = "requests"
    SPEND = "spend"


class Budget(enum.StrEnum):
    """A budget a key may have; its value is the key file's field and the flag's name."""

    TOKENS_PER_DAY = "tokens_per_day"
    TOKENS_PER_MONTH = "tokens_per_month"
    REQUESTS_PER_DAY = "requests_per_day"
    SPEND_PER_MONTH = "spend_per_month"

    @property
    def period(self) -> Period:
        return Period.DAY if self.value.endswith("_day") else Period.MONTH

    @property
    def measure(self) -> Measure:
        return Measure(self.value.split("_per_")[0])

    def limit_of(self, key: ApiKey) -> float | None:
        limit: float | None = getattr(key, self.value)
        return limit


@attrs.frozen
class Used:
    """What a key used in one period."""

    tokens: int = 0
    requests: int = 0
    spend: float = 0.0

    def plus(self, other: Used) -> Used:
        return Used(self.tokens + other.tokens, self.requests + other.requests, self.spend + other.spend)

    def of(self, measure: Measure) -> float:
        return {Measure.TOKENS: self.tokens, Measure.REQUESTS: self.requests, Measure.SPEND: self.spend}[measure]


NOTHING = Used()


@attrs.frozen
class Standing:
    """One budget of one key now: its limit, what was used, and when the period resets."""

    key: str
    budget: Budget
    limit: float
    used: float
    resets_at: float  # Unix seconds

    @property
    def left(self) -> float:
        return max(0.0, self.limit - self.used) if self.budget.measure is Measure.SPEND else \
            max(0, int(self.limit) - int(self.used))

    @property
    def exhausted(self) -> bool:
        return self.used >= self.limit

    def retry_after(self, now: float) -> int:
        """Whole seconds until the reset, at least 1."""
        return max(1, math.ceil(self.resets_at - now))

    @property
    def message(self) -> str:
        return (f"{self.budget} {amount(self.budget, self.limit)} of key {self.key} used: "
                f"{amount(self.budget, self.used)}; resets at {utc_text(self.resets_at)}")


def amount(budget: Budget, value: float) -> str:
    """A count as a whole number, money with its cents."""
    return f"{value:.2f}" if budget.measure is Measure.SPEND else str(int(value))


def utc_text(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def standings(key: ApiKey, day: Used, month: Used, now: float) -> list[Standing]:
    """Each budget *key* has, with what it used (*day*, *month*: its usage in the periods holding *now*)."""
    found = []
    for budget in Budget:
        limit = budget.limit_of(key)
        if limit is not None:
            used = (day if budget.period is Period.DAY else month).of(budget.measure)
            found.append(Standing(key.name, budget, limit, used, budget.period.end(now)))
    return found


def exhausted(key: ApiKey, day: Used, month: Used, now: float) -> Standing | None:
    """The budget that refuses a request of *key* starting at *now*, or None. Of several, the one
    that resets last: waiting for that one is what lets the request in."""
    spent = [standing for standing in standings(key, day, month, now) if standing.exhausted]
    return max(spent, key=lambda standing: standing.resets_at) if spent else None


@attrs.define
class BudgetLedger:
    """What each key used in the current day and month: read from the usage log at start
    (``load``), then each recorded row added (``observe``, a ``UsageLog`` listener). Each call
    first rolls the periods over when *now* is past their end."""

    clock: Callable[[], float] = time.time  # wall time: the periods are calendar ones
    _day_start: float = -math.inf
    _month_start: float = -math.inf
    _next_roll: float = -math.inf  # the end of the day (a month ends with a day): the counts are good until then
    _day: dict[str, Used] = attrs.Factory(dict)
    _month: dict[str, Used] = attrs.Factory(dict)

    def __attrs_post_init__(self) -> None:
        self._roll(self.clock())

    def load(self, day: Mapping[str, Used], month: Mapping[str, Used], now: float) -> None:
        """The counts of the periods holding *now*, as the usage log had them."""
        self._roll(now)
        self._day, self._month = dict(day), dict(month)

    def observe_row(self, key: str | None, ts: float, used: Used) -> None:
        """A request of *key* that arrived at *ts* used *used*."""
        if key is None:
            return
        self._roll(self.clock())
        if ts >= self._day_start:
            self._day[key] = self._day.get(key, NOTHING).plus(used)
        if ts >= self._month_start:
            self._month[key] = self._month.get(key, NOTHING).plus(used)

    def check(self, key: ApiKey) -> Standing | None:
        """The budget that refuses *key*'s next request now, or None."""
        if not any(budget.limit_of(key) is not None for budget in Budget):
            return None  # most keys: no budget, nothing to work out
        now = self.clock()
        self._roll(now)
        return exhausted(key, self.used(key.name, Period.DAY), self.used(key.name, Period.MONTH), now)

    def used(self, name: str, period: Period) -> Used:
        return (self._day if period is Period.DAY else self._month).get(name, NOTHING)

    def _roll(self, now: float) -> None:
        """A new day (and month) from its first instant: the counts of the one before are dropped."""
        if now < self._next_roll:
            return
        if Period.DAY.start(now) != self._day_start:
            self._day, self._day_start = {}, Period.DAY.start(now)
        if Period.MONTH.start(now) != self._month_start:
            self._month, self._month_start = {}, Period.MONTH.start(now)
        self._next_roll = Period.DAY.end(now)
