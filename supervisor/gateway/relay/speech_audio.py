"""How many seconds of audio a speech answer carried, read as it goes by: the usage row's ``audio_s``.

The audio goes to the client as it comes, byte for byte; the reader only looks. Seconds are
told exactly where the format says them: ``pcm`` (OpenAI's: 16-bit mono at 24 kHz) by its
length, ``wav`` by its ``fmt`` chunk and the bytes after its ``data`` chunk's header (a
streamed WAV's header may announce no length: the bytes are what counts), ``opus`` by its Ogg
pages' granule positions (``ogg_opus``), ``mp3`` and ``aac`` (ADTS) by their frames' headers
(``audio_frames``: the seconds a decoder gives, the encoder's delay and padding included),
``flac`` by its STREAMINFO's total samples where the encoder wrote them: a streamed FLAC's says
0, unknown (Kokoro-FastAPI's always does), and its seconds stay unknown. Unknown is None,
never guessed. With ``stream_format: sse`` the audio is the base64 of each
``speech.audio.delta`` event, measured the same way.
A client that leaves mid-answer is counted for the audio it was sent.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from collections.abc import Callable

import attrs

from supervisor.gateway.openai.speech import AudioFormat, SpeechRequest, StreamFormat
from supervisor.gateway.relay.answer import AnswerHead, Framing, Passed, NOTHING_HELD
from supervisor.gateway.relay.audio_frames import FrameMeter, adts_meter, mp3_meter
from supervisor.gateway.relay.ogg_opus import OggOpusMeter
from supervisor.gateway.relay.sse import EVENT_END, event_data

PCM_RATE, PCM_WIDTH = 24_000, 2  # OpenAI's pcm: 24 kHz, 16-bit, one channel
_HEADER_LIMIT = 64 * 1024  # a WAV whose data chunk begins later than this is not measured
_EVENT_LIMIT = 4 * 2**20  # an SSE event longer than this is not measured (the audio still goes through)


@attrs.define
class AudioMeter:
    """The seconds in a stream of one format's bytes, fed in pieces."""

    audio_format: AudioFormat
    header: bytes = b""  # the bytes before the samples, until they are read
    bytes_per_second: int | None = None  # known once the header is read (pcm: from the start)
    samples: int = 0  # bytes of samples after the header
    flac_seconds: float | None = None
    unreadable: bool = False
    framed: OggOpusMeter | FrameMeter | None = None  # opus, mp3, aac: counted by their pages' or frames' headers

    def __attrs_post_init__(self) -> None:
        if self.audio_format is AudioFormat.PCM:
            self.bytes_per_second = PCM_RATE * PCM_WIDTH
        framed = _FRAMED.get(self.audio_format)
        self.framed = framed() if framed is not None else None

    def feed(self, data: bytes) -> None:
        if self.unreadable:
            return
        if self.framed is not None:
            self.framed.feed(data)
            return
        if self.bytes_per_second is not None:
            self.samples += len(data)
            return
        if self.flac_seconds is not None:
            return
        self.header += data
        if self.audio_format is AudioFormat.WAV:
            self._read_wav_header()
        else:
            self._read_flac_header()
        if len(self.header) > _HEADER_LIMIT:
            self.unreadable = True

    def seconds(self) -> float | None:
        if self.unreadable:
            return None
        if self.framed is not None:
            return self.framed.seconds()
        if self.flac_seconds is not None:
            return self.flac_seconds
        if self.bytes_per_second is None:
            return None
        return round(self.samples / self.bytes_per_second, 6)

    def _read_wav_header(self) -> None:
        head = self.header
        if len(head) < 12:
            return
        if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
            self.unreadable = True
            return
        at, rate = 12, None
        while at + 8 <= len(head):
            kind, size = head[at:at + 4], struct.unpack_from("<I", head, at + 4)[0]
            if kind == b"data":
                if rate is None:
                    self.unreadable = True  # samples before their format
                    return
                self.bytes_per_second = rate
                self.samples = len(head) - (at + 8)
                self.header = b""
                return
            if kind == b"fmt ":
                if at + 8 + 16 > len(head):
                    return  # the rest of it comes later
                channels, sample_rate, _byte_rate, block = struct.unpack_from("<HIIH", head, at + 10)
                rate = sample_rate * block if channels and sample_rate and block else None
                if rate is None:
                    self.unreadable = True
                    return
            at += 8 + size + (size & 1)

    def _read_flac_header(self) -> None:
        head = self.header
        if len(head) < 4 + 4 + 18:
            return
        if head[:4] != b"fLaC" or head[4] & 0x7F != 0:  # STREAMINFO is always the first block
            self.unreadable = True
            return
        info = int.from_bytes(head[8 + 10:8 + 18], "big")  # rate 20 bits, channels 3, depth 5, samples 36
        rate, total = info >> 44, info & (2**36 - 1)
        if not rate or not total:
            self.unreadable = True  # a stream that did not say its length
            return
        self.flac_seconds = round(total / rate, 6)
        self.header = b""


_FRAMED: dict[AudioFormat, Callable[[], OggOpusMeter | FrameMeter]] = {
    AudioFormat.OPUS: OggOpusMeter, AudioFormat.MP3: mp3_meter, AudioFormat.AAC: adts_meter}


@attrs.define(eq=False)
class AudioMeasured:
    """A reader (answer.py) of a 200 speech answer: the seconds of audio it carried, told to
    *counted* as each piece goes by; every byte passed on as it came."""

    request: SpeechRequest
    counted: Callable[[float | None], None]
    meter: AudioMeter = attrs.field(init=False)
    events: bool = False  # an SSE answer: its audio is in its events
    pending: bytes = b""  # an SSE event begun, not yet ended (a copy: the bytes went on)
    reading: bool = False

    def __attrs_post_init__(self) -> None:
        self.meter = AudioMeter(self.request.audio_format)

    def start(self, head: AnswerHead) -> AnswerHead:
        self.reading = head.status == 200
        self.events = self.request.stream_format is StreamFormat.SSE and head.framing is Framing.EVENT_STREAM
        return head

    def body(self, chunk: bytes, more: bool) -> Passed:
        if self.events:
            self._read_events(chunk)
        else:
            self.meter.feed(chunk)
        self.counted(self.meter.seconds())
        return None, chunk

    def end(self) -> Passed:
        return NOTHING_HELD

    def _read_events(self, chunk: bytes) -> None:
        *whole, self.pending = EVENT_END.split(self.pending + chunk)
        if len(self.pending) > _EVENT_LIMIT:
            self.meter.unreadable, self.pending = True, b""
        for event in whole:
            data = event_data(event)
            if data is None or b"speech.audio.delta" not in data:
                continue
            try:
                value = json.loads(data)
                audio = base64.b64decode(value["audio"], validate=True)
            except (ValueError, TypeError, KeyError, binascii.Error, RecursionError):
                continue
            self.meter.feed(audio)
