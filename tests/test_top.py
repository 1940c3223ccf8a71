"""``steward top``: the view as text (a state built by the admin API's own function, and one
written by hand), the keys and the pause, ``--once`` against a real steward (keys, refusals,
an unreachable one), and the live view in a private tmux server, driven by its keys."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import pytest
from rich.console import Console

from supervisor.auth.keys import add_key
from supervisor.cli import main
from supervisor.observe.events import Event
from supervisor.gateway.admin import admin_state
from supervisor.observe.health import Health, HealthStatus
from supervisor.scheduler.core import Scheduler
from supervisor.scheduler.types import EngineProfile, SchedulingPolicy
from supervisor.top.client import admin_url
from supervisor.top.model import Top, merge_events
from supervisor.top.view import Frame, Screen, render_frame, split_bar
from tests.conftest import ROOT, StewardFactory, fake_model, free_port

GIB = 1024**3
URL = "http://127.0.0.1:8080"
WALL = 1_800_000_000.0  # the scheduler's time 0 on the wall clock


def screen(frame: Frame, width: int = 80, height: int = 24) -> list[str]:
    """The picture as the pane shows it, one string per line."""
    console = Console(width=width, height=height, record=True, force_terminal=False)
    console.print(render_frame(frame, width=width, height=height))
    return [line.rstrip() for line in console.export_text().splitlines()]


def clock(wall: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(wall))


def hot_ollama_state() -> dict[str, Any]:
    """The issue's case, through the scheduler and admin_state: Ollama was used interactively,
    so it is hot for 5 minutes, and a background request may not evict it."""
    s = Scheduler.create(10 * GIB, [EngineProfile("ollama", 8 * GIB, 4), EngineProfile("gemma4-e2b", 4 * GIB, 1)],
                         SchedulingPolicy(hot_window=300.0))
    s.wall_offset = WALL
    s.submit(1, "ollama", "interactive", 0.0)
    s.engine_ready("ollama", s.engines["ollama"].generation, "http://127.0.0.1:9000", 0.5)
    s.finish(1, 1.0)
    s.submit(2, "gemma4-e2b", "background", 10.0, timeout=600)
    recent = [Event("request", "info", {"class": "interactive", "model": "ollama", "status": 200, "queued_s": 0.0,
                                        "duration_s": 0.5}, WALL + 1, 1.0),
              Event("reject", "warning", {"model": "gemma4-e2b", "reason": "queue_full"}, WALL + 12, 12.0),
              Event("mode", "debug", {"gpu": "idle"}, WALL + 13, 13.0)]
    health = Health(HealthStatus.OK, (), {}, {}, {})
    return json.loads(json.dumps(admin_state(s.snapshot(explained=True), health, recent, "gpu", now=20.0, wall=WALL + 20.0)))


WHY = ("background request for gemma4-e2b waits: needs 4.0 GiB, 2.0 GiB free; the only idle engine (ollama) "
       f"is hot until {clock(WALL + 301)}")


def busy_state() -> dict[str, Any]:
    """Written by hand: two devices, every tier, engines in every state, long names and a long reason."""
    def engine(name: str, status: str, **fields: Any) -> dict[str, Any]:
        return {"name": name, "status": status, "draining": False, "in_flight": 0, "slots": 2, "queued": 0,
                "memory": 2 * GIB, "reserved": 0, "measured": 0, "pinned": False, "hot": False, "hot_until": None,
                "idle_s": None, "generation": 0, "failures": 0, "healthy": True, "devices": [], **fields}

    tiers = {"pinned": 4 * GIB, "hot": 3 * GIB, "cold": 2 * GIB, "asleep": GIB, "freeing": GIB, "exclusive": GIB}
    empty = dict.fromkeys(tiers, 0)
    return {
        "version": 1, "time": WALL, "mode": "background",
        "health": {"status": "degraded", "reasons": ["engine flaky failed 3 times"]},
        "devices": [{"device": "gpu0", "budget": 16 * GIB, "reserved": 12 * GIB, "outside": GIB, "free": 3 * GIB,
                     "tiers": tiers},
                    {"device": "gpu1", "budget": 8 * GIB, "reserved": 0, "outside": 0, "free": 8 * GIB,
                     "tiers": empty}],
        "engines": [
            engine("qwen2.5-coder-32b-instruct-q4-k-m-with-a-very-long-name", "ready", in_flight=2, queued=7,
                   reserved=4 * GIB, measured=4 * GIB, generation=3, failures=1, devices=["gpu0", "gpu1"],
                   hot=True, hot_until=WALL + 250),
            engine("chat", "ready", pinned=True, reserved=4 * GIB, idle_s=12.5, generation=1, devices=["gpu0"]),
            engine("old", "draining", draining=True, reserved=GIB, generation=2, devices=["gpu0"]),
            engine("flaky", "failed", failures=3, generation=4),
            engine("sick", "ready", healthy=False, reserved=GIB, generation=1, devices=["gpu0"]),
        ],
        "classes": {"interactive": {"queued": 0, "running": 2, "oldest_wait_s": None},
                    "background": {"queued": 7, "running": 0, "oldest_wait_s": 42.0},
                    "batch": {"queued": 0, "running": 0, "oldest_wait_s": None}},
        "waiting": [{"class": "background", "model": "qwen2.5-coder-32b-instruct-q4-k-m-with-a-very-long-name",
                     "waiting": 7, "waited_s": 42.0, "reason": "no_slot",
                     "why": "background request for qwen2.5-coder-32b-instruct-q4-k-m-with-a-very-long-name waits: "
                            + "all 2 slot(s) are busy and " * 20 + "that is all"}],
        "rejections": [{"ts": WALL - 5, "v": 1, "event": "reject", "level": "warning", "reason": "queue_full",
                        "model": "chat"}],
        "events": [{"ts": WALL - i, "mono": -i, "v": 1, "event": "spawn", "level": "info", "engine": f"e{i}",
                    "memory": GIB, "argv": ["llama-server", "--model", "/models/" + "x" * 300]}
                   for i in range(40, 0, -1)],
    }


def test_a_bar_shares_its_cells_out_in_proportion_and_shows_every_tier_that_holds_memory() -> None:
    assert split_bar([8, 2, 0, 6], 16) == [8, 2, 0, 6]
    assert split_bar([1, 1, 1], 10) == [4, 3, 3]  # largest remainders, ties to the first
    assert split_bar([1000, 1, 0], 10) == [9, 1, 0]  # a sliver still gets its cell
    assert split_bar([0, 0], 10) == [0, 0] and split_bar([5], 0) == [0]


def test_the_issue_case_reads_at_80_columns_why_a_request_waits_in_words() -> None:
    state = hot_ollama_state()
    lines = screen(Frame(URL, state, state["events"]))
    assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
    assert lines[0].startswith(f"steward 127.0.0.1:8080  {clock(WALL + 20)}  mode idle  health ok")
    bar = "▓" * 40 + "·" * 10
    assert lines[1:3] == [f"gpu0 {bar} 2.0 GiB free of 10.0 GiB", "     ▓ hot 8.0 GiB  · free 2.0 GiB"]
    assert lines[3].split() == ["ENGINE", "STATE", "SLOTS", "QUEUE", "RESERVED", "IDLE", "GEN", "RESTARTS",
                                "DEVICES", "HOT", "UNTIL"]
    assert lines[4].split() == ["ollama", "ready", "0/4", "0", "8.0", "GiB", "19s", "1", "0", "gpu0",
                                clock(WALL + 301)]
    assert lines[5].split() == ["gemma4-e2b", "stopped", "0/1", "1", "-", "-", "0", "0", "-", "-"]
    at = lines.index("background     1 queued    0 running   oldest 10s")
    assert lines[at - 1] == "interactive    0 queued    0 running"
    # The reason, whole, on two lines under its class: the point of the view.
    assert lines[at + 1].startswith("     10s ×1   background request for gemma4-e2b waits:")
    assert lines[at + 2].startswith(" " * 14) and f"{lines[at + 1][14:]} {lines[at + 2][14:]}" == WHY
    assert lines[at + 3] == "batch          0 queued    0 running"
    assert lines[at + 4:at + 6] == ["REJECTED", f"{clock(WALL + 12)} WARNING reject         model=gemma4-e2b "
                                                "reason=queue_full"]
    # The keys do not fit beside the header at 80 columns: they go on the events' title.
    assert lines[at + 6].startswith("EVENTS") and lines[at + 6].endswith("p pause  e events  q quit")
    assert [line.split()[2] for line in lines[at + 7:]] == ["request", "reject"]  # no debug event


def test_a_wide_pane_shows_more_every_tier_the_planned_memory_and_how_long_an_engine_stays_hot() -> None:
    state = hot_ollama_state()
    lines = screen(Frame(URL, state, state["events"]), width=140, height=30)
    assert all(len(line) <= 140 for line in lines)
    assert lines[0].endswith("p pause  e events  q quit")
    assert lines[2] == ("     █ pinned 0 B  ▓ hot 8.0 GiB  ▒ cold 0 B  ░ asleep 0 B  ▞ being freed 0 B  "
                        "▚ exclusive 0 B  ▄ outside steward 0 B  · free 2.0 GiB")
    assert "NEEDS" in lines[3] and "MEASURED" in lines[3]
    assert lines[4].split()[4:8] == ["8.0", "GiB", "8.0", "GiB"] and lines[4].endswith(
        f"{clock(WALL + 301)} (in 5m)")
    assert f"     10s ×1   {WHY}" in lines  # one line: it fits


def test_remote_models_have_a_row_each_under_the_engines_with_their_places_and_waiters() -> None:
    state = {**hot_ollama_state(), "remote": [
        {"name": "cloud-small", "upstream": "https://api.example.com/v1", "api": "openai", "memory": 0,
         "max_concurrency": 4, "in_flight": 3, "waiting": 2}]}
    lines = screen(Frame(URL, state, state["events"]), height=30)
    at = next(i for i, line in enumerate(lines) if line.startswith("CLOUD"))
    assert lines[at].split() == ["CLOUD", "PLACES", "WAITING", "UPSTREAM"]
    assert lines[at + 1].split() == ["cloud-small", "3/4", "2", "https://api.example.com/v1"]
    assert lines[at - 1].split()[0] == "gemma4-e2b"  # right under the engines


def test_video_jobs_queued_or_being_made_have_a_row_each_with_how_far_they_are() -> None:
    state = {**hot_ollama_state(), "videos": [
        {"id": "video_0123456789abcdef", "model": "clip", "status": "in_progress", "progress": 45, "owner": "alice"},
        {"id": "video_fedcba9876543210", "model": "clip", "status": "queued", "progress": 0, "owner": None}]}
    lines = screen(Frame(URL, state, state["events"]), height=30)
    at = next(i for i, line in enumerate(lines) if line.startswith("VIDEO JOB"))
    assert lines[at].split() == ["VIDEO", "JOB", "MODEL", "STATE", "DONE", "KEY"]
    assert lines[at + 1].split() == ["video_0123456789abcdef", "clip", "in_progress", "45%", "alice"]
    assert lines[at + 2].split() == ["video_fedcba9876543210", "clip", "queued", "0%", "-"]


def test_long_names_and_reasons_are_cut_never_wrapped_and_the_priorities_hold_in_a_short_pane() -> None:
    state = busy_state()
    frame = Frame(URL, state, state["events"])
    lines = screen(frame)
    assert len(lines) == 24 and all(len(line) <= 80 for line in lines)
    assert lines[1] == "health: engine flaky failed 3 times"
    assert lines[2].startswith("gpu0 █") and lines[2].endswith(" 3.0 GiB free of 16.0 GiB")
    assert [lines[2].count(glyph) > 0 for glyph in "█▓▒░▞▚▄·"] == [True] * 8
    assert lines[3].split()[::4] == ["█", "▓", "▒", "░", "▞"] and lines[3].endswith("being…")  # cut at the edge
    assert lines[4] == "gpu1 " + "·" * 50 + " 8.0 GiB free of 8.0 GiB"  # as long as gpu0's bar
    long_row = next(line for line in lines if line.startswith("qwen2.5"))
    assert "…" in long_row.split()[0] and "gpu0,gpu1" in long_row and long_row.split()[1:4] == ["ready", "2/2", "7"]
    states = {line.split()[0]: line.split()[1] for line in lines[7:12]}
    assert states == {"chat": "ready", "old": "draining", "flaky": "failed", "sick": "unhealthy"} | {
        long_row.split()[0]: "ready"}
    why = [line for line in lines if line.startswith("     42s ×7")]
    assert len(why) == 1 and lines[lines.index(why[0]) + 1].endswith(" …")  # two lines, cut, not more
    assert all(not line.startswith(" " * 14 + "that is all") for line in lines)
    events = lines[lines.index(next(line for line in lines if line.startswith("EVENTS"))) + 1:]
    assert events and all(line.endswith("…") for line in events)  # the last ones, one line each
    assert events[-1].split()[2:4] == ["spawn", "engine=e1"]

    short = screen(frame, height=14)  # too short for everything: events go first, then engines
    assert len(short) == 14 and short[0].startswith("steward") and short[2].startswith("gpu0")
    assert not any(line.startswith("EVENTS") for line in short)
    assert any(line.startswith("     42s ×7") for line in short)
    assert short[short.index(next(line for line in short if line.startswith("ENGINE"))) + 2].startswith("+4 more")


def test_the_events_screen_the_pause_and_an_unreachable_steward() -> None:
    state = busy_state()
    events = screen(Frame(URL, state, state["events"], screen=Screen.EVENTS), width=100, height=30)
    assert len(events) == 30 and events[0].endswith("e back  q quit")
    assert [line.split()[3] for line in events[1:]] == [f"engine=e{i}" for i in range(29, 0, -1)]
    assert screen(Frame(URL, state, paused=True))[0].endswith("health degraded      PAUSED")  # no room for more
    assert screen(Frame(URL, state, paused=True), width=120)[0].endswith("PAUSED  j/k select  p resume  e events  q quit")
    problem = "cannot reach steward at http://127.0.0.1:8080: nothing answers there; trying again every second"
    assert screen(Frame(URL, problem=problem))[:2] == [
        "steward 127.0.0.1:8080" + " " * 33 + "p pause  e events  q quit", problem[:79] + "…"]
    assert screen(Frame(URL))[1] == "waiting for steward's first answer"
    # A document of another shape draws what it can, never a traceback.
    odd = {"engines": [1, {"name": "two\nlines", "slots": "many"}], "devices": "gpu0", "health": None,
           "classes": {"batch": 5, "interactive": {"queued": 1}},
           "waiting": [{"class": "interactive", "why": "a reason\non two lines"}], "events": [{"ts": "soon"}]}
    lines = screen(Frame(URL, odd, odd["events"]))
    assert lines[1:6] == ["ENGINE    STATE SLOTS QUEUE RESERVED IDLE GEN RESTARTS DEVICES HOT UNTIL",
                          "two lines ?       -/-     -        -    -   -        - -       -",
                          "interactive    1 queued    - running", "       - ×-   a reason on two lines", "EVENTS"]
    assert lines[6].split()[1:] == ["INFO", "?"]


def test_keys_pause_the_picture_while_the_data_goes_on_and_events_are_kept_once() -> None:
    top = Top(URL)
    state = hot_ollama_state()
    top.saw_state(state)
    assert [e["event"] for e in top.events] == ["request", "reject"]  # in time order, no debug
    assert top.press("p") and top.frame().paused
    top.saw_state({**state, "mode": "batch"})
    top.saw_event({"ts": WALL + 30, "mono": 30.0, "event": "load", "level": "info", "engine": "gemma4-e2b"})
    held = top.frame()
    assert held.state == state and len(held.events) == 2  # the picture as it was when p was pressed
    assert top.press("e") and top.frame().screen is Screen.EVENTS and top.frame().paused
    assert top.press("P") and top.frame().state["mode"] == "batch" and len(top.frame().events) == 3
    assert top.press("x") and top.press("e") and top.frame().screen is Screen.OVERVIEW
    assert not top.press("q")
    top.failed("cannot reach steward")
    assert top.frame().problem == "cannot reach steward"
    top.saw_state(state)
    assert top.frame().problem is None
    # The state's recent events and the stream overlap: each once, however often seen.
    seen = merge_events([], state["events"] * 2 + [{"event": "mode", "level": "debug", "ts": 1.0}])
    assert merge_events(seen, state["events"]) == seen and len(seen) == 2
    assert len(merge_events([], ({"ts": float(i), "event": "e"} for i in range(600)), limit=500)) == 500


def test_addresses_as_people_give_them() -> None:
    assert admin_url("127.0.0.1:8080") == "http://127.0.0.1:8080"
    assert admin_url(" http://gpu-box:8080/v1/ ") == "http://gpu-box:8080"  # the OpenAI base URL
    assert admin_url("https://steward.lan/proxy/") == "https://steward.lan/proxy"
    for bad in ("ftp://x:1", "http://", "http://[::1"):
        with pytest.raises(ValueError, match="is not"):
            admin_url(bad)


# --- against a real steward --------------------------------------------------------------------

def top_command(*args: str) -> subprocess.CompletedProcess[str]:
    """``steward top`` as a user runs it: its own process, no terminal, $COLUMNS set."""
    return subprocess.run([sys.executable, "-m", "supervisor.cli", "top", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, env={**os.environ, "COLUMNS": "100"})


def top_here(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """The same in this process (it saves a second of imports a run): exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ, {"COLUMNS": "100", **(env or {})}), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        status = main(["top", *args])
    return status, out.getvalue(), err.getvalue()


def ask(url: str, model: str, key: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{url}/v1/chat/completions", headers=headers, timeout=60,
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})


@pytest.mark.slow
def test_once_prints_one_frame_of_a_running_steward(start_steward: StewardFactory, tmp_path: Path) -> None:
    steward = start_steward({"chat": fake_model("4GiB"), "embed": fake_model("2GiB")},
                            gpu={"probe": "none", "budget": "16GiB"})
    assert ask(steward.url, "chat").status_code == 200
    done = top_command("--once", steward.url)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"steward {steward.url.removeprefix('http://')}")
    assert all(len(line) <= 100 for line in lines) and "\x1b" not in done.stdout  # no terminal: no colours
    assert lines[1].startswith("cpu ▓") and lines[1].endswith("12.0 GiB free of 16.0 GiB")  # probe none: no GPU
    rows = {line.split()[0]: line.split() for line in lines if line.split() and line.split()[0] in ("chat", "embed")}
    assert rows["chat"][1:4] == ["ready", "0/2", "0"] and rows["embed"][1] == "stopped"
    assert any(" request " in line and "interactive chat 200" in line for line in lines)
    # The address from a config (its listen), and nothing at all there.
    config = tmp_path / "other.yaml"
    port = free_port()
    config.write_text(f"listen: 0.0.0.0:{port}\nmodels:\n  m:\n    command: [x]\n    memory: 1GiB\n")
    assert top_here("--once", "--config", str(config)) == (1, "", (
        f"steward top: cannot reach steward at http://127.0.0.1:{port}: nothing answers there (is steward running?)\n"))
    assert top_here("--once", "--config", str(tmp_path / "none.yaml"))[0] == 2
    assert top_here("--once", "ftp://x")[2].startswith("steward top: 'ftp://x' is not steward's address")


@pytest.mark.slow
def test_once_needs_an_admin_key_once_keys_are_configured(start_steward: StewardFactory, tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    admin, user = add_key(keys, "ops", admin=True), add_key(keys, "app")
    steward = start_steward({"chat": fake_model("1GiB")}, gpu={"probe": "none", "budget": "8GiB"},
                            auth={"keys_file": str(keys)})
    status, out, err = top_here("--once", steward.url)
    assert (status, out) == (2, "") and err == (
        f"steward top: {steward.url} refused the admin API (401): steward has API keys: pass --key or set "
        "STEWARD_KEY (an admin key) (steward says: This request needs an API key: send `Authorization: Bearer KEY` or "
        "`x-api-key: KEY`.)\n")
    status, _, err = top_here("--once", steward.url, "--key", user)
    assert status == 2 and "(403): top needs an admin key: make one with `steward keys add NAME --admin" in err
    assert "Key 'app' is not an admin key" in err
    status, _, err = top_here("--once", steward.url, "--key", "sk-not-a-key")
    assert status == 2 and "(401): the key given (--key or $STEWARD_KEY) is not one steward knows" in err
    status, out, _ = top_here("--once", steward.url, env={"STEWARD_KEY": admin})
    assert status == 0 and out.startswith("steward ")


# --- the live view in tmux ---------------------------------------------------------------------

@pytest.fixture
def tmux() -> Iterator[Callable[..., str]]:
    """A private tmux server; the function runs a tmux command on it and returns its output."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    server = ["tmux", "-L", f"top-test-{os.getpid()}", "-f", "/dev/null"]

    def run(*args: str, check: bool = True) -> str:
        return subprocess.run([*server, *args], capture_output=True, text=True, check=check, timeout=30).stdout

    try:
        yield run
    finally:
        subprocess.run([*server, "kill-server"], capture_output=True, timeout=30)


def wait_pane(tmux: Callable[..., str], seen: Callable[[str], bool], what: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    pane = ""
    while time.monotonic() < deadline:
        pane = tmux("capture-pane", "-p", "-t", "top", check=False)
        if seen(pane):
            return pane
        time.sleep(0.05)
    raise AssertionError(f"the pane never showed {what}:\n{pane}")


@pytest.mark.slow
def test_the_live_view_in_tmux_follows_steward_and_answers_its_keys(start_steward: StewardFactory,
                                                                    tmux: Callable[..., str]) -> None:
    steward = start_steward({"chat": fake_model("4GiB"), "embed": fake_model("2GiB")},
                            gpu={"probe": "none", "budget": "16GiB"})
    command = f"{sys.executable} -m supervisor.cli top {steward.url}"
    tmux("new-session", "-d", "-s", "top", "-x", "100", "-y", "30", "-c", str(ROOT), command)

    def row(pane: str, engine: str) -> list[str]:
        return next((line.split() for line in pane.splitlines() if line.startswith(engine + " ")), [])

    pane = wait_pane(tmux, lambda p: "ENGINE" in p and row(p, "chat")[1:2] == ["stopped"], "the engine table")
    assert pane.splitlines()[0].endswith("p pause  e events  q quit")  # 100 columns: the keys fit
    assert ask(steward.url, "chat").status_code == 200
    # The events panel (a stream) may show the request's line before the next state poll shows it done.
    pane = wait_pane(tmux, lambda p: row(p, "chat")[1:4] == ["ready", "0/2", "0"] and "interactive chat 200" in p,
                     "chat loaded, its request done")
    assert row(pane, "chat")[5] == "GiB"
    tmux("send-keys", "-t", "top", "p")
    pane = wait_pane(tmux, lambda p: "PAUSED" in p.splitlines()[0], "PAUSED")
    tmux("send-keys", "-t", "top", "e")
    pane = wait_pane(tmux, lambda p: "e back" in p.splitlines()[0], "the events screen")
    assert "ENGINE" not in pane and " ready " in pane and "PAUSED" in pane
    tmux("send-keys", "-t", "top", "q")
    deadline = time.monotonic() + 30
    while "top" in tmux("list-sessions", "-F", "#{session_name}", check=False).split():
        assert time.monotonic() < deadline, "top did not quit on q"
        time.sleep(0.05)
