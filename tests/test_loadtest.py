"""steward loadtest: the real-time client mix against its own steward on fake engines, with and without chaos."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from supervisor.tools import chaos, loadtest_thrash
from supervisor.cli import main
from supervisor.tools.loadtest import run_loadtest
from supervisor.tools.loadtest_chaos import ChaosOptions
from supervisor.tools.loadtest_clients import LoadTally, Outcome, default_kinds, serve_progress
from supervisor.tools.loadtest_report import LoadReport, format_report, summarize_events
from supervisor.tools.simulate import builtin_scenario
from supervisor.tools.simulate.targets import Verdict
from tests.conftest import descendants

MODELS = {"chat": "gemma4-12b", "background": "gemma4-e4b", "batch": "gemma4-e2b", "embedding": "nomic-embed"}
INVARIANTS = ["alive", "answers", "idle", "ledger", "processes", "fds"]


@pytest.mark.slow
def test_a_short_mixed_load_completes_work_in_every_class_without_errors(capfd: pytest.CaptureFixture[str]) -> None:
    said: list[str] = []
    report = run_loadtest(None, {"chat": 2, "background": 2, "batch": 1, "embedding": 1}, 6.0, MODELS, say=said.append)
    table = report.by_class()
    assert all(table[klass]["completed"] > 0 for klass in ("interactive", "background", "batch")), table
    assert sum(row["errors"] for row in table.values()) == 0, report.to_json()
    kinds = report.by_kind()
    assert list(kinds) == ["chat", "background", "batch", "embedding"]
    assert all(row["completed"] > 0 and row["reason"] is None for row in kinds.values()), kinds
    assert [line.split()[0] for line in format_report(report).splitlines()[1:5]] == list(kinds)
    # What the loadtest says as it goes: its steward, the load, progress (6 s: at least the 5 s line), the stop.
    assert said[0].startswith("loadtest: its steward is up at http://127.0.0.1:") and "steward.stderr" in said[0]
    assert said[1].startswith("loadtest: clients for 6s against ")
    assert "chat 2, background 2, batch 1, embedding 1" in said[1]
    assert re.fullmatch(r"loadtest \d+s(/6s| \(the 6s load is over.*\)): chat .*; embedding .*", said[2]), said
    assert said[-2:] == ["loadtest: stopping its steward, as planned (it finishes what is in flight, then stops its "
                         "engines)", "loadtest: its steward has stopped"]
    assert report.problems is not None and not {"exit", "shutdown_cut"} & set(report.problems)  # a planned stop
    assert "SIGTERM" not in capfd.readouterr().err  # steward's own line about it stays in its output file
    assert report.engine_events is not None and report.engine_events["loads"] >= 4
    assert report.engine_events["unnecessary_loads"] == 0
    assert any(o.kind == "embedding" and o.status == 200 for o in report.outcomes)
    assert report.chaos is None and report.passed
    json.dumps(report.to_json())  # machine-readable as it is


@pytest.mark.slow
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
    assert list(document["kinds"]) == ["chat", "embedding", "ollama", "image"]


def _tally(**counts: int) -> LoadTally:
    return LoadTally.of({kind: counts[kind.name] for kind in default_kinds(MODELS) if kind.name in counts})


def _answered(kind: str, sent: float, status: int = 200, ending: str = "done") -> Outcome:
    return Outcome(kind, "interactive", sent, 1.0, status, ending=ending)


def test_a_progress_line_counts_each_kind_and_ages_only_long_waits() -> None:
    tally = _tally(chat=2, background=1, embedding=1)
    tally.ended(tally.sent("chat", 100.0), _answered("chat", 100.0))
    tally.sent("chat", 101.0)
    tally.ended(tally.sent("background", 100.5), _answered("background", 100.5, 503, "answer"))
    tally.ended(tally.sent("background", 101.5), _answered("background", 101.5, ending=chaos.LEFT))
    tally.sent("background", 105.0)
    tally.sent("embedding", 100.0)
    assert tally.progress_line(112.9, started=100.0, duration=30.0) == (
        "loadtest 12s/30s: chat 1 done, 1 in flight (oldest 11s); background 0 done, 1 failed, 1 left, 1 in flight; "
        "embedding 0 done, 1 in flight (oldest 12s)")
    assert tally.progress_line(135.0, started=100.0, duration=30.0) == (
        "loadtest 35s (the 30s load is over; waiting for 3 answers): chat 1 done, 1 in flight (oldest 34s); "
        "background 0 done, 1 failed, 1 left, 1 in flight (oldest 30s); embedding 0 done, 1 in flight (oldest 35s)")


async def test_progress_is_said_on_a_fixed_grid_until_cancelled(autojump_clock: trio.testing.MockClock) -> None:
    tally = _tally(chat=1)
    said: list[str] = []
    async with trio.open_nursery() as nursery:
        started = trio.current_time()
        await nursery.start(functools.partial(serve_progress, tally, said.append, started=started, duration=12.0,
                                              interval=5.0))
        ticket = tally.sent("chat", started)
        await trio.sleep(7.0)
        tally.ended(ticket, _answered("chat", started))
        tally.sent("chat", trio.current_time())
        await trio.sleep(9.5)
        nursery.cancel_scope.cancel()
    assert said == ["loadtest 5s/12s: chat 0 done, 1 in flight", "loadtest 10s/12s: chat 1 done, 1 in flight",
                    "loadtest 15s (the 12s load is over; waiting for 1 answer): chat 1 done, 1 in flight"]


def test_every_kind_started_has_a_row_and_one_that_completed_nothing_says_why() -> None:
    tally = _tally(chat=1, background=1, batch=1, embedding=1, image=1)
    outcomes = [_answered("chat", 0.0), _answered("background", 1.0, 503, "answer"),
                _answered("background", 2.0, 0, "no_answer"), _answered("background", 3.0, ending=chaos.LEFT)]
    for outcome in outcomes:
        tally.ended(tally.sent(outcome.kind, outcome.started), outcome)
    tally.sent("image", 4.0)  # the load was stopped before its answer (chaos: steward died)
    report = LoadReport(10.0, outcomes, tally=tally)
    rows = report.by_kind()
    assert list(rows) == ["chat", "background", "batch", "embedding", "image"]
    assert rows["chat"]["reason"] is None and rows["chat"]["completed"] == 1
    assert rows["background"]["reason"] == "none of 3 completed: 503 answer x1, no_answer x1, left early x1"
    assert {k: rows["embedding"][k] for k in ("class", "clients", "requests", "completed", "errors", "reason")} == {
        "class": "background", "clients": 1, "requests": 0, "completed": 0, "errors": 0,
        "reason": "sent no request before the load ended"}
    assert rows["image"]["class"] == "comfyui" and rows["image"]["unanswered"] == 1
    assert rows["image"]["reason"] == "1 sent, still without an answer when the load was stopped"
    text = format_report(report).splitlines()
    assert text[4] == ("embedding  background         0         0      0    0    0       -       -       -  "
                       "sent no request before the load ended")
    assert [line.split()[0] for line in text[1:6]] == list(rows)
    assert json.loads(json.dumps(report.to_json()))["kinds"] == rows


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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


# ---- the thrash scenario on real processes (issue 16) -------------------------------------

def test_the_scaled_thrash_scenario_is_thrash_in_fewer_seconds_as_the_fakes_run_it() -> None:
    thrash, scaled = builtin_scenario("thrash"), loadtest_thrash.scaled_thrash(0.25, 60.0)
    assert scaled.duration == 60.0 and scaled.gpu.memory == thrash.gpu.memory
    qwen, fast = thrash.engines["qwen3-14b"], scaled.engines["qwen3-14b"]
    assert (fast.load_time, fast.stop_time, fast.speed, fast.memory) == (2.5, 0.25, 240.0, qwen.memory)
    coder = scaled.clients["coder"]
    # 1500-3000 prompt tokens at 2000/s take as long as 45-90 output tokens at 60/s.
    assert (coder.prompt_tokens.high, coder.output_tokens.low, coder.output_tokens.high) == (0.0, 145.0, 390.0)
    assert (coder.think.low, coder.think.high) == (0.25, 1.0)
    assert scaled.scheduler.swap_hold == thrash.scheduler.swap_hold * 0.25
    assert scaled.scheduler.guard_share == thrash.scheduler.guard_share  # not a duration
    assert scaled.gpu.sharing.engine_share(computing=2, loading=1) == 1.0  # the fakes do not slow each other
    kinds = loadtest_thrash.agent_kinds(scaled)
    assert [(k.name, k.model, k.max_tokens, n) for k, n in kinds.items()] == [
        ("coder", "qwen3-14b", (145, 390), 1), ("reviewer", "phi4-14b", (145, 390), 1),
        ("planner", "gemma3-12b", (144, 389), 1)]
    with pytest.raises(ValueError, match="time scale must be positive"):
        loadtest_thrash.scaled_thrash(0.0, 60.0)


def test_the_simulator_replays_the_load_and_stop_times_and_speeds_steward_measured(tmp_path: Path) -> None:
    records = [
        {"event": "load", "engine": "a", "mono": 10.0},
        {"event": "ready", "engine": "a", "mono": 11.5, "load_s": 1.5, "wake": False},
        {"event": "request", "model": "a", "status": 200, "completion_tokens": 300, "duration_s": 2.5,
         "queued_s": 1.0},
        {"event": "request", "model": "a", "status": 503, "completion_tokens": 0, "duration_s": 9.0, "queued_s": None},
        {"event": "stop", "engine": "a", "mono": 20.0},
        {"event": "stopped", "engine": "a", "mono": 20.125, "released": 0},  # its memory not yet seen free
        {"event": "released", "engine": "a", "mono": 20.25},
        {"event": "ready", "engine": "a", "mono": 30.0, "load_s": 2.5, "wake": False},
        {"event": "request", "model": "a", "status": 200, "completion_tokens": 100, "duration_s": 0.5,
         "queued_s": None},
        {"event": "stop", "engine": "a", "mono": 40.0},  # steward's own stop at the end: never released
    ]
    log = tmp_path / "events.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    measured = loadtest_thrash.measured_engines(log)
    assert measured["a"] == loadtest_thrash.Measured(load_s=2.0, stop_s=0.25, speed=200.0)  # 400 tokens in 2 s
    scenario = loadtest_thrash.scaled_thrash(0.5, 10.0)
    replayed = loadtest_thrash.with_measured(scenario, {"qwen3-14b": measured["a"]})
    assert (replayed.engines["qwen3-14b"].load_time, replayed.engines["qwen3-14b"].speed) == (2.0, 200.0)
    assert replayed.engines["phi4-14b"] == scenario.engines["phi4-14b"]  # not seen: as nominal


def test_thrash_figures_compare_loads_per_100_requests_within_the_tolerance() -> None:
    scenario = loadtest_thrash.scaled_thrash(0.1, 20.0)

    def report(loads: int, completed: int) -> loadtest_thrash.ThrashReport:
        load = LoadReport(20.0, [Outcome("coder", "background", 0.0, 1.0, 200)] * completed,
                          engine_events={"loads": loads, "evictions": 0, "unnecessary_loads": 0,
                                         "peak_reserved_bytes": 0})
        simulated = {1: loadtest_thrash.Loads(9, 30), 2: loadtest_thrash.Loads(11, 30)}  # 30 and 36.7: mean 33.3
        return loadtest_thrash.ThrashReport(scenario, 0.1, load, simulated)

    assert report(13, 40).verdict is Verdict.PASS  # 32.5 vs 33.3
    assert report(17, 40).verdict is Verdict.MISS and not report(17, 40).passed  # 42.5: 1.28x
    assert report(3, 0).verdict is Verdict.MISS  # nothing completed
    text = loadtest_thrash.format_thrash_report(report(13, 40)).splitlines()
    assert text[-3:] == ["  real       13 loads, 40 requests completed: 32.5 loads per 100 requests",
                         "  simulated  33.3 loads per 100 requests (mean of seeds 1-2, 30.0-36.7), the same scaled "
                         "scenario",
                         "  PASS  real loads per 100 requests within ±20 % of simulated: 32.5 vs 33.3 (0.98x)"]


@pytest.mark.slow
def test_thrash_on_real_processes_loads_as_often_as_the_simulator_says(capsys: pytest.CaptureFixture[str]) -> None:
    # 24 s at a twentieth of thrash's times: about 70 requests and 17 loads.
    assert main(["loadtest", "--scenario", "thrash", "--duration", "24s", "--time-scale", "0.05"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert [line.split()[0] for line in lines[1:4]] == ["coder", "reviewer", "planner"]
    real = next(line for line in lines if line.startswith("  real "))
    loads, completed = (int(n) for n in re.fullmatch(r"  real +(\d+) loads, (\d+) requests completed: .*", real).groups())
    assert loads > 3 and completed >= 20, captured.out  # the three first loads, and swaps after
    assert re.search(r"^  simulated  [\d.]+ loads per 100 requests \(mean of seeds 1-8, ", captured.out, re.M)
    assert re.search(r"^  PASS  real loads per 100 requests within ±20 % of simulated", captured.out, re.M), (
        captured.out)
    assert "loadtest: its steward has stopped" in captured.err
    assert descendants() == []  # steward and its engines are gone


def test_thrash_runs_only_on_its_own_steward(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["loadtest", "--scenario", "thrash", "--url", "http://127.0.0.1:9", "--chaos"]) == 2
    assert capsys.readouterr().err == ("steward: loadtest: --scenario thrash runs its own steward on fake engines, "
                                       "as the simulator replays it; leave out --url, --chaos\n")
    assert main(["loadtest", "--scenario", "thrash", "--time-scale", "-1"]) == 2
    assert capsys.readouterr().err == "steward: loadtest: the time scale must be positive, got -1\n"
    assert main(["loadtest", "--time-scale", "0.5", "--url", "http://127.0.0.1:9"]) == 2
    assert capsys.readouterr().err == "steward: loadtest: --time-scale is for --scenario thrash\n"
