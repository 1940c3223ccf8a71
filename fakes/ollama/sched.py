"""The scheduler (Ollama's ``server/sched.go``, simplified): loaded runners, keep_alive, unloads, the queue.

* A request for a model that is not loaded starts a load (listed in ``/api/ps`` at once) and
  waits for it; requests for a model that is unloading wait until it is gone, then load it again.
* Each runner serves ``num_parallel`` requests at once (embedding-only models: one); the rest wait.
  A request arriving while ``max_queue`` requests already wait (for a load or a turn) gets 503.
* A runner whose last request finished expires ``keep_alive`` later (0: at once; FOREVER: never).
  The last request's ``keep_alive`` (or the server default when it named none) is the one used.
* Unloading takes ``unload_lag``: until then the model is still in ``/api/ps`` and holds its memory.
* ``max_loaded_models`` (0: no limit): a load beyond it first evicts the idle runner that expires
  soonest, or waits until one is idle.
* The memory of all runners still listed is registered with the simulated GPU as this process's.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from fakes import simgpu
from fakes.ollama.cli import Config, ModelSpec
from fakes.ollama.errors import server_busy
from fakes.ollama.gotime import FOREVER, MAX_DURATION_S, rfc3339

LOADING, READY, UNLOADING = "loading", "ready", "unloading"


@attrs.define(eq=False)
class Runner:
    spec: ModelSpec
    keep_alive: float
    turns: trio.Semaphore
    state: str = LOADING
    refs: int = 0                                  # requests holding it (waiting for a turn or generating)
    idle_since: float | None = None                # wall clock of the last release, while idle
    unloading_since: float | None = None
    loaded: trio.Event = attrs.field(factory=trio.Event)
    gone: trio.Event = attrs.field(factory=trio.Event)
    expiry: trio.CancelScope | None = None

    def cancel_expiry(self) -> None:
        if self.expiry is not None:
            self.expiry.cancel()
            self.expiry = None

    def expires_at(self, now: float) -> float:
        """Wall clock of the expiry: past while unloading, keep_alive from now while in use."""
        if self.unloading_since is not None:
            return self.unloading_since
        start = self.idle_since if (self.idle_since is not None and self.refs == 0) else now
        return start + (MAX_DURATION_S if self.keep_alive == FOREVER else self.keep_alive)

    def ps_entry(self, now: float) -> dict[str, Any]:
        spec = self.spec
        return {"name": spec.name, "model": spec.name, "size": spec.size, "digest": spec.digest,
                "details": spec.details(), "expires_at": rfc3339(self.expires_at(now)), "size_vram": spec.size,
                "context_length": spec.context_length}


@attrs.define
class Stats:
    started: int = 0          # generations and embeddings that got their turn
    completed: int = 0
    cancelled: int = 0        # the client left (waiting or generating)
    rejected: int = 0         # 503 ErrMaxQueue
    failed: int = 0           # FAKE_ERROR_MIDSTREAM
    loads: int = 0
    unloads: int = 0          # runners that started unloading (expiry, keep_alive 0, eviction)
    unload_requests: int = 0  # empty prompt + keep_alive 0


@attrs.frozen
class Use:
    runner: Runner
    load_seconds: float       # from the request's arrival until its runner was loaded


@attrs.define(eq=False)
class Scheduler:
    cfg: Config
    nursery: trio.Nursery
    runners: dict[str, Runner] = attrs.field(factory=dict)
    stats: Stats = attrs.field(factory=Stats)
    waiting: int = 0
    active: int = 0
    _changed: trio.Event = attrs.field(factory=trio.Event)

    # ---- requests

    @asynccontextmanager
    async def use(self, spec: ModelSpec, keep_alive: float | None) -> AsyncIterator[Use]:
        """Admit the request (or raise 503), load the model if needed, and hold a turn on it."""
        if self.waiting >= self.cfg.max_queue:
            self.stats.rejected += 1
            raise server_busy()
        arrived = trio.current_time()
        self.waiting += 1
        waiting, runner = True, None
        try:
            runner = await self._acquire(spec, keep_alive)
            load_seconds = trio.current_time() - arrived
            async with runner.turns:
                self.waiting -= 1
                waiting = False
                self.active += 1
                try:
                    yield Use(runner, load_seconds)
                finally:
                    self.active -= 1
        finally:
            if waiting:
                self.waiting -= 1
            if runner is not None:
                self._release(runner)

    def expire(self, spec: ModelSpec) -> None:
        """An unload request (empty prompt, keep_alive 0): unload now, or once the runner is idle."""
        self.stats.unload_requests += 1
        runner = self.runners.get(spec.name)
        if runner is None or runner.state == UNLOADING:
            return
        runner.keep_alive = 0.0
        runner.cancel_expiry()
        if runner.refs == 0 and runner.state == READY:
            self._unload(runner)

    def ps(self) -> list[dict[str, Any]]:
        now = time.time()
        ordered = sorted(self.runners.values(), key=lambda r: r.expires_at(now), reverse=True)
        return [r.ps_entry(now) for r in ordered]

    # ---- internals

    async def _acquire(self, spec: ModelSpec, keep_alive: float | None) -> Runner:
        while True:
            runner = self.runners.get(spec.name)
            if runner is None:
                if not await self._make_room():
                    continue  # something changed while we waited: look again
                runner = self._start_load(spec)
            elif runner.state == UNLOADING:
                await runner.gone.wait()
                continue
            runner.refs += 1
            runner.cancel_expiry()
            runner.idle_since = None
            runner.keep_alive = self.cfg.keep_alive if keep_alive is None else keep_alive
            try:
                await runner.loaded.wait()
            except BaseException:
                self._release(runner)
                raise
            return runner

    async def _make_room(self) -> bool:
        """True if a new runner may load now; else wait for a change (after evicting one) -> False."""
        limit = self.cfg.max_loaded_models
        if limit <= 0 or len(self.runners) < limit:
            return True
        idle = [r for r in self.runners.values() if r.refs == 0 and r.state == READY]
        if idle:
            now = time.time()
            self._unload(min(idle, key=lambda r: r.expires_at(now)))
        changed = self._changed
        await changed.wait()
        return False

    def _start_load(self, spec: ModelSpec) -> Runner:
        turns = trio.Semaphore(1 if spec.embedding_only else self.cfg.num_parallel)
        runner = Runner(spec, self.cfg.keep_alive, turns)
        self.runners[spec.name] = runner
        self.stats.loads += 1
        self._sync_memory()
        self.nursery.start_soon(self._load, runner)
        return runner

    async def _load(self, runner: Runner) -> None:
        await trio.sleep(runner.spec.load_time)
        runner.state = READY
        runner.loaded.set()
        if runner.refs == 0:  # everyone who wanted it left while it loaded
            self._idle(runner)

    def _release(self, runner: Runner) -> None:
        runner.refs -= 1
        if runner.refs == 0 and runner.state == READY:
            self._idle(runner)
        self._pulse()

    def _idle(self, runner: Runner) -> None:
        runner.idle_since = time.time()
        if runner.keep_alive <= 0:
            self._unload(runner)
        elif runner.keep_alive != FOREVER:
            runner.expiry = trio.CancelScope()
            self.nursery.start_soon(self._expire_later, runner, runner.expiry)

    async def _expire_later(self, runner: Runner, scope: trio.CancelScope) -> None:
        with scope:
            await trio.sleep(runner.keep_alive)
            runner.expiry = None
            self._unload(runner)

    def _unload(self, runner: Runner) -> None:
        if runner.state == UNLOADING:
            return
        runner.cancel_expiry()
        runner.state, runner.unloading_since = UNLOADING, time.time()
        self.stats.unloads += 1
        self.nursery.start_soon(self._finish_unload, runner)

    async def _finish_unload(self, runner: Runner) -> None:
        await trio.sleep(self.cfg.unload_lag)
        del self.runners[runner.spec.name]
        self._sync_memory()
        runner.gone.set()
        self._pulse()

    def _pulse(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _sync_memory(self) -> None:
        if self.cfg.sim_gpu:
            total = sum(r.spec.size for r in self.runners.values())
            simgpu.register(self.cfg.sim_gpu, total, label="ollama")
