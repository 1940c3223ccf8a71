"""Retrying with exponential backoff: an upstream that cannot be reached, a service that exits."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import attrs
import trio

T = TypeVar("T")


@attrs.frozen
class Backoff:
    initial: float = 1.0
    maximum: float = 60.0
    # Set when retrying must end (steward shuts down): a request that never reached its
    # upstream must not hold the drain open for the whole shutdown timeout.
    until: trio.Event | None = attrs.field(default=None, eq=False)
    retries: int | None = None  # how many delays there are; None: retrying goes on

    def delays(self) -> Iterator[float]:
        delay, left = self.initial, self.retries
        while left is None or left > 0:
            yield delay
            delay = min(delay * 2, self.maximum)
            left = None if left is None else left - 1

    async def sleep(self, delay: float) -> bool:
        """Wait *delay* seconds before the next try; False when retrying must end instead."""
        if self.until is None:
            await trio.sleep(delay)
            return True
        with trio.move_on_after(delay):
            await self.until.wait()
        return not self.until.is_set()


class RetryEnded(Exception):
    """Retrying ended (steward shuts down) while the upstream still could not be reached."""


async def retry_while_unreachable(backoff: Backoff, attempt: Callable[[], Awaitable[T]], unreachable: type[Exception],
                                  on_retry: Callable[[Exception, float], Awaitable[None]]) -> T:
    """*attempt* again, after each of *backoff*'s delays, for as long as it raises *unreachable*
    (nothing was sent then); *on_retry* (the error, the delay) before each wait. RetryEnded,
    from the last such error, once retrying must end; any other error as it came."""
    for delay in backoff.delays():
        try:
            return await attempt()
        except unreachable as exc:
            await on_retry(exc, delay)
            if not await backoff.sleep(delay):
                raise RetryEnded(str(exc)) from exc
    raise AssertionError("Backoff.delays never ends")
