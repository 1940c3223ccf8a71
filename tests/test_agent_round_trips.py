"""An agent's tool round trip through steward with the official SDKs (issue 29): the model is
offered ``read_file``, asked to use it, calls it; the test reads the file for real, sends the
result back in the API's own shape and gets an answer that quotes it.

One steward (module scope) in front of the tool-calling fake llama-server (``fakes.tool_reply``
says how it answers). Each API (openai ``chat.completions`` and ``responses``, anthropic
``messages``) runs whole and streamed, streamed through the SDK's own stream helper
(``chat.completions.stream``, ``responses.stream``, ``messages.stream``): what an agent's loop
reads is what the SDK made of steward's bytes. Both requests of a round trip are in steward's
books: a ``request`` event and a usage row each, with the tokens the SDK was told.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import attrs
import httpx
import httpx2
import openai
import pytest

from tests.conftest import RunningSteward, fake_model, launch_steward

pytestmark = pytest.mark.slow

MODEL = "coder"
SYSTEM = "You are a coding agent."
PATH_SCHEMA = {"type": "object", "properties": {"path": {"type": "string", "description": "The file's path"}},
               "required": ["path"]}
DESCRIPTION = "Read a text file"
MAX_TOKENS = 200
FIRST_LINE = "steward relays tool calls"
DEADLINE_S = 10.0


@attrs.frozen
class Call:
    """A tool call as the SDK parsed it."""

    id: str
    name: str
    arguments: dict[str, Any]


@attrs.frozen
class Step:
    """One answer of the round trip as the SDK gave it: the call or the text, and the usage it was told."""

    call: Call | None
    text: str
    prompt_tokens: int
    completion_tokens: int


@attrs.frozen
class Door:
    steward: RunningSteward
    usage_db: Path
    request_ids: list[str]  # X-Request-Id of every answer the SDK clients got, in order

    def http_client(self, httpx_module: Any = httpx) -> Any:
        """An HTTP client for an SDK (of *httpx_module*: the anthropic SDK has its own fork, httpx2)
        that notes each answer's request id."""
        def record(response: Any) -> None:
            self.request_ids.append(response.headers["x-request-id"])

        return httpx_module.Client(timeout=30, event_hooks={"response": [record]})


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    folder = tmp_path_factory.mktemp("agent-round-trips")
    usage_db = folder / "usage.db"
    registry: list[RunningSteward] = []
    try:
        launch_steward(folder, {MODEL: fake_model("1GiB", tps=0)}, registry,
                       gpu={"probe": "none", "budget": "4GiB"}, usage={"db": str(usage_db)})
        yield Door(registry[0], usage_db, [])
        assert registry[0].stop() == 0
    finally:
        for steward in registry:
            steward.stop()


@pytest.fixture(autouse=True)
def no_leaked_children() -> Iterator[None]:
    yield  # the module's steward and its fake live across tests


# --------------------------------------------------------------------------- each API's shapes


def answered(resource: Any, final: str, asked: dict[str, Any], stream: bool) -> Any:
    """*resource*'s answer to *asked*: ``create()``d whole, or read with its stream helper to the end."""
    if not stream:
        return resource.create(**asked)
    with resource.stream(**asked) as events:
        return getattr(events, final)()


def chat_step(door: Door, messages: list[Any], stream: bool) -> Step:
    client = openai.OpenAI(base_url=door.steward.base_url, api_key="x", max_retries=0, http_client=door.http_client())
    tools = [{"type": "function", "function": {"name": "read_file", "description": DESCRIPTION,
                                               "parameters": PATH_SCHEMA}}]
    asked: dict[str, Any] = {"model": MODEL, "messages": messages, "tools": tools, "max_tokens": MAX_TOKENS}
    if stream:
        asked["stream_options"] = {"include_usage": True}
    answer = answered(client.chat.completions, "get_final_completion", asked, stream)
    message = answer.choices[0].message
    calls = [Call(c.id, c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
    if calls:
        assert answer.choices[0].finish_reason == "tool_calls"
        messages.append({"role": "assistant", "content": message.content, "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in message.tool_calls]})
    return Step(only(calls), message.content or "", answer.usage.prompt_tokens, answer.usage.completion_tokens)


def responses_step(door: Door, items: list[Any], stream: bool) -> Step:
    client = openai.OpenAI(base_url=door.steward.base_url, api_key="x", max_retries=0, http_client=door.http_client())
    tools = [{"type": "function", "name": "read_file", "description": DESCRIPTION, "parameters": PATH_SCHEMA,
              "strict": False}]
    asked: dict[str, Any] = {"model": MODEL, "instructions": SYSTEM, "input": items, "tools": tools,
                             "max_output_tokens": MAX_TOKENS}
    answer = answered(client.responses, "get_final_response", asked, stream)
    assert answer.status == "completed" and answer.usage is not None
    calls = [Call(item.call_id, item.name, json.loads(item.arguments)) for item in answer.output
             if item.type == "function_call"]
    items.extend(item for item in answer.output if item.type == "function_call")
    return Step(only(calls), answer.output_text, answer.usage.input_tokens, answer.usage.output_tokens)


def messages_step(door: Door, messages: list[Any], stream: bool) -> Step:
    client = anthropic.Anthropic(base_url=door.steward.url, api_key="x", max_retries=0,
                                 http_client=door.http_client(httpx2))
    tools = [{"name": "read_file", "description": DESCRIPTION, "input_schema": PATH_SCHEMA}]
    asked: dict[str, Any] = {"model": MODEL, "system": SYSTEM, "messages": messages, "tools": tools,
                             "max_tokens": MAX_TOKENS}
    answer = answered(client.messages, "get_final_message", asked, stream)
    calls = [Call(block.id, block.name, dict(block.input)) for block in answer.content  # type: ignore[arg-type]
             if block.type == "tool_use"]
    if calls:
        assert answer.stop_reason == "tool_use"
        messages.append({"role": "assistant", "content": [block.model_dump(exclude_none=True)
                                                          for block in answer.content]})
    text = "".join(block.text for block in answer.content if block.type == "text")
    return Step(only(calls), text, answer.usage.input_tokens, answer.usage.output_tokens)


def only(calls: list[Call]) -> Call | None:
    assert len(calls) <= 1, calls
    return calls[0] if calls else None


@attrs.frozen
class Api:
    """How an agent speaks one API: its route, the history that sets the task, one request and
    its answer (the SDK call; a tool call it made joins the history), a tool's result in its shape."""

    route: str
    opening: Callable[[str], list[Any]]
    step: Callable[[Door, list[Any], bool], Step]
    result: Callable[[Call, str], dict[str, Any]]


APIS = {
    "chat": Api("/v1/chat/completions",
                lambda task: [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}], chat_step,
                lambda call, text: {"role": "tool", "tool_call_id": call.id, "content": text}),
    "responses": Api("/v1/responses", lambda task: [{"role": "user", "content": task}], responses_step,
                     lambda call, text: {"type": "function_call_output", "call_id": call.id, "output": text}),
    "messages": Api("/v1/messages", lambda task: [{"role": "user", "content": task}], messages_step,
                    lambda call, text: {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": call.id, "content": text}]}),
}


# --------------------------------------------------------------------------- the test


def usage_rows(db: Path, request_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The usage rows of *request_ids*, waiting for the writer to have written them all."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        rows: dict[str, dict[str, Any]] = {}
        if db.exists():
            with sqlite3.connect(db) as connection:
                connection.row_factory = sqlite3.Row
                marks = ",".join("?" * len(request_ids))
                rows = {row["request_id"]: dict(row) for row in connection.execute(
                    f"SELECT * FROM requests WHERE request_id IN ({marks})", request_ids)}
        if len(rows) == len(request_ids) or time.monotonic() > deadline:
            assert set(rows) == set(request_ids), f"usage rows missing for {set(request_ids) - set(rows)}"
            return rows
        time.sleep(0.05)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", list(APIS))
def test_a_tool_round_trip(door: Door, tmp_path: Path, api: str, stream: bool) -> None:
    speaks = APIS[api]
    notes = tmp_path / "notes.txt"
    notes.write_text(f"{FIRST_LINE} ({api}, {'streamed' if stream else 'whole'})\nsecond line\n")
    before = len(door.request_ids)
    task = f'Use the read_file tool to read {{"path": "{notes}"}} and tell me its first line.'

    history = speaks.opening(task)
    first = speaks.step(door, history, stream)
    assert first.call is not None, f"no tool call: {first.text!r}"
    assert (first.call.name, first.call.arguments) == ("read_file", {"path": str(notes)})
    assert first.call.id
    result = Path(first.call.arguments["path"]).read_text()  # the agent runs its tool
    history.append(speaks.result(first.call, result))
    final = speaks.step(door, history, stream)
    assert final.call is None
    assert final.text == f"read_file returned: {result.splitlines()[0]}"

    ids = door.request_ids[before:]
    assert len(ids) == 2 and len(set(ids)) == 2, ids
    steps = (first, final)
    events = [door.steward.wait_event("request", request_id=request_id) for request_id in ids]
    rows = usage_rows(door.usage_db, ids)
    for step, event in zip(steps, events, strict=True):
        told = (step.prompt_tokens, step.completion_tokens)
        assert (event["route"], event["model"], event["status"], event["error"]) == (speaks.route, MODEL, 200, None)
        assert (event["prompt_tokens"], event["completion_tokens"]) == told, (event, step)
        row = rows[event["request_id"]]
        assert (row["route"], row["model"], row["status"]) == (speaks.route, MODEL, 200)
        assert (row["prompt_tokens"], row["completion_tokens"]) == told, (row, step)
    # The answer's prompt holds the task, the call and the file: more tokens than the task alone.
    assert final.prompt_tokens > first.prompt_tokens > 0 and first.completion_tokens > 0
