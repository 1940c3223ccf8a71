"""A real engine on the simulated GPU: ``python -m fakes.simgpu_engine --sim-gpu DIR -- PROGRAM ARGS``.

Runs PROGRAM (the CPU ``llama-server``) as its child, passes every line of its output on,
and registers on the simulated device (``fakes/simgpu.py``), under its own pid, the memory a
CUDA build would hold there: a runtime reserve from the start (the CUDA context, which
llama.cpp never reports) plus every buffer the program's log reports as it appears
(``supervisor/accounting/llama_logs.py``). Steward spawns this process as the engine, so the
per-process list names the engine's own pid, as NVML names a CUDA llama-server's.

Exits as the child does (the same status, or killed by the same signal), leaving the device
cleanly. Killed with SIGKILL, it leaves its record behind: the device counts the memory for its
linger while the process is gone from the list, as NVML does after a crash. SIGTERM, SIGINT
and SIGHUP are passed on; the child dies with this process (PR_SET_PDEATHSIG).

``steward gpu-check --simulated`` runs its engines this way.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import subprocess
import sys
from collections.abc import Sequence

from fakes import simgpu
from supervisor.accounting.llama_logs import LlamaLogAccumulator
from supervisor.engines.process import die_with_parent
from supervisor.units import parse_size

DEFAULT_RESERVE = "256MiB"
_PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fakes.simgpu_engine", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sim-gpu", required=True, metavar="DIR", help="the fakes.simgpu device to register with")
    parser.add_argument("--reserve", type=parse_size, default=parse_size(DEFAULT_RESERVE),
                        help=f"held from the start, beside the logged buffers ({DEFAULT_RESERVE})")
    parser.add_argument("program", nargs=argparse.REMAINDER, help="-- PROGRAM ARGS")
    args = parser.parse_args(argv)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        parser.error("no program given after --")
    try:
        child = subprocess.Popen(program, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 preexec_fn=functools.partial(die_with_parent, os.getpid()))
    except OSError as exc:
        print(f"simgpu_engine: cannot run {program[0]}: {exc}", file=sys.stderr)
        return 127
    for signum in _PASSED_ON:
        signal.signal(signum, lambda received, _frame: child.send_signal(received))
    log = LlamaLogAccumulator()
    held = args.reserve
    simgpu.register(args.sim_gpu, held, label=os.path.basename(program[0]))
    assert child.stdout is not None
    for raw in child.stdout:
        sys.stdout.buffer.write(raw)
        sys.stdout.buffer.flush()
        log.feed(raw.decode(errors="replace"))
        if (now := args.reserve + log.breakdown().total()) != held:
            held = now
            simgpu.register(args.sim_gpu, held, label=os.path.basename(program[0]))
    status = child.wait()
    simgpu.unregister(args.sim_gpu)
    if status < 0:  # the same death as the child's
        if -status != signal.SIGKILL:  # the one handler that cannot be set (nor was)
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    return status


if __name__ == "__main__":
    sys.exit(main())
