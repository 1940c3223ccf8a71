"""ComfyUI's own API as steward reads and calls it: a /prompt body read and checked against
ComfyUI's node classes (``/object_info``) before the GPU is taken, then the prompt followed to
its end, then the GPU freed. ComfyUI is a service steward holds the GPU for, not a Runtime.

A prompt is done when `/history/<id>` shows it completed or failed; one that vanished
(deleted from ComfyUI's queue, ComfyUI restarted) is noticed through `/queue` rather than
only by the job timeout. Then `POST /free` unloads ComfyUI's models, and steward waits
until the device's memory is back to what it was before the job (or a timeout).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import attrs
import httpx
import trio

from supervisor.config import ComfyConfig
from supervisor.observe.events import EventLog
from supervisor.gateway.comfy.inputs import NodeClass, validate_outputs
from supervisor.gateway.errors import comfy_refusal_body

_PROMPT_ID = re.compile(rb'"prompt_id"\s*:\s*"([^"]+)"')


@attrs.frozen
class PromptRefused:
    """Why a /prompt body cannot run, in ComfyUI's own words (its execution.validate_prompt)."""

    type: str
    message: str
    details: str = ""
    node_errors: dict[str, Any] = attrs.Factory(dict)  # each failing node's errors, as ComfyUI lists them

    def body(self) -> bytes:
        return comfy_refusal_body(self.type, self.message, self.details, self.node_errors)


@attrs.frozen
class PromptRequest:
    """A /prompt body read once: a JSON object whose prompt is a graph of nodes with class types."""

    prompt: dict[str, dict[str, Any]]
    targets: object = None  # partial_execution_targets as sent: ComfyUI validates and runs the outputs listed

    @property
    def partial(self) -> bool:
        return self.targets is not None

    @property
    def classes(self) -> set[str]:
        return {node["class_type"] for node in self.prompt.values()}

    def refusal(self, nodes: Mapping[str, NodeClass] | None) -> PromptRefused | None:
        """What ComfyUI would refuse of it, given its node classes (`NodeCatalog.lookup`): a class
        it does not list, no output, inputs it refuses on every output (comfy_inputs); *nodes*
        None (ComfyUI unreachable): nothing more is checked. Pure."""
        if nodes is None:
            return None
        for node_id, node in self.prompt.items():
            if node["class_type"] not in nodes:
                return PromptRefused("invalid_prompt", f"Cannot execute because node {node['class_type']} does not "
                                     "exist.", f"Node ID '#{node_id}'")
        outputs = [node_id for node_id, node in self.prompt.items() if nodes[node["class_type"]].output_node]
        if not self.partial and not outputs:
            return PromptRefused("prompt_no_outputs", "Prompt has no outputs")
        if self.partial:
            if not isinstance(self.targets, list):
                return None  # ComfyUI reads other targets its own way (a string by substring): left to it
            outputs = [node_id for node_id in outputs if node_id in self.targets]
        failed = validate_outputs(self.prompt, outputs, nodes)
        if failed is None or not _printable(failed.node_errors):
            return None
        return PromptRefused("prompt_outputs_failed_validation", "Prompt outputs failed validation", failed.details,
                             failed.node_errors)


def _printable(node_errors: dict[str, Any]) -> bool:
    """Whether the errors can be sent: a value nested deep enough is more than json.dumps can print."""
    try:
        json.dumps(node_errors)
    except (RecursionError, ValueError):
        return False
    return True


def read_prompt(body: bytes) -> PromptRequest | PromptRefused:
    """The prompt of a /prompt body, or why ComfyUI would refuse it whatever its nodes. Pure."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return PromptRefused("invalid_prompt", "The request body is not valid JSON.")
    if not isinstance(payload, dict):
        return PromptRefused("invalid_prompt", "The request body must be a JSON object with a prompt.")
    if "prompt" not in payload:
        return PromptRefused("no_prompt", "No prompt provided", "No prompt provided")
    prompt = payload["prompt"]
    if not isinstance(prompt, dict) or not prompt:
        return PromptRefused("invalid_prompt", "Cannot execute because the prompt is not an object of nodes.")
    for node_id, node in prompt.items():
        if not isinstance(node, dict) or not isinstance(node.get("class_type"), str):
            return PromptRefused("invalid_prompt", "Cannot execute because a node is missing the class_type "
                                 "property.", f"Node ID '#{node_id}'")
    return PromptRequest(prompt, targets=payload.get("partial_execution_targets"))


@attrs.define(eq=False)
class NodeCatalog:
    """ComfyUI's node classes (``/object_info``: what each takes and gives), fetched when first
    needed, again when a prompt names a class it does not list (custom nodes installed, ComfyUI
    restarted), and again before a refusal would be made from a copy older than *refresh_after*
    (an updated custom node may take other inputs under the same class name)."""

    http: httpx.AsyncClient
    base_url: str
    refresh_after: float = 10.0
    timeout: float = 30.0  # a big install's /object_info is megabytes
    nodes: dict[str, NodeClass] | None = None
    fetched_at: float = -math.inf
    _lock: trio.Lock = attrs.Factory(trio.Lock)

    async def lookup(self, class_types: set[str]) -> Mapping[str, NodeClass] | None:
        async with self._lock:
            if self.nodes is None or (self._stale() and not class_types <= self.nodes.keys()):
                await self._fetch()
        return self.nodes

    async def refusal(self, request: PromptRequest) -> PromptRefused | None:
        """`PromptRequest.refusal` from this catalog, fetched again first if it is stale."""
        refused = request.refusal(await self.lookup(request.classes))
        if refused is not None and self._stale():
            async with self._lock:
                if self._stale():
                    await self._fetch()
            refused = request.refusal(self.nodes)
        return refused

    def _stale(self) -> bool:
        return trio.current_time() - self.fetched_at >= self.refresh_after

    async def _fetch(self) -> None:
        self.fetched_at = trio.current_time()
        try:
            info: Any = (await self.http.get(f"{self.base_url}/object_info", timeout=self.timeout)).json()
        except (httpx.HTTPError, ValueError):
            return  # keep what we knew; unknown stays unknown
        if isinstance(info, dict):
            self.nodes = {str(name): NodeClass.of(str(name), entry) for name, entry in info.items()}


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
