"""What ``steward top`` knows and shows, changed by plain calls and free of I/O and clocks.

The live loop's tasks call ``saw_state``, ``saw_event``, ``failed`` and ``press``; the drawer
asks for ``frame()``. Pausing keeps the picture of the moment ``p`` was pressed (``held``)
while the data goes on arriving underneath, so resuming shows the present at once.

On a front door, a digit (its row's ``#``) or ``n`` (the next one) shows a node's own
picture, which the front door reads with its key for the node (``state_path``); ``0`` or
Escape goes back to the fleet. A state or a failure is told with the node it was asked
for, so an answer that arrives after a switch is not drawn under the wrong name.
"""

from __future__ import annotations

import enum
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from supervisor.top.client import STATE_PATH
from supervisor.top.view import NODE_KEYS, Frame, Screen

EVENTS_KEPT = 500  # more than the tallest pane shows


class Key(enum.Enum):
    QUIT = "q"
    PAUSE = "p"
    EVENTS = "e"  # the events alone; again: back to the overview
    NEXT_NODE = "n"  # a front door's next node's own view (after the last: the fleet)
    FLEET = "0"  # back to the front door's own view
    ESCAPE = "\x1b"  # the same


@attrs.frozen
class NodeFocus:
    """The node whose own picture is shown, and what top last had of it."""

    name: str
    state: Mapping[str, Any] | None = None
    problem: str | None = None


@attrs.define
class Top:
    url: str
    state: Mapping[str, Any] | None = None
    events: list[Mapping[str, Any]] = attrs.Factory(list)  # newest last, no debug events
    problem: str | None = None
    screen: Screen = Screen.OVERVIEW
    held: Frame | None = None  # the picture kept while paused
    focus: NodeFocus | None = None  # a node's own view; None: the steward's

    def frame(self) -> Frame:
        if self.held is not None:
            return attrs.evolve(self.held, screen=self.screen)
        if self.focus is not None:
            return self._node_frame(self.focus)
        return Frame(self.url, self.state, tuple(self.events), self.screen, paused=False, problem=self.problem)

    def _node_frame(self, focus: NodeFocus) -> Frame:
        recent = focus.state.get("events") if focus.state is not None else None
        events = merge_events([], recent if isinstance(recent, list) else [])
        problem = focus.problem
        if self._node(focus.name).get("key_known") is False:  # said whether its picture came or not
            no_key = f"the front door has no key for node {focus.name} (nodes.{focus.name}.key_env)"
            problem = f"{problem} ({no_key})" if problem else no_key
        return Frame(self.url, focus.state, tuple(events), self.screen, paused=False, problem=problem, node=focus.name)

    @property
    def node(self) -> str | None:
        """The node whose view is asked for now, if any."""
        return None if self.focus is None else self.focus.name

    def state_path(self) -> str:
        """Where the picture asked for now is read: the steward's, or a node's through it."""
        if self.focus is None:
            return STATE_PATH
        return f"/admin/nodes/{urllib.parse.quote(self.focus.name, safe='')}/state"

    def saw_state(self, state: Mapping[str, Any], node: str | None = None) -> None:
        """*state* of the steward, or of *node* (the node it was asked for)."""
        if node is not None:
            if self.focus is not None and self.focus.name == node:
                self.focus = NodeFocus(node, state)
            return
        self.state, self.problem = state, None
        recent = state.get("events")
        self.events = merge_events(self.events, recent if isinstance(recent, list) else [])

    def saw_event(self, record: Mapping[str, Any]) -> None:
        self.events = merge_events(self.events, [record])

    def failed(self, problem: str, node: str | None = None) -> None:
        if node is None:
            self.problem = problem
        elif self.focus is not None and self.focus.name == node:
            self.focus = attrs.evolve(self.focus, problem=problem)

    def press(self, char: str) -> bool:
        """Act on a key; False once it asks to quit. Other keys do nothing."""
        if char in NODE_KEYS:
            self._show_node(NODE_KEYS.index(char))
            return True
        try:
            key = Key(char.lower())
        except ValueError:
            return True
        if key is Key.QUIT:
            return False
        if key is Key.PAUSE:
            self.held = None if self.held is not None else attrs.evolve(self.frame(), paused=True)
        elif key is Key.EVENTS:
            self.screen = Screen.OVERVIEW if self.screen is Screen.EVENTS else Screen.EVENTS
        elif key is Key.NEXT_NODE:
            names = self._node_names()
            self._show_node(names.index(self.focus.name) + 1 if self.focus and self.focus.name in names else 0)
        else:
            self.focus = None
        return True

    def _show_node(self, index: int) -> None:
        """The view of the front door's *index*-th node; past the last, the fleet's."""
        names = self._node_names()
        if index >= len(names):
            self.focus = None
        elif self.focus is None or self.focus.name != names[index]:
            self.focus = NodeFocus(names[index])

    def _node_names(self) -> list[str]:
        return [str(node["name"]) for node in self._nodes() if "name" in node]

    def _node(self, name: str) -> Mapping[str, Any]:
        return next((node for node in self._nodes() if node.get("name") == name), {})

    def _nodes(self) -> list[Mapping[str, Any]]:
        """The front door's nodes, as its last state listed them (none: it is no front door)."""
        nodes = self.state.get("nodes") if self.state is not None else None
        return [node for node in nodes if isinstance(node, Mapping)] if isinstance(nodes, list) else []


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
