"""The scheduler's typed values: they still equal the strings the events, the APIs and the config use."""

from __future__ import annotations

import json

from supervisor.scheduler.core import Scheduler
from supervisor.request_class import LOWER_CLASSES, RequestClass
from supervisor.scheduler.types import (
    EngineProfile,
    EngineStatus,
    GpuMode,
    SchedulingPolicy,
)

GIB = 1024**3


def test_a_request_class_is_its_name_ranked_highest_first_with_its_use_weight() -> None:
    assert list(RequestClass) == ["interactive", "background", "batch"]
    assert [klass.rank for klass in RequestClass] == [0, 1, 2]
    assert [klass.use_weight for klass in RequestClass] == [1.0, 0.5, 0.25]
    assert RequestClass.BATCH.higher == (RequestClass.INTERACTIVE, RequestClass.BACKGROUND)
    assert RequestClass.BACKGROUND.and_lower == LOWER_CLASSES == (RequestClass.BACKGROUND, RequestClass.BATCH)
    assert RequestClass.of_rank(1) is RequestClass.BACKGROUND
    assert RequestClass.named("batch") is RequestClass.BATCH
    assert RequestClass.named("urgent") is None and RequestClass.named(["batch"]) is None  # type: ignore[arg-type]


def test_typed_values_are_written_as_their_strings() -> None:
    record = {"class": RequestClass.BATCH, "gpu": GpuMode.IDLE, "status": EngineStatus.READY,
              "queued": {RequestClass.INTERACTIVE: 1}}
    assert json.dumps(record) == '{"class": "batch", "gpu": "idle", "status": "ready", "queued": {"interactive": 1}}'
    assert f"{RequestClass.BACKGROUND} request" == "background request"


def test_the_core_takes_a_class_by_its_name_and_keeps_it_typed() -> None:
    policy = SchedulingPolicy(starvation={"interactive": 0.0, "background": 1.0, "batch": 2.0})
    assert policy.starvation[RequestClass.BATCH] == policy.starvation["batch"] == 2.0
    s = Scheduler.create(16 * GIB, [EngineProfile("chat", 8 * GIB, 1)], policy)
    s.submit(1, "chat", "background", now=0.0)
    assert s.waiting[1].klass is RequestClass.BACKGROUND
    snapshot = s.snapshot()
    assert snapshot.mode is GpuMode.IDLE  # nothing runs yet: its engine loads
    assert snapshot.engines[0].status is EngineStatus.STARTING
    assert snapshot.lines[0].klass is RequestClass.BACKGROUND
