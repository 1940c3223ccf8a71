"""Compute placement on the host's cores: how many threads each llama.cpp engine computes with,
and on which CPUs, so that the engines that may compute at once never oversubscribe the cores.

Why. A llama-server takes every core by default (``-t`` = the cores it sees). Two of them
decoding at once then run 2N threads on N cores: each is preempted in the middle of its
matrix products, the threads of one step wait on each other at every barrier, and each engine
ran at 1/4 to 1/18 of its speed alone, not 1/2 (issue 27, 2 cores). With one thread each
(``-t 1``) the two ran side by side at nearly full speed: a chat's p95 went from 17x its alone
run to 1.16x. So steward, which already decides what computes at once, also decides how many
threads each engine may use.

How many engines compute at once. The scheduler lets lower-class work (background, batch)
compute on at most ``scheduler.lower_class_engines`` engines while a chat's engine is hot;
the chats take one engine more (the interactive share, ``INTERACTIVE_SHARE``: chats on two
engines at once share the cores as they would a card). So at most ``1 + lower_class_engines``
engines compute at once. ``lower_class_engines: 0`` sets no such limit: then every engine
that can be resident at once may compute, which is how many fit the memory budget together
(an engine whose memory the config does not give, estimated or measured later, counts as
fitting: more engines at once means fewer threads each, never more threads than cores).
Either way no more than the engines steward starts on this host (an attached server runs
where someone else put it, and is not counted).

The share. An engine gets ``max(1, cores // engines at once)`` threads for both decoding
(``-t``) and prompt processing (``-tb``), where *cores* are the CPUs it may run on: its
``models.NAME.cpus`` set (intersected with what the host lets steward use), else every CPU
steward may use (``os.sched_getaffinity``, capped by a cgroup CPU quota). Engines count
against each other only where their CPU sets overlap: two engines pinned to disjoint sets
each have their set to themselves. The rest of a core's time goes to the HTTP threads, which
sleep while the engine computes.

What overrides it, in order: a thread flag in the model's args (``-t``/``--threads``,
``-tb``/``--threads-batch``, or ``LLAMA_ARG_THREADS`` in its env) wins, and steward passes no
thread count at all, so no flag is given twice; ``models.NAME.threads: N`` sets N for both;
``threads: auto`` (the default) is the share above.

On a GPU host. llama.cpp's threads compute only the part of the model that stays on the CPU:
with every layer offloaded (``-ngl`` all) they matter little, the card computes and its
driver time-slices the engines' contexts (docs/compute.md). The share still applies, since
a partly offloaded model (``-ngl`` below the layer count, ``--cpu-moe``, ``-ot`` to CPU)
computes its CPU layers with these threads, and every engine's CPU part competes for the
same cores.

Other runtimes. Only llama.cpp takes a thread count here. vLLM's CPU backend binds its
OpenMP threads itself (``VLLM_CPU_OMP_THREADS_BIND``, set in ``models.NAME.env``), Ollama sets
its own (``num_thread``); ``models.NAME.cpus`` applies to any process steward starts.

Pure: the host's CPUs are read at the edge (``usable_cpus``) and passed in.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import attrs

from supervisor.units import show

# The engines chats compute on at once, beside lower_class_engines for the other classes.
INTERACTIVE_SHARE = 1
# The runtimes that take a thread count: llama.cpp's llama-server.
THREADED_RUNTIMES = frozenset({"llama-server"})
THREAD_FLAGS = ("-t", "--threads", "-tb", "--threads-batch")
THREAD_ENV = ("LLAMA_ARG_THREADS", "LLAMA_ARG_THREADS_BATCH")
# Above any host's CPU count: a setting past it is a typo, not a CPU.
MAX_CPU = 8192


@attrs.frozen(order=True)
class CpuSet:
    """A set of CPU numbers, as ``taskset -c`` and cpuset(7) write them: ``0-3,6``."""

    cpus: frozenset[int]

    @classmethod
    def parse(cls, value: object) -> CpuSet:
        """``"0-3,6"``, ``"2"`` or ``2``; ValueError saying what is wrong."""
        text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
        if not isinstance(text, str):
            raise ValueError(f"must be a CPU list like \"0-3,6\", got {show(value)}")
        cpus: set[int] = set()
        for part in text.replace(" ", "").split(","):
            match = re.fullmatch(r"([0-9]{1,5})(?:-([0-9]{1,5}))?", part)
            if match is None:
                raise ValueError(f"must be a CPU list like \"0-3,6\", got {show(value)}")
            first = int(match.group(1))
            last = first if match.group(2) is None else int(match.group(2))
            if last < first:
                raise ValueError(f"must be a CPU list like \"0-3,6\"; the range {part} runs backwards")
            if last >= MAX_CPU:
                raise ValueError(f"must name CPUs below {MAX_CPU}, got {show(value)}")
            cpus.update(range(first, last + 1))
        return cls(frozenset(cpus))

    def __len__(self) -> int:
        return len(self.cpus)

    def __and__(self, other: CpuSet) -> CpuSet:
        return CpuSet(self.cpus & other.cpus)

    def __str__(self) -> str:
        """The shortest list: ``0-3,6``."""
        runs: list[list[int]] = []
        for cpu in sorted(self.cpus):
            if runs and runs[-1][1] == cpu - 1:
                runs[-1][1] = cpu
            else:
                runs.append([cpu, cpu])
        return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


@attrs.frozen
class HostCpus:
    """The CPUs steward may run its engines on, and how many of them it may keep busy at once."""

    cpus: CpuSet
    count: int  # len(cpus), or fewer under a cgroup CPU quota

    @classmethod
    def of(cls, cpus: Iterable[int]) -> HostCpus:
        cpu_set = CpuSet(frozenset(cpus))
        return cls(cpu_set, len(cpu_set))


class ShareSource(enum.Enum):
    AUTO = "auto"  # steward's share of the cores
    CONFIG = "config"  # models.NAME.threads
    ARGS = "args"  # a thread flag in the model's args or env: steward passes none
    RUNTIME = "runtime"  # a runtime that takes no thread count (vLLM, an attached server)


@attrs.frozen
class ComputeShare:
    """One engine's share of the host's compute, and how it was decided."""

    threads: int | None  # -t and -tb steward passes; None: it passes none
    cpus: CpuSet | None  # where its process may run (sched_setaffinity before exec); None: anywhere
    source: ShareSource
    how: str  # in words, for `steward check` and the compute_share event


@attrs.frozen
class EngineCompute:
    """What the decision needs to know of one engine: from its config, nothing measured."""

    name: str
    runtime: str
    spawned: bool  # steward starts its process on this host
    threads: int | None = None  # models.NAME.threads; None: auto
    threads_in_args: bool = False  # a thread flag in its args or env
    cpus: CpuSet | None = None
    memory: int | None = None  # set in the config; None: estimated or measured later


def sets_threads(args: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether a model's args (or env) give llama.cpp a thread count themselves."""
    return any(arg.partition("=")[0] in THREAD_FLAGS for arg in args) or any(name in env for name in THREAD_ENV)


def engines_at_once(lower_class_engines: int, engines: Sequence[EngineCompute], budget: int | None) -> tuple[int, str]:
    """How many of *engines* may compute at once, and why in words (the module docstring)."""
    local = [engine for engine in engines if engine.spawned]
    resident = _resident_at_once(local, budget)
    if lower_class_engines == 0:
        why = "scheduler.lower_class_engines 0: every engine that can be resident at once"
        if resident < len(local):
            why += f", {resident} of {len(local)} in the memory budget"
        return max(1, resident), why
    limit = INTERACTIVE_SHARE + lower_class_engines
    why = f"{INTERACTIVE_SHARE} interactive + scheduler.lower_class_engines {lower_class_engines}"
    if resident < limit:
        fewer = (f"steward starts only {_count(resident, 'engine')}" if resident == len(local) else
                 f"only {_count(resident, 'engine')} can be resident at once")
        return max(1, resident), f"{why}, but {fewer}"
    return limit, why


def _resident_at_once(engines: Sequence[EngineCompute], budget: int | None) -> int:
    """The most engines that can be loaded together: the smallest first, until the budget is spent.
    An engine whose size the config does not give counts as fitting."""
    sizes = sorted(engine.memory for engine in engines if engine.memory is not None)
    unknown = len(engines) - len(sizes)
    if budget is None:
        return len(engines)
    fit, spent = 0, 0
    for size in sizes:
        if spent + size > budget:
            break
        fit, spent = fit + 1, spent + size
    return unknown + fit


@attrs.frozen
class SharePlan:
    shares: dict[str, ComputeShare]
    problems: list[str]  # one line per problem, naming the key


def decide_shares(engines: Sequence[EngineCompute], lower_class_engines: int, budget: int | None,
                  host: HostCpus) -> SharePlan:
    """Each engine's share of *host*'s CPUs (the module docstring says how)."""
    at_once, why = engines_at_once(lower_class_engines, engines, budget)
    problems = []
    pools: dict[str, CpuSet] = {}
    for engine in engines:
        pools[engine.name] = host.cpus
        if engine.cpus is not None:
            pools[engine.name] = engine.cpus & host.cpus
            if not pools[engine.name].cpus:
                problems.append(f"models.{engine.name}.cpus: none of {engine.cpus} is a CPU steward may use here "
                                f"({host.cpus})")
    shares = {}
    for engine in engines:
        pool = pools[engine.name]
        cpus = (pool if pool.cpus else engine.cpus) if engine.cpus is not None else None
        shares[engine.name] = _share(engine, engines, pools, cpus, at_once, why, host)
    return SharePlan(shares, problems)


def _share(engine: EngineCompute, engines: Sequence[EngineCompute], pools: Mapping[str, CpuSet],
           cpus: CpuSet | None, at_once: int, why: str, host: HostCpus) -> ComputeShare:
    where = "on any CPU" if cpus is None else f"on CPU{'s' if len(cpus) > 1 else ''} {cpus}"
    if engine.runtime not in THREADED_RUNTIMES or not engine.spawned:
        return ComputeShare(None, cpus, ShareSource.RUNTIME,
                            f"runtime {engine.runtime} takes no thread count from steward; {where}")
    if engine.threads_in_args:
        return ComputeShare(None, cpus, ShareSource.ARGS,
                            f"its args set the thread count; steward passes none; {where}")
    if engine.threads is not None:
        return ComputeShare(engine.threads, cpus, ShareSource.CONFIG, f"models.{engine.name}.threads; {where}")
    pool = pools[engine.name]
    cores = host.count if engine.cpus is None else min(len(pool), host.count)
    sharing = sum(1 for other in engines if other.spawned and pools[other.name].cpus & pool.cpus)
    together = max(1, min(at_once, sharing))
    threads = max(1, cores // together)
    said = f"{_count(cores, 'core')} / {_count(together, 'engine')} at once ({why})"
    if together < at_once:
        said = f"{_count(cores, 'core')} / {_count(together, 'engine')} at once (only {sharing} share its CPUs)"
    return ComputeShare(threads, cpus, ShareSource.AUTO, f"{said} = {threads}; {where}")


def describe_share(share: ComputeShare) -> str:
    """One line for `steward check`: the threads steward passes, where it runs, how that was decided."""
    if share.threads is None:
        return share.how
    return f"{_count(share.threads, 'thread')} (--threads, --threads-batch): {share.how}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


# --- the edge: what this host lets steward use ---------------------------------------------------

def usable_cpus(cgroup: Path = Path("/sys/fs/cgroup")) -> HostCpus:
    """The CPUs this process may run on (its affinity), counted no higher than a cgroup v2 CPU
    quota allows (``cpu.max``: a container given 2 CPUs' time on a 64-core host)."""
    cpus = CpuSet(frozenset(os.sched_getaffinity(0)))
    count = len(cpus)
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
        if quota != "max":
            count = max(1, min(count, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return HostCpus(cpus, count)
