"""A request's class: a person (interactive), an agent (background), a batch queue.

A leaf module: the config, the gateway, the scheduler and the tools all speak of classes, and
none of them has to import another to do so.
"""

from __future__ import annotations

import enum
import functools


class RequestClass(enum.StrEnum):
    """A request's class, highest first: a person, then an agent, then a batch queue. Its
    value is its name in the config, the API and the events."""

    INTERACTIVE = "interactive", 1.0
    BACKGROUND = "background", 0.5
    BATCH = "batch", 0.25

    # Its place in the strict order (0: first).
    rank: int
    # What one step started on an engine counts for in its recent use: by whom a reload of it
    # would delay.
    use_weight: float

    def __new__(cls, value: str, use_weight: float) -> RequestClass:
        member = str.__new__(cls, value)
        member._value_ = value
        member.rank = len(cls.__members__)
        member.use_weight = use_weight
        return member

    @property
    def with_article(self) -> str:
        """``an interactive``, ``a background``: its name in a sentence (a why)."""
        return f"{'an' if self.value[0] in 'aeiou' else 'a'} {self.value}"

    @classmethod
    def named(cls, name: str) -> RequestClass | None:
        """The class called *name* (a header's, a key's), or None: there is none."""
        try:
            return cls(name)
        except ValueError:
            return None

    @classmethod
    def of_rank(cls, rank: int) -> RequestClass:
        """The class whose place in the strict order is *rank*."""
        return tuple(cls)[rank]

    @functools.cached_property
    def higher(self) -> tuple[RequestClass, ...]:
        """The classes ranked before it."""
        return tuple(RequestClass)[: self.rank]

    @functools.cached_property
    def and_lower(self) -> tuple[RequestClass, ...]:
        """It and the classes ranked after it."""
        return tuple(RequestClass)[self.rank:]


# Every class, highest first: what the core's loops go over (a tuple: iterating the enum
# itself costs a decision several times as much).
ALL_CLASSES = RequestClass.INTERACTIVE.and_lower
# The classes the starvation guard serves beside interactive work.
LOWER_CLASSES = RequestClass.BACKGROUND.and_lower
