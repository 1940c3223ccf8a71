"""Where the real ComfyUI for the tests lives.

ComfyUI is not on PyPI as a server: its source comes from a tarball (or an unpacked folder)
named by STEWARD_COMFYUI_SRC, which `.ci/run` points at `../shared/vendor/`. A user's clone has
no such file, so without the variable the tests that need ComfyUI skip and say so.
`deploy/install-comfyui.sh` unpacks the source and makes its venv (it reads the versions from
this file, so this is the one place to change them) in

    ${STEWARD_CACHE:-${XDG_CACHE_HOME:-~/.cache}/gpu-steward}/comfyui-<version>/
        ComfyUI/        the source, never changed by the tests (they start from a copy)
        venv/           torch (the CPU build), ComfyUI's requirements, the torchvision fix
        .complete       written last: a half-done install is done again

Tests call comfyui_install(); it raises MissingSource or FileNotFoundError, saying which is missing.
"""
from __future__ import annotations

import os
from pathlib import Path

import attrs

from fakes.llama_binary import cache_root

COMFYUI_VERSION = "0.3.64"
TORCH_VERSION = "2.13.0"  # the CPU build on this machine's disk; a looser pin takes a CUDA build of GBs
TORCHVISION_VERSION = "0.28.0"  # its Python parts, installed without dependencies (real_runtimes.md)

SOURCE_ENV = "STEWARD_COMFYUI_SRC"
INSTALL_HINT = (f"run `{SOURCE_ENV}=PATH sh deploy/install-comfyui.sh` (or `sh deploy/install.sh test` with "
                f"{SOURCE_ENV} set) to install it")


class MissingSource(LookupError):
    """STEWARD_COMFYUI_SRC is not set: there is nothing to install ComfyUI from."""


@attrs.frozen
class ComfyInstall:
    folder: Path  # the unpacked source: main.py, nodes.py, custom_nodes/
    python: Path  # the venv's python, which runs main.py

    @property
    def main(self) -> Path:
        return self.folder / "main.py"


def cached_comfyui() -> Path:
    return cache_root() / f"comfyui-{COMFYUI_VERSION}"


def comfyui_source() -> str:
    """The tarball or folder STEWARD_COMFYUI_SRC names, or MissingSource saying what is missing."""
    source = os.environ.get(SOURCE_ENV)
    if not source:
        raise MissingSource(f"{SOURCE_ENV} is not set: it names the ComfyUI {COMFYUI_VERSION} source (a .tar.gz "
                            f"or its unpacked folder; ComfyUI is not on PyPI), which `.ci/run` sets to "
                            f"../shared/vendor/comfyui-{COMFYUI_VERSION}-*-src.tar.gz")
    return source


def comfyui_install() -> ComfyInstall:
    """The installed ComfyUI; MissingSource without STEWARD_COMFYUI_SRC, FileNotFoundError saying
    how to install it when the cache lacks a complete install."""
    comfyui_source()
    root = cached_comfyui()
    install = ComfyInstall(root / "ComfyUI", root / "venv" / "bin" / "python")
    if not ((root / ".complete").exists() and install.main.is_file() and install.python.is_file()):
        raise FileNotFoundError(f"no complete ComfyUI {COMFYUI_VERSION} install at {root}; {INSTALL_HINT}")
    return install
