"""What the benchmark scripts share: free ports, stopping what they started, JSON over HTTP,
a process's own CPU time. Imported as a sibling module (the scripts run from their folder)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from typing import Any

from supervisor.engines.process_tree import stat_fields

STOP_GRACE_S = 15.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop(name: str, process: subprocess.Popen[bytes], grace: float = STOP_GRACE_S) -> None:
    """SIGTERM, up to *grace*, then SIGKILL."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            print(f"bench: {name} did not stop within {grace:g}s; killing it", file=sys.stderr)
            process.kill()
            process.wait()


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def cpu_seconds(pid: int) -> float:
    """utime + stime of *pid* (not of its children), from /proc."""
    fields = stat_fields(pid)  # fields[0] is /proc/PID/stat's field 3 (state)
    if fields is None:
        raise ProcessLookupError(pid)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
