"""The new APIs' pure parts: which route speaks what, requests read and routed (JSON and
multipart forms), what a model serves by default, errors reshaped for Anthropic's clients,
and the token counts of a Messages stream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters import model_apis
from fakes.tiny_gguf import write_tiny_model
from supervisor.apis import GENERATION, Api, ModelKind, model_kind
from supervisor.config import ConfigError, ModelConfig, parse_config
from supervisor.gateway.openai.api_routes import API_ROUTES, error_shape_for
from supervisor.gateway.http.asgi import RequestError
from supervisor.gateway.door import _read_tokens
from supervisor.gateway.errors import anthropic_error_body, anthropic_stream_error, responses_stream_error
from supervisor.gateway.openai.forms import parse_form
from supervisor.gateway.relay.reshaped import MessagesUsageRead, errors_reshaped
from supervisor.gateway.routed import NotHere, route_request
from tests.tapped import fed

ALIASES = {"chat": "chat", "gpt-4o": "chat", "whisper": "asr"}


def scope(path: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    return {"path": path, "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]}


def form_request(fields: dict[str, str], audio: bytes = b"RIFF\x00\x01audio--") -> tuple[str, bytes]:
    request = httpx.Request("POST", "http://steward/v1/audio/transcriptions", data=fields,
                            files={"file": ("a.wav", audio, "audio/wav")})
    return request.headers["content-type"], request.read()


def test_every_route_has_its_api_and_error_shape() -> None:
    assert {path: route.api for path, route in API_ROUTES.items()} == {
        "/v1/chat/completions": Api.CHAT, "/v1/completions": Api.COMPLETIONS, "/v1/embeddings": Api.EMBEDDINGS,
        "/v1/responses": Api.RESPONSES, "/v1/responses/input_tokens": Api.RESPONSES, "/v1/messages": Api.MESSAGES,
        "/v1/messages/count_tokens": Api.MESSAGES, "/v1/rerank": Api.RERANK, "/v1/reranking": Api.RERANK,
        "/rerank": Api.RERANK, "/v1/audio/transcriptions": Api.TRANSCRIPTION, "/v1/audio/speech": Api.SPEECH}
    anthropic = json.loads(error_shape_for({"path": "/v1/messages/count_tokens"})(404, "no such model"))
    assert anthropic == {"type": "error", "error": {"type": "not_found_error", "message": "no such model"}}
    openai_shaped = json.loads(error_shape_for({"path": "/v1/responses"})(400, "bad", code="x"))
    assert openai_shaped == {"error": {"message": "bad", "type": "invalid_request_error", "param": None, "code": "x"}}


@pytest.mark.parametrize("path", ["/v1/messages/batches", "/v1/messages//count_tokens", "/v1/messages/count_tokens/",
                                  "/v1/messages\0"])
def test_paths_under_the_messages_routes_are_answered_in_anthropic_s_shape(path: str) -> None:
    # The listener fuzzer found 404s and 401s under /v1/messages/ in OpenAI's shape (issue 26).
    assert json.loads(error_shape_for({"path": path})(404, "Unknown route."))["type"] == "error"
    assert set(json.loads(error_shape_for({"path": "/v1/models/x"})(404, "Unknown route."))) == {"error"}  # OpenAI's


@pytest.mark.parametrize(("status", "kind"), [(400, "invalid_request_error"), (401, "authentication_error"),
                                              (403, "permission_error"), (413, "request_too_large"),
                                              (429, "rate_limit_error"), (503, "overloaded_error"),
                                              (504, "timeout_error"), (502, "api_error")])
def test_anthropic_error_types_follow_the_status(status: int, kind: str) -> None:
    assert json.loads(anthropic_error_body(status, "m"))["error"]["type"] == kind


def test_stream_errors_in_each_apis_own_event() -> None:
    event = anthropic_stream_error(b"text/event-stream", "engine 'chat' failed")
    assert event.startswith(b"event: error\ndata: ") and event.endswith(b"\n\n")
    assert json.loads(event.split(b"data: ", 1)[1]) == {
        "type": "error", "error": {"type": "api_error", "message": "engine 'chat' failed"}}
    responses = responses_stream_error(b"text/event-stream", "stalled", code="engine_timeout")
    assert json.loads(responses.split(b"data: ", 1)[1]) == {
        "type": "error", "code": "engine_timeout", "message": "stalled", "param": None, "sequence_number": 0}


def test_a_json_request_on_a_new_route_is_routed_like_chat() -> None:
    body = json.dumps({"model": "gpt-4o@batch", "max_tokens": 4, "messages": [], "stream": True}).encode()
    routed = route_request(scope("/v1/messages"), body, ALIASES)
    assert (routed.model, routed.name, routed.klass, routed.stream) == ("chat", "gpt-4o", "batch", True)
    # Anthropic streams carry their usage unasked: no stream_options added to them.
    assert json.loads(routed.body) == {"model": "gpt-4o", "max_tokens": 4, "messages": [], "stream": True}
    assert not routed.keep_usage_chunk
    untouched = json.dumps({"model": "chat", "input": "hi"}).encode()
    assert route_request(scope("/v1/responses", {"x-steward-class": "background"}), untouched, ALIASES).body \
        is untouched
    unknown = route_request(scope("/v1/rerank"), json.dumps({"model": "nope", "query": "q"}).encode(), ALIASES)
    assert isinstance(unknown, NotHere) and unknown.name == "nope"
    assert unknown.request.body_naming("chat@node") == b'{"model": "chat@node", "query": "q"}'
    refusal = unknown.refusal()  # when no node serves it either
    assert (refusal.status, refusal.code, refusal.param) == (404, "model_not_found", "model")


@pytest.mark.parametrize(("body", "message"), [(b"[1]", "must be a JSON object"), (b"{", "could not parse"),
                                               (b'{"input": "x"}', "model parameter")])
def test_bad_json_bodies_are_400s(body: bytes, message: str) -> None:
    with pytest.raises(RequestError) as refused:
        route_request(scope("/v1/responses"), body, ALIASES)
    assert refused.value.status == 400 and message in refused.value.message


def test_a_form_is_routed_by_its_model_field_and_goes_on_byte_for_byte() -> None:
    content_type, body = form_request({"model": "whisper", "language": "en"})
    routed = route_request(scope("/v1/audio/transcriptions", {"content-type": content_type}), body, ALIASES)
    assert (routed.model, routed.klass, routed.stream) == ("asr", "interactive", False)
    assert routed.body is body and routed.content_type == content_type.encode()


@pytest.mark.parametrize(("fields", "klass"), [({"model": "whisper@batch"}, "batch"),
                                               ({"model": "whisper", "steward": '{"class": "background"}'},
                                                "background")])
def test_a_forms_class_is_read_and_steward_s_own_bits_removed(fields: dict[str, str], klass: str) -> None:
    content_type, body = form_request(fields)
    routed = route_request(scope("/v1/audio/transcriptions", {"content-type": content_type}), body, ALIASES,
                           {"asr": "openai/whisper-tiny"})
    assert routed.klass == klass
    parts = parse_form(content_type, routed.body)
    assert parts.value("model") == "openai/whisper-tiny"  # the engine's own name for it
    assert parts.value("steward") is None
    assert [part.name for part in parts.parts] == ["model", "file"]
    assert parts.parts[-1].data == b"RIFF\x00\x01audio--" and parts.parts[-1].filename == "a.wav"


@pytest.mark.parametrize(("content_type", "body", "message"), [
    ("application/json", b"{}", "multipart/form-data"),
    ("multipart/form-data", b"", "multipart/form-data"),  # no boundary
    ("multipart/form-data; boundary=x", b"--x\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwh",
     "cut short or malformed"),
])
def test_bad_forms_are_400s(content_type: str, body: bytes, message: str) -> None:
    with pytest.raises(RequestError) as refused:
        route_request(scope("/v1/audio/transcriptions", {"content-type": content_type}), body, ALIASES)
    assert refused.value.status == 400 and message in refused.value.message


def test_a_form_of_more_than_a_thousand_parts_is_a_413() -> None:
    """Issue 26: werkzeug refuses a form past max_parts with RequestEntityTooLarge, not ValueError:
    it escaped as a 500. Now it is a 413 like any body too large (the route gives it its shape)."""
    parts = b"".join(b'--x\r\nContent-Disposition: form-data; name="f%d"\r\n\r\nv\r\n' % i for i in range(1001))
    body = b'--x\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper\r\n' + parts + b"--x--\r\n"
    with pytest.raises(RequestError) as refused:
        route_request(scope("/v1/audio/transcriptions", {"content-type": "multipart/form-data; boundary=x"}), body,
                      ALIASES)
    assert (refused.value.status, refused.value.code) == (413, "request_too_large")
    assert "more than 1000 parts" in refused.value.message
    few = body.replace(parts, parts[: parts.index(b"--x", 10)])  # the model and one more part: read as ever
    assert route_request(scope("/v1/audio/transcriptions", {"content-type": "multipart/form-data; boundary=x"}), few,
                         ALIASES).model == "asr"


def test_a_form_without_a_model_or_with_a_bad_class_is_a_400() -> None:
    content_type, body = form_request({"language": "en"})
    with pytest.raises(RequestError, match="model field"):
        route_request(scope("/v1/audio/transcriptions", {"content-type": content_type}), body, ALIASES)
    content_type, body = form_request({"model": "whisper", "steward": "batch"})
    with pytest.raises(RequestError, match="'steward' must be an object"):
        route_request(scope("/v1/audio/transcriptions", {"content-type": content_type}), body, ALIASES)


def model(**config: Any) -> ModelConfig:
    return ModelConfig(**{"command": ["llama-server"], "memory": 1, **config})


@pytest.mark.parametrize(("config", "apis"), [
    ({}, GENERATION),
    ({"args": ["--embeddings"]}, {Api.EMBEDDINGS}),
    ({"args": ["--embedding", "--pooling", "rank"]}, {Api.RERANK}),
    ({"args": ["--reranking"]}, {Api.RERANK}),
    ({"args": ["--pooling", "rank"]}, GENERATION),  # rank pooling alone: the real server does not rerank
    ({"args": ["--mmproj", "audio.gguf"]}, GENERATION | {Api.TRANSCRIPTION}),
    ({"args": ["--embeddings"], "serves": ["embeddings", "chat"]}, {Api.EMBEDDINGS, Api.CHAT}),
    ({"runtime": "openai", "command": ["vllm", "serve", "m", "--port", "${PORT}"]}, GENERATION),
    ({"runtime": "openai", "command": ["vllm", "serve", "m", "--runner", "pooling", "--port", "${PORT}"]},
     {Api.EMBEDDINGS}),
])
def test_what_a_model_serves_by_default_and_when_told(config: dict[str, Any], apis: set[Api]) -> None:
    assert model_apis(model(**config)) == apis


def test_an_embedding_flag_on_a_decoder_keeps_it_generating(tmp_path: Path) -> None:
    decoder = write_tiny_model(tmp_path / "llama.gguf", "llama")
    encoder = write_tiny_model(tmp_path / "bert.gguf", "bert")
    assert model_apis(model(model=str(decoder.path), args=["--embeddings"])) == GENERATION | {Api.EMBEDDINGS}
    assert model_apis(model(model=str(encoder.path), args=["--embeddings"])) == {Api.EMBEDDINGS}
    assert model_apis(model(model=str(tmp_path / "missing.gguf"), args=["--embeddings"])) == {Api.EMBEDDINGS}


def test_what_a_model_is_for() -> None:
    assert model_kind(GENERATION) is ModelKind.CHAT
    assert model_kind({Api.EMBEDDINGS}) is ModelKind.EMBEDDING
    assert model_kind({Api.RERANK}) is ModelKind.RERANK
    assert model_kind({Api.TRANSCRIPTION}) is ModelKind.TRANSCRIPTION


@pytest.mark.parametrize(("serves", "problem"), [
    ([], "models.m.serves: name the APIs it serves"),
    (["chat", "images"], "models.m.serves[1]: must be one of"),
])
def test_a_bad_serves_list_names_the_key(serves: list[str], problem: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config({"models": {"m": {"command": ["llama-server"], "memory": "1GiB", "serves": serves}}})
    assert any(problem in line for line in refused.value.problems), refused.value.problems


class Sent(list[dict[str, Any]]):
    async def __call__(self, message: dict[str, Any]) -> None:
        self.append(message)


async def test_an_engine_error_on_an_anthropic_route_is_reshaped() -> None:
    sent = Sent()
    reshaped = fed(sent, errors_reshaped(anthropic_error_body))
    engine = json.dumps({"error": {"code": 500, "message": "the current context does not support logits "
                                   "computation. skipping", "type": "server_error"}}).encode()
    await reshaped({"type": "http.response.start", "status": 500,
                    "headers": [(b"content-type", b"application/json; charset=utf-8"),
                                (b"content-length", str(len(engine)).encode())]})
    await reshaped({"type": "http.response.body", "body": engine[:20], "more_body": True})
    await reshaped({"type": "http.response.body", "body": engine[20:], "more_body": False})
    assert sent[0]["status"] == 500
    body = json.loads(sent[1]["body"])
    assert body == {"type": "error", "error": {"type": "api_error", "message": "the current context does not "
                                                                              "support logits computation. skipping"}}
    assert dict(sent[0]["headers"])[b"content-length"] == str(len(sent[1]["body"])).encode()


@pytest.mark.parametrize(("status", "content_type", "body"), [
    (200, b"text/event-stream", b"event: message_stop\n"),  # a success: never held
    (502, b"application/json", b"[not an error object]"),  # an error it cannot read: as it came
])
async def test_what_is_no_readable_error_goes_through_as_it_came(status: int, content_type: bytes,
                                                                 body: bytes) -> None:
    sent = Sent()
    reshaped = fed(sent, errors_reshaped(anthropic_error_body))
    messages = [{"type": "http.response.start", "status": status, "headers": [(b"content-type", content_type)]},
                {"type": "http.response.body", "body": body, "more_body": status == 200}]
    for message in messages:
        await reshaped(message)
    assert sent == messages


async def test_a_messages_stream_s_tokens_are_read_from_its_two_events() -> None:
    counted: list[tuple[int | None, int | None]] = []
    sent = Sent()
    read = fed(sent, MessagesUsageRead(lambda prompt, completion: counted.append((prompt, completion))))
    start = {"type": "message_start", "message": {"id": "m", "usage": {"cache_read_input_tokens": 15,
                                                                      "input_tokens": 1, "output_tokens": 0}}}
    await read({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    await read({"type": "http.response.body", "more_body": True,
                "body": b"event: message_start\ndata: " + json.dumps(start).encode() + b"\n\n"})
    await read({"type": "http.response.body", "more_body": True,
                "body": b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
                        b'"delta":{"type":"text_delta","text":"hi"}}\n\n'})
    await read({"type": "http.response.body", "more_body": True,
                "body": b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"max_tokens"},'
                        b'"usage":{"output_tokens":4}}\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n'})
    assert counted == [(16, 0), (16, 4)]
    assert len(sent) == 4  # nothing held, nothing changed


def test_the_door_reads_anthropic_and_responses_token_counts() -> None:
    anthropic = b'"usage":{"cache_read_input_tokens":6,"input_tokens":10,"output_tokens":4}}'
    assert _read_tokens(anthropic) == (16, 4)
    responses = b'"usage":{"input_tokens":18,"output_tokens":4,"total_tokens":22,' \
                b'"input_tokens_details":{"cached_tokens":17}}}'
    assert _read_tokens(responses) == (18, 4)
