"""`steward loadtest --scenario real`: issue 27's mix on real llama-servers beside the simulator.

The pieces are tested on made-up figures; the whole, briefly, on the real llama-server with
SmolLM2 (its report's shape, not the issue's targets: this machine is shared)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from supervisor.tools import loadtest_real
from supervisor.config import SchedulerConfig
from supervisor.tools.loadtest_clients import Outcome
from supervisor.tools.loadtest_report import LoadReport
from supervisor.tools.loadtest_real import (
    MIX,
    ClassFigures,
    RealReport,
    Sizes,
    format_real_report,
    longest_queue_wait,
    mix_scenario,
    request_sizes,
    served_rate,
    simulated_figures,
)
from supervisor.engines.measurements import HOST_KEY
from supervisor.tools.simulate.scenario import Calibration, EngineFigures, Range
from supervisor.tools.simulate.targets import Verdict

ENGINES = [client.kind.model for client in MIX]


def _calibration() -> Calibration:
    return Calibration(1.5, 0.2, {name: EngineFigures(60.0, 300.0, 0.5) for name in ENGINES}, "state.json")


def _request(model: str, klass: str, status: int, queued: float | None, duration: float, prompt: int | None,
             completion: int | None) -> dict[str, Any]:
    return {"ts": 1.0, "mono": 1.0, "v": 1, "event": "request", "level": "info", "model": model, "class": klass,
            "status": status, "queued_s": queued, "duration_s": duration, "prompt_tokens": prompt,
            "completion_tokens": completion}


def test_the_real_runs_figures_from_the_event_log(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    records = [_request("chat", "interactive", 200, 0.5, 2.5, 40, 60),
               _request("chat", "interactive", 200, 0.0, 1.0, 80, 20),
               _request("embed", "background", 200, 1.0, 11.0, 6400, 0),
               _request("batch", "batch", 499, 29.5, 29.6, None, None),  # left while queued: it waited all the same
               _request("batch", "batch", 200, 12.0, 20.0, 1500, 100)]
    events.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert request_sizes(events) == {"chat": Sizes(Range(40, 80), Range(20, 60)),
                                     "embed": Sizes(Range(100, 100), Range(0, 0)),  # 64 inputs
                                     "batch": Sizes(Range(1500, 1500), Range(100, 100))}
    assert served_rate(events, "interactive") == 80 / 3.0  # tokens over the time after the queue
    assert served_rate(events, "background") is None  # embeddings generate nothing
    assert longest_queue_wait(events, "batch") == 29.5
    assert longest_queue_wait(events, "interactive") == 0.5


def test_the_mix_in_the_simulator_has_the_calibration_and_the_real_sizes() -> None:
    sizes = {"agent": Sizes(Range(1000, 2000), Range(64, 128))}
    scenario = mix_scenario(60.0, _calibration(), sizes, {"chat": 0.2})
    assert scenario.gpu.memory == 3 * 1024**3 and set(scenario.engines) == set(ENGINES)
    assert (scenario.gpu.sharing.alpha, scenario.gpu.sharing.batching_gain) == (1.5, 0.2)
    chat = scenario.engines["chat"]
    assert (chat.memory, chat.speed, chat.prompt_speed, chat.load_time, chat.stop_time, chat.slots) == \
        (1024**3, 60.0, 300.0, 0.5, 0.2, 2)
    assert scenario.engines["agent"].stop_time == 0.5  # not measured: assumed
    assert scenario.clients["agent"].prompt_tokens == Range(1000, 2000)  # as the real run's engine counted them
    assert scenario.clients["chat"].output_tokens == Range(32, 96)  # not seen: what the clients ask for
    assert scenario.clients["embedding"].inputs == 64 and scenario.present_classes() == list(
        ("interactive", "background", "batch"))
    figures = simulated_figures(scenario, (1, 2))
    assert set(figures) == {"interactive", "background", "batch"}
    assert figures["interactive"].completed > 0 and figures["interactive"].tokens_per_s is not None
    with pytest.raises(RuntimeError, match="the calibration has no speed for chat"):
        mix_scenario(60.0, Calibration(1.0, 0.5, {}), {}, {})


def _outcome(kind: str, klass: str, latency: float) -> Outcome:
    return Outcome(kind, klass, 0.0, latency, 200, ttft=0.1 if klass == "interactive" else None, ending="done")


def _report(chat_p95: float, batch_wait: float | None, simulated_done: float) -> RealReport:
    scenario = mix_scenario(30.0, _calibration(), {}, {})
    real = {"interactive": ClassFigures(10, 1.0, chat_p95, 0.1, 50.0),
            "background": ClassFigures(4, 5.0, 8.0, 2.0, 20.0),
            "batch": ClassFigures(2, 9.0, 12.0, batch_wait, 20.0)}
    simulated = {k: ClassFigures(simulated_done, f.p50_s, f.p95_s, f.longest_wait_s, f.tokens_per_s)
                 for k, f in real.items()}
    mix = LoadReport(30.0, [_outcome("chat", "interactive", 1.0), _outcome("agent", "background", 5.0)])
    alone = LoadReport(30.0, [_outcome("chat", "interactive", 0.8)])
    return RealReport(30.0, 7, (1, 2), scenario, alone, mix, real, ClassFigures(12, 0.8, 1.0, 0.0, 60.0), simulated,
                      ClassFigures(12, 0.8, 1.1, 0.0, 60.0), 10.5)


def test_the_verdicts_of_the_issues_targets() -> None:
    report = _report(chat_p95=1.2, batch_wait=8.0, simulated_done=9)
    checks = {c.what: c for c in report.checks()}
    assert checks["interactive p95 at most 1.3x its alone run"].verdict is Verdict.PASS
    assert checks["interactive p95 at most 1.3x its alone run"].detail == "1.20 s vs 1.00 s (1.20x)"
    assert checks["background completes work"].verdict is Verdict.PASS
    assert checks["batch's longest wait within its bound"].verdict is Verdict.PASS
    assert checks["simulated interactive completions within ±25 % of real"].detail == "9.0 vs 10.0 (0.90x)"
    assert checks["simulated background completions within ±25 % of real"].verdict is Verdict.MISS  # 9 vs 4
    assert not report.passed
    worse = {c.what: c.verdict for c in _report(chat_p95=1.5, batch_wait=None, simulated_done=10).checks()}
    assert worse["interactive p95 at most 1.3x its alone run"] is Verdict.MISS
    assert worse["batch's longest wait within its bound"] is Verdict.MISS


def test_the_report_side_by_side_and_as_json() -> None:
    report = _report(chat_p95=1.2, batch_wait=8.0, simulated_done=10)
    text = format_real_report(report)
    assert "chats alone p50 / p95 s      0.80 / 1.00     0.80 / 1.10" in text.splitlines()
    assert "  p95 / alone p95                  1.20x           1.09x" in text.splitlines()
    assert "  longest wait s                    8.00            8.00" in text.splitlines()
    assert "  PASS  batch's longest wait within its bound: 8.00 s vs 10.50 s" in text
    result = json.loads(json.dumps(report.to_json()))
    assert result["real"]["ratio"] == 1.2 and result["simulated"]["ratio"] == 1.091
    assert result["calibration"]["alpha"] == 1.5 and set(result["calibration"]["engines"]) == set(ENGINES)
    assert set(result["loadtest"]) == {"alone", "mix"} and len(result["checks"]) == 10


def _have_real_engines() -> None:
    from fakes.llama_binary import llama_server_path

    try:
        llama_server_path()
        loadtest_real.smollm2_path()
    except (FileNotFoundError, RuntimeError) as exc:
        pytest.skip(str(exc))


def test_the_mix_in_the_simulator_reads_prompts_as_the_calibration_measured() -> None:
    calibration = attrs.evolve(_calibration(), prefill_alpha=0.4, prefill_batching_gain=0.0)
    sharing = mix_scenario(60.0, calibration, {}, {}).gpu.sharing
    assert (sharing.alpha, sharing.batching_gain, sharing.prefill_alpha, sharing.prefill_batching_gain) == (
        1.5, 0.2, 0.4, 0.0)


def test_a_calibration_without_the_mixs_engines_is_refused_before_any_run(tmp_path: Path) -> None:
    _have_real_engines()
    state = tmp_path / "state.json"
    state.write_text(json.dumps({HOST_KEY: {"alpha": 1.0, "batching_gain": 0.5, "cores": 2}}))
    with pytest.raises(RuntimeError, match="the calibration has no speed for chat"):
        loadtest_real.run_real_loadtest(20.0, calibration=state, say=lambda line: None)


@pytest.mark.slow
def test_the_real_mix_briefly(tmp_path: Path) -> None:
    _have_real_engines()
    # A calibration given (calibrate has its own test): the figures are this test's, the runs real.
    state = tmp_path / "state.json"
    state.write_text(json.dumps({f"k-{name}": {"engine": name, "decode_tps": 50.0, "prompt_tps": 250.0,
                                               "load_s": 0.5, "measured_at": 1.0} for name in ENGINES}
                                | {HOST_KEY: {"alpha": 1.5, "batching_gain": 0.3, "cores": 2, "prefill_alpha": 0.2,
                                              "prefill_batching_gain": 0.0}}))
    said: list[str] = []
    report = loadtest_real.run_real_loadtest(20.0, calibration=state, seeds=(1, 2), say=said.append)
    assert report.duration_s == 20.0 and report.scenario.gpu.sharing.alpha == 1.5
    assert (report.scenario.gpu.sharing.prefill_alpha, report.scenario.gpu.sharing.prefill_batching_gain) == (0.2, 0.0)
    assert report.real_alone.completed > 0 and report.real["interactive"].completed > 0
    assert set(report.real) == set(report.simulated) == {"interactive", "background", "batch"}
    result = report.to_json()
    assert result["real"]["mix"]["interactive"]["p95_s"] is not None
    assert {c["what"] for c in result["checks"]} >= {"interactive p95 at most 1.3x its alone run",
                                                     "batch's longest wait within its bound"}
    text = format_real_report(report)
    assert "targets (issue 27)" in text
    assert "(alpha 1.50, batching gain 0.30; prompts: alpha 0.20, batching gain 0.00; chat 50 tok/s" in text
    assert any(line.startswith("loadtest: the mix, 20s") for line in said)


def test_batchs_bound_is_the_one_the_core_documents_read_from_the_runs_steps(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    steps = [("chat", "interactive", 40.0), ("agent", "background", 30.0), ("batch", "batch", 12.0),
             ("agent", "background", None)]
    events.write_text("".join(json.dumps({"ts": 1.0, "mono": 1.0, "v": 1, "event": "complete", "level": "debug",
                                          "model": m, "class": k, "duration_s": d}) + "\n" for m, k, d in steps))
    longest = loadtest_real.longest_lower_class_step(events)
    assert longest == 30.0  # a chat's step is not a lower-class step
    # batch_max_starvation 10 s + 30 s / guard_share 0.5 + guard_gap_wait 15 s + a 1.5 s load
    assert loadtest_real.documented_batch_bound(SchedulerConfig(), longest, 1.5) == 10.0 + 60.0 + 15.0 + 1.5
