"""Model hyperparameters from a GGUF header, as llama.cpp b1-0c1e570 derives them.

Mirrors ``llama_model_base::load_hparams`` (``src/llama-model.cpp``), the per-arch
``load_arch_hparams`` in ``src/models/*.cpp`` and ``src/llama-hparams.cpp``: per-layer
head counts, which layers slide (SWA), which are recurrent, which own a KV cache,
and the recurrent state widths ``n_embd_r``/``n_embd_s``.
"""

from __future__ import annotations

from typing import Any

import attrs

from supervisor.accounting.gguf_header import GGUFHeader

# create_memory() returns no memory for these (src/llama-model.cpp): no KV cache at all.
NO_MEMORY_ARCHS = frozenset({
    "bert", "jina-bert-v2", "jina-bert-v3", "nomic-bert", "nomic-bert-moe", "neo-bert", "eurobert",
    "wavtokenizer-dec", "modern-bert", "gemma-embedding", "dream", "llada", "llada-moe", "rnd1",
})
# llm_arch_is_recurrent / llm_arch_is_hybrid (src/llama-arch.cpp)
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID_ARCHS = frozenset({
    "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe",
    "qwen3next", "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next", "qwen35", "qwen35moe", "qwen4exp",
    "deepseek4", "minimax-01",
})
# Hybrids whose recurrent layers follow <arch>.full_attention_interval (default 4).
_INTERVAL_HYBRIDS = frozenset({"qwen3next", "qwen35", "qwen35moe", "qwen4exp", "minimax-01"})
# Models without an LM head: no tied output copy of token_embd.
NO_LM_HEAD_ARCHS = NO_MEMORY_ARCHS - {"dream", "llada", "llada-moe", "rnd1"} | {"t5encoder"}


@attrs.frozen
class _SwaRule:
    period: int
    dense_first: bool = False
    needs_key: bool = True  # SWA only when <arch>.attention.sliding_window > 0
    fixed_window: int = 0  # window hard-coded by llama.cpp (0: read the key)


# load_swa_pattern(ml, period, dense_first) calls in src/models/*.cpp
_SWA_RULES = {
    "gemma2": _SwaRule(2, needs_key=False, fixed_window=0),
    "gemma3": _SwaRule(6),
    "gemma3n": _SwaRule(5, needs_key=False),
    "gemma-embedding": _SwaRule(6, needs_key=False),
    "cohere2": _SwaRule(4, needs_key=False),
    "cohere2moe": _SwaRule(4, dense_first=True, needs_key=False),
    "exaone-moe": _SwaRule(4, needs_key=False, fixed_window=128),
    "gpt-oss": _SwaRule(2, needs_key=False),
    "muse-glimmer": _SwaRule(4, needs_key=False),
    "afmoe": _SwaRule(4),
    "laguna": _SwaRule(4, dense_first=True),
    "mellum": _SwaRule(4),
    "olmo2": _SwaRule(4),
    "plamo3": _SwaRule(8),
    "smallthinker": _SwaRule(4, dense_first=True, fixed_window=4096),
    "modern-bert": _SwaRule(3, dense_first=True),
}


@attrs.frozen
class ModelHParams:
    arch: str
    n_layer_all: int  # block_count, including NextN/MTP blocks
    n_layer_nextn: int
    n_embd: int
    n_vocab: int
    n_ctx_train: int
    n_head: tuple[int, ...]  # per layer
    n_head_kv: tuple[int, ...]  # per layer
    n_ff: tuple[int, ...]  # per layer
    head_k: int
    head_v: int
    head_k_swa: int
    head_v_swa: int
    is_mla: bool
    n_swa: int
    is_swa: tuple[bool, ...]
    is_recurrent: tuple[bool, ...]
    n_layer_kv_from_start: int  # -1: every layer may own KV
    memory: str  # "none" | "kv" | "recurrent" | "hybrid"
    attention_layers: tuple[int, ...]  # layers with a KV cache of their own
    recurrent_layers: tuple[int, ...]  # layers with recurrent state
    n_embd_r: int
    n_embd_s: int
    causal: bool
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_embd_per_layer: int
    pooling: int | None
    n_ff_shexp: int = 0
    n_layer_dense_lead: int = 0
    ssm_d_conv: int = 0
    ssm_d_inner: int = 0
    ssm_d_state: int = 0
    ssm_n_group: int = 0
    ssm_dt_rank: int = 0
    shortconv_l_cache: int = 0

    @property
    def n_layer(self) -> int:
        """Trunk layers (without NextN/MTP blocks)."""
        return self.n_layer_all - self.n_layer_nextn

    def n_embd_k_gqa(self, il: int) -> int:
        return (self.head_k_swa if self.is_swa[il] else self.head_k) * self.n_head_kv[il]

    def n_embd_v_gqa(self, il: int) -> int:
        return (self.head_v_swa if self.is_swa[il] else self.head_v) * self.n_head_kv[il]

    def n_embd_v_gqa_max(self) -> int:
        return max([self.n_embd_v_gqa(il) for il in range(self.n_layer_all)] + [0])


class HParamsError(ValueError):
    pass


def _per_layer(header: GGUFHeader, suffix: str, n_layer: int, default: Any) -> tuple[int, ...]:
    """``get_key_or_arr``: a scalar for every layer, or one value per layer."""
    value = header.arch_get(suffix, default)
    if isinstance(value, list):
        if len(value) != n_layer:
            raise HParamsError(f"{header.arch}.{suffix} has {len(value)} entries for {n_layer} layers")
        return tuple(int(v) for v in value)
    return (int(value),) * n_layer


def read_hparams(header: GGUFHeader) -> ModelHParams:
    arch = header.arch
    get = header.arch_get
    n_layer_all = int(get("block_count", 0))
    if n_layer_all <= 0:
        raise HParamsError(f"{arch}.block_count is missing")
    n_nextn = int(get("nextn_predict_layers", 0))
    n_layer = n_layer_all - n_nextn
    n_embd = int(get("embedding_length", 0))

    n_head = _per_layer(header, "attention.head_count", n_layer_all, 0)
    n_head_kv = n_head  # n_head_kv is optional, default to n_head
    if header.arch_get("attention.head_count_kv") is not None:
        n_head_kv = _per_layer(header, "attention.head_count_kv", n_layer_all, 0)
    n_ff = _per_layer(header, "feed_forward_length", n_layer_all, 0)

    head_k = head_v = 0
    if n_head[0] > 0:
        head_k = int(get("attention.key_length", n_embd // n_head[0]))
        head_v = int(get("attention.value_length", n_embd // n_head[0]))
    head_k_swa = int(get("attention.key_length_swa", head_k))
    head_v_swa = int(get("attention.value_length_swa", head_v))
    is_mla = get("attention.key_length_mla") is not None and get("attention.value_length_mla") is not None

    n_swa, is_swa = _sliding_window(header, n_layer_all, n_layer, n_head_kv)
    is_recr = _recurrent_layers(arch, header, n_layer_all, n_layer, n_head_kv, n_ff)

    n_kv_from_start = -1
    if arch == "gemma3n":
        n_kv_from_start = 20  # hard-coded in src/models/gemma3n.cpp; shared_kv_layers is not read
    elif arch == "gemma4":
        n_kv_from_start = n_layer_all - int(get("attention.shared_kv_layers", 0))

    memory, attn, recr = _memory_layers(arch, n_layer_all, n_layer, n_nextn, is_recr, n_head_kv, n_ff,
                                        n_kv_from_start)
    n_embd_r, n_embd_s = _recurrent_widths(header, n_embd, n_head[0] if n_head else 0)
    causal = bool(get("attention.causal", True))
    pooling = get("pooling_type")
    return ModelHParams(
        arch=arch, n_layer_all=n_layer_all, n_layer_nextn=n_nextn, n_embd=n_embd,
        n_vocab=header.n_vocab, n_ctx_train=int(get("context_length", 0)),
        n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
        head_k=head_k, head_v=head_v, head_k_swa=head_k_swa, head_v_swa=head_v_swa, is_mla=is_mla,
        n_swa=n_swa, is_swa=is_swa, is_recurrent=is_recr, n_layer_kv_from_start=n_kv_from_start,
        memory=memory, attention_layers=attn, recurrent_layers=recr,
        n_embd_r=n_embd_r, n_embd_s=n_embd_s, causal=causal,
        n_expert=int(get("expert_count", 0)), n_expert_used=int(get("expert_used_count", 0)),
        n_ff_exp=int(get("expert_feed_forward_length", 0)),
        n_embd_per_layer=int(get("embedding_length_per_layer_input", 0)),
        pooling=None if pooling is None else int(pooling),
        n_ff_shexp=int(get("expert_shared_feed_forward_length", 0)),
        n_layer_dense_lead=int(get("leading_dense_block_count", 0)),
        ssm_d_conv=int(get("ssm.conv_kernel", 0)), ssm_d_inner=int(get("ssm.inner_size", 0)),
        ssm_d_state=int(get("ssm.state_size", 0)), ssm_n_group=int(get("ssm.group_count", 0)),
        ssm_dt_rank=int(get("ssm.time_step_rank", 0)),
        shortconv_l_cache=int(get("shortconv.l_cache", 0)),
    )


def _pattern(header: GGUFHeader, n_layer_all: int, n_layer: int, period: int,
             dense_first: bool) -> tuple[bool, ...]:
    """llama_model_base::load_swa_pattern + llama_hparams::set_swa_pattern."""
    key = header.arch_get("attention.sliding_window_pattern")
    if isinstance(key, list):
        flags = [bool(v) for v in key][:n_layer_all]
        return tuple(flags + [False] * (n_layer_all - len(flags)))
    if key is not None:
        period = int(key)
    out = []
    for il in range(n_layer_all):
        if il >= n_layer:
            out.append(False)
        elif dense_first:
            out.append(period == 0 or il % period != 0)
        else:
            out.append(period == 0 or il % period < period - 1)
    return tuple(out)


def _sliding_window(header: GGUFHeader, n_layer_all: int, n_layer: int,
                    n_head_kv: tuple[int, ...]) -> tuple[int, tuple[bool, ...]]:
    arch = header.arch
    window = header.arch_get("attention.sliding_window")
    if isinstance(window, list):  # per-layer windows: the largest sizes the cache
        window = max(window) if window else 0
    window = int(window or 0)
    none = (0, (False,) * n_layer_all)
    if arch in ("lfm2", "lfm2moe"):
        if window <= 0:
            return none
        return window, tuple(kv != 0 for kv in n_head_kv)
    if arch == "gemma4":
        return window, _pattern(header, n_layer_all, n_layer, 0, False)
    if arch == "llama4":
        if header.arch_get("attention.sliding_window") is not None and window == 0:
            return none
        return 8192, _pattern(header, n_layer_all, n_layer, 4, False)  # chunked attention
    if arch == "exaone4":
        if n_layer != 64:
            return none
        return 4096, _pattern(header, n_layer_all, n_layer, 4, False)
    rule = _SWA_RULES.get(arch)
    if rule is None:
        return none
    if rule.needs_key and window <= 0:
        return none
    if rule.fixed_window:
        window = rule.fixed_window
    elif arch == "gemma2" and window <= 0:
        window = 4096
    return window, _pattern(header, n_layer_all, n_layer, rule.period, rule.dense_first)


def _recurrent_layers(arch: str, header: GGUFHeader, n_layer_all: int, n_layer: int,
                      n_head_kv: tuple[int, ...], n_ff: tuple[int, ...]) -> tuple[bool, ...]:
    if arch in RECURRENT_ARCHS or arch == "falcon-h1":
        return (True,) * n_layer_all
    if arch not in HYBRID_ARCHS:
        return (False,) * n_layer_all
    if arch in _INTERVAL_HYBRIDS:
        explicit = header.arch_get("attention.recurrent_layers")
        if isinstance(explicit, list):
            return tuple(bool(v) for v in explicit)
        interval = int(header.arch_get("full_attention_interval", 4))
        return tuple(il < n_layer and (il + 1) % interval != 0 for il in range(n_layer_all))
    if arch in ("nemotron_h", "nemotron_h_moe"):
        return tuple(il < n_layer and n_head_kv[il] == 0 and n_ff[il] == 0 for il in range(n_layer_all))
    # jamba, plamo2, granitehybrid, lfm2, lfm2moe, kimi-linear, bailingmoe3, ...: 0 KV heads = recurrent
    return tuple(kv == 0 for kv in n_head_kv)


def _memory_layers(arch: str, n_layer_all: int, n_layer: int, n_nextn: int, is_recr: tuple[bool, ...],
                   n_head_kv: tuple[int, ...], n_ff: tuple[int, ...],
                   n_kv_from_start: int) -> tuple[str, tuple[int, ...], tuple[int, ...]]:
    """llama_model::create_memory: which layers get KV, which get recurrent state."""
    layers = range(n_layer_all)
    if arch in NO_MEMORY_ARCHS:
        return "none", (), ()
    if arch in RECURRENT_ARCHS:
        return "recurrent", (), tuple(layers)
    if arch in HYBRID_ARCHS:
        if arch == "falcon-h1":
            return "hybrid", tuple(layers), tuple(layers)
        if arch in ("nemotron_h", "nemotron_h_moe"):
            attn = tuple(il for il in layers if not is_recr[il] and n_ff[il] == 0 and n_head_kv[il] > 0)
            return "hybrid", attn, tuple(il for il in layers if is_recr[il] and n_ff[il] == 0)
        trunk = (lambda il: il < n_layer) if arch in _INTERVAL_HYBRIDS else (lambda il: True)
        attn = tuple(il for il in layers if trunk(il) and not is_recr[il])
        return "hybrid", attn, tuple(il for il in layers if trunk(il) and is_recr[il])

    def has_kv(il: int) -> bool:
        if n_kv_from_start >= 0 and il >= n_kv_from_start:
            return False  # shares another layer's cache (gemma3n, gemma4)
        if n_nextn > 0 and n_layer > 0 and il >= n_layer:
            return False  # MTP blocks get no KV in the main context
        return True

    return "kv", tuple(il for il in layers if has_kv(il)), ()


def _recurrent_widths(header: GGUFHeader, n_embd: int, n_head: int) -> tuple[int, int]:
    """llama_hparams::n_embd_r / n_embd_s (floats per slot per recurrent layer)."""
    get = header.arch_get
    wkv_head_size = int(get("wkv.head_size", 0))
    if wkv_head_size:  # RWKV
        return int(get("token_shift_count", 2)) * n_embd, n_embd * wkv_head_size
    l_cache = int(get("shortconv.l_cache", 0))
    d_conv = int(get("ssm.conv_kernel", 0))
    if l_cache:  # LFM2 short convolution: no S state
        return n_embd * (l_cache - 1), 0
    kda = int(get("kda.head_dim", 0))
    if kda:  # Kimi KDA
        d_inner = n_head * kda
        return 3 * (d_conv - 1 if d_conv > 0 else 3) * d_inner, kda * kda * n_head
    d_inner = int(get("ssm.inner_size", 0))
    d_state = int(get("ssm.state_size", 0))
    n_group = int(get("ssm.group_count", 0))
    conv = (d_conv - 1 if d_conv > 0 else 0) * (d_inner + 2 * n_group * d_state)
    return conv, d_state * d_inner
