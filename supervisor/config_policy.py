"""From the config to what the scheduler's core decides with: its policy and its engines."""

from __future__ import annotations

import ssl
from collections.abc import Container, Mapping, Sequence
from pathlib import Path

import attrs

from adapters import LlamaServerRuntime, OllamaRuntime, Residence, Runtime, model_runtime
from supervisor.accounting.cpu_share import (
    EngineCompute,
    HostCpus,
    SharePlan,
    decide_shares,
    sets_threads,
    usable_cpus,
)
from supervisor.address import Address
from supervisor.backoff import Backoff
from supervisor.config import OLLAMA_ENGINE, Config, ConfigError, FallbackConfig
from supervisor.engines.spec import EngineSpec, HealthChecks
from supervisor.gateway.relay.tls import tls_context
from supervisor.observe.health import DEFAULT_SLO_WAIT
from supervisor.engines.memory_plan import MemoryPlan
from supervisor.nodes.spec import NodeSpec
from supervisor.scheduler.core import Scheduler
from supervisor.slot_cache.fingerprint import cache_types
from supervisor.slot_cache.plan import SlotCachePlan
from supervisor.slot_cache.store import CacheFolder
from supervisor.request_class import RequestClass
from supervisor.scheduler.types import (
    DEFAULT_DEVICE,
    BackoffPolicy,
    EngineProfile,
    FallbackRoute,
    FallbackWhen,
    SchedulingPolicy,
)


def engine_specs(config: Config, host: HostCpus | None = None) -> dict[str, EngineSpec]:
    """Every engine the config names, each through its runtime's adapter: the models, then Ollama.
    *host*: the CPUs the engines share (default: this process's, read here)."""
    specs = {}
    shares = compute_shares(config, host).shares
    for name, model in config.models.items():
        where = model.upstream or Address(config.engines.host, model.port or 0)
        runtime = model_runtime(model)
        slots = slot_cache_plan(config, name)
        if isinstance(runtime, LlamaServerRuntime):
            runtime = attrs.evolve(runtime, threads=shares[name].threads, served_as=name,
                                   slot_save_path=None if slots is None else slots.save_path)
        specs[name] = attrs.evolve(_engine_spec(name, runtime, where, config),
                                   devices=None if model.devices is None else tuple(model.devices),
                                   cpus=shares[name].cpus, slot_cache=slots)
    if (ollama := config.ollama) is not None:
        specs[OLLAMA_ENGINE] = attrs.evolve(_engine_spec(OLLAMA_ENGINE, OllamaRuntime(ollama), ollama.upstream, config),
                                            usage_poll=ollama.ps_poll,
                                            retry=Backoff(ollama.retry_initial, ollama.retry_max))
    return specs


def slot_cache_plan(config: Config, name: str) -> SlotCachePlan | None:
    """models.NAME.keep_cache with the kv_cache section's folder and bounds; None: off."""
    model, cache = config.models[name], config.kv_cache
    if model.keep_cache is None:
        return None
    keep = model.keep_cache
    return SlotCachePlan(CacheFolder(Path(cache.dir)), name, keep.slots,
                         cache.max_bytes if keep.max_bytes is None else min(keep.max_bytes, cache.max_bytes),
                         keep.min_tokens, cache.max_bytes, cache.keep, cache.save_within, cache.restore_within,
                         cache_types(model.args, model.env))


def compute_shares(config: Config, host: HostCpus | None = None) -> SharePlan:
    """Each engine's threads and CPUs (supervisor/accounting/cpu_share.py); *host*: default, this process's CPUs."""
    engines = [EngineCompute(name, model.runtime, spawned=model.command is not None, threads=model.threads,
                             threads_in_args=sets_threads(model.args, model.env), cpus=model.cpus, memory=model.memory)
               for name, model in config.models.items()]
    if config.ollama is not None and config.ollama.command is not None:  # it computes beside them
        engines.append(EngineCompute(OLLAMA_ENGINE, "ollama", spawned=True, memory=config.ollama.memory))
    # One memory budget the engines share, where the config alone says so (host memory, or a probe
    # of none); else how many fit at once is not known here, and every engine counts as fitting.
    one_device = not config.gpu.devices and config.gpu.probe in ("host", "none")
    budget = config.gpu.budget if one_device else None
    return decide_shares(engines, config.scheduler.lower_class_engines, budget, host or usable_cpus())


def _engine_spec(name: str, runtime: Runtime, where: Address, config: Config) -> EngineSpec:
    """*where*: the engine's host, and its port if fixed (0: one is picked per process)."""
    engines = config.engines
    return EngineSpec(name=name, runtime=runtime, host=where.host, port=where.port or None,
                      start_timeout=engines.start_timeout, stop_grace=engines.stop_grace,
                      health_interval=engines.health_interval, tail_lines=engines.stderr_tail_lines,
                      checks=HealthChecks(engines.health_check_interval, engines.health_check_timeout),
                      retry=Backoff(engines.restart_backoff, engines.restart_backoff_max))


def scheduling_policy(config: Config) -> SchedulingPolicy:
    defaults = SchedulingPolicy()
    classes = {klass: getattr(config.classes, klass) for klass in RequestClass}
    return SchedulingPolicy(
        interactive_window=config.scheduler.interactive_window,
        starvation={"interactive": 0.0, "background": config.scheduler.background_max_starvation,
                    "batch": config.scheduler.batch_max_starvation},
        hot_window=config.scheduler.hot_window,
        swap_hold=config.scheduler.swap_hold,
        warm=tuple(config.scheduler.warm),
        guard_share=config.scheduler.guard_share,
        guard_gap_wait=config.scheduler.guard_gap_wait,
        guard_fill=config.scheduler.guard_fill,
        gap_step=config.scheduler.gap_step,
        lower_class_engines=config.scheduler.lower_class_engines,
        max_queue={k: c.max_queue or defaults.max_queue[k] for k, c in classes.items()},
        queue_timeout={k: defaults.queue_timeout[k] if c.queue_timeout is None else c.queue_timeout
                       for k, c in classes.items()},
        slo_wait=slo_waits(config),
        release_timeout=config.scheduler.release_timeout,
        backoff=BackoffPolicy(config.engines.restart_backoff, config.engines.restart_backoff_max),
        unhealthy_after=config.engines.unhealthy_after, recover_timeout=config.engines.recover_timeout)


def engine_profiles(config: Config, specs: Mapping[str, EngineSpec], plans: Mapping[str, MemoryPlan],
                    ) -> list[EngineProfile]:
    profiles = [EngineProfile(name, plans[name].nbytes, specs[name].slots, model.resident,
                              fixed_memory=plans[name].source == "config", idle_unload=model.idle_unload,
                              sleep_memory=model.sleep.memory if model.sleep is not None else None,
                              devices=_devices(specs[name]), splittable=specs[name].runtime.splits,
                              fallback=fallback_routes(model.fallback, config.remote_models))
                for name, model in config.models.items()]
    if config.ollama is not None:
        profiles.append(EngineProfile(OLLAMA_ENGINE, config.ollama.memory, config.ollama.parallel,
                                      devices=(DEFAULT_DEVICE,)))
    return profiles


def fallback_routes(chain: Sequence[FallbackConfig], remote: Container[str] = ()) -> tuple[FallbackRoute, ...]:
    """A model's fallback chain as the scheduler takes it (models.NAME.fallback); *remote*: the
    names of the models a cloud serves (runtime: remote)."""
    return tuple(FallbackRoute(route.model, frozenset(FallbackWhen(when) for when in route.when),
                               None if route.classes is None else frozenset(route.classes), route.wait,
                               remote=route.model in remote)
                 for route in chain)


def _devices(spec: EngineSpec) -> tuple[int, ...] | None:
    """Where the scheduler may place it: a kept process (a service, an attached server) stays on
    the devices it was started on, the first unless models.NAME.devices says."""
    if spec.runtime.residence is Residence.SPAWNED:
        return spec.devices
    return spec.devices or (DEFAULT_DEVICE,)


def build_scheduler(config: Config, specs: Mapping[str, EngineSpec], plans: Mapping[str, MemoryPlan],
                    budgets: list[int], *, observe_memory: bool,
                    load_times: Mapping[str, float] | None = None) -> Scheduler:
    """*load_times*: each engine's load time measured before (MeasurementStore.load_time)."""
    return Scheduler.create(budgets, engine_profiles(config, specs, plans), scheduling_policy(config),
                            observe_memory=observe_memory, load_times=load_times)


def listen_addresses(config: Config) -> dict[str, Address]:
    """Each listener steward opens, by name."""
    listeners = {"openai": config.listen}
    for name, service in (("ollama", config.ollama), ("comfyui", config.comfyui)):
        if service is not None and service.listen is not None:
            listeners[name] = service.listen
    return listeners


def exposed_listeners(config: Config) -> frozenset[str]:
    """Listeners reachable from other machines that must not serve without a key."""
    if config.auth.allow_unauthenticated:
        return frozenset()
    return frozenset(name for name, address in listen_addresses(config).items() if not address.is_loopback)


def exposure_problem(config: Config, has_keys: bool) -> str | None:
    """Why steward must not start: a listener beyond loopback, and no key to guard it."""
    exposed = exposed_listeners(config)
    if has_keys or not exposed:
        return None
    where = ", ".join(f"{name} on {listen_addresses(config)[name]}" for name in sorted(exposed))
    return (f"auth.keys_file: {config.auth.keys_file} holds no key, and steward would listen beyond loopback "
            f"({where}) for anyone to use. Add a key with `steward keys add NAME --config CONFIG`, or set "
            f"auth.allow_unauthenticated: true if that is deliberate")


def slo_waits(config: Config) -> dict[str, float]:
    """How long each class may wait before steward counts as overloaded."""
    return {klass: getattr(config.classes, klass).slo_wait or DEFAULT_SLO_WAIT[klass] for klass in RequestClass}


def node_specs(config: Config, environ: Mapping[str, str]) -> list[NodeSpec]:
    """The nodes a front door routes to, each with its key read from the environment."""
    specs, problems = [], []
    for name, node in config.nodes.items():
        key = None
        if node.key_env is not None:
            key = environ.get(node.key_env)
            if not key:
                problems.append(f"nodes.{name}.key_env: {node.key_env} is not set in steward's environment (it "
                                f"holds the node's admin key)")
        specs.append(NodeSpec(name, node.url.url, key, node.wake, tuple(node.models) if node.models else None,
                              node.poll))
    if problems:
        raise ConfigError(problems)
    return specs


def remote_key_problems(config: Config, environ: Mapping[str, str]) -> list[str]:
    """What keeps the remote models from being served here: a key variable that is not set, a
    ca_file that cannot be read (`steward run` and `steward check` refuse the config)."""
    problems = []
    for name, model in config.remote_models.items():
        if not environ.get(model.key_env):
            problems.append(f"models.{name}.key_env: {model.key_env} is not set in steward's environment (it "
                            f"holds the cloud's API key)")
        if model.ca_file is not None:
            try:
                tls_context(model.ca_file)
            except (OSError, ssl.SSLError) as exc:
                problems.append(f"models.{name}.ca_file: cannot read {model.ca_file} as PEM certificates: "
                                f"{getattr(exc, 'strerror', None) or exc}")
    return problems


def check_remote_keys(config: Config, environ: Mapping[str, str]) -> None:
    if problems := remote_key_problems(config, environ):
        raise ConfigError(problems)
