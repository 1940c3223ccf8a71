"""A steward of a load test's own: its config, starting it as a child process, stopping it.

The loadtest (and ``steward loadtest --scenario overload``, thrash and real) runs steward as
a child process, not in its own process, so that the load generator does not share
steward's CPU time slice; its config, event log and terminal output are files in the
test's folder, read afterwards. Here are the steps of that: the demo's config for it,
start (until it listens), stop (SIGTERM, then SIGKILL), the last lines of its output for
an error message, where its listeners are, and the lines the loadtest says about it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from supervisor.observe.events import read_event_log
from supervisor.engines.process import die_with_parent
from supervisor.tools.demo import RealEnginesUnavailable, demo_config_dict, real_demo_config_dict
from supervisor.tools.loadtest_clients import Endpoints

STEWARD_OUTPUT = "steward.stderr"  # the loadtest's steward's terminal output, in its folder
EVENTS_FILE = "events.jsonl"  # its event log, in its folder


def _deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def demo_steward_config(workdir: Path, *, real: bool = False,
                        overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The demo's config (fake engines, or real with ``real``) for a loadtest's steward.

    *overrides* are merged into it (``ollama`` and ``comfyui`` only where the demo has
    them: the real demo has neither).
    """
    try:
        config = real_demo_config_dict(workdir, port=0) if real else demo_config_dict(workdir, port=0)
    except RealEnginesUnavailable as exc:
        raise RuntimeError(str(exc)) from None
    return _deep_merge(config, {k: v for k, v in (overrides or {}).items()
                                if k in config or k not in ("ollama", "comfyui")})


def start_steward(workdir: Path, config: Mapping[str, Any],
                  stderr: Path | None = None) -> tuple[subprocess.Popen[bytes], str, Path]:
    """``steward run`` on *config*, written into *workdir*, as a child process; its URL and event log.

    Its event log goes to *workdir* whatever *config* says (read whole afterwards);
    *stderr*: steward's terminal output goes there (default: the loadtest's stderr,
    never its stdout, which may be JSON).
    """
    config = {**config, "log": {"file": str(workdir / EVENTS_FILE), "terminal": "warning", "max_size": 0}}
    config_path = workdir / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    process = spawn_steward(config_path, stderr)
    events = workdir / EVENTS_FILE
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"steward exited with status {process.returncode}" + output_tail(stderr))
        if events.exists():
            for record in read_event_log(events):
                if record["event"] == "listening":
                    return process, record["urls"][0], events
        time.sleep(0.05)
    stop_steward(process)
    raise RuntimeError("steward did not start within 30 s" + output_tail(stderr))


def spawn_steward(config_path: Path, stderr: Path | None = None) -> subprocess.Popen[bytes]:
    """``steward run`` on the config file at *config_path*, in a session of its own; not waited for.

    *stderr*: its terminal output is appended there (default: this process's stderr, never
    its stdout, which may be JSON). When this process dies, however, steward gets SIGTERM.
    """
    with contextlib.ExitStack() as stack:
        err = stack.enter_context(stderr.open("ab")) if stderr is not None else 2  # fd 2, whatever sys.stderr is
        return subprocess.Popen([sys.executable, "-m", "supervisor.cli", "run", str(config_path)],
                                stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True,
                                preexec_fn=functools.partial(die_with_parent, os.getpid(), signal.SIGTERM))


def stop_steward(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM, then SIGKILL to its group after 30 s; returns its exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return process.returncode


def stop_as_planned(process: subprocess.Popen[bytes], say: Callable[[str], None]) -> int:
    """``stop_steward``, after saying that the loadtest stops it."""
    # Said here because steward's own line about the SIGTERM, in its output file, would read
    # like an accident on the loadtest's terminal.
    say("loadtest: stopping its steward, as planned (it finishes what is in flight, then stops its engines)")
    return stop_steward(process)


def output_tail(path: Path | None, lines: int = 10) -> str:
    """The last *lines* of steward's output at *path*, indented after a colon, for an error message; or ""."""
    if path is None or not path.exists():
        return ""
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return ":\n" + "\n".join(f"  {line}" for line in text) if text else ""


def listener_endpoints(events: Path, steward_url: str) -> Endpoints:
    """Steward's listeners at *steward_url*, with its Ollama and ComfyUI ones as its event log names them."""
    for record in read_event_log(events):
        if record["event"] == "listening":
            ollama, comfyui = record.get("ollama") or [], record.get("comfyui") or []
            return Endpoints(steward_url, ollama[0] if ollama else None, comfyui[0] if comfyui else None)
    return Endpoints(steward_url)


def engines_in_words(real: bool) -> str:
    return "real llama-server engines" if real else "the demo's fake engines"


def started_line(steward_url: str, output: Path, *, engines: str, keep: bool) -> str:
    """The line that says the loadtest's steward is up: where, on what, and where its output goes."""
    kept = "" if keep else "; removed at the end, --keep keeps it"
    return f"loadtest: its steward is up at {steward_url} on {engines} (its own output: {output}{kept})"
