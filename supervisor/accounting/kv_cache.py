"""KV cache and recurrent state sizes per layer (llama.cpp b1-0c1e570).

* ``llama_kv_cache::llama_kv_cache`` (``src/llama-kv-cache.cpp``): per layer with a cache,
  K = ``row(type_k, n_embd_k_gqa) * kv_size * n_stream`` and V likewise; without flash
  attention V is stored transposed and padded to the widest layer
  ([TAG_V_CACHE_VARIABLE]); MLA models keep K only. Device: the layer's ``-ngl``
  device, or the host with ``-nkvo``.
* ``llama_kv_cache_iswa`` (``src/llama-kv-cache-iswa.cpp``): sliding-window layers get
  ``pad256(min(n_ctx_seq, n_swa * (unified ? n_seq_max : 1) + n_ubatch))`` cells, or
  ``n_ctx_seq`` with ``--swa-full``.
* ``llama_memory_recurrent`` (``src/llama-memory-recurrent.cpp``): one f32 row of
  ``n_embd_r`` and one of ``n_embd_s`` per slot (``max(1, n_seq_max)``) per recurrent
  layer, whatever ``-ctk/-ctv`` say and whatever the context size.
"""

from __future__ import annotations

import attrs

from supervisor.accounting.context import KV_PAD, ContextPlan, pad
from supervisor.accounting.gguf_header import ggml_row_bytes
from supervisor.accounting.hparams import ModelHParams
from supervisor.accounting.placement import HOST, WeightPlacement

# ggml type ids of the KV cache types (ggml.h enum ggml_type)
CACHE_TYPE_IDS = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
                  "iq4_nl": 20, "bf16": 30}
QUANTIZED_CACHE_TYPES = frozenset({"q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl"})
F32_BYTES = 4


@attrs.frozen
class KvLayer:
    il: int
    swa: bool
    cells: int  # per stream
    n_stream: int
    k_bytes: int
    v_bytes: int
    device: str

    @property
    def nbytes(self) -> int:
        return self.k_bytes + self.v_bytes


@attrs.frozen
class RecurrentLayer:
    il: int
    slots: int
    nbytes: int
    device: str


def swa_cells(hp: ModelHParams, ctx: ContextPlan, swa_full: bool) -> int:
    if swa_full:
        return ctx.n_ctx_seq
    window = hp.n_swa * (ctx.n_seq_max if ctx.kv_unified else 1) + ctx.n_ubatch
    return pad(min(ctx.n_ctx_seq, window), KV_PAD)


def kv_layers(hp: ModelHParams, ctx: ContextPlan, placement: WeightPlacement, *,
              cache_type_k: str = "f16", cache_type_v: str = "f16", swa_full: bool = False,
              offload: bool = True) -> list[KvLayer]:
    k_type, v_type = CACHE_TYPE_IDS[cache_type_k], CACHE_TYPE_IDS[cache_type_v]
    v_trans = not ctx.flash_attn
    v_width_max = hp.n_embd_v_gqa_max()
    cells_swa = swa_cells(hp, ctx, swa_full)
    out = []
    for il in hp.attention_layers:
        swa = hp.is_swa[il]
        cells = cells_swa if swa else ctx.n_ctx_seq
        rows = cells * ctx.n_stream
        k_bytes = ggml_row_bytes(k_type, hp.n_embd_k_gqa(il)) * rows
        v_width = v_width_max if v_trans else hp.n_embd_v_gqa(il)
        v_bytes = 0 if hp.is_mla else ggml_row_bytes(v_type, v_width) * rows
        device = placement.layer_devices[il] if offload else HOST
        out.append(KvLayer(il, swa, cells, ctx.n_stream, k_bytes, v_bytes, device))
    return out


def recurrent_layers(hp: ModelHParams, ctx: ContextPlan, placement: WeightPlacement, *,
                     offload: bool = True) -> list[RecurrentLayer]:
    slots = max(1, ctx.n_seq_max)
    per_layer = (hp.n_embd_r + hp.n_embd_s) * F32_BYTES * slots
    return [RecurrentLayer(il, slots, per_layer, placement.layer_devices[il] if offload else HOST)
            for il in hp.recurrent_layers]
