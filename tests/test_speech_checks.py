"""Speech without a process: the body steward checks (gateway/openai/speech.py), the seconds it reads
from the audio going by (relay/speech_audio.py), the config's ``voices``, ``steward check``'s line.
"""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path
from typing import Any

import pytest

from fakes.speech_server.audio import frames, tone, wav_header
from supervisor.apis import Api, ModelKind, model_kind
from supervisor.config import ConfigError, parse_config
from supervisor.gateway.http.asgi import RequestError
from supervisor.gateway.openai.api_routes import API_ROUTES
from supervisor.gateway.openai.speech import AudioFormat, StreamFormat, check_speech, read_speech
from supervisor.gateway.relay.answer import AnswerHead
from supervisor.gateway.relay.speech_audio import AudioMeasured, AudioMeter
from tests.test_cli import steward, write

GOOD = {"model": "tts", "input": "hello", "voice": "alloy"}


def test_a_good_body_is_read_with_openais_defaults() -> None:
    speech = check_speech(GOOD)
    assert (speech.input_chars, speech.voice, speech.audio_format, speech.stream_format) == (
        5, "alloy", AudioFormat.MP3, StreamFormat.AUDIO)
    custom = check_speech({**GOOD, "voice": {"id": "voice_1234"}, "response_format": "pcm", "speed": 4,
                           "stream_format": "sse", "instructions": "calmly", "lang_code": "a"})
    assert (custom.voice, custom.audio_format, custom.stream_format) == ("voice_1234", AudioFormat.PCM,
                                                                         StreamFormat.SSE)
    assert check_speech({**GOOD, "input": "x" * 4096}).input_chars == 4096
    assert API_ROUTES["/v1/audio/speech"].api is Api.SPEECH and model_kind({Api.SPEECH}) is ModelKind.SPEECH


@pytest.mark.parametrize(("change", "param", "code"), [
    ({"input": ""}, "input", "empty_string"), ({"input": "x" * 4097}, "input", "string_above_max_length"),
    ({"input": None}, "input", "missing_required_parameter"), ({"input": ["a"]}, "input", "invalid_type"),
    ({"instructions": "y" * 4097}, "instructions", "string_above_max_length"),
    ({"instructions": 3}, "instructions", "invalid_type"),
    ({"voice": None}, "voice", "missing_required_parameter"), ({"voice": ""}, "voice", "invalid_value"),
    ({"voice": 7}, "voice", "invalid_type"), ({"voice": {"id": "a", "x": 1}}, "voice", "invalid_type"),
    ({"voice": "nova"}, "voice", "invalid_value"),  # not among the model's voices
    ({"response_format": "ogg"}, "response_format", "invalid_value"),
    ({"response_format": ["wav"]}, "response_format", "invalid_value"),
    ({"speed": 0.2}, "speed", "invalid_value"), ({"speed": 4.01}, "speed", "invalid_value"),
    ({"speed": "1"}, "speed", "invalid_type"), ({"speed": True}, "speed", "invalid_type"),
    ({"stream_format": "chunks"}, "stream_format", "invalid_value"),
])
def test_each_bad_parameter_is_a_400_naming_it(change: dict[str, Any], param: str, code: str) -> None:
    body = {k: v for k, v in ({**GOOD} | change).items() if v is not None}
    with pytest.raises(RequestError) as refused:
        check_speech(body, ["alloy", "af_heart"])
    assert (refused.value.status, refused.value.param, refused.value.code) == (400, param, code)
    assert read_speech(body) is None or param == "voice"  # the reader measures what it can read


def test_a_voice_not_listed_is_named_with_the_ones_that_are() -> None:
    with pytest.raises(RequestError, match="'nova' is not a voice of this model. Supported values are: 'alloy'"):
        check_speech({**GOOD, "voice": "nova"}, ["alloy"])
    assert check_speech({**GOOD, "voice": "nova"}).voice == "nova"  # no list: the engine says


def fed(meter: AudioMeter, data: bytes, piece: int) -> float | None:
    for at in range(0, len(data), piece):
        meter.feed(data[at:at + piece])
    return meter.seconds()


@pytest.mark.parametrize("piece", [1, 3, 44, 45, 1000, 10**6])
def test_a_wavs_seconds_whatever_pieces_it_comes_in(piece: int) -> None:
    count = frames(1.25)
    data = wav_header(count) + tone(count)
    assert fed(AudioMeter(AudioFormat.WAV), data, piece) == 1.25
    cut = data[:44 + 24_000]  # a client that left after half a second of it
    assert fed(AudioMeter(AudioFormat.WAV), cut, piece) == 0.5


def test_a_wav_with_more_chunks_before_its_data_and_stereo() -> None:
    fmt = struct.pack("<HHIIHH", 1, 2, 16_000, 64_000, 4, 16)
    data = (b"RIFF" + struct.pack("<I", 0) + b"WAVE" + b"LIST" + struct.pack("<I", 3) + b"abc\0"
            + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", 0xFFFFFFFF) + b"\0" * 32_000)
    assert fed(AudioMeter(AudioFormat.WAV), data, 7) == 0.5  # the bytes count, not the length announced


def test_pcm_flac_and_the_formats_not_measured() -> None:
    assert fed(AudioMeter(AudioFormat.PCM), tone(36_000), 999) == 1.5  # 36,000 samples at 24 kHz
    info = (44_100 << 44) | (1 << 41) | (15 << 36) | 88_200  # rate, mono, 16-bit, 2 s of samples
    flac = b"fLaC" + bytes([0x80, 0, 0, 34]) + b"\0" * 10 + info.to_bytes(8, "big") + b"\0" * 16 + b"\xff\xf8"
    assert fed(AudioMeter(AudioFormat.FLAC), flac, 5) == 2.0
    for unmeasured in (AudioFormat.MP3, AudioFormat.OPUS, AudioFormat.AAC):
        assert fed(AudioMeter(unmeasured), b"\xff\xfb" * 5000, 100) is None
    assert fed(AudioMeter(AudioFormat.WAV), b"OggS" + b"\0" * 100, 10) is None  # not what it says it is
    assert fed(AudioMeter(AudioFormat.WAV), b"RIFF\0\0\0\0WAVE" + b"junk" + b"\xff" * 70_000, 1000) is None


def test_the_reader_passes_every_byte_and_reads_sse_deltas() -> None:
    seen: list[float | None] = []
    reader = AudioMeasured(check_speech({**GOOD, "response_format": "pcm", "stream_format": "sse"}), seen.append)
    head = AnswerHead.of(200, [(b"content-type", b"text/event-stream")])
    assert reader.start(head) is head and reader.reading
    events = b"".join(b"data: " + json.dumps({"type": "speech.audio.delta",
                                              "audio": base64.b64encode(tone(6_000)).decode()}).encode() + b"\n\n"
                      for _ in range(3))
    events += b'data: {"type": "speech.audio.done", "usage": {"input_tokens": 1}}\n\n'
    passed = b"".join(reader.body(events[at:at + 50], True)[1] for at in range(0, len(events), 50))
    assert passed == events and seen[-1] == 0.75
    refused = AudioMeasured(check_speech(GOOD), seen.append)
    refused.start(AnswerHead.of(400, [(b"content-type", b"application/json")]))
    assert not refused.reading


def test_voices_belong_to_a_speech_model(tmp_path: Path) -> None:
    speech = {"runtime": "openai", "command": ["x", "${PORT}"], "memory": "1GiB", "serves": ["speech"]}
    assert parse_config({"models": {"tts": {**speech, "voices": ["af_heart"]}}}).models["tts"].voices == ["af_heart"]
    for model, problem in [({**speech, "serves": ["chat"], "voices": ["a"]}, "only a speech model has voices"),
                           ({**speech, "voices": []}, "name its voices"),
                           ({**speech, "voices": ["a\u200bb"]}, r"voices\[0\]: .* invisible")]:
        with pytest.raises(ConfigError, match=problem):
            parse_config({"models": {"tts": model}})


def test_check_says_what_a_speech_model_serves_and_its_voices(tmp_path: Path) -> None:
    path = write(tmp_path, {"gpu": {"probe": "none", "budget": "4GiB"}, "models": {
        "tts": {"runtime": "openai", "command": ["python3", "${PORT}"], "memory": "1GiB", "serves": ["speech"],
                "voices": ["af_heart", "alloy"]},
        "embed": {"command": "llama-server", "memory": "0.4GiB", "args": ["--embeddings"]}}})
    result = steward("check", path)
    assert result.returncode == 0, result.stderr
    assert "  serves   speech; voices af_heart, alloy" in result.stdout
    assert "  serves   embeddings (kind embedding)" in result.stdout
