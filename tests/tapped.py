"""Readers of answers (supervisor/gateway/relay/answer.py) fed the ASGI messages a relay's answer
is made of, as the tests of what reaches the client write them."""

from __future__ import annotations

from typing import Any

import attrs

from supervisor.gateway.http.asgi import Send
from supervisor.gateway.relay.answer import ANSWER_HEAD, AnswerHead, AnswerTap, Reader


@attrs.define(eq=False)
class Fed:
    """A tap that takes ASGI messages: a start is read into its head, as the relay reads it."""

    tap: AnswerTap

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            await self.tap.start(AnswerHead.of(message["status"], message.get("headers", ())))
        else:
            await self.tap.body(message.get("body", b""), message.get("more_body", False))

    async def send_held(self) -> None:
        await self.tap.end()


def fed(send: Send, *readers: Reader) -> Fed:
    """*readers* on a tap to *send*, which gets the messages as a client's send would, without the
    head steward attaches for its front door."""

    async def bare(message: dict[str, Any]) -> None:
        await send({k: v for k, v in message.items() if k != ANSWER_HEAD})

    return Fed(AnswerTap(bare, list(readers)))


def fed_tap(tap: AnswerTap) -> Fed:
    """A tap made elsewhere (``reading_answer``), fed ASGI messages."""
    return Fed(tap)
