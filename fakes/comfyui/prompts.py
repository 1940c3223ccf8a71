"""The prompt queue, the history and the worker that runs one prompt at a time (``main.py prompt_worker``).

A prompt runs for ``--job-time`` (or its ``fake_seconds``), node by node, sending the websocket
messages of ``execution.py`` to its client; it takes the model memory when it starts and leaves
it loaded. The images its outputs save (one per image of a batch) stay viewable, as files in
ComfyUI's output folder do, until ``MAXIMUM_HISTORY_SIZE`` newer ones were saved. ``/free``
sets flags the worker acts on when idle (at once) or after the running prompt. ``/interrupt``
ends the running prompt with ``execution_interrupted``. A *dropped* prompt (test hook)
vanishes: no history entry and no further message, as if ComfyUI had restarted.
"""

from __future__ import annotations

import itertools
import random
import string
import time
from typing import Any

import attrs
import trio

from fakes.comfyui.assets import PNG, Picture
from fakes.comfyui.cli import Config
from fakes.comfyui.memory import Gpu
from fakes.comfyui.workflow import ANIMATION_CLASS, ERROR_CLASS, Plan
from fakes.comfyui.ws import Hub

MAXIMUM_HISTORY_SIZE = 10000
INTERRUPT, DROP = "interrupt", "drop"


def now_ms() -> int:
    return int(time.time() * 1000)


@attrs.define(eq=False)
class Item:
    number: float
    prompt_id: str
    prompt: dict[str, Any]
    extra_data: dict[str, Any]
    plan: Plan
    seq: int

    def as_list(self) -> list[Any]:
        """``[number, prompt_id, prompt, extra_data, outputs_to_execute]`` as /queue and /history show it."""
        return [self.number, self.prompt_id, self.prompt, self.extra_data, self.plan.outputs]

    @property
    def client_id(self) -> str | None:
        return self.extra_data.get("client_id")


@attrs.define
class Stats:
    queued: int = 0
    succeeded: int = 0
    failed: int = 0
    interrupted: int = 0
    dropped: int = 0
    free_calls: int = 0


@attrs.define(eq=False)
class Prompts:
    cfg: Config
    gpu: Gpu
    hub: Hub
    pending: list[Item] = attrs.field(factory=list)
    running: Item | None = None
    history: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    stats: Stats = attrs.field(factory=Stats)
    number: int = 0
    last_node: str | None = None
    free_flags: dict[str, bool] | None = None
    # (filename, subfolder, type) -> a Picture, or an animation: (its frames, fps)
    saved: dict[tuple[str, str, str], Picture | tuple[Picture, float] | None] = attrs.field(factory=dict)
    _seq: itertools.count[int] = attrs.field(factory=itertools.count)
    _images: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1))
    _wake: trio.Event = attrs.field(factory=trio.Event)
    _scope: trio.CancelScope | None = None
    _stop: str | None = None

    # ---- the queue

    def next_number(self, front: bool) -> int:
        number = -self.number if front else self.number
        self.number += 1
        return number

    def put(self, number: float, prompt_id: str, prompt: dict[str, Any], extra_data: dict[str, Any],
            plan: Plan) -> None:
        self.pending.append(Item(number, prompt_id, prompt, extra_data, plan, next(self._seq)))
        self.stats.queued += 1
        self.queue_updated()
        self._wake.set()

    @property
    def remaining(self) -> int:
        return len(self.pending) + (self.running is not None)

    def status(self) -> dict[str, Any]:
        return {"exec_info": {"queue_remaining": self.remaining}}

    def queue_updated(self) -> None:
        self.hub.send("status", {"status": self.status()})

    def delete(self, prompt_ids: list[str]) -> None:
        before = len(self.pending)
        self.pending = [i for i in self.pending if i.prompt_id not in prompt_ids]
        if len(self.pending) != before:
            self.queue_updated()

    def clear(self) -> None:
        self.pending.clear()
        self.queue_updated()

    def interrupt(self, prompt_id: str | None = None) -> None:
        if self.running is not None and prompt_id in (None, self.running.prompt_id):
            self._stop_running(INTERRUPT)

    def drop(self, prompt_id: str | None = None) -> list[str]:
        """Make prompts vanish (pending and running): no history, no messages."""
        dropped = [i.prompt_id for i in self.pending if prompt_id in (None, i.prompt_id)]
        self.pending = [i for i in self.pending if i.prompt_id not in dropped]
        self.stats.dropped += len(dropped)
        if self.running is not None and prompt_id in (None, self.running.prompt_id):
            dropped.append(self.running.prompt_id)
            self._stop_running(DROP)
        return dropped

    def request_free(self, unload_models: bool, free_memory: bool) -> None:
        self.stats.free_calls += 1
        flags = self.free_flags or {"unload_models": False, "free_memory": False}
        self.free_flags = {"unload_models": flags["unload_models"] or unload_models,
                           "free_memory": flags["free_memory"] or free_memory}
        self._wake.set()

    def history_slice(self, max_items: int | None, offset: int) -> dict[str, Any]:
        """``PromptQueue.get_history`` without a prompt id."""
        if offset < 0 and max_items is not None:
            offset = len(self.history) - max_items
        out: dict[str, Any] = {}
        for i, (key, entry) in enumerate(self.history.items()):
            if i >= offset:
                out[key] = entry
                if max_items is not None and len(out) >= max_items:
                    break
        return out

    def _stop_running(self, reason: str) -> None:
        if self._stop != DROP:
            self._stop = reason
        if self._scope is not None:
            self._scope.cancel()

    # ---- the worker

    async def run_worker(self) -> None:
        while True:
            if self.pending:
                item = min(self.pending, key=lambda i: (i.number, i.seq))
                self.pending.remove(item)
                await self._execute(item)
                if self.cfg.disable_smart_memory:
                    self.gpu.drop()
            elif self.free_flags is not None:
                flags, self.free_flags = self.free_flags, None
                if flags["unload_models"] or flags["free_memory"]:
                    await self.gpu.unload(self.cfg.free_delay)
            else:
                await self._wake.wait()
                self._wake = trio.Event()

    async def _execute(self, item: Item) -> None:
        self.running, self._stop, self._scope = item, None, trio.CancelScope()
        self.queue_updated()  # PromptQueue.get() announces the take too
        scope, sid, pid = self._scope, item.client_id, item.prompt_id
        messages: list[list[Any]] = []

        def add_message(event: str, data: dict[str, Any], broadcast: bool = False) -> None:
            data = {**data, "timestamp": now_ms()}
            messages.append([event, data])
            if sid is not None or broadcast:
                self.hub.send(event, data, sid)

        add_message("execution_start", {"prompt_id": pid})
        add_message("execution_cached", {"nodes": [], "prompt_id": pid})
        outputs: dict[str, Any] = {}
        executed: list[str] = []
        failed_node: str | None = None
        await self.gpu.ensure_loaded()
        with scope:
            failed_node = await self._run_nodes(item, outputs, executed)
        self._scope = None
        if self._stop == DROP:
            self.running, self.last_node = None, None
            self.stats.dropped += 1
            return
        node = self.last_node
        node_info = {"prompt_id": pid, "node_id": node, "node_type": item.plan.classes.get(node or ""),
                     "executed": executed}
        if self._stop == INTERRUPT:
            add_message("execution_interrupted", node_info, broadcast=True)
            self.stats.interrupted += 1
        elif failed_node is not None:
            add_message("execution_error", {**node_info, "exception_message": "fake failure (FAKE_ERROR)",
                                            "exception_type": "RuntimeError",
                                            "traceback": ["RuntimeError: fake failure (FAKE_ERROR)\n"],
                                            "current_inputs": {}, "current_outputs": []})
            self.stats.failed += 1
        else:
            add_message("execution_success", {"prompt_id": pid})
            self.stats.succeeded += 1
        success = self._stop is None and failed_node is None
        self._add_history(item, outputs, messages, success)
        self.running, self.last_node = None, None
        self.queue_updated()
        if sid is not None:
            self.hub.send("executing", {"node": None, "prompt_id": pid}, sid)

    async def _run_nodes(self, item: Item, outputs: dict[str, Any], executed: list[str]) -> str | None:
        """Run the plan; the node that failed (FAKE_ERROR), else None."""
        plan, sid, pid = item.plan, item.client_id, item.prompt_id
        seconds = self.cfg.job_time if plan.seconds is None else plan.seconds
        for node in plan.nodes:
            self.last_node = node
            if sid is not None:
                self.hub.send("executing", {"node": node, "display_node": node, "prompt_id": pid}, sid)
            if plan.classes[node] == ERROR_CLASS:
                return node
            if node == plan.progress_node:
                for step in range(1, plan.steps + 1):
                    await trio.sleep(seconds / plan.steps)
                    self.hub.send("progress", {"value": step, "max": plan.steps, "prompt_id": pid, "node": node},
                                  sid)  # sid None: broadcast, as ComfyUI does
            elif plan.progress_node is None:
                await trio.sleep(seconds / len(plan.nodes))
            else:
                await trio.lowlevel.checkpoint()
            if node in plan.outputs:
                outputs[node] = self._output(plan.classes[node], item.prompt[node], plan.pictures.get(node))
                if sid is not None:
                    self.hub.send("executed", {"node": node, "display_node": node, "output": outputs[node],
                                               "prompt_id": pid}, sid)
            executed.append(node)
        return None

    def _output(self, class_type: str, node: dict[str, Any], picture: Picture | None) -> dict[str, Any]:
        if class_type == "PreviewImage":
            prefix = "ComfyUI_temp_" + "".join(random.choices(string.ascii_lowercase, k=5))
            kind = "temp"
        else:
            prefix, kind = str((node.get("inputs") or {}).get("filename_prefix") or "ComfyUI"), "output"
        subfolder, _, prefix = prefix.rpartition("/")
        if class_type == ANIMATION_CLASS:
            fps = (node.get("inputs") or {}).get("fps", 6.0)
            filename = f"{prefix}_{next(self._images):05}_.webp"
            self._keep((filename, subfolder, kind), (picture or Picture.empty(1, 1, 1, 0), float(fps)))
            return {"images": [{"filename": filename, "subfolder": subfolder, "type": kind}], "animated": [True]}
        images = []
        for batch_number in range(picture.batch if picture is not None else 1):
            filename = f"{prefix.replace('%batch_num%', str(batch_number))}_{next(self._images):05}_.png"
            self._keep((filename, subfolder, kind), picture)
            images.append({"filename": filename, "subfolder": subfolder, "type": kind})
        return {"images": images}

    def _keep(self, where: tuple[str, str, str], saved: Picture | tuple[Picture, float] | None) -> None:
        if len(self.saved) >= MAXIMUM_HISTORY_SIZE:
            self.saved.pop(next(iter(self.saved)))
        self.saved[where] = saved

    def _add_history(self, item: Item, outputs: dict[str, Any], messages: list[list[Any]], success: bool) -> None:
        if len(self.history) >= MAXIMUM_HISTORY_SIZE:
            self.history.pop(next(iter(self.history)))
        meta = {n: {"node_id": n, "display_node": n, "parent_node": None, "real_node_id": n} for n in outputs}
        self.history[item.prompt_id] = {
            "prompt": item.as_list(), "outputs": outputs,
            "status": {"status_str": "success" if success else "error", "completed": success, "messages": messages},
            "meta": meta,
        }

    def image(self, filename: str, subfolder: str, kind: str) -> bytes | None:
        """The PNG of an image a prompt saved (what /view serves), or None."""
        if (filename, subfolder, kind) not in self.saved:
            return None
        picture = self.saved[(filename, subfolder, kind)]
        if isinstance(picture, tuple):
            return picture[0].animated_webp(picture[1])
        return picture.png() if picture is not None else PNG
