"""The live loop of ``steward top``, and ``--once``.

One nursery holds six tasks around one ``Top``: the event follower (``/admin/events``: each
event is drawn at once and asks for a fresh state), the state poller (``/admin/state`` at
least once a second, and shortly after a burst of events, once for the burst), the history
poller (``/admin/history`` every 10 s, for the sparklines), the key
reader, the asker (what a key asks of steward: an engine unloaded, pinned, its output
followed; as ``steward unload|pin|unpin|logs`` ask it, the outcome a line on the screen), and
the drawer, which redraws whenever one of them nudges it. Signals that end a
pane (Ctrl-C, SIGTERM, tmux's SIGHUP) quit the way ``q`` does, so the terminal is always put
back. A refused key ends top (exit 2); an unreachable steward is said on the screen and
tried again.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import sys
from typing import Any

import attrs
import httpx
import trio
from rich.console import Console
from rich.live import Live

from supervisor.control.calls import ActionNotDone, act, follow_engine_logs
from supervisor.top.client import (
    AdminRefused,
    Unreachable,
    fetch_history,
    fetch_state,
    follow_events,
    open_admin_client,
)
from supervisor.top.keys import cbreak, read_keys
from supervisor.top.model import Ask, LogPane, Top
from supervisor.top.view import render_frame

EXIT_OK = 0
EXIT_UNREACHABLE = 1
EXIT_REFUSED = 2
LOG_LINES = 200  # of the followed engine's output, shown first
ACT_WAIT_S = 5.0  # an action is done once steward accepts it: this bounds only that answer
POLL_S = 1.0  # the state is fetched at least this often: idle times and waits move on
HISTORY_S = 10.0  # the history, as often as steward samples it
SETTLE_S = 0.2  # after an event, wait this long for the rest of its burst before fetching
RETRY_S = 1.0
FRAME_S = 0.05  # at most 20 pictures a second, however fast events come (a load test's requests)


@attrs.define(eq=False)
class Nudge:
    """A wake-up that coalesces: any number of ``nudge`` calls before ``wait`` returns are one."""

    _event: trio.Event = attrs.Factory(trio.Event)

    def nudge(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
        self._event = trio.Event()  # whatever changed before this is drawn by the caller next


def run_live(url: str, key: str | None) -> int:
    if not sys.stdout.isatty():
        print("steward top: the live view needs a terminal; `steward top --once` prints one frame", file=sys.stderr)
        return EXIT_REFUSED
    fd = sys.stdin.fileno() if sys.stdin.isatty() else None
    console = Console()
    with contextlib.ExitStack() as stack:
        if fd is not None:
            stack.enter_context(cbreak(fd))
        live = stack.enter_context(Live(console=console, screen=True, auto_refresh=False, redirect_stdout=False,
                                        redirect_stderr=False))
        refusal = None
        try:
            refusal = trio.run(serve_top, Top(url), key, live, fd)
        except* KeyboardInterrupt:
            pass  # Ctrl-C before the signal handler was in place: a quit like any other
    if refusal is not None:
        print(f"steward top: {refusal}", file=sys.stderr)
        return EXIT_REFUSED
    return EXIT_OK


async def serve_top(top: Top, key: str | None, live: Live, fd: int | None) -> str | None:
    """Show *top* live until a key or a signal says quit; why steward refused, if it did."""
    redraw, refetch = Nudge(), Nudge()
    refused: list[AdminRefused] = []
    try:
        async with open_admin_client(key) as client, trio.open_nursery() as nursery:
            await nursery.start(serve_drawing, top, live, redraw)
            await nursery.start(quit_on_signals, nursery.cancel_scope, redraw)
            await nursery.start(poll_state, top, client, redraw, refetch)
            await nursery.start(poll_history, top, client, redraw)
            await nursery.start(follow_steward, top, client, redraw, refetch)
            if fd is not None:
                asks_send, asks = trio.open_memory_channel[Ask](math.inf)
                await nursery.start(serve_asks, top, key, asks, redraw, refetch)
                await nursery.start(serve_keys, top, fd, redraw, nursery.cancel_scope, refetch, asks_send)
    except* AdminRefused as group:
        refused.extend(exc for exc in group.exceptions if isinstance(exc, AdminRefused))
    return str(refused[0]) if refused else None


async def serve_drawing(top: Top, live: Live, redraw: Nudge, *,
                        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    task_status.started()
    while True:
        # The pane's own size, read each time (it may have been resized): $COLUMNS and $LINES,
        # which rich would believe first, may be stale or another pane's.
        size = os.get_terminal_size(live.console.file.fileno())
        live.console.size = (size.columns, size.lines)
        live.update(render_frame(top.frame(), width=size.columns, height=size.lines), refresh=True)
        await trio.sleep(FRAME_S)
        await redraw.wait()


async def quit_on_signals(done: trio.CancelScope, redraw: Nudge, *,
                          task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGWINCH) as signals:
        task_status.started()
        async for signum in signals:
            if signum == signal.SIGWINCH:
                redraw.nudge()
            else:
                done.cancel(reason=f"{signal.Signals(signum).name}: quit")


async def poll_state(top: Top, client: httpx.AsyncClient, redraw: Nudge, refetch: Nudge, *,
                     task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    task_status.started()
    while True:
        node = top.node  # the picture asked for: the steward's, or one of its nodes' (told with the answer)
        try:
            top.saw_state(await fetch_state(client, top.url, path=top.state_path()), node)
        except Unreachable as exc:
            top.failed(f"{exc}; trying again every second", node)
        redraw.nudge()
        with trio.move_on_after(POLL_S):
            await refetch.wait()
            await trio.sleep(SETTLE_S)


async def poll_history(top: Top, client: httpx.AsyncClient, redraw: Nudge, *,
                       task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """The last hour's samples every HISTORY_S (steward takes one every 10 s), for the sparklines;
    a steward that keeps none (an older one) or cannot be reached just shows none."""
    task_status.started()
    while True:
        try:
            top.saw_history(await fetch_history(client, top.url))
            redraw.nudge()
        except Unreachable:
            pass  # the state poller says so on the screen
        await trio.sleep(HISTORY_S)


async def follow_steward(top: Top, client: httpx.AsyncClient, redraw: Nudge, refetch: Nudge, *,
                         task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    def seen(record: dict[str, Any]) -> None:
        top.saw_event(record)
        redraw.nudge()
        refetch.nudge()

    task_status.started()
    while True:
        with contextlib.suppress(Unreachable):  # the poller says so on the screen
            await follow_events(client, top.url, seen)
        await trio.sleep(RETRY_S)


async def serve_keys(top: Top, fd: int, redraw: Nudge, done: trio.CancelScope, refetch: Nudge | None = None,
                     asks: trio.MemorySendChannel[Ask] | None = None, *,
                     task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    def pressed(char: str) -> bool:
        node = top.node
        going = top.press(char)
        if asks is not None:
            for ask in top.asks:
                asks.send_nowait(ask)  # unbounded: one a key press
        top.asks.clear()
        redraw.nudge()
        if refetch is not None and top.node != node:
            refetch.nudge()  # another node's picture (or the fleet's): fetched now, not at the next poll
        return going

    task_status.started()
    if await read_keys(fd, pressed):
        done.cancel(reason="q pressed")


async def serve_asks(top: Top, key: str | None, asks: trio.MemoryReceiveChannel[Ask], redraw: Nudge,
                     refetch: Nudge, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Send each ask to steward: an action at once (its outcome said on the screen, the state
    fetched again), the log pane's follow until it is closed. A refusal, a missing key or an
    unreachable steward is a line on the screen, never the end of top."""
    task_status.started()
    following: trio.CancelScope | None = None
    async with trio.open_nursery() as nursery:
        async for ask in asks:
            if isinstance(ask.action, LogPane):
                if following is not None:
                    following.cancel(reason="the log pane closed")
                following = await nursery.start(_follow_log, top, key, ask.engine, redraw) \
                    if ask.action is LogPane.OPEN else None
            else:
                nursery.start_soon(_act, top, key, ask, redraw, refetch)


async def _act(top: Top, key: str | None, ask: Ask, redraw: Nudge, refetch: Nudge) -> None:
    assert not isinstance(ask.action, LogPane)
    try:
        done = await act(top.url, key, ask.engine, ask.action, frozenset(), ACT_WAIT_S)
    except (ActionNotDone, AdminRefused, Unreachable) as exc:
        top.say(f"{ask.action.value} {ask.engine}: {exc}")
    else:
        top.say(f"{ask.action.value} {ask.engine}: done, {'pinned, ' if done.engine.get('pinned') else ''}"
                f"{done.engine.get('status', '?')}")
    refetch.nudge()
    redraw.nudge()


async def _follow_log(top: Top, key: str | None, engine: str, redraw: Nudge, *,
                      task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED) -> None:
    def told(line: str) -> None:
        top.saw_log_line(engine, line)
        redraw.nudge()

    with trio.CancelScope() as scope:
        task_status.started(scope)
        try:
            await follow_engine_logs(top.url, key, engine, LOG_LINES, told)
            top.say(f"logs {engine}: steward ended the stream")
        except (AdminRefused, Unreachable, ValueError) as exc:
            top.say(f"logs {engine}: {exc}")
        redraw.nudge()


def print_once(url: str, key: str | None) -> int:
    """One frame on stdout, as wide as the terminal (or $COLUMNS); as tall as the terminal
    when there is one (or $LINES), else the whole picture."""
    try:
        state = trio.run(_fetch_once, url, key)
    except AdminRefused as exc:
        print(f"steward top: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except Unreachable as exc:
        print(f"steward top: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    size = shutil.get_terminal_size((80, 24))
    height = size.lines if sys.stdout.isatty() or "LINES" in os.environ else 10_000
    top = Top(url)
    top.saw_state(state)
    console = Console(width=size.columns, height=height)
    console.print(render_frame(top.frame(), width=size.columns, height=height))
    return EXIT_OK


async def _fetch_once(url: str, key: str | None) -> dict[str, Any]:
    async with open_admin_client(key) as client:
        return await fetch_state(client, url)
