"""The seconds in an Ogg Opus stream, from its pages' headers alone: exact, and nothing decoded.

Every Ogg page's header carries a granule position: for Opus, the samples at 48 kHz (Opus's
rate whatever the input's) decoded up to the end of the page, counting the ``pre_skip`` that
the stream's ``OpusHead`` says a decoder drops at the start. The last page's granule, less the
pre-skip, is the audio's length exactly as a decoder plays it (RFC 7845 §4: it also trims
the encoder's padding at the end). A page counts once all its bytes have gone by: a client
that leaves mid-page was not sent that page's audio. The page bodies are skipped, never kept
(but the first page's, the OpusHead). Anything that is not one Ogg Opus stream's pages
(a second stream's first page, another serial number, a page that does not begin with ``OggS``) makes the length
unknown (None), never guessed.
"""

from __future__ import annotations

import struct

import attrs

from supervisor.gateway.relay.audio_frames import HeaderWalker

OPUS_RATE = 48_000  # an Opus granule's unit, whatever rate the audio was made at
_HEADER = 27  # an Ogg page's fixed header; then its segment table, one byte a segment
_NO_GRANULE = -1  # a page on which no packet ends
_BEGINS = 0x02  # header_type: the first page of a logical stream


@attrs.define
class OggOpusMeter(HeaderWalker):
    """Feed it the stream's bytes in pieces; ``seconds`` is the audio in the pages whole so far."""

    page_granule: int = _NO_GRANULE  # the granule of the page whose body is going by
    serial: int | None = None
    pre_skip: int | None = None  # from the OpusHead, once read
    granule: int = _NO_GRANULE  # the last whole page's

    def seconds(self) -> float | None:
        if self.unreadable or self.pre_skip is None:
            return None
        return round(max(0, self.granule - self.pre_skip) / OPUS_RATE, 6) if self.granule >= 0 else 0.0

    def _read_units(self) -> None:
        while len(self.pending) >= _HEADER and not self.unreadable:
            head = self.pending
            if head[:4] != b"OggS" or head[4] != 0:
                self.unreadable = True
                return
            segments = head[26]
            if len(head) < _HEADER + segments:
                return
            body = sum(head[_HEADER:_HEADER + segments])
            granule, serial = struct.unpack_from("<qI", head, 6)
            if self.serial is None:
                if len(head) < _HEADER + segments + body:
                    return  # the first page is read whole: its body is the OpusHead
                self._read_opus_head(bytes(head[_HEADER + segments:_HEADER + segments + body]))
                self.serial = serial
            elif serial != self.serial or head[5] & _BEGINS:
                self.unreadable = True  # a second stream (chained, or muxed): not one length
                return
            self.page_granule = granule
            self._pass(_HEADER + segments + body)

    def _read_opus_head(self, body: bytes) -> None:
        if len(body) < 19 or body[:8] != b"OpusHead":
            self.unreadable = True
            return
        self.pre_skip = struct.unpack_from("<H", body, 10)[0]

    def _unit_ended(self) -> None:
        if self.page_granule != _NO_GRANULE:
            self.granule = self.page_granule
