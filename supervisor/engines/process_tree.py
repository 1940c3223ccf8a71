"""Process trees from /proc: an engine's memory is the sum over its whole tree.

vLLM keeps its memory in child processes (its EngineCore and workers), not in the one
steward spawned; Ollama's runners are children of `ollama serve`. NVML lists each process
apart, and RSS is per process: both are folded onto the engine's own pid here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 (state) on: the command name may hold spaces and parentheses."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].decode().split()
    except OSError:
        return None


def alive(pid: int) -> bool:
    """Whether *pid* runs (a zombie, exited but not yet reaped, does not)."""
    stat = stat_fields(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def read_parents() -> dict[int, int]:
    """pid -> parent pid of every live (non-zombie) process."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := stat_fields(int(entry))) is not None and stat[0] not in ("Z", "X"):
            parents[int(entry)] = int(stat[1])
    return parents


def tree_of(root: int, parents: Mapping[int, int]) -> set[int]:
    """*root* and its live descendants."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found, stack = {root}, list(children.get(root, []))
    while stack:
        pid = stack.pop()
        if pid not in found:
            found.add(pid)
            stack.extend(children.get(pid, []))
    return found


def fold_to_roots(processes: Mapping[int, int], roots: Iterable[int], parents: Mapping[int, int]) -> dict[int, int]:
    """*processes* (pid -> bytes) with each descendant of a root counted under that root. Pure.

    A process under no root keeps its own entry (it is someone else's, or outside use)."""
    roots = set(roots)
    folded: dict[int, int] = {}
    for pid, nbytes in processes.items():
        owner, seen = pid, set()
        while owner not in roots and owner in parents and owner not in seen and owner > 1:
            seen.add(owner)
            owner = parents[owner]
        key = owner if owner in roots else pid
        folded[key] = folded.get(key, 0) + nbytes
    return folded


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None  # exited between the listing and the read
    return None


def tree_rss(root: int, parents: Mapping[int, int]) -> int | None:
    """The resident memory of *root*'s whole tree; None if *root* is gone."""
    own = rss_bytes(root)
    if own is None:
        return None
    return own + sum(rss_bytes(pid) or 0 for pid in tree_of(root, parents) - {root})
