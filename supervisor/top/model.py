"""What ``steward top`` knows and shows, changed by plain calls and free of I/O and clocks.

The live loop's tasks call ``saw_state``, ``saw_event``, ``failed`` and ``press``; the drawer
asks for ``frame()``. Pausing keeps the picture of the moment ``p`` was pressed (``held``)
while the data goes on arriving underneath, so resuming shows the present at once.

An engine is selected with the arrows or j/k; then ``u`` unloads it, ``p`` pins or unpins it
and ``f`` opens a pane of its output, live (Escape or q: back). What needs steward is left in
``asks`` for the live loop to send (top/app.py), which says the outcome with ``said``: the
model itself does no I/O.

On a front door, a digit (its row's ``#``) or ``n`` (the next one) shows a node's own
picture, which the front door reads with its key for the node (``state_path``); ``0`` or
Escape goes back to the fleet. A state or a failure is told with the node it was asked
for, so an answer that arrives after a switch is not drawn under the wrong name. A node's
engines are the node's: the engine keys act on the steward top watches, in its own view only.
"""

from __future__ import annotations

import enum
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from supervisor.scheduler.types import EngineAction
from supervisor.top.client import STATE_PATH
from supervisor.top.keys import DOWN, ESCAPE, UP
from supervisor.top.view import NODE_KEYS, Frame, Screen

EVENTS_KEPT = 500  # more than the tallest pane shows
LOG_KEPT = 500  # lines of the followed engine's output: more than the tallest pane shows
_SELECT = {UP: -1, "k": -1, DOWN: 1, "j": 1}
_UNLOAD, _PIN, _FOLLOW, _SPACE = "u", "p", "f", " "


class LogPane(enum.Enum):
    OPEN = "open"  # follow the engine's output
    CLOSE = "close"


@attrs.frozen
class Ask:
    """Something only steward can do, asked with a key: an action on an engine, or its output followed."""

    engine: str
    action: EngineAction | LogPane


class Key(enum.Enum):
    QUIT = "q"
    PAUSE = "p"
    EVENTS = "e"  # the events alone; again: back to the overview
    NEXT_NODE = "n"  # a front door's next node's own view (after the last: the fleet)
    FLEET = "0"  # back to the front door's own view
    ESCAPE = ESCAPE  # the same


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
    selected: str | None = None  # an engine's name: what u, p and f act on
    following: str | None = None  # the engine whose output the log pane shows
    log: list[str] = attrs.Factory(list)  # its last lines, newest last
    said: str | None = None  # how the last ask went (a refusal, a missing key), one line
    asks: list[Ask] = attrs.Factory(list)  # for the live loop to send, oldest first
    history: tuple[Mapping[str, Any], ...] = ()  # the steward's samples of the last hour, oldest first

    def frame(self) -> Frame:
        mine = {"screen": self.screen, "selected": self.selected, "following": self.following,
                "log": tuple(self.log), "said": self.said, "history": self.history}
        if self.held is not None:
            return attrs.evolve(self.held, **mine)
        if self.focus is not None:
            return self._node_frame(self.focus)
        return Frame(self.url, self.state, tuple(self.events), paused=False, problem=self.problem, **mine)

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

    def saw_history(self, samples: list[Mapping[str, Any]]) -> None:
        self.history = tuple(samples)

    def saw_event(self, record: Mapping[str, Any]) -> None:
        self.events = merge_events(self.events, [record])

    def failed(self, problem: str, node: str | None = None) -> None:
        if node is None:
            self.problem = problem
        elif self.focus is not None and self.focus.name == node:
            self.focus = attrs.evolve(self.focus, problem=problem)

    def saw_log_line(self, engine: str, line: str) -> None:
        if engine == self.following:
            self.log.append(line)
            del self.log[:-LOG_KEPT]

    def say(self, line: str) -> None:
        self.said = line

    def press(self, char: str) -> bool:
        """Act on a key (a character, or UP, DOWN, ESCAPE); False once it asks to quit. Other
        keys do nothing."""
        if self.following is not None:  # the log pane: q and Escape go back, the rest waits
            if char in ("q", ESCAPE):
                self.asks.append(Ask(self.following, LogPane.CLOSE))
                self.following, self.log = None, []
            return True
        if char in NODE_KEYS:
            self._show_node(NODE_KEYS.index(char))
            return True
        if self.focus is None and char in _SELECT:
            self._select(_SELECT[char])
            return True
        if char == _SPACE:
            char = Key.PAUSE.value
        elif self.focus is None and self.selected is not None and char in (_UNLOAD, _PIN, _FOLLOW):
            self._ask(self.selected, char)
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

    def _select(self, step: int) -> None:
        """The next engine up or down (the first down, or the last up, when none is)."""
        names = self._engine_names()
        if not names:
            self.selected = None
            return
        if self.selected not in names:
            self.selected = names[0] if step > 0 else names[-1]
        else:
            self.selected = names[max(0, min(len(names) - 1, names.index(self.selected) + step))]

    def _ask(self, engine: str, char: str) -> None:
        if char == _FOLLOW:
            self.following, self.log, self.said = engine, [], None
            self.asks.append(Ask(engine, LogPane.OPEN))
            return
        if char == _UNLOAD:
            action = EngineAction.UNLOAD
        else:
            pinned = any(e.get("pinned") for e in self._engines() if e.get("name") == engine)
            action = EngineAction.UNPIN if pinned else EngineAction.PIN
        self.said = f"{action.value} {engine}: asked"
        self.asks.append(Ask(engine, action))

    def _engines(self) -> list[Mapping[str, Any]]:
        engines = self.state.get("engines") if self.state is not None else None
        return [e for e in engines if isinstance(e, Mapping)] if isinstance(engines, list) else []

    def _engine_names(self) -> list[str]:
        return [name for e in self._engines() if isinstance(name := e.get("name"), str)]

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
