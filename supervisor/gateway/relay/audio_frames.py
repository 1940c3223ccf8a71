"""The seconds in an mp3 or an ADTS aac stream, counted from its frames' headers: nothing decoded.

Each MPEG audio frame's 4-byte header says its length (from its bitrate, sample rate and
padding) and so where the next begins; its layer and version say how many samples it holds
(576 or 1152 for layer III). Each ADTS frame's 7-byte header says its length and its raw
blocks of 1024 samples. The samples of the frames whole so far, over the rate, are the seconds
a decoder gives: ffmpeg's, exactly (the tests decode with it). They include the encoder's delay
and padding (a few hundredths of a second) because nothing in such a stream says them, and a
decoder plays them. An mp3 whose first frame is a Xing, Info or VBRI frame is not counted: a
decoder trims the delay that tag tells, and the count would not be the decoder's. An ID3v2
tag before the frames is skipped. Anything else where a frame should begin (free-format
bitrates, a trailing ID3v1 tag, a change of sample rate) makes the seconds unknown (None).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

_ADTS_RATES = (96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350)
# kb/s by (MPEG-1?, layer bits: 3 I, 2 II, 1 III), for bitrate indexes 1..14.
_MPEG_KBPS = {
    (True, 3): (32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
    (True, 2): (32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    (True, 1): (32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (False, 3): (32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
    (False, 2): (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
    (False, 1): (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_VERSION_SHIFT = {3: 0, 2: 1, 0: 2}  # MPEG-1, MPEG-2, MPEG-2.5: the sample rate halved, quartered
_VBR_TAGS = (b"Xing", b"Info", b"VBRI")


@attrs.frozen
class Frame:
    length: int  # bytes, the header's included
    samples: int
    rate: int


def adts_frame(head: bytes) -> Frame | None:
    """An ADTS header's frame (7 bytes read), None if it is not one."""
    if head[0] != 0xFF or head[1] & 0xF6 != 0xF0 or (head[2] >> 2) & 0xF >= len(_ADTS_RATES):
        return None  # the sync word, layer 0; a sample rate index in the table
    length = (head[3] & 0x3) << 11 | head[4] << 3 | head[5] >> 5
    return Frame(length, 1024 * ((head[6] & 0x3) + 1), _ADTS_RATES[(head[2] >> 2) & 0xF]) if length > 7 else None


def mpeg_frame(head: bytes) -> Frame | None:
    """An MPEG audio frame header's frame (4 bytes read), None if it is not one (or free-format)."""
    version, layer = (head[1] >> 3) & 3, (head[1] >> 1) & 3
    bitrate, rate_index, padding = head[2] >> 4, (head[2] >> 2) & 3, (head[2] >> 1) & 1
    if head[0] != 0xFF or head[1] & 0xE0 != 0xE0 or version == 1 or not layer or bitrate in (0, 15) \
            or rate_index == 3:
        return None
    mpeg1 = version == 3
    rate = (44100, 48000, 32000)[rate_index] >> _VERSION_SHIFT[version]
    bits = _MPEG_KBPS[(mpeg1, layer)][bitrate - 1] * 1000
    if layer == 3:  # layer I: slots of 4 bytes
        return Frame((12 * bits // rate + padding) * 4, 384, rate)
    samples = 1152 if mpeg1 or layer == 2 else 576
    return Frame(samples // 8 * bits // rate + padding, samples, rate)


def id3_length(head: bytes) -> int | None:
    """The bytes of an ID3v2 tag at *head*'s start (0: none there); None until 10 bytes are read."""
    if len(head) < 3:
        return None if head == b"ID3"[:len(head)] else 0
    if head[:3] != b"ID3":
        return 0
    if len(head) < 10:
        return None
    size = head[6] << 21 | head[7] << 14 | head[8] << 7 | head[9]  # syncsafe: 7 bits a byte
    return 10 + size + (10 if head[5] & 0x10 else 0)


def mp3_tagged(frame: bytes) -> bool:
    """Whether an mp3's first frame is a Xing/Info/VBRI frame (a tag, no audio: within its first 40 bytes)."""
    return any(tag in frame[:40] for tag in _VBR_TAGS)


@attrs.define
class HeaderWalker:
    """Walks a stream of units (frames, pages) that each begin with a header saying their length:
    the headers are read, the bodies passed over (never kept), fed in pieces of any size."""

    pending: bytearray = attrs.Factory(bytearray)  # the bytes of a header (or a unit read whole) not yet read
    skip: int = 0  # bytes still to pass over: the body of the unit going by
    unreadable: bool = False

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not self.unreadable:
            if self.skip:
                passed = min(self.skip, len(view))
                view, self.skip = view[passed:], self.skip - passed
                if not self.skip:
                    self._unit_ended()
                continue
            self.pending += view
            view = memoryview(b"")
            self._read_units()

    def _pass(self, length: int) -> None:
        """The unit of *length* bytes at the start of ``pending``: passed over, whole or as it comes."""
        if len(self.pending) >= length:
            del self.pending[:length]
            self._unit_ended()
        else:
            self.skip = length - len(self.pending)
            self.pending.clear()

    def _read_units(self) -> None:
        raise NotImplementedError

    def _unit_ended(self) -> None:
        raise NotImplementedError


@attrs.define(kw_only=True)
class FrameMeter(HeaderWalker):
    """Feed it a stream's bytes in pieces; ``seconds`` is the audio in its frames whole so far."""

    read_frame: Callable[[bytes], Frame | None]
    header_size: int
    lead_in: Callable[[bytes], int | None] = lambda _head: 0  # bytes before the first frame (None: more needed)
    first_is_tag: Callable[[bytes], bool] = lambda _frame: False
    in_frame: Frame | None = None  # the frame whose body is going by
    started: bool = False  # the lead-in and the first frame are behind
    samples: int = 0
    rate: int | None = None

    def seconds(self) -> float | None:
        if self.unreadable or self.rate is None:
            return None
        return round(self.samples / self.rate, 6)

    def _read_units(self) -> None:
        if not self.started and not self._read_start():
            return
        while len(self.pending) >= self.header_size and not self.unreadable:
            frame = self.read_frame(bytes(self.pending[:self.header_size]))
            if frame is None or self.rate not in (None, frame.rate):
                self.unreadable = True
                return
            self.in_frame = frame
            self._pass(frame.length)

    def _read_start(self) -> bool:
        """Past the lead-in, and the first frame read whole (is it a tag?): True once done."""
        lead = self.lead_in(bytes(self.pending[:10]))
        if lead is None:
            return False
        if lead:
            self.skip = lead - min(lead, len(self.pending))
            del self.pending[:lead]
            self.lead_in = lambda _head: 0
            if self.skip:
                return False
        if len(self.pending) < self.header_size:
            return False
        frame = self.read_frame(bytes(self.pending[:self.header_size]))
        if frame is not None and len(self.pending) < frame.length:
            return False
        if frame is not None and self.first_is_tag(bytes(self.pending[:frame.length])):
            self.unreadable = True  # a decoder trims by the tag: not what the frames say
            return False
        self.started = True
        return True

    def _unit_ended(self) -> None:
        frame, self.in_frame = self.in_frame, None
        if frame is not None:
            self.samples += frame.samples
            self.rate = frame.rate


def mp3_meter() -> FrameMeter:
    return FrameMeter(read_frame=mpeg_frame, header_size=4, lead_in=id3_length, first_is_tag=mp3_tagged)


def adts_meter() -> FrameMeter:
    return FrameMeter(read_frame=adts_frame, header_size=7)
