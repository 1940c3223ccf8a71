"""The waiting line of one class: per engine, ordered by the requests' place in line.

Decisions look only at the head of each engine's line, so a decision costs time in
the number of engines, not in the number of waiting jobs.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

import attrs

from supervisor.request_class import RequestClass

from supervisor.scheduler.types import Job


def _order(job: Job) -> tuple[int, int]:
    return (job.seq, job.id)


@attrs.define
class ClassQueue:
    klass: RequestClass
    # engine name (None: exclusive jobs) -> its waiting jobs, oldest request first
    lines: dict[str | None, list[Job]] = attrs.Factory(dict)
    size: int = 0

    def push(self, job: Job) -> None:
        bisect.insort(self.lines.setdefault(job.model, []), job, key=_order)
        self.size += 1

    def remove(self, job: Job) -> None:
        line = self.lines[job.model]
        index = bisect.bisect_left(line, _order(job), key=_order)
        assert line[index] is job
        del line[index]
        self.size -= 1
        if not line:
            del self.lines[job.model]

    def heads(self) -> Iterator[Job]:
        for line in self.lines.values():
            yield line[0]

    def head(self) -> Job | None:
        return min(self.heads(), key=_order, default=None)

    def line(self, model: str | None) -> list[Job]:
        return self.lines.get(model, [])

    def count(self, model: str | None) -> int:
        return len(self.lines.get(model, ()))
