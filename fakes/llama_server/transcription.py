"""OpenAI's audio transcription (``/v1/audio/transcriptions``) the way llama-server serves it.

Without a multimodal projector llama-server answers 501 "The current model does not support
audio input." before reading the request; the fake does so unless started with ``--mmproj``
(any path: it is never read). With one, the multipart form (``file``, ``model``, ``prompt``,
``language``, ``response_format``, ``stream``, ``max_tokens``, ``temperature``: all strings)
becomes a chat request that carries the audio. The answer is ``{"type":
"transcript.text.done", "text", "usage"}``; a stream (``stream=true``) sends ``data:
{"type": "transcript.text.delta", "delta"}`` per token, the done object, then ``data:
[DONE]``. Only ``response_format=json`` is accepted.

The fake's transcript of an upload of N bytes is "transcript of N bytes" (a token per word,
then the end of generation); the audio costs a token per started KiB. The form is parsed
with werkzeug's multipart parser (werkzeug comes with quart).
"""

from __future__ import annotations

import io
import re
from typing import Any

import attrs
from werkzeug.formparser import MultiPartParser
from werkzeug.http import parse_options_header

from fakes.http11 import Request
from fakes.llama_server.cli import Config
from fakes.llama_server.errors import invalid_request
from fakes.llama_server.formats import DataEvents, Outcome
from fakes.llama_server.parsing import Job, body_json, build_job, user_chat

ASR_PROMPT = "Transcribe audio to text"  # llama-server's default user prompt for transcription
AUDIO_BYTES_PER_TOKEN = 1024
MAX_FORM_PARTS = 100


@attrs.frozen
class Upload:
    """A transcription request: its form fields (as llama-server sees them) and the uploaded file."""

    fields: dict[str, Any]  # strings; a repeated name holds a list of them
    file: bytes | None


def read_upload(request: Request) -> Upload:
    """The multipart form; any other body is read as JSON, like llama-server does (so: no file)."""
    mimetype, options = parse_options_header(request.headers.get("content-type", ""))
    if mimetype != "multipart/form-data":
        return Upload(body_json(request), None)
    boundary = options.get("boundary")
    if not boundary:
        raise invalid_request("a multipart/form-data body needs a boundary")
    parser = MultiPartParser(max_form_parts=MAX_FORM_PARTS)
    try:
        form, files = parser.parse(io.BytesIO(request.body), boundary.encode("latin-1"), len(request.body))
    except ValueError as exc:  # werkzeug's word for a malformed form (RequestEntityTooLarge is one too)
        raise invalid_request(f"the multipart form cannot be read: {exc}") from None
    fields = {name: values[0] if len(values) == 1 else values for name, values in form.lists()}
    upload = files.get("file")
    try:
        return Upload(fields, None if upload is None else upload.read())
    finally:
        for storage in files.values():
            storage.close()


def transcription_job(upload: Upload, cfg: Config) -> Job:
    if upload.file is None:
        raise invalid_request("No input file found for transcription")
    fields = upload.fields
    if _field(fields, "response_format", "json") != "json":
        raise invalid_request("Only 'json' response_format is supported for transcription")
    prompt = _field(fields, "prompt", "") or ASR_PROMPT
    if language := _field(fields, "language", ""):
        prompt += f" (language: {language})"
    chat: dict[str, Any] = {"stream": _field(fields, "stream", "false") == "true"}
    if "max_tokens" in fields:
        chat["max_tokens"] = _stoul(fields["max_tokens"])
    if "temperature" in fields:
        _stof(fields["temperature"])  # only checked: the fake does not sample
    n_audio = -(-len(upload.file) // AUDIO_BYTES_PER_TOKEN)
    job = build_job(chat, cfg, prompt, user_chat(prompt).n_tokens + n_audio)
    return attrs.evolve(job, answer=("transcript", " of", f" {len(upload.file)}", " bytes"))


def _field(fields: dict[str, Any], name: str, default: str) -> str:
    value = fields.get(name, default)
    return value if isinstance(value, str) else default  # a repeated field is not a string: ignored


_STOUL = re.compile(r"\s*([+-]?)(\d+)")


def _stoul(value: object) -> int:
    """C++ std::stoul: leading digits count, the rest is ignored; a minus wraps around (no limit)."""
    match = _STOUL.match(value) if isinstance(value, str) else None
    if match is None:
        raise invalid_request("stoul")
    return -1 if match.group(1) == "-" else int(match.group(2))


def _stof(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise invalid_request("stof") from None


@attrs.define(eq=False)
class TranscriptionFormat(DataEvents):
    """The transcript, streamed as bare ``data:`` events that end with ``[DONE]``."""

    ends_with_done = True

    def token_events(self, piece: str, n_decoded: int, slot_id: int) -> list[dict[str, Any]]:
        return [{"type": "transcript.text.delta", "delta": piece}]

    def final_events(self, out: Outcome) -> list[dict[str, Any]]:
        return [self.response(out)]

    def response(self, out: Outcome) -> dict[str, Any]:
        return {"type": "transcript.text.done", "text": out.text, "usage": {
            "type": "tokens", "input_tokens": out.n_prompt, "output_tokens": out.n_decoded,
            "total_tokens": out.n_prompt + out.n_decoded, "input_tokens_details": {"cached_tokens": 0}}}
