"""Speech without a process: the body steward checks (gateway/openai/speech.py), the seconds it reads
from the audio going by (relay/speech_audio.py), the config's ``voices``, ``steward check``'s line.
"""

from __future__ import annotations

import base64
import io
import json
import struct
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import av

from fakes.speech_server.audio import SAMPLE_RATE, frames, tone, wav_header
from fakes.speech_server import server as fake_server
from fakes.speech_server.encode import ENCODED, WRITTEN, AudioWriter
from supervisor.apis import Api, ModelKind, model_kind
from supervisor.config import ConfigError, parse_config
from supervisor.gateway.http.asgi import RequestError
from supervisor.gateway.openai.api_routes import API_ROUTES
from supervisor.gateway.openai.speech import AudioFormat, StreamFormat, check_speech, read_speech
from supervisor.gateway.relay.answer import AnswerHead
from supervisor.gateway.relay.speech_audio import AudioMeasured, AudioMeter
from tests.test_cli import steward, write

GOOD = {"model": "tts", "input": "hello", "voice": "alloy"}
FAKE = fake_server.parse_config([])


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


def test_pcm_flac_and_what_is_not_audio() -> None:
    assert fed(AudioMeter(AudioFormat.PCM), tone(36_000), 999) == 1.5  # 36,000 samples at 24 kHz
    info = (44_100 << 44) | (1 << 41) | (15 << 36) | 88_200  # rate, mono, 16-bit, 2 s of samples
    flac = b"fLaC" + bytes([0x80, 0, 0, 34]) + b"\0" * 10 + info.to_bytes(8, "big") + b"\0" * 16 + b"\xff\xf8"
    assert fed(AudioMeter(AudioFormat.FLAC), flac, 5) == 2.0
    for framed in (AudioFormat.MP3, AudioFormat.OPUS, AudioFormat.AAC):
        assert fed(AudioMeter(framed), b"\xff\xfa" * 5000, 100) is None  # no frame, no Ogg page: not guessed
    assert fed(AudioMeter(AudioFormat.WAV), b"OggS" + b"\0" * 100, 10) is None  # not what it says it is
    assert fed(AudioMeter(AudioFormat.WAV), b"RIFF\0\0\0\0WAVE" + b"junk" + b"\xff" * 70_000, 1000) is None


# What a decoder reads of each encoded format, beyond the samples made: mp3 and aac carry the
# encoder's delay and padding (no tag says them), in whole frames; opus's granules trim them.
FRAME = {"mp3": 576, "aac": 1024, "opus": 0, "flac": 0, "wav": 0}  # samples per frame at 24 kHz (MPEG-2 layer III)
DECODED_RATE = {"opus": 48_000}  # Ogg Opus decodes at 48 kHz; the others at the 24 kHz they were made at


@attrs.frozen
class Decoded:
    seconds: float
    sample_rate: int
    channels: int


def decode(data: bytes) -> Decoded:
    """*data* decoded by ffmpeg (PyAV): the seconds of samples it gives, their rate and channels."""
    with av.open(io.BytesIO(data)) as container:
        samples, rates, channels = 0, set(), set()
        for frame in container.decode(audio=0):
            samples, rates = samples + frame.samples, rates | {frame.sample_rate}
            channels.add(frame.layout.nb_channels)
    assert len(rates) == 1 and len(channels) == 1, (rates, channels)
    rate = rates.pop()
    return Decoded(samples / rate, rate, channels.pop())


def assert_decodes_as_made(response_format: str, data: bytes, seconds: float) -> Decoded:
    """*data* is *seconds* of the fake's audio in *response_format*, as Kokoro's encoders make it."""
    got = decode(data)
    assert (got.sample_rate, got.channels) == (DECODED_RATE.get(response_format, SAMPLE_RATE), 1)
    extra = 3 * FRAME[response_format] / SAMPLE_RATE  # mp3: 1105 samples of delay, then a frame's padding
    assert seconds - 1e-6 <= got.seconds <= seconds + extra + 1e-6, (response_format, got.seconds, seconds)
    return got


def encoded(response_format: str, seconds: float, piece_seconds: float = 0.2) -> list[bytes]:
    """The pieces the fake sends of *seconds* of audio, made *piece_seconds* at a time (empty ones left out)."""
    writer, total, pieces = AudioWriter(response_format, frames(seconds)), frames(seconds), []
    while writer.made < total:
        pieces.append(writer.write(min(frames(piece_seconds), total - writer.made)))
    pieces.append(writer.finish())
    return [piece for piece in pieces if piece]


@pytest.mark.parametrize("response_format", sorted(ENCODED | {"wav"}))
def test_the_fakes_audio_decodes_to_what_it_made(response_format: str) -> None:
    pieces = encoded(response_format, 2.6)
    assert_decodes_as_made(response_format, b"".join(pieces), 2.6)
    if response_format == "opus":
        assert len(pieces) < 6  # the Ogg muxer holds its pages for a second: fewer chunks than pieces made


@pytest.mark.parametrize("piece", [1, 27, 28, 100, 4096, 10**6])
def test_opus_seconds_from_its_pages_whatever_pieces_they_come_in(piece: int) -> None:
    data = b"".join(encoded("opus", 2.6))
    assert fed(AudioMeter(AudioFormat.OPUS), data, piece) == decode(data).seconds == 2.6
    pages = data.split(b"OggS")  # a client that left one byte short of the second page of audio
    cut = b"OggS".join(pages[:5])[:-1]
    assert fed(AudioMeter(AudioFormat.OPUS), cut, piece) == fed(AudioMeter(AudioFormat.OPUS), b"OggS".join(pages[:4]),
                                                                  piece)
    assert 0 < fed(AudioMeter(AudioFormat.OPUS), cut, piece) < 2.6


def ffmpeg_encoded(codec: str, container: str, rate: int, layout: str, seconds: float, **options: str) -> bytes:
    """*seconds* of silence encoded by ffmpeg (PyAV) as *codec* in *container*, in one piece."""
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container, options=options) as output:
        stream = output.add_stream(codec, rate=rate, layout=layout)
        frame = av.AudioFrame(format="s16", layout=layout, samples=round(seconds * rate))
        frame.planes[0].update(bytes(frame.planes[0].buffer_size))
        frame.sample_rate, frame.pts = rate, 0
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            output.mux(packet)
    return buffer.getvalue()


@pytest.mark.parametrize(("codec", "container", "rate", "layout"), [
    ("mp3", "mp3", 44_100, "stereo"),  # MPEG-1 layer III
    ("mp3", "mp3", 22_050, "mono"),  # MPEG-2
    ("mp3", "mp3", 8_000, "mono"),  # MPEG-2.5
    ("mp2", "mp2", 48_000, "stereo"),  # layer II
    ("aac", "adts", 48_000, "stereo"),
    ("aac", "adts", 16_000, "mono"),
])
@pytest.mark.parametrize("piece", [1, 5, 4096])
def test_mp3_and_aac_seconds_from_their_frames_are_what_a_decoder_gives(
        codec: str, container: str, rate: int, layout: str, piece: int) -> None:
    data = ffmpeg_encoded(codec, container, rate, layout, 1.3, write_xing="0")  # ID3v2 first, as Kokoro's
    audio_format = AudioFormat.AAC if codec == "aac" else AudioFormat.MP3
    assert fed(AudioMeter(audio_format), data, piece) == pytest.approx(decode(data).seconds, abs=1e-6)


@pytest.mark.parametrize("piece", [1, 7, 1000])
def test_what_a_frame_count_cannot_tell_is_unknown(piece: int) -> None:
    tagged = ffmpeg_encoded("mp3", "mp3", 24_000, "mono", 1.0)  # a Xing/Info frame: a decoder trims by it
    assert fed(AudioMeter(AudioFormat.MP3), tagged, piece) is None
    kokoros = b"".join(encoded("mp3", 1.0))
    assert fed(AudioMeter(AudioFormat.MP3), kokoros + b"TAG" + b"\0" * 125, piece) is None  # an ID3v1 tag after
    assert fed(AudioMeter(AudioFormat.AAC), b"".join(encoded("aac", 1.0))[:-1], piece) == pytest.approx(
        decode(b"".join(encoded("aac", 1.0))).seconds - 1024 / SAMPLE_RATE)  # the last frame not whole: not sent
    assert fed(AudioMeter(AudioFormat.AAC), kokoros, piece) is None  # an mp3 said to be aac


_STREAMS = {audio_format: b"".join(encoded(audio_format.value, 0.3)) for audio_format in
            (AudioFormat.MP3, AudioFormat.OPUS, AudioFormat.AAC, AudioFormat.FLAC, AudioFormat.WAV)}


@settings(max_examples=300, deadline=None)
@given(audio_format=st.sampled_from(sorted(_STREAMS, key=str)), keep=st.integers(0, 20_000),
       noise=st.binary(max_size=300), at=st.integers(0, 20_000), piece=st.integers(1, 700))
def test_whatever_an_engine_sends_the_meter_says_seconds_or_none(audio_format: AudioFormat, keep: int, noise: bytes,
                                                                  at: int, piece: int) -> None:
    """An engine's bytes are unsafe: cut, with noise anywhere, the meter says a length or None, never fails."""
    data = _STREAMS[audio_format][:keep]
    seconds = fed(AudioMeter(audio_format), data[:at] + noise + data[at:], piece)
    assert seconds is None or seconds >= 0


def test_a_streamed_flac_says_no_length_so_its_seconds_are_unknown() -> None:
    data = b"".join(encoded("flac", 1.0))
    assert int.from_bytes(data[18:26], "big") & (2**36 - 1) == 0  # STREAMINFO's total samples: 0, unknown
    assert decode(data).seconds == 1.0
    assert fed(AudioMeter(AudioFormat.FLAC), data, 1000) is None  # not 0
    two_streams = b"".join(encoded("opus", 0.5)) * 2  # chained: not one length
    assert fed(AudioMeter(AudioFormat.OPUS), two_streams, 4096) is None


def test_without_pyav_the_fake_answers_the_encoded_formats_as_a_failed_encoding(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A demo installed without the test extra: wav and pcm (the demo's banner asks for wav), and for
    the others Kokoro-FastAPI's 500 when its encoder fails, saying why."""
    monkeypatch.setattr(fake_server, "MADE", WRITTEN)
    body = {"model": "kokoro", "input": "hello", "voice": "af_heart"}
    assert fake_server.read_speech(json.dumps({**body, "response_format": "wav"}).encode(), FAKE).voice == "af_heart"
    with pytest.raises(fake_server.Refused) as refused:
        fake_server.read_speech(json.dumps(body).encode(), FAKE)  # mp3, OpenAI's default
    assert refused.value.status == 500
    assert refused.value.body["detail"]["error"] == "processing_error"  # type: ignore[index]
    assert "PyAV is not installed" in refused.value.body["detail"]["message"]  # type: ignore[index]


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
