"""``POST /slots/{id}?action=save|restore|erase`` with ``--slot-save-path``, as llama-server answers it.

The fake's "KV cache" of a slot is the prompt text of its last task and that task's prompt token
count: a save writes them to the file as JSON (llama-server writes the raw KV state), a restore
reads them back into the slot, so the next request whose prompt continues that text is told
``cache_n`` = that count, as the real server would find it computed. ``--fake-slot-delay`` makes
each action take that long; ``--fake-slot-fail`` answers each with llama-server's 500.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import trio

from fakes.llama_server.errors import ApiError, invalid_request, not_supported
from fakes.llama_server.slots import Slot

_SLOT_PATH = re.compile(r"/slots/(\d+)")
_PLAIN_NAME = re.compile(r"[A-Za-z0-9._-]+")


def slot_id(path: str) -> int | None:
    """The slot a ``/slots/{id}`` path names; None: not such a path."""
    match = _SLOT_PATH.fullmatch(path)
    return int(match.group(1)) if match else None


async def slot_action(slots: list[Slot], save_path: str | None, slot: int, action: str | None, body: Any,
                      delay: float, fail: bool) -> dict[str, Any]:
    """Do what ``?action=`` says to slot *slot*; the answer's JSON, or an ApiError as llama-server's."""
    if save_path is None:
        raise not_supported("slots action", "--slot-save-path")
    if not 0 <= slot < len(slots):
        raise invalid_request("Invalid slot ID")
    target = slots[slot]
    if action == "erase":
        n_erased, target.cached_text, target.n_cached = target.n_cached, "", 0
        return {"id_slot": slot, "n_erased": n_erased}
    if action not in ("save", "restore"):
        raise invalid_request("Invalid action")
    filename = body.get("filename") if isinstance(body, dict) else None
    if not isinstance(filename, str) or not _PLAIN_NAME.fullmatch(filename) or filename.startswith("."):
        raise invalid_request("Invalid filename")
    if target.is_processing:
        raise invalid_request("Slot is busy")  # the real server defers the task until the slot is free
    started = time.monotonic()
    await trio.sleep(delay)
    if fail:
        raise ApiError(500, f"fake failure to {action} slot {slot}", "server_error")
    path = Path(save_path) / filename
    if action == "save":
        data = json.dumps({"prompt": target.cached_text, "n_tokens": target.n_cached}).encode()
        path.write_bytes(data)
        return {"id_slot": slot, "filename": filename, "n_saved": target.n_cached, "n_written": len(data),
                "timings": {"save_ms": (time.monotonic() - started) * 1000}}
    try:
        data = path.read_bytes()
        saved = json.loads(data)
        text, n_tokens = str(saved["prompt"]), int(saved["n_tokens"])
    except (OSError, ValueError, KeyError, TypeError):
        raise invalid_request("Unable to restore slot, no available space in KV cache or invalid slot save file")
    target.cached_text, target.n_cached = text, n_tokens
    return {"id_slot": slot, "filename": filename, "n_restored": n_tokens, "n_read": len(data),
            "timings": {"restore_ms": (time.monotonic() - started) * 1000}}
