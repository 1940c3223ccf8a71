"""``steward gpu-check``: steward on a real GPU, its ledger and its estimates held against the device.

One command for the day a GPU is lent (``deploy/gpu-check.sh`` wraps it). It runs five steps
and reports each:

(a) the device, through NVML; without an NVIDIA driver it says so and exits with
    ``EXIT_NO_DEVICE``, having done nothing;
(b) a CUDA llama-server, built once into the cache (gpu_check_setup.py), the build's time said;
(c) ``steward run``, a real process, with SmolLM2 and three tiny models on it, every layer on the
    GPU, ``gpu.probe: nvml``; once each engine is ready: the ledger (``GET /admin/state``) against
    NVML's per-process memory (the engine's process tree folded), and ``steward estimate``'s
    components against the buffers the engine's log reports (the ``buffers`` event);
(d) the phantom-memory guard: kill -9 of one engine, then when its process left NVML's list, when
    its memory left the device, and what steward logged meanwhile, in milliseconds;
(e) steward stopped, and no process of its left behind.

Figures are reported, not judged, except the tolerances docs/estimates.md states for the estimate
(PASS/FAIL). The exit status is 0 when every step ran. ``--simulated`` runs the same flow on a
simulated GPU with the CPU llama-server (``fakes/simgpu_engine.py``): how the flow is tested
without a GPU (tests/test_gpu_check.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx

from supervisor.accounting.estimate import estimate
from supervisor.engines.probes import GpuReading
from supervisor.engines.process_tree import alive, fold_to_roots, read_parents, tree_of
from supervisor.exit_status import EXIT_NO_DEVICE
from supervisor.observe.events import read_event_log
from supervisor.tools.chaos import descendants
from supervisor.tools.demo import open_workdir
from supervisor.tools.gpu_check_setup import (
    RELEASE_TIMEOUT_S,
    SMOLLM2,
    CheckModel,
    DeviceFound,
    NoDevice,
    StepFailed,
    check_models,
    engine_command,
    find_device,
    find_llama_server,
    steward_config,
)
from supervisor.tools.gpu_check_tables import (
    PHANTOM_EVENTS,
    ComponentCheck,
    EngineMemory,
    PhantomRecord,
    ProbeSample,
    compare_components,
    device_buffers,
    format_components,
    format_memory,
    format_phantom,
)
from supervisor.tools.loadtest_steward import EVENTS_FILE, STEWARD_OUTPUT, output_tail, start_steward, stop_steward
from supervisor.units import format_size

READY_TIMEOUT_S = {True: 60.0, False: 300.0}  # simulated, real: every engine loaded (CUDA starts slower)
MEASURED_TIMEOUT_S = 10.0  # steward's probe has read every ready engine's memory by then
PHANTOM_EXTRA_S = 5.0  # watched past release_timeout before the check gives up on a release
SAMPLE_INTERVAL_S = 0.02
SAVED = ("config.yaml", EVENTS_FILE, STEWARD_OUTPUT)  # the run's files that --save keeps beside the report
_FAILURES = ("crash", "spawn_failed", "start_timeout")


@attrs.define
class Section:
    title: str
    ran: bool
    text: str


@attrs.define
class EngineRun:
    """One engine as the event log tells it (docs/events.md)."""

    name: str
    planned: int = 0  # memory_plan
    source: str = ""
    pid: int | None = None  # spawn
    argv: list[str] = attrs.Factory(list)
    load_s: float | None = None  # ready
    buffers: dict[str, dict[str, int]] | None = None  # buffers
    failure: str | None = None  # crash, spawn_failed or start_timeout before it was ready

    @property
    def settled(self) -> bool:
        return self.load_s is not None or self.failure is not None


def engine_runs(records: Iterable[dict[str, Any]], names: Sequence[str]) -> dict[str, EngineRun]:
    runs = {name: EngineRun(name) for name in names}
    for record in records:
        run = runs.get(record.get("engine", ""))
        if run is None:
            continue
        match record["event"]:
            case "memory_plan":
                run.planned, run.source = record["memory"], record["source"]
            case "spawn":
                run.pid, run.argv = record["pid"], record["argv"]
            case "ready" if run.load_s is None:
                run.load_s = record["load_s"]
            case "buffers" if run.buffers is None:
                run.buffers = record["devices"]
            case event if event in _FAILURES and run.load_s is None and run.failure is None:
                run.failure = f"{event}: {record.get('detail') or record.get('timeout_s')}"
    return runs


@attrs.define
class GpuCheckReport:
    simulated: bool
    sections: list[Section] = attrs.Factory(list)
    memory: list[EngineMemory] = attrs.Factory(list)
    components: dict[str, list[ComponentCheck]] = attrs.Factory(dict)
    phantom: PhantomRecord | None = None
    left_behind: list[tuple[int, str]] = attrs.Factory(list)

    def add(self, title: str, ran: bool, text: str) -> None:
        self.sections.append(Section(title, ran, text))

    @property
    def verdicts(self) -> list[str]:
        return [check.verdict for checks in self.components.values() for check in checks if check.verdict]

    @property
    def all_ran(self) -> bool:
        return bool(self.sections) and all(section.ran for section in self.sections)


def format_report(report: GpuCheckReport) -> str:
    mode = "a simulated GPU, the CPU llama-server (--simulated)" if report.simulated else "NVML, the CUDA llama-server"
    lines = [f"steward gpu-check on {mode}"]
    for section in report.sections:
        lines += ["", f"== {section.title}{'' if section.ran else ' (did not run in full)'}", section.text]
    verdicts = report.verdicts
    lines += ["", f"estimate tolerances: {verdicts.count('PASS')} PASS, {verdicts.count('FAIL')} FAIL; "
                  + ("every step ran" if report.all_ran else
                     "not every step ran: " + ", ".join(s.title for s in report.sections if not s.ran))]
    return "\n".join(lines)


def run_gpu_check(workdir: Path, *, simulated: bool, llama_server: Path | None = None,
                  say: Callable[[str], None] = lambda _: None) -> GpuCheckReport:
    """The five steps in *workdir*; NoDevice when there is no device to check."""
    report = GpuCheckReport(simulated)
    device = find_device(simulated, workdir)
    report.add("(a) device", True, device.describe())
    say(f"gpu-check: {device.describe()}; finding the llama-server")
    try:
        binary = find_llama_server(simulated, llama_server, say)
    except StepFailed as exc:
        report.add("(b) llama-server", False, str(exc))
        return report
    report.add("(b) llama-server", True, f"{binary.path} ({binary.how})")
    models, missing = check_models(workdir)
    report.add("(c) models", not missing, "\n".join(
        [f"{m.name:<16} {m.what}: {' '.join(m.flags)} -ngl 99" for m in models] + [f"missing: {m}" for m in missing]))
    _under_steward(report, workdir, device, models, engine_command(binary.path, device), say)
    return report


def _under_steward(report: GpuCheckReport, workdir: Path, device: DeviceFound, models: list[CheckModel],
                   command: list[str], say: Callable[[str], None]) -> None:
    config = steward_config(models, command, device, workdir)
    try:
        process, url, events = start_steward(workdir, config, stderr=workdir / STEWARD_OUTPUT)
    except RuntimeError as exc:
        report.add("(c) steward run", False, str(exc))
        return
    say(f"gpu-check: steward runs at {url}; loading {len(models)} engines")
    seen: set[tuple[int, str]] = set()
    try:
        runs = _wait_settled(events, [m.name for m in models], READY_TIMEOUT_S[report.simulated], process)
        ready = [run for run in runs.values() if run.load_s is not None and run.pid is not None]
        lines = [f"{run.name:<16} " + (f"ready in {run.load_s:.1f} s, pid {run.pid}" if run in ready else
                                       f"NOT READY: {run.failure or 'no word within the timeout'}")
                 for run in runs.values()]
        if len(ready) < len(models):
            lines.append("steward's output" + output_tail(workdir / STEWARD_OUTPUT, 5))
        report.add("(c) engines ready", len(ready) == len(models), "\n".join(lines))
        if ready:
            seen.update(descendants(process.pid))
            _compare(report, url, device, ready, {m.name: m for m in models}, len(command))
            say("gpu-check: killing one engine with SIGKILL (the phantom-memory guard)")
            _phantom(report, events, device, ready)
    finally:
        say("gpu-check: stopping steward")
        seen.update(descendants(process.pid))
        _stop(report, process, seen)


def _wait_settled(events: Path, names: list[str], timeout: float,
                  process: subprocess.Popen[bytes]) -> dict[str, EngineRun]:
    deadline = time.monotonic() + timeout
    while True:
        runs = engine_runs(read_event_log(events), names)
        if all(run.settled for run in runs.values()) or time.monotonic() > deadline or process.poll() is not None:
            return runs
        time.sleep(0.1)


def _compare(report: GpuCheckReport, url: str, device: DeviceFound, ready: list[EngineRun],
             models: dict[str, CheckModel], program_words: int) -> None:
    """(c): the ledger against the probe, the estimate against each engine's log."""
    state = _wait_measured(url, {run.name for run in ready})
    readings = device.probe.read()
    engines = {e["name"]: e for e in state["engines"]}
    pids = {run.pid for run in ready if run.pid is not None}
    parents = read_parents()
    used: dict[int, int] = {}
    for reading in readings:
        for pid, nbytes in fold_to_roots(reading.processes, pids, parents).items():
            used[pid] = used.get(pid, 0) + nbytes
    flavour = "cpu" if report.simulated else "gpu"
    for run in ready:
        assert run.pid is not None
        guess = estimate(models[run.name].path, run.argv[program_words:], device=flavour)
        buffers = run.buffers or {}
        report.components[run.name] = compare_components(guess, buffers)
        report.memory.append(EngineMemory(
            run.name, run.pid, run.planned, run.source, engines[run.name]["reserved"], used.get(run.pid),
            device_buffers(buffers)))
    probe = "NVML" if not report.simulated else "sim GPU"
    report.add("(c) ledger against the device", True, "\n".join(
        [format_memory(report.memory, probe), *_device_lines(state, readings, used, pids)]))
    tables = [format_components(name, checks, _estimate_line(models[name], flavour))
              for name, checks in report.components.items()]
    verdicts = report.verdicts
    tables.append(f"{verdicts.count('PASS')} PASS, {verdicts.count('FAIL')} FAIL (weights, KV, recurrent within 1 %, "
                  "compute within 20 %: docs/estimates.md)")
    if report.simulated:
        tables.append("(--simulated: the CPU build's buffers, against the estimate for --device cpu)")
    report.add("(c) estimate against the engines' logs", True, "\n\n".join(tables))


def _wait_measured(url: str, names: set[str]) -> dict[str, Any]:
    """/admin/state once steward's probe has measured every ready engine (or after MEASURED_TIMEOUT_S)."""
    deadline = time.monotonic() + MEASURED_TIMEOUT_S
    while True:
        state: dict[str, Any] = httpx.get(f"{url}/admin/state", timeout=10).json()
        if all(e["measured"] for e in state["engines"] if e["name"] in names) or time.monotonic() > deadline:
            return state
        time.sleep(0.1)


def _device_lines(state: dict[str, Any], readings: Sequence[GpuReading], used: dict[int, int],
                  engine_pids: set[int]) -> list[str]:
    lines = []
    for ledger, reading in zip(state["devices"], readings):
        engines = sum(nbytes for pid, nbytes in used.items() if pid in engine_pids)
        lines.append(f"  {reading.device} {reading.name}: in use {format_size(reading.used_bytes)} of "
                     f"{format_size(reading.total_bytes)}, the engines' processes {format_size(engines)}; ledger: "
                     f"budget {format_size(ledger['budget'])}, reserved {format_size(ledger['reserved'])}, outside "
                     f"{format_size(ledger['outside'])}, free {format_size(ledger['free'])}")
    others = {pid: nbytes for pid, nbytes in used.items() if pid not in engine_pids}
    if others:  # another PID namespace would show here: NVML's pids are not the engines'
        lines.append("  other processes on the device: " + ", ".join(
            f"pid {pid} {format_size(nbytes)}" for pid, nbytes in sorted(others.items())))
    return lines


def _estimate_line(model: CheckModel, flavour: str) -> str:
    device = " --device cpu" if flavour == "cpu" else ""
    return f"steward estimate{device} {model.path.name} -- {' '.join(model.flags)} -ngl 99"


def _phantom(report: GpuCheckReport, events: Path, device: DeviceFound, ready: list[EngineRun]) -> None:
    """(d): kill -9 one engine (SmolLM2 when it runs) and watch its memory and steward's events."""
    victim = next((run for run in ready if run.name == SMOLLM2), ready[0])
    assert victim.pid is not None
    tree = tree_of(victim.pid, read_parents())
    before = device.probe.read()[0]
    held = sum(nbytes for pid, nbytes in before.processes.items() if pid in tree)
    killed_at = time.time()
    os.kill(victim.pid, signal.SIGKILL)
    record = PhantomRecord(victim.name, victim.pid, killed_at, held, before.used_bytes, (), (), RELEASE_TIMEOUT_S)
    deadline = killed_at + RELEASE_TIMEOUT_S + PHANTOM_EXTRA_S
    released_at = None
    while time.time() < deadline:
        reading = device.probe.read()[0]
        sample = ProbeSample(time.time(), bool(tree & reading.processes.keys()), reading.used_bytes)
        told = tuple(r for r in read_event_log(events) if r.get("engine") == victim.name
                     and r["event"] in PHANTOM_EVENTS and r["ts"] >= killed_at)
        record = attrs.evolve(record, samples=(*record.samples, sample), events=told)
        if released_at is None and record.release_event is not None:
            released_at = time.time()
        if released_at is not None and (record.moment("freed") is not None or time.time() > released_at + 2):
            break  # released, and the memory seen free (or not within 2 s more)
        time.sleep(SAMPLE_INTERVAL_S)
    report.phantom = record
    report.add("(d) phantom-memory guard", True,
               format_phantom(record, "NVML" if not report.simulated else "the simulated GPU"))


def _stop(report: GpuCheckReport, process: subprocess.Popen[bytes], seen: set[tuple[int, str]]) -> None:
    """(e): SIGTERM to steward; then every process it ran must be gone (those left are killed)."""
    status = stop_steward(process)
    deadline = time.monotonic() + 5
    while (left := sorted((pid, cmd) for pid, cmd in seen if alive(pid))) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid, _ in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    report.left_behind = left
    said = f"steward exited with status {status}; " + (
        "no process of its left behind" if not left else
        "LEFT BEHIND (killed now): " + ", ".join(f"pid {pid} {cmd[:80]}" for pid, cmd in left))
    report.add("(e) stop", status == 0 and not left, said)


def main(*, simulated: bool, llama_server: Path | None, keep: bool, save: Path | None) -> int:
    """The command: progress on stderr, the report on stdout (and in *save*); its exit status."""
    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with open_workdir("gpu-check", keep=keep) as workdir:
        try:
            report = run_gpu_check(workdir, simulated=simulated, llama_server=llama_server, say=say)
        except NoDevice as exc:
            text = (f"steward: gpu-check: no NVIDIA driver ({exc}); nothing to check here. `steward gpu-check "
                    "--simulated` runs the same steps on a simulated GPU")
            print(text, file=sys.stderr)
            _save(save, text, workdir)
            return EXIT_NO_DEVICE
        text = format_report(report)
        print(text, flush=True)
        _save(save, text, workdir)
        return 0 if report.all_ran else 1


def _save(folder: Path | None, text: str, workdir: Path) -> None:
    """The report, and the run's config, event log and steward's output, into *folder*."""
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gpu-check-report.txt").write_text(text + "\n")
    for name in SAVED:
        if (workdir / name).exists():
            shutil.copyfile(workdir / name, folder / f"gpu-check-{name}")
