"""Per-key limits: requests per minute and requests at once. Pure: the caller passes ``now``.

Written here rather than taken from a library: the ``limits`` package (and its kin) reads the
wall clock itself, and these limits must run on trio's MockClock in tests and in
``steward simulate``, where a minute passes in a millisecond.

The rate is exact: at most ``rpm`` admissions in any 60 s, kept as the admission times of the
last 60 s per key (never more than ``rpm`` of them). State is kept by key name, so it survives a
reload of the key file; ``forget`` drops the state of keys that were removed.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Collection

import attrs

from supervisor.auth.keys import ApiKey

WINDOW = 60.0  # seconds: "per minute"


class RefusalReason(enum.Enum):
    RATE = "rate"
    CONCURRENCY = "concurrency"


@attrs.frozen
class Refused:
    reason: RefusalReason
    message: str  # for the client: the limit and the key's name
    retry_after: int  # whole seconds, at least 1


@attrs.define(eq=False)
class _KeyState:
    # Admission times within the last WINDOW seconds, oldest first; only kept for a key with an rpm.
    admitted: deque[float] = attrs.Factory(deque)
    running: int = 0  # admitted and not yet released


@attrs.define(eq=False)
class Admission:
    """A request let through; hand it back to ``KeyLimiter.release`` when the request has ended."""

    key: str
    # The state it counts in: a release after the key was forgotten (or removed and added again)
    # changes that old state, not the new key's.
    _state: _KeyState = attrs.field(alias="state", repr=False)
    released: bool = False


@attrs.define
class KeyLimiter:
    _states: dict[str, _KeyState] = attrs.Factory(dict)

    def admit(self, key: ApiKey, now: float) -> Admission | Refused:
        state = self._states.setdefault(key.name, _KeyState())
        if key.rpm is None:
            state.admitted.clear()
        else:
            while state.admitted and state.admitted[0] <= now - WINDOW:
                state.admitted.popleft()
            if len(state.admitted) >= key.rpm:
                # After a reload lowered rpm there may be more than rpm: wait until all but rpm - 1 left.
                leaves = state.admitted[len(state.admitted) - key.rpm] + WINDOW
                retry_after = max(1, math.ceil(leaves - now))
                return Refused(RefusalReason.RATE, f"key {key.name!r} is limited to {key.rpm} requests per minute; "
                                                   f"try again in {retry_after}s", retry_after)
        if key.concurrency is not None and state.running >= key.concurrency:
            return Refused(RefusalReason.CONCURRENCY, f"key {key.name!r} is limited to {key.concurrency} "
                                                      f"{_requests(key.concurrency)} at a time; try again when "
                                                      f"one has finished", 1)
        if key.rpm is not None:
            state.admitted.append(now)
        state.running += 1
        return Admission(key.name, state=state)

    def release(self, admission: Admission) -> None:
        """The admitted request ended: it no longer counts toward concurrency (it still counts toward
        the rate). Releasing twice is harmless."""
        if not admission.released:
            admission.released = True
            admission._state.running -= 1

    def forget(self, names_still_present: Collection[str]) -> None:
        """Drop the state of every key not in *names_still_present* (call it after a reload)."""
        for name in self._states.keys() - set(names_still_present):
            del self._states[name]

    def running(self, name: str) -> int:
        state = self._states.get(name)
        return 0 if state is None else state.running


def _requests(count: int) -> str:
    return "request" if count == 1 else "requests"
