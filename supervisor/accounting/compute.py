"""Compute (graph) buffer: a calibrated approximation, not an exact count.

llama.cpp sizes the compute buffer by building the worst-case prompt graph
(``llama_context::sched_reserve`` in ``src/llama-context.cpp``: ``T = min(n_ctx,
n_ubatch)`` tokens, ``min(T, n_outputs_max)`` outputs, where llama-server sets
``n_outputs_max`` to the slot count, or to ``n_batch`` for embeddings) and taking
ggml-alloc's peak over it (``ggml/src/ggml-alloc.c``: tensors are freed after their
last use and some ops reuse their input in place). There is no closed form; this
module models the peak as

    compute = masks + per-layer inputs + max over layers of max(mixer, FFN, output head)

in f32 elements per token (x 4 bytes x T), with e = n_embd, q = n_head x head_dim,
kv = n_head_kv x head_dim:

    KQ masks        n_kv x T per KV cache (a sliding-window model has two), f16 with
                    flash attention, f32 without; models without a cache: T x T
    attention       3e + 2q + kv   (+ the f32 KQ scores n_kv x T x n_head without flash attention)
    gated FFN       3e + 3 n_ff + q          non-gated (BERT): 3e + n_ff
    MoE FFN         3e + 3 n_used x n_ff_exp + 2 n_expert
    Mamba2 mixer    3e + 2 in_proj + d_xbc + d_inner
    short conv      7e (LFM2)
    output head     n_vocab + e per output (e only for models without an LM head)
    per-layer embd  4 x n_layer x n_embd_per_layer (Gemma 3n/4: live for the whole graph)

The coefficients were fitted to the CPU compute buffers llama-server b1-0c1e570
reports (a grid over n_embd, n_ff, heads for llama and BERT, plus the tiny models of
docs/estimates.md); fragmentation in ggml-alloc makes the real peak wander by about
±10-20 % around this.

GPU placement: the device that holds a layer computes it; the host keeps the
token-embedding lookup (the input layer stays on the CPU). When weights of a
layer stay in host memory while a GPU exists, llama.cpp copies them into the GPU
compute buffer for large batches (op offload, PR #6083): the largest host-resident
weight of one layer is added to the first GPU. With several GPUs and full offload,
pipeline parallelism keeps 4 copies of the graph inputs per GPU.
"""

from __future__ import annotations

from supervisor.accounting.context import ContextPlan
from supervisor.accounting.gguf_header import GGUFHeader
from supervisor.accounting.hparams import NO_LM_HEAD_ARCHS, ModelHParams
from supervisor.accounting.kv_cache import KvLayer
from supervisor.accounting.placement import HOST, WeightPlacement

F32 = 4
F16 = 2
PIPELINE_COPIES = 4  # ggml_backend_sched n_copies with pipeline parallelism
SMALL_INPUTS = 5  # token ids, positions, K/V row indices: ~5 f32-sized values per token
GEMMA3N_ALTUP = 4  # hidden-state copies of Gemma 3n's AltUp (hard-coded in llama.cpp)


def _mask_bytes(ctx: ContextPlan, kv: list[KvLayer], n_tokens: int) -> int:
    element = F16 if ctx.flash_attn else F32
    if not kv:
        return n_tokens * n_tokens * element if not ctx.causal else 0
    caches = {layer.swa: layer.cells * layer.n_stream for layer in kv}
    # a non-unified cache has one mask per stream, each for its share of the tokens
    streams = kv[0].n_stream
    return sum(cells * (n_tokens // streams) * element for cells in caches.values())


def _mixer(hp: ModelHParams, ctx: ContextPlan, il: int, kv_cells: int, n_tokens: int) -> float:
    """Peak f32 elements per token of layer *il*'s token mixer (attention or recurrent)."""
    e = hp.n_embd
    if il in hp.recurrent_layers and il not in hp.attention_layers:
        if hp.ssm_d_inner:
            d_xbc = hp.ssm_d_inner + 2 * hp.ssm_n_group * hp.ssm_d_state
            in_proj = hp.ssm_d_inner + d_xbc + hp.ssm_dt_rank
            return 3 * e + 2 * in_proj + d_xbc + hp.ssm_d_inner
        return 3 * e + 2 * max(hp.n_embd_r, 2 * e)  # short conv (7e), RWKV
    q_dim = hp.n_head[il] * max(hp.head_k, hp.head_v)
    kv_dim = max(hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il))
    mixer = 3 * e + 2 * q_dim + kv_dim
    if not ctx.flash_attn:
        mixer += (kv_cells or n_tokens) * hp.n_head[il]  # KQ scores; softmax runs in place
    return mixer


def _ffn(header: GGUFHeader, hp: ModelHParams, il: int) -> float:
    e = hp.n_embd
    if hp.n_expert and hp.n_ff_exp and il >= hp.n_layer_dense_lead:
        routed = 3 * e + 3 * hp.n_expert_used * hp.n_ff_exp + 2 * hp.n_expert
        return max(routed, 3 * e + 3 * hp.n_ff_shexp)
    n_ff = hp.n_ff[il]
    if not n_ff:
        return 0
    q_dim = hp.n_head[il] * max(hp.head_k, hp.head_v)
    if header.tensor(f"blk.{il}.ffn_gate.weight") is None and header.tensor(f"blk.{il}.ffn_up.weight") is not None:
        return 3 * e + n_ff  # up -> activation in place -> down
    return 3 * e + 3 * n_ff + q_dim


def compute_bytes(header: GGUFHeader, hp: ModelHParams, ctx: ContextPlan, placement: WeightPlacement,
                  kv: list[KvLayer]) -> dict[str, int]:
    """Compute buffer bytes per device (``host`` and ``gpuN``)."""
    n_tokens = ctx.n_tokens_reserve
    n_outputs = min(n_tokens, ctx.n_outputs_max)
    cells = {layer.il: layer.cells for layer in kv}
    masks = _mask_bytes(ctx, kv, n_tokens)
    per_layer_embd = 4 * hp.n_layer * hp.n_embd_per_layer * F32 * n_tokens
    if hp.arch == "gemma3n":
        per_layer_embd += GEMMA3N_ALTUP * hp.n_embd * F32 * n_tokens
    head = hp.n_embd if hp.arch in NO_LM_HEAD_ARCHS else hp.n_vocab + hp.n_embd

    peak: dict[str, float] = {}
    for il in range(hp.n_layer):
        device = placement.layer_devices[il]
        layer = max(_mixer(hp, ctx, il, cells.get(il, 0), n_tokens), _ffn(header, hp, il)) * F32 * n_tokens
        peak[device] = max(peak.get(device, 0), layer)
    output = placement.output_device
    peak[output] = max(peak.get(output, 0), head * F32 * n_outputs)

    gpus = sorted(d for d in peak if d != HOST)
    copies = PIPELINE_COPIES if len(gpus) > 1 and HOST not in placement.layer_devices else 1
    small = SMALL_INPUTS * F32 * n_tokens
    out: dict[str, int] = {}
    for device, layer_peak in peak.items():
        inputs = masks + small if device != HOST or not gpus else small
        out[device] = int(inputs * (copies if device != HOST else 1) + layer_peak)
    if gpus:
        # the input layer stays on the CPU: its embedding lookup (and Gemma's per-layer
        # embedding lookup) is host compute; the rest of the per-layer inputs go with layer 0
        out[HOST] = out.get(HOST, 0) + hp.n_embd * F32 * n_tokens + per_layer_embd // 4
        first = placement.layer_devices[0] if placement.layer_devices[0] != HOST else gpus[0]
        out[first] = out.get(first, 0) + per_layer_embd - per_layer_embd // 4
        staged = _largest_host_weight_per_layer(header, placement)
        if staged and n_tokens >= 32:
            out[gpus[0]] += staged
    else:
        out[HOST] = out.get(HOST, 0) + per_layer_embd
    return out


def _largest_host_weight_per_layer(header: GGUFHeader, placement: WeightPlacement) -> int:
    """Bytes of the biggest host-resident weight of one layer (op offload staging)."""
    largest = 0
    for tensor in header.tensors:
        if tensor.name.startswith("blk.") and placement.tensor_devices[tensor.name] == HOST:
            largest = max(largest, tensor.nbytes)
    return largest
