"""The fake llama-server on the routes agents speak (OpenAI's Responses, Anthropic's Messages,
rerank, audio transcription), checked with the official clients, and the same requests sent
to the REAL llama-server: same status, same event types in the same order, same keys.

The fakes and the real servers (tiny models written by fakes.tiny_gguf) start once for the
module; the real binary comes from fakes.llama_binary, and a missing one fails these tests,
it never skips them. Real answers come from a random model, so only shapes are compared
(greedy decoding keeps them the same from run to run); the fake's are checked exactly.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import attrs
import httpx
import openai
import pytest

from fakes.llama_binary import llama_server_path
from fakes.tiny_gguf import write_tiny_model
from tests.bare_llama import open_bare_llama_server
from tests.conftest import MODULE_SCOPED, descendants
from tests.fake_processes import FakeProcess, fake_launcher

pytestmark = pytest.mark.slow  # every test here talks to servers in their own processes

GREEDY = {"temperature": 0}  # the real model's answer is then the same every time
AUDIO = b"RIFF" + bytes(range(256)) * 10  # 2564 bytes: 3 audio tokens
RESPONSES_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
                    "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
                    "response.output_text.done", "response.content_part.done", "response.output_item.done",
                    "response.completed"]
MESSAGES_EVENTS = ["message_start", "content_block_start", "content_block_delta", "content_block_delta",
                   "content_block_stop", "message_delta", "message_stop"]
NO_LOGITS = {"error": {"code": 500, "message": "the current context does not support logits computation. skipping",
                       "type": "server_error"}}


@attrs.frozen
class Servers:
    generate: str  # base URLs
    rerank: str    # an embedding server that pools by rank (--reranking): it cannot generate
    audio: str = ""  # the fake only: one with a multimodal projector


def _pids() -> set[int]:
    return {pid for pid, _ in descendants()}


def _spare(before: set[int]) -> set[int]:
    """The processes started since *before* live across this module's tests: the leak check spares them."""
    mine = _pids() - before
    MODULE_SCOPED.update(mine)
    return mine


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    before = _pids()
    for launcher in fake_launcher(tmp_path_factory.mktemp("fakes")):
        def start(*args: str) -> str:
            return launcher.launch(FakeProcess, "fakes.llama_server", ["-a", "tiny", "--tokens-per-second", "0",
                                                                      *args], ready_path="/health").url
        servers = Servers(start("--max-tokens-default", "4"), start("--reranking"),
                          start("--mmproj", "/models/mmproj-audio.gguf"))
        mine = _spare(before)
        try:
            yield servers
        finally:
            MODULE_SCOPED.difference_update(mine)


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    binary = llama_server_path()  # fails (never skips) with the build command when missing
    where = tmp_path_factory.mktemp("real")
    llama = write_tiny_model(where / "llama.gguf", "llama")
    ranker = write_tiny_model(where / "reranker.gguf", "bert", reranker=True)
    before = _pids()
    with open_bare_llama_server(binary, llama.path, ["-c", "512", "--alias", "tiny"], where / "llama.log") as gen, \
            open_bare_llama_server(binary, ranker.path, ["-c", "512", "--reranking"], where / "rank.log") as rank:
        mine = _spare(before)
        try:
            yield Servers(gen, rank)
        finally:
            MODULE_SCOPED.difference_update(mine)


def post(base: str, path: str, body: object = None, **kwargs: Any) -> httpx.Response:
    if body is not None:
        kwargs["json"] = body
    return httpx.post(base + path, timeout=60, **kwargs)


def sse(text: str) -> list[tuple[str | None, Any]]:
    """A finished stream as (event name or None, parsed data) pairs; ``[DONE]`` stays a string."""
    events = []
    for block in text.split("\n\n"):
        if not block or block.startswith(":"):
            continue
        name, data = None, None
        for line in block.split("\n"):
            field, _, value = line.partition(": ")
            if field == "event":
                name = value
            else:
                assert field == "data", block
                data = value if value == "[DONE]" else json.loads(value)
        events.append((name, data))
    return events


def shape(value: Any) -> Any:
    """Keys and value types, recursively; a list's first item stands for all of them."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(item) for item in value[:1]]
    return type(value).__name__


def assert_same_stream(fake_answer: httpx.Response, real_answer: httpx.Response) -> list[str | None]:
    """Same status, framing, event names in order, and each event's shape; the names."""
    assert (fake_answer.status_code, real_answer.status_code) == (200, 200), (fake_answer.text, real_answer.text)
    assert fake_answer.headers["content-type"] == real_answer.headers["content-type"] == "text/event-stream"
    fake_events, real_events = sse(fake_answer.text), sse(real_answer.text)
    assert [name for name, _ in fake_events] == [name for name, _ in real_events]
    for (name, fake_data), (_, real_data) in zip(fake_events, real_events, strict=True):
        assert shape(fake_data) == shape(real_data), name
    return [name for name, _ in fake_events]


def assert_same_json(fake_answer: httpx.Response, real_answer: httpx.Response) -> Any:
    assert fake_answer.status_code == real_answer.status_code, (fake_answer.text, real_answer.text)
    assert shape(fake_answer.json()) == shape(real_answer.json())
    return fake_answer.json()


def assert_same_error(fake_answer: httpx.Response, real_answer: httpx.Response) -> None:
    assert (fake_answer.status_code, fake_answer.json()) == (real_answer.status_code, real_answer.json())
    assert fake_answer.headers["connection"] == real_answer.headers["connection"] == "close"


# --------------------------------------------------------------------------- OpenAI Responses


def test_responses_with_the_openai_client(fake: Servers) -> None:
    client = openai.OpenAI(base_url=f"{fake.generate}/v1", api_key="x", max_retries=0, timeout=30)
    answer = client.responses.create(model="tiny", input="hello there", max_output_tokens=3)
    assert (answer.status, answer.output_text, answer.model) == ("completed", " the quick brown", "tiny")
    assert answer.id.startswith("resp_") and answer.output[0].id.startswith("msg_")
    # two words in the chat template: its default system prompt, the user's turn, the assistant's start
    assert (answer.usage.input_tokens, answer.usage.output_tokens, answer.usage.total_tokens) == (30, 3, 33)

    events = list(client.responses.create(model="tiny", instructions="be brief", max_output_tokens=2, stream=True,
                                          input=[{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]))
    assert [event.type for event in events] == RESPONSES_EVENTS
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert deltas == [" the", " quick"]
    done = events[-1].response
    assert done.output_text == " the quick" and done.usage.output_tokens == 2
    assert done.usage.input_tokens == 17  # instructions (the system prompt) and input: two turns
    assert {event.item_id for event in events if hasattr(event, "item_id")} == {done.output[0].id}

    counted = client.responses.input_tokens.count(model="tiny", input="hello", instructions="be brief")
    assert counted.input_tokens == 17


def test_responses_stream_framing_without_done(fake: Servers) -> None:
    answer = post(fake.generate, "/responses", {"input": "hi", "max_output_tokens": 2, "stream": True})
    events = sse(answer.text)
    assert [name for name, _ in events] == RESPONSES_EVENTS
    assert all(name == data["type"] for name, data in events)
    assert "[DONE]" not in answer.text
    assert events[-1][1]["timings"]["predicted_n"] == 2 and "timings" not in events[-1][1]["response"]
    assert "timings" not in post(fake.generate, "/v1/responses", {"input": "hi", "max_output_tokens": 1}).json()


def test_responses_quirks_of_a_first_token_that_is_half_a_character(fake: Servers) -> None:
    """llama-server notes the response as created only with token 1's event: when token 1 is
    half a character (not sent), every token that follows announces the response again."""
    answer = post(fake.generate, "/v1/responses", {"input": "FAKE_SPLIT_UTF8", "max_output_tokens": 3, "stream": True})
    names = [name for name, _ in sse(answer.text)]
    assert names[:6] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta", "response.created"]
    assert names.count("response.created") == 2 and names.count("response.output_item.added") == 1


def test_responses_errors_mid_stream_and_in_the_request(fake: Servers) -> None:
    failed = sse(post(fake.generate, "/v1/responses", {"input": "FAKE_ERROR_MIDSTREAM", "stream": True}).text)
    assert failed[-1] == (None, {"error": {"code": 500, "message": "fake mid-stream failure", "type": "server_error"}})
    for body, message in (({"model": "x"}, "'input' is required"),
                          ({"input": 3}, "'input' must be a string or array of objects"),
                          ({"input": [{"role": "tool"}]}, "Cannot determine type of 'item'"),
                          ({"input": [{"role": "user", "content": [{"type": "text"}]}]},
                           "'type' must be one of 'input_text', 'input_image', or 'input_file'"),
                          ({"input": "x", "previous_response_id": "resp_1"},
                           "llama.cpp does not support 'previous_response_id'.")):
        answer = post(fake.generate, "/v1/responses", body)
        assert answer.status_code == 400
        assert answer.json() == {"error": {"code": 400, "message": message, "type": "invalid_request_error"}}


# --------------------------------------------------------------------------- Anthropic Messages


def test_messages_with_the_anthropic_client(fake: Servers) -> None:
    client = anthropic.Anthropic(base_url=fake.generate, api_key="x", max_retries=0, timeout=30)
    message = client.messages.create(model="tiny", max_tokens=2, system=[{"type": "text", "text": "be brief"}],
                                     messages=[{"role": "user", "content": [{"type": "text", "text": "hello"}]}])
    assert (message.type, message.role, message.model, message.stop_reason) == ("message", "assistant", "tiny",
                                                                                "max_tokens")
    assert message.id.startswith("chatcmpl-") and message.content[0].text == " the quick"
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens, message.usage.output_tokens) == (
        17, 0, 2)  # the system prompt and a turn, rendered by the chat template

    events = list(client.messages.create(model="tiny", max_tokens=2, stream=True,
                                         messages=[{"role": "user", "content": "hi"}]))
    assert [event.type for event in events] == MESSAGES_EVENTS
    assert events[0].message.usage.input_tokens == 29  # with the template's default system prompt
    assert [event.delta.text for event in events if event.type == "content_block_delta"] == [" the", " quick"]
    assert (events[-2].delta.stop_reason, events[-2].usage.output_tokens) == ("max_tokens", 2)

    with client.messages.stream(model="tiny", max_tokens=3, messages=[{"role": "user", "content": "hi"}]) as stream:
        assert stream.get_final_text() == " the quick brown"
    assert client.messages.count_tokens(model="tiny", system="be brief",
                                        messages=[{"role": "user", "content": "hello there"}]).input_tokens == 19


def test_messages_without_max_tokens_end_their_turn(fake: Servers) -> None:
    """Anthropic requires max_tokens; llama-server does not (4096). The fake model finishes by
    itself after --max-tokens-default tokens and an end-of-generation token."""
    body = {"messages": [{"role": "user", "content": "hi"}]}
    answer = post(fake.generate, "/v1/messages", body).json()
    assert answer["stop_reason"] == "end_turn" and answer["usage"]["output_tokens"] == 4 + 1
    assert answer["content"] == [{"type": "text", "text": " the quick brown fox"}]
    events = sse(post(fake.generate, "/v1/messages", {**body, "stream": True}).text)
    assert [name for name, _ in events].count("content_block_delta") == 4  # the end token shows nothing
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"


def test_messages_stream_framing_errors_and_quirks(fake: Servers) -> None:
    answer = post(fake.generate, "/v1/messages", {"max_tokens": 2, "stream": True,
                                                 "messages": [{"role": "user", "content": "hi"}]})
    assert "ping" not in answer.text and "[DONE]" not in answer.text
    assert all(name == data["type"] for name, data in sse(answer.text))
    failed = sse(post(fake.generate, "/v1/messages", {"stream": True, "max_tokens": 9, "messages": [
        {"role": "user", "content": "FAKE_ERROR_MIDSTREAM"}]}).text)
    assert failed[-1] == ("error", {"code": 500, "message": "fake mid-stream failure", "type": "server_error"})
    # message_start comes only with token 1's event: none at all when token 1 is half a character.
    split = sse(post(fake.generate, "/v1/messages", {"stream": True, "max_tokens": 3, "messages": [
        {"role": "user", "content": "FAKE_SPLIT_UTF8"}]}).text)
    assert [name for name, _ in split][:2] == ["content_block_start", "content_block_delta"]
    missing = post(fake.generate, "/v1/messages", {"model": "x"})
    assert (missing.status_code, missing.json()) == (500, {"error": {
        "code": 500, "message": "'messages' is required", "type": "server_error"}})
    nope = post(fake.generate, "/v1/messages", {"messages": "nope", "max_tokens": 2})
    assert nope.status_code == 200 and nope.json()["type"] == "message"  # no conversation, no refusal


# --------------------------------------------------------------------------- rerank


def test_rerank_on_every_path(fake: Servers) -> None:
    body = {"model": "ranker", "query": "a cat", "documents": ["the stock market", "a cat sat", "a dog"],
            "return_documents": True}
    for path in ("/v1/rerank", "/v1/reranking", "/rerank", "/reranking"):
        answer = post(fake.rerank, path, body)
        assert answer.status_code == 200, answer.text
        ranked = answer.json()
        assert (ranked["model"], ranked["object"]) == ("ranker", "list")
        n_tokens = (2 + 3 + 2) + (2 + 3 + 2) + (2 + 2 + 2)  # per pair: [CLS] query [SEP] document
        assert ranked["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
        assert [r["index"] for r in ranked["results"]] == [1, 2, 0]  # both words, one word, none
        assert set(ranked["results"][0]) == {"index", "relevance_score"}  # return_documents: ignored, as real
    top = post(fake.rerank, "/v1/rerank", {**body, "top_n": 1}).json()
    assert [r["index"] for r in top["results"]] == [1] and top["usage"]["prompt_tokens"] == 20
    assert post(fake.rerank, "/v1/rerank", {"query": "a", "documents": ["b"]}).json()["model"] == "tiny"
    again = post(fake.rerank, "/v1/rerank", body).json()
    assert again["results"] == post(fake.rerank, "/v1/rerank", body).json()["results"]  # deterministic


def test_rerank_tei_shape_and_errors(fake: Servers) -> None:
    tei = post(fake.rerank, "/rerank", {"query": "a cat", "texts": ["a dog", "a cat"], "return_text": True}).json()
    assert [set(r) for r in tei] == [{"index", "score", "text"}] * 2
    assert [(r["index"], r["text"]) for r in tei] == [(1, "a cat"), (0, "a dog")]
    for body, status, message in (({"documents": ["a"]}, 400, '"query" must be provided'),
                                  ({"query": 1, "documents": ["a"]}, 400, '"query" must be a string'),
                                  ({"query": "q", "documents": ["a", 2]}, 400,
                                   '"documents" must be a non-empty string array'),
                                  ({"query": "q", "documents": ["a"], "top_n": -1}, 500, "vector::_M_default_append")):
        answer = post(fake.rerank, "/v1/rerank", body)
        assert (answer.status_code, answer.json()["error"]["message"]) == (status, message)
    refused = post(fake.generate, "/v1/rerank", {"query": "q", "documents": ["a"]})
    assert (refused.status_code, refused.json()["error"]["message"]) == (
        501, "This server does not support reranking. Start it with `--reranking`")


# --------------------------------------------------------------------------- transcription


def test_transcription_with_the_openai_client(fake: Servers) -> None:
    client = openai.OpenAI(base_url=f"{fake.audio}/v1", api_key="x", max_retries=0, timeout=30)
    text = client.audio.transcriptions.create(model="tiny", file=("talk.wav", AUDIO, "audio/wav"))
    assert text.text == f"transcript of {len(AUDIO)} bytes"
    answer = post(fake.audio, "/audio/transcriptions", data={"model": "tiny", "language": "en"},
                  files={"file": ("talk.wav", AUDIO, "audio/wav")})
    n_prompt = 38 + 3  # "Transcribe audio to text (language: en)" in the chat template, the audio
    assert answer.json() == {"type": "transcript.text.done", "text": f"transcript of {len(AUDIO)} bytes", "usage": {
        "type": "tokens", "input_tokens": n_prompt, "output_tokens": 5, "total_tokens": n_prompt + 5,
        "input_tokens_details": {"cached_tokens": 0}}}
    assert httpx.get(f"{fake.audio}/props").json()["modalities"] == {"vision": False, "audio": True}


def test_transcription_stream_and_errors(fake: Servers) -> None:
    upload = {"file": ("a.wav", b"RIFF", "audio/wav")}
    stream = sse(post(fake.audio, "/v1/audio/transcriptions", data={"stream": "true", "max_tokens": "2"},
                      files=upload).text)
    assert stream == [(None, {"type": "transcript.text.delta", "delta": "transcript"}),
                      (None, {"type": "transcript.text.delta", "delta": " of"}),
                      (None, {"type": "transcript.text.done", "text": "transcript of", "usage": stream[2][1]["usage"]}),
                      (None, "[DONE]")]
    for data, files, message in (({"model": "x"}, {"notes": ("n.txt", b"x", "text/plain")},
                                  "No input file found for transcription"),
                                 ({"response_format": "text"}, upload,
                                  "Only 'json' response_format is supported for transcription"),
                                 ({"max_tokens": "many"}, upload, "stoul")):
        answer = post(fake.audio, "/v1/audio/transcriptions", data=data, files=files)
        assert (answer.status_code, answer.json()["error"]["message"]) == (400, message)
    as_json = post(fake.audio, "/v1/audio/transcriptions", {"model": "x"})  # read as JSON, like real: no file
    assert as_json.json()["error"]["message"] == "No input file found for transcription"
    cut = post(fake.audio, "/v1/audio/transcriptions", content=b"--b\r\nContent-Dispo",
               headers={"content-type": "multipart/form-data; boundary=b"})
    assert cut.status_code == 400 and "multipart form cannot be read" in cut.json()["error"]["message"]
    deaf = post(fake.generate, "/v1/audio/transcriptions", data={"model": "x"}, files=upload)
    assert (deaf.status_code, deaf.json()["error"]["message"]) == (501, "The current model does not support audio input.")


# --------------------------------------------------------------------------- an encoder cannot generate


GENERATIONS = [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
               ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
               ("/v1/responses", {"input": "hi", "max_output_tokens": 2}),
               ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})]


def test_an_embedding_server_fails_every_generation_with_a_500(fake: Servers) -> None:
    for path, body in GENERATIONS:
        for stream in (False, True):
            answer = post(fake.rerank, path, {**body, "stream": stream})
            assert (answer.status_code, answer.json()) == (500, NO_LOGITS), (path, stream)
            assert answer.headers["content-type"].startswith("application/json")
    assert post(fake.rerank, "/v1/embeddings", {"input": "hi"}).status_code == 200  # what it does serve


def test_token_counters(fake: Servers) -> None:
    chat = post(fake.generate, "/v1/chat/completions/input_tokens", {"messages": [{"role": "user", "content": "a b"}]})
    assert chat.json() == {"input_tokens": 30, "object": "response.input_tokens"}
    assert post(fake.generate, "/responses/input_tokens", {"input": "a b"}).json() == chat.json()
    assert post(fake.generate, "/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "a b"}]}
                ).json() == {"input_tokens": 30}


# --------------------------------------------------------------------------- against the real llama-server


def test_responses_match_the_real_server(fake: Servers, real: Servers) -> None:
    body = {"input": [{"role": "user", "content": "hello"}], "instructions": "be brief", "max_output_tokens": 2,
            **GREEDY}
    answer = assert_same_json(post(fake.generate, "/v1/responses", body), post(real.generate, "/v1/responses", body))
    assert answer["status"] == "completed"
    stream = {**body, "stream": True}
    names = assert_same_stream(post(fake.generate, "/v1/responses", stream), post(real.generate, "/v1/responses",
                                                                                   stream))
    assert names == RESPONSES_EVENTS
    counted = assert_same_json(post(fake.generate, "/v1/responses/input_tokens", body),
                               post(real.generate, "/v1/responses/input_tokens", body))
    assert counted["object"] == "response.input_tokens"
    for bad in ({"model": "x"}, {"input": 3}, {"input": [{"role": "tool"}]}, {"input": "x", "previous_response_id": "r"}):
        assert_same_error(post(fake.generate, "/v1/responses", bad), post(real.generate, "/v1/responses", bad))


def test_messages_match_the_real_server(fake: Servers, real: Servers) -> None:
    body = {"model": "x", "max_tokens": 2, "system": "be brief", **GREEDY,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]}
    answer = assert_same_json(post(fake.generate, "/v1/messages", body), post(real.generate, "/v1/messages", body))
    assert answer["stop_reason"] == "max_tokens"
    stream = {**body, "stream": True}
    names = assert_same_stream(post(fake.generate, "/v1/messages", stream), post(real.generate, "/v1/messages", stream))
    assert names == MESSAGES_EVENTS
    assert_same_json(post(fake.generate, "/v1/messages/count_tokens", body),
                     post(real.generate, "/v1/messages/count_tokens", body))
    assert_same_error(post(fake.generate, "/v1/messages", {"model": "x"}),
                      post(real.generate, "/v1/messages", {"model": "x"}))
    nope = {"messages": "nope", "max_tokens": 2, **GREEDY}
    assert post(fake.generate, "/v1/messages", nope).status_code == post(real.generate, "/v1/messages", nope).status_code


def test_rerank_matches_the_real_server(fake: Servers, real: Servers) -> None:
    jina = {"model": "ranker", "query": "a cat", "documents": ["a dog", "a cat sat", "the end"], "top_n": 2}
    answer = assert_same_json(post(fake.rerank, "/v1/rerank", jina), post(real.rerank, "/v1/rerank", jina))
    assert len(answer["results"]) == 2
    real_scores = [r["relevance_score"] for r in post(real.rerank, "/v1/rerank", jina).json()["results"]]
    assert real_scores == sorted(real_scores, reverse=True)
    tei = {"query": "a cat", "texts": ["a dog", "a cat"], "return_text": True}
    assert_same_json(post(fake.rerank, "/rerank", tei), post(real.rerank, "/rerank", tei))
    for bad in ({"documents": ["a"]}, {"query": 1, "documents": ["a"]}, {"query": "q", "documents": "a"},
                {"query": "q", "documents": ["a"], "top_n": -1}):
        assert_same_error(post(fake.rerank, "/v1/rerank", bad), post(real.rerank, "/v1/rerank", bad))


def test_refusals_match_the_real_server(fake: Servers, real: Servers) -> None:
    upload = {"data": {"model": "x"}, "files": {"file": ("a.wav", b"RIFF0000WAVE", "audio/wav")}}
    assert_same_error(post(fake.generate, "/v1/audio/transcriptions", **upload),
                      post(real.generate, "/v1/audio/transcriptions", **upload))
    for path, body in (("/v1/rerank", {"query": "q", "documents": ["a"]}), ("/v1/embeddings", {"input": "a"})):
        assert_same_error(post(fake.generate, path, body), post(real.generate, path, body))
    for path, body in GENERATIONS:
        for stream in (False, True):
            assert_same_error(post(fake.rerank, path, {**body, "stream": stream}),
                              post(real.rerank, path, {**body, "stream": stream}))
