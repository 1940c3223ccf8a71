"""llama-server's slot API, as the build steward tests against answers it (b1-0c1e570).

``GET /slots``: one object per slot; a slot that ran a task says ``n_prompt_tokens`` (its
last task's prompt, cached in it unless evicted since); a slot that never did says nothing of
its cache. ``POST /slots/{id}?action=save`` with ``{"filename": NAME}`` writes the slot's KV
cache to NAME in ``--slot-save-path`` and answers ``n_saved`` (tokens) and ``n_written``
(bytes); ``action=restore`` reads it into the slot, answering ``n_restored`` and ``n_read``.
A restored slot holds the file's tokens as its prompt, so the server's choice of slot by
prompt similarity (``--slot-prompt-similarity``) picks it for a request that continues it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    import httpx


class SlotApiError(Exception):
    """The server did not do what was asked; the message says what it answered."""


@attrs.frozen
class SlotFile:
    slot: int
    tokens: int
    nbytes: int


async def slot_tokens(http: httpx.AsyncClient, base_url: str) -> dict[int, int | None]:
    """Each slot's cached prompt tokens as /slots says them (None: it does not say)."""
    body = await _call(http, "GET", f"{base_url}/slots")
    if not isinstance(body, list):
        raise SlotApiError("/slots answered no list")
    slots: dict[int, int | None] = {}
    for slot in body:
        if isinstance(slot, dict) and isinstance(slot.get("id"), int):
            tokens = slot.get("n_prompt_tokens")
            slots[slot["id"]] = tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None
    return slots


async def props(http: httpx.AsyncClient, base_url: str) -> dict[str, Any]:
    body = await _call(http, "GET", f"{base_url}/props")
    if not isinstance(body, dict):
        raise SlotApiError("/props answered no object")
    return body


async def save(http: httpx.AsyncClient, base_url: str, slot: int, filename: str) -> SlotFile:
    """Unbounded here (a large slot takes seconds to write): the caller's deadline bounds it."""
    body = await _call(http, "POST", f"{base_url}/slots/{slot}?action=save", {"filename": filename}, timeout=None)
    return SlotFile(slot, _count(body, "n_saved"), _count(body, "n_written"))


async def restore(http: httpx.AsyncClient, base_url: str, slot: int, filename: str) -> SlotFile:
    body = await _call(http, "POST", f"{base_url}/slots/{slot}?action=restore", {"filename": filename}, timeout=None)
    return SlotFile(slot, _count(body, "n_restored"), _count(body, "n_read"))


async def _call(http: httpx.AsyncClient, method: str, url: str, body: dict[str, Any] | None = None,
                **timeout: float | None) -> Any:
    """*timeout*: ``timeout=None`` for none; else the client's own."""
    import httpx
    path = "/" + url.split("://", 1)[-1].partition("/")[2]
    try:
        response = await http.request(method, url, json=body, **timeout)  # type: ignore[arg-type]
    except httpx.HTTPError as exc:
        raise SlotApiError(f"{method} {path}: {exc or type(exc).__name__}") from exc
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if response.status_code != 200:
        error = answer.get("error") if isinstance(answer, dict) else None
        said = error.get("message") if isinstance(error, dict) else response.text[:200]
        raise SlotApiError(f"{method} {path} answered {response.status_code}: {said}")
    return answer


def _count(body: Any, key: str) -> int:
    value = body.get(key) if isinstance(body, dict) else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SlotApiError(f"the answer has no {key}")
    return value
