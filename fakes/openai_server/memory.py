"""The simulated GPU memory of the engine: held in this process, or by an engine-core child.

Awake it is ``--memory``: weights + KV cache + what sleep keeps (the CUDA context). Sleep at
any level leaves only ``--sleep-memory`` (level 1 moves the weights to host RAM, level 2
drops them); a wake-up with ``tags`` brings back only those parts, as vLLM's does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import attrs
import trio

from fakes import simgpu
from fakes.openai_server.cli import Config

CHILD_STOP_GRACE_S = 1.0
ALL_TAGS = frozenset({"weights", "kv_cache"})


@attrs.define(eq=False)
class EngineCoreChild:
    """The child process and the pipes that tell it what to hold."""

    popen: subprocess.Popen[bytes]
    to_child: trio.lowlevel.FdStream
    from_child: trio.lowlevel.FdStream
    _buffer: bytes = b""

    @classmethod
    async def spawn(cls, sim_gpu: str | None) -> EngineCoreChild:
        # Forked in the trio thread, not a worker thread: PR_SET_PDEATHSIG fires when the
        # *thread* that forked the child exits.
        argv = [sys.executable, "-m", "fakes.openai_server.engine_core", str(os.getpid())]
        popen = subprocess.Popen(argv + ([sim_gpu] if sim_gpu else []),  # noqa: ASYNC220 - see above
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None)
        assert popen.stdin is not None and popen.stdout is not None
        child = cls(popen, trio.lowlevel.FdStream(os.dup(popen.stdin.fileno())),
                    trio.lowlevel.FdStream(os.dup(popen.stdout.fileno())))
        popen.stdin.close()
        popen.stdout.close()
        await child._expect(b"ready")
        return child

    @property
    def pid(self) -> int:
        return self.popen.pid

    async def _expect(self, word: bytes) -> None:
        while b"\n" not in self._buffer:
            data = await self.from_child.receive_some(256)
            if not data:
                raise RuntimeError(f"engine core process {self.pid} died (exit {self.popen.poll()})")
            self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        if line != word:
            raise RuntimeError(f"engine core said {line!r}, not {word!r}")

    async def hold(self, nbytes: int) -> None:
        await self.to_child.send_all(f"{nbytes}\n".encode())
        await self._expect(b"ok")

    def stop(self) -> None:
        """SIGTERM (it unregisters on the way out), SIGKILL after a grace; always reaped."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(CHILD_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.popen.kill()
        self.popen.wait()

    def kill(self) -> None:
        """A crash: no cleanup, the registration lingers like a dead process's memory."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()


@attrs.define(eq=False)
class EngineMemory:
    """What the engine holds now, and who registers it."""

    cfg: Config
    child: EngineCoreChild | None = None
    held: int = 0
    # Parts on the device: "weights", "kv_cache"; sleep empties it, wake_up refills it.
    awake_parts: set[str] = attrs.field(factory=set)

    @classmethod
    async def open(cls, cfg: Config) -> EngineMemory:
        child = await EngineCoreChild.spawn(cfg.sim_gpu) if cfg.memory_in_child else None
        return cls(cfg, child)

    @property
    def holder_pid(self) -> int:
        return self.child.pid if self.child is not None else os.getpid()

    def part_bytes(self, part: str) -> int:
        return self.cfg.weights_memory if part == "weights" else self.cfg.kv_cache_memory

    async def set_parts(self, parts: set[str]) -> None:
        self.awake_parts = set(parts)
        self.held = self.cfg.sleep_memory + sum(self.part_bytes(p) for p in parts)
        if self.child is not None:
            await self.child.hold(self.held)
        elif self.cfg.sim_gpu:
            simgpu.register(self.cfg.sim_gpu, self.held, label=self.cfg.model_name)
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        if self.child is not None:
            self.child.stop()

    def crash(self) -> None:
        if self.child is not None:
            self.child.kill()
