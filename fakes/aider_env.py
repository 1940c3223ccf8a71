"""Where the real aider (PyPI `aider-chat`) for the tests lives.

`deploy/install-aider.sh` installs `aider-chat` at AIDER_VERSION (the script reads it from this
file, so this is the one place to change it) into its own venv at

    ${STEWARD_CACHE:-${XDG_CACHE_HOME:-~/.cache}/gpu-steward}/aider-chat-<version>/

Tests call aider_path(); STEWARD_AIDER, when set, overrides the cache path (an `aider` executable).
"""
from __future__ import annotations

import os
from pathlib import Path

from fakes.llama_binary import cache_root

AIDER_VERSION = "0.86.2"


def aider_path() -> Path:
    """The `aider` executable, or FileNotFoundError saying what is missing and how to install it."""
    hint = "run `sh deploy/install-aider.sh` (or `sh deploy/install.sh test`) to install it"
    override = os.environ.get("STEWARD_AIDER")
    if override:
        if Path(override).is_file():
            return Path(override)
        raise FileNotFoundError(f"STEWARD_AIDER={override} is no file; unset it to use the install cache, "
                                f"or {hint}")
    path = cache_root() / f"aider-chat-{AIDER_VERSION}" / "bin" / "aider"
    if path.is_file() and (path.parents[1] / ".complete").exists():
        return path
    raise FileNotFoundError(f"no aider-chat {AIDER_VERSION} in the install cache ({path}); {hint}")
