"""Child processes: process groups, SIGTERM then SIGKILL after the grace, pipes drained;
the reaper, which kills what a child left in its group when its parent dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable

import pytest
import trio

from supervisor.engines.process import describe_exit, open_child, pump_lines, stop_child
from supervisor.engines.reaper import Reaper, reaper_argv
from tests.conftest import ROOT, descendants

pytestmark = pytest.mark.slow  # every test here starts child processes

STUBBORN = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
    print("ready", child.pid, flush=True)
    time.sleep(60)
""")


async def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_with_its_whole_group() -> None:
    process = open_child([sys.executable, "-c", STUBBORN])
    lines: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump_lines, process.output, lines.append)
        with trio.fail_after(10):
            while not lines:
                await trio.sleep(0.02)
        grandchild = int(lines[0].split()[1])
        started = trio.current_time()
        status = await stop_child(process, grace=0.5)
        assert trio.current_time() - started >= 0.5  # it had its grace
        assert describe_exit(status) == "killed by SIGKILL"
        with trio.fail_after(5):
            while _alive(grandchild):
                await trio.sleep(0.02)
    await process.output.aclose()


async def test_a_child_that_honours_sigterm_stops_within_the_grace() -> None:
    process = open_child([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"])
    lines: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump_lines, process.output, lines.append)
        with trio.fail_after(10):
            while not lines:
                await trio.sleep(0.02)
        status = await stop_child(process, grace=5.0)
    assert describe_exit(status) == "killed by SIGTERM"
    await process.output.aclose()


async def test_output_is_drained_line_by_line_even_when_it_is_large() -> None:
    process = open_child([sys.executable, "-c", "import sys\nfor i in range(20000): print('line', i)\nprint('partial', end='')"])
    lines: list[str] = []
    with trio.fail_after(20):
        await pump_lines(process.output, lines.append)
        assert await process.wait() == 0
    assert len(lines) == 20001 and lines[-2] == "line 19999" and lines[-1] == "partial"
    await process.output.aclose()


async def test_a_leader_that_exits_by_itself_takes_what_it_left_in_its_group_with_it() -> None:
    process = open_child(["sh", "-c", "sleep 60 & echo $!"])
    lines: list[str] = []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump_lines, process.output, lines.append)
            assert await process.wait() == 0
        # The output ended too: the sleep held it open until it was killed.
        while _alive(int(lines[0])):
            await trio.sleep(0.02)
    await process.output.aclose()


# A parent that spawns through a wrapper that does not exec: the sleep is a grandchild.
PARENT = textwrap.dedent("""
    import json, sys
    from supervisor.engines.process import open_child
    for _ in sys.stdin:
        print(json.dumps(open_child(["sh", "-c", "sleep 60; echo bye"]).take_reaper_warnings()), flush=True)
""")


def test_a_wrappers_child_dies_with_a_parent_killed_by_sigkill() -> None:
    with _start_parent() as parent:
        assert _spawn_in(parent) == []
        grandchild = _wait_for_sleeps(parent, 1)[0]
        parent.kill()
    wait_until(lambda: not _alive(grandchild))


def test_a_dead_reaper_is_replaced_and_told_every_group_again() -> None:
    with _start_parent() as parent:
        _spawn_in(parent)
        [first_reaper] = _reapers_of(parent.pid)
        os.kill(first_reaper, signal.SIGKILL)
        wait_until(lambda: not _alive(first_reaper))
        [warning] = _spawn_in(parent)
        assert f"the reaper (pid {first_reaper}) had been killed by SIGKILL" in warning
        assert "watches 2 groups" in warning
        grandchildren = _wait_for_sleeps(parent, 2)
        [second_reaper] = _reapers_of(parent.pid)
        assert second_reaper != first_reaper
        parent.kill()
    wait_until(lambda: not any(_alive(pid) for pid in grandchildren))


def test_the_reaper_kills_a_watched_group_when_its_pipe_closes_and_spares_a_forgotten_one() -> None:
    watched, forgotten = _start_group(), _start_group()
    reaper = subprocess.Popen(reaper_argv(), stdin=subprocess.PIPE)
    assert reaper.stdin is not None
    reaper.stdin.write(f"+{watched.pid}\n+{forgotten.pid}\n-{forgotten.pid}\n".encode())
    reaper.stdin.close()  # as when steward dies
    assert reaper.wait(timeout=20) == 0
    assert watched.wait(timeout=20) == -signal.SIGKILL
    assert forgotten.poll() is None  # the reaper is gone: it did all it will ever do
    forgotten.kill()
    forgotten.wait()


def test_the_reaper_ignores_the_signals_a_terminal_sends_its_foreground_group() -> None:
    group = _start_group()
    reaper = subprocess.Popen(reaper_argv(), stdin=subprocess.PIPE)
    assert reaper.stdin is not None
    reaper.stdin.write(f"+{group.pid}\n".encode())
    reaper.stdin.flush()
    terminal_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    wait_until(lambda: all(_ignores(reaper.pid, signum) for signum in terminal_signals))
    for signum in terminal_signals:
        reaper.send_signal(signum)
    reaper.stdin.close()
    assert reaper.wait(timeout=20) == 0  # it outlived the signals to do its job
    assert group.wait(timeout=20) == -signal.SIGKILL


async def test_the_reaper_exits_once_the_last_child_is_stopped() -> None:
    process = open_child([sys.executable, "-c", "import time; time.sleep(60)"])
    [reaper] = _reapers_of(os.getpid())
    await stop_child(process, grace=5.0)
    with trio.fail_after(20):
        while _alive(reaper):
            await trio.sleep(0.02)
    await process.output.aclose()


def test_forgetting_the_last_group_lets_the_reaper_go_and_spares_the_group() -> None:
    group = _start_group()
    reaper = Reaper()
    assert reaper.watch(group.pid) is None
    running = reaper.pid
    assert running is not None
    assert reaper.forget(group.pid) is None
    assert reaper.pid is None
    wait_until(lambda: not _alive(running))
    assert group.poll() is None  # the reaper is gone: it did all it will ever do
    group.kill()
    group.wait()


def test_a_reaper_that_stops_reading_is_replaced_without_blocking_the_caller() -> None:
    group = _start_group()
    reaper = Reaper()
    assert reaper.watch(group.pid) is None
    stuck = reaper.pid
    assert stuck is not None
    os.kill(stuck, signal.SIGSTOP)
    # Each watch writes a line; once the stuck reaper's pipe is full, the next one gives up on it.
    warning = next(filter(None, (reaper.watch(group.pid) for _ in range(100_000))))
    assert f"the reaper (pid {stuck}) stopped reading, so it was killed" in warning
    wait_until(lambda: not _alive(stuck))
    replacement = reaper.pid
    assert replacement is not None and replacement != stuck
    assert reaper.forget(group.pid) is None  # the last group: the new reaper exits, sparing it
    wait_until(lambda: not _alive(replacement))
    assert group.poll() is None
    group.kill()
    group.wait()


def wait_until(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def _start_parent() -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", PARENT], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def _spawn_in(parent: subprocess.Popen[str]) -> list[str]:
    """Have *parent* spawn one wrapper; returns the reaper warnings it got."""
    assert parent.stdin is not None and parent.stdout is not None
    parent.stdin.write("spawn\n")
    parent.stdin.flush()
    return json.loads(parent.stdout.readline())


def _wait_for_sleeps(parent: subprocess.Popen[str], count: int) -> list[int]:
    def sleeps() -> list[int]:
        return [pid for pid, cmdline in descendants(parent.pid) if cmdline == "sleep 60"]

    wait_until(lambda: len(sleeps()) == count)
    return sleeps()


def _reapers_of(pid: int) -> list[int]:
    return [child for child, cmdline in descendants(pid) if "supervisor/engines/reaper.py" in cmdline]


def _start_group() -> subprocess.Popen[bytes]:
    """A process leading its own group, as open_child's children do."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)


def _ignores(pid: int, signum: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        ignored = next(int(line.split()[1], 16) for line in f if line.startswith("SigIgn:"))
    return bool(ignored & (1 << (signum - 1)))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):  # reaped since the kill(0): gone
        return False
