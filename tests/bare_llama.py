"""A real llama-server started bare (no steward in front) for tests that read its log or ask it directly."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.conftest import free_port, stop_process

# Generous: a tiny model loads in well under a second; only a broken build gets near it.
LOAD_TIMEOUT_S = 60.0
# One thread: llama.cpp's spinning worker threads crawl when the cores are shared with the
# rest of the suite.
THREADS = ["--threads", "1"]


@contextmanager
def open_bare_llama_server(binary: Path, model: Path, args: list[str], log: Path) -> Iterator[str]:
    """Start llama-server (output into `log`), yield its base URL once /health says ready; always reaped."""
    port = free_port()
    cmd = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), *THREADS, *args]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        try:
            base = f"http://127.0.0.1:{port}"
            _wait_healthy(proc, base, log)
            yield base
        finally:
            stop_process(proc)


def _wait_healthy(proc: subprocess.Popen[bytes], base: str, log: Path) -> None:
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
            raise AssertionError(f"llama-server exited with {proc.returncode} while loading:\n{tail}")
        if time.monotonic() > deadline:
            raise AssertionError(f"llama-server not healthy within {LOAD_TIMEOUT_S}s; see {log}")
        try:
            if httpx.get(f"{base}/health", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
