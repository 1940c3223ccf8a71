"""Chaos for ``steward loadtest --chaos``: signals to what steward supervises, and the checks after.

While the load runs, engines (the fake llama-servers) and upstreams (the fake Ollama and
ComfyUI) are stopped (SIGTERM), frozen (SIGSTOP, SIGCONT a while later) and killed
(SIGKILL). The schedule (when, what, to whom) is a pure function of the seed; the pids
come from steward's event log as the run goes (``spawn`` and ``exit`` events). A signal
goes through a pidfd opened on a process checked to be steward's child and the very
process the ``spawn`` event named (its start time), so a pid the kernel has since
given to someone else is never signalled.

After the load: the invariants (every request answered, the ledger adds up, no process
left, no fds gained), from what the clients saw, ``/healthz`` and ``/proc``.
"""

from __future__ import annotations

import json
import os
import random
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import attrs
import trio

from supervisor.engines.process_tree import stat_fields

ACTIONS = ("stop", "freeze", "kill")
SIGNALS = {"stop": signal.SIGTERM, "freeze": signal.SIGSTOP, "kill": signal.SIGKILL}

# How a request ended, as its client saw it. An answer is an HTTP status with its whole
# body, or a stream that ended with its terminator ([DONE], Ollama's "done": true) or an
# error event. The client itself leaving is neither answered nor lost.
ANSWERED = ("answer", "done", "error_event", "invalid")
LOST = ("no_answer", "timeout", "truncated")
LEFT = "disconnect"


# ---- the schedule ---------------------------------------------------------------------


@attrs.frozen
class ChaosAction:
    at: float  # seconds from the start of the load
    action: str  # stop, freeze or kill
    target: str  # an engine's or service's name, as steward's events spell it
    freeze_s: float = 0.0  # freeze: SIGCONT this long after SIGSTOP


def chaos_schedule(seed: int, targets: Iterable[str], *, start: float, end: float, mean_interval: float,
                   actions: Sequence[str] = ACTIONS, freeze: tuple[float, float] = (1.0, 15.0),
                   ) -> list[ChaosAction]:
    """Actions between *start* and *end*, exponentially spaced around *mean_interval*.

    The same seed, targets and bounds give the same schedule: what happens to a target
    that is not running at its moment differs between runs, the plan does not.
    """
    rng = random.Random(f"chaos {seed}")  # a stream of its own: the clients' choices cannot shift it
    names = sorted(targets)
    schedule: list[ChaosAction] = []
    at = start
    while names:
        at += rng.expovariate(1.0 / mean_interval)
        if at >= end:
            break
        action, target = rng.choice(actions), rng.choice(names)
        freeze_s = round(rng.uniform(*freeze), 3) if action == "freeze" else 0.0
        schedule.append(ChaosAction(round(at, 3), action, target, freeze_s))
    return schedule


# ---- steward's children, from its event log ----------------------------------------


@attrs.frozen
class Incarnation:
    """One process of a target, as a ``spawn`` event announced it."""

    name: str
    pid: int
    start_time: int | None  # /proc/PID/stat field 22; None: it was gone before we looked


_WATCHED = (b'"event":"spawn"', b'"event":"exit"', b'"event":"listening"')  # as steward writes them


@attrs.define
class ProcessWatch:
    """Follows steward's event log: which process each target runs now, and every one it ran."""

    path: Path
    # Invariant: live[name].pid has had a spawn event and no exit event since.
    live: dict[str, Incarnation] = attrs.Factory(dict)
    spawned: list[Incarnation] = attrs.Factory(list)
    listening: dict[str, Any] | None = None  # steward's `listening` event
    _offset: int = 0
    _partial: bytes = b""

    def poll(self) -> None:
        """Read what the log gained since the last call (whole lines only)."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            # Most lines are requests and engine output: parse only the few that matter.
            if any(name in line for name in _WATCHED):
                self.feed(json.loads(line))

    def feed(self, record: Mapping[str, Any]) -> None:
        event = record["event"]
        if event == "spawn":
            incarnation = Incarnation(record["engine"], record["pid"], process_start_time(record["pid"]))
            self.live[incarnation.name] = incarnation
            self.spawned.append(incarnation)
        elif event == "exit":
            current = self.live.get(record["engine"])
            if current is not None and current.pid == record["pid"]:
                del self.live[record["engine"]]
        elif event == "listening":
            self.listening = dict(record)

    def listener_ports(self) -> set[int]:
        """The ports of steward's own listeners (OpenAI, Ollama, ComfyUI)."""
        record = self.listening or {}
        urls = [*record.get("urls", []), *(record.get("ollama") or []), *(record.get("comfyui") or [])]
        return {int(url.rsplit(":", 1)[1].split("/")[0]) for url in urls if isinstance(url, str)}


# ---- signals --------------------------------------------------------------------------


@attrs.frozen
class ChaosRecord:
    at: float  # seconds from the start of the load, when it was done
    action: str  # stop, freeze, kill, or thaw (the SIGCONT after a freeze)
    target: str
    pid: int | None  # None: the target was not running
    result: str  # sent, not running, gone (it exited before the signal)

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)

    def to_line(self) -> str:
        pid = f"pid {self.pid}" if self.pid is not None else "-"
        return f"chaos {self.at:8.1f}s  {self.action:<6} {self.target:<12} {pid:<10} {self.result}"


def open_child_pidfd(incarnation: Incarnation, parent: int) -> int | None:
    """A pidfd on *incarnation*'s process if it still is that process and *parent*'s child; else None.

    Once the pidfd is open, a signal through it reaches that process or nobody, whatever
    happens to the pid afterwards.
    """
    if incarnation.start_time is None:
        return None
    try:
        pidfd = os.pidfd_open(incarnation.pid)
    except ProcessLookupError:
        return None
    stat = stat_fields(incarnation.pid)
    if stat is None or int(stat[1]) != parent or int(stat[19]) != incarnation.start_time:
        os.close(pidfd)
        return None
    return pidfd


def send_signal(pidfd: int, signum: int) -> bool:
    """False when the process has exited (and been reaped) since its pidfd was opened."""
    try:
        signal.pidfd_send_signal(pidfd, signum)
    except ProcessLookupError:
        return False
    return True


async def run_chaos(schedule: Sequence[ChaosAction], watch: ProcessWatch, parent: int, started: float,
                    records: list[ChaosRecord], announce: Callable[[ChaosRecord], None]) -> None:
    """Carry out *schedule* (times from *started*, trio's clock) on *parent*'s children.

    Returns once every action is done and every frozen process has been continued; if
    cancelled, continues the frozen ones at once.
    """

    def note(action: str, target: str, pid: int | None, result: str) -> None:
        record = ChaosRecord(round(trio.current_time() - started, 3), action, target, pid, result)
        records.append(record)
        announce(record)

    async def thaw(pidfd: int, target: str, pid: int, after: float) -> None:
        try:
            await trio.sleep(after)
        finally:  # cancelled too: a process is never left frozen
            note("thaw", target, pid, "sent" if send_signal(pidfd, signal.SIGCONT) else "gone")
            os.close(pidfd)

    async with trio.open_nursery() as nursery:
        for action in schedule:
            await trio.sleep_until(started + action.at)
            watch.poll()
            incarnation = watch.live.get(action.target)
            if incarnation is None:
                note(action.action, action.target, None, "not running")
                continue
            pidfd = open_child_pidfd(incarnation, parent)
            if pidfd is None:
                note(action.action, action.target, incarnation.pid, "gone")
                continue
            sent = send_signal(pidfd, SIGNALS[action.action])
            note(action.action, action.target, incarnation.pid, "sent" if sent else "gone")
            if sent and action.action == "freeze":
                nursery.start_soon(thaw, pidfd, action.target, incarnation.pid, action.freeze_s)
            else:
                os.close(pidfd)


# ---- /proc -----------------------------------------------------------------------------


def process_start_time(pid: int) -> int | None:
    stat = stat_fields(pid)
    return int(stat[19]) if stat is not None else None


def is_running(incarnation: Incarnation) -> bool:
    """The very process (not a later one with its pid) exists and is not a zombie."""
    stat = stat_fields(incarnation.pid)
    return (stat is not None and stat[0] not in ("Z", "X") and incarnation.start_time is not None
            and int(stat[19]) == incarnation.start_time)


def descendants(root: int) -> list[tuple[int, str]]:
    """Live (non-zombie) descendants of *root*, with their command lines."""
    children: dict[int, list[int]] = {}
    states: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := stat_fields(int(entry))) is not None:
            states[int(entry)] = stat[0]
            children.setdefault(int(stat[1]), []).append(int(entry))
    found, stack = [], list(children.get(root, []))
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        if states.get(pid) not in ("Z", "X"):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:
                continue
            found.append((pid, cmdline))
    return found


@attrs.frozen
class FdCount:
    """A process's open fds, split by whom they serve."""

    total: int
    children: int  # pipes shared with a live child, connections to a live child's listening port
    clients: int  # connections accepted on the process's listeners
    own: dict[str, int]  # the rest, by kind: socket, pipe, file, other

    @property
    def own_total(self) -> int:
        return sum(self.own.values())

    def to_json(self) -> dict[str, Any]:
        return {"total": self.total, "children": self.children, "clients": self.clients, "own": self.own_total,
                "own_by_kind": self.own}


def count_fds(pid: int, listener_ports: set[int]) -> FdCount | None:
    """*pid*'s fds; those of its children and its clients apart, since they come and go with load.

    What is left (``own``) is what steward holds for itself: listeners, its log, its
    wakeup sockets, the reaper's pipe, and anything it leaks (a connection to an engine
    that is gone, a pipe of a reaped child).
    """
    targets = _fd_targets(pid)
    if targets is None:
        return None
    sockets = _tcp_sockets(pid)
    child_inodes: set[str] = set()
    for child, _ in descendants(pid):
        child_inodes.update(_fd_targets(child) or [])
    child_ports = {local for inode, (local, _, state) in sockets.items()
                   if state == "0A" and f"socket:[{inode}]" in child_inodes}
    children = clients = 0
    own = {"socket": 0, "pipe": 0, "file": 0, "other": 0}
    for target in targets:
        if target.startswith("pipe:"):
            if target in child_inodes:
                children += 1
            else:
                own["pipe"] += 1
        elif target.startswith("socket:"):
            local, remote, state = sockets.get(int(target[8:-1]), (0, 0, ""))
            if state and state != "0A" and remote in child_ports:
                children += 1
            elif state and state != "0A" and local in listener_ports:
                clients += 1
            else:
                own["socket"] += 1
        elif target.startswith("/"):
            own["file"] += 1
        else:
            own["other"] += 1
    return FdCount(len(targets), children, clients, own)


def _fd_targets(pid: int) -> list[str] | None:
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    targets = []
    for name in names:
        try:
            targets.append(os.readlink(f"/proc/{pid}/fd/{name}"))
        except OSError:
            continue  # closed meanwhile
    return targets


def _tcp_sockets(pid: int) -> dict[int, tuple[int, int, str]]:
    """inode -> (local port, remote port, state as hex: 01 established, 0A listen) in *pid*'s namespace."""
    sockets = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[9] != "0":
                sockets[int(fields[9])] = (int(fields[1].rsplit(":", 1)[1], 16),
                                           int(fields[2].rsplit(":", 1)[1], 16), fields[3])
    return sockets


# ---- invariants ------------------------------------------------------------------------


@attrs.frozen
class Invariant:
    name: str
    passed: bool
    detail: str  # the figures, in words
    figures: dict[str, Any] = attrs.Factory(dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "detail": self.detail, "figures": self.figures}

    def to_line(self) -> str:
        return f"  {'PASS' if self.passed else 'FAIL'}  {self.name:<10} {self.detail}"


class Ended(Protocol):
    @property
    def ending(self) -> str: ...


def check_alive(exited_during_load: int | None, exit_status: int | None, stop_s: float | None) -> Invariant:
    """(0) Steward ran through the whole load and stopped cleanly on SIGTERM."""
    figures = {"exited_during_load": exited_during_load, "exit_status": exit_status, "stop_s": stop_s}
    if exited_during_load is not None:
        return Invariant("alive", False, f"steward exited during the load with status {exited_during_load}",
                         figures)
    passed = exit_status == 0
    stopped = f"exited with status {exit_status}" if exit_status is not None else "did not exit"
    took = f" {stop_s:.1f}s" if stop_s is not None else ""
    return Invariant("alive", passed, f"steward ran throughout; on SIGTERM it {stopped}{took} after", figures)


def check_answers(outcomes: Iterable[Ended]) -> Invariant:
    """(a) No request lost without an answer."""
    endings: dict[str, int] = {}
    for outcome in outcomes:
        endings[outcome.ending] = endings.get(outcome.ending, 0) + 1
    lost = sum(endings.get(ending, 0) for ending in LOST)
    answered = sum(endings.get(ending, 0) for ending in ANSWERED)
    total = sum(endings.values())
    cause = ", ".join(f"{ending.replace('_', ' ')} {endings.get(ending, 0)}" for ending in LOST)
    return Invariant("answers", lost == 0,
                     f"{total} requests: {answered} answered, {endings.get(LEFT, 0)} left by their client, "
                     f"{lost} lost ({cause})", {"requests": total, "lost": lost, "endings": endings})


def check_idle(idle: bool, waited_s: float, busy: Sequence[str]) -> Invariant:
    """Steward came to rest once the load stopped: nothing queued, running, loading or stopping."""
    if idle:
        return Invariant("idle", True, f"idle {waited_s:.1f}s after the load stopped", {"waited_s": waited_s})
    return Invariant("idle", False, f"not idle {waited_s:.1f}s after the load stopped: {'; '.join(busy)}",
                     {"waited_s": waited_s, "busy": list(busy)})


def check_ledger(health: Mapping[str, Any] | None) -> Invariant:
    """(b) The ledger's total is the sum of the engines' reservations, and none is held by a stopped engine."""
    if health is None:
        return Invariant("ledger", False, "no /healthz answer to check", {})
    engines = health.get("engines", {})
    total = sum(int(e.get("reserved", 0)) for e in engines.values())
    stale = {name: int(e["reserved"]) for name, e in engines.items()
             if e.get("status") in ("stopped", "failed") and int(e.get("reserved", 0)) > 0}
    figures = {"reserved": health.get("reserved"), "engines_reserved": total, "held_by_stopped": stale}
    passed = health.get("reserved") == total and not stale
    detail = f"reserved {_gib(health.get('reserved'))} = engines' {_gib(total)}" if health.get("reserved") == total \
        else f"reserved {_gib(health.get('reserved'))} != engines' {_gib(total)}"
    if stale:
        detail += "; held by stopped engines: " + ", ".join(f"{n} {_gib(b)}" for n, b in stale.items())
    return Invariant("ledger", passed, detail, figures)


def check_processes(left: Sequence[tuple[int, str]]) -> Invariant:
    """(c) No child or grandchild of the loadtest outlived its steward."""
    if not left:
        return Invariant("processes", True, "no process left after steward stopped", {"left": []})
    listed = "; ".join(f"{pid} {cmd[:80]}" for pid, cmd in left)
    return Invariant("processes", False, f"{len(left)} left after steward stopped: {listed}",
                     {"left": [{"pid": pid, "cmdline": cmd} for pid, cmd in left]})


def check_fds(warm: FdCount | None, end: FdCount | None, tolerance: int) -> Invariant:
    """(d) Steward's own fds after quiescing are within *tolerance* of those after warm-up.

    Own fds leave out the pipes and connections of live children and the connections
    of clients, which follow the load; at the end no client is connected, so a client
    connection steward still holds counts as its own.
    """
    if warm is None or end is None:
        return Invariant("fds", False, "steward's fds could not be read", {})
    own_end = end.total - end.children
    figures = {"warm": warm.to_json(), "end": end.to_json(), "own_warm": warm.own_total, "own_end": own_end,
               "tolerance": tolerance}
    passed = own_end - warm.own_total <= tolerance
    detail = (f"own fds {warm.own_total} after warm-up, {own_end} at rest (tolerance +{tolerance}; "
              f"total {warm.total} -> {end.total})")
    return Invariant("fds", passed, detail, figures)


def _gib(value: object) -> str:
    return f"{value / 1024**3:.2f} GiB" if isinstance(value, int | float) else str(value)
