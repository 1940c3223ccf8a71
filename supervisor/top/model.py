"""What ``steward top`` knows and shows, changed by plain calls and free of I/O and clocks.

The live loop's tasks call ``saw_state``, ``saw_event``, ``failed`` and ``press``; the drawer
asks for ``frame()``. Pausing keeps the picture of the moment ``p`` was pressed (``held``)
while the data goes on arriving underneath, so resuming shows the present at once.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from supervisor.top.view import Frame, Screen

EVENTS_KEPT = 500  # more than the tallest pane shows


class Key(enum.Enum):
    QUIT = "q"
    PAUSE = "p"
    EVENTS = "e"  # the events alone; again: back to the overview


@attrs.define
class Top:
    url: str
    state: Mapping[str, Any] | None = None
    events: list[Mapping[str, Any]] = attrs.Factory(list)  # newest last, no debug events
    problem: str | None = None
    screen: Screen = Screen.OVERVIEW
    held: Frame | None = None  # the picture kept while paused

    def frame(self) -> Frame:
        if self.held is not None:
            return attrs.evolve(self.held, screen=self.screen)
        return Frame(self.url, self.state, tuple(self.events), self.screen, paused=False, problem=self.problem)

    def saw_state(self, state: Mapping[str, Any]) -> None:
        self.state, self.problem = state, None
        recent = state.get("events")
        self.events = merge_events(self.events, recent if isinstance(recent, list) else [])

    def saw_event(self, record: Mapping[str, Any]) -> None:
        self.events = merge_events(self.events, [record])

    def failed(self, problem: str) -> None:
        self.problem = problem

    def press(self, char: str) -> bool:
        """Act on a key; False once it asks to quit. Other keys do nothing."""
        try:
            key = Key(char.lower())
        except ValueError:
            return True
        if key is Key.QUIT:
            return False
        if key is Key.PAUSE:
            self.held = None if self.held is not None else attrs.evolve(self.frame(), paused=True)
        else:
            self.screen = Screen.OVERVIEW if self.screen is Screen.EVENTS else Screen.EVENTS
        return True


def merge_events(known: list[Mapping[str, Any]], new: Iterable[Any],
                 limit: int = EVENTS_KEPT) -> list[Mapping[str, Any]]:
    """*known* and the records of *new* it lacks, in time order, debug events left out (the
    state's recent events and the stream overlap: each event is kept once)."""
    seen = {_identity(record) for record in known}
    merged = list(known)
    for record in new:
        if isinstance(record, Mapping) and record.get("level") != "debug" and _identity(record) not in seen:
            seen.add(_identity(record))
            merged.append(record)
    if len(merged) > len(known):
        merged.sort(key=_moment)  # stable: events of one moment keep their order
    return merged[-limit:]


def _identity(record: Mapping[str, Any]) -> tuple[Any, ...]:
    return record.get("ts"), record.get("mono"), record.get("event")


def _moment(record: Mapping[str, Any]) -> float:
    ts = record.get("ts")
    return float(ts) if isinstance(ts, int | float) else 0.0
