"""Every API an agent speaks, through a real steward: OpenAI's Responses (the `openai` client),
Anthropic's Messages and count_tokens (the `anthropic` client), rerank and transcriptions,
in front of fake llama-servers and the fake Ollama (real processes, real sockets), with keys on.

Each route goes through the scheduler like chat completions (classes, slots, usage,
disconnects); a route its model does not serve, and a bad body, get that route's error
shape, never a 5xx of steward's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from supervisor.auth.keys import add_key
from tests.conftest import RunningSteward, fake_model, free_port, launch_steward
from tests.test_ollama_listener import CHAT, ollama_section
from tests.test_ollama_listener import listener as ollama_listener

pytestmark = pytest.mark.slow
OLLAMA_CHAT = CHAT.partition(",")[0]  # the fake Ollama's model, without its settings
TOKENS = ["--max-tokens-default", "8"]
RESPONSES_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
                    "response.content_part.added", "response.output_text.delta", "response.output_text.done",
                    "response.content_part.done", "response.output_item.done", "response.completed"]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningSteward, str]]:
    run_dir = tmp_path_factory.mktemp("apis")
    keys_file = run_dir / "keys.json"
    key = add_key(keys_file, "agent", known_models=["chat"], ollama=True)
    models = {
        "chat": fake_model("1GiB", parallel=2, tps=50, aliases=["claude-sonnet-4-5"], extra=TOKENS),
        "embed": fake_model("0.5GiB", extra=["--embeddings"]),
        "rank": fake_model("0.5GiB", extra=["--reranking"]),
        "asr": fake_model("0.5GiB", extra=["--mmproj", "/models/mmproj-audio.gguf", *TOKENS]),
        # Told it serves messages although its engine embeds: the engine's own 500 comes back.
        "misled": fake_model("0.5GiB", extra=["--embeddings"], serves=["embeddings", "messages"]),
    }
    registry: list[RunningSteward] = []
    launch_steward(run_dir, models, registry, gpu={"probe": "none", "budget": "16GiB"},
                   auth={"keys_file": str(keys_file)}, ollama=ollama_section(free_port()))
    yield registry[0], key
    assert registry[0].stop() == 0


@pytest.fixture(autouse=True)
def no_leaked_children() -> Iterator[None]:
    yield  # the module's steward lives across tests


@pytest.fixture
def steward(keyed: tuple[RunningSteward, str]) -> RunningSteward:
    return keyed[0]


@pytest.fixture
def key(keyed: tuple[RunningSteward, str]) -> str:
    return keyed[1]


@pytest.fixture
def oai(steward: RunningSteward, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=steward.base_url, api_key=key, max_retries=0, timeout=30)


@pytest.fixture
def claude(steward: RunningSteward, key: str) -> anthropic.Anthropic:
    # The Anthropic SDK appends /v1/messages to its base URL and sends the key as x-api-key.
    return anthropic.Anthropic(base_url=steward.url, api_key=key, max_retries=0, timeout=30)


def requests_so_far(steward: RunningSteward, route: str, listener: str = "openai") -> list[dict[str, Any]]:
    return [r for r in steward.events("request") if r["route"] == route and r["listener"] == listener]


def request_after(steward: RunningSteward, route: str, before: int, listener: str = "openai") -> dict[str, Any]:
    """The `request` event of the request after the first *before* on *route*: it is written once
    its answer ended, which may be a moment after the client has the answer."""
    deadline = time.monotonic() + 10
    while len(rows := requests_so_far(steward, route, listener)) <= before:
        assert time.monotonic() < deadline, f"{len(rows)} request events for {route}, wanted {before + 1}"
        time.sleep(0.02)
    return rows[before]


def test_the_responses_api_with_the_openai_client(oai: openai.OpenAI, steward: RunningSteward) -> None:
    before = len(requests_so_far(steward, "/v1/responses"))
    answer = oai.responses.create(model="chat", input="hello", max_output_tokens=4)
    assert answer.status == "completed" and answer.output_text
    assert answer.usage is not None and answer.usage.output_tokens == 4
    row = request_after(steward, "/v1/responses", before)
    assert (row["status"], row["model"], row["completion_tokens"]) == (200, "chat", 4)
    assert row["prompt_tokens"] == answer.usage.input_tokens

    events = list(oai.responses.create(model="chat", input=[{"role": "user", "content": "hi"}],
                                       instructions="be brief", max_output_tokens=3, stream=True))
    kinds = [event.type for event in events]
    assert kinds == RESPONSES_EVENTS[:4] + ["response.output_text.delta"] * 3 + RESPONSES_EVENTS[5:]
    assert events[-1].response.usage.output_tokens == 3
    row = request_after(steward, "/v1/responses", before + 1)
    assert (row["status"], row["completion_tokens"]) == (200, 3)

    counted = httpx.post(f"{steward.base_url}/responses/input_tokens", json={"model": "chat", "input": "hello"},
                         headers={"authorization": f"Bearer {oai.api_key}"}, timeout=30)
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 0


def test_the_messages_api_with_the_anthropic_client(claude: anthropic.Anthropic, steward: RunningSteward) -> None:
    before = len(requests_so_far(steward, "/v1/messages"))
    message = claude.messages.create(model="claude-sonnet-4-5", max_tokens=4, system="be brief",
                                     messages=[{"role": "user", "content": "hello"}])
    assert message.type == "message" and message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 4
    row = request_after(steward, "/v1/messages", before)
    assert (row["status"], row["model"], row["completion_tokens"]) == (200, "chat", 4)
    cached = message.usage.cache_read_input_tokens or 0
    assert row["prompt_tokens"] == message.usage.input_tokens + cached

    with claude.messages.stream(model="chat", max_tokens=5,
                                messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds and "message_delta" in kinds
    assert final.usage.output_tokens == 5 and final.content[0].text
    row = request_after(steward, "/v1/messages", before + 1)
    assert (row["status"], row["completion_tokens"]) == (200, 5)
    assert row["prompt_tokens"] and row["prompt_tokens"] > 0  # message_start's, the cached part included

    counting = len(requests_so_far(steward, "/v1/messages/count_tokens"))
    counted = claude.messages.count_tokens(model="chat", messages=[{"role": "user", "content": "hello there"}])
    assert counted.input_tokens > 0
    row = request_after(steward, "/v1/messages/count_tokens", counting)
    assert (row["status"], row["prompt_tokens"], row["completion_tokens"]) == (200, 0, 0)  # counted, not computed


def test_rerank_on_each_of_its_paths(steward: RunningSteward, key: str) -> None:
    body = {"model": "rank", "query": "a cat", "documents": ["a dog", "a cat sat", "the stock market"], "top_n": 2}
    for path in ("/v1/rerank", "/v1/reranking", "/rerank"):
        before = len(requests_so_far(steward, path))
        answer = httpx.post(f"{steward.url}{path}", json=body, headers={"authorization": f"Bearer {key}"}, timeout=30)
        assert answer.status_code == 200, answer.text
        results = answer.json()["results"]
        assert len(results) == 2
        assert results[0]["relevance_score"] >= results[1]["relevance_score"]
        assert request_after(steward, path, before)["model"] == "rank"


def test_a_transcription_through_the_openai_client(oai: openai.OpenAI, steward: RunningSteward) -> None:
    audio = b"RIFF" + bytes(range(256)) * 8
    before, rows = len(steward.events("dispatch")), len(requests_so_far(steward, "/v1/audio/transcriptions"))
    text = oai.audio.transcriptions.create(model="asr@batch", file=("talk.wav", audio, "audio/wav"))
    assert text.text
    dispatched = steward.events("dispatch")[before:]
    assert [(d["model"], d["class"]) for d in dispatched] == [("asr", "batch")]
    row = request_after(steward, "/v1/audio/transcriptions", rows)
    assert (row["status"], row["model"], row["class"]) == (200, "asr", "batch")


def route_request(route: str, model: str, how: str) -> tuple[dict[str, str], dict[str, Any]]:
    """Keyword arguments for httpx: a request on *route* for *model* whose class is given *how*."""
    headers: dict[str, str] = {}
    name = f"{model}@background" if how == "suffix" else model
    extra = {"steward": {"class": "batch"}} if how == "body" else {}
    if how == "header":
        headers["x-steward-class"] = "background"
    if route == "/v1/audio/transcriptions":
        data = {"model": name, **({"steward": json.dumps(extra["steward"])} if extra else {})}
        return headers, {"data": data, "files": {"file": ("a.wav", b"RIFF-audio", "audio/wav")}}
    bodies = {"/v1/responses": {"input": "hi", "max_output_tokens": 1},
              "/v1/messages": {"max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]},
              "/v1/messages/count_tokens": {"messages": [{"role": "user", "content": "hi"}]},
              "/v1/rerank": {"query": "q", "documents": ["a", "b"]}}
    return headers, {"json": {"model": name, **bodies[route], **extra}}


ROUTE_MODELS = [("/v1/responses", "chat"), ("/v1/messages", "chat"), ("/v1/messages/count_tokens", "chat"),
                ("/v1/rerank", "rank"), ("/v1/audio/transcriptions", "asr")]


@pytest.mark.parametrize(("route", "model"), ROUTE_MODELS)
@pytest.mark.parametrize("how", ["header", "body", "suffix"])
def test_a_class_given_any_way_on_every_route(steward: RunningSteward, key: str, route: str, model: str,
                                              how: str) -> None:
    headers, request = route_request(route, model, how)
    before = len(steward.events("dispatch"))
    answer = httpx.post(f"{steward.url}{route}", headers={"x-api-key": key, **headers}, timeout=30, **request)
    assert answer.status_code == 200, answer.text
    dispatched = steward.events("dispatch")[before:]
    assert [(d["model"], d["class"]) for d in dispatched] == [(model, "batch" if how == "body" else "background")]


def test_a_route_the_model_does_not_serve_is_a_400_in_the_route_s_shape(
        oai: openai.OpenAI, claude: anthropic.Anthropic) -> None:
    with pytest.raises(openai.BadRequestError) as chat_to_embedder:
        oai.chat.completions.create(model="embed", messages=[{"role": "user", "content": "hi"}])
    assert chat_to_embedder.value.code == "model_not_supported"
    assert "does not serve /v1/chat/completions: it serves /v1/embeddings" in chat_to_embedder.value.message
    with pytest.raises(openai.BadRequestError) as responses_to_reranker:
        oai.responses.create(model="rank", input="hi")
    assert responses_to_reranker.value.code == "model_not_supported"
    with pytest.raises(anthropic.BadRequestError) as messages_to_embedder:
        claude.messages.create(model="embed", max_tokens=1, messages=[{"role": "user", "content": "hi"}])
    assert messages_to_embedder.value.body == {"type": "error", "error": {
        "type": "invalid_request_error", "message": messages_to_embedder.value.body["error"]["message"]}}
    assert "does not serve /v1/messages" in messages_to_embedder.value.message
    assert oai.embeddings.create(model="embed", input="hi").data  # what it does serve still works


def test_an_engine_s_own_error_on_messages_comes_in_anthropic_s_shape(claude: anthropic.Anthropic,
                                                                     steward: RunningSteward) -> None:
    # Its config says it serves messages; its engine (started with --embeddings) answers 500.
    before = len(requests_so_far(steward, "/v1/messages"))
    with pytest.raises(anthropic.InternalServerError) as failed:
        claude.messages.create(model="misled", max_tokens=1, messages=[{"role": "user", "content": "hi"}])
    assert failed.value.status_code == 500
    assert failed.value.body == {"type": "error", "error": {
        "type": "api_error", "message": "the current context does not support logits computation. skipping"}}
    assert request_after(steward, "/v1/messages", before)["error"] == "server_error"  # the engine's, not the client's


def anthropic_error(answer: httpx.Response) -> dict[str, Any]:
    body = answer.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    return body["error"]


def openai_error(answer: httpx.Response) -> dict[str, Any]:
    body = answer.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


@pytest.mark.parametrize("route", ["/v1/responses", "/v1/messages", "/v1/messages/count_tokens", "/v1/rerank",
                                   "/v1/audio/transcriptions"])
@pytest.mark.parametrize("body", ["not json", "[]", "{}", '{"model": "nope"}', '{"model": 7}'])
def test_bad_bodies_get_the_route_s_error_shape(steward: RunningSteward, key: str, route: str, body: str) -> None:
    answer = httpx.post(f"{steward.url}{route}", content=body, timeout=30,
                        headers={"x-api-key": key, "content-type": "application/json"})
    expected = 404 if body == '{"model": "nope"}' and route != "/v1/audio/transcriptions" else 400
    assert answer.status_code == expected, answer.text
    error = anthropic_error(answer) if route.startswith("/v1/messages") else openai_error(answer)
    assert error["message"]


def test_bad_forms_and_methods_get_the_route_s_shape(steward: RunningSteward, key: str) -> None:
    auth = {"x-api-key": key}
    no_model = httpx.post(f"{steward.base_url}/audio/transcriptions", headers=auth, timeout=30,
                          files={"file": ("a.wav", b"RIFF", "audio/wav")})
    assert no_model.status_code == 400 and openai_error(no_model)["param"] == "model"
    cut = httpx.post(f"{steward.base_url}/audio/transcriptions", timeout=30, content=b"--b\r\nContent-Dispo",
                     headers={**auth, "content-type": "multipart/form-data; boundary=b"})
    assert cut.status_code == 400 and "cut short or malformed" in openai_error(cut)["message"]
    unknown = httpx.post(f"{steward.base_url}/audio/transcriptions", headers=auth, timeout=30,
                         data={"model": "nope"}, files={"file": ("a.wav", b"RIFF", "audio/wav")})
    assert unknown.status_code == 404 and openai_error(unknown)["code"] == "model_not_found"
    wrong_method = httpx.get(f"{steward.base_url}/messages", headers=auth, timeout=30)
    assert wrong_method.status_code == 405 and anthropic_error(wrong_method)["type"] == "invalid_request_error"


def test_without_a_key_each_route_refuses_in_its_own_shape(steward: RunningSteward) -> None:
    with pytest.raises(anthropic.AuthenticationError) as refused:
        anthropic.Anthropic(base_url=steward.url, api_key="sk-steward-wrong", max_retries=0).messages.create(
            model="chat", max_tokens=1, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError) as refused_openai:
        openai.OpenAI(base_url=steward.base_url, api_key="sk-steward-wrong", max_retries=0).responses.create(
            model="chat", input="hi")
    assert refused_openai.value.code == "invalid_api_key"


def test_a_client_leaving_a_messages_stream_cancels_the_engine_s_request(steward: RunningSteward, key: str) -> None:
    stats_url = steward.engine_endpoint("chat") + "/fake/stats"
    cancelled_before = httpx.get(stats_url).json()["cancelled"]
    before = len(requests_so_far(steward, "/v1/messages"))
    body = {"model": "chat", "stream": True, "max_tokens": 400, "messages": [{"role": "user", "content": "go"}]}
    with httpx.stream("POST", f"{steward.base_url}/messages", json=body, headers={"x-api-key": key}) as response:
        for line in response.iter_lines():
            if "content_block_delta" in line:
                break  # leave after the first token
    deadline = time.monotonic() + 10
    while httpx.get(stats_url).json()["cancelled"] == cancelled_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert httpx.get(stats_url).json()["cancelled"] == cancelled_before + 1
    row = request_after(steward, "/v1/messages", before)
    assert row["status"] == 499 and row["error"] == "client_left"


def test_the_model_list_says_what_each_model_is_for(steward: RunningSteward, key: str,
                                                    claude: anthropic.Anthropic) -> None:
    auth = {"authorization": f"Bearer {key}"}
    listed = httpx.get(f"{steward.base_url}/models", headers=auth).json()["data"]
    kinds = {entry["id"]: (entry["steward"]["kind"], entry["capabilities"]) for entry in listed}
    assert kinds == {"chat": ("chat", ["completion"]), "claude-sonnet-4-5": ("chat", ["completion"]),
                     "embed": ("embedding", ["embedding"]), "rank": ("rerank", ["rerank"]),
                     "asr": ("chat", ["completion"]), "misled": ("chat", ["completion"])}
    served = {entry["id"]: entry["steward"]["serves"] for entry in listed}
    assert served["asr"] == ["chat", "completions", "responses", "messages", "transcription"]
    assert served["embed"] == ["embeddings"]
    chat_only = httpx.get(f"{steward.base_url}/models", params={"kind": "chat"}, headers=auth).json()["data"]
    assert "embed" not in {entry["id"] for entry in chat_only} and "rank" not in {e["id"] for e in chat_only}
    page = claude.models.list()
    assert [model.id for model in page.data] == list(kinds)
    assert all(model.type == "model" and model.created_at for model in page.data)
    assert claude.models.retrieve("embed").id == "embed"
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.models.retrieve("nope")
    assert missing.value.body["error"]["type"] == "not_found_error"


def test_the_ollama_listener_s_responses_and_messages_go_through_the_same_code(
        steward: RunningSteward, key: str) -> None:
    url = ollama_listener(steward)
    via_openai = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=30)
    before = len(steward.events("dispatch"))
    answer = via_openai.responses.create(model=f"{OLLAMA_CHAT}@background", input="hello", max_output_tokens=3)
    assert answer.output_text
    events = list(via_openai.responses.create(model=OLLAMA_CHAT, input="hi", max_output_tokens=3, stream=True))
    assert events[-1].type == "response.completed"
    via_anthropic = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=30)
    message = via_anthropic.messages.create(model=OLLAMA_CHAT, max_tokens=3,
                                            messages=[{"role": "user", "content": "hi"}])
    assert message.content and message.content[0].text
    with via_anthropic.messages.stream(model=OLLAMA_CHAT, max_tokens=3,
                                       messages=[{"role": "user", "content": "hi"}]) as stream:
        assert stream.get_final_text()
    dispatched = steward.events("dispatch")[before:]
    assert [(d["model"], d["class"]) for d in dispatched] == [("ollama", "background")] + [("ollama",
                                                                                            "interactive")] * 3
    with pytest.raises(anthropic.NotFoundError) as missing:
        via_anthropic.messages.create(model="not-pulled:1b", max_tokens=3, messages=[{"role": "user", "content": "x"}])
    assert missing.value.body["type"] == "error"
    assert request_after(steward, "/v1/messages", 0, listener="ollama")["completion_tokens"] == 3


def test_module_left_no_5xx_of_steward_s_own(steward: RunningSteward) -> None:
    statuses = {(r["route"], r["status"]) for r in steward.events("request") if r["status"] >= 500}
    assert statuses <= {("/v1/messages", 500)}, statuses  # the misled engine's own 500, nothing of steward's
    assert Path(steward.stderr_path).read_text().count("Traceback") == 0


def test_streams_llama_server_leaves_unopened_are_opened_for_the_official_clients(
        oai: openai.OpenAI, claude: anthropic.Anthropic, steward: RunningSteward) -> None:
    """llama-server sends message_start only with token 1's event, and nothing for a token that
    is half a character (the fake does the same): steward sends the opening event first."""
    with claude.messages.stream(model="chat", max_tokens=3,
                                messages=[{"role": "user", "content": "FAKE_SPLIT_UTF8"}]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.model == "chat" and final.content[0].text == "é brown" and final.usage.output_tokens == 3
    direct = httpx.post(steward.engine_endpoint("chat") + "/v1/messages", timeout=30, json={
        "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": "FAKE_SPLIT_UTF8"}]})
    assert "message_start" not in direct.text  # the quirk itself
    # One token, half a character: no whole character, no partial result at all; only the final events.
    with oai.responses.stream(model="chat", input="FAKE_SPLIT_UTF8", max_output_tokens=1) as responses:
        kinds = [event.type for event in responses]
        response = responses.get_final_response()
    assert kinds == ["response.created", "response.in_progress", "response.completed"]
    assert response.status == "completed" and response.usage is not None and response.usage.output_tokens == 1
