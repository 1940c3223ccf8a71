"""The home-lab seed's overload test against steward: 256 requests at once, and everything visible.

The seed's system hid its overload three ways (a waiting gauge structurally zero, no usage
rows for rejected requests, an overload event that went nowhere) and its health check said
200. The slow test runs the whole scenario (supervisor/tools/overload.py) against a real steward
and a fake engine and asserts each of those is visible here; it asserts only counts and
relations, never absolute times, so it holds beside busy cores. The quick tests check the
pure parts: the mix, the scrape parser, and that the checks do catch the seed's blindness.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.tools.overload import run_overload
from supervisor.tools.overload_report import (
    CAPACITY_REASONS,
    OverloadReport,
    UsageFigures,
    Waits,
    event_rejections,
    format_overload_report,
    parse_scrape,
    usage_figures,
)
from supervisor.tools.overload_scenario import OverloadPlan

CLIENTS = 256


def _connection_events(log: Path) -> str:
    """What the event log says about connections and errors: where a request that got no HTTP
    answer at all went (a connection refused, broken or failed), for the failure's text."""
    lines = [line for line in log.read_text().splitlines()
             if '"event":"connection_' in line or '"level":"error"' in line]
    return "\nconnection and error events:\n" + "\n".join(lines[:20]) if lines else ""


@pytest.mark.slow
def test_an_overload_of_256_requests_is_visible_everywhere(tmp_path: Path) -> None:
    report = run_overload(tmp_path, clients=CLIENTS)
    text = format_overload_report(report) + _connection_events(tmp_path / "events.jsonl")

    assert 0 not in report.answers, text  # every request got an HTTP answer
    assert sum(report.answers.values()) == CLIENTS, text
    # The waiting gauges: never zero while the overload was surely under way.
    assert report.counted_samples >= 10, text
    assert report.zero_queued_samples == 0, text
    assert report.zero_waiting_samples == 0, text
    assert report.max_queued > 0, text
    # Rejections, by reason, counted alike by the clients, /metrics and the event log.
    assert CAPACITY_REASONS <= set(report.rejected_by_clients), text
    assert report.rejected_by_metrics == report.rejected_by_clients, text
    assert report.rejected_by_events == report.rejected_by_clients, text
    assert report.requests_by_metrics == report.answers, text
    # The usage log: one row per request sent, the rejected ones with their status and code.
    assert report.usage.rows == CLIENTS, text
    assert report.usage.by_status == report.answers, text
    assert report.usage.by_error == report.rejected_by_clients, text
    assert sum(n for status, n in report.usage.by_status.items() if status != 200) > 0, text
    # /healthz: overloaded, with reasons, as HTTP 503.
    assert report.health_seen.get("overloaded", 0) > 0, text
    assert set(report.overloaded_http) == {503}, text
    assert report.overloaded_reasons, text
    assert "overloaded" in report.health_events, text
    # One alert for the whole incident, not one per rejection.
    assert len(report.alerts) == 1, text
    assert report.alert_sent_events == 1, text
    assert report.alerts[0].title, text
    # Priority: interactive waited less than batch.
    interactive, batch = report.usage.waits["interactive"], report.usage.waits["batch"]
    assert interactive.served > 0 and batch.served > 0, text
    assert interactive.p50_s is not None and batch.p50_s is not None and interactive.p50_s < batch.p50_s, text
    assert interactive.max_s is not None and batch.max_s is not None and interactive.max_s < batch.max_s, text
    assert report.steward_exit == 0, text
    assert report.passed, text
    assert report.to_json()["passed"] is True


def test_the_mix_adds_up_and_bad_input_is_a_clear_error() -> None:
    plan = OverloadPlan.for_clients(CLIENTS, 20.0)
    assert sum(caller.count for caller in plan.callers) == CLIENTS
    assert {caller.name: caller.count for caller in plan.callers} == {
        "family": 48, "guest": 8, "stranger": 8, "agents": 92, "agents asking interactive": 4, "jobs": 96}
    assert plan.batch_max_queue == 24 and plan.tokens_per_second == 200
    assert plan.background_queue_timeout == 5.05 and plan.interactive_slo_wait == 1.0
    for bad in ({"clients": 10, "capacity_per_s": 20.0}, {"clients": CLIENTS, "capacity_per_s": 0.0},
                {"clients": CLIENTS, "capacity_per_s": float("nan")}):
        with pytest.raises(ValueError, match="must be"):
            OverloadPlan.for_clients(**bad)  # type: ignore[arg-type]


def test_a_metrics_page_is_read_into_the_figures_the_checks_need() -> None:
    page = "\n".join([
        "# TYPE steward_queued gauge", 'steward_queued{class="interactive"} 3.0', 'steward_queued{class="batch"} 2.0',
        "# TYPE steward_waiting gauge", 'steward_waiting{engine="chat",class="interactive"} 3.0',
        'steward_waiting{engine="chat",class="batch"} 2.0',
        "# TYPE steward_rejected counter", 'steward_rejected_total{class="batch",reason="queue_full"} 4.0',
        'steward_rejected_total{class="",reason="invalid_api_key"} 1.0',
        'steward_rejected_created{class="batch",reason="queue_full"} 1.7e9',
        "# TYPE steward_requests counter",
        'steward_requests_total{listener="openai",key="jobs",class="batch",status="429"} 4.0',
        'steward_requests_total{listener="openai",key="",class="",status="401"} 1.0',
        "# TYPE steward_health_status gauge", 'steward_health_status{status="ok"} 0.0',
        'steward_health_status{status="overloaded"} 1.0', ""])
    scrape = parse_scrape(page)
    assert scrape.total_queued == 5 and scrape.waiting == 5
    assert scrape.rejected == {"queue_full": 4, "invalid_api_key": 1}
    assert scrape.requests == {429: 4, 401: 1}
    assert scrape.health == "overloaded"


def test_the_usage_rows_and_events_are_counted_per_status_reason_and_class() -> None:
    rows = [("interactive", 200, None, 0.5), ("interactive", 200, None, 1.5), ("batch", 200, None, 4.0),
            ("batch", 429, "queue_full", 0.0), (None, 401, "invalid_api_key", None)]
    usage = usage_figures(rows)
    assert usage.rows == 5 and usage.by_status == {200: 3, 401: 1, 429: 1}
    assert usage.by_error == {"invalid_api_key": 1, "queue_full": 1}
    assert usage.waits["interactive"] == Waits(2, 1.0, 1.45, 1.5)
    assert usage.waits["background"] == Waits(0, None, None, None)
    records = [{"event": "reject", "reason": "queue_full"}, {"event": "timeout", "waited_s": 5.0},
               {"event": "refused", "reason": "invalid_api_key"}, {"event": "dispatch"}]
    assert event_rejections(records) == {"queue_full": 1, "queue_timeout": 1, "invalid_api_key": 1}


def test_the_seeds_invisible_overload_fails_every_check_it_hid() -> None:
    # The seed's figures: 256 requests, 16 rejected, the gauge zero in 253 samples, only ok rows
    # (508 of them), health 200, no alert.
    seed = OverloadReport(
        clients=256, capacity_per_s=26 / 60, max_tokens=10, duration_s=600.0, answers={200: 240, 503: 16},
        rejected_by_clients={"queue_timeout": 16}, rejected_by_metrics={}, rejected_by_events={},
        requests_by_metrics={}, samples=253, counted_samples=253, zero_queued_samples=253,
        zero_waiting_samples=253, max_queued=0,
        usage=UsageFigures(508, {200: 508}, {}, {"interactive": Waits(100, 117.0, 121.0, 122.0),
                                                 "batch": Waits(40, 60.0, 100.0, 118.0)}),
        health_seen={"ok": 253}, overloaded_http={}, overloaded_reasons=(), health_events=(), alerts=(),
        alert_sent_events=0, steward_exit=0)
    problems = "\n".join(seed.problems)
    for hidden in ("steward_queued read 0 in 253", "steward_waiting read 0 in 253", "steward_rejected_total",
                   "the event log's rejections", "508 rows for 256 requests", "usage log's statuses",
                   "/healthz never said overloaded", "no health event", "0 alerts", "0 alert_sent",
                   "queue_full", "not less than batch"):
        assert hidden in problems, problems
    assert not seed.passed
    assert "FAILED" in format_overload_report(seed)


@pytest.mark.slow
def test_a_steward_that_cannot_start_is_a_clear_error_and_leaves_nothing(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: OverloadPlan, workdir: Path, webhook: str) -> dict[str, object]:
        return {**original(self, workdir, webhook), "gpu": {"probe": "none", "budget": "lots"}}

    original = OverloadPlan.config
    monkeypatch.setattr(OverloadPlan, "config", broken)
    with pytest.raises(RuntimeError, match="steward exited with status") as failure:
        run_overload(tmp_path, clients=64)
    assert "gpu.budget" in str(failure.value)
    with pytest.raises(RuntimeError, match="needs a fresh folder"):
        run_overload(tmp_path, clients=64)  # its keys are there already


def test_steward_loadtest_runs_the_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    from supervisor.cli import main

    assert main(["loadtest", "--scenario", "overload", "--clients", "10"]) == 2  # refused before anything starts
    assert "64" in capsys.readouterr().err
