"""The routes of the ``/ui`` page on the OpenAI listener.

``/ui`` with no keys in force (a loopback steward) is the whole page, drawn here; with keys,
a browser cannot send one on navigation, so ``/ui`` is the page's shell with a key form, and
its script fetches ``/ui/live`` (an admin route, like ``/admin/state``) with the admin key the
user typed, kept in sessionStorage. ``/ui/app.js`` and ``/ui/app.css`` hold no data either.
"""

from __future__ import annotations

import importlib.resources
import time
from collections.abc import Callable
from typing import Any

import trio
from quart import Response, request
from quart_trio import QuartTrio

from supervisor.gateway.door import UI_LIVE_PATH, UI_PATH, FrontDoor
from supervisor.gateway.ui.page import PERIODS, render_live, render_page
from supervisor.observe.history import History
from supervisor.units import format_elapsed
from supervisor.usage.report import Grouping, UsageReadError, read_usage, report_json

# Same origin only: the page's own script and style, no inline script, never in a frame.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; "
                               "form-action 'self'",
    "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store"}
_ASSETS = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}


def add_ui_routes(app: QuartTrio, state: Callable[[], dict[str, Any]], history: History | None, door: FrontDoor,
                  usage_db: str | None) -> None:

    def period() -> str:
        chosen = request.args.get("period", "1h")
        return chosen if chosen in PERIODS else "1h"

    async def live(chosen: str) -> str:
        usage = await trio.to_thread.run_sync(_usage, usage_db, PERIODS[chosen], time.time())
        current = state()
        return render_live(current, (history or History()).to_json(), usage, _fleet(current))

    @app.get(UI_PATH)
    async def ui_page() -> Response:
        chosen = period()
        locked = door.required("openai")
        page = render_page("" if locked else await live(chosen), period=chosen, locked=locked)
        return _answer(page, "text/html; charset=utf-8")

    @app.get(UI_LIVE_PATH)
    async def ui_live() -> Response:
        return _answer(await live(period()), "text/html; charset=utf-8")

    @app.get(UI_PATH + "/<name>")
    async def ui_asset(name: str) -> Response:
        if name not in _ASSETS:
            return _answer("not found", "text/plain; charset=utf-8", 404)
        text = importlib.resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
        return _answer(text, _ASSETS[name])


def _fleet(state: dict[str, Any]) -> list[dict[str, Any]]:
    """A front door's nodes as the admin state has them (nodes/fleet.py): each one's state and for
    how long, its last poll, what it serves and the requests held for it."""
    rows = []
    for node in state.get("nodes") or ():
        poll = node.get("last_poll") or {}
        said = f"{node.get('state')} for {format_elapsed(node.get('for_s') or 0.0)}"
        if poll:
            said += f", polled {format_elapsed(poll.get('age_s') or 0.0)} ago" + ("" if poll.get("answered") else
                                                                                 " (no answer)")
        if node.get("held"):
            said += f", {node['held']} held for it"
        rows.append({"name": node.get("name"), "availability": said, "serves": list(node.get("serves") or ())})
    return rows


def _answer(body: str, content_type: str, status: int = 200) -> Response:
    return Response(body, status=status, content_type=content_type, headers=SECURITY_HEADERS)


def _usage(db: str | None, since_s: float, now: float) -> dict[str, dict[str, Any]]:
    """The usage log per key and per model over the period (what `steward usage` reads), or why not."""
    if db is None:
        return {by.value: {"error": "no usage log (usage.db is null)"} for by in (Grouping.KEY, Grouping.MODEL)}
    reports: dict[str, dict[str, Any]] = {}
    for by in (Grouping.KEY, Grouping.MODEL):
        try:
            reports[by.value] = report_json(read_usage(db, by=by, since_s=since_s, now=now))
        except UsageReadError as exc:
            reports[by.value] = {"error": str(exc)}
    return reports
