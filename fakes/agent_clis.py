"""Where the real coding-agent CLIs for the tests live: Claude Code and Codex, from npm.

`deploy/install-agent-clis.sh` installs `@anthropic-ai/claude-code` at CLAUDE_CODE_VERSION and
`@openai/codex` at CODEX_VERSION (the script reads both from this file, so this is the one place
to change them) with ``npm install --prefix`` into

    ${STEWARD_CACHE:-${XDG_CACHE_HOME:-~/.cache}/gpu-steward}/agent-clis-<claude>-<codex>/

Tests call agent_cli(); STEWARD_CLAUDE_CODE and STEWARD_CODEX, when set, name an executable to
use instead of the cached one.
"""
from __future__ import annotations

from pathlib import Path

import attrs

from fakes.install_cache import installed
from fakes.llama_binary import cache_root

CLAUDE_CODE_VERSION = "2.1.332"
CODEX_VERSION = "0.171.0"

INSTALL_HINT = "run `sh deploy/install-agent-clis.sh` (or `sh deploy/install.sh test`) to install it"


@attrs.frozen
class AgentCli:
    """A CLI the tests run: its executable in ``node_modules/.bin``, its npm package, its override."""

    executable: str
    package: str  # name@version, as npm installs it
    override_var: str  # names an executable to run instead of the cached one


CLAUDE_CODE = AgentCli("claude", f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}", "STEWARD_CLAUDE_CODE")
CODEX = AgentCli("codex", f"@openai/codex@{CODEX_VERSION}", "STEWARD_CODEX")


def install_dir() -> Path:
    return cache_root() / f"agent-clis-{CLAUDE_CODE_VERSION}-{CODEX_VERSION}"


def agent_cli(cli: AgentCli) -> Path:
    """The CLI's executable, or FileNotFoundError saying what is missing and how to install it."""
    return installed(install_dir() / "node_modules" / ".bin" / cli.executable, install_dir() / ".complete",
                     override_var=cli.override_var, what=cli.package, hint=INSTALL_HINT)
