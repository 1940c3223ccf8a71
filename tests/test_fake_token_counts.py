"""The fake llama-server counts a prompt as the real one does (issue 29): within 15 %.

A real engine renders a chat with its template (roles, the system prompt, every tool's JSON
schema) before it tokenizes; coding agents' requests are thousands of tokens, most of them
tools. ``tests/data/llama_prompt_counts.json`` holds requests shaped like Claude Code's, Codex's
and aider's (a plain chat, a long system prompt, eight tools with code and tool results, an
Anthropic Messages request, a Responses request, a JSON config with a log) with what the REAL
llama-server counted for each: the fast tests hold the fake to them, the slow one asks the real
server (SmolLM2-135M-Instruct, the fake's template file) again, and with
``STEWARD_RECORD_PROMPT_COUNTS=1`` writes its counts back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from fakes.chat_template import TEMPLATE_PATH, Chat, ChatMessage, render
from fakes.chat_tokens import count_tokens, pieces
from fakes.llama_binary import llama_server_path
from fakes.llama_server.messages import messages_chat
from fakes.llama_server.parsing import chat_request
from fakes.llama_server.responses import responses_chat
from fakes.real_model import smollm2_gguf
from tests.bare_llama import open_bare_llama_server

DATA = Path(__file__).parent / "data" / "llama_prompt_counts.json"
RECORDED = json.loads(DATA.read_text())
CASES = RECORDED["cases"]
TOLERANCE = 0.15
CHATS: dict[str, Callable[[dict[str, Any]], Chat]] = {
    "chat": chat_request, "messages": messages_chat, "responses": responses_chat}
COUNTERS = {"chat": "/v1/chat/completions/input_tokens", "messages": "/v1/messages/count_tokens",
            "responses": "/v1/responses/input_tokens"}


def fake_count(case: dict[str, Any]) -> int:
    return CHATS[case["api"]](case["body"]).n_tokens


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_the_fake_counts_a_request_as_llama_server_does(case: dict[str, Any]) -> None:
    fake, real = fake_count(case), case["real_tokens"]
    assert abs(fake - real) <= TOLERANCE * real, f"fake {fake}, real {real}: {100 * (fake - real) / real:+.1f} %"


def test_the_recorded_requests_are_an_agent_s() -> None:
    """Thousands of tokens, most of them the tools' schemas (a word count saw a quarter of them)."""
    agent = next(case for case in CASES if case["name"] == "coding_agent_tools")
    without_tools = {key: value for key, value in agent["body"].items() if key != "tools"}
    assert agent["real_tokens"] > 4000 and fake_count(agent) - chat_request(without_tools).n_tokens > 2000
    words = sum(len(str(m["content"]).split()) for m in agent["body"]["messages"])
    assert words < agent["real_tokens"] / 2


def test_the_counter_cuts_text_as_a_bpe_pre_tokenizer_does() -> None:
    text = 'def read(path: str) -> str:\n    return open(path).read()  # 2026 {"a": [1, 2]}\n\n'
    assert "".join(pieces(text)) == text
    assert pieces("from 2026, see") == ["from", " 2", "0", "2", "6", ",", " see"]  # digits one by one
    # What SmolLM2's tokenizer makes of these (llama-server's /tokenize).
    assert count_tokens("<|im_start|>user\nhi<|im_end|>") == 5
    assert count_tokens("Hello world, this is a test of 12345 numbers.") == 16  # " 1" is two tokens
    assert count_tokens('{"type": "object", "properties": {"path": {"type": "string"}}}') == 20


def test_the_template_puts_tools_in_the_system_message_and_results_in_a_user_turn() -> None:
    tool = {"type": "function", "function": {"name": "ls", "description": "", "parameters": {"type": "object"}}}
    prompt = render([ChatMessage("user", "hi"), ChatMessage("tool", "a.txt", tool_call_id="1")], [tool])
    assert prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert '\n<tools>\n{"type": "function", "function": {"name": "ls", "description": "", ' in prompt
    assert prompt.endswith("<|im_start|>user\n<tool_response>\na.txt\n</tool_response><|im_end|>\n"
                           "<|im_start|>assistant\n")


# --------------------------------------------------------------------------- the real llama-server


def _real_server_or_skip() -> tuple[Path, Path]:
    try:
        return llama_server_path(), smollm2_gguf()
    except FileNotFoundError as exc:
        pytest.skip(f"no real llama-server to count with: {exc}")


@pytest.mark.slow
def test_the_real_llama_server_counts_as_recorded(tmp_path: Path) -> None:
    """The same requests to the real llama-server: it counts what the file says, renders chats as the
    fake does, and a generation's usage agrees with its counter."""
    binary, model = _real_server_or_skip()
    args = ["-c", "8192", "-np", "1", "--chat-template-file", str(TEMPLATE_PATH)]
    with open_bare_llama_server(binary, model, args, tmp_path / "llama.log") as base:
        counted = {case["name"]: httpx.post(base + COUNTERS[case["api"]], json=case["body"], timeout=60).json()[
            "input_tokens"] for case in CASES}
        for case in CASES:
            if case["api"] == "chat":
                rendered = httpx.post(base + "/apply-template", json=case["body"], timeout=60).json()["prompt"]
                assert chat_request(case["body"]).prompt == rendered, case["name"]
        plain = next(case for case in CASES if case["name"] == "plain_chat")
        answer = httpx.post(base + "/v1/chat/completions", json={**plain["body"], "max_tokens": 1}, timeout=120)
        assert answer.json()["usage"]["prompt_tokens"] == counted["plain_chat"]
    if os.environ.get("STEWARD_RECORD_PROMPT_COUNTS") == "1":
        for case in CASES:
            case["real_tokens"] = counted[case["name"]]
        DATA.write_text(json.dumps(RECORDED, indent=1, ensure_ascii=False) + "\n")
    assert counted == {case["name"]: case["real_tokens"] for case in CASES}
    for case in CASES:
        assert abs(fake_count(case) - counted[case["name"]]) <= TOLERANCE * counted[case["name"]], case["name"]
