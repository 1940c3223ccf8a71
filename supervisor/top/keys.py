"""Key presses from the terminal, one at a time, without Enter.

``cbreak`` puts the terminal in cbreak mode (no line buffering, no echo; Ctrl-C still
interrupts) and puts back exactly what it found on every way out, an error included, so a
crash of top never leaves the pane without echo.

``key_names`` reads the arrows' escape sequences as ``up``/``down`` and a lone Escape as
``escape`` (a sequence arrives in one read: a terminal writes it at once).
"""

from __future__ import annotations

import contextlib
import os
import re
import termios
import tty
from collections.abc import Callable, Iterator

import trio


# CSI or SS3 sequences (an arrow, a function key), a lone Escape, or any one character.
_KEYS = re.compile(r"\x1b\[[0-9;]*[A-Za-z~]|\x1bO[A-Za-z]|\x1b|.", re.DOTALL)
UP, DOWN, ESCAPE = "up", "down", "escape"
_NAMED = {"\x1b[A": UP, "\x1bOA": UP, "\x1b[B": DOWN, "\x1bOB": DOWN, "\x1b": ESCAPE}


def key_names(text: str) -> list[str]:
    """The keys in *text*: a character, or ``up``, ``down``, ``escape``; other sequences left out."""
    return [_NAMED.get(key, key) for key in _KEYS.findall(text) if key in _NAMED or not key.startswith("\x1b")]


@contextlib.contextmanager
def cbreak(fd: int) -> Iterator[None]:
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


async def read_keys(fd: int, on_key: Callable[[str], bool]) -> bool:
    """Call *on_key* with each key typed (``key_names``) until it says False (then True) or
    input ends (then False)."""
    while True:
        await trio.lowlevel.wait_readable(fd)
        try:
            data = os.read(fd, 64)
        except BlockingIOError:  # another reader of the terminal was first
            continue
        if not data:
            return False
        for key in key_names(data.decode(errors="replace")):
            if not on_key(key):
                return True
