"""A node's own ``/admin/state``, read by the front door for a person (``steward top``'s
node view, through the front door's ``GET /admin/nodes/NAME/state``).

The front door holds each node's key (``nodes.NAME.key_env``); the person watching holds
only the front door's admin key. So the front door reads the node's state with the node's
key and hands it on: the node's key never leaves the front door. What the node answers is
outside input: bounded in size and time, and it must be a JSON object with ``engines`` (the
shape of a steward's state) to be handed on; anything else is a ``PeekRefused`` with a
sentence for the screen.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

ADMIN_STATE_PATH = "/admin/state"
PEEK_TIMEOUT_S = 5.0
MAX_STATE_BYTES = 8 * 1024 * 1024  # a steward's state is tens of KiB; more is not a state


class PeekRefused(Exception):
    """No state of the node's to hand on: *status* for the front door's answer, and why."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


async def peek_admin_state(node: str, url: str, key: str | None, http: httpx.AsyncClient) -> dict[str, Any]:
    """The node's ``/admin/state``, read with its key; PeekRefused if it cannot be had."""
    headers = {"authorization": f"Bearer {key}"} if key else {}
    try:
        async with http.stream("GET", url + ADMIN_STATE_PATH, headers=headers, timeout=PEEK_TIMEOUT_S) as response:
            if response.status_code in (401, 403):
                why = ("the front door has no key for it (nodes.{0}.key_env)" if key is None
                       else "it refuses the front door's key for it (nodes.{0}.key_env)").format(node)
                raise PeekRefused(502, "node_refused", f"node {node!r} refused its admin state "
                                  f"(HTTP {response.status_code}): {why}")
            if response.status_code != 200:
                raise PeekRefused(502, "node_unavailable", f"node {node!r} answered HTTP {response.status_code}")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_STATE_BYTES:
                    raise PeekRefused(502, "node_unavailable", f"node {node!r} sent more than a state")
    except httpx.HTTPError as exc:
        said = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise PeekRefused(503, "node_unavailable", f"node {node!r} cannot be reached ({said})") from None
    try:
        state = json.loads(body)
    except ValueError:
        state = None
    if not isinstance(state, dict) or "engines" not in state:
        raise PeekRefused(502, "node_unavailable", f"node {node!r} answered something that is not a steward's state")
    return state
