"""An engine's own output, kept per engine: the ring's bounds and its safe lines (pure), which
lines still reach the event log, and ``steward logs NAME [-f]`` against a real steward over a
fake llama-server that logs each request (``--verbose``): the last lines, a new line followed
as it comes, Ctrl-C, an unknown engine, and the event log without one event a line."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading

import httpx
import pytest

from supervisor.observe.engine_logs import LINE_CHARS, EngineLogs, OutputRing, safe_line
from supervisor.observe.engine_output import worth_logging
from tests.conftest import ROOT, StewardFactory, fake_model
from tests.test_control import _as_from_a_terminal, steward_command
from tests.test_openai_engines import ask, wait_until
from tests.test_quiet_logs import metric


def test_the_ring_keeps_the_last_lines_within_its_line_and_byte_bounds() -> None:
    ring = OutputRing(max_lines=5, max_bytes=10_000)
    for number in range(12):
        ring.add(f"line {number}", 0.0)
    assert [line.line for line in ring.last(100)] == [f"line {n}" for n in range(7, 12)]
    assert [line.seq for line in ring.last(2)] == [11, 12] and ring.last(0) == []
    assert ring.size == sum(len(f"line {n}") for n in range(7, 12))

    by_bytes = OutputRing(max_lines=1000, max_bytes=100)
    for number in range(50):
        by_bytes.add(f"{number:02d}" + "x" * 18, 0.0)  # 20 bytes a line: 5 fit
    assert [line.line[:2] for line in by_bytes.last(1000)] == ["45", "46", "47", "48", "49"]
    assert by_bytes.size == 100
    # A line bigger than the bound on its own is still kept (cut at LINE_CHARS), alone.
    by_bytes.add("é" * (LINE_CHARS + 500), 0.0)
    (huge,) = by_bytes.last(1000)
    assert huge.line == "é" * LINE_CHARS + "…" and huge.size == len(huge.line.encode())


def test_a_kept_line_cannot_repaint_a_terminal_nor_break_a_utf8_writer() -> None:
    assert safe_line("\x1b[31mred\x1b[0m\tdone\rnext\x9b2J\ud800") == "\\x1b[31mred\\x1b[0m\tdone\\x0dnext\\x9b2J\\ud800"


def test_followers_are_told_each_new_line_of_their_engine_only() -> None:
    logs = EngineLogs(max_lines=3)
    told: list[str] = []
    logs.followers_of("chat").append(lambda line: told.append(line.line))
    for text in ("a", "b", "c", "d"):
        logs.add("chat", text)
    logs.add("embed", "other")
    assert told == ["a", "b", "c", "d"] and [line.line for line in logs.last("chat", 10)] == ["b", "c", "d"]
    assert logs.last("nope", 10) == []

    def broken(line: object) -> None:
        raise RuntimeError("a reader's bug")

    logs.followers_of("chat").append(broken)
    logs.add("chat", "e")  # the pump goes on; the broken follower is dropped, the other still told
    assert told[-1] == "e" and broken not in logs.followers_of("chat")


@pytest.mark.parametrize(("line", "logged"), [
    ("llama_model_load: error loading model: tensor 'x' is missing", True),
    ("WARNING 12-01 10:00:00 [config.py:1] Casting torch.bfloat16 to torch.float16.", True),
    ('time=2025-01-01T10:00:00 level=WARN source=server.go:1 msg="gpu VRAM usage didn\'t recover"', True),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", True),
    ("srv  fake: connection from 127.0.0.1 failed: ConnectionResetError()", True),
    ("srv  update_slots: all slots are idle", False),
    ("srv  log_server_r: request: POST /v1/chat/completions 127.0.0.1 200", False),
    ("INFO 12-01 10:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s", False),
])
def test_only_a_line_that_says_trouble_goes_to_the_event_log_too(line: str, logged: bool) -> None:
    assert worth_logging(line) is logged


def _read_lines(stream: object, into: queue.Queue[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        into.put(line.rstrip("\n"))


@pytest.mark.slow
def test_steward_logs_shows_and_follows_an_engine_s_output(start_steward: StewardFactory) -> None:
    steward = start_steward({"chat": fake_model("1GiB", extra=["--verbose"])}, gpu={"probe": "none", "budget": "4GiB"})
    assert ask(steward.base_url, "chat").status_code == 200
    wait_until(lambda: any("request: POST /v1/chat/completions" in line for line in steward.engine_lines("chat")),
               "the chat's request line kept")
    status, out, err = steward_command("logs", "chat", "--url", steward.url)
    assert (status, err) == (0, "")
    assert "main: model loaded" in out and "request: POST /v1/chat/completions" in out
    status, out, _ = steward_command("logs", "chat", "-n", "1", "--url", steward.url)
    assert status == 0 and len(out.splitlines()) == 1
    assert steward_command("logs", "nope", "--url", steward.url) == (1, "", "steward logs: no engine named 'nope'\n")
    text = httpx.get(f"{steward.url}/admin/engines/chat/logs", params={"lines": 3, "format": "text"}).text
    assert len(text.splitlines()) == 3
    missing = httpx.get(f"{steward.url}/admin/engines/nope/logs", params={"follow": 1})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "engine_not_found"

    following = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "logs", "chat", "-f", "-n", "1",
                                  "--url", steward.url], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, preexec_fn=_as_from_a_terminal)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_read_lines, args=(following.stdout, lines), daemon=True).start()
    try:
        # Its first line, the last one kept, says the stream is open: a new request's line comes as it is printed.
        lines.get(timeout=30)
        assert ask(steward.base_url, "chat").status_code == 200
        while "request: POST /v1/chat/completions" not in (line := lines.get(timeout=30)):
            pass
        following.send_signal(signal.SIGINT)
        assert following.wait(timeout=30) == 130
    finally:
        if following.poll() is None:
            following.kill()
            following.wait()
    assert following.stderr is not None and "Traceback" not in following.stderr.read()

    # The event log has none of those lines; /metrics counts them all.
    assert not [e for e in steward.events("engine_output") if "request:" in e["line"] or "loaded" in e["line"]]
    kept = len(steward.engine_lines("chat"))
    assert metric(steward.url, "steward_engine_output_lines", engine="chat") >= kept >= 5

