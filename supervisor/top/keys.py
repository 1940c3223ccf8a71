"""Key presses from the terminal, one at a time, without Enter.

``cbreak`` puts the terminal in cbreak mode (no line buffering, no echo; Ctrl-C still
interrupts) and puts back exactly what it found on every way out, an error included, so a
crash of top never leaves the pane without echo.
"""

from __future__ import annotations

import contextlib
import os
import termios
import tty
from collections.abc import Callable, Iterator

import trio


@contextlib.contextmanager
def cbreak(fd: int) -> Iterator[None]:
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


async def read_keys(fd: int, on_key: Callable[[str], bool]) -> bool:
    """Call *on_key* with each character typed until it says False (then True) or input ends
    (then False)."""
    while True:
        await trio.lowlevel.wait_readable(fd)
        try:
            data = os.read(fd, 64)
        except BlockingIOError:  # another reader of the terminal was first
            continue
        if not data:
            return False
        for char in data.decode(errors="replace"):
            if not on_key(char):
                return True
