"""``POST /v1/audio/speech`` through a real steward, in front of the fake Kokoro-FastAPI
(fakes/speech_server, a real process): the official `openai` SDK's ``audio.speech.create`` and
``with_streaming_response``, the audio of each format decoded back (ffmpeg, through PyAV); chunks that reach the client before the
engine has made the last; a client that leaves frees its slot and the engine's stream; bad
input refused by steward in OpenAI's shape before anything is queued; the usage row's
characters in and seconds out; ``/v1/models``' kind.
"""

from __future__ import annotations

import io
import sys
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from fakes.speech_server.audio import frames
from tests.conftest import RunningSteward, launch_steward
from tests.test_api_routes import request_after, requests_so_far
from tests.test_deploy import wait_until
from tests.test_speech_checks import assert_decodes_as_made

pytestmark = pytest.mark.slow
ROUTE = "/v1/audio/speech"
VOICES = ["af_heart", "alloy", "bm_george"]
CHARS_PER_SECOND = 15.0  # the fake's: len(input) / 15 seconds of audio at speed 1
TEXT = "Steward streams this sentence as audio."  # 39 characters: 2.6 seconds
FORMATS = ["mp3", "opus", "aac", "flac", "wav", "pcm"]
FORMAT_TYPES = {"mp3": "mpeg", "opus": "opus", "aac": "aac", "flac": "flac", "wav": "wav", "pcm": "pcm"}


def speech_model(release: Path, **config: Any) -> dict[str, Any]:
    command = [sys.executable, "-m", "fakes.speech_server", "--port", "${PORT}", "--chunk-seconds", "0.2",
               "--real-time-factor", "40", "--hold-last", str(release)]
    return {"runtime": "openai", "command": command, "memory": "0.5GiB", "serves": ["speech"],
            "served_name": "kokoro", "parallel": 2, **config}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningSteward, Path]]:
    run_dir = tmp_path_factory.mktemp("speech")
    release = run_dir / "release"
    release.touch()
    models = {"tts": speech_model(release, voices=VOICES, aliases=["tts-1"]),
              "tts-open": speech_model(release, always_on=True)}
    registry: list[RunningSteward] = []
    launch_steward(run_dir, models, registry, gpu={"probe": "none", "budget": "4GiB"})
    registry[0].wait_event("ready", timeout=30, engine="tts-open")  # the always-on engine, loaded at start
    yield registry[0], release
    assert registry[0].stop() == 0


@pytest.fixture(autouse=True)
def no_leaked_children() -> Iterator[None]:
    yield  # the module's steward lives across tests


@pytest.fixture
def steward(served: tuple[RunningSteward, Path]) -> RunningSteward:
    return served[0]


@pytest.fixture
def release(served: tuple[RunningSteward, Path]) -> Iterator[Path]:
    """The fake's --hold-last file: present (streams end) unless a test removes it; present after."""
    yield served[1]
    served[1].touch()


@pytest.fixture
def client(steward: RunningSteward) -> openai.OpenAI:
    return openai.OpenAI(base_url=steward.base_url, api_key="none", max_retries=0, timeout=30)


def fake_stats(steward: RunningSteward, engine: str) -> dict[str, Any]:
    return httpx.get(f"{steward.engine_endpoint(engine)}/fake/stats", timeout=5).json()


def decoded(data: bytes) -> tuple[float, int]:
    """A WAV's seconds and sample rate, as the standard library's decoder reads them."""
    with wave.open(io.BytesIO(data)) as audio:
        frames = audio.readframes(audio.getnframes())
        assert len(frames) == audio.getnframes() * audio.getsampwidth() * audio.getnchannels()
        return audio.getnframes() / audio.getframerate(), audio.getframerate()


def test_the_sdk_gets_audio_a_decoder_reads_and_the_usage_row_counts_it(
        client: openai.OpenAI, steward: RunningSteward, release: Path) -> None:
    before = len(requests_so_far(steward, ROUTE))
    answer = client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format="wav")
    seconds, rate = decoded(answer.content)
    assert rate == 24_000 and seconds == pytest.approx(len(TEXT) / CHARS_PER_SECOND, abs=1e-3)
    assert answer.response.headers["content-type"] == "audio/wav"
    row = request_after(steward, ROUTE, before)
    assert (row["status"], row["model"], row["input_chars"]) == (200, "tts", len(TEXT))
    assert row["audio_s"] == pytest.approx(seconds, abs=1e-3)
    metrics = httpx.get(f"{steward.url}/metrics", timeout=5).text
    assert 'steward_speech_total{kind="input_chars",model="tts"}' in metrics
    assert 'steward_speech_total{kind="audio_seconds",model="tts"}' in metrics


def test_a_streamed_answer_written_to_a_file(client: openai.OpenAI, steward: RunningSteward, release: Path,
                                              tmp_path: Path) -> None:
    before = len(requests_so_far(steward, ROUTE))
    target = tmp_path / "speech.wav"
    with client.audio.speech.with_streaming_response.create(model="tts", voice="bm_george", input=TEXT * 3,
                                                            response_format="wav", speed=2.0) as answer:
        answer.stream_to_file(target)
    seconds, rate = decoded(target.read_bytes())
    assert rate == 24_000 and seconds == pytest.approx(len(TEXT) * 3 / CHARS_PER_SECOND / 2, abs=1e-3)
    assert request_after(steward, ROUTE, before)["audio_s"] == pytest.approx(seconds, abs=1e-3)
    pcm = client.audio.speech.create(model="tts-open", voice="af_sky", input=TEXT, response_format="pcm")
    assert len(pcm.content) == round(len(TEXT) / CHARS_PER_SECOND * 24_000) * 2  # 16-bit mono at 24 kHz
    assert request_after(steward, ROUTE, before + 1)["audio_s"] == pytest.approx(len(TEXT) / CHARS_PER_SECOND)


def test_chunks_reach_the_client_before_the_engine_makes_the_last(steward: RunningSteward, release: Path) -> None:
    release.unlink()
    before = len(requests_so_far(steward, ROUTE))
    body = {"model": "tts", "voice": "af_heart", "input": TEXT, "response_format": "wav"}
    with httpx.stream("POST", f"{steward.base_url}/audio/speech", json=body, timeout=30) as answer:
        assert answer.status_code == 200 and answer.headers["content-type"] == "audio/wav"
        pieces = answer.iter_raw()
        first = next(pieces)
        assert first.startswith(b"RIFF")
        stats = fake_stats(steward, "tts")
        assert stats["running"] == 1 and stats["finished"] == stats["started"] - 1  # the last is held back
        release.touch()
        data = first + b"".join(pieces)
    assert decoded(data)[0] == pytest.approx(len(TEXT) / CHARS_PER_SECOND, abs=1e-3)
    row = request_after(steward, ROUTE, before)
    assert row["status"] == 200 and row["ttft_s"] < row["duration_s"]


def test_a_client_that_leaves_frees_its_slot_and_cancels_the_engines_stream(
        steward: RunningSteward, release: Path) -> None:
    release.unlink()
    cancelled = fake_stats(steward, "tts")["cancelled"]
    before = len(requests_so_far(steward, ROUTE))
    body = {"model": "tts", "voice": "af_heart", "input": TEXT, "response_format": "pcm"}
    with httpx.stream("POST", f"{steward.base_url}/audio/speech", json=body, timeout=30) as answer:
        pieces = answer.iter_raw()  # kept: a generator dropped closes the answer
        assert len(next(pieces)) > 0
        wait_until(lambda: steward.health()["engines"]["tts"]["in_flight"] == 1, "the slot held")
    wait_until(lambda: fake_stats(steward, "tts")["cancelled"] == cancelled + 1, "the engine's stream cancelled")
    wait_until(lambda: steward.health()["engines"]["tts"]["in_flight"] == 0, "the slot freed")
    row = request_after(steward, ROUTE, before)
    assert (row["status"], row["error"]) == (499, "client_left")
    assert 0 < row["audio_s"] < len(TEXT) / CHARS_PER_SECOND  # what it was sent


@pytest.mark.parametrize(("change", "param"), [
    ({"input": ""}, "input"), ({"input": "x" * 4097}, "input"), ({"input": None}, "input"),
    ({"voice": "nova"}, "voice"), ({"voice": None}, "voice"), ({"response_format": "ogg"}, "response_format"),
    ({"speed": 4.5}, "speed"), ({"speed": "fast"}, "speed"), ({"stream_format": "chunks"}, "stream_format"),
    ({"instructions": "y" * 4097}, "instructions"),
])
def test_bad_input_is_refused_by_steward_naming_the_parameter(
        client: openai.OpenAI, steward: RunningSteward, change: dict[str, Any], param: str) -> None:
    started = fake_stats(steward, "tts-open")["started"]
    dispatched = len(steward.events("dispatch"))
    body = {k: v for k, v in ({"model": "tts", "voice": "alloy", "input": TEXT} | change).items() if v is not None}
    answer = httpx.post(f"{steward.base_url}/audio/speech", json=body, timeout=30)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]
    assert len(steward.events("dispatch")) == dispatched  # nothing was queued
    with pytest.raises(openai.BadRequestError) as refused:
        client.audio.speech.create(**{"model": "tts", "voice": "alloy", "input": TEXT, **change})  # type: ignore[arg-type]
    assert refused.value.param == param
    assert fake_stats(steward, "tts-open")["started"] == started


def test_the_engines_own_refusals_come_back_in_openais_shape(client: openai.OpenAI, steward: RunningSteward) -> None:
    with pytest.raises(openai.BadRequestError) as unknown:  # no voices configured: the engine says which it has
        client.audio.speech.create(model="tts-open", voice="nobody", input=TEXT)
    assert unknown.value.body["message"].startswith("Voice 'nobody' not found")  # type: ignore[index]
    assert unknown.value.body["code"] == "validation_error"  # Kokoro's own word for it  # type: ignore[index]


@pytest.mark.parametrize("response_format", FORMATS)
def test_each_format_whole_and_streamed_decodes_to_the_audio_made(
        client: openai.OpenAI, steward: RunningSteward, release: Path, response_format: str) -> None:
    before = len(requests_so_far(steward, ROUTE))
    seconds = len(TEXT) / CHARS_PER_SECOND
    whole = client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT,
                                       response_format=response_format)  # type: ignore[arg-type]
    with client.audio.speech.with_streaming_response.create(
            model="tts-open", voice="af_heart", input=TEXT * 2, response_format=response_format,  # type: ignore[arg-type]
            speed=2.0) as answer:
        content_type = answer.headers["content-type"]
        streamed = b"".join(answer.iter_bytes())
    assert content_type == whole.response.headers["content-type"] == f"audio/{FORMAT_TYPES[response_format]}"
    decoded = []  # the seconds a decoder gives: what steward's usage row counts (mp3, aac: delay and padding too)
    for data in (whole.content, streamed):  # twice the text at twice the speed: as long
        if response_format == "pcm":
            assert len(data) == frames(seconds) * 2
            decoded.append(seconds)
        else:
            decoded.append(assert_decodes_as_made(response_format, data, seconds).seconds)
    rows = [request_after(steward, ROUTE, before + i) for i in (0, 1)]
    assert [(row["status"], row["input_chars"]) for row in rows] == [(200, len(TEXT)), (200, 2 * len(TEXT))]
    if response_format == "flac":  # Kokoro's FLAC says no length (STREAMINFO's total samples 0): not guessed
        assert [row["audio_s"] for row in rows] == [None, None]
    else:
        assert [row["audio_s"] for row in rows] == pytest.approx(decoded, abs=1e-6)


def test_speech_models_are_listed_as_speech(steward: RunningSteward) -> None:
    models = {m["id"]: m for m in httpx.get(f"{steward.base_url}/models", timeout=5).json()["data"]}
    assert models["tts"]["steward"]["kind"] == "speech" and models["tts"]["steward"]["serves"] == ["speech"]
    assert models["tts-1"]["steward"]["alias_of"] == "tts"
    only = httpx.get(f"{steward.base_url}/models", params={"kind": "speech"}, timeout=5).json()["data"]
    assert {m["id"] for m in only} == {"tts", "tts-1", "tts-open"}


def test_what_the_engine_sends_is_relayed_as_it_is(steward: RunningSteward, release: Path) -> None:
    """Kokoro-FastAPI has no `stream_format`: asked for `sse` it sends audio, which steward relays
    (and measures as audio); its own `stream: false` answers whole, with its length."""
    before = len(requests_so_far(steward, ROUTE))
    body = {"model": "tts", "voice": "af_heart", "input": TEXT, "response_format": "wav"}
    sse = httpx.post(f"{steward.base_url}/audio/speech", json={**body, "stream_format": "sse"}, timeout=30)
    assert sse.headers["content-type"] == "audio/wav" and decoded(sse.content)[0] == pytest.approx(2.6, abs=1e-3)
    whole = httpx.post(f"{steward.base_url}/audio/speech", json={**body, "stream": False}, timeout=30)
    assert whole.headers["content-length"] == str(len(whole.content)) and whole.content == sse.content
    assert [request_after(steward, ROUTE, before + i)["audio_s"] for i in (0, 1)] == [2.6, 2.6]


def test_speech_engines_hold_their_memory_in_the_ledger(steward: RunningSteward) -> None:
    engines = steward.health()["engines"]
    assert engines["tts-open"]["status"] == "ready" and engines["tts-open"]["pinned"]
    assert engines["tts-open"]["reserved"] == 2**29  # its 0.5 GiB, as any engine's
