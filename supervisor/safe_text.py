"""Text from outside (a client, an engine, a file) made safe before it goes where it could fail.

JSON may carry a lone UTF-16 surrogate (``"\\ud800"``): Python's parser gives a ``str`` that
no UTF-8 writer takes (SQLite, a terminal, a socket), and one such model name once stopped
steward from inside the usage writer. Two answers, by where the text goes:

- a request that carries one is refused at the edge (``lone_surrogate``: a 400 in the route's
  shape), since no engine could read it either;
- text that is only recorded (a usage row, an event's terminal line) is escaped
  (``recordable``), never refused: a record must never be lost for its contents.
"""

from __future__ import annotations

import re
from typing import Any

# A JSON escape of a surrogate (U+D800-U+DFFF): the only way one gets into parsed JSON.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def recordable(text: str) -> str:
    """*text* as UTF-8 can write it: a lone surrogate becomes its escape (``\\ud800``)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def lone_surrogate(body: bytes, value: Any) -> str | None:
    """Where in *value* (parsed from the JSON *body*) a string holds a lone surrogate, as a path
    (``messages.0.content``), or None. Costs a regular-expression scan unless *body* has one."""
    if _SURROGATE_ESCAPE.search(body) is None:
        return None
    return _find(value, "")


def _find(value: Any, path: str) -> str | None:
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if not encodes(item):
                return where or "(the body)"
        elif isinstance(item, dict):
            for key, child in item.items():
                here = f"{where}.{key}" if where else str(key)
                if not encodes(key):
                    return recordable(here)
                stack.append((child, here))
        elif isinstance(item, list):
            stack.extend((child, f"{where}.{index}" if where else str(index)) for index, child in enumerate(item))
    return None


def encodes(text: str) -> bool:
    """Whether UTF-8 can write *text* (False: it holds a lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
