"""``steward check CONFIG``: the resolved plan of a config, and what would make ``run`` refuse it.

It resolves budgets, memory plans and compute shares as ``run`` does and opens what
``run`` opens at start (dry_start.py), without serving: nothing of the gateway.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Container

from adapters import model_apis
from adapters.llama_server import fits_itself
from supervisor.apis import api_names, model_kind
from supervisor.accounting.cpu_share import describe_share, usable_cpus
from supervisor.auth.keys import KeyFileError, load_key_file
from supervisor.budgets import budgets_beyond_devices, memory_device, resolve_budgets
from supervisor.config import Config, ConfigError, FallbackConfig, ModelConfig
from supervisor.config_policy import (
    check_remote_keys,
    compute_shares,
    engine_profiles,
    engine_specs,
    exposed_listeners,
    exposure_problem,
    listen_addresses,
)
from supervisor.dry_start import dry_start_problems
from supervisor.exit_status import EXIT_CONFIG
from supervisor.engines.measurements import MeasurementStore
from supervisor.engines.memory_plan import budget_problems, plan_all
from supervisor.engines.probes import ProbeUnavailable, open_probe
from supervisor.units import format_duration, format_size


def run_check(config: Config) -> int:
    """Print the plan of *config*; its problems on stderr. The exit status: EXIT_CONFIG with problems."""
    try:
        probe, note = open_probe(config.gpu)
        readings = probe.read() if probe else []
    except ProbeUnavailable as exc:
        print(f"steward: gpu.probe: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    specs = engine_specs(config)
    try:
        check_remote_keys(config, os.environ)
        budgets = resolve_budgets(config, readings)
        plans = plan_all(config, {name: specs[name].command(0) for name in config.models},
                         MeasurementStore.open(config.state_file), memory_device(probe))
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"steward: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    host = usable_cpus()
    compute = compute_shares(config, host)
    print(f"listen   {config.listen}")
    print(f"probe    {note}")
    print(f"cpus     {host.count} for the engines ({host.cpus}), shared so that those computing at once never "
          f"oversubscribe them")
    budget = sum(device.nbytes for device in budgets)
    if len(budgets) == 1:
        print(f"budget   {format_size(budget)} ({budget} bytes) from {budgets[0].source}")
    else:
        print(f"budget   {format_size(budget)} over {len(budgets)} devices")
        for index, device in enumerate(budgets):
            print(f"  device {index}  {format_size(device.nbytes)} ({device.nbytes} bytes) from {device.source}")
    for name, model in config.models.items():
        spec, plan = specs[name], plans[name]
        aliases = [alias for alias, target in config.alias_table().items() if target == name and alias != name]
        print(f"\nmodel {name}  ({model.runtime}, {_tier(model)})")
        if model.upstream is not None:
            print(f"  attach   {model.upstream.url} (someone else runs it; steward waits for {model.health})")
        else:
            print(f"  command  {shlex.join(spec.command('<port>') or [])}")
        print(f"  memory   {format_size(plan.nbytes)} ({plan.nbytes} bytes) reserved while loaded, "
              f"{_SOURCES[plan.source]}")
        print(f"  slots    {spec.slots}" + ("" if model.runtime == "llama-server" else
                                             " (requests steward sends at once; the rest wait in its queue)"))
        apis, kind = model_apis(model), model_kind(model_apis(model)).value  # kind: as /v1/models says
        names = api_names(apis)
        voices = f"; voices {', '.join(model.voices)}" if model.voices else ""
        print(f"  serves   {', '.join(names)}{'' if kind in names else f' (kind {kind})'}{voices}")
        if model.devices is not None:
            print(f"  devices  {', '.join(map(str, model.devices))}" + (
                " (split over them)" if len(model.devices) > 1 else ""))
        if model.upstream is None:
            print(f"  compute  {describe_share(compute.shares[name])}")
        if model.sleep is not None:
            held = (f"holds {format_size(model.sleep.memory)} asleep" if model.sleep.memory is not None
                    else "what it holds asleep is measured")
            print(f"  sleep    unloading is POST /sleep?level={model.sleep.level}, loading POST /wake_up; {held}")
        if model.idle_unload is not None:
            print(f"  idle     unloaded after {format_duration(model.idle_unload)} without a request")
        if model.runtime == "llama-server":
            print("  fit      llama-server's own --fit is " + (
                "on (set in args): it may change unset parameters to fit the memory it sees free"
                if fits_itself(model) else "off: steward plans the memory (set --fit in args to let it)"))
        if (cache := spec.slot_cache) is not None:
            print(f"  cache    on eviction, up to {cache.slots} slot(s)' KV caches ({format_size(cache.max_bytes)} "
                  f"at most, {cache.min_tokens}+ tokens each) saved in {cache.save_path} within "
                  f"{format_duration(cache.save_within)}, restored on its next load; kept "
                  f"{format_duration(cache.keep_s)}, {format_size(config.kv_cache.max_bytes)} for all models")
        if aliases:
            print(f"  aliases  {', '.join(aliases)}")
        for route in model.fallback:
            print(f"  fallback {describe_route(route, config.remote_models)}")
        if model.command is not None and shutil.which(model.command[0]) is None:
            print(f"  warning  {model.command[0]} is not an executable program here")
        if model.model is not None and not os.path.exists(model.model):
            print(f"  warning  model file {model.model} does not exist here")
    for name, service in (("ollama", config.ollama), ("comfyui", config.comfyui)):
        if service is not None:
            how = f"supervised: {shlex.join(service.command)}" if service.command else "attached"
            print(f"\n{name:<8} listen {service.listen or '(off)'} -> upstream {service.upstream} ({how})")
    if config.ollama is not None:
        print(f"  memory   {format_size(config.ollama.memory)} reserved while Ollama may hold models "
              f"(grows to what /api/ps reports), {config.ollama.parallel} request(s) at once")
    if config.comfyui is not None:
        need = config.comfyui.memory or budgets[0].nbytes
        print(f"  images   exclusive jobs in the {config.comfyui.job_class} class, {format_size(need)} each")
        for name, image in config.image_models.items():
            also = f" ({', '.join(image.aliases)})" if image.aliases else ""
            if image.video is not None:
                print(f"  model    {name}{also}: /v1/videos from {image.workflow}, "
                      f"{'/'.join(str(s) for s in image.video.seconds)} s at {image.video.fps} fps, "
                      f"{', '.join(image.video.sizes)}")
                continue
            print(f"  model    {name}{also}: /v1/images/generations from {image.workflow}, {image.size}, "
                  f"{image.steps} steps by default")
        print(f"  videos   kept in {config.videos.dir}, up to {format_size(config.videos.max_bytes)}, "
              f"for {format_duration(config.videos.keep)}")
    for name, remote in config.remote_models.items():
        also = f" ({', '.join(remote.aliases)})" if remote.aliases else ""
        print(f"\nremote {name}{also}  {remote.upstream} ({remote.api} API, key from ${remote.key_env}, "
              f"{remote.max_concurrency} at once, {remote.price.input:g}/{remote.price.output:g} per million tokens "
              f"in/out{', CAs also from ' + remote.ca_file if remote.ca_file else ''}): no GPU memory")
    for name, node in config.nodes.items():
        key = f"key from ${node.key_env}" if node.key_env else "no key"
        wake = node.wake
        woken = (f"; wakes {wake.mac} via {wake.broadcast}:{wake.port}, waits {format_duration(wake.timeout)}"
                 if wake is not None else "")
        print(f"\nnode {name}  {node.url.url} ({key}{woken})")
        print(f"  models   {', '.join(node.models) + ' (configured)' if node.models else 'what it says it serves'}")
        if node.key_env and not os.environ.get(node.key_env):
            print(f"  warning  ${node.key_env} is not set here: `steward run` would refuse to start")
    for capability, models in config.capabilities.items():
        print(f"\ncapability {capability} -> {', '.join(models)} (the first resident, else the first that fits)")
    total = sum(plan.nbytes for plan in plans.values())
    pinned = sum(plans[name].nbytes for name, model in config.models.items() if model.resident)
    print(f"\nall models {format_size(total)}, pinned {format_size(pinned)}, budget {format_size(budget)}")
    profiles = engine_profiles(config, specs, plans)
    problems = budgets_beyond_devices(budgets, readings, memory_device(probe))
    problems += budget_problems(config, profiles, [device.nbytes for device in budgets]) + _auth_problems(config)
    problems += dry_start_problems(config)  # what run opens at start, opened here the same way
    problems += compute.problems
    for problem in problems:
        print(f"steward: {problem}", file=sys.stderr)
    return EXIT_CONFIG if problems else 0


def _auth_problems(config: Config) -> list[str]:
    """Print who may call steward; what would make `run` refuse to start."""
    try:
        keys = load_key_file(config.auth.keys_file).keys
    except KeyFileError as exc:
        return [str(exc)]
    exposed = exposed_listeners(config)
    if keys:
        print(f"keys     {len(keys)} in {config.auth.keys_file}: every request needs one")
    elif exposed:
        print(f"keys     none in {config.auth.keys_file}")
    elif config.auth.allow_unauthenticated:
        print(f"keys     none in {config.auth.keys_file}: auth.allow_unauthenticated lets anyone who can reach the "
              f"listeners use them")
    else:
        print(f"keys     none in {config.auth.keys_file}: open to this machine only (loopback)")
    if config.auth.allow_unauthenticated and not keys and any(
            not address.is_loopback for address in listen_addresses(config).values()):
        print("warning  auth.allow_unauthenticated with a listener beyond loopback: keep it unreachable from other "
              "machines (publish on 127.0.0.1) or add a key")
    print(f"usage    {config.usage.db or '(no usage log)'}")
    problem = exposure_problem(config, has_keys=bool(keys))
    return [] if problem is None else [problem]


def describe_route(route: FallbackConfig, remote: Container[str] = ()) -> str:
    """``-> gemma4-e4b for background, batch when no_room or wait (past 30s)``; *remote*: the
    names of the models a cloud serves."""
    classes = "every class" if route.classes is None else ", ".join(route.classes)
    bound = "" if "wait" not in route.when else f" (past {format_duration(route.wait)})" if route.wait is not None \
        else " (past the class's slo_wait)"
    cloud = " (a cloud: runtime remote)" if route.model in remote else ""
    return f"-> {route.model}{cloud} for {classes} when {' or '.join(route.when)}{bound}"


def _tier(model: ModelConfig) -> str:
    if model.pinned:
        return "pinned"
    return "always on" if model.resident else "on demand"


_SOURCES = {"config": "set by hand", "measured": "measured on an earlier load",
            "estimate": "estimated from the GGUF header (replaced by a measurement after the first load)"}
