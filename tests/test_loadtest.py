"""steward loadtest: the real-time client mix against its own steward on fake engines."""

from __future__ import annotations

import json
from pathlib import Path

from supervisor.loadtest import run_loadtest, summarize_events

MODELS = {"chat": "gemma4-12b", "background": "gemma4-e4b", "batch": "gemma4-e2b", "embedding": "nomic-embed"}


def test_a_short_mixed_load_completes_work_in_every_class_without_errors() -> None:
    report = run_loadtest(None, {"chat": 2, "background": 2, "batch": 1, "embedding": 1}, 6.0, MODELS)
    table = report.by_class()
    assert all(table[klass]["completed"] > 0 for klass in ("interactive", "background", "batch")), table
    assert sum(row["errors"] for row in table.values()) == 0, report.to_json()
    assert report.engine_events is not None and report.engine_events["loads"] >= 4
    assert report.engine_events["unnecessary_loads"] == 0
    assert any(o.kind == "embedding" and o.status == 200 for o in report.outcomes)
    json.dumps(report.to_json())  # machine-readable as it is


def test_unnecessary_loads_are_reloads_after_an_eviction_that_was_not_needed(tmp_path: Path) -> None:
    records = [
        {"event": "load", "engine": "a", "reserved": 4},
        {"event": "evict", "engine": "a", "need": 3, "free": 1},  # needed: only 1 free of 3
        {"event": "load", "engine": "a", "reserved": 4},
        {"event": "evict", "engine": "a", "need": 3, "free": 5},  # not needed
        {"event": "load", "engine": "b", "reserved": 7},
        {"event": "load", "engine": "a", "reserved": 9},
    ]
    log = tmp_path / "events.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert summarize_events(log) == {"loads": 4, "evictions": 2, "unnecessary_loads": 1, "peak_reserved_bytes": 9}
