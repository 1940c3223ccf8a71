"""Where the real llama.cpp `llama-server` for the tests lives.

`deploy/build-llama-server.sh` builds it from the llama.cpp source vendored in the
`llama-cpp-python` sdist at LLAMA_CPP_PYTHON_VERSION (the script reads the version from
this file, so this is the one place to change it) into

    ${STEWARD_CACHE:-${XDG_CACHE_HOME:-~/.cache}/gpu-steward}/llama-server-<version>/bin/llama-server

Tests call llama_server_path(); STEWARD_LLAMA_SERVER, when set, overrides the cache path.
"""
from __future__ import annotations

import os
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"

BUILD_HINT = "run `sh deploy/build-llama-server.sh` (or `sh deploy/install.sh test`) to build it"


def cache_root() -> Path:
    if os.environ.get("STEWARD_CACHE"):
        return Path(os.environ["STEWARD_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "gpu-steward"


def cached_llama_server() -> Path:
    return cache_root() / f"llama-server-{LLAMA_CPP_PYTHON_VERSION}" / "bin" / "llama-server"


def llama_server_path() -> Path:
    """The llama-server binary to test against, or FileNotFoundError saying how to build it."""
    override = os.environ.get("STEWARD_LLAMA_SERVER")
    path = Path(override) if override else cached_llama_server()
    if not (path.is_file() and os.access(path, os.X_OK)):
        source = "STEWARD_LLAMA_SERVER" if override else "the build cache"
        raise FileNotFoundError(
            f"no executable llama-server at {path} (from {source}); {BUILD_HINT}")
    return path
