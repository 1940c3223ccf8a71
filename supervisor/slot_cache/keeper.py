"""The save after a drain and the restore before ready: one engine's ``SlotKeeper``.

Neither ever fails the engine or a client: whatever goes wrong (the server refuses, a file
cannot be written, the fingerprint changed, the time bound passed) is a ``cache_skipped``
event and the eviction or load goes on as it would without ``keep_cache``.

The bounds. A save runs while the load that evicted the engine waits for its memory, so it is
cut at ``kv_cache.save_within`` (what was saved by then is kept); it saves the slots holding the
most cached tokens, at most ``keep_cache.slots`` of them and ``keep_cache.max_bytes`` together,
none holding fewer than ``keep_cache.min_tokens``. Then the folder's sets older than
``kv_cache.keep`` go, and the oldest ones while all hold more than ``kv_cache.max_bytes``. A
restore runs before the engine counts as ready (so the first request after the load finds
its conversation), cut at ``kv_cache.restore_within``; its time is part of the load's
measured ``load_s``.
"""

from __future__ import annotations

import enum
import secrets
import time
from typing import TYPE_CHECKING

import attrs
import trio

from supervisor.observe.events import EventLog
from supervisor.slot_cache import llama
from supervisor.slot_cache.fingerprint import changed, fingerprint
from supervisor.slot_cache.plan import SlotCachePlan
from supervisor.slot_cache.store import SavedSet, SavedSlot

if TYPE_CHECKING:
    import httpx


class SkipWhy(enum.Enum):
    """The ``cache_skipped`` event's ``why``."""

    DEADLINE = "deadline"  # save_within / restore_within passed: the rest is left out
    FINGERPRINT = "fingerprint"  # the engine is not the one the save came from: the set is deleted
    EXPIRED = "expired"  # older than kv_cache.keep: deleted
    FAILED = "failed"  # the server refused, or a file could not be written or read
    NOTHING_CACHED = "nothing_cached"  # no slot held keep_cache.min_tokens


@attrs.define
class _SaveProgress:
    """What a save has done so far: kept when the time bound cuts it short."""

    origin: dict[str, object] | None = None  # the engine's fingerprint, once read
    slots: list[SavedSlot] = attrs.Factory(list)
    left_out: list[str] = attrs.Factory(list)  # the slots worth keeping that were not, and why


@attrs.define(eq=False)
class SlotKeeper:
    """Owned by the engine's task: what it restored in the generation running now (a restored
    slot that took no task since says nothing of its cache in /slots, and is worth saving again)."""

    plan: SlotCachePlan
    events: EventLog
    restored: dict[int, int] = attrs.Factory(dict)  # slot -> tokens restored into it

    def new_generation(self) -> None:
        self.restored.clear()

    def before_spawn(self) -> None:
        """llama-server refuses to start unless its --slot-save-path is a folder: create it. A folder
        that cannot be made is an event here; the start then fails with the server's own words."""
        try:
            self.plan.folder.model_dir(self.plan.model).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._skipped("start", SkipWhy.FAILED, f"cannot create {self.plan.save_path}: {exc.strerror or exc}",
                          saved=0)

    async def save(self, http: httpx.AsyncClient, base_url: str) -> float:
        """Save the slots worth keeping; the seconds it took (the eviction waited that long)."""
        plan, start = self.plan, trio.current_time()
        progress = _SaveProgress()
        with trio.move_on_after(plan.save_within) as bound:
            try:
                await self._save(http, base_url, progress)
            except (llama.SlotApiError, OSError) as exc:
                self._skipped("save", SkipWhy.FAILED, str(exc), saved=len(progress.slots))
        seconds = trio.current_time() - start
        if bound.cancelled_caught:
            self._skipped("save", SkipWhy.DEADLINE, f"cut at kv_cache.save_within ({plan.save_within:g}s) with "
                                                    f"{len(progress.slots)} slot(s) saved", saved=len(progress.slots))
        if progress.origin is not None:  # else it failed before anything: the old set stays as it was
            with trio.CancelScope(shield=True):
                await self._keep(progress, seconds)
        return seconds

    async def _save(self, http: httpx.AsyncClient, base_url: str, progress: _SaveProgress) -> None:
        plan = self.plan
        await trio.to_thread.run_sync(plan.folder.prepare, plan.model)
        progress.origin = fingerprint(await llama.props(http, base_url), plan.cache_types)
        cached = await llama.slot_tokens(http, base_url)
        tokens = {slot: said if said is not None else self.restored.get(slot, 0) for slot, said in cached.items()}
        ranked = sorted((slot for slot, n in tokens.items() if n >= plan.min_tokens), key=lambda s: (-tokens[s], s))
        progress.left_out += [f"slot {slot}: beyond keep_cache.slots" for slot in ranked[plan.slots:]]
        if not ranked:
            self._skipped("save", SkipWhy.NOTHING_CACHED, f"no slot holds {plan.min_tokens} cached tokens or more "
                                                          f"(keep_cache.min_tokens)", saved=0)
        per_token: float | None = None  # bytes per token, known from the first file
        for slot in ranked[:plan.slots]:
            written = sum(s.nbytes for s in progress.slots)
            if per_token is not None and written + tokens[slot] * per_token > plan.max_bytes:
                progress.left_out.append(f"slot {slot}: would pass keep_cache.max_bytes")
                continue
            name = f"slot{slot}-{secrets.token_hex(4)}.bin"
            result = await llama.save(http, base_url, slot, name)
            per_token = result.nbytes / max(result.tokens, 1)
            if result.tokens < plan.min_tokens or written + result.nbytes > plan.max_bytes:
                bound = "under keep_cache.min_tokens" if result.tokens < plan.min_tokens else "past keep_cache.max_bytes"
                progress.left_out.append(f"slot {slot}: {result.tokens} tokens, {result.nbytes} bytes ({bound})")
                continue  # its file is deleted at the next save (the folder's unlisted files)
            progress.slots.append(SavedSlot(name, result.tokens, result.nbytes))

    async def _keep(self, progress: _SaveProgress, seconds: float) -> None:
        """Make what was saved the model's set (or none: a save replaces the last), then prune the folder."""
        plan = self.plan
        assert progress.origin is not None
        try:
            if progress.slots:
                saved = SavedSet(progress.origin, time.time(), tuple(progress.slots))
                await trio.to_thread.run_sync(plan.folder.write, plan.model, saved)
                self.events.emit("cache_saved", "info", engine=plan.model, slots=len(saved.slots),
                                 tokens=saved.tokens, bytes=saved.nbytes, seconds=round(seconds, 3),
                                 left_out=progress.left_out)
            else:
                await trio.to_thread.run_sync(plan.folder.discard, plan.model)
            pruned = await trio.to_thread.run_sync(plan.folder.prune, plan.keep_s, plan.total_bytes)
        except OSError as exc:
            self._skipped("save", SkipWhy.FAILED, f"the cache folder: {exc}", saved=0)
            return
        for gone in pruned:
            self.events.emit("cache_pruned", "info", engine=gone.model, why=gone.why, bytes=gone.nbytes)

    async def restore(self, http: httpx.AsyncClient, base_url: str) -> None:
        """Restore the model's last set into its slots 0, 1, ... (most tokens first), if it may be."""
        plan = self.plan
        self.new_generation()
        saved = await trio.to_thread.run_sync(plan.folder.read, plan.model)
        if saved is None:
            return
        start = trio.current_time()
        with trio.move_on_after(plan.restore_within) as bound:
            try:
                await self._restore(http, base_url, saved)
            except (llama.SlotApiError, OSError) as exc:
                self._skipped("restore", SkipWhy.FAILED, str(exc), saved=len(saved.slots))
        if bound.cancelled_caught:
            self._skipped("restore", SkipWhy.DEADLINE, f"cut at kv_cache.restore_within ({plan.restore_within:g}s) "
                                                       f"with {len(self.restored)} slot(s) restored",
                          saved=len(saved.slots))
        if self.restored:
            self.events.emit("cache_restored", "info", engine=plan.model, slots=len(self.restored),
                             tokens=sum(self.restored.values()),
                             bytes=sum(s.nbytes for i, s in enumerate(saved.slots) if i in self.restored),
                             seconds=round(trio.current_time() - start, 3), age_s=round(time.time() - saved.saved_at, 1))

    async def _restore(self, http: httpx.AsyncClient, base_url: str, saved: SavedSet) -> None:
        plan = self.plan
        if time.time() - saved.saved_at > plan.keep_s:
            await trio.to_thread.run_sync(plan.folder.discard, plan.model)
            self._skipped("restore", SkipWhy.EXPIRED, f"saved {time.time() - saved.saved_at:.0f}s ago, past "
                                                      f"kv_cache.keep ({plan.keep_s:g}s); deleted", saved=len(saved.slots))
            return
        now = fingerprint(await llama.props(http, base_url), plan.cache_types)
        if differ := changed(saved.fingerprint, now):
            await trio.to_thread.run_sync(plan.folder.discard, plan.model)
            self._skipped("restore", SkipWhy.FINGERPRINT, f"the engine changed since the save ({', '.join(differ)}); "
                                                          f"deleted", saved=len(saved.slots), changed=differ)
            return
        for slot, kept in enumerate(saved.slots):
            result = await llama.restore(http, base_url, slot, kept.file)
            self.restored[slot] = result.tokens

    def _skipped(self, action: str, why: SkipWhy, detail: str, *, saved: int,
                 changed: list[str] | None = None) -> None:
        level = "info" if why in (SkipWhy.NOTHING_CACHED, SkipWhy.EXPIRED) else "warning"
        self.events.emit("cache_skipped", level, engine=self.plan.model, action=action, why=why.value,
                         detail=detail, slots=saved, changed=changed)
