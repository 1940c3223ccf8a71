"""ComfyUI's side of an image job: follow the prompt to its end, then free the GPU.

A prompt is done when `/history/<id>` shows it completed or failed; one that vanished
(deleted from ComfyUI's queue, ComfyUI restarted) is noticed through `/queue` rather than
only by the job timeout. Then `POST /free` unloads ComfyUI's models, and steward waits
until the device's memory is back to what it was before the job (or a timeout).
"""

from __future__ import annotations

import json
import re

import httpx
import trio

from supervisor.config import ComfyConfig
from supervisor.events import EventLog

_PROMPT_ID = re.compile(rb'"prompt_id"\s*:\s*"([^"]+)"')


def find_prompt_id(captured: bytes) -> str | None:
    """The prompt_id in the first bytes of ComfyUI's answer to /prompt (bounded capture)."""
    match = _PROMPT_ID.search(captured)
    return match.group(1).decode() if match else None


async def follow_prompt(config: ComfyConfig, http: httpx.AsyncClient, base_url: str, prompt_id: str) -> str:
    """Wait for the prompt's end: "success", "error", "vanished" or "timeout"."""
    with trio.move_on_after(config.job_timeout):
        while True:
            outcome = await _history_outcome(http, base_url, prompt_id)
            if outcome is not None:
                return outcome
            if not await _still_queued(http, base_url, prompt_id):
                # It may have finished between the two calls: the history decides.
                return await _history_outcome(http, base_url, prompt_id) or "vanished"
            await trio.sleep(config.history_poll)
    return "timeout"


async def _history_outcome(http: httpx.AsyncClient, base_url: str, prompt_id: str) -> str | None:
    try:
        entry = (await http.get(f"{base_url}/history/{prompt_id}")).json().get(prompt_id)
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    if not isinstance(entry, dict):
        return None
    status = entry.get("status") or {}
    if status.get("status_str") == "error":
        return "error"
    return "success" if status.get("completed") else None


async def _still_queued(http: httpx.AsyncClient, base_url: str, prompt_id: str) -> bool:
    try:
        queue = (await http.get(f"{base_url}/queue")).json()
    except (httpx.HTTPError, ValueError):
        return True  # cannot tell: keep following until the history or the timeout says
    items = [*queue.get("queue_running", []), *queue.get("queue_pending", [])]
    return any(isinstance(item, list) and len(item) > 1 and item[1] == prompt_id for item in items)


async def used_vram(http: httpx.AsyncClient, base_url: str) -> int | None:
    try:
        device = (await http.get(f"{base_url}/system_stats")).json()["devices"][0]
        return int(device["vram_total"]) - int(device["vram_free"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None


async def free_gpu(config: ComfyConfig, http: httpx.AsyncClient, base_url: str, baseline: int | None,
                   events: EventLog, prompt_id: str) -> bool:
    """POST /free, then wait until the memory is observed back at *baseline*. True if it was."""
    try:
        await http.post(f"{base_url}/free", content=json.dumps({"unload_models": True, "free_memory": True}),
                        headers={"content-type": "application/json"})
    except httpx.HTTPError as exc:
        events.emit("image_free_failed", "warning", prompt_id=prompt_id, detail=str(exc))
        return False
    tolerance = 256 * 1024**2
    with trio.move_on_after(config.free_timeout):
        while True:
            used = await used_vram(http, base_url)
            if used is None or baseline is None or used <= baseline + tolerance:
                return used is not None
            await trio.sleep(0.1)
    return False
