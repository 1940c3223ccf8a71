"""The real coding agents, Claude Code and Codex, each run one non-interactive task with one tool
call through steward, with the settings the README gives for them.

Steward stands in front of the fake llama-server, whose model calls the tool the user asks for
and then answers with the tool's result (fakes/tool_reply.py): the agent's own tool runs in its
own working folder, on a file holding a secret the fake can only quote if the tool's result came
back through steward. The CLIs are the npm packages pinned in fakes/agent_clis.py
(`sh deploy/install-agent-clis.sh`); no request may leave the machine (their telemetry and
update checks are off; nothing but loopback is reachable anyway).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest

from fakes.agent_clis import CLAUDE_CODE, CODEX, AgentCli, agent_cli
from supervisor.auth.keys import add_key
from tests.conftest import RunningSteward, StewardFactory, fake_model

pytestmark = pytest.mark.slow

MODEL = "agent"  # steward's name for the model both agents use
# The model's slot context (one slot). An agent's first prompt is 10-20k tokens; Claude Code compacts
# a conversation at no less than 100k tokens, so a model it uses needs a context above that.
CONTEXT = 131072
MAX_OUTPUT_TOKENS = 4096
ALIASES = ("claude-opus-4-1",)  # a name Claude Code remaps to its current Opus unless told not to
CLI_TIMEOUT_S = 120


def require_cli(cli: AgentCli) -> Path:
    """The CLI, or the test fails saying how to install it (skips only with STEWARD_SKIP_AGENT_CLIS=1)."""
    try:
        return agent_cli(cli)
    except FileNotFoundError as exc:
        if os.environ.get("STEWARD_SKIP_AGENT_CLIS") == "1":
            pytest.skip(f"STEWARD_SKIP_AGENT_CLIS=1: {exc}")
        pytest.fail(str(exc), pytrace=False)


@attrs.frozen
class CliRun:
    returncode: int
    stdout: str
    stderr: str

    def json_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stdout.splitlines() if line.startswith("{")]


def run_cli(args: list[str], *, env: dict[str, str], cwd: Path) -> CliRun:
    """*args* in their own process group (what they start goes with them), stdin closed."""
    process = subprocess.Popen(args, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=CLI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(f"{args[0]} ran past {CLI_TIMEOUT_S} s: {stdout[-3000:]} {stderr[-3000:]}") from None
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # anything it left in its group
        except ProcessLookupError:
            pass
    return CliRun(process.returncode, stdout, stderr)


def base_env(home: Path) -> dict[str, str]:
    """A bare environment: the agents' state goes into *home*, none of the caller's settings leak in."""
    home.mkdir()
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb"}


@pytest.fixture
def claude_code() -> Path:
    return require_cli(CLAUDE_CODE)


@pytest.fixture
def codex() -> Path:
    return require_cli(CODEX)


@attrs.frozen
class Door:
    """Steward in front of the fake model, with a key file holding one key for the agents."""

    steward: RunningSteward
    key: str


@pytest.fixture
def door(start_steward: StewardFactory, tmp_path: Path) -> Door:
    keys_file = tmp_path / "keys.json"
    key = add_key(keys_file, "agents", known_models=[MODEL, *ALIASES])
    model = fake_model("1GiB", parallel=1, tps=0, extra=["-c", str(CONTEXT)], aliases=list(ALIASES))
    return Door(start_steward({MODEL: model}, auth={"keys_file": str(keys_file)}), key)


@pytest.fixture
def workdir(tmp_path: Path) -> tuple[Path, str]:
    """The agent's working folder, holding notes.txt with a secret line."""
    secret = f"the secret is {secrets.token_hex(8)}"
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text(f"{secret}\nsecond line\n")
    return work, secret


def agent_requests(steward: RunningSteward, route: str, count: int) -> list[dict[str, Any]]:
    """The `request` events of *route*, once there are *count* (steward logs one as its answer ends,
    which may be after the agent read that answer and exited)."""
    deadline = time.monotonic() + 10
    while len(found := [e for e in steward.events("request") if e["route"] == route]) < count:
        assert time.monotonic() < deadline, steward.events("request")
        time.sleep(0.02)
    return found


# --------------------------------------------------------------------------- Claude Code


def claude_code_env(door: Door, home: Path) -> dict[str, str]:
    """The README's settings for Claude Code."""
    return {**base_env(home),
            "ANTHROPIC_BASE_URL": door.steward.url,
            "ANTHROPIC_API_KEY": door.key,  # sent as x-api-key
            "ANTHROPIC_MODEL": MODEL,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": MODEL,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": MODEL,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL,
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(MAX_OUTPUT_TOKENS),
            "CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(CONTEXT),
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1"}


def claude_code_reads(claude_code: Path, notes: Path, env: dict[str, str], *args: str) -> CliRun:
    """Claude Code in print mode, asked to read *notes* with its Read tool (allowed without asking)."""
    prompt = f'Use the Read tool with {{"file_path": "{notes}"}}'
    return run_cli([str(claude_code), "-p", prompt, "--output-format", "stream-json", "--verbose",
                    "--allowedTools", "Read", *args], env=env, cwd=notes.parent)


def test_claude_code_reads_a_file_through_steward(claude_code: Path, door: Door, workdir: tuple[Path, str],
                                                  tmp_path: Path) -> None:
    steward, (work, secret) = door.steward, workdir
    debug_log = tmp_path / "claude-debug.log"
    run = claude_code_reads(claude_code, work / "notes.txt", claude_code_env(door, tmp_path / "home"),
                            "--debug-file", str(debug_log))
    lines = run.json_lines()
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    contents = [block for line in lines if line.get("type") in ("assistant", "user")
                for block in line["message"]["content"] if isinstance(block, dict)]
    calls = [block for block in contents if block["type"] == "tool_use"]
    assert [(call["name"], call["input"]) for call in calls] == [("Read", {"file_path": str(work / "notes.txt")})], \
        contents
    results = [block for block in contents if block["type"] == "tool_result"]
    assert len(results) == 1 and results[0]["tool_use_id"] == calls[0]["id"], results
    assert secret in json.dumps(results[0]["content"]), results  # Claude Code read the file
    final = lines[-1]
    assert final["type"] == "result" and not final["is_error"], final
    assert final["result"] == f"Read returned: 1\t{secret}", final  # the fake saw it (Read numbers lines)
    # it compacts before the model's context is full: its window less the room for an answer
    assert f"effectiveWindow={CONTEXT - MAX_OUTPUT_TOKENS}" in debug_log.read_text()

    requests = agent_requests(steward, "/v1/messages", 2)  # the call, then the answer after its result
    assert {(r["model"], r["status"], r["key"]) for r in requests} == {(MODEL, 200, "agents")}, requests
    assert all(r["prompt_tokens"] > 5000 for r in requests), requests  # its system prompt and tools
    slots = httpx.get(steward.engine_endpoint(MODEL) + "/slots", timeout=5).json()
    assert slots[0]["params"]["n_predict"] == MAX_OUTPUT_TOKENS, slots  # its max_tokens


@pytest.mark.parametrize("remap_off", [False, True], ids=["remapped", "kept"])
def test_claude_code_sends_a_legacy_opus_name_only_with_its_remap_off(claude_code: Path, door: Door,
                                                                      workdir: tuple[Path, str], tmp_path: Path,
                                                                      remap_off: bool) -> None:
    env = {**claude_code_env(door, tmp_path / "home"), "ANTHROPIC_MODEL": ALIASES[0]}
    for tier in ("OPUS", "SONNET", "HAIKU"):
        del env[f"ANTHROPIC_DEFAULT_{tier}_MODEL"]  # the remap's target is then Claude Code's own Opus
    if remap_off:
        env["CLAUDE_CODE_DISABLE_LEGACY_MODEL_REMAP"] = "1"
    run = claude_code_reads(claude_code, workdir[0] / "notes.txt", env)
    result = run.json_lines()[-1]
    if remap_off:  # the alias reached steward
        assert run.returncode == 0 and not result["is_error"], (run.stdout[-3000:], run.stderr[-3000:])
        requests = agent_requests(door.steward, "/v1/messages", 2)
        assert {(r["model"], r["status"]) for r in requests} == {(MODEL, 200)}, requests
    else:  # it asked steward for its current Opus, which steward does not know
        assert result["is_error"] and result["api_error_status"] == 404, result
        assert "(claude-opus-5-5)" in result["result"], result
        requests = agent_requests(door.steward, "/v1/messages", 1)
        assert {(r["status"], r["error"]) for r in requests} == {(404, "model_not_found")}, requests


# --------------------------------------------------------------------------- Codex


def codex_config(steward: RunningSteward) -> str:
    """The README's config.toml for Codex: steward as a custom provider on the Responses API."""
    return f"""\
model = "{MODEL}"
model_provider = "steward"
model_context_window = {CONTEXT}
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[analytics]
enabled = false

[model_providers.steward]
name = "steward"
base_url = "{steward.base_url}"
wire_api = "responses"
env_key = "STEWARD_API_KEY"
"""


def test_codex_runs_a_command_through_steward(codex: Path, door: Door, workdir: tuple[Path, str],
                                              tmp_path: Path) -> None:
    steward, (work, secret) = door.steward, workdir
    codex_home = tmp_path / "codex-home"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(codex_config(steward))
    env = {**base_env(tmp_path / "home"), "CODEX_HOME": str(codex_home), "STEWARD_API_KEY": door.key}
    prompt = 'Use the exec_command tool with {"cmd": "cat notes.txt"}'
    run = run_cli([str(codex), "exec", "--json", "--skip-git-repo-check", prompt],
                  env=env, cwd=work)
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    items = [line["item"] for line in run.json_lines() if line["type"] == "item.completed"]
    commands = [item for item in items if item["type"] == "command_execution"]
    assert len(commands) == 1 and commands[0]["command"].endswith("'cat notes.txt'"), items
    assert commands[0]["exit_code"] == 0 and secret in commands[0]["aggregated_output"], commands  # it ran
    answers = [item["text"] for item in items if item["type"] == "agent_message"]
    # The fake quotes the first line of the call's output as Codex sent it back: its "Chunk ID: ..." header.
    assert len(answers) == 1 and re.fullmatch(r"exec_command returned: Chunk ID: \w+", answers[0]), items

    requests = agent_requests(steward, "/v1/responses", 2)  # the call, then the answer after its output
    assert {(r["model"], r["status"], r["key"]) for r in requests} == {(MODEL, 200, "agents")}, requests
    assert requests[1]["prompt_tokens"] > requests[0]["prompt_tokens"] > 5000, requests
