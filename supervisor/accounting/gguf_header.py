"""Read a GGUF file's header: metadata and tensor infos, never tensor data.

The file is memory-mapped and only the header pages are touched, so a 40 GB
model reads as fast as a 4 MB one. ``gguf.GGUFReader`` was measured first: it
builds a numpy view per array element and took 8 s on a header with a
262144-token vocabulary, so the header is parsed here with ``struct`` and only
the type tables come from the ``gguf`` package. It and numpy are imported
where a header is read, not with this module: ``steward`` starts without them.

Layout (ggml ``docs/gguf.md``, llama.cpp ``ggml/src/gguf.cpp``): magic ``GGUF``,
version u32, tensor count u64, KV count u64, KV pairs, tensor infos, padding to
``general.alignment`` (default 32), tensor data.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from pathlib import Path
from typing import Any

import attrs

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# ggml types newer than the installed gguf package (vendored gguf-py of b1-0c1e570).
_EXTRA_TYPES: dict[int, tuple[str, int, int]] = {42: ("Q2_0", 64, 18)}


def ggml_type_layout(type_id: int) -> tuple[str, int, int]:
    """(name, block size in elements, bytes per block) of a ggml type id."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        qtype = GGMLQuantizationType(type_id)
    except ValueError:
        if type_id in _EXTRA_TYPES:
            return _EXTRA_TYPES[type_id]
        raise
    block, size = GGML_QUANT_SIZES[qtype]
    return qtype.name, block, size


def ggml_row_bytes(type_id: int, n_elements: int) -> int:
    """Bytes of ``n_elements`` values of a type laid out in whole blocks (ggml_row_size)."""
    _, block, size = ggml_type_layout(type_id)
    return -(-n_elements // block) * size


class GGUFError(Exception):
    """A file that is not a readable GGUF; the message names the file."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


@attrs.frozen
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: ne0 (the row length) first
    ggml_type: int
    type_name: str
    nbytes: int
    offset: int  # from the start of the data region

    @property
    def n_elements(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count


@attrs.frozen(eq=False)
class GGUFHeader:
    path: str
    version: int
    arch: str
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    file_size: int
    alignment: int
    data_offset: int  # absolute offset of the data region

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def arch_get(self, suffix: str, default: Any = None) -> Any:
        """``<arch>.<suffix>``, e.g. ``arch_get("block_count")``."""
        return self.metadata.get(f"{self.arch}.{suffix}", default)

    def tensor(self, name: str) -> TensorInfo | None:
        for tensor in self.tensors:
            if tensor.name == name:
                return tensor
        return None

    @property
    def tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def n_vocab(self) -> int:
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        if tokens is not None:
            return len(tokens)
        return int(self.arch_get("vocab_size", 0))


class _Truncated(Exception):
    pass


# GGUF value type id -> struct format of one scalar (without byte order).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_NUMPY = {0: "u1", 1: "i1", 2: "u2", 3: "i2", 4: "u4", 5: "i4", 6: "f4", 7: "?", 10: "u8", 11: "i8", 12: "f8"}
_STRING, _ARRAY = 8, 9


class _Cursor:
    """Sequential reads from a buffer; running past the end raises _Truncated."""

    def __init__(self, buf: Any, order: str) -> None:
        self.buf = buf
        self.pos = 0
        self.order = order
        self.size = len(buf)

    def unpack(self, fmt: str) -> Any:
        fmt = self.order + fmt
        end = self.pos + struct.calcsize(fmt)
        if end > self.size:
            raise _Truncated(self.pos)
        values = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos = end
        return values[0] if len(values) == 1 else values

    def raw(self, count: int) -> bytes:
        end = self.pos + count
        if count < 0 or end > self.size:
            raise _Truncated(self.pos)
        data = self.buf[self.pos:end]
        self.pos = end
        return bytes(data)

    def string(self) -> str:
        length = self.unpack("Q")
        return self.raw(length).decode("utf-8", errors="replace")

    def value(self, type_id: int) -> Any:
        if type_id in _SCALARS:
            return self.unpack(_SCALARS[type_id])
        if type_id == _STRING:
            return self.string()
        if type_id == _ARRAY:
            item_type, count = self.unpack("IQ")
            if item_type in _NUMPY:
                import numpy as np

                dtype = np.dtype(_NUMPY[item_type]).newbyteorder(self.order)
                nbytes = dtype.itemsize * count
                if self.pos + nbytes > self.size:
                    raise _Truncated(self.pos)
                values = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).tolist()
                self.pos += nbytes
                return values
            if item_type == _STRING:
                return self._strings(count)
            return [self.value(item_type) for _ in range(count)]
        raise ValueError(f"unknown metadata value type {type_id}")

    def _strings(self, count: int) -> list[str]:
        # The vocabulary is the one big array (100k-260k entries): keep this loop tight.
        buf, pos, size = self.buf, self.pos, self.size
        length_fmt = struct.Struct(self.order + "Q")
        out = []
        for _ in range(count):
            if pos + 8 > size:
                raise _Truncated(pos)
            (length,) = length_fmt.unpack_from(buf, pos)
            pos += 8
            if pos + length > size:
                raise _Truncated(pos)
            out.append(buf[pos:pos + length].decode("utf-8", errors="replace"))
            pos += length
        self.pos = pos
        return out


def read_gguf_header(path: str | os.PathLike[str], *, check_size: bool = True) -> GGUFHeader:
    """The header of the GGUF file at *path*.

    With *check_size*, a file shorter than its declared tensor data is an error
    (llama.cpp refuses to load it); a sparse file of the full size is fine.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            file_size = os.fstat(f.fileno()).st_size
            if file_size < 4:
                head = f.read()
                raise GGUFError(path, f"not a GGUF file (only {file_size} bytes: {head!r})")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(path, buf, file_size, check_size)
    except OSError as exc:
        raise GGUFError(path, f"cannot read: {exc.strerror or exc}") from None


_SPLIT_NAME = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def read_gguf_model(path: str | os.PathLike[str]) -> GGUFHeader:
    """The header of a model, with the tensors of every part of a split model (``gguf-split``).

    Parts are named like llama.cpp's ``llama_split_path``: ``NAME-00001-of-00003.gguf``.
    Tensor offsets of later parts are shifted so that they follow the earlier parts' data.
    """
    first = read_gguf_header(path)
    count = int(first.get("split.count", 1) or 1)
    if count <= 1:
        return first
    match = _SPLIT_NAME.match(str(path))
    if match is None:
        raise GGUFError(path, f"part of a {count}-file split model, but not named NAME-00001-of-{count:05d}.gguf")
    parts = [read_gguf_header(f"{match['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    tensors: list[TensorInfo] = []
    shift = 0
    for part in parts:
        tensors += [attrs.evolve(t, offset=t.offset + shift) for t in part.tensors]
        shift += max((t.offset + t.nbytes for t in part.tensors), default=0)
    head = parts[0]
    return attrs.evolve(head, tensors=tuple(tensors), file_size=sum(p.file_size for p in parts))


def _parse(path: Path, buf: mmap.mmap, file_size: int, check_size: bool) -> GGUFHeader:
    magic = bytes(buf[:4])
    if magic != GGUF_MAGIC:
        raise GGUFError(path, f"not a GGUF file (magic {magic!r})")
    cursor = _Cursor(buf, "<")
    cursor.pos = 4
    try:
        version = cursor.unpack("I")
        if version & 0xFFFF == 0 and version != 0:
            # Written on a big-endian machine: every number is byte-swapped.
            cursor.order = ">"
            version = struct.unpack(">I", struct.pack("<I", version))[0]
        if version not in SUPPORTED_VERSIONS:
            raise GGUFError(path, f"unsupported GGUF version {version} (this reader knows "
                                  f"{', '.join(map(str, SUPPORTED_VERSIONS))})")
        n_tensors, n_kv = cursor.unpack("QQ")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cursor.string()
            type_id = cursor.unpack("I")
            try:
                metadata[key] = cursor.value(type_id)
            except ValueError as exc:
                raise GGUFError(path, f"metadata key {key!r}: {exc}") from None
        raw_tensors = []
        for _ in range(n_tensors):
            name = cursor.string()
            n_dims = cursor.unpack("I")
            if n_dims > 8:
                raise GGUFError(path, f"tensor {name!r}: {n_dims} dimensions is not plausible")
            shape = tuple(cursor.unpack("Q") for _ in range(n_dims))
            type_id, offset = cursor.unpack("IQ")
            raw_tensors.append((name, shape, type_id, offset))
        header_end = cursor.pos
    except _Truncated as exc:
        raise GGUFError(path, f"truncated GGUF header (file ends at byte {file_size}, "
                              f"reading at byte {exc.args[0]})") from None

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(path, f"general.alignment must be a power of two, got {alignment!r}")
    data_offset = -(-header_end // alignment) * alignment

    tensors = []
    for name, shape, type_id, offset in raw_tensors:
        try:
            type_name, block, size = ggml_type_layout(type_id)
        except (ValueError, KeyError):
            raise GGUFError(path, f"tensor {name!r} has unknown ggml type {type_id}") from None
        n_elements = 1
        for dim in shape:
            n_elements *= dim
        row = shape[0] if shape else 1
        if row % block:
            raise GGUFError(path, f"tensor {name!r}: row of {row} is not a multiple of the "
                                  f"{type_name} block size {block}")
        tensors.append(TensorInfo(name, shape, type_id, type_name, n_elements // block * size, offset))

    if check_size and tensors:
        data_end = data_offset + max(t.offset + t.nbytes for t in tensors)
        if data_end > file_size:
            raise GGUFError(path, f"truncated: tensor data ends at byte {data_end}, "
                                  f"the file has {file_size} bytes")
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        if int(metadata.get("split.no", 0) or 0) == 0:
            raise GGUFError(path, "no general.architecture in the metadata")
        arch = ""  # a later part of a split model carries tensors, not the model's metadata
    return GGUFHeader(str(path), version, arch, metadata, tuple(tensors), file_size, alignment, data_offset)
