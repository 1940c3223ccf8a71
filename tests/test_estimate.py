"""supervisor.accounting: the estimate against hand-computed sizes, and against the real llama-server.

The first part builds small GGUF headers with gguf.GGUFWriter (never loaded by a server)
and checks every component against arithmetic written out in the test. The last test
runs the tiny models of fakes.tiny_gguf in the real llama-server (CPU backend) and
compares the buffer sizes it logs with the estimate (docs/estimates.md); it needs the
binary and fails, never skips, when it is missing.

    python -m tests.test_estimate     # prints the docs/estimates.md table
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import attrs
import gguf
import numpy as np
import pytest

from supervisor.accounting.context import plan_context
from supervisor.accounting.estimate import Estimate, estimate
from supervisor.accounting.gguf_header import read_gguf_header
from supervisor.accounting.hparams import read_hparams
from supervisor.accounting.llama_logs import MeasuredBreakdown, parse_llama_log
from supervisor.accounting.server_args import ServerArgsError, TensorOverride, parse_server_args
from supervisor.cli import main
from tests.bare_llama import open_bare_llama_server

MIB = 1024 * 1024
F32, F16 = gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16
N_VOCAB = 100

# ---------------------------------------------------------------------------------------------
# a GGUF writer for headers with exactly the tensors a test names


def write_gguf(path: Path, arch: str, meta: dict[str, Any], tensors: dict[str, tuple[tuple[int, ...], Any]],
               n_vocab: int = N_VOCAB) -> Path:
    """*meta* keys without the ``<arch>.`` prefix; *tensors*: name -> (ggml shape, ne0 first; type)."""
    w = gguf.GGUFWriter(path, arch)
    for key, value in meta.items():
        key = f"{arch}.{key}"
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, list):
            w.add_array(key, value)
        else:
            w.add_string(key, value)
    w.add_token_list([f"t{i}" for i in range(n_vocab)])
    for name, (shape, qtype) in tensors.items():
        data = np.zeros(tuple(reversed(shape)), dtype=np.float32)
        if qtype == F16:
            data = data.astype(np.float16)
        elif qtype != F32:
            data = gguf.quants.quantize(data, qtype)
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
            continue
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def nbytes(shape: tuple[int, ...], qtype: Any = F32) -> int:
    count = int(np.prod(shape))
    return count * (4 if qtype == F32 else 2)


def attention(il: int, n_embd: int, q_dim: int, kv_dim: int) -> dict[str, tuple[tuple[int, ...], Any]]:
    return {
        f"blk.{il}.attn_norm.weight": ((n_embd,), F32),
        f"blk.{il}.attn_q.weight": ((n_embd, q_dim), F16),
        f"blk.{il}.attn_k.weight": ((n_embd, kv_dim), F16),
        f"blk.{il}.attn_v.weight": ((n_embd, kv_dim), F16),
        f"blk.{il}.attn_output.weight": ((q_dim, n_embd), F16),
    }


def dense_ffn(il: int, n_embd: int, n_ff: int) -> dict[str, tuple[tuple[int, ...], Any]]:
    return {
        f"blk.{il}.ffn_norm.weight": ((n_embd,), F32),
        f"blk.{il}.ffn_gate.weight": ((n_embd, n_ff), F16),
        f"blk.{il}.ffn_up.weight": ((n_embd, n_ff), F16),
        f"blk.{il}.ffn_down.weight": ((n_ff, n_embd), F16),
    }


def io_tensors(n_embd: int, tied: bool = False) -> dict[str, tuple[tuple[int, ...], Any]]:
    out = {"token_embd.weight": ((n_embd, N_VOCAB), F32), "output_norm.weight": ((n_embd,), F32)}
    if not tied:
        out["output.weight"] = ((n_embd, N_VOCAB), F16)
    return out


def llama(path: Path, n_layer: int = 2, n_embd: int = 64, n_head: int = 8, n_head_kv: Any = 2,
          head_dim: int | None = None) -> Path:
    head_dim = head_dim or n_embd // n_head
    kv_heads = n_head_kv if isinstance(n_head_kv, list) else [n_head_kv] * n_layer
    meta = {"block_count": n_layer, "context_length": 4096, "embedding_length": n_embd,
            "feed_forward_length": 128, "attention.head_count": n_head, "attention.head_count_kv": n_head_kv,
            "attention.key_length": head_dim, "attention.value_length": head_dim}
    tensors = io_tensors(n_embd)
    for il in range(n_layer):
        tensors |= attention(il, n_embd, n_head * head_dim, kv_heads[il] * head_dim) | dense_ffn(il, n_embd, 128)
    return write_gguf(path, "llama", meta, tensors)


def kv(result: Estimate, device: str = "gpu0") -> int:
    return result.devices[device].kv if device != "host" else result.host.kv


# ---------------------------------------------------------------------------------------------
# KV cache: GQA, context pool, slots


def test_gqa_kv_cache_is_per_layer_kv_heads_times_head_dim(tmp_path: Path) -> None:
    model = llama(tmp_path / "m.gguf")  # 8 query heads, 2 KV heads of 8 -> K and V rows of 16 f16
    result = estimate(model, ["-c", "1000", "-np", "1"])
    cells = 1024  # -c is padded to a multiple of 256
    assert result.context.n_ctx == cells
    assert kv(result) == 2 * (16 * 2 + 16 * 2) * cells  # 2 layers x (K + V) x cells
    assert result.host.kv == 0


def test_gridcore_ctx_size_is_the_total_pool_not_per_slot(tmp_path: Path) -> None:
    model = llama(tmp_path / "m.gguf")
    result = estimate(model, ["--ctx-size", "8192", "--parallel", "4"])
    per_cell = 2 * (16 * 2 + 16 * 2)
    assert result.context.n_stream == 4 and result.context.n_ctx_seq == 2048  # 4 streams x 2048
    assert kv(result) == per_cell * 8192
    assert kv(result) != per_cell * 4 * 8192  # the GridCore mistake


def test_parallel_without_unified_pads_each_stream_and_raises_the_total(tmp_path: Path) -> None:
    model = llama(tmp_path / "m.gguf")
    result = estimate(model, ["-c", "4096", "-np", "3"])
    assert (result.context.n_ctx_seq, result.context.n_ctx) == (1536, 4608)  # pad256(4096 / 3) x 3
    assert kv(result) == 2 * 64 * 4608


def test_no_parallel_flag_means_four_slots_sharing_one_cache(tmp_path: Path) -> None:
    model = llama(tmp_path / "m.gguf")
    auto = estimate(model, ["-c", "4096"])
    assert (auto.context.n_seq_max, auto.context.n_stream, auto.context.kv_unified) == (4, 1, True)
    assert kv(auto) == 2 * 64 * 4096
    unified = estimate(model, ["-c", "4096", "-np", "2", "--kv-unified"])
    assert (unified.context.n_stream, unified.context.n_ctx_seq) == (1, 4096)
    assert kv(estimate(model, ["-c", "0", "-np", "1"])) == 2 * 64 * 4096  # -c 0: training context
    assert kv(estimate(model, ["-np", "1"])) == 2 * 64 * 4096  # no -c: training context too


def test_quantized_kv_cache_uses_block_row_sizes(tmp_path: Path) -> None:
    model = llama(tmp_path / "m.gguf", n_head=4, n_head_kv=4)  # K/V rows of 64 values
    f16 = estimate(model, ["-c", "1024", "-np", "1"])
    q8 = estimate(model, ["-c", "1024", "-np", "1", "-ctk", "q8_0", "-ctv", "q8_0"])
    q4k = estimate(model, ["-c", "1024", "-np", "1", "-ctk", "q4_0"])
    assert kv(f16) == 2 * (128 + 128) * 1024
    assert kv(q8) == 2 * (68 + 68) * 1024  # 64 values = 2 blocks of 34 bytes
    assert kv(q4k) == 2 * (36 + 128) * 1024  # q4_0: 2 blocks of 18 bytes; V stays f16
    assert q8.notes == ()
    assert "flash attention" in estimate(model, ["-ctv", "q8_0", "-fa", "off"]).notes[0]


def test_without_flash_attention_v_rows_are_padded_to_the_widest_layer(tmp_path: Path) -> None:
    model = llama(tmp_path / "m.gguf", n_head=4, n_head_kv=[1, 2], head_dim=16)
    on = estimate(model, ["-c", "1024", "-np", "1", "-fa", "on"])
    off = estimate(model, ["-c", "1024", "-np", "1", "-fa", "off"])
    assert kv(on) == ((16 + 16) * 2 + (32 + 32) * 2) * 1024
    assert kv(off) == ((16 + 32) * 2 + (32 + 32) * 2) * 1024  # V of layer 0 padded to 32


# ---------------------------------------------------------------------------------------------
# sliding window, shared KV, MLA


def gemma3(path: Path, n_layer: int = 6, window: int = 128) -> Path:
    meta = {"block_count": n_layer, "context_length": 8192, "embedding_length": 64, "feed_forward_length": 128,
            "attention.head_count": 4, "attention.head_count_kv": 1, "attention.key_length": 32,
            "attention.value_length": 32, "attention.sliding_window": window}
    tensors = io_tensors(64, tied=True)
    for il in range(n_layer):
        tensors |= attention(il, 64, 128, 32) | dense_ffn(il, 64, 128)
    return write_gguf(path, "gemma3", meta, tensors)


def test_sliding_window_layers_hold_window_plus_ubatch_cells(tmp_path: Path) -> None:
    model = gemma3(tmp_path / "g.gguf")  # period 6: layers 0-4 slide, layer 5 is global
    hp = read_hparams(read_gguf_header(model))
    assert hp.is_swa == (True, True, True, True, True, False) and hp.n_swa == 128
    per_cell = 32 * 2 + 32 * 2  # one KV head of 32, K + V in f16

    def swa_cells(*args: str) -> float:
        result = estimate(model, list(args))
        global_part = result.context.n_ctx_seq * result.context.n_stream * per_cell
        return (kv(result) - global_part) / (5 * per_cell * result.context.n_stream)

    assert swa_cells("-c", "4096", "-np", "1") == 768  # pad256(min(4096, 128 + 512))
    assert swa_cells("-c", "4096", "-np", "1", "-ub", "1024") == 1280  # -ub changes the window cache
    assert swa_cells("-c", "4096", "-np", "1", "-ub", "128") == 256
    assert swa_cells("-c", "4096", "-np", "1", "--swa-full") == 4096
    assert swa_cells("-c", "4096") == 1024  # unified, 4 slots: pad256(128 x 4 + 512)
    assert swa_cells("-c", "4096", "-np", "2") == 768  # per stream, 2 streams of 2048
    assert swa_cells("-c", "512", "-np", "1") == 512  # never more than the context
    full = estimate(model, ["-c", "4096", "-np", "1"])
    assert kv(full) == 4096 * per_cell + 5 * 768 * per_cell


def test_gemma3n_shares_kv_after_layer_20(tmp_path: Path) -> None:
    meta = {"block_count": 22, "context_length": 4096, "embedding_length": 64, "feed_forward_length": 128,
            "attention.head_count": 2, "attention.head_count_kv": 1, "attention.key_length": 32,
            "attention.value_length": 32, "attention.sliding_window": 64, "attention.shared_kv_layers": 2,
            "embedding_length_per_layer_input": 8}
    tensors = io_tensors(64, tied=True) | {"per_layer_token_embd.weight": ((8 * 22, N_VOCAB), F32)}
    for il in range(22):
        tensors |= attention(il, 64, 64, 32)
    model = write_gguf(tmp_path / "n.gguf", "gemma3n", meta, tensors)
    hp = read_hparams(read_gguf_header(model))
    assert hp.attention_layers == tuple(range(20))
    result = estimate(model, ["-c", "1024", "-np", "1"])
    per_cell = 128
    # period 5: layers 4, 9, 14, 19 are global; the other 16 of the first 20 slide (768 cells)
    assert kv(result) == 4 * 1024 * per_cell + 16 * 768 * per_cell
    # the per-layer embedding table stays in host memory, the tied output is copied to the GPU
    embd, ple = 64 * N_VOCAB * 4, 8 * 22 * N_VOCAB * 4
    assert result.host.weights == embd + ple
    tensor_total = read_gguf_header(model).tensor_bytes
    assert result.devices["gpu0"].weights == tensor_total - embd - ple + embd


def test_gemma4_reads_shared_kv_layers(tmp_path: Path) -> None:
    pattern = [True, True, False] * 4
    meta = {"block_count": 12, "context_length": 4096, "embedding_length": 64, "feed_forward_length": 128,
            "attention.head_count": 2, "attention.head_count_kv": 1, "attention.key_length": 32,
            "attention.value_length": 32, "attention.key_length_swa": 16, "attention.value_length_swa": 16,
            "attention.sliding_window": 64, "attention.sliding_window_pattern": pattern,
            "attention.shared_kv_layers": 4}
    model = write_gguf(tmp_path / "g4.gguf", "gemma4", meta, io_tensors(64))
    hp = read_hparams(read_gguf_header(model))
    assert hp.attention_layers == tuple(range(8)) and hp.is_swa[:3] == (True, True, False)
    result = estimate(model, ["-c", "1024", "-np", "1"])
    swa = [il for il in range(8) if pattern[il]]
    assert kv(result) == (8 - len(swa)) * 1024 * 128 + len(swa) * 768 * 64  # SWA heads are 16 wide


def test_mla_keeps_k_only(tmp_path: Path) -> None:
    meta = {"block_count": 2, "context_length": 4096, "embedding_length": 64, "attention.head_count": 4,
            "attention.head_count_kv": 1, "attention.key_length": 48, "attention.value_length": 32,
            "attention.key_length_mla": 24, "attention.value_length_mla": 16, "attention.kv_lora_rank": 32}
    model = write_gguf(tmp_path / "ds.gguf", "deepseek2", meta, io_tensors(64))
    assert kv(estimate(model, ["-c", "1024", "-np", "1"])) == 2 * 48 * 2 * 1024


# ---------------------------------------------------------------------------------------------
# recurrent state


def test_granitehybrid_mamba2_state_is_f32_per_slot(tmp_path: Path) -> None:
    meta = {"block_count": 4, "context_length": 4096, "embedding_length": 64, "feed_forward_length": 128,
            "attention.head_count": 4, "attention.head_count_kv": [0, 0, 0, 2], "ssm.conv_kernel": 4,
            "ssm.inner_size": 128, "ssm.state_size": 16, "ssm.group_count": 1, "ssm.time_step_rank": 4}
    model = write_gguf(tmp_path / "gh.gguf", "granitehybrid", meta, io_tensors(64))
    per_slot = ((4 - 1) * (128 + 2 * 1 * 16) + 16 * 128) * 4  # conv state + SSM state, f32
    one = estimate(model, ["-c", "1024", "-np", "1"])
    assert one.devices["gpu0"].recurrent == 3 * per_slot  # layers 0-2 are Mamba2
    assert kv(one) == (32 * 2 + 32 * 2) * 1024  # only layer 3 has attention (2 heads of 16)
    assert estimate(model, ["-c", "4096", "-np", "4"]).devices["gpu0"].recurrent == 3 * per_slot * 4
    assert estimate(model, ["-c", "65536", "-np", "4"]).devices["gpu0"].recurrent == 3 * per_slot * 4
    assert estimate(model, ["-c", "4096"]).devices["gpu0"].recurrent == 3 * per_slot * 4  # auto: 4 slots
    q8 = estimate(model, ["-c", "1024", "-np", "1", "-ctk", "q8_0", "-ctv", "q8_0"])
    assert q8.devices["gpu0"].recurrent == 3 * per_slot  # always f32
    assert estimate(model, ["-c", "1024", "-np", "1", "-nkvo"]).host.recurrent == 3 * per_slot


def test_lfm2_short_conv_state(tmp_path: Path) -> None:
    meta = {"block_count": 4, "context_length": 4096, "embedding_length": 64, "feed_forward_length": 128,
            "attention.head_count": 4, "attention.head_count_kv": [0, 2, 0, 2], "shortconv.l_cache": 3}
    model = write_gguf(tmp_path / "lfm2.gguf", "lfm2", meta, io_tensors(64, tied=True))
    result = estimate(model, ["-c", "1024", "-np", "2"], device="cpu")
    assert result.host.recurrent == 2 * (64 * (3 - 1) * 4) * 2  # 2 conv layers x n_embd x 2 x f32 x 2 slots
    assert result.host.kv == 2 * (32 * 2 * 2) * 1024


# ---------------------------------------------------------------------------------------------
# weight placement: -ngl, MoE overrides, tied output


def qwen3moe(path: Path, n_layer: int = 4) -> tuple[Path, int]:
    meta = {"block_count": n_layer, "context_length": 4096, "embedding_length": 64, "feed_forward_length": 128,
            "attention.head_count": 4, "attention.head_count_kv": 2, "expert_count": 4, "expert_used_count": 2,
            "expert_feed_forward_length": 32}
    tensors = io_tensors(64)
    for il in range(n_layer):
        tensors |= attention(il, 64, 64, 32) | {
            f"blk.{il}.ffn_norm.weight": ((64,), F32),
            f"blk.{il}.ffn_gate_inp.weight": ((64, 4), F32),
            f"blk.{il}.ffn_gate_exps.weight": ((64, 32, 4), F16),
            f"blk.{il}.ffn_up_exps.weight": ((64, 32, 4), F16),
            f"blk.{il}.ffn_down_exps.weight": ((32, 64, 4), F16),
        }
    return write_gguf(path, "qwen3moe", meta, tensors), 3 * nbytes((64, 32, 4), F16)


def test_cpu_moe_keeps_every_expert_in_host_memory(tmp_path: Path) -> None:
    model, experts_per_layer = qwen3moe(tmp_path / "moe.gguf")
    total = read_gguf_header(model).tensor_bytes
    embd = nbytes((64, N_VOCAB))
    full = estimate(model, ["-c", "1024", "-np", "1"])
    assert full.host.weights == embd and full.devices["gpu0"].weights == total - embd
    cpu_moe = estimate(model, ["-c", "1024", "-np", "1", "--cpu-moe"])
    assert cpu_moe.host.weights == embd + 4 * experts_per_layer
    assert cpu_moe.devices["gpu0"].weights == total - embd - 4 * experts_per_layer
    assert kv(cpu_moe) == kv(full)  # -ot moves weights, never the KV cache


def test_n_cpu_moe_keeps_the_experts_of_the_first_layers(tmp_path: Path) -> None:
    model, experts_per_layer = qwen3moe(tmp_path / "moe.gguf")
    embd = nbytes((64, N_VOCAB))
    result = estimate(model, ["-c", "1024", "-np", "1", "--n-cpu-moe", "2"])
    assert result.host.weights == embd + 2 * experts_per_layer


def test_override_tensor_regex_first_match_wins(tmp_path: Path) -> None:
    model, experts_per_layer = qwen3moe(tmp_path / "moe.gguf")
    embd = nbytes((64, N_VOCAB))
    ffn_per_layer = experts_per_layer + nbytes((64,)) + nbytes((64, 4))  # + ffn_norm + router
    ot = estimate(model, ["-c", "1024", "-np", "1", "-ot", r"blk\.[01]\.ffn_.*=CPU"])
    assert ot.host.weights == embd + 2 * ffn_per_layer
    up = nbytes((64, 32, 4), F16)
    first = estimate(model, ["-c", "1024", "-np", "1",
                             "-ot", r"blk\.0\.ffn_up_exps=CUDA0,blk\.[01]\.ffn_.*=CPU"])
    assert first.host.weights == embd + 2 * ffn_per_layer - up  # blk.0.ffn_up_exps matched CUDA0 first
    assert kv(ot) == kv(first) == 4 * (32 * 2 * 2) * 1024


def test_ngl_counts_the_output_layer_and_offloads_it_first(tmp_path: Path) -> None:
    model = llama(tmp_path / "m.gguf", n_layer=4)
    header = read_gguf_header(model)
    layer = sum(t.nbytes for t in header.tensors if t.name.startswith("blk.0."))
    output = nbytes((64,)) + nbytes((64, N_VOCAB), F16)
    per_layer_kv = (16 * 2 * 2) * 1024
    two = estimate(model, ["-c", "1024", "-np", "1", "-ngl", "2"])  # output layer + block 3
    assert two.devices["gpu0"].weights == output + layer
    assert kv(two) == per_layer_kv and kv(two, "host") == 3 * per_layer_kv
    four = estimate(model, ["-c", "1024", "-np", "1", "-ngl", "4"])  # block 0 stays on the CPU
    assert four.devices["gpu0"].weights == output + 3 * layer
    zero = estimate(model, ["-c", "1024", "-np", "1", "-ngl", "0"])
    assert zero.devices["gpu0"].weights == 0 and zero.host.weights == header.tensor_bytes
    nkvo = estimate(model, ["-c", "1024", "-np", "1", "-nkvo"])
    assert kv(nkvo) == 0 and kv(nkvo, "host") == 4 * per_layer_kv


def test_tied_output_is_copied_to_the_gpu_and_layers_split_across_gpus(tmp_path: Path) -> None:
    model = gemma3(tmp_path / "g.gguf")
    embd = nbytes((64, N_VOCAB))
    one = estimate(model, ["-c", "1024", "-np", "1"])
    header = read_gguf_header(model)
    assert one.host.weights == embd
    assert one.devices["gpu0"].weights == header.tensor_bytes - embd + embd  # the duplicate
    two = estimate(model, ["-c", "1024", "-np", "1", "-ts", "1,1"], n_gpu=2)
    assert set(two.devices) == {"gpu0", "gpu1"}
    assert two.devices["gpu0"].weights + two.devices["gpu1"].weights == one.devices["gpu0"].weights
    assert two.devices["gpu0"].kv > 0 and two.devices["gpu1"].kv > 0


def test_cpu_device_puts_everything_in_host_memory(tmp_path: Path) -> None:
    model = llama(tmp_path / "m.gguf")
    header = read_gguf_header(model)
    result = estimate(model, ["-c", "1024", "-np", "1", "-ngl", "99"], device="cpu")
    assert result.devices == {}
    # mmap: the host buffer spans the file from the first tensor byte to the last
    span = max(t.offset + t.nbytes for t in header.tensors) - min(t.offset for t in header.tensors)
    assert result.host.weights == span >= header.tensor_bytes
    assert result.host.kv == 2 * 64 * 1024 and result.host.compute > 0
    assert result.host.total == (result.host.weights + result.host.kv + result.host.compute
                                 + result.host.output)
    assert estimate(model, ["-dev", "none", "-c", "1024"]).devices == {}


def test_output_buffer_is_logits_per_slot_in_host_memory(tmp_path: Path) -> None:
    model = llama(tmp_path / "m.gguf")
    assert estimate(model, ["-c", "1024", "-np", "3"]).host.output == 3 * N_VOCAB * 4
    assert estimate(model, ["-c", "1024", "-np", "3", "--embedding"]).host.output == 3 * (N_VOCAB + 64) * 4
    assert estimate(model, ["-c", "1024", "-np", "3"]).devices["gpu0"].output == 0


def test_gpu_reserve_is_per_gpu_and_configurable(tmp_path: Path) -> None:
    model = llama(tmp_path / "m.gguf")
    default = estimate(model, ["-c", "1024"])
    assert default.devices["gpu0"].reserve == 400 * MIB
    assert estimate(model, ["-c", "1024"], gpu_reserve=0).devices["gpu0"].total == (
        default.devices["gpu0"].total - 400 * MIB)


def test_mmproj_goes_to_the_first_gpu_unless_told_otherwise(tmp_path: Path) -> None:
    model = llama(tmp_path / "m.gguf")
    w = gguf.GGUFWriter(tmp_path / "mmproj.gguf", "clip")
    for key, value in (("clip.vision.embedding_length", 32), ("clip.vision.feed_forward_length", 64),
                       ("clip.vision.attention.head_count", 2), ("clip.vision.image_size", 64),
                       ("clip.vision.patch_size", 16)):
        w.add_uint32(key, value)
    w.add_tensor("v.patch_embd.weight", np.zeros((32, 768), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    on_gpu = estimate(model, ["-c", "1024", "--mmproj", str(tmp_path / "mmproj.gguf")])
    n_pos = (64 // 16) ** 2 + 1
    assert on_gpu.devices["gpu0"].mmproj == 32 * 768 * 4 + 4 * n_pos * (4 * 32 + 2 * 64) + 2 * n_pos * n_pos
    on_cpu = estimate(model, ["-c", "1024", "--mmproj", str(tmp_path / "mmproj.gguf"), "--no-mmproj-offload"])
    assert on_cpu.devices["gpu0"].mmproj == 0 and on_cpu.host.mmproj == on_gpu.devices["gpu0"].mmproj


def test_bert_has_no_kv_cache(tmp_path: Path) -> None:
    meta = {"block_count": 2, "context_length": 512, "embedding_length": 64, "feed_forward_length": 128,
            "attention.head_count": 4, "attention.causal": False, "pooling_type": 1}
    model = write_gguf(tmp_path / "bert.gguf", "bert", meta, io_tensors(64, tied=True))
    result = estimate(model, ["-c", "512", "--embeddings"], device="cpu")
    assert result.host.kv == 0 and result.host.recurrent == 0
    assert result.host.weights == read_gguf_header(model).tensor_bytes  # no LM head, no duplicate
    ctx = plan_context(read_hparams(read_gguf_header(model)), parse_server_args(["--embeddings"]))
    assert ctx.n_batch == ctx.n_ubatch == 512  # embeddings: the whole input in one ubatch


# ---------------------------------------------------------------------------------------------
# the llama-server flag parser


def test_server_args_defaults_and_spellings() -> None:
    args = parse_server_args([])
    assert (args.n_parallel, args.n_gpu_layers, args.n_batch, args.n_ubatch) == (-1, -1, 2048, 512)
    assert (args.flash_attn, args.cache_type_k, args.ctx_size) == ("auto", "f16", None)
    args = parse_server_args(["llama-server", "--model", "x.gguf", "-c=8192", "--parallel", "4", "-ngl", "all",
                              "--unknown-flag", "value", "-fa", "off", "-ctk", "Q8_0", "--n-gpu-layers=7",
                              "-b", "1024", "--ubatch-size", "256", "-nkvo", "--swa-full", "-kvu"])
    assert (args.model, args.ctx_size, args.n_parallel, args.n_gpu_layers) == ("x.gguf", 8192, 4, 7)
    assert (args.flash_attn, args.cache_type_k, args.n_batch, args.n_ubatch) == ("off", "q8_0", 1024, 256)
    assert args.no_kv_offload and args.swa_full and args.kv_unified


def test_server_args_overrides_keep_argv_order() -> None:
    args = parse_server_args(["-ot", "a=CPU,b=CUDA0", "--n-cpu-moe", "2", "--cpu-moe"])
    assert args.overrides == (
        TensorOverride("a", "CPU"), TensorOverride("b", "CUDA0"),
        TensorOverride(r"blk\.0\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU"),
        TensorOverride(r"blk\.1\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU"),
        TensorOverride(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU"),
    )


@pytest.mark.parametrize("argv", [["-c", "lots"], ["-ctk", "q9"], ["-fa", "maybe"], ["-ot", "nopattern"],
                                  ["--ctx-size"]])
def test_server_args_bad_values(argv: list[str]) -> None:
    with pytest.raises(ServerArgsError):
        parse_server_args(argv)


# ---------------------------------------------------------------------------------------------
# steward estimate


def test_cli_json_is_bytes_per_component(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = llama(tmp_path / "m.gguf")
    assert main(["estimate", str(model), "--json", "--", "-c", "8192", "-np", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == str(model)
    keys = {"weights", "kv", "recurrent", "compute", "mmproj", "reserve", "total"}
    assert keys <= set(out["devices"]["gpu0"]) and {"weights", "kv", "compute", "total"} <= set(out["host"])
    assert out["devices"]["gpu0"]["kv"] == 2 * 64 * 8192
    assert out == estimate(model, ["-c", "8192", "-np", "4"]).to_json()
    assert main(["estimate", "--device", "cpu", "--json", str(model), "--", "-c", "1024"]) == 0
    cpu = json.loads(capsys.readouterr().out)
    assert cpu["devices"] == {} and cpu["host"]["kv"] == 2 * 64 * 1024


def test_cli_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = llama(tmp_path / "m.gguf")
    assert main(["estimate", str(model), "--", "-c", "4096", "-np", "2"]) == 0
    out = capsys.readouterr().out
    assert "gpu0" in out and "host" in out and "4096 cells (2 x 2048)" in out
    for row in ("weights", "kv", "recurrent", "compute", "mmproj", "output", "reserve", "total"):
        assert f"\n{row}" in out


def test_cli_bad_file_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"PK\x03\x04 not a model")
    assert main(["estimate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"steward: {bad}: not a GGUF file (magic b'PK\\x03\\x04')"
    assert main(["estimate", str(tmp_path / "missing.gguf")]) == 2
    assert "Traceback" not in capsys.readouterr().err
    assert main(["estimate", str(llama(tmp_path / "m.gguf")), "--", "-ctk", "q9"]) == 2
    assert "--cache-type-k" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# against the real llama-server (docs/estimates.md)

# Tiny models, widened so that their buffers print with enough digits (the log shows MiB
# with two decimals, i.e. +-0.005 MiB).
TINY_MODELS: dict[str, dict[str, Any]] = {
    "llama": dict(n_layer=4, n_embd=256, n_head=8, n_head_kv=2, n_ff=768, n_vocab=2048),
    "gemma3": dict(n_layer=6, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512, sliding_window=128,
                   n_vocab=2048),
    "qwen3moe": dict(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512, n_expert=8,
                     n_expert_used=2, n_ff_exp=128, n_vocab=2048),
    "lfm2": dict(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, shortconv_l_cache=3, n_vocab=2048),
    "granitehybrid": dict(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, ssm_d_conv=4,
                          ssm_d_state=64, ssm_n_group=1, ssm_dt_rank=8, n_vocab=2048),
    "bert": dict(n_layer=2, n_embd=256, n_head=4, n_head_kv=4, n_ff=512),
    "gemma3n": dict(),
}
TINY_CONFIGS = (("-c", "1024", "-np", "1"), ("-c", "4096", "-np", "4"), ("-c", "4096"))
COMPONENTS = ("weights", "kv", "recurrent", "compute", "output")
PRINT_RESOLUTION = round(0.005 * MIB)  # the log's two decimals
EXACT = 0.01  # weights, KV, recurrent state: within 1 % (or the print resolution)
COMPUTE = 0.20
TOTAL = (-0.02, 0.05)


@attrs.frozen
class Comparison:
    arch: str
    args: tuple[str, ...]
    measured: dict[str, int]
    estimated: dict[str, int]

    def error(self, component: str) -> float | None:
        measured, estimated = self.measured[component], self.estimated[component]
        return None if measured == 0 else (estimated - measured) / measured

    def close(self, component: str, tolerance: float) -> bool:
        measured, estimated = self.measured[component], self.estimated[component]
        return abs(estimated - measured) <= max(tolerance * measured, PRINT_RESOLUTION)


def run_llama_server(binary: Path, model: Path, args: list[str], log: Path) -> MeasuredBreakdown:
    """Start llama-server, wait until it serves (every buffer is allocated by then), stop it, read its log."""
    with open_bare_llama_server(binary, model, ["-lv", "4", *args], log):
        pass
    return parse_llama_log(log.read_text(errors="replace"))


def compare_tiny_models(binary: Path, workdir: Path) -> list[Comparison]:
    from fakes.tiny_gguf import write_tiny_model

    rows = []
    for arch, overrides in TINY_MODELS.items():
        model = write_tiny_model(workdir / f"{arch}.gguf", arch, **overrides)
        for config in TINY_CONFIGS:
            args = [*config, *(["--embeddings"] if not model.causal else [])]
            measured = run_llama_server(binary, model.path, args, workdir / f"{arch}.log")
            host = estimate(model.path, args, device="cpu").host
            rows.append(Comparison(
                arch, config,
                {c: measured.component(c) for c in COMPONENTS} | {"total": measured.total()},
                {c: getattr(host, c) for c in COMPONENTS} | {"total": host.total},
            ))
    return rows


@pytest.mark.slow
def test_estimate_matches_the_real_llama_server(tmp_path: Path) -> None:
    """Needs the real llama-server (fakes.llama_binary); a missing binary fails this test."""
    from fakes.llama_binary import llama_server_path

    try:
        binary = llama_server_path()
    except FileNotFoundError as exc:
        pytest.fail(str(exc))
    rows = compare_tiny_models(binary, tmp_path)
    problems = [problem for row in rows for problem in off_by_more_than_allowed(row)]
    assert not problems, "\n".join(problems)
    assert {row.arch for row in rows} == set(TINY_MODELS)


def off_by_more_than_allowed(row: Comparison) -> list[str]:
    """Weights, KV and recurrent state exact (EXACT), compute within COMPUTE, the total within TOTAL."""
    where = f"{row.arch} {' '.join(row.args)}"
    problems = [f"{where}: {component} {row.estimated[component]} vs {row.measured[component]}"
                for component in ("weights", "kv", "recurrent") if not row.close(component, EXACT)]
    if not row.close("compute", COMPUTE):
        problems.append(f"{where}: compute off by {row.error('compute'):+.1%}")
    low, high = TOTAL
    if not low <= (row.error("total") or 0.0) <= high:
        problems.append(f"{where}: total off by {row.error('total'):+.1%}")
    return problems


SMOLLM2_CONFIGS = (("-c", "2048", "-np", "1"), ("-c", "8192", "-np", "4"), ("-c", "8192"))


def compare_smollm2(binary: Path, workdir: Path) -> list[Comparison]:
    """The real instruct model (fakes/real_model.py) at the contexts the tests and the demo give it."""
    from fakes.real_model import smollm2_gguf

    model = smollm2_gguf()
    rows = []
    for config in SMOLLM2_CONFIGS:
        measured = run_llama_server(binary, model, list(config), workdir / "smollm2.log")
        host = estimate(model, list(config), device="cpu").host
        rows.append(Comparison("smollm2-135m-q4_1", config,
                               {c: measured.component(c) for c in COMPONENTS} | {"total": measured.total()},
                               {c: getattr(host, c) for c in COMPONENTS} | {"total": host.total}))
    return rows


@pytest.mark.slow
def test_estimate_matches_the_real_llama_server_on_a_real_model(tmp_path: Path) -> None:
    """SmolLM2-135M-Instruct Q4_1 (a real llama-architecture model, not one written here)."""
    from fakes.llama_binary import llama_server_path

    rows = compare_smollm2(llama_server_path(), tmp_path)
    problems = [problem for row in rows for problem in off_by_more_than_allowed(row)]
    assert not problems, "\n".join(problems)


def markdown_table(rows: list[Comparison]) -> str:
    def cell(row: Comparison, component: str) -> str:
        measured, estimated = row.measured[component] / MIB, row.estimated[component] / MIB
        error = row.error(component)
        if measured == 0 and estimated == 0:
            return "-"
        pct = "" if error is None else f" ({error:+.1%})"
        return f"{measured:.2f} / {estimated:.3f}{pct}"

    lines = ["| model | flags | weights | KV | recurrent | compute | output | total |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        cells = " | ".join(cell(row, c) for c in (*COMPONENTS, "total"))
        lines.append(f"| {row.arch} | `{' '.join(row.args)}` | {cells} |")
    return "\n".join(lines)


if __name__ == "__main__":
    from fakes.llama_binary import llama_server_path

    with tempfile.TemporaryDirectory() as tmp:
        print(markdown_table(compare_tiny_models(llama_server_path(), Path(tmp))
                             + compare_smollm2(llama_server_path(), Path(tmp))))
    sys.exit(0)
