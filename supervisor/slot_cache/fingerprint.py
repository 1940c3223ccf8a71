"""What a saved slot depends on: a restore into an engine where any of it changed is refused.

A slot's file is llama.cpp's raw KV state: read into another model, another context size per
slot, another slot count, other cache types or another build, it is garbage at best. The
running server says most of it (``GET /props``: its model file, its context per slot, its slot
count, its build); the cache types are only in its arguments, and the model file is known by its
path, size and modification time (a file replaced in place changes at least one of them).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

CACHE_TYPE_FLAGS = {"k": ("-ctk", "--cache-type-k"), "v": ("-ctv", "--cache-type-v")}
CACHE_TYPE_ENV = {"k": "LLAMA_ARG_CACHE_TYPE_K", "v": "LLAMA_ARG_CACHE_TYPE_V"}
DEFAULT_CACHE_TYPE = "f16"  # llama-server's, when neither flag nor variable says


def cache_types(args: Sequence[str], env: Mapping[str, str]) -> tuple[str, str]:
    """The K and V cache types the engine runs with (a flag in its args wins over its environment)."""
    return _cache_type("k", args, env), _cache_type("v", args, env)


def _cache_type(which: str, args: Sequence[str], env: Mapping[str, str]) -> str:
    value = env.get(CACHE_TYPE_ENV[which], DEFAULT_CACHE_TYPE)
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if name in CACHE_TYPE_FLAGS[which]:
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else value)
    return value


def fingerprint(props: Mapping[str, Any], types: tuple[str, str]) -> dict[str, Any]:
    """The fingerprint of a running llama-server, from its /props and its cache types."""
    settings = props.get("default_generation_settings")
    path = props.get("model_path")
    size = mtime = None
    if isinstance(path, str):
        try:
            stat = os.stat(path)
            size, mtime = stat.st_size, stat.st_mtime_ns
        except OSError:
            pass
    return {"model_path": path, "model_size": size, "model_mtime_ns": mtime,
            "n_ctx": settings.get("n_ctx") if isinstance(settings, Mapping) else None,
            "total_slots": props.get("total_slots"), "build_info": props.get("build_info"),
            "cache_type_k": types[0], "cache_type_v": types[1]}


def changed(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """The keys whose values differ (a key either side lacks counts as changed)."""
    return sorted(key for key in set(saved) | set(now) if saved.get(key) != now.get(key) or key not in saved)
