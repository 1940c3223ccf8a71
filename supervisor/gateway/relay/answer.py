"""An answer on its way to a client: its head, read once, and the tap its readers sit on.

The relay reads an upstream's head once into an ``AnswerHead`` (its status, its framing, whether
its length was announced) and writes the answer into an ``Answer``: the client's ``AnswerTap``,
or a caller's own (the steps of a generation cut into steps, an embeddings step being assembled).
The tap hands the head and each body chunk to the readers the route needs, in order, then
sends what they pass on to the client as ASGI messages; with no reader it sends what comes.

A reader is sans-IO: ``start(head)`` returns the head to pass on (or a new one), or None to
hold it until its body is read (an error answer being reshaped, a JSON answer being renamed);
``body(chunk, more)`` returns the head it releases (or None) and the bytes to pass on (none,
with more to come: all of it held); ``end()`` returns what it still holds of an answer that
ended without its last chunk. After ``start`` its ``reading`` says whether the answer's body is
its to read: once the head went by every reader, those that do not read it leave the tap.

The start message carries the head (``ANSWER_HEAD``), so that the front door reads it rather
than the headers again.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Iterable
from typing import Any, Protocol

import attrs

from supervisor.gateway.http.asgi import Send

ANSWER_HEAD = "steward.answer_head"  # in an http.response.start message: its AnswerHead
Headers = list[tuple[bytes, bytes]]


class Framing(enum.Enum):
    """What the answer's Content-Type says its body is, as the readers tell them apart."""

    JSON = enum.auto()  # application/json
    EVENT_STREAM = enum.auto()  # text/event-stream: server-sent events
    NDJSON = enum.auto()  # application/x-ndjson: Ollama's native streams
    OTHER = enum.auto()


def _framing(content_type: bytes) -> Framing:
    if content_type.startswith(b"application/json"):
        return Framing.JSON
    if content_type.startswith(b"text/event-stream"):
        return Framing.EVENT_STREAM
    if content_type.startswith(b"application/x-ndjson"):
        return Framing.NDJSON
    return Framing.OTHER


@attrs.frozen
class AnswerHead:
    status: int
    headers: Headers  # as the client gets them (the upstream's hop-by-hop ones left out)
    content_type: bytes  # the first Content-Type's value; b"" without one
    framing: Framing
    length_declared: bool  # a Content-Length: the body must go through whole, at that length

    @classmethod
    def of(cls, status: int, headers: Iterable[tuple[bytes, bytes]],
           without: frozenset[bytes] = frozenset()) -> AnswerHead:
        """The head of an answer with *headers* (lower-case names), those named in *without* left out:
        one pass over them."""
        kept = []
        content_type = None
        length_declared = False
        for name, value in headers:
            if name in without:
                continue
            kept.append((name, value))
            if name == b"content-type":
                content_type = value if content_type is None else content_type
            elif name == b"content-length":
                length_declared = True
        content_type = content_type or b""
        return cls(status, kept, content_type, _framing(content_type), length_declared)

    def with_length(self, length: int) -> AnswerHead:
        """This head for a body of *length* bytes (its Content-Length, where it announced one)."""
        if not self.length_declared:
            return self
        value = str(length).encode()
        return attrs.evolve(self, headers=[(k, value if k == b"content-length" else v) for k, v in self.headers])

    @property
    def event_stream(self) -> bool:
        """A 200 event stream: the answer that the readers of streams read."""
        return self.status == 200 and self.framing is Framing.EVENT_STREAM


def start_message(head: AnswerHead) -> dict[str, Any]:
    return {"type": "http.response.start", "status": head.status, "headers": head.headers, ANSWER_HEAD: head}


Passed = tuple[AnswerHead | None, bytes]  # a reader's output: the head it releases (None: none), the bytes
NOTHING_HELD: Passed = (None, b"")


class Reader(Protocol):
    """Reads (and may rewrite) one answer on its way to the client; see the module docstring."""

    @property
    def reading(self) -> bool: ...

    def start(self, head: AnswerHead) -> AnswerHead | None: ...

    def body(self, chunk: bytes, more: bool) -> Passed: ...

    def end(self) -> Passed: ...


class Answer(abc.ABC):
    """Where a relay writes an upstream's answer: its head once, then its body."""

    @abc.abstractmethod
    async def start(self, head: AnswerHead) -> None: ...

    @abc.abstractmethod
    async def body(self, chunk: bytes, more: bool) -> None: ...


@attrs.define(eq=False)
class AnswerTap(Answer):
    """The client's side of an answer: the route's readers, then the client's *send*."""

    send: Send
    readers: list[Reader] = attrs.Factory(list)  # in order, from the upstream's side to the client's

    async def start(self, head: AnswerHead) -> None:
        if not self.readers:
            await self.send(start_message(head))
            return
        await self._pass(0, head, b"", more=True)

    async def body(self, chunk: bytes, more: bool) -> None:
        if not self.readers:
            await self.send({"type": "http.response.body", "body": chunk, "more_body": more})
            return
        await self._pass(0, None, chunk, more)

    async def end(self) -> None:
        """The answer ended without its last chunk (an upstream broke off a body of announced
        length): what the readers still hold goes on unchanged, and the client sees it cut."""
        for index, reader in enumerate(self.readers):
            head, held = reader.end()
            if head is not None or held:
                await self._pass(index + 1, head, held, more=True)

    async def _pass(self, first: int, head: AnswerHead | None, chunk: bytes, more: bool) -> None:
        """*head* (if any) and *chunk* through the readers from *first* on, then to the client."""
        readers = self.readers
        for index in range(first, len(readers)):
            reader = readers[index]
            if head is not None:
                head = reader.start(head)
            if chunk or not more:
                released, chunk = reader.body(chunk, more)
                head = released if released is not None else head
        if head is not None:
            self.readers = [reader for reader in readers if reader.reading]
            await self.send(start_message(head))
        if chunk or not more:
            await self.send({"type": "http.response.body", "body": chunk, "more_body": more})


async def answer_whole(answer: Answer, status: int, headers: Headers, body: bytes) -> None:
    """A whole answer at once, with its Content-Length (any given in *headers* is replaced)."""
    headers = [(k, v) for k, v in headers if k != b"content-length"]
    headers.append((b"content-length", str(len(body)).encode()))
    await answer.start(AnswerHead.of(status, headers))
    await answer.body(body, more=False)
