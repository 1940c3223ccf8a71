"""The engine-core child (``--memory-in-child``): it, not the spawned server, holds the GPU memory.

vLLM keeps its memory in its EngineCore/worker processes. This child registers with the
simulated GPU under its own pid: each line on stdin is a byte count to hold, answered "ok".
It dies with its parent: PR_SET_PDEATHSIG (SIGTERM) for a parent killed outright, stdin's
EOF as well; SIGTERM marks its registration exited on the way out.

Run by the server as ``python -m fakes.openai_server.engine_core PARENT_PID [DIR]``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from types import FrameType

from fakes import simgpu

_PR_SET_NAME = 15
_PR_SET_PDEATHSIG = 1
PROCESS_NAME = b"VLLM::EngineCor"  # vLLM's setproctitle name, cut to the kernel's 15 bytes


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: list[str]) -> int:
    parent_pid, directory = int(argv[0]), (argv[1] if len(argv) > 1 else None)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_NAME, PROCESS_NAME)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    if os.getppid() != parent_pid:
        return 1  # the parent died before prctl took effect
    stamp = time.strftime("%m-%d %H:%M:%S")
    sys.stderr.write(f"(EngineCore_DP0 pid={os.getpid()}) INFO {stamp} [core.py:1] Engine core started\n")
    sys.stderr.flush()
    try:
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        for line in sys.stdin:  # EOF: the parent has gone
            nbytes = int(line)
            if directory:
                simgpu.register(directory, nbytes, label="VLLM::EngineCore")
            sys.stdout.write("ok\n")
            sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        pass
    finally:
        if directory:
            simgpu.unregister(directory)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
