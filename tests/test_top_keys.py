"""steward top's keys for one engine: select it (arrows, j/k), ``u`` unload, ``p`` pin/unpin,
``f`` follow its output in a pane (Escape/q back). The model's answer to each key (pure), the
keys read from a terminal's bytes, and the asks sent to a real steward by top's own asker
task, in-process: the outcome, a refusal and a missing key each a line on the screen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from rich.console import Console

from supervisor.auth.keys import add_key
from supervisor.scheduler.types import EngineAction
from supervisor.top.app import Nudge, serve_asks
from supervisor.top.keys import key_names
from supervisor.top.model import Ask, LogPane, Top
from supervisor.top.view import Frame, render_frame
from tests.conftest import StewardFactory, fake_model
from tests.test_control import rows, steward_command
from tests.test_openai_engines import ask


def state(*engines: dict[str, Any]) -> dict[str, Any]:
    return {"engines": list(engines)}


def test_the_arrows_and_escape_are_read_from_a_terminal_s_bytes() -> None:
    assert key_names("j\x1b[Ak\x1bOB\x1b\x1b[5~q ") == ["j", "up", "k", "down", "escape", "q", " "]


def test_keys_select_an_engine_and_ask_to_unload_pin_unpin_or_follow_it() -> None:
    top = Top("http://127.0.0.1:8080")
    assert top.press("j") and top.selected is None and not top.asks  # nothing to select yet
    top.saw_state(state({"name": "chat", "pinned": False}, {"name": "embed", "pinned": True}))
    assert top.press("u") and not top.asks  # no engine selected: u does nothing
    assert top.press("down") and top.selected == "chat"
    assert top.press("j") and top.press("j") and top.selected == "embed"  # stays at the last
    assert top.press("up") and top.press("k") and top.selected == "chat"
    assert top.press("k") and top.selected == "chat"
    assert top.press("p") and top.asks == [Ask("chat", EngineAction.PIN)] and not top.frame().paused
    assert top.press("j") and top.press("p") and top.asks[-1] == Ask("embed", EngineAction.UNPIN)
    assert top.press("u") and top.asks[-1] == Ask("embed", EngineAction.UNLOAD)
    assert top.frame().said == "unload embed: asked"
    assert top.press(" ") and top.frame().paused and top.press(" ") and not top.frame().paused  # space pauses
    # Digits and n are not engine keys (the node view's).
    asked = len(top.asks)
    assert top.press("1") and top.press("n") and len(top.asks) == asked
    # f: the log pane; its keys are only Escape and q (back, not quit).
    assert top.press("f") and top.asks[-1] == Ask("embed", LogPane.OPEN) and top.frame().following == "embed"
    top.saw_log_line("embed", "loading model")
    top.saw_log_line("chat", "not this one")
    assert top.frame().log == ("loading model",)
    assert top.press("u") and top.press("p") and top.asks[-1] == Ask("embed", LogPane.OPEN)
    assert top.press("escape") and top.asks[-1] == Ask("embed", LogPane.CLOSE) and top.frame().following is None
    assert top.press("f") and top.press("q") and top.asks[-1] == Ask("embed", LogPane.CLOSE)
    assert not top.press("q")  # out of the pane, q quits


def test_the_selected_row_the_log_pane_and_the_said_line_are_drawn() -> None:
    picture = state({"name": "chat", "status": "ready"}, {"name": "embed", "status": "stopped"})
    frame = Frame("http://127.0.0.1:8080", picture, selected="chat", said="pin chat: chat is failed")
    text = _text(frame)
    assert "u unload  p pin/unpin  f follow" in text[0] and text[1] == "pin chat: chat is failed"
    reversed_rows = [line for line in _text(frame, styles=True) if "\x1b[7m" in line]  # SGR 7: reverse
    assert len(reversed_rows) == 1 and "chat" in reversed_rows[0] and "embed" not in reversed_rows[0]
    pane = _text(Frame("http://127.0.0.1:8080", picture, following="chat", log=("a", "b", "\\x1b[2J")))
    assert pane[0].endswith("Esc/q back") and pane[1:] == ["OUTPUT OF chat  Esc/q back", "a", "b", "\\x1b[2J"]


def _text(frame: Frame, *, styles: bool = False) -> list[str]:
    console = Console(width=140, height=20, record=True, color_system="standard", force_terminal=True)
    console.print(render_frame(frame, width=140, height=20))
    return [line.rstrip() for line in console.export_text(styles=styles).splitlines() if line.strip()]


async def _ask_all(top: Top, key: str | None, asks: list[Ask], until: Any) -> None:
    """Run top's asker on *asks* until *until()* holds for the model (waited for, not slept)."""
    redraw, refetch = Nudge(), Nudge()
    send, receive = trio.open_memory_channel[Ask](100)
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_asks, top, key, receive, redraw, refetch)
        for one in asks:
            send.send_nowait(one)
        with trio.fail_after(30):
            while not until():
                await redraw.wait()
        nursery.cancel_scope.cancel()


@pytest.mark.slow
def test_top_s_asks_reach_a_real_steward_and_its_answers_are_said(start_steward: StewardFactory,
                                                                   tmp_path: Path) -> None:
    steward = start_steward({"chat": fake_model("1GiB", extra=["--verbose"])}, gpu={"probe": "none", "budget": "4GiB"})
    assert ask(steward.base_url, "chat").status_code == 200
    top = Top(steward.url)
    trio.run(_ask_all, top, None, [Ask("chat", EngineAction.PIN)], lambda: top.said and "done" in top.said)
    assert top.said == "pin chat: done, pinned, ready"
    assert rows(steward_command("ps", "--url", steward.url)[1])["chat"][6] == "pinned"
    trio.run(_ask_all, top, None, [Ask("chat", EngineAction.UNLOAD)], lambda: top.said and "unload" in top.said)
    assert top.said == "unload chat: chat is pinned: unpin it first"
    # The log pane: the engine's last lines, then a new one as it comes.
    top.following = "chat"
    trio.run(_ask_all, top, None, [Ask("chat", LogPane.OPEN)], lambda: any("model loaded" in x for x in top.log))

    async def a_new_line() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_ask_all, top, None, [Ask("chat", LogPane.OPEN)],
                               lambda: sum("request: POST /v1/chat/completions" in x for x in top.log) >= 2)
            with trio.fail_after(30):
                while not any("request: POST" in x for x in top.log):
                    await trio.sleep(0.01)  # the backlog shows the first request: a state waited for
                await trio.to_thread.run_sync(ask, steward.base_url, "chat")

    top.log.clear()
    trio.run(a_new_line)
    trio.run(_ask_all, top, None, [Ask("nope", EngineAction.UNLOAD)], lambda: top.said and "nope" in top.said)
    assert top.said == "unload nope: no engine named 'nope'"


@pytest.mark.slow
def test_a_missing_key_is_said_on_top_s_screen_not_a_crash(start_steward: StewardFactory, tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    add_key(keys, "ops", admin=True)
    steward = start_steward({"chat": fake_model("1GiB")}, gpu={"probe": "none", "budget": "4GiB"},
                            auth={"keys_file": str(keys)})
    top = Top(steward.url)
    trio.run(_ask_all, top, None, [Ask("chat", EngineAction.PIN)], lambda: top.said is not None and "401" in top.said)
    assert "pass --key or set STEWARD_KEY" in str(top.said)
    top.said, top.following = None, "chat"
    trio.run(_ask_all, top, None, [Ask("chat", LogPane.OPEN)], lambda: top.said is not None)
    assert str(top.said).startswith("logs chat: ") and "401" in str(top.said)
    assert steward_command("ps", "--url", steward.url, env={"STEWARD_KEY": ""})[0] == 2
