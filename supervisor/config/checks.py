"""What the config's keys mean together, checked once it is structured (``parse_config``): names
that clash, settings that contradict each other, values no engine, socket or terminal can take.

Each problem is one line naming the key, in ``steward check``'s words; ``check_semantics`` gives
them all at once, so a person fixes a config in one pass.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any


from supervisor.accounting.cpu_share import THREADED_RUNTIMES, sets_threads
from supervisor.address import ANY, Address, normalize_origin  # the cross-site guard reads origins the same way
from supervisor.config.schema import (
    COMFYUI_SCOPE,
    DEFAULT_HEALTH,
    OLLAMA_ENGINE,
    PORT_PLACEHOLDER,
    ComfyConfig,
    Config,
    ModelConfig,
    OllamaConfig,
)
from supervisor.units import format_duration, show


def check_semantics(config: Config) -> list[str]:
    problems = []
    if not (config.models or config.image_models or config.remote_models) and config.ollama is None and config.comfyui is None \
            and not config.nodes:
        problems.append("models: must name at least one model (or configure ollama, comfyui or nodes)")
    seen: dict[str, str] = {}
    for name, model in config.models.items():
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:/\-]*", name) or "@" in name:
            problems.append(f"models.{name}: a model name may hold letters, digits and ._:/- (no '@')")
        if model.parallel is not None and _has_flag(model.args, *_PARALLEL_FLAGS):
            problems.append(f"models.{name}.parallel: set here and as --parallel in args; keep one")
        if (why := _parallel_arg_problem(model.args)) is not None:
            problems.append(f"models.{name}.args: {why}")
        if model.memory == 0:
            problems.append(f"models.{name}.memory: must be the engine's memory size, e.g. 8.3GiB (got 0)")
        if model.memory is None and model.model is None:
            problems.append(f"models.{name}.memory: required when models.{name}.model names no GGUF file "
                            f"to estimate it from")
        problems += _runtime_problems(name, model) + _device_problems(f"models.{name}", model)
        problems += _env_problems(f"models.{name}.env", model.env) + _compute_problems(name, model)
        if (config.gpu.budget is not None and model.memory is not None and model.memory > config.gpu.budget
                and not config.gpu.devices and not model.devices and model.runtime != "llama-server"):
            problems.append(f"models.{name}.memory: {model.memory} bytes is more than gpu.budget "
                            f"({config.gpu.budget} bytes); it could never load")
        for alias in model.aliases:
            if (why := _alias_problem(alias)) is not None:
                problems.append(f"models.{name}.aliases: {why}")
            if alias in seen or alias in config.models:
                problems.append(f"models.{name}.aliases: {alias!r} already names "
                                f"{seen.get(alias, alias)!r}")
            seen[alias] = name
    for alias, target in config.aliases.items():
        if (why := _alias_problem(alias)) is not None:
            problems.append(f"aliases: {why}")
        if target not in config.models:
            problems.append(f"aliases.{alias}: names model {target!r}, which is not under models")
        if alias in config.models or alias in seen:
            problems.append(f"aliases.{alias}: already names {seen.get(alias, alias)!r}")
    if config.ollama is not None and OLLAMA_ENGINE in config.models:
        problems.append(f"models.{OLLAMA_ENGINE}: the name is taken by the Ollama service; rename the model")
    problems += _comfyui_scope_problems(config)
    if config.comfyui is not None and config.comfyui.warm_model is not None and config.ollama is None:
        problems.append("comfyui.warm_model: names an Ollama model, but no ollama section is configured")
    if config.comfyui is not None and config.comfyui.warm_model is not None and \
            (why := _invisible_problem(config.comfyui.warm_model)) is not None:
        problems.append(f"comfyui.warm_model: {why}")
    problems += _front_door_problems(config) + _node_problems(config) + _image_model_problems(config)
    problems += _remote_model_problems(config)
    problems += _warm_problems(config) + _fallback_problems(config)
    if config.gpu.probe == "simulated" and not config.gpu.simulated_dir:
        problems.append("gpu.simulated_dir: required when gpu.probe is 'simulated'")
    return problems + _backoff_problems(config) + _port_problems(config)


def _comfyui_scope_problems(config: Config) -> list[str]:
    """With a ComfyUI listener, `comfyui` in a key's models lets the key reach it: no model or alias is called that."""
    names = {**config.alias_table(), **config.image_alias_table()}
    if config.comfyui is None or COMFYUI_SCOPE not in names:
        return []
    target = names[COMFYUI_SCOPE]
    where = f"models.{COMFYUI_SCOPE}" if target == COMFYUI_SCOPE else \
        f"aliases.{COMFYUI_SCOPE}" if COMFYUI_SCOPE in config.aliases else f"models.{target}.aliases"
    return [f"{where}: the name {COMFYUI_SCOPE!r} is taken by the ComfyUI listener (in a key's models, it lets the "
            f"key reach that listener); rename it"]


def _fallback_problems(config: Config) -> list[str]:
    """Each route of a fallback chain names another model under models, for some reason."""
    problems = []
    aliases = config.alias_table()
    for name, model in config.models.items():
        for i, route in enumerate(model.fallback):
            key = f"models.{name}.fallback[{i}]"
            if route.model == name:
                problems.append(f"{key}.model: names the model itself")
            elif route.model in config.image_models:
                problems.append(f"{key}.model: {show(route.model)} is an image model; a chat cannot go there")
            elif route.model in config.remote_models:
                pass  # a cloud's (runtime: remote): the request leaves for it, if its key may send data out
            elif route.model in aliases and route.model not in config.models:
                problems.append(f"{key}.model: {show(route.model)} is an alias; name the model, "
                                f"{show(aliases[route.model])}")
            elif route.model not in config.models:
                problems.append(f"{key}.model: names model {show(route.model)}, which is not under models")
            if not route.when:
                problems.append(f"{key}.when: name at least one of no_room, wait, failed")
            if route.classes is not None and not route.classes:
                problems.append(f"{key}.classes: name at least one class, or leave it out for every class")
            if route.wait is not None and "wait" not in route.when:
                problems.append(f"{key}.wait: a bound for `wait`, which is not in its `when`")
    return problems


def _warm_problems(config: Config) -> list[str]:
    """scheduler.warm names engines steward loads: models under models, each once."""
    problems = []
    aliases = config.alias_table()
    first: dict[str, int] = {}
    for i, name in enumerate(config.scheduler.warm):
        key = f"scheduler.warm[{i}]"
        if name in first:
            problems.append(f"{key}: {show(name)} is named already, at scheduler.warm[{first[name]}]; keep one")
        elif name in config.image_models:
            problems.append(f"{key}: {show(name)} is an image model: its workflow runs in ComfyUI, which steward "
                            f"does not load")
        elif name in config.remote_alias_table():
            problems.append(f"{key}: {show(name)} is a remote model: a cloud serves it, steward loads nothing")
        elif name == OLLAMA_ENGINE and config.ollama is not None:
            problems.append(f"{key}: 'ollama' is not under models; to warm an Ollama model after an image job, "
                            f"set comfyui.warm_model")
        elif name in aliases and name not in config.models:
            problems.append(f"{key}: {show(name)} is an alias; name the model, {show(aliases[name])}")
        elif name not in config.models:
            problems.append(f"{key}: names model {show(name)}, which is not under models")
        first.setdefault(name, i)
    return problems


def _image_model_problems(config: Config) -> list[str]:
    problems = _split_model_names(config.image_models, config.alias_table())
    for name, model in config.image_models.items():
        if config.comfyui is None:
            problems.append(f"models.{name}.runtime: comfyui runs the workflow in the ComfyUI of the comfyui "
                            f"section, and there is none")
        if not model.workflow:
            problems.append(f"models.{name}.workflow: must be the path of an API-format workflow file")
        if model.video is not None:
            for key, values in (("seconds", model.video.seconds), ("sizes", model.video.sizes)):
                if not values or len(set(values)) != len(values):
                    problems.append(f"models.{name}.video.{key}: must list at least one value, each once")
    return problems


def _remote_model_problems(config: Config) -> list[str]:
    """Remote models' names clash with no other model's (an engine's, an image model's); hooks.py
    checked each value (the URL, the variable's name, the prices)."""
    problems = _split_model_names(config.remote_models, {**config.alias_table(), **config.image_alias_table()})
    for name, model in config.remote_models.items():
        if model.served_name == "":
            problems.append(f"models.{name}.served_name: must be the model's name at the cloud, or left out")
    return problems


def _split_model_names(models: Mapping[str, Any], names: Mapping[str, str]) -> list[str]:
    """The names of models split from the engines' (image, remote): valid, and each name or alias
    naming one model only (*names*: every name the others take)."""
    problems = []
    seen: dict[str, str] = {}
    for name, model in models.items():
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:/\-]*", name):
            problems.append(f"models.{name}: a model name may hold letters, digits and ._:/- (no '@')")
        for alias in model.aliases:
            if (why := _alias_problem(alias)) is not None:
                problems.append(f"models.{name}.aliases: {why}")
            if alias in names or alias in seen or alias in models:
                problems.append(f"models.{name}.aliases: {alias!r} already names "
                                f"{names.get(alias) or seen.get(alias, alias)!r}")
            seen[alias] = name
        if name in names:
            problems.append(f"models.{name}: the name is already an alias of {names[name]!r}")
    return problems


def _device_problems(where: str, model: ModelConfig) -> list[str]:
    if model.devices is None:
        return []
    problems = []
    if not model.devices:
        problems.append(f"{where}.devices: a list of device indices like [0] or [0, 1], got []")
    elif twice := sorted({device for device in model.devices if model.devices.count(device) > 1}):
        problems.append(f"{where}.devices: device {', '.join(map(str, twice))} is named twice")
    if "CUDA_VISIBLE_DEVICES" in model.env:
        problems.append(f"{where}.env: CUDA_VISIBLE_DEVICES is set by steward from {where}.devices; keep one")
    return problems


def _env_problems(where: str, env: dict[str, str]) -> list[str]:
    """What no process environment can hold: each entry is one NAME=VALUE string (a NUL is
    refused in every string, by hooks.py)."""
    problems = []
    for name in env:
        if not name:
            problems.append(f"{where}: a variable needs a name, got ''")
        elif "=" in name:
            problems.append(f"{where}.{name}: a variable's name cannot hold '=' (the environment is NAME=VALUE)")
    return problems


def _front_door_problems(config: Config) -> list[str]:
    problems = []
    if not config.auth.keys_file:
        problems.append("auth.keys_file: must be a file path")
    for path in config.auth.open_paths:
        if not path.startswith("/"):
            problems.append(f"auth.open_paths: {show(path)} is not a path like /livez")
    if config.usage.db == "":
        problems.append("usage.db: must be a file path, or null for no usage log")
    webhook = config.alerts.webhook
    if webhook is not None and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", webhook):
        problems.append(f"alerts.webhook: must be an http:// or https:// URL, got {show(webhook)}")
    elif webhook is not None and (why := _url_problem(webhook)) is not None:
        problems.append(f"alerts.webhook: {why}, got {show(webhook)}")
    for i, host in enumerate(config.security.allowed_hosts):
        if not _is_host_name(host):
            problems.append(f"security.allowed_hosts[{i}]: must be a host name or an IP address without a port, "
                            f"like lab.local or 192.168.1.20, or '*'; got {show(host)}")
    for i, origin in enumerate(config.security.allowed_origins):
        if not _is_origin(origin):
            problems.append(f"security.allowed_origins[{i}]: must be an origin, scheme://host[:port] like "
                            f"https://app.example.com or http://localhost:3000, or '*'; got {show(origin)}")
    return problems


def _is_host_name(text: str) -> bool:
    """What the cross-site guard can find in a Host header (its name, lower case, without the port):
    lab.local, my_service (a container's), 192.168.1.20, ::1; not lab.local:8080 nor [::1]."""
    if text == "*":
        return True
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(text)
        return True
    try:
        return bool(text) and ":" not in text and urllib.parse.urlsplit(f"//{text}").hostname == text.lower()
    except ValueError:
        return False


def _is_origin(text: str) -> bool:
    """What a browser sends as Origin (and the cross-site guard compares, normalized): no path, query or user."""
    if text == ANY:
        return True
    if normalize_origin(text) is None:
        return False
    parts = urllib.parse.urlsplit(text.strip())
    return parts.path in ("", "/") and not parts.query and not parts.fragment and "@" not in parts.netloc


def _url_problem(url: str) -> str | None:
    """What httpx, which makes steward's every request, refuses in *url* (a control character, a length)."""
    import httpx  # here: loading a config needs it only for a URL (steward check starts without it)

    try:
        httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as exc:
        said = str(exc).split(", '", 1)[0].rstrip(".")  # without the character: the value is quoted after it
        return said[:1].lower() + said[1:]
    return None


def _node_problems(config: Config) -> list[str]:
    problems = []
    for name, node in config.nodes.items():
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            problems.append(f"nodes.{name}: a node name may hold letters, digits and ._-")
        if node.key_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", node.key_env):
            problems.append(f"nodes.{name}.key_env: must be the name of an environment variable, got "
                            f"{show(node.key_env)}")
        if node.models is not None and not node.models:
            problems.append(f"nodes.{name}.models: name at least one model, or leave it out")
        if node.url == config.listen:
            problems.append(f"nodes.{name}.url: is this steward's own listen address")
        for i, model in enumerate(node.models or []):
            if (why := _invisible_problem(model)) is not None:
                problems.append(f"nodes.{name}.models[{i}]: {why}")
    return problems + _capability_problems(config)


def _capability_problems(config: Config) -> list[str]:
    """A capability means the first fitting one of its models on the nodes (supervisor/nodes/routing.py):
    the nodes' models, where the config lists them all, are the only ones it can mean."""
    problems = []
    if config.capabilities and not config.nodes:
        problems.append("capabilities: a capability chooses among the models of the nodes, and no node is "
                        "configured (nodes)")
    served = None  # what the nodes serve, where each lists it (else: known only once they answer)
    if config.nodes and all(node.models is not None for node in config.nodes.values()):
        served = {model for node in config.nodes.values() for model in node.models or []}
    names = config.alias_table()
    for capability, models in config.capabilities.items():
        if (why := _alias_problem(capability)) is not None:
            problems.append(f"capabilities: {why}")
        if capability in names:
            problems.append(f"capabilities.{capability}: already names the model {names[capability]!r}")
        if not models:
            problems.append(f"capabilities.{capability}: name the models it means, in order of preference")
        for i, model in enumerate(models):
            if (why := _invisible_problem(model)) is not None:
                problems.append(f"capabilities.{capability}[{i}]: {why}")
            elif served is not None and model not in served:
                problems.append(f"capabilities.{capability}[{i}]: names model {show(model)}, which no node serves "
                                f"(nodes.NAME.models lists what each serves)")
    return problems


def _compute_problems(name: str, model: ModelConfig) -> list[str]:
    """threads and cpus (supervisor/accounting/cpu_share.py): for a process steward starts; threads for llama.cpp."""
    key = f"models.{name}"
    problems = []
    if model.upstream is not None:
        problems += [f"{key}.{field}: applies to a process steward starts, not to an attached server"
                     for field in ("threads", "cpus") if getattr(model, field) is not None]
    elif model.threads is not None and model.runtime not in THREADED_RUNTIMES:
        problems.append(f"{key}.threads: only llama-server takes a thread count from steward; set runtime "
                        f"{model.runtime}'s own in {key}.env (vLLM's CPU backend: VLLM_CPU_OMP_THREADS_BIND)")
    elif model.threads is not None and sets_threads(model.args, model.env):
        problems.append(f"{key}.threads: set here and as a thread flag in args (or LLAMA_ARG_THREADS in env); keep one")
    return problems


def _runtime_problems(name: str, model: ModelConfig) -> list[str]:
    """How the engine is reached: started from `command`, or attached at `upstream`."""
    key = f"models.{name}"
    problems = []
    if model.command is None and model.upstream is None:
        problems.append(f"{key}.command: required key is missing (the engine's program); or set {key}.upstream "
                        f"to attach to a server that runs already")
    if model.command is not None and model.upstream is not None:
        problems.append(f"{key}.upstream: give command (steward runs the server) or upstream (someone else "
                        f"does), not both")
    if model.upstream is not None and model.port is not None:
        problems.append(f"{key}.port: an attached server's port is the one in {key}.upstream")
    if model.runtime == "llama-server" and model.upstream is not None:
        problems.append(f"{key}.upstream: to attach to a llama-server someone else runs, use runtime: openai")
    if model.runtime != "llama-server":
        if model.model is not None:
            problems.append(f"{key}.model: runtime {model.runtime} takes no GGUF path; name the model in "
                            f"its command")
        placeholder = any(PORT_PLACEHOLDER in part for part in [*(model.command or []), *model.args])
        if model.command is not None and model.port is None and not placeholder:
            problems.append(f"{key}.command: must hold {PORT_PLACEHOLDER} where the server takes its port "
                            f"(or set {key}.port to the port it listens on)")
    if model.served_name is not None and model.runtime != "openai":
        problems.append(f"{key}.served_name: only for runtime openai (llama-server answers any name)")
    if model.keep_cache is not None and (model.runtime != "llama-server" or model.command is None):
        problems.append(f"{key}.keep_cache: only a llama-server that steward starts saves its slots' caches")
    if model.keep_cache is not None and _has_flag(model.args, "--slot-save-path"):
        problems.append(f"{key}.args: --slot-save-path is steward's with keep_cache (kv_cache.dir); drop it")
    if model.sleep is not None and model.runtime != "openai":
        problems.append(f"{key}.sleep: only runtime openai engines can sleep (vLLM's /sleep and /wake_up)")
    if not model.health.startswith("/"):
        problems.append(f"{key}.health: must be a path like /health, got {show(model.health)}")
    elif model.health != DEFAULT_HEALTH and (why := _url_problem(f"http://127.0.0.1{model.health}")) is not None:
        problems.append(f"{key}.health: must be a path like /health ({why}), got {show(model.health)}")
    if model.served_name is not None and (why := _invisible_problem(model.served_name)) is not None:
        problems.append(f"{key}.served_name: {why}")
    if model.idle_unload is not None and model.resident:
        problems.append(f"{key}.idle_unload: an always-on engine is never unloaded; drop idle_unload, or set "
                        f"always_on: false")
    if model.serves is not None and not model.serves:
        problems.append(f"{key}.serves: name the APIs it serves, like [chat, responses, messages], or leave it out")
    if model.voices is not None and "speech" not in (model.serves or []):
        problems.append(f"{key}.voices: only a speech model has voices; add serves: [speech], or drop voices")
    elif model.voices is not None and not model.voices:
        problems.append(f"{key}.voices: name its voices, like [af_heart, alloy], or leave it out (any voice)")
    for i, voice in enumerate(model.voices or []):
        if not voice or (why := _invisible_problem(voice)) is not None:
            problems.append(f"{key}.voices[{i}]: {why or 'empty'}")
    if model.always_on is not None and model.pinned and not model.always_on:
        problems.append(f"{key}.always_on: false contradicts pinned: true; keep always_on")
    return problems


def _alias_problem(alias: str) -> str | None:
    if not alias:
        return "an alias must not be empty"
    if "@" in alias:
        return f"{show(alias)} holds '@', which separates a class suffix (model@batch)"
    return _invisible_problem(alias)


def _invisible_problem(name: str) -> str | None:
    """A name clients send and events and terminals show: a control character, a line break or an
    invisible one (a right-to-left override, a zero-width space) is a typo or a trick."""
    hidden = next((char for char in name if not char.isprintable()), None)
    if hidden is None:
        return None
    return f"{show(name)} holds {hidden!r}, a control or invisible character; a name is visible text"


_PARALLEL_FLAGS = ("-np", "--parallel")


def _parallel_arg_problem(args: list[str]) -> str | None:
    """Steward counts an engine's slots from -np/--parallel in its args (adapters/llama_server.py)."""
    for i, arg in enumerate(args):
        flag, eq, inline = arg.partition("=")
        if flag not in _PARALLEL_FLAGS:
            continue
        value = inline if eq else (args[i + 1] if i + 1 < len(args) else None)
        if value is None or not re.fullmatch(r"-?[0-9]{1,9}", value):
            return f"{flag} must be followed by an integer, got {'nothing' if value is None else show(value)}"
        if int(value) < -1:
            return f"{flag} must be followed by a slot count or -1 (auto), got {show(value)}"
    return None


def _backoff_problems(config: Config) -> list[str]:
    """A backoff doubles from its first delay up to its cap; a cap below the start is a typo."""
    pairs: list[tuple[str, Any, str, str]] = [("engines", config.engines, "restart_backoff", "restart_backoff_max")]
    pairs += [(name, service, "retry_initial", "retry_max") for name, service in _services(config)]
    return [f"{section}.{cap}: {format_duration(getattr(values, cap))} is less than "
            f"{section}.{first} ({format_duration(getattr(values, first))})"
            for section, values, first, cap in pairs if getattr(values, cap) < getattr(values, first)]


def _services(config: Config) -> list[tuple[str, OllamaConfig | ComfyConfig]]:
    return [(name, service) for name, service in (("ollama", config.ollama), ("comfyui", config.comfyui))
            if service is not None]


def _port_problems(config: Config) -> list[str]:
    """Two of steward's listeners, its engines' fixed ports or its upstreams on one port of one host."""
    services = _services(config)
    texts = [("listen", config.listen)] + [(f"{name}.listen", service.listen) for name, service in services]
    texts += [(f"{name}.upstream", service.upstream) for name, service in services]
    fixed = [(key, address) for key, address in texts if address is not None]
    fixed += [(f"models.{name}.port", Address(config.engines.host, model.port))
              for name, model in config.models.items() if model.port is not None]
    fixed = [(key, address) for key, address in fixed if address.port != 0]  # 0: the system picks a free one
    problems = []
    for i, (key, address) in enumerate(fixed):
        taken = [earlier for earlier, other in fixed[:i]
                 if other.port == address.port and _same_interface(other.host, address.host)]
        if taken:
            problems.append(f"{key}: port {address.port} on {address.host} is already used by {taken[0]}; "
                            f"give each its own port")
    return problems


def _same_interface(a: str, b: str) -> bool:
    """Whether two binds of one port on these hosts collide (0.0.0.0 or :: takes every address)."""
    mine, theirs = _bound_addresses(a), _bound_addresses(b)
    return "*" in mine | theirs or bool(mine & theirs)


def _bound_addresses(host: str) -> set[str]:
    host = host.lower().removesuffix(".")
    if host == "localhost":
        return {"127.0.0.1", "::1"}
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return {host}
    return {"*"} if address.is_unspecified else {str(address)}


def _has_flag(args: list[str], *flags: str) -> bool:
    return any(arg in flags or arg.split("=", 1)[0] in flags for arg in args)
