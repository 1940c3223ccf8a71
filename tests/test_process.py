"""Child processes: process groups, SIGTERM then SIGKILL after the grace, pipes drained."""

from __future__ import annotations

import os
import sys
import textwrap

import trio

from supervisor.process import describe_exit, open_child, pump_lines, stop_child

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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"
