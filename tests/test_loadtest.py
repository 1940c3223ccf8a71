"""steward loadtest: the real-time client mix against its own steward on fake engines, with and without chaos."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import attrs
import pytest
import trio

from supervisor import chaos
from supervisor.cli import main
from supervisor.loadtest import ChaosOptions, Outcome, run_loadtest, summarize_events

MODELS = {"chat": "gemma4-12b", "background": "gemma4-e4b", "batch": "gemma4-e2b", "embedding": "nomic-embed"}
INVARIANTS = ["alive", "answers", "idle", "ledger", "processes", "fds"]


def test_a_short_mixed_load_completes_work_in_every_class_without_errors() -> None:
    report = run_loadtest(None, {"chat": 2, "background": 2, "batch": 1, "embedding": 1}, 6.0, MODELS)
    table = report.by_class()
    assert all(table[klass]["completed"] > 0 for klass in ("interactive", "background", "batch")), table
    assert sum(row["errors"] for row in table.values()) == 0, report.to_json()
    assert report.engine_events is not None and report.engine_events["loads"] >= 4
    assert report.engine_events["unnecessary_loads"] == 0
    assert any(o.kind == "embedding" and o.status == 200 for o in report.outcomes)
    assert report.chaos is None and report.passed
    json.dumps(report.to_json())  # machine-readable as it is


def test_a_short_chaos_run_reports_every_invariant_with_its_figures() -> None:
    announced: list[chaos.ChaosRecord] = []
    options = ChaosOptions(interval=1.0, freeze=(1.0, 1.5), warmup=1.5, sample_interval=1.0)
    report = run_loadtest(None, {"chat": 1, "embedding": 1, "ollama": 1, "image": 1}, 6.0, MODELS, seed=3,
                          disconnect_rate=0.3, chaos_options=options, announce=announced.append)
    assert report.chaos is not None
    c = report.chaos
    assert [i.name for i in c.invariants] == INVARIANTS
    assert all(isinstance(i.passed, bool) and i.detail for i in c.invariants)
    assert report.passed == all(i.passed for i in c.invariants)
    # Every scheduled action was carried out or found its target not running, and announced.
    assert len([r for r in c.records if r.action != "thaw"]) == len(c.schedule) > 0
    assert announced == c.records
    assert all(r.result in ("sent", "not running", "gone") for r in c.records)
    assert {o.kind for o in report.outcomes} >= {"chat", "embedding", "ollama", "image"}
    assert c.samples and c.rss()["peak"] >= c.rss()["start"] > 0  # type: ignore[operator]
    document = json.loads(json.dumps(report.to_json()))
    assert [i["name"] for i in document["invariants"]] == INVARIANTS
    assert document["passed"] == report.passed
    assert set(document["steward"]) == {"rss_bytes", "fds", "samples", "log_problems"}
    assert set(document["classes"]) == {"interactive", "background", "batch", "ollama", "image"}


def test_chaos_needs_the_loadtests_own_steward(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RuntimeError, match="--url"):
        run_loadtest("http://127.0.0.1:9", {"chat": 1}, 1.0, MODELS, chaos_options=ChaosOptions())
    assert main(["loadtest", "--url", "http://127.0.0.1:9", "--chaos"]) == 2
    assert "--chaos" in capsys.readouterr().err


def test_the_chaos_schedule_follows_from_the_seed() -> None:
    targets = ["gemma4-12b", "nomic-embed", "ollama", "comfyui"]
    first = chaos.chaos_schedule(7, targets, start=5.0, end=300.0, mean_interval=5.0)
    assert first == chaos.chaos_schedule(7, reversed(targets), start=5.0, end=300.0, mean_interval=5.0)
    assert first != chaos.chaos_schedule(8, targets, start=5.0, end=300.0, mean_interval=5.0)
    assert all(5.0 < a.at < 300.0 and a.target in targets for a in first)
    assert {a.action for a in first} == set(chaos.ACTIONS)
    assert all((1.0 <= a.freeze_s <= 15.0) if a.action == "freeze" else a.freeze_s == 0.0 for a in first)
    assert chaos.chaos_schedule(7, [], start=0.0, end=10.0, mean_interval=1.0) == []


def _outcome(ending: str, status: int = 200) -> Outcome:
    return Outcome("chat", "interactive", 0.0, 1.0, status, ending=ending)


@pytest.mark.parametrize("lost", ["no_answer", "timeout", "truncated"])
def test_a_request_lost_without_an_answer_fails_the_answers_invariant(lost: str) -> None:
    outcomes = [_outcome("done"), _outcome("answer", 503), _outcome("error_event"), _outcome(lost, 0)]
    verdict = chaos.check_answers(outcomes)
    assert not verdict.passed
    assert verdict.figures["lost"] == 1 and verdict.figures["requests"] == 4
    assert f"{lost.replace('_', ' ')} 1" in verdict.detail


def test_answers_errors_and_clients_that_left_lose_nothing() -> None:
    outcomes = [_outcome("done"), _outcome("answer", 502), _outcome("error_event"), _outcome("disconnect"),
                _outcome("invalid")]
    verdict = chaos.check_answers(outcomes)
    assert verdict.passed and verdict.figures["lost"] == 0
    assert "1 left by their client" in verdict.detail


def test_the_ledger_must_equal_the_engines_reservations_and_stopped_engines_hold_nothing() -> None:
    def health(reserved: int, **engines: tuple[str, int]) -> dict[str, object]:
        return {"reserved": reserved, "engines": {n: {"status": s, "reserved": r} for n, (s, r) in engines.items()}}

    assert chaos.check_ledger(health(5, a=("ready", 3), b=("ready", 2), c=("stopped", 0))).passed
    mismatch = chaos.check_ledger(health(6, a=("ready", 3), b=("ready", 2)))
    assert not mismatch.passed and mismatch.figures["engines_reserved"] == 5
    stale = chaos.check_ledger(health(5, a=("ready", 3), b=("failed", 2)))
    assert not stale.passed and stale.figures["held_by_stopped"] == {"b": 2}
    assert not chaos.check_ledger(None).passed


def test_fd_growth_beyond_the_tolerance_fails() -> None:
    warm = chaos.FdCount(total=40, children=20, clients=10, own={"socket": 6, "pipe": 2, "file": 2, "other": 0})
    at_rest = chaos.FdCount(total=30, children=16, clients=0, own={"socket": 10, "pipe": 2, "file": 2, "other": 0})
    assert chaos.check_fds(warm, at_rest, tolerance=5).passed  # 10 -> 14
    leaky = chaos.FdCount(total=33, children=16, clients=1, own={"socket": 12, "pipe": 2, "file": 2, "other": 0})
    verdict = chaos.check_fds(warm, leaky, tolerance=5)  # 10 -> 17: a client connection kept counts too
    assert not verdict.passed and verdict.figures["own_end"] == 17
    assert not chaos.check_fds(warm, None, tolerance=5).passed


def test_a_process_left_behind_fails_and_is_named() -> None:
    assert chaos.check_processes([]).passed
    verdict = chaos.check_processes([(4242, "python -m fakes.llama_server --port 1")])
    assert not verdict.passed and "4242" in verdict.detail


def test_alive_and_idle_report_what_went_wrong() -> None:
    assert chaos.check_alive(None, 0, 0.4).passed
    assert not chaos.check_alive(-9, None, None).passed
    assert not chaos.check_alive(None, 1, 0.4).passed
    assert chaos.check_idle(True, 1.0, []).passed
    verdict = chaos.check_idle(False, 120.0, ["gemma4-12b: 1 in flight"])
    assert not verdict.passed and "1 in flight" in verdict.detail


def test_the_watch_follows_spawns_and_exits_line_by_line(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    compact = (",", ":")  # as steward writes its log
    first = json.dumps({"event": "spawn", "engine": "a", "pid": os.getpid()}, separators=compact) + "\n"
    second = json.dumps({"event": "exit", "engine": "a", "pid": os.getpid()}, separators=compact) + "\n"
    log.write_text(first + second[:10])  # steward may be mid-line
    watch = chaos.ProcessWatch(log)
    watch.poll()
    assert watch.live["a"] == chaos.Incarnation("a", os.getpid(), chaos.process_start_time(os.getpid()))
    with log.open("a") as f:
        f.write(second[10:])
    watch.poll()
    assert "a" not in watch.live and len(watch.spawned) == 1


def _sleeper() -> tuple[subprocess.Popen[bytes], chaos.Incarnation]:
    process = subprocess.Popen(["sleep", "30"])
    return process, chaos.Incarnation("x", process.pid, chaos.process_start_time(process.pid))


def test_a_signal_goes_only_to_the_named_child() -> None:
    process, incarnation = _sleeper()
    try:
        assert chaos.open_child_pidfd(incarnation, parent=os.getppid()) is None  # not its parent
        assert chaos.open_child_pidfd(attrs.evolve(incarnation, start_time=1), parent=os.getpid()) is None
        pidfd = chaos.open_child_pidfd(incarnation, parent=os.getpid())
        assert pidfd is not None
        assert chaos.send_signal(pidfd, signal.SIGTERM)
        assert process.wait(10) == -signal.SIGTERM
        assert not chaos.send_signal(pidfd, signal.SIGKILL)  # reaped: nobody is reached
        os.close(pidfd)
        assert chaos.open_child_pidfd(incarnation, parent=os.getpid()) is None
    finally:
        process.kill()
        process.wait()


async def test_chaos_freezes_continues_and_kills_children_of_the_given_parent(tmp_path: Path) -> None:
    process, _ = _sleeper()
    try:
        watch = chaos.ProcessWatch(tmp_path / "events.jsonl")
        watch.feed({"event": "spawn", "engine": "x", "pid": process.pid})
        schedule = [chaos.ChaosAction(0.0, "freeze", "x", freeze_s=0.1), chaos.ChaosAction(0.0, "stop", "y"),
                    chaos.ChaosAction(0.05, "kill", "x")]
        records: list[chaos.ChaosRecord] = []
        await chaos.run_chaos(schedule, watch, os.getpid(), trio.current_time(), records, lambda r: None)
        assert [(r.action, r.target, r.result) for r in records][:3] == [
            ("freeze", "x", "sent"), ("stop", "y", "not running"), ("kill", "x", "sent")]
        assert records[3].action == "thaw"  # sent or gone: the kill may have been reaped by then
        assert process.wait(10) == -signal.SIGKILL
    finally:
        process.kill()
        process.wait()


def test_own_fds_leave_out_pipes_shared_with_live_children() -> None:
    process = subprocess.Popen(["sleep", "30"], stdout=subprocess.PIPE)
    try:
        with_child = chaos.count_fds(os.getpid(), set())
        assert with_child is not None and with_child.children >= 1
        process.kill()
        process.wait()
        orphaned = chaos.count_fds(os.getpid(), set())  # the pipe is still open here: it is ours now
        assert orphaned is not None and orphaned.own["pipe"] >= with_child.own["pipe"] + 1
    finally:
        process.kill()
        process.wait()
        assert process.stdout is not None
        process.stdout.close()


def test_unnecessary_loads_are_reloads_after_an_eviction_that_was_not_needed(tmp_path: Path) -> None:
    records = [
        {"event": "load", "engine": "a", "reserved": 4},
        {"event": "evict", "engine": "a", "need": 3, "free": 1},  # needed: only 1 free of 3
        {"event": "load", "engine": "a", "reserved": 4},
        {"event": "evict", "engine": "a", "need": 3, "free": 5},  # not needed
        {"event": "load", "engine": "b", "reserved": 7},
        {"event": "restart", "engine": "ollama", "restart_in_s": 1.0},  # a service's restart: no load
        {"event": "load", "engine": "a", "reserved": 9},
    ]
    log = tmp_path / "events.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert summarize_events(log) == {"loads": 4, "evictions": 2, "unnecessary_loads": 1, "peak_reserved_bytes": 9}
