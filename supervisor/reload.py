"""A new config for a running steward (SIGHUP, `steward reload`, POST /admin/reload): what
changes, and whether it can change without a restart. Pure: two configs in, a plan out.

What reloads live: the models (added, removed, changed: a changed or removed engine drains
its requests in flight first), their aliases, the classes and the scheduler's rules. What
the listeners, the probe, the files or the services are is fixed for the life of the
process: a new config that changes any of them is refused as a whole, the running one
kept, and the refusal says which key needs a restart.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import attrs

from supervisor.config import Config
from supervisor.units import format_size

# Sections read once at start (listeners bound, files opened, services and nodes followed).
_FIXED = ("listen", "gpu", "limits", "security", "engines", "log", "auth", "usage", "health", "alerts", "state_file",
          "ollama", "comfyui", "nodes", "capabilities")


@attrs.frozen
class ReloadPlan:
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    unchanged: tuple[str, ...]
    rules_changed: bool  # classes or scheduler: the scheduler's policy is replaced
    # Per changed model, what changed: one line per key (`memory: 4.0 GiB -> 6.0 GiB`).
    changes: dict[str, tuple[str, ...]] = attrs.Factory(dict)

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed or self.rules_changed)


@attrs.frozen
class ReloadOutcome:
    plan: ReloadPlan | None  # None: refused, for *problems*
    problems: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        if self.plan is None:
            return {"reloaded": False, "problems": list(self.problems)}
        plan = self.plan
        return {"reloaded": True, "added": list(plan.added), "removed": list(plan.removed),
                "changed": list(plan.changed), "changes": {name: list(lines) for name, lines in plan.changes.items()},
                "unchanged": list(plan.unchanged), "rules_changed": plan.rules_changed}


Reload = Callable[[], Awaitable[ReloadOutcome]]  # read the config file again and apply it


def plan_reload(running: Config, new: Config) -> ReloadPlan | list[str]:
    """The plan, or the problems that refuse it (one line each, naming the key)."""
    problems = [f"{section}: changed, and it needs a restart (steward keeps the running config)"
                for section in _FIXED if getattr(running, section) != getattr(new, section)]
    if running.scheduler.embedding_chunk != new.scheduler.embedding_chunk:
        problems.append("scheduler.embedding_chunk: changed, and it needs a restart (steward keeps the running config)")
    if problems:
        return problems
    old, now = running.models, new.models
    changed = tuple(name for name in now if name in old and now[name] != old[name])
    return ReloadPlan(
        added=tuple(name for name in now if name not in old),
        removed=tuple(name for name in old if name not in now),
        changed=changed,
        unchanged=tuple(name for name in now if name in old and now[name] == old[name]),
        rules_changed=running.classes != new.classes or running.scheduler != new.scheduler,
        changes={name: model_changes(old[name], now[name]) for name in changed})


_SAID_MAX = 100  # characters of a value in a change's line


def model_changes(old: object, new: object) -> tuple[str, ...]:
    """What changed in one model's config, a line per key: ``args: ["-c", "4096"] -> ["-c", "8192"]``.
    Sizes read as sizes; of ``env`` only the names are said (its values may be secrets)."""
    if type(old) is not type(new) or not attrs.has(type(old)):
        return (f"runtime: {getattr(old, 'runtime', '?')} -> {getattr(new, 'runtime', '?')}",)
    lines = []
    for field in attrs.fields(type(old)):
        before, after = getattr(old, field.name), getattr(new, field.name)
        if before == after:
            continue
        if field.name == "env":
            names = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
            lines.append(f"env: {', '.join(names)} changed")
        elif field.name == "memory":
            lines.append(f"memory: {_size(before)} -> {_size(after)}")
        else:
            lines.append(f"{field.name}: {_said(before)} -> {_said(after)}")
    return tuple(lines)


def _size(value: int | None) -> str:
    return "unset" if value is None else format_size(value)


def _said(value: object) -> str:
    if value is None:
        return "unset"
    said = json.dumps(attrs.asdict(value) if attrs.has(type(value)) else value, default=str)
    return said if len(said) <= _SAID_MAX else said[: _SAID_MAX - 3] + "..."
