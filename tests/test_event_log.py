"""The event log: the schema version in every record, rotation by size, and the terminal line.

The writer runs on real files in a temporary folder (rotation is renames); the terminal is a
StringIO. Events are emitted in batches and the writer is let drain them with
``wait_all_tasks_blocked``, never a sleep. The last test runs a real steward and reads the
``request`` events its front door wrote, in the file and on its terminal.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import math
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import trio
import trio.testing

from supervisor.config import ConfigError, parse_config
from supervisor.observe.events import RECORD_KEYS, SCHEMA_VERSION, Event, EventLog, iso_time, read_event_log, serve_event_log
from supervisor.gateway.door import FrontDoor, front_door
from supervisor.observe.metrics import StewardMetrics
from supervisor.usage.writer import UsageLog
from tests.conftest import StewardFactory, fake_model

GIB = 1024**3
WALL = 1796021441.52


def line_of(name: str, level: str = "info", **fields: Any) -> str:
    """The terminal line of an event, without its clock (``HH:MM:SS ``)."""
    line = Event(name, level, fields, WALL, 1.0).to_line()
    assert line[:9] == time.strftime("%H:%M:%S ", time.localtime(WALL))
    return line[9:]


# --- the schema version


def test_every_record_carries_the_schema_version_after_its_times() -> None:
    record = json.loads(Event("load", "info", {"engine": "chat", "memory": 8 * GIB}, WALL, 2.5).to_json())
    assert list(record)[:6] == ["ts", "time", "mono", "v", "event", "level"]
    assert record == {"ts": WALL, "time": iso_time(WALL), "mono": 2.5, "v": 1, "event": "load", "level": "info",
                      "engine": "chat",
                      "memory": 8 * GIB, "memory_text": "8.0 GiB"}  # the JSON keeps the exact bytes, words beside
    assert SCHEMA_VERSION == 1


# --- rotation


async def run_writer(path: Path, batches: list[list[dict[str, Any]]], *, max_size: int, keep: int,
                     between: Callable[[int], None] = lambda batch: None) -> tuple[list[Event], str]:
    """Write *batches* of ``tick`` events through a real writer; the events it emitted itself, and the terminal."""
    terminal = io.StringIO()
    async with trio.open_nursery() as nursery:
        log: EventLog = await nursery.start(functools.partial(serve_event_log, str(path), terminal=terminal,
                                                              max_size=max_size, keep=keep))
        for number, batch in enumerate(batches):
            between(number)
            for fields in batch:
                log.emit("tick", "debug", **fields)
            await trio.testing.wait_all_tasks_blocked()  # the writer has written the batch and waits
        log.close()
    return [e for e in log.recent if e.name != "tick"], terminal.getvalue()


def ticks(path: Path) -> list[int]:
    return [r["i"] for r in read_event_log(path) if r["event"] == "tick"]


def whole_lines(path: Path) -> list[str]:
    text = path.read_text()
    assert text.endswith("\n"), f"{path.name} ends mid-line"
    lines = text.splitlines()
    for line in lines:
        json.loads(line)  # each one whole
    return lines


async def test_the_log_rotates_by_size_keeps_keep_files_and_splits_or_loses_no_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    batches = [[{"i": i, "pad": "x" * 60} for i in range(start, start + 25)] for start in range(0, 300, 25)]
    told, _ = await run_writer(path, batches, max_size=2000, keep=3)

    assert told == []  # a rotation that works says nothing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.jsonl", "events.jsonl.1", "events.jsonl.2",
                                                          "events.jsonl.3"]
    oldest_first = [Path(f"{path}.{n}") for n in (3, 2, 1)] + [path]
    kept = [i for file in oldest_first for i in ticks(file)]
    assert kept == list(range(kept[0], 300)) and kept[0] > 0  # consecutive to the last; the oldest files went
    for file, following in zip(oldest_first, oldest_first[1:], strict=False):
        size = file.stat().st_size
        # Rotated exactly when the next line would have taken it past max_size.
        assert size <= 2000 < size + len(whole_lines(following)[0]) + 1
    assert ticks(path) == kept[-len(whole_lines(path)):]  # read_event_log reads the current file


async def test_a_line_longer_than_max_size_is_written_whole_in_a_file_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"event":"earlier"}\n')  # a file from the last run: counted, and rotated first
    for n in (4, 5, 6):  # from a run that kept more
        Path(f"{path}.{n}").write_text('{"event":"much earlier"}\n')
    await run_writer(path, [[{"i": 0}, {"i": 1}], [{"i": 2, "pad": "y" * 500}]], max_size=50, keep=3)
    assert whole_lines(Path(f"{path}.3")) == ['{"event":"earlier"}']
    assert [ticks(Path(f"{path}.{n}")) for n in (2, 1)] + [ticks(path)] == [[0], [1], [2]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.jsonl", "events.jsonl.1", "events.jsonl.2",
                                                          "events.jsonl.3"]


async def test_a_rotation_that_fails_is_an_event_and_writing_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    blocker = tmp_path / "events.jsonl.1"  # a folder where the rotated file must go: the rename fails
    (blocker / "inside").mkdir(parents=True)
    batches = [[{"i": i, "pad": "x" * 60}] for i in range(20)]  # about 12 lines fill 2000 bytes
    told, terminal = await run_writer(path, batches, max_size=2000, keep=1,
                                      between=lambda n: shutil.rmtree(blocker) if n == 15 else None)

    assert [e.name for e in told] == ["log_rotate_failed", "log_rotate_recovered"]  # once per cause
    failed = told[0]
    assert failed.level == "warning" and failed.fields["path"] == str(path)
    assert failed.fields["detail"] == f"{path} -> {blocker}: Is a directory"
    assert 0 < failed.fields["size_bytes"] <= 2000
    assert f"WARNING log_rotate_failed path={path} detail={path} -> " in terminal  # the rest: cut at 160
    # Every line kept, none twice: those written while it failed went on in the same file, which rotated once it could.
    assert ticks(blocker) == list(range(15))
    assert ticks(path) == list(range(15, 20))
    assert [r["event"] for r in read_event_log(path)][:2] == ["tick", "log_rotate_recovered"]
    for file in (blocker, path):
        whole_lines(file)


async def test_only_a_regular_file_is_rotated(tmp_path: Path) -> None:
    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # so the writer's open does not wait for one
    try:
        told, _ = await run_writer(fifo, [[{"i": 0}, {"i": 1}], [{"i": 2}]], max_size=1, keep=2)
        received = os.read(reader, 1 << 16).decode()
    finally:
        os.close(reader)
    assert told == [] and sorted(p.name for p in tmp_path.iterdir()) == ["events.fifo"]
    assert [json.loads(line)["i"] for line in received.splitlines()] == [0, 1, 2]


MODELS = {"chat": {"command": "llama-server", "memory": "1GiB"}}


def test_the_rotation_keys_in_the_config() -> None:
    config = parse_config({"models": MODELS, "log": {"max_size": "1MiB", "keep": 2}})
    assert (config.log.max_size, config.log.keep) == (1024**2, 2)
    defaults = parse_config({"models": MODELS}).log
    assert (defaults.max_size, defaults.keep) == (64 * 1024**2, 5)
    with pytest.raises(ConfigError) as caught:
        parse_config({"models": MODELS, "log": {"max_size": "lots", "keep": 0}})
    assert caught.value.problems == ["log.max_size: must be a size like 16GiB or 8.3GB, got 'lots'",
                                     "log.keep: must be a positive integer, got 0"]


# --- the terminal line


def test_sizes_read_as_sizes_on_the_terminal() -> None:
    assert line_of("stopped", engine="chat", released=8912057139, free=0, per_device=[4 * GIB, 5 * GIB]) == (
        "INFO    stopped        engine=chat released=8.3 GiB free=0 B per_device=[4.0 GiB, 5.0 GiB]")
    # Loads, evictions and readiness read as a sentence, the reason in words.
    assert line_of("load", engine="chat", memory=8912057139, reserved=9341553868, free=0, reason="request", job=1,
                   devices=[0, 1], per_device=[4 * GIB, 5 * GIB], why="a background request waits for it",
                   where="devices 0, 1 (split)") == (
        "INFO    load           chat 8.3 GiB on devices 0, 1 (split): a background request waits for it (free 0 B after)")
    assert line_of("load", engine="chat", memory=GIB, free=GIB, reason="pinned", where=None) == (
        "INFO    load           chat 1.0 GiB: pinned (free 1.0 GiB after)")
    assert line_of("evict", engine="old", memory=2 * GIB, in_flight=0, idle_s=3.412, hot=True,
                   why="to make room for new (needs 4.0 GiB, 1.5 GiB free)") == (
        "INFO    evict          old (2.0 GiB, idle 3.4s, hot): to make room for new (needs 4.0 GiB, 1.5 GiB free)")
    assert line_of("ready", engine="chat", load_s=2.439261, endpoint="http://127.0.0.1:1") == (
        "INFO    ready          chat after 2.4s at http://127.0.0.1:1")
    assert line_of("probe", budget=16 * GIB, budget_text="16 GiB", devices=[{"budget": 8 * GIB, "source": "nvml"}],
                   response_bytes=2048, need=1536) == (
        "INFO    probe          budget=16.0 GiB budget_text=16 GiB devices=[{budget: 8.0 GiB, source: nvml}] "
        "response_bytes=2.0 KiB need=1.5 KiB")
    assert line_of("buffers", engine="chat", devices={"0": {"weights": 2 * GIB, "kv": 1024**2}}) == (
        "INFO    buffers        engine=chat devices={0: {weights: 2.0 GiB, kv: 1.0 MiB}}")
    # Not every field named like a size is one: a count of image jobs; and a flag is no size.
    assert line_of("image_force_release", "warning", released=2) == "WARNING image_force_release released=2"
    assert line_of("measured", engine="x", measured=True, estimate=None) == (
        "INFO    measured       engine=x measured=true estimate=null")


def test_a_command_line_reads_as_a_shell_command_cut_to_about_100_characters() -> None:
    argv = ["/opt/llama.cpp/build/bin/llama-server", "-m", "/models/qwen3/Qwen3-8B-Q4_K_M.gguf", "--alias", "my chat",
            "--port", "40001", "--ctx-size", "8192", "--parallel", "4", "--flash-attn"]
    line = line_of("spawn", engine="chat", argv=argv, pid=7)
    shown = line.removeprefix("INFO    spawn          engine=chat argv=").removesuffix(" pid=7")
    assert len(shown) == 100 and shown.endswith("…")
    assert shown == ("/opt/llama.cpp/build/bin/llama-server -m /models/qwen3/Qwen3-8B-Q4_K_M.gguf --alias 'my chat' "
                     "--port 40001 --ctx-size 8192 --parallel 4 --flash-attn")[:99] + "…"
    assert line_of("spawn", argv=["llama-server", "--port", "1"]) == "INFO    spawn          argv=llama-server --port 1"


def test_long_values_are_cut_and_kept_on_one_line() -> None:
    line = line_of("crash", "error", engine="chat", detail="exited with status 1: " + "z" * 300, failures=1)
    detail = line.removeprefix("ERROR   crash          engine=chat detail=").removesuffix(" failures=1")
    assert len(detail) == 160 and detail.endswith("z…")
    assert line_of("engine_output", "debug", line="\x1b[31mred\x1b[0m\tdone\r\nnext\x9b2J") == (
        "DEBUG   engine_output  line=\\x1b[31mred\\x1b[0m\\tdone\\r\\nnext\\x9b2J")
    listed = line_of("health", "warning", reasons=[f"reason {n}" for n in range(40)])
    assert "\n" not in listed and listed.endswith("…") and len(listed.split("reasons=", 1)[1]) == 160
    assert line_of("listening", urls=["http://127.0.0.1:8080"], ollama=None) == (
        "INFO    listening      urls=[http://127.0.0.1:8080] ollama=null")


REQUEST = {"listener": "openai", "method": "POST", "route": "/v1/chat/completions", "model": "chat",
           "class": "interactive", "status": 200, "error": None, "queued_s": 0.0123, "duration_s": 1.2,
           "prompt_tokens": 12, "completion_tokens": 40, "key": "alice", "request_id": "4f2a9c0d1e3b5a67"}


@pytest.mark.parametrize(("fields", "expected"), [
    ({}, "interactive chat 200 queued 0.01s took 1.20s tokens 12+40 (key alice)"),
    ({"key": None, "queued_s": None, "prompt_tokens": None, "completion_tokens": None}, "interactive chat 200 took 1.20s"),
    ({"status": 499, "error": "client_left", "completion_tokens": None, "key": None},
     "interactive chat 499 client_left queued 0.01s took 1.20s tokens 12+?"),
    ({"method": "GET", "route": "/v1/models", "model": None, "class": None, "queued_s": None, "duration_s": 0.0004,
      "prompt_tokens": None, "completion_tokens": None, "key": None}, "GET /v1/models 200 took 0.00s"),
    ({"model": "gemma3:4b\n\x1b[2J", "class": "batch", "key": None},  # an Ollama name is the client's words
     "batch gemma3:4b\\n\\x1b[2J 200 queued 0.01s took 1.20s tokens 12+40"),
])
def test_a_request_reads_as_one_compact_line(fields: dict[str, Any], expected: str) -> None:
    assert line_of("request", **{**REQUEST, **fields}) == f"INFO    request        {expected}"


# --- the request event


async def test_the_door_emits_one_request_event_per_request_and_none_for_monitoring() -> None:
    send, _ = trio.open_memory_channel[Event](math.inf)
    events = EventLog(send, recent_max=100)
    metrics = StewardMetrics()
    events.listeners.append(metrics.observe)  # a new event name is no trouble for the metrics
    door = FrontDoor(events, UsageLog(None, events, None))

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b'{"usage":{"prompt_tokens":3,"completion_tokens":5}}'
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})

    guarded = front_door(app, door, "openai", lambda scope: None)  # type: ignore[arg-type,return-value]

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}"}

    async def ignore(message: dict[str, Any]) -> None:
        pass

    for path in ("/v1/chat/completions", "/healthz", "/metrics"):
        await guarded({"type": "http", "method": "POST", "path": path, "headers": []}, receive, ignore)
    [request] = [e for e in events.recent if e.name == "request"]
    assert request.level == "info"
    assert {k: v for k, v in request.fields.items() if k not in ("duration_s", "request_id", "ttft_s")} == {
        "listener": "openai", "method": "POST", "route": "/v1/chat/completions", "model": None, "class": None,
        "status": 200, "error": None, "queued_s": None, "prompt_tokens": 3, "completion_tokens": 5, "key": None,
        "decode_tps": None, "slowdown": None, "beside": None, "gpu_s": None,
        "cost": None, "input_chars": None, "audio_s": None}
    assert len(request.fields["request_id"]) == 16 and request.fields["duration_s"] >= request.fields["ttft_s"] >= 0


# --- a real steward


def wait_for(read: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := read()):
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout}s")
        time.sleep(0.02)
    return value


@pytest.mark.slow
def test_a_steward_logs_one_request_line_per_request(start_steward: StewardFactory) -> None:
    steward = start_steward({"chat": fake_model("1GiB")}, gpu={"probe": "none", "budget": "8GiB"})
    client = openai.OpenAI(base_url=steward.base_url, api_key="unused", max_retries=0, timeout=30)
    whole = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    chunks = list(client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hey"}],
                                                 max_tokens=6, stream=True, stream_options={"include_usage": True}))
    streamed = chunks[-1].usage
    assert whole.usage is not None and streamed is not None
    assert httpx.get(f"{steward.url}/healthz", timeout=10).status_code == 200
    assert b"steward_requests" in httpx.get(f"{steward.url}/metrics", timeout=10).content

    requests = wait_for(lambda: len(steward.events("request")) == 2 and steward.events("request"), "request events")
    assert [(r["route"], r["model"], r["class"], r["status"], r["error"], r["prompt_tokens"], r["completion_tokens"])
            for r in requests] == [
        ("/v1/chat/completions", "chat", "interactive", 200, None, u.prompt_tokens, u.completion_tokens)
        for u in (whole.usage, streamed)]
    assert all(r["v"] == 1 and r["level"] == "info" and r["queued_s"] is not None for r in requests)
    assert all(0 < r["gpu_s"] <= r["duration_s"] for r in requests)  # the slot it held, within its time
    assert [r["event"] for r in steward.events() if r.get("route") in ("/healthz", "/metrics")] == []

    # On its terminal: the compact line, as Event.to_line renders the record.
    for record in requests:
        fields = {k: v for k, v in record.items() if k not in RECORD_KEYS}
        expected = Event("request", "info", fields, record["ts"], record["mono"]).to_line()[9:]
        assert expected.startswith(f"INFO    request        interactive chat 200 queued {record['queued_s']:.2f}s")
        wait_for(lambda expected=expected: any(line[9:] == expected
                                                for line in steward.stderr_path.read_text().splitlines()),
                 f"the terminal line {expected!r}")


# --- faults the writer contains (issue 26)


async def test_an_event_log_deleted_under_steward_is_noticed_and_opened_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from supervisor.observe import events as events_module
    from supervisor.observe.events import open_event_log

    monkeypatch.setattr(events_module, "_REOPEN_CHECK_S", 0.0)
    path = tmp_path / "steward.jsonl"
    log, writer = open_event_log(str(path), terminal=io.StringIO())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.serve)
        log.emit("first")
        await trio.testing.wait_all_tasks_blocked()
        path.unlink()
        log.emit("second")  # written into the deleted file, then the file is found gone
        await trio.testing.wait_all_tasks_blocked()
        log.emit("third")
        await trio.testing.wait_all_tasks_blocked()
        log.close()
    writer.close()
    assert [record["event"] for record in read_event_log(path)] == ["log_reopened", "third"]


async def test_an_event_log_that_cannot_be_written_is_an_event_and_so_is_its_recovery(tmp_path: Path) -> None:
    from supervisor.observe.events import open_event_log

    path = tmp_path / "steward.jsonl"
    terminal = io.StringIO()
    log, writer = open_event_log(str(path), terminal=terminal, terminal_level="warning")
    assert writer.sink is not None
    good = writer.sink.file
    writer.sink.file = open("/dev/full", "a")  # noqa: SIM115 - a disk that is full
    seen: list[str] = []
    log.listeners.append(lambda event: seen.append(event.name))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.serve)
        try:
            log.emit("lost")
            await trio.testing.wait_all_tasks_blocked()
            full, writer.sink.file = writer.sink.file, good
            with contextlib.suppress(OSError):  # what it holds cannot be written: the disk is full
                full.close()
            log.emit("kept")
            await trio.testing.wait_all_tasks_blocked()
        finally:
            log.close()
    writer.close()
    assert seen == ["lost", "log_write_failed", "kept", "log_write_recovered"]
    assert "event log " + str(path) + ": cannot write: No space left on device" in terminal.getvalue()
    records = read_event_log(path)
    assert [record["event"] for record in records] == ["kept", "log_write_recovered"]
    assert records[1]["lost"] >= 1


async def test_an_event_the_writer_fails_on_is_the_only_one_lost_and_the_writer_comes_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock) -> None:
    from supervisor.backoff import Backoff
    from supervisor.observe.events import EventLogWriter, open_event_log
    from supervisor.supervise import Supervision, supervise

    write = EventLogWriter._write

    def poisoned(self: EventLogWriter, event: Event) -> None:
        if event.name == "poison":
            raise RuntimeError("an event the writer cannot take")
        write(self, event)

    monkeypatch.setattr(EventLogWriter, "_write", poisoned)
    path = tmp_path / "steward.jsonl"
    log, writer = open_event_log(str(path), terminal=io.StringIO())
    async with trio.open_nursery() as nursery:
        await nursery.start(supervise, Supervision(log, Backoff(1.0, 1.0)), "event log writer", writer.serve)
        log.emit("before")
        log.emit("poison")
        log.emit("after")
        await trio.sleep(5.0)
        log.close()
    writer.close()
    names = [record["event"] for record in read_event_log(path)]
    assert names == ["before", "after", "task_failed", "task_restarted"]
