"""The requests of ``steward ps``, ``steward load|unload|pin|unpin`` and ``steward logs``, and
the wait for an action to be done. Refusals, an unknown engine and an unreachable steward are
top's typed errors (top/client.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import attrs
import httpx
import trio

from supervisor.scheduler.types import EngineAction, EngineStatus
from supervisor.top.client import (Unreachable, check_answer, error_message, fetch_state, follow_stream,
                                   open_admin_client, unreachable)

POLL_S = 0.2  # how often the state is read while a load or an unload is under way


class ActionNotDone(Exception):
    """Steward would not do the action (no such engine, or its rules say no now), the engine
    failed, or it was not done in time: a sentence that says which."""


@attrs.frozen
class ActionDone:
    engine: dict[str, Any]  # the engine's row of the state once done (or of the action's answer)
    took_s: float


async def engines_state(url: str, key: str | None) -> dict[str, Any]:
    async with open_admin_client(key) as client:
        return await fetch_state(client, url, command="ps")


async def act(url: str, key: str | None, name: str, action: EngineAction, done_at: frozenset[EngineStatus],
              wait_s: float) -> ActionDone:
    """POST the action; then, unless *done_at* is empty (done once accepted), read the state
    until the engine is in one of *done_at* (ActionNotDone if refused, failed or not done in *wait_s*)."""
    started = trio.current_time()
    async with open_admin_client(key) as client:
        path = f"/admin/engines/{name}/{action.value}"
        try:
            response = await client.post(url + path)
        except httpx.HTTPError as exc:
            raise Unreachable(unreachable(url, exc)) from None
        if response.status_code in (404, 409):
            raise ActionNotDone(error_message(response))
        check_answer(response, url, has_key="authorization" in client.headers, command=action.value)
        engine: dict[str, Any] = response.json()
        state: dict[str, Any] = {}
        with trio.move_on_after(wait_s):
            while done_at and engine["status"] not in done_at:
                if engine["status"] == EngineStatus.FAILED:
                    raise ActionNotDone(f"{name} failed to start: {_crash(state, name)}")
                await trio.sleep(POLL_S)
                state = await fetch_state(client, url, command=action.value)
                found = [e for e in state["engines"] if e["name"] == name]
                if not found:
                    raise ActionNotDone(f"{name} is no longer in steward's config (a reload removed it)")
                engine = found[0]
            return ActionDone(engine, trio.current_time() - started)
    raise ActionNotDone(f"{name} is still {engine['status']} after {wait_s:g}s; `steward ps` shows how it goes on")


def _crash(state: dict[str, Any], name: str) -> str:
    """Why *name* failed, as its last ``crash`` event in the state says (its exit and last output)."""
    crashes = [e for e in state.get("events", []) if e.get("event") == "crash" and e.get("engine") == name]
    return str(crashes[-1].get("detail")) if crashes else "steward's log says why (its `crash` event)"


def logs_path(name: str, lines: int, *, follow: bool = False) -> str:
    return f"/admin/engines/{quote(name, safe='')}/logs?lines={lines}" + ("&follow=1" if follow else "")


async def engine_logs(url: str, key: str | None, name: str, lines: int) -> list[str]:
    """The last *lines* lines of *name*'s output (NotFound if steward has no such engine)."""
    async with open_admin_client(key) as client:
        try:
            response = await client.get(url + logs_path(name, lines))
        except httpx.HTTPError as exc:
            raise Unreachable(unreachable(url, exc)) from None
        check_answer(response, url, has_key="authorization" in client.headers, command="logs")
        return [str(line.get("line", "")) for line in response.json().get("lines", [])]


async def follow_engine_logs(url: str, key: str | None, name: str, lines: int, on_line: Callable[[str], None]) -> None:
    """*on_line* with the last *lines* lines of *name*'s output, then each new one, until steward
    ends the stream (a line says how many a slow reader lost)."""

    def told(data: str) -> None:
        record = json.loads(data)
        if "line" in record:
            on_line(str(record["line"]))
        elif record.get("dropped"):
            on_line(f"[steward: {record['dropped']} lines dropped: this reader fell behind]")

    async with open_admin_client(key) as client:
        await follow_stream(client, url, logs_path(name, lines, follow=True), told, command="logs")
