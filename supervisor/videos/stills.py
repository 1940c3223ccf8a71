"""A video's thumbnail: the first frame of an animated WEBP, taken out of the file as it is.

ComfyUI's SaveAnimatedWEBP (Pillow's libwebp encoder) writes an extended WEBP: a ``VP8X``
header, ``ANIM``, then one ``ANMF`` chunk per frame, each holding the frame's own bitstream
(``VP8`` or ``VP8L``, with ``ALPH`` for a lossy frame with alpha). The first frame of such a
file covers the whole canvas (it is a key frame), so its chunks, in a RIFF container of their
own, are a still WEBP of that frame: nothing is decoded or encoded, steward needs no image
library, and of a large file only the header and the first frame are read. A file of another
shape (a frame that is not the whole canvas, an MP4) has no still here: the workflow may save
one itself (a SaveImage of ``ImageFromBatch``), which is used first.
Pure.
"""

from __future__ import annotations

import io
import struct
from typing import BinaryIO


def _chunks(file: BinaryIO, end: int | None, wanted: frozenset[bytes]) -> list[tuple[bytes, bytes]]:
    """The RIFF chunks from *file*'s position up to *end* (None: its end): (fourcc, payload) for
    the kinds *wanted*, the others skipped unread; stops at the first one cut short."""
    chunks = []
    while end is None or file.tell() + 8 <= end:
        header = file.read(8)
        if len(header) < 8:
            break
        kind, size = header[:4], struct.unpack("<I", header[4:])[0]
        if kind in wanted:
            payload = file.read(size)
            if len(payload) < size:
                break
            chunks.append((kind, payload))
            file.seek(size & 1, 1)
        else:
            file.seek(size + (size & 1), 1)
        if kind == b"ANMF" and kind in wanted:
            break  # the first frame is all that is wanted of the animation
    return chunks


def _chunk(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack("<I", len(payload)) + payload + (b"\x00" if len(payload) & 1 else b"")


def _u24(data: bytes, offset: int) -> int:
    return int.from_bytes(data[offset:offset + 3], "little")


def first_webp_frame(file: BinaryIO) -> bytes | None:
    """The first frame of the animated WEBP in *file* (read from its start; only the header and
    the first frame are read) as a still WEBP, or None where there is none to take (not a WEBP,
    not animated, a first frame smaller than the canvas)."""
    head = file.read(12)
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WEBP":
        return None
    chunks = _chunks(file, None, frozenset({b"VP8X", b"ANMF"}))
    header = next((payload for kind, payload in chunks if kind == b"VP8X"), None)
    frame = next((payload for kind, payload in chunks if kind == b"ANMF"), None)
    if header is None or len(header) < 10 or frame is None or len(frame) < 16:
        return None
    width, height = _u24(header, 4) + 1, _u24(header, 7) + 1
    x, y, frame_width, frame_height = (_u24(frame, 0) * 2, _u24(frame, 3) * 2, _u24(frame, 6) + 1,
                                       _u24(frame, 9) + 1)
    if (x, y, frame_width, frame_height) != (0, 0, width, height):
        return None
    inner = _chunks(io.BytesIO(frame[16:]), len(frame) - 16, frozenset({b"ALPH", b"VP8 ", b"VP8L"}))
    if not inner or inner[-1][0] not in (b"VP8 ", b"VP8L"):
        return None
    body = b"".join(_chunk(kind, payload) for kind, payload in inner)
    if inner[0][0] == b"ALPH":  # alpha beside a lossy frame needs the extended header (alpha flag)
        body = _chunk(b"VP8X", bytes([0x10, 0, 0, 0]) + (width - 1).to_bytes(3, "little")
                      + (height - 1).to_bytes(3, "little")) + body
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body
