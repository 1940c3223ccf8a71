"""Starts ``python -m supervisor.cli run`` and the fakes for the tests without their imports each time.

``python -m supervisor.cli run CONFIG`` spends about half a second of CPU importing the gateway
before it reads its config (twice that beside busy loops), a fake runtime a fifth of that, and
the tests start over a hundred stewards and as many fakes. This program (``python -m
tests.forkserver``, one per test process) imports what they import once, then serves
requests on stdin, one JSON line each:

    {"module": MODULE, "args": [...], "cwd": DIR, "env": {...}, "output": PATH}   ->   {"pid": PID}

For each it forks a process that is what ``python -m MODULE ARGS`` is once its imports are done:
stdin from /dev/null, stdout and stderr into PATH, the given working directory and environment,
no other file descriptor, and MODULE run as ``__main__`` by runpy, as ``-m`` runs it, through to
the interpreter's normal exit (its exit status, atexit, the threads joined). It is forked twice,
so that it is re-parented to the test process, a child subreaper (tests/conftest.py): the test
waits for it and reads its exit status itself (ForkedProcess in conftest), as it would a Popen's.

The server stays single-threaded, so a fork copies no lock held by another thread. EOF on stdin
ends it. It imports nothing from the tests.
"""

from __future__ import annotations

import json
import os
import runpy
import sys

# What the modules run here import: steward's command line and gateway (and what `run` imports
# later: the probe's NVML binding, httpx's transport), and the fake runtimes.
PRELOAD = ("supervisor.cli", "supervisor.serving", "httpcore", "pynvml", "fakes.llama_server.server",
           "fakes.openai_server.server", "fakes.ollama.server", "fakes.comfyui.server")


def _become(request: dict[str, object]) -> None:
    """In the forked process: set up as Popen would, then run the module as ``-m`` does (SystemExit at its end)."""
    module, args, cwd, env, output = (request[key] for key in ("module", "args", "cwd", "env", "output"))
    assert isinstance(module, str) and isinstance(args, list) and isinstance(cwd, str)
    assert isinstance(env, dict) and isinstance(output, str)
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the pipes to the test process among them
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = [module, *args]  # run_module puts the module's file first, as -m does
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    raise SystemExit(0)  # the module returned: a normal end


def serve() -> None:
    for name in PRELOAD:
        __import__(name)
    replies = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        pid_read, pid_write = os.pipe()
        middle = os.fork()
        if middle == 0 and _fork_again(pid_read, pid_write):
            _become(request)  # raises SystemExit, which ends the forked process past these frames
        os.close(pid_write)
        with os.fdopen(pid_read, "rb") as reader:
            pid = int(reader.read())
        os.waitpid(middle, 0)  # gone: what it forked is the test process's child now
        replies.write(json.dumps({"pid": pid}) + "\n")
        replies.flush()


def _fork_again(pid_read: int, pid_write: int) -> bool:
    """In the middle process: fork again, say the pid, exit. Returns (True) only in the process forked."""
    try:
        os.close(pid_read)
        child = os.fork()
    except BaseException:
        os._exit(1)
    if child == 0:
        os.close(pid_write)
        return True
    try:
        os.write(pid_write, str(child).encode())
    finally:
        os._exit(0)


if __name__ == "__main__":
    serve()
