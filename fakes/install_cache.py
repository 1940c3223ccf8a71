"""What the test install put in the cache (deploy/install-*.sh), found or said missing.

Each install writes its ``.complete`` mark last, so a half-finished one is not taken; an
environment variable may name an executable to use instead of the cached one.
"""
from __future__ import annotations

import os
from pathlib import Path


def installed(path: Path, done_mark: Path, *, override_var: str, what: str, hint: str) -> Path:
    """*path* once its install is complete (*done_mark* exists), or the executable *override_var*
    names; else FileNotFoundError naming *what* is missing, where it was looked for, and *hint*."""
    override = os.environ.get(override_var)
    found = Path(override) if override else path
    if found.is_file() and (override or done_mark.exists()):
        return found
    source = override_var if override else "the install cache"
    raise FileNotFoundError(f"no {what} at {found} (from {source}); {hint}")
