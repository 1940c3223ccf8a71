"""The picture ``steward top`` draws: a pure function of one ``Frame`` and the pane's size.

The input is ``/admin/state``'s document as it came (see ``supervisor.gateway.admin``), read
defensively: a field that is missing or of another type shows as ``-``, never as a
traceback, so a newer or older steward still draws. Every line is one line: text is cut with
an ellipsis at the pane's edge instead of wrapped, except the reason a queue waits, which is
the point of the view and gets up to two lines (one when the pane is short).

The rows are shared out by priority, since a pane of 24 lines cannot hold everything: the
header, a front door's nodes, the memory bars, the queues and why they wait (the requests a
front door holds for a node among them), the engines, the rejections, and the events get what
is left. A front door with no engines of its own shows no memory bar of its own (its budget
would read as free memory nobody can use): its memory is its nodes'. A node's own view is the
same picture of the node's state, its name in the header. From ``WIDE`` columns on, the room is used for more: every tier in
the legends, the planned and measured memory of each engine, how long an engine stays hot.
"""

from __future__ import annotations

import enum
import math
import textwrap
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from supervisor.observe.events import RECORD_KEYS, Event
from supervisor.request_class import RequestClass
from supervisor.observe.slowdown import format_factor
from supervisor.top.sparkline import sparkline
from supervisor.units import format_age, format_elapsed, format_size

WIDE = 120  # columns from which the wider layout is used
_BAR_MAX = 100  # a bar wider than this reads no better
_WHY_LINES = 2
_REJECTIONS_MAX = 3  # on the overview; the events screen has them all
_LEADING = ("engine", "model", "class", "reason")
_LEVEL_STYLES = {"warning": "yellow", "error": "bold red"}
_HEALTH_STYLES = {"ok": "green", "degraded": "yellow"}
_NODE_STYLES = {"awake": "green", "waking": "yellow", "asleep": "cyan", "down": "bold red"}
NODE_KEYS = "123456789"  # the key of each node, in the config's order


class Screen(enum.Enum):
    OVERVIEW = "overview"
    EVENTS = "events"  # the events alone, the whole pane


@attrs.frozen
class Frame:
    """Everything one picture shows."""

    url: str
    state: Mapping[str, Any] | None = None  # /admin/state's document; None before the first answer
    events: Sequence[Mapping[str, Any]] = ()  # event records as /admin/events sends them, newest last
    screen: Screen = Screen.OVERVIEW
    paused: bool = False
    problem: str | None = None  # why the picture may be old: steward cannot be reached, say
    node: str | None = None  # a front door's node whose own picture this is; None: the front door's
    selected: str | None = None  # the engine the keys u, p and f act on
    following: str | None = None  # an engine whose output fills the pane (its last lines: log)
    log: Sequence[str] = ()
    said: str | None = None  # how the last action asked with a key went
    history: Sequence[Mapping[str, Any]] = ()  # /admin/history's samples, oldest first (the sparklines)


@attrs.frozen
class Tier:
    key: str  # its name in the state's ``tiers`` (``outside`` and ``free`` are the device's own)
    label: str
    glyph: str  # a different character per tier: the bar still reads in a capture without colours
    style: str


TIERS = (
    Tier("pinned", "pinned", "█", "magenta"),
    Tier("hot", "hot", "▓", "red"),
    Tier("cold", "cold", "▒", "blue"),
    Tier("asleep", "asleep", "░", "cyan"),
    Tier("freeing", "being freed", "▞", "yellow"),
    Tier("exclusive", "exclusive", "▚", "green"),
    Tier("outside", "outside steward", "▄", "grey50"),
    Tier("free", "free", "·", "grey39"),
)


def render_frame(frame: Frame, *, width: int, height: int) -> RenderableType:
    """The picture for a pane of *width* x *height* cells: never more lines than *height*."""
    width, height = max(width, 20), max(height, 1)
    state = frame.state if isinstance(frame.state, Mapping) else None
    header, keys_shown = _header(frame, state, width)
    lines: list[RenderableType] = [header]
    if frame.problem:
        lines.append(_line(frame.problem, "bold red"))
    if frame.said:
        lines.append(_line(frame.said, "yellow"))
    if frame.following is not None:
        body = _log_pane(frame.following, frame.log, height - len(lines))
    elif state is None:
        if not frame.problem:
            lines.append(_line("waiting for steward's first answer", "dim"))
        body = _event_block(frame.events, height - len(lines), title=frame.screen is Screen.OVERVIEW)
    elif frame.screen is Screen.EVENTS:
        body = _event_block(frame.events, height - len(lines), title=False)
    else:
        if reasons := _list(_get(state, "health"), "reasons"):
            lines.append(_line(f"health: {'; '.join(map(_text, reasons))}", "yellow"))
        hint = None if keys_shown else _keys(frame)  # a narrow pane: the keys go on the events' title
        body = _overview(state, frame.events, width, height - len(lines), hint, frame.selected, frame.history)
    return Group(*lines[:height], *body)


def split_bar(sizes: Sequence[int], width: int) -> list[int]:
    """Cells of a *width*-cell bar for each of *sizes*, in proportion (largest remainders),
    every size above zero getting at least one cell while there are cells to give."""
    sizes = [max(0, size) for size in sizes]
    total = sum(sizes)
    if total == 0 or width <= 0:
        return [0] * len(sizes)
    exact = [size * width / total for size in sizes]
    cells = [math.floor(x) for x in exact]
    for index in sorted(range(len(sizes)), key=lambda i: exact[i] - cells[i], reverse=True)[:width - sum(cells)]:
        cells[index] += 1
    for index, size in enumerate(sizes):
        if size and not cells[index]:
            donor = max(range(len(cells)), key=lambda i: cells[i])
            if cells[donor] > 1:
                cells[donor] -= 1
                cells[index] = 1
    return cells


# --- the overview ----------------------------------------------------------------------------

def _log_pane(engine: str, log: Sequence[str], room: int) -> list[RenderableType]:
    """The followed engine's output, its newest lines at the bottom (made safe by steward)."""
    title = Text.assemble((f"OUTPUT OF {engine}", "bold"), ("  Esc/q back", "dim"), no_wrap=True, overflow="ellipsis")
    if room < 1:
        return []
    lines = [_line(line) for line in log] or [_line("(no output yet)", "dim")]
    return [title, *lines[-(room - 1):]] if room > 1 else [title]


def _overview(state: Mapping[str, Any], events: Sequence[Mapping[str, Any]], width: int, room: int,
              hint: Text | None, selected: str | None = None,
              history: Sequence[Mapping[str, Any]] = ()) -> list[RenderableType]:
    wide = width >= WIDE
    nodes = _nodes(_list(state, "nodes"), width, room)
    room -= _height(nodes)
    # A front door with no engines of its own: its own budget is no memory anyone can use.
    local = _list(state, "devices") if _list(state, "engines") or not nodes else []
    devices = _devices(local, width, wide)[:max(room, 0)]
    room -= len(devices)
    sparks = history_lines(history, _budget(local), width) if local and room > 8 else []
    room -= len(sparks)
    queues = _queues(state, width, room)
    room -= len(queues)
    engines = _engines(_list(state, "engines"), _number(state.get("time")), width, wide, room, selected)
    room -= _height(engines)
    clouds = _clouds(_list(state, "remote"), width, room)
    room -= _height(clouds)
    videos = _videos(_list(state, "videos"), width, room)
    room -= _height(videos)
    rejections = _titled("REJECTED", [_event_line(r) for r in _list(state, "rejections")],
                         min(room, _REJECTIONS_MAX + 1))
    room -= len(rejections)
    return (nodes + devices + sparks + engines + clouds + videos + queues + rejections
            + _event_block(events, room, title=True, width=width, hint=hint))


# What steward holds on a device in a history sample: every tier but the device's own.
_HELD_TIERS = ("pinned", "hot", "cold", "asleep", "freeing", "exclusive")


def history_lines(samples: Sequence[Mapping[str, Any]], budget: int, width: int) -> list[RenderableType]:
    """One line of sparklines over the last samples that fit (one each 10 s): the memory steward
    holds (scaled to the devices' budget), the steps queued, tokens per second out. None
    before two samples: a line of one block says nothing."""
    samples = [s for s in samples if isinstance(s, Mapping)]
    if len(samples) < 2:
        return []
    span = max(4, (width - 60) // 3)
    shown = samples[-span:]
    held = [float(sum(_size(tiers.get(tier)) for tiers in _get(s, "devices").values() if isinstance(tiers, Mapping)
                      for tier in _HELD_TIERS)) for s in shown]
    queued = [float(sum(n for n in _get(s, "queued").values() if isinstance(n, int | float))) for s in shown]
    tokens = [_number(s.get("tokens_per_s")) for s in shown]
    minutes = format_elapsed(len(shown) * 10.0)
    line = Text(f"last {minutes}", style="dim", no_wrap=True, overflow="ellipsis")
    for label, values, ceiling, said in (
            ("  memory ", held, float(budget) if budget else None, format_size(int(held[-1]))),
            ("  queued ", queued, None, f"{queued[-1]:.0f}"),
            ("  tokens/s ", tokens, None, "-" if tokens[-1] is None else f"{tokens[-1]:.0f}")):
        line.append(label, "dim")
        line.append(sparkline(values, span, ceiling=ceiling), "cyan")
        line.append(f" {said}")
    return [line]


def _budget(devices: list[Any]) -> int:
    return sum(_size(d.get("budget")) for d in devices if isinstance(d, Mapping))


def _header(frame: Frame, state: Mapping[str, Any] | None, width: int) -> tuple[Text, bool]:
    """Where, when and how steward is, and PAUSED; the keys while there is room for them (the
    second value says whether there was: on the overview they may go on the events' title)."""
    left = Text.assemble(("steward ", "bold"), (frame.url.removeprefix("http://"), "bold cyan"))
    if frame.node is not None:
        left.append(f" › node {_text(frame.node)}", "bold magenta")
    if state is not None:
        if (moment := _number(state.get("time"))) is not None:
            left.append(f"  {_clock(moment)}")
        status = _text(_get(state, "health").get("status", "?"))
        left.append(f"  mode {_text(state.get('mode', '?'))}  ")
        left.append(f"health {status}", _HEALTH_STYLES.get(status, "bold red"))
    paused = Text.assemble(("PAUSED", "bold reverse yellow"), "  ") if frame.paused else Text("")
    keys = _keys(frame)
    fits = left.cell_len + paused.cell_len + keys.cell_len + 2 <= width
    right = Text.assemble(paused, keys) if fits or frame.screen is Screen.EVENTS else paused
    left.truncate(max(0, width - right.cell_len - 2), overflow="ellipsis")
    return Text.assemble(left, " " * max(1, width - left.cell_len - right.cell_len), right, no_wrap=True,
                         overflow="ellipsis"), fits


def _keys(frame: Frame) -> Text:
    if frame.following is not None:
        return Text("Esc/q back", "dim")
    state = frame.state if isinstance(frame.state, Mapping) else {}
    nodes = "0 fleet  n next  " if frame.node is not None else "1-9 node  " if _list(state, "nodes") else ""
    pause = f"{'space' if frame.selected else 'p'} {'resume' if frame.paused else 'pause'}"
    if frame.node is not None:  # a node's engines are the node's: no engine keys here
        chosen = ""
    elif frame.selected:
        chosen = "u unload  p pin/unpin  f follow  "
    else:  # once there is an engine to select
        chosen = "j/k select  " if _list(state, "engines") else ""
    return Text(f"{nodes}{chosen}{pause}  e {'back' if frame.screen is Screen.EVENTS else 'events'}  q quit", "dim")


def _devices(devices: list[Any], width: int, wide: bool) -> list[RenderableType]:
    """Two lines a device: its memory as a bar by tier, then the legend with the sizes. The bars
    of all devices are one length, so they compare at a glance."""
    devices = [device for device in devices if isinstance(device, Mapping)]
    labels = [_text(device.get("device", "?")) for device in devices]
    sizes = [[_size(d.get(t.key) if t.key in ("outside", "free") else _get(d, "tiers").get(t.key)) for t in TIERS]
             for d in devices]
    summaries = [f" {format_size(held[-1])} free of {format_size(_size(d.get('budget')))}"
                 for d, held in zip(devices, sizes, strict=True)]
    indent = max(map(len, labels), default=0) + 1
    length = min(_BAR_MAX, width - indent - max(map(len, summaries), default=0))
    lines: list[RenderableType] = []
    for label, held, summary in zip(labels, sizes, summaries, strict=True):
        bar = Text(label.ljust(indent), style="bold", no_wrap=True, overflow="ellipsis")
        for tier, count in zip(TIERS, split_bar(held, length), strict=True):
            bar.append(tier.glyph * count, tier.style)
        bar.append(summary)
        legend = Text(" " * indent, no_wrap=True, overflow="ellipsis")
        for tier, size in zip(TIERS, held, strict=True):
            if size or wide:
                legend.append(f"{tier.glyph} ", tier.style)
                legend.append(f"{tier.label} {format_size(size)}  ", "" if size else "dim")
        legend.rstrip()
        lines += [bar, legend]
    return lines


def _engines(engines: list[Any], now: float | None, width: int, wide: bool, room: int,
             selected: str | None = None) -> list[RenderableType]:
    """A row per engine (a last row says how many did not fit), the selected one in reverse.
    The other columns take what they need; the name gets the rest, cut if it must be."""
    engines = [engine for engine in engines if isinstance(engine, Mapping)]
    if room < 2 or not engines:
        return []
    right = ["SLOTS", "QUEUE", "RESERVED", *(["NEEDS", "MEASURED"] if wide else []), "IDLE", "GEN", "RESTARTS"]
    headers = ["ENGINE", "STATE", *right, "DEVICES", "HOT UNTIL"]
    shown = engines if len(engines) + 1 <= room else engines[:room - 2]
    rows = [_engine_row(engine, now, wide) for engine in shown]
    if len(shown) < len(engines):
        rows.append([Text(f"+{len(engines) - len(shown)} more", style="dim"), *(Text("") for _ in headers[1:])])
    needs = [max(len(header), *(row[i].cell_len for row in rows)) for i, header in enumerate(headers)]
    name_width = max(6, min(needs[0], width - sum(needs[1:]) - (len(headers) - 1)))
    table = Table(box=None, padding=(0, 1, 0, 0), pad_edge=False, show_edge=False, header_style="bold")
    for header in headers:
        table.add_column(header, no_wrap=True, overflow="ellipsis", justify="right" if header in right else "left",
                         **({"width": name_width} if header == "ENGINE" else {}))
    for engine, row in zip(shown, rows, strict=False):
        table.add_row(*row, style="reverse" if selected is not None and engine.get("name") == selected else None)
    for row in rows[len(shown):]:
        table.add_row(*row)
    return [table]


def _clouds(clouds: list[Any], width: int, room: int) -> list[RenderableType]:
    """The remote models (runtime: remote), a row each: their places at the cloud in use (of
    max_concurrency), the requests waiting for one, and where they go. No memory, no engine."""
    rows = [[Text(_text(cloud.get("name", "?")), style="bold"),
             Text(f"{_count(cloud.get('in_flight'))}/{_count(cloud.get('max_concurrency'))}"),
             Text(str(_count(cloud.get("waiting")))), Text(_text(cloud.get("upstream", "-")), style="dim")]
            for cloud in clouds if isinstance(cloud, Mapping)]
    return _table(["CLOUD", "PLACES", "WAITING", "UPSTREAM"], rows, width, room, right=("PLACES", "WAITING"),
                  ratio="UPSTREAM")


def _videos(videos: list[Any], width: int, room: int) -> list[RenderableType]:
    """The video jobs queued or being made (/v1/videos), a row each: its model, its state and
    how far ComfyUI is, and whose it is."""
    rows = [[Text(_text(video.get("id", "?"))), Text(_text(video.get("model", "?")), style="bold"),
             Text(_text(video.get("status", "?"))), Text(f"{_count(video.get('progress'))}%"),
             Text(_text(video.get("owner") or "-"), style="dim")]
            for video in videos if isinstance(video, Mapping)]
    return _table(["VIDEO JOB", "MODEL", "STATE", "DONE", "KEY"], rows, width, room, right=("DONE",), ratio="KEY")


def _table(headers: list[str], rows: list[list[Text]], width: int, room: int, *, right: tuple[str, ...],
           ratio: str) -> list[RenderableType]:
    """A table of *rows* under *headers* in *room* lines (a last row says how many did not fit);
    *right*: the columns set right; *ratio*: the one that takes the width left."""
    if room < 2 or not rows:
        return []
    shown = rows if len(rows) + 1 <= room else rows[:room - 2]
    if len(shown) < len(rows):
        shown = [*shown, [Text(f"+{len(rows) - len(shown)} more", style="dim"), *(Text("") for _ in headers[1:])]]
    table = Table(box=None, padding=(0, 1, 0, 0), pad_edge=False, show_edge=False, header_style="bold", width=width)
    for header in headers:
        table.add_column(header, no_wrap=True, overflow="ellipsis", justify="right" if header in right else "left",
                         ratio=1 if header == ratio else None)
    for row in shown:
        table.add_row(*row)
    return [table]


def _engine_row(engine: Mapping[str, Any], now: float | None, wide: bool) -> list[Text]:
    idle = _number(engine.get("idle_s"))
    cells = [Text(_text(engine.get("name", "?")), style="bold"), _engine_state(engine),
             Text(f"{_count(engine.get('in_flight'))}/{_count(engine.get('slots'))}"),
             Text(str(_count(engine.get("queued")))), Text(_size_or_dash(engine.get("reserved")))]
    if wide:
        cells += [Text(_size_or_dash(engine.get("memory"))), Text(_size_or_dash(engine.get("measured")))]
    return [*cells, Text(format_elapsed(idle) if idle is not None else "-"),
            Text(str(_count(engine.get("generation")))), Text(str(_count(engine.get("failures")))),
            Text(",".join(map(_text, _list(engine, "devices"))) or "-"), _hot_until(engine, now, wide)]


def _engine_state(engine: Mapping[str, Any]) -> Text:
    status = _text(engine.get("status", "?"))
    if engine.get("draining") and status != "draining":
        status = f"{status}, draining"
    if engine.get("healthy") is False and status == "ready":
        return Text("unhealthy", style="bold red")
    return Text(status, style={"ready": "green", "failed": "bold red", "starting": "yellow",
                               "draining": "yellow", "stopping": "yellow"}.get(status, ""))


def _hot_until(engine: Mapping[str, Any], now: float | None, wide: bool) -> Text:
    if engine.get("pinned"):
        return Text("pinned", style="magenta")
    until = _number(engine.get("hot_until"))
    if not engine.get("hot") or until is None:
        return Text("-")
    left = f" (in {format_elapsed(max(0.0, until - now))})" if wide and now is not None else ""
    return Text(_clock(until) + left, style="red")


def _nodes(nodes: list[Any], width: int, room: int) -> list[RenderableType]:
    """A front door's nodes, a row each: its key, name, state and since when, how long ago it
    was last polled (✗: no answer), its models (* resident), free memory per device, queue,
    running steps and health, the last four as the node last said them while awake."""
    nodes = [node for node in nodes if isinstance(node, Mapping)]
    if room < 2 or not nodes:
        return []
    headers = ["#", "NODE", "STATE", "POLLED", "QUEUE", "RUN", "HEALTH", "FREE", "MODELS (*loaded)"]
    shown = nodes if len(nodes) + 1 <= room else nodes[:room - 2]
    rows = [_node_row(index, node) for index, node in enumerate(shown)]
    if len(shown) < len(nodes):
        rows.append([Text(""), Text(f"+{len(nodes) - len(shown)} more", style="dim"), *(Text("") for _ in headers[2:])])
    table = Table(box=None, padding=(0, 1, 0, 0), pad_edge=False, show_edge=False, header_style="bold", width=width)
    for header in headers:
        table.add_column(header, no_wrap=True, overflow="ellipsis", justify="right" if header in ("QUEUE", "RUN")
                         else "left", ratio=1 if header.startswith("MODELS") else None)
    for row in rows:
        table.add_row(*row)
    return [table]


def _node_row(index: int, node: Mapping[str, Any]) -> list[Text]:
    state = _text(node.get("state", "?"))
    since = _number(node.get("for_s"))
    poll = _get(node, "last_poll")
    age = _number(poll.get("age_s"))
    polled = "-" if age is None else format_age(age) + ("" if poll.get("answered") is True else " ✗")
    awake = state == "awake"
    models = [m for m in _list(node, "models") if isinstance(m, Mapping)]
    names = ([_text(m.get("name", "?")) + ("*" if m.get("resident") is True else "") for m in models] if awake
             else [_text(name) for name in _list(node, "serves")])
    free = [f"{_text(d.get('device', '?'))} {format_size(_size(d.get('free')))}"
            for d in _list(node, "devices") if isinstance(d, Mapping)] if awake else []
    queued = _get(node, "queued")
    waiting = sum(n for n in queued.values() if isinstance(n, int)) if awake else None
    health = _text(node.get("health")) if awake and node.get("health") is not None else "-"
    return [Text(NODE_KEYS[index] if index < len(NODE_KEYS) else "", style="dim"),
            Text(_text(node.get("name", "?")), style="bold"),
            Text(state + (f" {format_age(since)}" if since is not None else ""), style=_NODE_STYLES.get(state, "")),
            Text(polled, style="" if poll.get("answered") is True else "yellow"),
            Text("-" if waiting is None else str(waiting)),
            Text(str(_count(node.get("in_flight"))) if awake else "-"),
            Text(health, style=_HEALTH_STYLES.get(health, "" if health == "-" else "bold red")),
            Text(", ".join(free) or "-"), Text(", ".join(names) or "-")]


def _queues(state: Mapping[str, Any], width: int, room: int) -> list[RenderableType]:
    """A line per class, and under it the head of each of its lines and why it waits."""
    classes = _get(state, "classes")
    order = [*(klass for klass in RequestClass if klass in classes),
             *(klass for klass in classes if RequestClass.named(klass) is None)]
    waiting = [line for line in _list(state, "waiting") if isinstance(line, Mapping)]
    for why_lines in (_WHY_LINES, 1):
        lines: list[RenderableType] = []
        for klass in order:
            counts = classes[klass]
            if not isinstance(counts, Mapping):
                continue
            oldest = _number(counts.get("oldest_wait_s"))
            summary = Text(f"{_text(klass):<12}", style="bold", no_wrap=True, overflow="ellipsis")
            summary.append(f"{_count(counts.get('queued')):>4} queued {_count(counts.get('running')):>4} running")
            if isinstance(held := counts.get("held"), int) and held:
                summary.append(f" {held:>4} held for a node", "yellow")  # a front door's, waiting for a node to wake
            if (slowdown := _number(counts.get("slowdown_p50"))) is not None:
                # How many times slower than alone its answers decode (the median over the health window).
                summary.append(f"   slowdown {format_factor(slowdown)}", "bold red" if counts.get("slowed") is True
                               else "yellow" if slowdown >= 1.5 else "")
            if oldest is not None:
                summary.append(f"   oldest {format_elapsed(oldest)}", "yellow")
            lines.append(summary)
            for line in waiting:
                if line.get("class") == klass:
                    lines += _why(line, width, why_lines)
        if len(lines) <= room:
            return lines
    return lines[:max(room, 0)]


def _why(line: Mapping[str, Any], width: int, max_lines: int) -> list[RenderableType]:
    waited = _number(line.get("waited_s"))
    prefix = f"  {format_elapsed(waited) if waited is not None else '-':>6} ×{_count(line.get('waiting')):<3} "
    why = _text(line.get("why") or f"{line.get('class')} request for {line.get('model')} waits: {line.get('reason')}")
    room = max(10, width - len(prefix))
    words = textwrap.wrap(why, room, max_lines=max_lines, placeholder=" …") or [""]
    out = [Text.assemble((prefix, "yellow"), words[0], no_wrap=True, overflow="ellipsis")]
    out += [Text(" " * len(prefix) + more, no_wrap=True, overflow="ellipsis") for more in words[1:]]
    return out


# --- events ----------------------------------------------------------------------------------

def _event_block(events: Sequence[Mapping[str, Any]], room: int, *, title: bool, width: int = 0,
                 hint: Text | None = None) -> list[RenderableType]:
    shown = [_event_line(record) for record in events if isinstance(record, Mapping)]
    if not title:
        return shown[-room:] if room > 0 else []
    block = _titled("EVENTS", shown, room)
    if block and hint is not None:
        block[0] = Text.assemble(block[0], " " * max(1, width - 6 - hint.cell_len), hint, no_wrap=True,
                                 overflow="ellipsis")
    return block


def _titled(title: str, lines: list[Text], room: int) -> list[Text]:
    if room < 2 or not lines:
        return []
    return [Text(title, style="bold", no_wrap=True, overflow="ellipsis"), *lines[-(room - 1):]]


def _event_line(record: Mapping[str, Any]) -> Text:
    """The record as steward's own terminal prints it (sizes readable, long values cut), the
    fields that say what it is about first: the line is cut at the pane's edge."""
    fields = {key: record[key] for key in _LEADING if key in record}
    fields.update((key, value) for key, value in record.items() if key not in RECORD_KEYS)
    level = _text(record.get("level", "info"))
    event = Event(_text(record.get("event", "?")), level, fields, _number(record.get("ts")) or 0.0, 0.0)
    return _line(event.to_line(), _LEVEL_STYLES.get(level, ""))


# --- reading the document --------------------------------------------------------------------

def _line(text: str, style: str = "") -> Text:
    return Text(text, style=style, no_wrap=True, overflow="ellipsis")


def _height(items: list[RenderableType]) -> int:
    return sum(item.row_count + 1 if isinstance(item, Table) else 1 for item in items)


def _clock(wall: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(wall))


def _text(value: Any) -> str:
    """A value of the document as one line of text: a name or a reason with a newline in it
    would break the picture (rich drops the other control characters itself)."""
    return " ".join(str(value).split())


def _get(mapping: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = mapping.get(key)
    return value if isinstance(value, Mapping) else {}


def _list(mapping: Mapping[str, Any], key: str) -> list[Any]:
    value = mapping.get(key)
    return value if isinstance(value, list) else []


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _count(value: Any) -> int | str:
    return value if isinstance(value, int) and not isinstance(value, bool) else "-"


def _size(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _size_or_dash(value: Any) -> str:
    return format_size(value) if _size(value) else "-"
