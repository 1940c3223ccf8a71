"""aider (PyPI ``aider-chat``, the real CLI, installed by deploy/install-aider.sh) does one task
through steward: it edits a file with what the model answered, and steward's books hold its request.

aider's "tool" is its edit format: the model answers ``whole`` edits (a file's name on a line,
then the file's new text in a fenced block) and aider writes them. The fake llama-server's
model does as it is told (``fakes.tool_reply.dictated_reply``: ``Reply exactly: "<JSON string>"``),
so the task dictates the edit, and the test sees aider apply it. aider is told the model's
context by a model metadata file (as a user would: without one it warns of an unknown model) and
never reaches the internet: a seeded price cache in its HOME, litellm's local price map.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from fakes.aider_env import aider_path
from fakes.chat_template import Chat, ChatMessage
from fakes.chat_tokens import pieces
from fakes.tool_reply import dictated_reply
from supervisor.auth.keys import add_key
from tests.conftest import StewardFactory, fake_model

MODEL = "coder"
SLOT_CTX = 8192
NEW_TEXT = "Hello from steward\nsecond line\n"
DEADLINE_S = 10.0


def test_a_dictated_reply_is_the_json_string_after_the_words() -> None:
    def said(*messages: ChatMessage) -> str | None:
        return dictated_reply(Chat(messages))

    edit = 'a.txt\n```\nnew "text"\n```\n'
    assert said(ChatMessage("user", f"Change a.txt. Reply exactly: {json.dumps(edit)} please")) == edit
    reminder = ChatMessage("system", "Reply exactly: \"not the user's\"")
    assert said(ChatMessage("user", 'Reply exactly: "Done."'), reminder) == "Done."  # the latest user message
    assert said(ChatMessage("user", 'Reply exactly: "old"'), ChatMessage("user", "go on")) is None
    assert said(ChatMessage("user", "Reply exactly: Done.")) is None  # no JSON string: the model talks as ever
    assert said(ChatMessage("user", 'Reply exactly: ["a"]')) is None


def aider_command(base_url: str, workdir: Path, task: str, stream: bool) -> list[str]:
    metadata = workdir.parent / "model-metadata.json"
    metadata.write_text(json.dumps({f"openai/{MODEL}": {
        "max_input_tokens": SLOT_CTX, "max_output_tokens": SLOT_CTX, "input_cost_per_token": 0,
        "output_cost_per_token": 0, "litellm_provider": "openai", "mode": "chat"}}))
    return [str(aider_path()), "--model", f"openai/{MODEL}", "--openai-api-base", base_url,
            "--model-metadata-file", str(metadata), "--edit-format", "whole", "--message", task,
            "--yes-always", "--no-git", "--no-auto-commits", "--no-show-model-warnings", "--no-check-update",
            "--no-analytics", "--no-show-release-notes", "--no-pretty", "--no-fancy-input", "--map-tokens", "0",
            "--stream" if stream else "--no-stream", "notes.txt"]


def aider_env(home: Path, key: str) -> dict[str, str]:
    """This environment without any OpenAI/aider setting of the caller's, HOME a fresh folder."""
    caches = home / ".aider" / "caches"
    caches.mkdir(parents=True)
    (caches / "model_prices_and_context_window.json").write_text("{}")  # aider fetches it from GitHub otherwise
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("OPENAI_", "AIDER_", "ANTHROPIC_", "LITELLM_"))}
    return {**env, "HOME": str(home), "OPENAI_API_KEY": key, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def usage_row(db: Path, request_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if db.exists():
            with sqlite3.connect(db) as connection:
                connection.row_factory = sqlite3.Row
                row = connection.execute("SELECT * FROM requests WHERE request_id = ?", (request_id,)).fetchone()
            if row is not None:
                return dict(row)
        time.sleep(0.05)
    raise AssertionError(f"no usage row for {request_id} within {DEADLINE_S}s")


@pytest.mark.slow
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_aider_edits_a_file_through_steward(start_steward: StewardFactory, tmp_path: Path, stream: bool) -> None:
    try:
        aider_path()
    except FileNotFoundError as missing:
        pytest.fail(str(missing), pytrace=False)  # CI installs it: missing is a failure, not a skip
    keys_file, usage_db = tmp_path / "keys.json", tmp_path / "usage.db"
    key = add_key(keys_file, "aider", known_models=[MODEL])
    steward = start_steward({MODEL: fake_model("1GiB", parallel=1, tps=0, extra=["-c", str(SLOT_CTX)])},
                            gpu={"probe": "none", "budget": "4GiB"}, auth={"keys_file": str(keys_file)},
                            usage={"db": str(usage_db)})
    workdir = tmp_path / "project"
    workdir.mkdir()
    notes = workdir / "notes.txt"
    notes.write_text("Hello\n")
    edit = f"notes.txt\n```\n{NEW_TEXT}```\n"
    task = f"Change notes.txt as I say. Reply exactly: {json.dumps(edit)}"

    ran = subprocess.run(aider_command(steward.base_url, workdir, task, stream), cwd=workdir,
                         env=aider_env(tmp_path / "home", key), stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "Applied edit to notes.txt" in ran.stdout, ran.stdout
    assert notes.read_text() == NEW_TEXT

    (request,) = [event for event in steward.events("request") if event["route"] == "/v1/chat/completions"]
    assert (request["model"], request["status"], request["key"]) == (MODEL, 200, "aider")
    assert request["completion_tokens"] == len(pieces(edit)) + 1  # the edit and the end-of-generation token
    told = re.search(r"Tokens: (\d+) sent, (\d+) received", ran.stdout)
    assert told is not None, ran.stdout
    if not stream:  # streamed, aider asks for no usage and counts for itself
        assert told.groups() == (str(request["prompt_tokens"]), str(request["completion_tokens"]))
    row = usage_row(usage_db, request["request_id"])
    assert (row["route"], row["model"], row["status"], row["key"]) == ("/v1/chat/completions", MODEL, 200, "aider")
    assert (row["prompt_tokens"], row["completion_tokens"]) == (request["prompt_tokens"], request["completion_tokens"])
    assert request["prompt_tokens"] > 200  # aider's system prompt, its example edit and the file
