"""Compute (graph) buffer: a calibrated approximation, not an exact count.

llama.cpp sizes the compute buffer by building the worst-case prompt graph
(``llama_context::sched_reserve``, ``src/llama-context.cpp``: ``n_tokens =
min(n_ctx, n_ubatch)`` tokens, ``n_outputs = min(n_tokens, n_outputs_max)``)
and taking ggml-alloc's peak over it, per backend. There is no closed form; the
peak is modelled as

    compute = inputs + max(peak layer, output head)

    inputs      KQ mask per KV cache: n_kv x n_tokens, f16 with flash attention
                (f32 without); non-causal models: n_tokens x n_tokens;
                + the token embeddings f32[n_embd, n_tokens]
    attention   f32 x n_tokens x (3 n_embd + 2 q_dim + 2 kv_dim)
                (+ f32 KQ = n_kv x n_tokens x n_head, twice, without flash attention)
    FFN         f32 x n_tokens x (3 n_embd + 3 n_ff)
    MoE FFN     f32 x n_tokens x (3 n_embd + 2 n_expert + n_used (3 n_ff_exp + n_embd))
    recurrent   f32 x n_tokens x (3 n_embd + 2 x in_proj width)
    output      f32 x n_outputs x (n_vocab + n_embd)

The coefficients were fitted to the CPU compute buffers llama-server b1-0c1e570
reports for the tiny models in docs/estimates.md (llama, gemma3, qwen3moe, lfm2,
granitehybrid, bert, gemma3n); see that page for the measured error.

GPU placement: the device that holds a layer computes it; the host keeps the
token embedding lookup (the input layer stays on the CPU). When layers or expert
weights stay on the CPU while a GPU exists, llama.cpp copies those weights into the
GPU compute buffer for large batches (op offload, PR #6083): the largest
host-resident weight of one layer is added to the first GPU.
"""

from __future__ import annotations

from supervisor.accounting.context import ContextPlan
from supervisor.accounting.gguf_header import GGUFHeader
from supervisor.accounting.hparams import ModelHParams
from supervisor.accounting.kv_cache import KvLayer
from supervisor.accounting.placement import HOST, WeightPlacement

F32 = 4
F16 = 2
# ggml_backend_sched with pipeline parallelism keeps this many copies of the graph inputs
PIPELINE_COPIES = 4


def _mask_bytes(ctx: ContextPlan, kv: list[KvLayer], n_tokens: int) -> int:
    element = F16 if ctx.flash_attn else F32
    if not ctx.causal and not kv:
        return n_tokens * n_tokens * element  # non-causal models without a cache mask the batch itself
    caches = {layer.swa: layer.cells for layer in kv}
    return sum(cells * n_tokens * element for cells in caches.values())


def _layer_peak(hp: ModelHParams, ctx: ContextPlan, il: int, n_tokens: int, kv_cells: int) -> int:
    """Peak f32 working set of layer *il* over its attention/recurrent part and its FFN."""
    e = hp.n_embd
    if il in hp.recurrent_layers and il not in hp.attention_layers:
        width = max(hp.n_embd_r, 2 * e)  # short-conv / SSM projections are a few n_embd wide
        mixer = F32 * n_tokens * (3 * e + 2 * width)
    else:
        q_dim = hp.n_head[il] * max(hp.head_k, hp.head_v)
        kv_dim = max(hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il))
        mixer = F32 * n_tokens * (3 * e + 2 * q_dim + 2 * kv_dim)
        if not ctx.flash_attn:
            n_kv = kv_cells if kv_cells else n_tokens
            mixer += 2 * F32 * n_kv * n_tokens * hp.n_head[il]
    if hp.n_expert and hp.n_ff_exp:
        ffn = F32 * n_tokens * (3 * e + 2 * hp.n_expert + hp.n_expert_used * (3 * hp.n_ff_exp + e))
    else:
        ffn = F32 * n_tokens * (3 * e + 3 * hp.n_ff[il])
    return max(mixer, ffn)


def compute_bytes(header: GGUFHeader, hp: ModelHParams, ctx: ContextPlan, placement: WeightPlacement,
                  kv: list[KvLayer]) -> dict[str, int]:
    """Compute buffer bytes per device (``host`` and ``gpuN``)."""
    n_tokens = ctx.n_tokens_reserve
    n_outputs = min(n_tokens, ctx.n_outputs_max)
    cells = {layer.il: layer.cells for layer in kv}
    inputs = _mask_bytes(ctx, kv, n_tokens)
    embeddings = F32 * n_tokens * hp.n_embd
    output = F32 * n_outputs * (hp.n_vocab + hp.n_embd) if hp.arch else 0

    peak: dict[str, int] = {}
    for il in range(hp.n_layer):
        device = placement.layer_devices[il]
        peak[device] = max(peak.get(device, 0), _layer_peak(hp, ctx, il, n_tokens, cells.get(il, 0)))
    peak[placement.output_device] = max(peak.get(placement.output_device, 0), output)

    out: dict[str, int] = {}
    gpus = sorted(d for d in peak if d != HOST)
    copies = PIPELINE_COPIES if len(gpus) > 1 and HOST not in placement.layer_devices else 1
    for device, layer_peak in peak.items():
        device_inputs = inputs if device != HOST or not gpus else 0
        out[device] = device_inputs * (copies if device != HOST else 1) + layer_peak
    out[HOST] = out.get(HOST, 0) + embeddings
    if gpus:
        staged = _largest_host_weight_per_layer(header, placement)
        if staged and n_tokens >= 32:
            out[gpus[0]] += staged
    return out


def _largest_host_weight_per_layer(header: GGUFHeader, placement: WeightPlacement) -> int:
    """Bytes of the biggest set of host-resident weights of one layer (op offload staging)."""
    per_layer: dict[str, int] = {}
    for tensor in header.tensors:
        if not tensor.name.startswith("blk.") or placement.tensor_devices[tensor.name] != HOST:
            continue
        block = tensor.name.split(".", 2)[1]
        per_layer[block] = max(per_layer.get(block, 0), tensor.nbytes)
    return max(per_layer.values(), default=0)
