"""The ``/ui`` page, rendered here: HTML with inline SVG, every outside string escaped.

The live part (``render_live``) is the same HTML the first render holds; the page's script
fetches it again every few seconds from ``/ui/live`` and swaps it in, so the page is drawn
in one place (here), and works without JavaScript.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from supervisor.units import format_size

PERIODS = {"1h": 3600.0, "24h": 86400.0, "7d": 7 * 86400.0}
TIERS = ("pinned", "hot", "cold", "asleep", "freeing", "exclusive")
_WIDTH, _HEIGHT = 600, 90


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def render_page(live: str, *, period: str, locked: bool) -> str:
    """The whole page around *live*; *locked*: keys are in force and the request had no admin
    key, so the page asks for one and the script fetches the live part with it."""
    form = ('<form id="key-form"><label>Admin key <input id="key" type="password" autocomplete="off"></label>'
            '<button>Show</button></form>') if locked else ""
    periods = " ".join(f'<a href="?period={p}"{" class=chosen" if p == period else ""}>{p}</a>' for p in PERIODS)
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>steward</title>'
            f'<link rel="stylesheet" href="/ui/app.css"><script src="/ui/app.js" defer></script></head>'
            f'<body data-period="{esc(period)}"><header><h1>steward</h1>{form}<nav>usage over {periods}</nav></header>'
            f'<main id="live">{live}</main><section><h2>Events</h2><ol id="events"></ol></section></body></html>')


def render_live(state: Mapping[str, Any], history: Mapping[str, Any], usage: Mapping[str, Any],
                fleet: Sequence[Mapping[str, Any]] = ()) -> str:
    """What changes: health, devices, engines, queues, plots of the last hour, the fleet (a front
    door's nodes), usage tables."""
    health = state["health"]
    reasons = "; ".join(health["reasons"])
    return "".join([
        f'<p class="health {esc(health["status"])}">health: <b>{esc(health["status"])}</b> {esc(reasons)} '
        f'· mode {esc(state["mode"])}</p>',
        "<section><h2>Memory</h2>", *(_device_bar(d) for d in state["devices"]), "</section>",
        '<section class="wide"><h2>Last hour</h2>', _plots(history["samples"]), "</section>",
        "<section><h2>Engines</h2>", _engines(state["engines"]), "</section>",
        "<section><h2>Queues</h2>", _classes(state["classes"]), _waiting(state["waiting"]), "</section>",
        *(("<section><h2>Fleet</h2>", _table(("node", "availability", "serves"),
                                             ((n["name"], n["availability"], ", ".join(n["serves"])) for n in fleet),
                                             "fleet"), "</section>") if fleet else ()),
        "<section><h2>Recent events</h2>", _recent(state["events"]), "</section>",
        "<section><h2>Usage</h2>", *(_usage(by, report) for by, report in usage.items()), "</section>",
    ])


def _device_bar(device: Mapping[str, Any]) -> str:
    """One bar per device: each tier's memory, what others use, and what is free, to scale."""
    budget = max(1, device["budget"] + device["outside"])
    parts = [*((tier, device["tiers"].get(tier, 0)) for tier in TIERS), ("outside", device["outside"]),
             ("free", max(0, device["free"]))]
    x, rects, legend = 0.0, [], []
    for name, nbytes in parts:
        width = _WIDTH * nbytes / budget
        if width > 0:
            rects.append(f'<rect class="{name}" x="{x:.1f}" y="0" width="{width:.1f}" height="20">'
                         f'<title>{name} {format_size(nbytes)}</title></rect>')
            legend.append(f'<span class="key {name}">{name} {format_size(nbytes)}</span>')
        x += width
    return (f'<div class="device"><b>{esc(device["device"])}</b> budget {format_size(device["budget"])}'
            f'<svg class="bar" viewBox="0 0 {_WIDTH} 20" width="{_WIDTH}" height="20">{"".join(rects)}</svg>'
            f'<div>{" ".join(legend)}</div></div>')


def _table(head: Sequence[str], rows: Iterable[Sequence[Any]], cls: str = "") -> str:
    header = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table>'


def _engines(engines: Sequence[Mapping[str, Any]]) -> str:
    return _table(("engine", "status", "running", "queued", "memory", "devices", "pinned", "hot", "idle"),
                  ((e["name"], e["status"] + (" draining" if e["draining"] else ""), f'{e["in_flight"]}/{e["slots"]}',
                    e["queued"], format_size(e["memory"]), ", ".join(e["devices"]), "yes" if e["pinned"] else "",
                    "yes" if e["hot"] else "", "" if e["idle_s"] is None else f'{e["idle_s"]:.0f}s')
                   for e in engines), "engines")


def _classes(classes: Mapping[str, Mapping[str, Any]]) -> str:
    return _table(("class", "queued", "running", "oldest wait"),
                  ((name, c["queued"], c["running"], "" if c["oldest_wait_s"] is None else f'{c["oldest_wait_s"]:.1f}s')
                   for name, c in classes.items()), "classes")


def _waiting(lines: Sequence[Mapping[str, Any]]) -> str:
    if not lines:
        return '<p class="quiet">nothing waits</p>'
    return _table(("class", "model", "waiting", "waited", "why"),
                  ((w["class"], w["model"], w["waiting"], f'{w["waited_s"]:.1f}s', w["why"] or w["reason"])
                   for w in lines), "waiting")


def _recent(events: Sequence[Mapping[str, Any]]) -> str:
    rows = reversed(events[-10:])
    return _table(("time", "level", "event", "details"),
                  ((e.get("ts", ""), e.get("level", ""), e.get("event", ""), _details(e)) for e in rows), "recent")


def _details(event: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in event.items() if k not in ("ts", "level", "event", "mono"))


def _plots(samples: Sequence[Mapping[str, Any]]) -> str:
    if not samples:
        return '<p class="quiet">the first sample comes 10 s after start</p>'
    devices = sorted({name for s in samples for name in s["devices"]})
    classes = sorted({name for s in samples for name in s["queued"]})
    memory = {name: [sum(s["devices"].get(name, {}).values()) for s in samples] for name in devices}
    queued = {name: [s["queued"].get(name, 0) for s in samples] for name in classes}
    return "".join([
        _plot("memory used", memory, format_size), _plot("queued", queued, str),
        _plot("tokens/s", {"tokens/s": [s["tokens_per_s"] for s in samples]}, lambda v: f"{v:.1f}"),
        _plot("rejections", {"rejected": [s["rejected"] for s in samples]}, str)])


def _plot(title: str, series: Mapping[str, Sequence[float]], show: Any) -> str:
    """A small line plot over the hour: one line per series, the top value labelled."""
    top = max([1.0, *(v for values in series.values() for v in values)])
    lines = []
    for index, (name, values) in enumerate(series.items()):
        step = _WIDTH / max(1, len(values) - 1)
        points = " ".join(f"{i * step:.1f},{_HEIGHT - _HEIGHT * v / top:.1f}" for i, v in enumerate(values))
        lines.append(f'<polyline class="line{index % 4}" points="{points}"><title>{esc(name)}</title></polyline>')
    names = " ".join(f'<span class="key line{i % 4}">{esc(name)}</span>' for i, name in enumerate(series))
    return (f'<figure><figcaption>{esc(title)} (max {esc(show(top))}) {names}</figcaption>'
            f'<svg class="plot" viewBox="0 0 {_WIDTH} {_HEIGHT}" preserveAspectRatio="none">'
            f'{"".join(lines)}</svg></figure>')


def _usage(by: str, report: Mapping[str, Any]) -> str:
    if "error" in report:
        return f'<p class="quiet">usage per {esc(by)}: {esc(report["error"])}</p>'
    return f"<h3>per {esc(by)}</h3>" + _table(
        (by, "requests", "rejected", "waited", "prompt tok", "compl tok"),
        ((g["group"] if g["group"] is not None else "-", g["requests"], g["rejected"], g["waited"], g["prompt_tokens"],
          g["completion_tokens"]) for g in report["groups"]), "usage")
