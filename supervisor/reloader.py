"""Reloading the config of a running steward: one task owns "the running config".

A reload (SIGHUP while steward's terminal is there, `steward reload`, POST /admin/reload)
reads the config file again and checks it as `steward check` does (the same messages);
a config that is invalid, does not fit the devices, or changes what needs a restart is
refused and the running one kept. Otherwise, with nothing in flight dropped:

- an added model gets its engine task, then the scheduler learns of it;
- a removed model leaves the names clients may send at once; its waiting requests get 404,
  its requests in flight finish, then its engine stops and its task ends;
- a changed model drains and stops the same way, waiting requests kept; then its task is
  replaced by one with the new config and the next load is the new one;
- the classes and the scheduler's rules are replaced.

Events: ``reload`` (added, removed, changed, unchanged), ``reload_refused`` (problems).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import attrs
import httpx
import trio

from supervisor.config import Config, ConfigError, load_config
from supervisor.config_policy import check_remote_keys, engine_profiles, engine_specs, scheduling_policy
from supervisor.engines.driver import EngineHandle, serve_engine
from supervisor.engines.spec import EngineSpec
from supervisor.observe.events import EventLog
from supervisor.gateway.catalog import ModelCatalog
from supervisor.engines.measurements import MeasurementStore
from supervisor.engines.memory_plan import Device, MemoryPlan, budget_problems, plan_all
from supervisor.reload import Reload, ReloadOutcome, plan_reload
from supervisor.scheduler.actor import SchedulerClient
from supervisor.supervise import Supervision, supervise


@attrs.define(eq=False)
class Reloader:
    """What a reload changes, and the engine tasks it starts (in *nursery*)."""

    path: Path
    config: Config  # the running one
    budgets: list[int]
    device: Device
    store: MeasurementStore
    plans: dict[str, MemoryPlan]
    engines: dict[str, EngineHandle]
    catalog: ModelCatalog
    scheduler: SchedulerClient
    events: EventLog
    http: httpx.AsyncClient
    nursery: trio.Nursery
    # Changed models whose old engine is draining: the spec their new task starts with.
    _waiting_specs: dict[str, EngineSpec] = attrs.Factory(dict)

    async def reload(self) -> ReloadOutcome:
        try:
            new = load_config(self.path)
            plan = plan_reload(self.config, new)
            if isinstance(plan, list):
                raise ConfigError(plan)
            check_remote_keys(new, os.environ)  # a remote model's key must be set, as at the start
            specs = engine_specs(new)
            fresh = [*plan.added, *plan.changed]
            plans = {**self.plans, **plan_all(_only(new, fresh), {n: specs[n].command(0) for n in fresh},
                                              self.store, self.device)}
            profiles = engine_profiles(new, specs, plans)
            if problems := budget_problems(new, profiles, self.budgets):
                raise ConfigError(problems)
        except ConfigError as exc:
            self.events.emit("reload_refused", "warning", path=str(self.path), problems=exc.problems)
            return ReloadOutcome(None, tuple(exc.problems))
        by_name = {profile.name: profile for profile in profiles}
        self.config, self.plans = new, plans
        self.catalog.replace(new)  # removed names go now; added ones are routed once their engine is known
        for name in plan.added:
            self.engines[name] = await self.nursery.start(serve_engine, specs[name], self.scheduler, self.events,
                                                          self.http)
            self.scheduler.add_engine(by_name[name], self.store.load_time(plans[name].key))
        for name in plan.removed:
            self.plans.pop(name, None)
            self.scheduler.retire_engine(name, None)
        for name in plan.changed:
            self._waiting_specs[name] = specs[name]
            self.scheduler.retire_engine(name, by_name[name])
        if plan.rules_changed:
            self.scheduler.replace_policy(scheduling_policy(new))
        self.events.emit("reload", "info", path=str(self.path), added=list(plan.added), removed=list(plan.removed),
                         changed=list(plan.changed), unchanged=list(plan.unchanged), rules_changed=plan.rules_changed,
                         changes={name: list(lines) for name, lines in plan.changes.items()})
        return ReloadOutcome(plan)

    def on_retired(self, name: str, replaced: bool) -> None:
        """The scheduler says a removed or changed engine has stopped: its task goes (and a
        changed one's new task starts)."""
        handle = self.engines.pop(name, None)
        if handle is not None:
            handle.retire()
        if replaced and (spec := self._waiting_specs.pop(name, None)) is not None:
            self.nursery.start_soon(self._replace, spec)

    async def _replace(self, spec: EngineSpec) -> None:
        self.engines[spec.name] = await self.nursery.start(serve_engine, spec, self.scheduler, self.events, self.http)
        self.scheduler.report_replaced(spec.name)


def _only(config: Config, names: list[str]) -> Config:
    return attrs.evolve(config, models={name: config.models[name] for name in names})


async def serve_reloads(reloader: Reloader, supervision: Supervision | None = None, *,
                        task_status: trio.TaskStatus[Reload] = trio.TASK_STATUS_IGNORED) -> None:
    """The one task that reloads: requests are served one at a time, each answered with its outcome.
    Under *supervision*, a reload that fails (a bug) is answered as refused and the task restarts
    on the same requests."""
    send, receive = trio.open_memory_channel[tuple[trio.Event, list[ReloadOutcome]]](16)

    async def request() -> ReloadOutcome:
        done, outcome = trio.Event(), []
        await send.send((done, outcome))
        await done.wait()
        return outcome[0]

    task_status.started(request)
    if supervision is None:
        await _serve_requests(reloader, receive)
    else:
        await supervise(supervision, "reloader", functools.partial(_serve_requests, reloader, receive))


async def _serve_requests(reloader: Reloader, receive: trio.MemoryReceiveChannel[tuple[trio.Event,
                          list[ReloadOutcome]]], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
                          ) -> None:
    task_status.started()
    async for done, outcome in receive:
        try:
            outcome.append(await reloader.reload())
        finally:
            if not outcome:  # it failed: whoever asked is answered, never left waiting
                outcome.append(ReloadOutcome(None, ("steward failed while reloading (its task_failed event says "
                                                    "how); the running config stays",)))
            done.set()
