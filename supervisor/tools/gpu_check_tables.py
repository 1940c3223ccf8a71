"""``steward gpu-check``'s comparisons and tables: pure, from the figures a run collected.

Three comparisons, one table each:

- the ledger against the device (``EngineMemory``): what steward reserved at the load and
  holds now, what NVML's per-process list says the engine's process tree uses, and how much
  of that its log never names (CUDA context, cuBLAS workspace, pools: the estimate's reserve);
- the estimate against the engine's own account (``ComponentCheck``): per device and
  component, ``supervisor.accounting.estimate`` against the buffer sizes in its log, with the
  tolerances docs/estimates.md states marked PASS or FAIL (the only figures judged here);
- the phantom-memory guard (``PhantomRecord``): after a kill -9, when the process left the
  per-process list, when its memory left the device total, and what steward did meanwhile,
  from its event log, in milliseconds after the kill.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from supervisor.accounting.estimate import DEFAULT_GPU_RESERVE, Estimate
from supervisor.observe.events import RECORD_KEYS
from supervisor.units import format_size

MIB = 1024**2
PRINT_RESOLUTION = round(0.005 * MIB)  # the log prints MiB with two decimals
COMPONENTS = ("weights", "kv", "recurrent", "compute", "output")
# docs/estimates.md: weights, KV and recurrent state within 1 % (or the print resolution),
# compute within 20 %. Output and the totals are reported, not judged.
TOLERANCES = {"weights": 0.01, "kv": 0.01, "recurrent": 0.01, "compute": 0.20}
FREED_SHARE = 0.9  # a dead process's memory counts as freed once the device total fell by this much of it
# The events of the killed engine that tell what steward did (docs/events.md).
PHANTOM_EVENTS = frozenset({"exit", "crash", "released", "release_timeout", "measured", "restart", "load", "spawn"})


def mib(nbytes: int) -> str:
    return f"{nbytes / MIB:.2f}"


@attrs.frozen
class ComponentCheck:
    """One component on one device: the engine's log against the estimate, in bytes."""

    device: str  # gpu0, ..., host
    component: str  # weights | kv | recurrent | compute | output | total (without the reserve)
    logged: int
    estimated: int

    @property
    def error(self) -> float | None:
        return None if self.logged == 0 else (self.estimated - self.logged) / self.logged

    @property
    def verdict(self) -> str:
        """PASS or FAIL where docs/estimates.md states a tolerance; "" where it states none."""
        tolerance = TOLERANCES.get(self.component)
        if tolerance is None:
            return ""
        close = abs(self.estimated - self.logged) <= max(tolerance * self.logged, PRINT_RESOLUTION)
        return "PASS" if close else "FAIL"


def compare_components(estimate: Estimate, buffers: Mapping[str, Mapping[str, int]]) -> list[ComponentCheck]:
    """Each device's components, logged (``buffers``: the ``buffers`` event's device -> component ->
    bytes) against estimated; a component neither names is left out. The totals leave out the
    estimate's runtime reserve, which no log line reports."""
    columns: dict[str, dict[str, int]] = {name: attrs.asdict(device) for name, device in estimate.devices.items()}
    columns["host"] = attrs.asdict(estimate.host)
    for device in buffers:
        columns.setdefault(device, {})
    checks = []
    for device, estimated in columns.items():
        logged = buffers.get(device, {})
        for component in COMPONENTS:
            if logged.get(component, 0) or estimated.get(component, 0):
                checks.append(ComponentCheck(device, component, logged.get(component, 0), estimated.get(component, 0)))
        checks.append(ComponentCheck(device, "total", sum(logged.values()),
                                     estimated.get("total", 0) - estimated.get("reserve", 0)))
    return checks


def format_components(engine: str, checks: Sequence[ComponentCheck], estimate_line: str) -> str:
    """One engine's table: logged / estimated MiB, the error, the verdict."""
    lines = [f"{engine}: {estimate_line}",
             f"  {'device':<7} {'component':<10} {'log MiB':>10} {'estimate MiB':>13} {'error':>8}  verdict"]
    for check in checks:
        error = "-" if check.error is None else f"{check.error:+.1%}"
        lines.append(f"  {check.device:<7} {check.component:<10} {mib(check.logged):>10} {mib(check.estimated):>13} "
                     f"{error:>8}  {check.verdict}".rstrip())
    return "\n".join(lines)


def device_buffers(buffers: Mapping[str, Mapping[str, int]]) -> int:
    """What the log puts on the GPU: its GPU devices' buffers; a CPU build's all (the simulated GPU
    stands for the device there, and holds them)."""
    on_gpu = [sum(components.values()) for device, components in buffers.items() if device != "host"]
    return sum(on_gpu) if on_gpu else sum(sum(components.values()) for components in buffers.values())


@attrs.frozen
class EngineMemory:
    """One engine's memory as the ledger, the device and its log say it, in bytes."""

    engine: str
    pid: int | None
    planned: int  # reserved at the load (the memory_plan event)
    source: str  # where that figure came from: estimate | measured | config
    reserved: int  # the ledger now (/admin/state)
    used: int | None  # the per-process list now, the engine's process tree folded; None: not listed
    logged: int  # the buffers its log puts on the device (device_buffers)

    @property
    def unlogged(self) -> int | None:
        """Device memory the log never names: CUDA context, cuBLAS workspace, pools."""
        return None if self.used is None else self.used - self.logged


def format_memory(rows: Sequence[EngineMemory], probe: str) -> str:
    header = (f"  {'engine':<16} {'pid':>7} {'reserved at load':>26} {'ledger now':>11} {probe + ' used':>11} "
              f"{'used-ledger':>11} {'log buffers':>11} {'used-buffers':>12}")
    lines = [header]
    for row in rows:
        used = "not listed" if row.used is None else format_size(row.used)
        diff = "-" if row.used is None else _signed(row.used - row.reserved)
        unlogged = "-" if row.unlogged is None else format_size(row.unlogged)
        planned = f"{format_size(row.planned)} ({row.source})"
        lines.append(f"  {row.engine:<16} {row.pid or '-':>7} {planned:>26} {format_size(row.reserved):>11} "
                     f"{used:>11} {diff:>11} {format_size(row.logged):>11} {unlogged:>12}")
    lines.append(f"  used-buffers: what the log never names (CUDA context, cuBLAS workspace, pools); the estimate "
                 f"counts {format_size(DEFAULT_GPU_RESERVE)} a GPU for it")
    return "\n".join(lines)


def _signed(nbytes: int) -> str:
    return ("+" if nbytes >= 0 else "-") + format_size(abs(nbytes))


@attrs.frozen
class ProbeSample:
    at: float  # wall clock
    listed: bool  # the killed process (or a descendant) is in the per-process list
    used: int  # the device's total use


@attrs.frozen
class PhantomRecord:
    """A kill -9 of one engine, watched through the probe and steward's event log."""

    engine: str
    pid: int
    killed_at: float  # wall clock
    held: int  # what the process held per the per-process list before the kill
    used_before: int  # the device's total use before the kill
    samples: tuple[ProbeSample, ...]
    events: tuple[dict[str, Any], ...]  # the engine's event-log records from the kill on
    release_timeout: float  # scheduler.release_timeout

    def moment(self, what: str) -> float | None:
        """Seconds after the kill: ``gone`` (first sample not listed), ``freed`` (first sample whose total
        fell by FREED_SHARE of what it held), ``released`` (the release event)."""
        if what == "released":
            return next((e["ts"] - self.killed_at for e in self.events
                         if e["event"] in ("released", "release_timeout")), None)
        for sample in self.samples:
            if (not sample.listed if what == "gone" else
                    sample.used <= self.used_before - FREED_SHARE * self.held):
                return sample.at - self.killed_at
        return None

    @property
    def release_event(self) -> str | None:
        return next((e["event"] for e in self.events if e["event"] in ("released", "release_timeout")), None)


def format_phantom(record: PhantomRecord, probe: str) -> str:
    clock = time.strftime("%H:%M:%S", time.localtime(record.killed_at))
    lines = [f"kill -9 {record.engine} (pid {record.pid}, {format_size(record.held)} per {probe}) at {clock}; "
             f"device use before: {format_size(record.used_before)}"]
    timeline: list[tuple[float, str]] = [(0.0, "SIGKILL sent")]
    timeline += [(at, f"{probe}: {said}") for at, said in _probe_changes(record)]
    timeline += [(event["ts"] - record.killed_at, f"event {event['event']} ({event['level']}): {_event_detail(event)}")
                 for event in record.events]
    lines += [f"  {at * 1000:+8.0f} ms  {said}" for at, said in sorted(timeline, key=lambda item: item[0])]
    gone, freed, released = (record.moment(what) for what in ("gone", "freed", "released"))
    lines.append("  " + "; ".join([
        _moment("gone from the process list", gone),
        _moment("memory freed", freed) + (f" (a phantom for {(freed - gone) * 1000:.0f} ms)"
                                          if gone is not None and freed is not None else ""),
        _moment(f"reservation released ({record.release_event or 'no event'}, release_timeout "
                f"{record.release_timeout:g}s)", released)]))
    if released is not None and freed is not None:
        lines.append("  steward released the reservation " + (
            "after the memory was free" if released >= freed else
            f"{(freed - released) * 1000:.0f} ms BEFORE the memory was free"))
    return "\n".join(lines)


def _moment(what: str, at: float | None) -> str:
    return f"{what} {'never seen' if at is None else f'at +{at * 1000:.0f} ms'}"


def _probe_changes(record: PhantomRecord) -> Iterable[tuple[float, str]]:
    """The samples where the list or the total changed (by 1 MiB or more), in words."""
    listed, used = True, record.used_before
    for sample in record.samples:
        if sample.listed != listed or abs(sample.used - used) >= MIB:
            held = sample.used - (record.used_before - record.held)
            if sample.listed:
                state = "still listed"
            elif held >= MIB:
                state = f"not listed; the device still holds {format_size(held)} of it"
            else:
                state = "not listed; its memory is free"
            yield sample.at - record.killed_at, f"{state} (device use {format_size(sample.used)})"
            listed, used = sample.listed, sample.used


def _event_detail(event: Mapping[str, Any]) -> str:
    skip = RECORD_KEYS | {"engine", "argv"}
    parts = []
    for key, value in event.items():
        if key in skip:
            continue
        if isinstance(value, int) and key in ("released", "free", "memory", "reserved", "measured", "estimate"):
            shown = format_size(value)
        else:  # a crash's detail ends with the engine's last output: not this table's business
            shown = str(value).split("; last output", 1)[0][:120]
        parts.append(f"{key} {shown}")
    return ", ".join(parts)
