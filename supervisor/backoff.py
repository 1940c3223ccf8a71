"""Retrying with exponential backoff: an upstream that cannot be reached, a service that exits."""

from __future__ import annotations

from collections.abc import Iterator

import attrs
import trio


@attrs.frozen
class Backoff:
    initial: float = 1.0
    maximum: float = 60.0
    # Set when retrying must end (steward shuts down): a request that never reached its
    # upstream must not hold the drain open for the whole shutdown timeout.
    until: trio.Event | None = attrs.field(default=None, eq=False)

    def delays(self) -> Iterator[float]:
        delay = self.initial
        while True:
            yield delay
            delay = min(delay * 2, self.maximum)

    async def sleep(self, delay: float) -> bool:
        """Wait *delay* seconds before the next try; False when retrying must end instead."""
        if self.until is None:
            await trio.sleep(delay)
            return True
        with trio.move_on_after(delay):
            await self.until.wait()
        return not self.until.is_set()
