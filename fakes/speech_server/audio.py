"""The fake's audio: a tone, as OpenAI's ``pcm`` (16-bit little-endian mono at 24 kHz) or as WAV.

What needs no encoder is written here: ``pcm`` and ``wav`` (the others: ``encode``). A WAV's header
comes first and says the length of the whole (the fake knows it before it begins), so a
client that reads it with the standard library's ``wave`` gets the seconds and the sample rate back.
"""

from __future__ import annotations

import math
import struct

SAMPLE_RATE = 24_000  # Kokoro's, and OpenAI's pcm
SAMPLE_WIDTH = 2  # bytes: 16-bit
TONE_HZ = 400  # a whole number of samples per period: 60
_PERIOD = b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * i * TONE_HZ / SAMPLE_RATE)))
                   for i in range(SAMPLE_RATE // TONE_HZ))


def frames(seconds: float) -> int:
    return max(1, round(seconds * SAMPLE_RATE))


def tone(count: int, start: int = 0) -> bytes:
    """*count* samples of the tone, from sample *start* on (so that pieces join without a click)."""
    period = len(_PERIOD) // SAMPLE_WIDTH
    offset = (start % period) * SAMPLE_WIDTH
    needed = count * SAMPLE_WIDTH
    repeats = (offset + needed) // len(_PERIOD) + 1
    return (_PERIOD * repeats)[offset:offset + needed]


def wav_header(count: int) -> bytes:
    """The 44-byte header of a WAV of *count* samples, 16-bit mono at 24 kHz, as ``wave`` writes it
    (written here because ``wave`` patches the length to what was written when it closes)."""
    data = count * SAMPLE_WIDTH
    return (b"RIFF" + struct.pack("<I", 36 + data) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, SAMPLE_RATE, SAMPLE_RATE * SAMPLE_WIDTH, SAMPLE_WIDTH,
                                    8 * SAMPLE_WIDTH)
            + b"data" + struct.pack("<I", data))
