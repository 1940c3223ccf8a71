"""The fake's audio in each of Kokoro-FastAPI's formats, encoded as it encodes them, piece by piece.

Kokoro-FastAPI's ``StreamingAudioWriter`` encodes with PyAV (ffmpeg): ``mp3`` (LAME, 128 kb/s,
no Xing header), ``opus`` (libopus in Ogg, 128 kb/s), ``aac`` (ffmpeg's encoder in ADTS, 128 kb/s)
and ``flac``, all mono at the model's 24 kHz. Each piece of samples is encoded and the bytes the
muxer wrote so far are handed out (its buffer emptied), and the stream is finished with the
encoder's flush. What follows from that, and what a client of Kokoro gets:

* a piece may encode to nothing yet (the Ogg muxer holds its pages for about a second; an
  encoder holds a frame's worth): Kokoro skips empty chunks, so its chunks are not evenly timed;
* the FLAC muxer patches STREAMINFO's total samples when it closes, by seeking back to the
  start of a buffer already handed out: the patch is lost, and a streamed FLAC says 0 samples
  (unknown), as does a whole one (``stream: false`` goes through the same writer);
* mp3 and aac carry the encoder's delay and padding (no Xing/LAME tag, no edit list), so a
  decoder reads a frame or two more than was made; opus's Ogg granules trim them exactly,
  and an Ogg Opus stream decodes at 48 kHz whatever it was made at.

``wav`` and ``pcm`` are written by hand (``audio``): they need no encoder. PyAV is a test
dependency (the ``test`` extra): without it the encoded formats are not made (``ENCODED`` is
empty) and the fake answers them with Kokoro's 500 for an encoding that failed.
"""

from __future__ import annotations

import io
from typing import Any

import attrs

from fakes.speech_server.audio import SAMPLE_RATE, tone, wav_header

try:
    import av
except ImportError:  # a demo install without the test extra
    av = None

# response_format -> (PyAV container, codec, bit rate): Kokoro-FastAPI's codec_map.
_CODECS: dict[str, tuple[str, str, int | None]] = {"mp3": ("mp3", "mp3", 128_000),
                                                   "opus": ("opus", "libopus", 128_000),
                                                   "aac": ("adts", "aac", 128_000),
                                                   "flac": ("flac", "flac", None)}
ENCODED = frozenset(_CODECS) if av is not None else frozenset()
WRITTEN = frozenset({"wav", "pcm"})  # by hand, no encoder needed


@attrs.define(eq=False)
class AudioWriter:
    """One answer's audio in *response_format*: ``write`` each piece of the tone as it is made,
    then ``finish``; each returns the bytes to send (perhaps none yet)."""

    response_format: str
    total: int  # samples in the whole answer (a WAV's header says it)
    made: int = 0
    _container: Any = None
    _stream: Any = None
    _buffer: io.BytesIO = attrs.Factory(io.BytesIO)

    def __attrs_post_init__(self) -> None:
        if self.response_format in WRITTEN:
            return
        if self.response_format not in ENCODED:
            raise ValueError(f"no {self.response_format} encoder here")
        container, codec, bit_rate = _CODECS[self.response_format]
        options = {"write_xing": "0"} if self.response_format == "mp3" else {}
        self._container = av.open(self._buffer, mode="w", format=container, options=options)
        self._stream = self._container.add_stream(codec, rate=SAMPLE_RATE, layout="mono")
        if bit_rate is not None:
            self._stream.bit_rate = bit_rate

    def write(self, count: int) -> bytes:
        samples = tone(count, self.made)
        first = self.made == 0
        self.made += count
        if self.response_format == "pcm":
            return samples
        if self.response_format == "wav":
            return (wav_header(self.total) if first else b"") + samples
        frame = av.AudioFrame(format="s16", layout="mono", samples=count)
        frame.planes[0].update(samples)
        frame.sample_rate, frame.pts = SAMPLE_RATE, self.made - count
        self._mux(self._stream.encode(frame))
        return self._taken()

    def finish(self) -> bytes:
        """The encoder's last frames and the container's trailer; the writer is closed after."""
        if self._container is None:
            return b""
        self._mux(self._stream.encode(None))
        container, self._container = self._container, None
        if self.response_format == "opus":  # the Ogg muxer writes its last page when it closes
            container.close()
            return self._taken()
        data = self._taken()  # what the others write when closing goes back to the start: lost
        container.close()
        return data

    def close(self) -> None:
        """Frees the encoder of an answer cut short (a client that left)."""
        if self._container is not None:
            try:
                self._container.close()
            except (OSError, ValueError, av.FFmpegError):
                pass  # an encoder that was mid-stream: nothing to keep

    def _mux(self, packets: list[Any]) -> None:
        for packet in packets:
            self._container.mux(packet)

    def _taken(self) -> bytes:
        data = self._buffer.getvalue()
        self._buffer.seek(0)
        self._buffer.truncate(0)
        return data
