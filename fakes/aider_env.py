"""Where the real aider (PyPI `aider-chat`) for the tests lives.

`deploy/install-aider.sh` installs `aider-chat` at AIDER_VERSION (the script reads it from this
file, so this is the one place to change it) into its own venv at

    ${STEWARD_CACHE:-${XDG_CACHE_HOME:-~/.cache}/gpu-steward}/aider-chat-<version>/

Tests call aider_path(); STEWARD_AIDER, when set, overrides the cache path (an `aider` executable).
"""
from __future__ import annotations

from pathlib import Path

from fakes.install_cache import installed
from fakes.llama_binary import cache_root

AIDER_VERSION = "0.86.2"


def aider_path() -> Path:
    """The `aider` executable, or FileNotFoundError saying what is missing and how to install it."""
    venv = cache_root() / f"aider-chat-{AIDER_VERSION}"
    return installed(venv / "bin" / "aider", venv / ".complete", override_var="STEWARD_AIDER",
                     what=f"aider-chat {AIDER_VERSION}",
                     hint="run `sh deploy/install-aider.sh` (or `sh deploy/install.sh test`) to install it")
