"""The startup probe of an upstream service (Ollama, ComfyUI): logged, never fatal."""

from __future__ import annotations

import httpx
import trio

from supervisor.observe.events import EventLog

# A service steward just spawned needs a moment to bind its port; give it this long
# before calling its absence a warning.
SPAWNED_GRACE_S = 30.0
POLL_S = 0.1


async def probe_upstream(http: httpx.AsyncClient, service: str, url: str, events: EventLog, spawned: bool, *,
                         task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """One `upstream_probe` event: the service answered (status, version), or it did not."""
    task_status.started()
    deadline = trio.current_time() + (SPAWNED_GRACE_S if spawned else 0.0)
    while True:
        try:
            response = await http.get(url)
        except httpx.HTTPError as exc:
            if trio.current_time() < deadline:
                await trio.sleep(POLL_S)
                continue
            events.emit("upstream_probe", "warning", service=service, url=url, detail=str(exc) or type(exc).__name__)
            return
        events.emit("upstream_probe", "info", service=service, url=url, status=response.status_code,
                    version=_version(response))
        return


def _version(response: httpx.Response) -> str | None:
    """Ollama's /api/version {"version"}; ComfyUI's /system_stats {"system": {"comfyui_version"}}."""
    try:
        body = response.json()
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    system = body.get("system")
    version = body.get("version") or (system.get("comfyui_version") if isinstance(system, dict) else None)
    return version if isinstance(version, str) else None
