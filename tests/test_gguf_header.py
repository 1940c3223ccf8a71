"""supervisor.accounting.gguf_header: metadata and tensor infos, never tensor data."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import gguf
import numpy as np
import pytest

from supervisor.accounting.gguf_header import GGUFError, ggml_row_bytes, read_gguf_header, read_gguf_model

Q8_0 = gguf.GGMLQuantizationType.Q8_0


def write_sample(path: Path, *, endianess: gguf.GGUFEndian = gguf.GGUFEndian.LITTLE) -> None:
    w = gguf.GGUFWriter(path, "llama", endianess=endianess)
    w.add_block_count(2)
    w.add_context_length(4096)
    w.add_head_count_kv([2, 0])
    w.add_rope_freq_base(10000.0)
    w.add_causal_attention(True)
    w.add_name("sample")
    w.add_token_list(["a", "b", "ccc"])
    w.add_token_scores([0.5, 0.25, 0.125])
    w.add_uint64("custom.big", 2**40)
    w.add_int8("custom.small", -3)
    w.add_tensor("token_embd.weight", np.ones((3, 64), dtype=np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(64, dtype=np.float16))
    q8 = gguf.quants.quantize(np.zeros((4, 64), dtype=np.float32), Q8_0)
    w.add_tensor("blk.0.ffn_up.weight", q8, raw_shape=q8.shape, raw_dtype=Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_round_trip_matches_the_writer_and_gguf_reader(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    write_sample(path)
    h = read_gguf_header(path)
    assert h.arch == "llama" and h.version == 3 and h.alignment == 32
    assert h.file_size == path.stat().st_size
    assert h.arch_get("block_count") == 2 and h.arch_get("context_length") == 4096
    assert h.arch_get("attention.head_count_kv") == [2, 0]
    assert h.arch_get("rope.freq_base") == 10000.0 and h.arch_get("attention.causal") is True
    assert h.get("general.name") == "sample"
    assert h.get("tokenizer.ggml.tokens") == ["a", "b", "ccc"] and h.n_vocab == 3
    assert h.get("tokenizer.ggml.scores") == [0.5, 0.25, 0.125]
    assert h.get("custom.big") == 2**40 and h.get("custom.small") == -3

    embd, norm, up = h.tensors
    assert (embd.name, embd.shape, embd.type_name, embd.nbytes) == ("token_embd.weight", (64, 3), "F32", 768)
    assert (norm.shape, norm.type_name, norm.nbytes) == ((64,), "F16", 128)
    assert (up.shape, up.type_name, up.nbytes) == ((64, 4), "Q8_0", 4 * 2 * 34)  # 2 blocks a row
    assert h.tensor_bytes == 768 + 128 + 272

    oracle = gguf.GGUFReader(path)  # the library's reader: same offsets and sizes
    assert h.data_offset == oracle.data_offset
    for ours, theirs in zip(h.tensors, oracle.tensors):
        assert ours.name == theirs.name
        assert h.data_offset + ours.offset == theirs.data_offset
        assert ours.nbytes == theirs.n_bytes
        assert list(ours.shape) == [int(d) for d in theirs.shape]


def test_big_endian_file(tmp_path: Path) -> None:
    path = tmp_path / "be.gguf"
    write_sample(path, endianess=gguf.GGUFEndian.BIG)
    h = read_gguf_header(path)
    assert h.arch_get("block_count") == 2 and h.get("custom.big") == 2**40
    assert h.get("tokenizer.ggml.scores") == [0.5, 0.25, 0.125]
    assert [t.nbytes for t in h.tensors] == [768, 128, 272]


def test_a_huge_sparse_model_reads_in_well_under_a_second(tmp_path: Path) -> None:
    """40 GB of declared tensors and a 150k-token vocabulary: only the header is read."""
    path = tmp_path / "huge.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(40)
    w.add_token_list([f"token{i}" for i in range(150_000)])
    w.add_token_types([1] * 150_000)
    shape = (25_000, 10_000)  # numpy order: 250M f32 elements = 1 GB per tensor
    for i in range(40):
        w.add_tensor_info(f"blk.{i}.ffn_up.weight", shape, np.dtype(np.float32), 4 * shape[0] * shape[1])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    header_size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(header_size + 40 * 4 * shape[0] * shape[1] + 64)  # sparse: no data written
    start = time.perf_counter()
    h = read_gguf_header(path)
    elapsed = time.perf_counter() - start
    # Reading the 160 GB of (sparse) data would take minutes; the header alone, well under a second.
    assert elapsed < 5, f"reading the header took {elapsed:.2f}s"
    assert h.tensor_bytes == 40 * 10**9 and len(h.tensors) == 40 and h.n_vocab == 150_000
    assert h.tensors[0].shape == (10_000, 25_000)


def test_not_a_gguf_file_names_the_file_and_the_magic(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(GGUFError) as err:
        read_gguf_header(path)
    assert str(err.value) == f"{path}: not a GGUF file (magic b'PK\\x03\\x04')"


def test_empty_and_tiny_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(GGUFError, match=f"^{empty}: not a GGUF file"):
        read_gguf_header(empty)
    short = tmp_path / "short.gguf"
    short.write_bytes(b"GGUF")
    with pytest.raises(GGUFError, match=f"^{short}: truncated GGUF header"):
        read_gguf_header(short)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match="nope.gguf: cannot read: No such file"):
        read_gguf_header(tmp_path / "nope.gguf")


def test_truncated_header_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    write_sample(path)
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:60])  # inside the first metadata entries
    with pytest.raises(GGUFError, match=f"^{cut}: truncated GGUF header"):
        read_gguf_header(cut)


def test_truncated_tensor_data_is_an_error_unless_asked_not_to_check(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    write_sample(path)
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(GGUFError, match=rf"^{path}: truncated: tensor data ends at byte \d+, "
                                        rf"the file has {len(data) - 100} bytes"):
        read_gguf_header(path)
    assert read_gguf_header(path, check_size=False).tensor_bytes == 1168


def test_unknown_version(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    write_sample(path)
    data = bytearray(path.read_bytes())
    data[4:8] = struct.pack("<I", 99)
    path.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match=f"^{path}: unsupported GGUF version 99"):
        read_gguf_header(path)


def test_row_bytes_of_quantized_types() -> None:
    assert ggml_row_bytes(1, 128) == 256  # f16
    assert ggml_row_bytes(8, 128) == 4 * 34  # q8_0: 32 values in 34 bytes
    assert ggml_row_bytes(2, 64) == 2 * 18  # q4_0
    assert ggml_row_bytes(12, 256) == 144  # q4_K


def test_split_model_parts_are_read_together(tmp_path: Path) -> None:
    for no in range(2):
        w = gguf.GGUFWriter(tmp_path / f"m-{no + 1:05d}-of-00002.gguf", "llama")
        w.add_uint16("split.no", no)
        w.add_uint16("split.count", 2)
        if no == 0:
            w.add_block_count(2)
        w.add_tensor(f"blk.{no}.ffn_up.weight", np.zeros((8, 64), dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    model = read_gguf_model(tmp_path / "m-00001-of-00002.gguf")
    assert model.arch_get("block_count") == 2
    assert [t.name for t in model.tensors] == ["blk.0.ffn_up.weight", "blk.1.ffn_up.weight"]
    assert model.tensors[1].offset == 8 * 64 * 4  # right after the first part's data
    assert model.tensor_bytes == 2 * 8 * 64 * 4
    lone = tmp_path / "lone.gguf"
    lone.write_bytes((tmp_path / "m-00001-of-00002.gguf").read_bytes())
    with pytest.raises(GGUFError, match="split model"):
        read_gguf_model(lone)
