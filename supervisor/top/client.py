"""The HTTP edge of ``steward top``: the state, the event stream, and what can go wrong.

Every failure is one of two typed errors with a sentence for the screen: ``AdminRefused``
(401/403: the key is missing, unknown, or not an admin key; top gives up) and
``Unreachable`` (anything else: steward is down, restarting, or answers something that is
not its state; top says so and tries again).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx

STATE_PATH = "/admin/state"
EVENTS_PATH = "/admin/events"
HISTORY_PATH = "/admin/history"
_TIMEOUT_S = 5.0
# /admin/events sends a keep-alive comment every 15 s: a stream silent for longer is dead.
_STREAM_READ_S = 45.0


class AdminRefused(Exception):
    """Steward refused the admin API to this key (401, 403)."""


class Unreachable(Exception):
    """No usable answer from steward (yet)."""


class NotFound(Unreachable):
    """Steward says no such thing (404 in its error shape): an engine not in its config."""


def admin_url(text: str) -> str:
    """``127.0.0.1:8080``, ``http://host:8080/`` or the OpenAI base URL ``.../v1`` -> the
    steward's root URL; ValueError with a sentence for anything else."""
    raw = text.strip()
    candidate = raw if "://" in raw else f"http://{raw}"
    try:
        url = httpx.URL(candidate)
    except httpx.InvalidURL as exc:
        raise ValueError(f"{raw!r} is not a URL: {exc}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"{raw!r} is not steward's address: give http://HOST:PORT")
    path = url.path.rstrip("/").removesuffix("/v1")
    return str(url.copy_with(path=path or "/", query=None, fragment=None)).rstrip("/")


def open_admin_client(key: str | None) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.AsyncClient(headers=headers, timeout=_TIMEOUT_S, trust_env=False)


async def fetch_state(client: httpx.AsyncClient, url: str, command: str = "top",
                      path: str = STATE_PATH) -> dict[str, Any]:
    """``GET /admin/state`` (or a front door's node's, at *path*) for ``steward COMMAND``: the
    state, or AdminRefused/Unreachable."""
    try:
        response = await client.get(url + path)
    except httpx.HTTPError as exc:
        raise Unreachable(unreachable(url, exc)) from None
    check_answer(response, url, has_key="authorization" in client.headers, command=command)
    try:
        state = response.json()
    except ValueError:
        state = None
    if not isinstance(state, dict) or "engines" not in state:
        raise Unreachable(f"{url}{path} answered something that is not steward's state")
    return state


async def fetch_history(client: httpx.AsyncClient, url: str) -> list[dict[str, Any]]:
    """``GET /admin/history``: the last hour's samples, oldest first; Unreachable (or NotFound
    from a steward that keeps none) when they cannot be had, AdminRefused as the state's."""
    try:
        response = await client.get(url + HISTORY_PATH)
    except httpx.HTTPError as exc:
        raise Unreachable(unreachable(url, exc)) from None
    check_answer(response, url, has_key="authorization" in client.headers)
    try:
        samples = response.json().get("samples")
    except (ValueError, AttributeError):
        samples = None
    if not isinstance(samples, list):
        raise Unreachable(f"{url}{HISTORY_PATH} answered something that is not steward's history")
    return [sample for sample in samples if isinstance(sample, dict)]


async def follow_events(client: httpx.AsyncClient, url: str, on_event: Callable[[dict[str, Any]], None]) -> None:
    """Call *on_event* with each event as steward emits it, until the stream ends (steward
    stops); Unreachable if it cannot be had or breaks."""
    await follow_stream(client, url, EVENTS_PATH, lambda data: on_event(_record(data)))


async def follow_stream(client: httpx.AsyncClient, url: str, path: str, on_data: Callable[[str], None],
                        command: str = "top") -> None:
    """Call *on_data* with each SSE ``data:`` of *path* (an admin stream), until it ends;
    NotFound (404), AdminRefused or Unreachable if it cannot be had or breaks."""
    timeout = httpx.Timeout(_TIMEOUT_S, read=_STREAM_READ_S)
    try:
        async with client.stream("GET", url + path, timeout=timeout) as response:
            if response.status_code != 200:
                await response.aread()
            check_answer(response, url, has_key="authorization" in client.headers, command=command)
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    on_data(line[6:])
    except httpx.HTTPError as exc:
        raise Unreachable(unreachable(url, exc)) from None


def _record(data: str) -> dict[str, Any]:
    try:
        record = json.loads(data)
    except ValueError:
        record = None
    if not isinstance(record, dict):
        record = {"event": "unreadable_event", "level": "warning", "data": data[:200]}
    if "ts" not in record:  # steward's own notes in the stream (events_dropped) carry no time
        record = {"ts": time.time(), "level": "warning", **record}
    return record


def check_answer(response: httpx.Response, url: str, *, has_key: bool, command: str = "top") -> None:
    """AdminRefused for 401/403 (with what to do, for *command*), NotFound for steward's 404, Unreachable for any
    other answer but 200."""
    if response.status_code in (401, 403):
        said = error_message(response)
        raise AdminRefused(f"{url} refused the admin API ({response.status_code}): "
                           f"{refusal_hint(response.status_code, has_key=has_key, command=command)}" +
                           (f" (steward says: {said})" if said else ""))
    if response.status_code == 404 and response.headers.get("content-type", "").startswith("application/json"):
        raise NotFound(error_message(response))  # steward's own answer: no such engine (not a wrong URL's 404)
    if response.status_code != 200:
        said = error_message(response)
        raise Unreachable(f"{url}{response.url.path} answered {response.status_code}" + (f": {said}" if said else ""))


def refusal_hint(status: int, *, has_key: bool, command: str) -> str:
    """What to do when the admin API answers *status* (401 or 403) to ``steward COMMAND``."""
    if status == 403:
        return f"{command} needs an admin key: make one with `steward keys add NAME --admin --config CONFIG`"
    if has_key:
        return "the key given (--key or $STEWARD_KEY) is not one steward knows"
    return "steward has API keys: pass --key or set STEWARD_KEY (an admin key)"


def error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
        return str(body["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200].strip()


def unreachable(url: str, exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.TimeoutException):
        reason = "no answer in time"
    elif isinstance(exc, httpx.ConnectError):
        reason = "nothing answers there (is steward running?)"
    else:
        reason = str(exc) or type(exc).__name__
    return f"cannot reach steward at {url}: {reason}"
