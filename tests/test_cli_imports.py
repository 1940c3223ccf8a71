"""`steward --version` and `steward check` start light: what they import, not how long it takes.

The gateway (quart, hypercorn), numpy and gguf (read with a GGUF header) and the tools are
imported when the command that needs them runs. Wall time is not asserted (CI machines
are busy); ``python -X importtime`` names every module imported.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import ROOT

HEAVY = ("numpy", "gguf", "quart", "quart_trio", "hypercorn", "fakes")
# What only a command that makes a request needs (check plans the engines from their specs, apart from
# the driver, an httpx client; and reads the nodes from theirs, apart from the directory's client).
CLIENT = ("httpx", "rich")
TOOLS_COMMAND_LINE = {"supervisor.tools", "supervisor.tools.commands"}  # the tools' flags, nothing of the tools


def imported(*args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run ``python -X importtime -m supervisor.cli ARGS``: its result and the modules it imported."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "supervisor.cli", *args],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    modules = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
               if line.startswith("import time:") and line.count("|") == 2}
    modules.discard("imported package")  # the header line
    return result, modules


def too_heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules
                  if m.split(".")[0] in HEAVY or (m.startswith("supervisor.tools") and m not in TOOLS_COMMAND_LINE))


def test_version_imports_no_gateway_numpy_or_tools() -> None:
    result, modules = imported("--version")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("steward ")
    assert "supervisor.cli" in modules or "supervisor.config" in modules  # the listing was read
    assert too_heavy(modules) == []
    assert sorted(m for m in modules if m.split(".")[0] in CLIENT) == []  # httpx imports rich, if present


def test_check_imports_no_gateway_numpy_or_tools(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "gpu": {"probe": "none", "budget": "16GiB"},
        "models": {"chat": {"command": "llama-server", "model": "/models/chat.gguf", "memory": "8GiB"}}}))
    result, modules = imported("check", str(config))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "model chat" in result.stdout
    assert "supervisor.config_policy" in modules
    assert too_heavy(modules) == []
    assert sorted(m for m in modules if m.split(".")[0] in CLIENT) == []
    assert {"supervisor.serving", "supervisor.tree", "supervisor.engines.driver"} & modules == set()  # `run` only
