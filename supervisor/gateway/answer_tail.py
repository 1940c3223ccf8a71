"""An answer's end as the door keeps it: its last bytes (where the usage is) and its last line.

Fed every chunk the client is sent, so each chunk costs O(its size), not O(the tail): the
last ``TAIL`` bytes are kept as the chunks that hold them and joined only when read (the usage
log reads them once, at the end), and whether the answer has reached the last event of a whole
stream is told by the first bytes of its last line alone, however long that line is (a
Responses API ``response.completed`` that repeats an agent's tools is tens of KB).
"""

from __future__ import annotations

import collections
import re

import attrs

TAIL = 8192  # the answer's last bytes, where its usage is (the final chunk of a stream, or the body's end)
LINE_HEAD = 512  # of the last line: enough for the start of any last event below
# The last event of a whole stream, by its line's start: OpenAI's SSE ``[DONE]``, Ollama's NDJSON
# ``"done": true`` (after the model, time and message of its final line), Anthropic's
# ``message_stop``, the Responses API's ``response.completed`` (or ``incomplete``/``failed``).
_LAST_EVENT = re.compile(rb'data: \[DONE\]\s*$|data: \{"type":\s*"message_stop"\}|\{[^\n]*"done":\s*true\b'
                         rb'|(data: )?\{"type":\s*"response\.(completed|incomplete|failed)"')


@attrs.define
class AnswerTail:
    _chunks: collections.deque[bytes] = attrs.Factory(collections.deque)
    _size: int = 0  # of the chunks kept
    _joined: bytes | None = b""  # the tail, as last read (None: chunks came since)
    _line: bytes = b""  # the first LINE_HEAD bytes of the last line that has any text
    _line_ended: bool = True  # whether the last chunk ended its line

    def add(self, chunk: bytes) -> None:
        if not chunk:
            return
        self._chunks.append(chunk)
        self._size += len(chunk)
        while self._size - len(self._chunks[0]) >= TAIL:
            self._size -= len(self._chunks.popleft())
        self._joined = None
        self._follow_line(chunk)

    def bytes(self) -> bytes:
        """The answer's last TAIL bytes."""
        if self._joined is None:
            self._joined = b"".join(self._chunks)[-TAIL:]
        return self._joined

    def __bool__(self) -> bool:
        return self._size > 0

    @property
    def at_stream_end(self) -> bool:
        """Whether the answer so far ends with the whole last event of a stream."""
        return self._line_ended and _LAST_EVENT.match(self._line) is not None

    def _follow_line(self, chunk: bytes) -> None:
        text = chunk.rstrip(b"\r\n")
        if text:
            cut = text.rfind(b"\n")
            if cut >= 0 or self._line_ended:
                self._line = text[cut + 1:cut + 1 + LINE_HEAD].rstrip(b"\r")
            elif len(self._line) < LINE_HEAD:  # the same line goes on
                self._line = (self._line + text)[:LINE_HEAD]
        self._line_ended = chunk.endswith(b"\n")
