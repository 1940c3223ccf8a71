"""A new config for a running steward (SIGHUP, `steward reload`, POST /admin/reload): what
changes, and whether it can change without a restart. Pure: two configs in, a plan out.

What reloads live: the models (added, removed, changed: a changed or removed engine drains
its requests in flight first), their aliases, the classes and the scheduler's rules. What
the listeners, the probe, the files or the services are is fixed for the life of the
process: a new config that changes any of them is refused as a whole, the running one
kept, and the refusal says which key needs a restart.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import attrs

from supervisor.config import Config

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
                "changed": list(plan.changed), "unchanged": list(plan.unchanged), "rules_changed": plan.rules_changed}


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
    return ReloadPlan(
        added=tuple(name for name in now if name not in old),
        removed=tuple(name for name in old if name not in now),
        changed=tuple(name for name in now if name in old and now[name] != old[name]),
        unchanged=tuple(name for name in now if name in old and now[name] == old[name]),
        rules_changed=running.classes != new.classes or running.scheduler != new.scheduler)
