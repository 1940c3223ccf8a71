"""The fake llama-server calls tools when asked, in each API's shape, as the real one does (issue 29).

The fake runs in this process (its HTTP server on a loopback port, no child process) and is
asked over HTTP, by the official ``openai`` and ``anthropic`` clients (async, under trio) and
by hand. ``tests/data/llama_tool_calls.json`` holds what the REAL llama-server answered to the
same requests (SmolLM2-135M-Instruct with the fake's chat template, greedy): the fake's answers
must have the same keys and types and the same events in the same order (a run of deltas
counts once). Real streamed tool calls are not valid by the SDKs' strict types (no
``sequence_number``, a ``tool_use`` block started without ``input``): the clients read them
leniently, as the tests do; whole answers are validated strictly where the real one passes.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import trio
from anthropic.types import Message
from openai.types.chat import ChatCompletion

from fakes.chat_template import Chat, ChatMessage, ToolCall, ToolChoice, function_tool
from fakes.llama_server.cli import Log, parse_config
from fakes.llama_server.server import FakeLlamaServer
from fakes.tool_reply import example_value, tool_reply
from tests.test_fake_llama_apis import shape, sse

RECORDED = json.loads((Path(__file__).parent / "data" / "llama_tool_calls.json").read_text())
REQUESTS, REAL = RECORDED["requests"], RECORDED["answers"]
CALL_ID = re.compile(r"[A-Za-z0-9]{32}")
READ_FILE = function_tool("read_file", "Read a file", {
    "type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}}, "required": ["path"]})
GREP_PROPERTIES = {"pattern": {"type": "string"}, "mode": {"type": "string", "enum": ["content", "count"]},
                   "context": {"type": ["integer", "null"], "minimum": 2},
                   "globs": {"type": "array", "items": {"type": "string"}}}
GREP = function_tool("grep", "Search", {"type": "object", "properties": GREP_PROPERTIES, "required": list(GREP_PROPERTIES)})


@asynccontextmanager
async def serving(*flags: str) -> AsyncIterator[str]:
    """A fake llama-server in this process; its base URL."""
    server = FakeLlamaServer(parse_config(["--port", "0", "--tokens-per-second", "0", *flags]), Log(enabled=False))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.http.serve, "127.0.0.1", 0)
        await server.load(port)
        yield f"http://127.0.0.1:{port}"
        nursery.cancel_scope.cancel()


@pytest.fixture
async def fake() -> AsyncIterator[str]:
    async with serving() as base:
        yield base


async def ask(base: str, api: str, *, stream: bool, **changes: Any) -> Any:
    """The fake's answer to the recorded request of *api*: parsed JSON, or (event, data) pairs."""
    request = REQUESTS[api]
    body = {**request["body"], **changes, "stream": stream}
    if stream and api == "chat":
        body["stream_options"] = {"include_usage": True}
    async with httpx.AsyncClient(timeout=30) as client:
        answer = await client.post(base + request["path"], json=body)
    assert answer.status_code == 200, answer.text
    return [tuple(event) for event in sse(answer.text)] if stream else answer.json()


def sdk_messages(body: dict[str, Any]) -> dict[str, Any]:
    """The recorded Messages request as the anthropic client takes it (not every field of the body)."""
    return {key: body[key] for key in ("model", "max_tokens", "system", "tools", "messages")}


def stream_shape(events: list[Any]) -> list[Any]:
    """Each event's name and shape; a run of events of one shape (the deltas) counts once."""
    shapes: list[Any] = []
    for name, data in events:
        if not shapes or shapes[-1] != (name, shape(data)):
            shapes.append((name, shape(data)))
    return shapes


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
async def test_a_tool_call_has_the_real_llama_server_s_shape(fake: str, api: str) -> None:
    assert shape(await ask(fake, api, stream=False)) == shape(REAL[api])
    assert stream_shape(await ask(fake, api, stream=True)) == stream_shape(REAL[f"{api}_stream"])


async def test_chat_tool_calls_with_the_openai_client(fake: str) -> None:
    body = {**REQUESTS["chat"]["body"], "model": "tiny"}
    client = openai.AsyncOpenAI(base_url=f"{fake}/v1", api_key="x", max_retries=0)
    raw = await client.chat.completions.with_raw_response.create(**body)
    answer = ChatCompletion.model_validate(json.loads(raw.http_response.text), strict=True)
    (call,) = answer.choices[0].message.tool_calls or []
    assert answer.choices[0].finish_reason == "tool_calls" and CALL_ID.fullmatch(call.id)
    assert (call.function.name, json.loads(call.function.arguments)) == ("read_file", {"path": "src/main.py"})
    pieces, ids, finish = [], set(), None
    async for chunk in await client.chat.completions.create(**body, stream=True):
        for delta_call in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            pieces.append(delta_call.function.arguments)
            ids |= {delta_call.id} - {None}
        finish = chunk.choices[0].finish_reason if chunk.choices else finish
    assert json.loads("".join(pieces)) == {"path": "src/main.py"} and len(pieces) > 3 and len(ids) == 1
    assert finish == "tool_calls"


async def test_messages_tool_use_with_the_anthropic_client(fake: str) -> None:
    body = sdk_messages(REQUESTS["messages"]["body"])
    client = anthropic.AsyncAnthropic(base_url=fake, api_key="x", max_retries=0)
    raw = await client.messages.with_raw_response.create(**body)
    message = Message.model_validate(json.loads(raw.http_response.text), strict=True)
    (block,) = message.content
    assert (message.stop_reason, block.type) == ("tool_use", "tool_use")
    assert (block.name, block.input) == ("read_file", {"path": "src/main.py"})  # type: ignore[union-attr]
    async with client.messages.stream(**body) as stream:
        final = await stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert final.content[0].input == {"path": "src/main.py"}  # type: ignore[union-attr]


async def test_responses_function_call_with_the_openai_client(fake: str) -> None:
    body = REQUESTS["responses"]["body"]
    client = openai.AsyncOpenAI(base_url=f"{fake}/v1", api_key="x", max_retries=0)
    answer = await client.responses.create(**body)
    (item,) = answer.output
    assert item.type == "function_call"
    assert item.call_id == "call_" + item.id.removeprefix("fc_")  # type: ignore[union-attr]
    assert (item.name, json.loads(item.arguments)) == ("read_file", {"path": "src/main.py"})  # type: ignore[union-attr]
    events = [event async for event in await client.responses.create(**body, stream=True)]
    deltas = "".join(event.delta for event in events if event.type == "response.function_call_arguments.delta")
    assert json.loads(deltas) == {"path": "src/main.py"}
    assert events[-1].type == "response.completed" and events[-1].response.output[0].type == "function_call"


async def test_after_the_tool_s_result_each_api_answers_with_text_about_it(fake: str) -> None:
    result = "def main():\n    print('hi')"
    chat = {**REQUESTS["chat"]["body"], "model": "tiny"}
    chat = {**chat, "messages": [*chat["messages"], {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "src/main.py"}'}}]},
        {"role": "tool", "tool_call_id": "c2", "content": result}]}
    messages = REQUESTS["messages"]["body"]
    messages = {**messages, "messages": [*messages["messages"], {"role": "assistant", "content": [
        {"type": "tool_use", "id": "c2", "name": "read_file", "input": {"path": "src/main.py"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c2", "content": result}]}]}
    responses = REQUESTS["responses"]["body"]
    responses = {**responses, "input": [*responses["input"], {"type": "function_call", "call_id": "c2",
                                                               "name": "read_file", "arguments": "{}"},
                                        {"type": "function_call_output", "call_id": "c2", "output": result}]}
    oai = openai.AsyncOpenAI(base_url=f"{fake}/v1", api_key="x", max_retries=0)
    said = "read_file returned: def main():"
    answer = await oai.chat.completions.create(**{**chat, "max_tokens": 100})
    assert (answer.choices[0].finish_reason, answer.choices[0].message.content) == ("stop", said)
    message = await anthropic.AsyncAnthropic(base_url=fake, api_key="x", max_retries=0).messages.create(
        **sdk_messages(messages))
    assert (message.stop_reason, message.content[0].text) == ("end_turn", said)  # type: ignore[union-attr]
    response = await oai.responses.create(**responses)
    assert response.output_text == said


async def test_a_budget_too_small_cuts_the_call(fake: str) -> None:
    answer = await ask(fake, "chat", stream=False, max_tokens=20)
    (call,) = answer["choices"][0]["message"]["tool_calls"]
    assert answer["choices"][0]["finish_reason"] == "length" and answer["usage"]["completion_tokens"] == 20
    assert call["function"]["arguments"] == '{"path'  # 18 tokens before the arguments, then two of them


async def test_without_a_budget_the_model_ends_its_reply_itself() -> None:
    async with serving("--max-tokens-default", "5") as base, httpx.AsyncClient(timeout=30) as client:
        ask_chat = {"messages": [{"role": "user", "content": "hi"}]}
        free = (await client.post(base + "/v1/chat/completions", json=ask_chat)).json()
        capped = (await client.post(base + "/v1/chat/completions", json={**ask_chat, "max_tokens": 3})).json()
        native = (await client.post(base + "/completion", json={"prompt": "hi", "n_predict": -1})).json()
    assert (free["choices"][0]["finish_reason"], free["usage"]["completion_tokens"]) == ("stop", 6)  # + the EOS
    assert (capped["choices"][0]["finish_reason"], capped["usage"]["completion_tokens"]) == ("length", 3)
    assert (native["stop_type"], native["tokens_predicted"]) == ("eos", 6)


# --------------------------------------------------------------------------- what triggers a call


def chat(text: str, *tools: dict[str, Any], choice: ToolChoice = ToolChoice()) -> Chat:
    return Chat((ChatMessage("system", "be brief"), ChatMessage("user", text)), tools, choice)


def test_a_call_needs_offered_tools_and_a_named_one_or_a_choice() -> None:
    call = tool_reply(chat("please run read_file", READ_FILE))
    assert isinstance(call, ToolCall) and (call.name, call.arguments) == ("read_file", '{"path": "README.md"}')
    assert tool_reply(chat("please run read_file")) is None  # no tools offered
    assert tool_reply(chat("read the file", READ_FILE)) is None  # not named
    assert tool_reply(chat("read_file is broken", READ_FILE)) is None  # named, not asked for
    assert tool_reply(chat("run read_files", READ_FILE)) is None  # a longer word is another name
    assert tool_reply(chat("Use the `read_file` tool", READ_FILE)).name == "read_file"
    assert tool_reply(chat("use read_file", READ_FILE, choice=ToolChoice("none"))) is None
    assert tool_reply(chat("anything", READ_FILE, GREP, choice=ToolChoice("required"))).name == "read_file"
    assert tool_reply(chat("read_file", READ_FILE, GREP, choice=ToolChoice("required", "grep"))).name == "grep"
    assert tool_reply(chat("use grep, then use read_file", READ_FILE, GREP)).name == "grep"  # the first asked for
    written = tool_reply(chat('use grep with {"pattern": "TODO"} and nothing else', READ_FILE, GREP))
    assert json.loads(written.arguments) == {"pattern": "TODO"}


def test_system_messages_after_the_last_turn_do_not_hide_it() -> None:
    # Claude Code sends its environment as a system message after the user's request.
    asked = Chat((ChatMessage("user", "use read_file"), ChatMessage("system", "cwd: /work")), (READ_FILE,))
    assert tool_reply(asked).name == "read_file"
    call = ToolCall("read_file", "{}", "c1")
    done = Chat((*asked.messages, ChatMessage("assistant", tool_calls=(call,)),
                 ChatMessage("tool", "hello", tool_call_id="c1"), ChatMessage("system", "reminder")), (READ_FILE,))
    assert tool_reply(done) == "read_file returned: hello"


def test_arguments_fill_the_schema_s_required_properties_with_values_of_their_types() -> None:
    assert example_value(GREP["function"]["parameters"]) == {"pattern": "TODO", "mode": "content", "context": 2,
                                                            "globs": []}
    assert example_value({"type": "object", "properties": {"url": {"type": "string"}, "n": {"type": "number"},
                                                           "on": {"type": "boolean", "default": True}},
                          "required": ["url", "n", "on"]}) == {"url": "https://example.com", "n": 1.0, "on": True}


def test_a_tool_result_gets_an_answer_that_quotes_it() -> None:
    call = ToolCall("read_file", "{}", "c1")
    done = Chat((ChatMessage("user", "read_file"), ChatMessage("assistant", tool_calls=(call,)),
                 ChatMessage("tool", "x" * 100 + "\nmore", tool_call_id="c1")), (READ_FILE,))
    assert tool_reply(done) == "read_file returned: " + "x" * 80 + "..."
