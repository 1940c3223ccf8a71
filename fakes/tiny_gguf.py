"""Tiny but structurally real GGUF models with random weights, for tests against the real llama-server.

Every architecture here loads and answers in the llama-server built by
`deploy/build-llama-server.sh` (llama.cpp vendored in llama-cpp-python 0.3.36, build b1-0c1e570):

    llama          grouped-query attention (n_head != n_head_kv), Q8_0 weights
    gemma3         interleaved sliding-window attention (`sliding_window`, period 6 unless
                   `swa_pattern` is given), explicit head dim (n_head * head_dim != n_embd),
                   tied output
    qwen3moe       mixture of experts (`expert_count`, `expert_used_count`,
                   `expert_feed_forward_length`, router `ffn_gate_inp`)
    lfm2           hybrid: short-conv (recurrent) layers + attention layers (head_count_kv 0 = conv)
    granitehybrid  hybrid: Mamba2 (recurrent) layers + attention layers
    bert           embedding model (non-causal, mean pooling, WordPiece vocab); needs `--embeddings`;
                   `reranker=True` makes it a cross-encoder reranker instead: rank pooling and the
                   classification head (`cls`, `cls.output`); needs `--reranking`
    gemma3n        sliding window + shared KV (layers >= 20 reuse the KV of layers 18/19) + per-layer
                   embeddings (`per_layer_token_embd`)

Tensor names and metadata keys come from the `gguf` package (`MODEL_TENSORS`/`TENSOR_NAMES` and the
`GGUFWriter.add_*` helpers); each tensor is checked against the architecture's tensor list there.
Shapes follow llama.cpp's `load_arch_tensors` (ggml order, ne0 first).

    model = write_tiny_model(tmp_path / "m.gguf", "qwen3moe", n_layer=3, seed=1)
    python -m fakes.tiny_gguf qwen3moe /tmp/m.gguf --layers 3

The returned `TinyModel` carries every dimension an estimator needs to hand-compute weight, KV,
recurrent-state and output sizes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import gguf
import numpy as np
from gguf.constants import MODEL_ARCH, MODEL_ARCH_NAMES, MODEL_TENSOR, MODEL_TENSORS, TENSOR_NAMES

T = MODEL_TENSOR

# ---------------------------------------------------------------------------------------------
# the record


@attrs.frozen
class TinyModel:
    """What was written: the file and every dimension used (llama.cpp hparams naming)."""

    path: Path
    arch: str
    seed: int
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: tuple[int, ...]  # per layer; 0 = recurrent (conv/SSM) layer without KV
    head_dim_k: int
    head_dim_v: int
    n_ff: int  # feed_forward_length (dense FFN width; MoE layers use n_ff_exp)
    n_vocab: int
    n_ctx_train: int
    sliding_window: int  # 0 = no sliding-window attention
    swa_layers: tuple[bool, ...]  # per layer: uses the sliding-window KV cache
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    shortconv_l_cache: int  # LFM2: recurrent state per conv layer = n_embd * (l_cache - 1) floats
    ssm_d_conv: int  # Mamba2: conv state = (d_conv - 1) * (d_inner + 2 * n_group * d_state) floats
    ssm_d_inner: int  # Mamba2: ssm state = d_state * d_inner floats
    ssm_d_state: int
    ssm_n_group: int
    ssm_dt_rank: int  # number of SSM heads
    n_layer_kv_from_start: int  # -1: every attention layer owns its KV; else only layers < this
    n_embd_per_layer: int  # gemma3n per-layer-input width (0 elsewhere)
    causal: bool
    pooling: str | None  # embedding pooling ("mean", "cls", "rank", ...) or None
    tokenizer: str  # tokenizer.ggml.model: "gpt2" (byte-level BPE) or "bert" (WordPiece)
    has_chat_template: bool
    weight_type: str  # ggml type of the matmul weights ("f32", "f16", "q8_0")
    tied_output: bool  # no output.weight: llama.cpp duplicates token_embd as the output
    tensor_bytes: int  # sum of the tensor data sizes (ggml_nbytes), without alignment padding
    n_tensors: int

    @property
    def reranker(self) -> bool:
        """Rank pooling with a classification head: scores (query, document) pairs."""
        return self.pooling == "rank"

    @property
    def recurrent_layers(self) -> tuple[int, ...]:
        return tuple(il for il, kv in enumerate(self.n_head_kv) if kv == 0)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(il for il, kv in enumerate(self.n_head_kv) if kv > 0)

    @property
    def kv_layers(self) -> tuple[int, ...]:
        """Attention layers that own a KV cache (shared-KV layers reuse another layer's)."""
        if not self.causal:
            return ()
        cut = self.n_layer_kv_from_start
        return tuple(il for il in self.attention_layers if cut < 0 or il < cut)

    def n_embd_k_gqa(self, il: int) -> int:
        return self.head_dim_k * self.n_head_kv[il]

    def n_embd_v_gqa(self, il: int) -> int:
        return self.head_dim_v * self.n_head_kv[il]


# ---------------------------------------------------------------------------------------------
# per-architecture defaults

# every parameter write_tiny_model accepts, with the generic default
_BASE: dict[str, Any] = dict(
    seed=0,
    n_layer=2,
    n_embd=128,
    n_head=4,
    n_head_kv=2,  # int, or one value per layer
    head_dim=None,  # sets head_dim_k and head_dim_v; default n_embd // n_head
    head_dim_k=None,
    head_dim_v=None,
    n_ff=256,
    n_vocab=384,
    n_ctx_train=4096,
    sliding_window=0,
    swa_pattern=None,  # None: the architecture's built-in period (not written); int period; bools
    n_expert=0,
    n_expert_used=0,
    n_ff_exp=0,
    attention_layers=None,  # hybrids: indices of the attention layers (others are recurrent)
    shortconv_l_cache=0,
    ssm_d_conv=0,
    ssm_d_state=0,
    ssm_n_group=0,
    ssm_dt_rank=0,
    weight_type="f16",
    tied_output=False,
    pooling=None,
    reranker=False,  # bert: rank pooling + classification head (shorthand for pooling="rank")
    chat_template=True,
)


@attrs.frozen
class _Spec:
    model_arch: MODEL_ARCH
    build: Callable[[_Builder], None]
    defaults: dict[str, Any]
    tokenizer: str = "gpt2"
    # sliding-window support in llama.cpp: "none"; "period" (every swa_period-th layer is global
    # unless a pattern key is written); "attention" (lfm2: a window makes every attention layer SWA)
    swa: str = "none"
    swa_period: int = 0
    # hybrids: default attention layers are those with il % attn_every == attn_every - 1
    attn_every: int = 0
    causal: bool = True
    kv_from_start: int = -1  # llama.cpp hard-coded n_layer_kv_from_start (gemma3n: 20)


# ---------------------------------------------------------------------------------------------
# the builder: tensor groups shared by the architectures


_GGML = gguf.GGMLQuantizationType
_WEIGHT_TYPES = {"f32": _GGML.F32, "f16": _GGML.F16, "q8_0": _GGML.Q8_0}


class _Builder:
    """Adds tensors to a GGUFWriter, named via the gguf tables and checked against the arch."""

    def __init__(self, writer: gguf.GGUFWriter, spec: _Spec, p: dict[str, Any]):
        self.w = writer
        self.spec = spec
        self.p = p
        self.rng = np.random.default_rng(p["seed"])
        self.allowed = set(MODEL_TENSORS[spec.model_arch])
        self.wtype = _WEIGHT_TYPES[p["weight_type"]]
        self.nbytes = 0
        self.count = 0

    # -- primitives ----------------------------------------------------------------------------

    def name(self, kind: MODEL_TENSOR, bid: int | None = None, suffix: str | None = "weight") -> str:
        if kind not in self.allowed:
            raise ValueError(f"{kind.name} is not a tensor of {self.w.arch} in gguf's MODEL_TENSORS")
        base = TENSOR_NAMES[kind].format(bid=bid)
        return f"{base}.{suffix}" if suffix else base

    def add(self, kind: MODEL_TENSOR, ne: Sequence[int], bid: int | None = None, *,
            suffix: str | None = "weight", init: str = "normal", matmul: bool = False,
            scale: float = 0.02) -> None:
        """One tensor of ggml shape *ne* (ne0 first). *matmul* weights get the model's weight type."""
        shape = tuple(int(n) for n in reversed(ne))  # numpy order
        if init == "ones":
            data = np.ones(shape, dtype=np.float32)
        elif init == "zeros":
            data = np.zeros(shape, dtype=np.float32)
        elif init == "neg":  # Mamba A = -exp(A_log)
            data = -self.rng.uniform(1.0, 16.0, size=shape).astype(np.float32)
        else:
            data = (self.rng.standard_normal(size=shape) * scale).astype(np.float32)

        qtype = self.wtype if matmul else _GGML.F32
        block, _ = gguf.GGML_QUANT_SIZES[qtype]
        if ne[0] % block:  # rows too short for the block size: stay unquantized
            qtype = _GGML.F16 if matmul else _GGML.F32
        if qtype == _GGML.F16:
            data = data.astype(np.float16)
        elif qtype != _GGML.F32:
            data = gguf.quants.quantize(data, qtype)
        name = self.name(kind, bid, suffix)
        if qtype in (_GGML.F32, _GGML.F16):
            self.w.add_tensor(name, data)
        else:
            self.w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
        self.nbytes += int(data.nbytes)
        self.count += 1

    def norm(self, kind: MODEL_TENSOR, bid: int | None = None, width: int | None = None,
             bias: bool = False) -> None:
        width = width or self.p["n_embd"]
        self.add(kind, [width], bid, init="ones")
        if bias:
            self.add(kind, [width], bid, suffix="bias", init="zeros")

    def matrix(self, kind: MODEL_TENSOR, n_in: int, n_out: int, bid: int | None = None,
               bias: bool = False) -> None:
        self.add(kind, [n_in, n_out], bid, matmul=True)
        if bias:
            self.add(kind, [n_out], bid, suffix="bias", init="zeros")

    # -- groups --------------------------------------------------------------------------------

    def embeddings(self, output_norm: MODEL_TENSOR = T.OUTPUT_NORM) -> None:
        p = self.p
        self.add(T.TOKEN_EMBD, [p["n_embd"], p["n_vocab"]], matmul=True, scale=1.0)
        self.norm(output_norm)
        if not p["tied_output"]:
            self.matrix(T.OUTPUT, p["n_embd"], p["n_vocab"])

    def attention(self, il: int, *, qk_norm: bool = False, bias: bool = False,
                  post_norm: bool = False) -> None:
        p = self.p
        n_embd, n_q = p["n_embd"], p["head_dim_k"] * p["n_head"]
        n_kv = p["n_head_kv"][il]
        self.matrix(T.ATTN_Q, n_embd, n_q, il, bias=bias)
        self.matrix(T.ATTN_K, n_embd, p["head_dim_k"] * n_kv, il, bias=bias)
        self.matrix(T.ATTN_V, n_embd, p["head_dim_v"] * n_kv, il, bias=bias)
        self.matrix(T.ATTN_OUT, p["head_dim_v"] * p["n_head"], n_embd, il, bias=bias)
        if qk_norm:
            self.norm(T.ATTN_Q_NORM, il, p["head_dim_k"])
            self.norm(T.ATTN_K_NORM, il, p["head_dim_k"])
        if post_norm:
            self.norm(T.ATTN_POST_NORM, il)

    def ffn(self, il: int, *, gated: bool = True, bias: bool = False) -> None:
        n_embd, n_ff = self.p["n_embd"], self.p["n_ff"]
        if gated:
            self.matrix(T.FFN_GATE, n_embd, n_ff, il, bias=bias)
        self.matrix(T.FFN_UP, n_embd, n_ff, il, bias=bias)
        self.matrix(T.FFN_DOWN, n_ff, n_embd, il, bias=bias)

    def moe(self, il: int) -> None:
        n_embd, n_exp, n_ff_exp = self.p["n_embd"], self.p["n_expert"], self.p["n_ff_exp"]
        self.add(T.FFN_GATE_INP, [n_embd, n_exp], il)  # router: kept f32, as llama-quantize does
        self.add(T.FFN_GATE_EXP, [n_embd, n_ff_exp, n_exp], il, matmul=True)
        self.add(T.FFN_UP_EXP, [n_embd, n_ff_exp, n_exp], il, matmul=True)
        self.add(T.FFN_DOWN_EXP, [n_ff_exp, n_embd, n_exp], il, matmul=True)

    def shortconv(self, il: int) -> None:
        n_embd = self.p["n_embd"]
        self.add(T.SHORTCONV_CONV, [self.p["shortconv_l_cache"], n_embd], il, scale=0.2)
        self.matrix(T.SHORTCONV_INPROJ, n_embd, 3 * n_embd, il)
        self.matrix(T.SHORTCONV_OUTPROJ, n_embd, n_embd, il)

    def mamba2(self, il: int) -> None:
        p = self.p
        d_inner, d_state, n_group, n_head = p["ssm_d_inner"], p["ssm_d_state"], p["ssm_n_group"], p["ssm_dt_rank"]
        d_xbc = d_inner + 2 * n_group * d_state
        self.matrix(T.SSM_IN, p["n_embd"], 2 * d_inner + 2 * n_group * d_state + n_head, il)
        self.add(T.SSM_CONV1D, [p["ssm_d_conv"], d_xbc], il, scale=0.2)
        self.add(T.SSM_CONV1D, [d_xbc], il, suffix="bias", init="zeros")
        self.add(T.SSM_DT, [n_head], il, suffix="bias", init="zeros")
        self.add(T.SSM_A, [1, n_head], il, suffix=None, init="neg")
        self.add(T.SSM_D, [1, n_head], il, suffix=None, init="ones")
        self.add(T.SSM_NORM, [d_inner // n_group, n_group], il, init="ones")
        self.matrix(T.SSM_OUT, d_inner, p["n_embd"], il)


# ---------------------------------------------------------------------------------------------
# architectures: which groups each layer gets (mirrors llama.cpp src/models/<arch>.cpp)


def _build_llama(b: _Builder) -> None:
    b.embeddings()
    for il in range(b.p["n_layer"]):
        b.norm(T.ATTN_NORM, il)
        b.attention(il)
        b.norm(T.FFN_NORM, il)
        b.ffn(il)


def _build_gemma3(b: _Builder) -> None:
    b.embeddings()
    for il in range(b.p["n_layer"]):
        b.norm(T.ATTN_NORM, il)
        b.attention(il, qk_norm=True, post_norm=True)
        b.norm(T.FFN_PRE_NORM, il)
        b.ffn(il)
        b.norm(T.FFN_POST_NORM, il)


def _build_qwen3moe(b: _Builder) -> None:
    b.embeddings()
    for il in range(b.p["n_layer"]):
        b.norm(T.ATTN_NORM, il)
        b.attention(il, qk_norm=True)
        b.norm(T.FFN_NORM, il)
        b.moe(il)


def _build_lfm2(b: _Builder) -> None:
    b.embeddings(output_norm=T.TOKEN_EMBD_NORM)  # llama.cpp's LLM_TENSOR_OUTPUT_NORM_LFM2
    for il in range(b.p["n_layer"]):
        b.norm(T.FFN_NORM, il)
        b.ffn(il)
        b.norm(T.ATTN_NORM, il)
        if b.p["n_head_kv"][il] == 0:
            b.shortconv(il)
        else:
            b.attention(il, qk_norm=True)


def _build_granitehybrid(b: _Builder) -> None:
    b.embeddings()
    for il in range(b.p["n_layer"]):
        b.norm(T.ATTN_NORM, il)
        if b.p["n_head_kv"][il] == 0:
            b.mamba2(il)
        else:
            b.attention(il)
        b.norm(T.FFN_NORM, il)
        b.ffn(il)


def _build_bert(b: _Builder) -> None:
    p = b.p
    b.add(T.TOKEN_EMBD, [p["n_embd"], p["n_vocab"]], matmul=True, scale=1.0)
    b.add(T.TOKEN_TYPES, [p["n_embd"], 2])
    b.add(T.POS_EMBD, [p["n_embd"], p["n_ctx_train"]])
    b.norm(T.TOKEN_EMBD_NORM, bias=True)
    for il in range(p["n_layer"]):
        b.attention(il, bias=True)
        b.norm(T.ATTN_OUT_NORM, il, bias=True)
        b.ffn(il, gated=False, bias=True)
        b.norm(T.LAYER_OUT_NORM, il, bias=True)
    if p["pooling"] == "rank":
        # llama.cpp's rank pooling: the [CLS] row -> tanh(cls @ x + b) -> cls.output (one score per
        # sequence, n_cls_out defaults to 1). A larger scale than the body's spreads the scores.
        n_embd = p["n_embd"]
        b.add(T.CLS, [n_embd, n_embd], scale=0.5)
        b.add(T.CLS, [n_embd], suffix="bias", init="zeros")
        b.add(T.CLS_OUT, [n_embd, 1], scale=0.5)
        b.add(T.CLS_OUT, [1], suffix="bias", init="zeros")


def _build_gemma3n(b: _Builder) -> None:
    p = b.p
    n_embd, n_layer, n_pl = p["n_embd"], p["n_layer"], p["n_embd_per_layer"]
    n_altup, laurel_rank = _GEMMA3N_ALTUP, _GEMMA3N_LAUREL_RANK
    b.embeddings()
    b.add(T.ALTUP_PROJ, [n_embd, n_embd, n_altup - 1], matmul=True)
    b.add(T.ALTUP_UNEMBD_PROJ, [n_embd, n_embd, n_altup - 1], matmul=True)
    b.add(T.PER_LAYER_TOKEN_EMBD, [n_pl * n_layer, p["n_vocab"]], matmul=True)
    b.matrix(T.PER_LAYER_MODEL_PROJ, n_embd, n_pl * n_layer)
    b.norm(T.PER_LAYER_PROJ_NORM, width=n_pl)
    for il in range(n_layer):
        b.norm(T.ATTN_NORM, il)
        b.attention(il, qk_norm=True, post_norm=True)
        b.norm(T.FFN_PRE_NORM, il)
        b.ffn(il)
        b.norm(T.FFN_POST_NORM, il)
        b.matrix(T.PER_LAYER_INP_GATE, n_embd, n_pl, il)
        b.matrix(T.PER_LAYER_PROJ, n_pl, n_embd, il)
        b.norm(T.PER_LAYER_POST_NORM, il)
        b.add(T.ALTUP_CORRECT_COEF, [n_altup, n_altup], il)
        b.norm(T.ALTUP_CORRECT_SCALE, il)
        b.add(T.ALTUP_PREDICT_COEF, [n_altup, n_altup * n_altup], il)
        b.matrix(T.ALTUP_ROUTER, n_embd, n_altup, il)
        b.norm(T.ALTUP_ROUTER_NORM, il)
        b.matrix(T.LAUREL_L, n_embd, laurel_rank, il)
        b.matrix(T.LAUREL_R, laurel_rank, n_embd, il)
        b.norm(T.LAUREL_POST_NORM, il)


# hard-coded in this llama.cpp build (llama_hparams defaults), not read from the file
_GEMMA3N_ALTUP = 4
_GEMMA3N_LAUREL_RANK = 64
_GEMMA3N_EMBD_PER_LAYER = 256
_GEMMA3N_KV_FROM_START = 20

SPECS: dict[str, _Spec] = {
    "llama": _Spec(MODEL_ARCH.LLAMA, _build_llama,
                   dict(n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, weight_type="q8_0")),
    "gemma3": _Spec(MODEL_ARCH.GEMMA3, _build_gemma3,
                    dict(n_layer=6, n_embd=64, n_head=4, n_head_kv=1, head_dim=32, n_ff=128,
                         sliding_window=128, tied_output=True),
                    swa="period", swa_period=6),
    "qwen3moe": _Spec(MODEL_ARCH.QWEN3MOE, _build_qwen3moe,
                      dict(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=128,
                           n_expert=8, n_expert_used=2, n_ff_exp=64)),
    "lfm2": _Spec(MODEL_ARCH.LFM2, _build_lfm2,
                  dict(n_layer=4, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, shortconv_l_cache=3,
                       tied_output=True),
                  attn_every=2, swa="attention"),
    "granitehybrid": _Spec(MODEL_ARCH.GRANITE_HYBRID, _build_granitehybrid,
                           dict(n_layer=4, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, ssm_d_conv=4,
                                ssm_d_state=16, ssm_n_group=1, ssm_dt_rank=4),
                           attn_every=4),
    "bert": _Spec(MODEL_ARCH.BERT, _build_bert,
                  dict(n_layer=2, n_embd=64, n_head=4, n_head_kv=4, n_ff=128, n_ctx_train=1024,
                       pooling="mean", weight_type="f32", tied_output=True, chat_template=False),
                  tokenizer="bert", causal=False),
    "gemma3n": _Spec(MODEL_ARCH.GEMMA3N, _build_gemma3n,
                     dict(n_layer=22, n_embd=64, n_head=2, n_head_kv=1, head_dim=32, n_ff=128,
                          n_vocab=320, sliding_window=64, tied_output=True, weight_type="q8_0"),
                     swa="period", swa_period=5, kv_from_start=_GEMMA3N_KV_FROM_START),
}

ARCHITECTURES: tuple[str, ...] = tuple(SPECS)


# ---------------------------------------------------------------------------------------------
# parameters


# overrides that only make sense where the architecture's defaults already use them
_ARCH_SPECIFIC = {"n_expert", "n_expert_used", "n_ff_exp", "shortconv_l_cache", "ssm_d_conv",
                  "ssm_d_state", "ssm_n_group", "ssm_dt_rank", "pooling"}


def _resolve(spec: _Spec, overrides: dict[str, Any]) -> dict[str, Any]:
    unknown = set(overrides) - set(_BASE)
    if unknown:
        raise TypeError(f"unknown tiny-model parameter(s): {', '.join(sorted(unknown))}; "
                        f"known: {', '.join(sorted(_BASE))}")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if overrides.pop("reranker", False):
        if spec.model_arch != MODEL_ARCH.BERT:
            raise ValueError(f"reranker applies to bert only, not {spec.model_arch.name.lower()}")
        if overrides.get("pooling", "rank") != "rank":
            raise ValueError("a reranker pools with 'rank', not " + repr(overrides["pooling"]))
        overrides["pooling"] = "rank"
    for key in _ARCH_SPECIFIC & set(overrides):
        if not spec.defaults.get(key):
            raise ValueError(f"{key} does not apply to {spec.model_arch.name.lower()}")
    if "swa_pattern" in overrides and spec.swa != "period":
        raise ValueError(f"swa_pattern does not apply to {spec.model_arch.name.lower()}")
    p = {**_BASE, **spec.defaults, **overrides}
    n_layer, n_head = p["n_layer"], p["n_head"]
    if n_layer < 1:
        raise ValueError("n_layer must be >= 1")

    head_dim = p["head_dim"] or p["n_embd"] // n_head
    p["head_dim_k"] = p["head_dim_k"] or head_dim
    p["head_dim_v"] = p["head_dim_v"] or head_dim
    p["explicit_head_dim"] = (p["head_dim_k"] * n_head != p["n_embd"]
                              or p["head_dim_v"] * n_head != p["n_embd"])

    # per-layer KV heads; hybrids put 0 on recurrent layers
    kv = p["n_head_kv"]
    kv = [int(kv)] * n_layer if isinstance(kv, int) else [int(x) for x in kv]
    if len(kv) != n_layer:
        raise ValueError(f"n_head_kv has {len(kv)} entries for {n_layer} layers")
    if spec.attn_every:
        attn = p["attention_layers"]
        if attn is None:
            attn = [il for il in range(n_layer) if il % spec.attn_every == spec.attn_every - 1]
        attn = set(attn)
        kv = [h if il in attn else 0 for il, h in enumerate(kv)]
    elif p["attention_layers"] is not None:
        raise ValueError("attention_layers only applies to hybrid architectures")
    p["n_head_kv"] = tuple(kv)

    # sliding-window layout (what llama.cpp will compute)
    pattern = p["swa_pattern"]
    if not p["sliding_window"]:
        swa = [False] * n_layer
    elif spec.swa == "none":
        raise ValueError(f"llama.cpp has no sliding-window attention for {spec.model_arch.name.lower()}")
    elif spec.swa == "attention":
        swa = [h > 0 for h in kv]
    elif isinstance(pattern, (list, tuple)):
        swa = [bool(x) for x in pattern]
        if len(swa) != n_layer:
            raise ValueError(f"swa_pattern has {len(swa)} entries for {n_layer} layers")
    else:  # llama_hparams::set_swa_pattern(period): layer il is global iff il % period == period - 1
        period = spec.swa_period if pattern is None else int(pattern)
        swa = [period == 0 or il % period < period - 1 for il in range(n_layer)]
    p["swa_layers"] = tuple(swa)

    if p["n_expert"] and not p["n_ff_exp"]:
        p["n_ff_exp"] = p["n_ff"] // p["n_expert_used"]
    p["ssm_d_inner"] = 2 * p["n_embd"] if p["ssm_d_state"] else 0  # llama.cpp supports expand 2 only
    p["n_embd_per_layer"] = _GEMMA3N_EMBD_PER_LAYER if spec.model_arch == MODEL_ARCH.GEMMA3N else 0
    p["pooling"] = p["pooling"] if not spec.causal else None
    if p["weight_type"] not in _WEIGHT_TYPES:
        raise ValueError(f"weight_type must be one of {sorted(_WEIGHT_TYPES)}")
    return p


# ---------------------------------------------------------------------------------------------
# metadata


def _write_hparams(w: gguf.GGUFWriter, spec: _Spec, p: dict[str, Any]) -> None:
    n_layer = p["n_layer"]
    w.add_name(f"tiny-{w.arch}")
    w.add_context_length(p["n_ctx_train"])
    w.add_embedding_length(p["n_embd"])
    w.add_block_count(n_layer)
    w.add_feed_forward_length(p["n_ff"])
    w.add_head_count(p["n_head"])
    kv = p["n_head_kv"]
    w.add_head_count_kv(kv[0] if len(set(kv)) == 1 else list(kv))
    if p["explicit_head_dim"]:
        w.add_key_length(p["head_dim_k"])
        w.add_value_length(p["head_dim_v"])
    w.add_vocab_size(p["n_vocab"])
    if spec.causal:
        w.add_layer_norm_rms_eps(1e-6)
        w.add_rope_freq_base(10000.0)
    else:
        w.add_layer_norm_eps(1e-12)
        w.add_causal_attention(False)
        w.add_pooling_type(gguf.PoolingType[p["pooling"].upper()])

    if p["sliding_window"]:
        w.add_sliding_window(p["sliding_window"])
        pattern = p["swa_pattern"]
        if isinstance(pattern, int):
            w.add_sliding_window_pattern(pattern)
        elif pattern is not None:
            w.add_sliding_window_pattern(list(p["swa_layers"]))
    if p["n_expert"]:
        w.add_expert_count(p["n_expert"])
        w.add_expert_used_count(p["n_expert_used"])
        w.add_expert_feed_forward_length(p["n_ff_exp"])
    if p["shortconv_l_cache"]:
        w.add_shortconv_l_cache(p["shortconv_l_cache"])
    if p["ssm_d_state"]:
        w.add_ssm_conv_kernel(p["ssm_d_conv"])
        w.add_ssm_inner_size(p["ssm_d_inner"])
        w.add_ssm_state_size(p["ssm_d_state"])
        w.add_ssm_time_step_rank(p["ssm_dt_rank"])
        w.add_ssm_group_count(p["ssm_n_group"])
    if p["n_embd_per_layer"]:
        w.add_embedding_length_per_layer_input(p["n_embd_per_layer"])
        w.add_altup_num_inputs(_GEMMA3N_ALTUP)
        w.add_altup_active_idx(0)
        if n_layer > spec.kv_from_start >= 0:
            w.add_shared_kv_layers(n_layer - spec.kv_from_start)
    w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                     "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[p["weight_type"]])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


# ---------------------------------------------------------------------------------------------
# tokenizers


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte-level alphabet: the printable stand-in character of each byte 0..255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


_LETTERS = "etaoinshrdlucmfwypvbgk"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _bpe_tokenizer(w: gguf.GGUFWriter, n_vocab: int, chat_template: bool) -> None:
    """Byte-level BPE ("gpt2"): 3 control tokens, the 256 byte tokens, then merged pairs."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    byte_chars = _bytes_to_unicode()
    tokens = specials + byte_chars
    if n_vocab < len(tokens):
        raise ValueError(f"a byte-level BPE vocab needs at least {len(tokens)} tokens")
    space = byte_chars[ord(" ")]
    merges: list[str] = []
    seen = set(tokens)
    # pairs of frequent letters, with and without a leading space, then triples
    firsts = [space + c for c in _LETTERS] + list(_LETTERS)
    candidates = [(a, b) for a in firsts for b in _LETTERS]
    candidates += [(a + b, c) for a in firsts for b in _LETTERS for c in _LETTERS]
    for left, right in candidates:
        if len(tokens) >= n_vocab:
            break
        if left not in seen:
            continue
        merged = left + right
        if merged in seen:
            continue
        tokens.append(merged)
        seen.add(merged)
        merges.append(f"{left} {right}")
    if len(tokens) < n_vocab:
        raise ValueError(f"n_vocab {n_vocab} is larger than this toy BPE can fill")
    types = [gguf.TokenType.CONTROL] * len(specials) + [gguf.TokenType.NORMAL] * (len(tokens) - len(specials))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_eot_token_id(2)
    w.add_add_bos_token(False)
    if chat_template:
        w.add_chat_template(CHATML_TEMPLATE)


def _wordpiece_tokenizer(w: gguf.GGUFWriter, n_vocab: int) -> None:
    """BERT WordPiece in llama.cpp's spelling: word starts carry "▁", continuations are bare."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789.,!?'-:;()"
    tokens = specials + ["▁" + c for c in alphabet] + list(alphabet)
    tokens += ["▁" + a + b for a in _LETTERS for b in _LETTERS][: max(0, n_vocab - len(tokens))]
    if len(tokens) != n_vocab:
        raise ValueError(f"this toy WordPiece vocab holds {len(specials) + 2 * len(alphabet)}"
                         f"..{len(tokens)} tokens, not {n_vocab}")
    types = [gguf.TokenType.CONTROL] * len(specials) + [gguf.TokenType.NORMAL] * (len(tokens) - len(specials))
    w.add_tokenizer_model("bert")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_type_count(2)
    w.add_pad_token_id(0)
    w.add_unk_token_id(1)
    w.add_bos_token_id(2)  # [CLS]
    w.add_sep_token_id(3)
    w.add_mask_token_id(4)
    w.add_add_bos_token(True)
    w.add_add_sep_token(True)


# ---------------------------------------------------------------------------------------------
# entry points


def write_tiny_model(path: str | Path, arch: str, **overrides: Any) -> TinyModel:
    """Write a random-weight *arch* model to *path*; *overrides* replace the arch's defaults.

    Parameters: seed, n_layer, n_embd, n_head, n_head_kv (int or per layer), head_dim /
    head_dim_k / head_dim_v, n_ff, n_vocab, n_ctx_train, sliding_window, swa_pattern (int period
    or per-layer bools; written to the file only when given), n_expert, n_expert_used, n_ff_exp,
    attention_layers (hybrids), shortconv_l_cache, ssm_d_conv, ssm_d_state, ssm_n_group,
    ssm_dt_rank, weight_type ("f32" | "f16" | "q8_0"), tied_output, pooling, reranker (bert only:
    rank pooling and a classification head; the model then needs `--reranking`), chat_template.
    Same arguments, same bytes.
    """
    if arch not in SPECS:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(ARCHITECTURES)}")
    spec = SPECS[arch]
    p = _resolve(spec, overrides)
    path = Path(path)

    w = gguf.GGUFWriter(path, MODEL_ARCH_NAMES[spec.model_arch])
    _write_hparams(w, spec, p)
    if spec.tokenizer == "bert":
        _wordpiece_tokenizer(w, p["n_vocab"])
    else:
        _bpe_tokenizer(w, p["n_vocab"], p["chat_template"])
    b = _Builder(w, spec, p)
    spec.build(b)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    return TinyModel(
        path=path, arch=arch, seed=p["seed"], n_layer=p["n_layer"], n_embd=p["n_embd"],
        n_head=p["n_head"], n_head_kv=p["n_head_kv"], head_dim_k=p["head_dim_k"],
        head_dim_v=p["head_dim_v"], n_ff=p["n_ff"],
        n_vocab=p["n_vocab"], n_ctx_train=p["n_ctx_train"], sliding_window=p["sliding_window"],
        swa_layers=p["swa_layers"], n_expert=p["n_expert"], n_expert_used=p["n_expert_used"],
        n_ff_exp=p["n_ff_exp"], shortconv_l_cache=p["shortconv_l_cache"],
        ssm_d_conv=p["ssm_d_conv"], ssm_d_inner=p["ssm_d_inner"], ssm_d_state=p["ssm_d_state"],
        ssm_n_group=p["ssm_n_group"], ssm_dt_rank=p["ssm_dt_rank"],
        n_layer_kv_from_start=spec.kv_from_start, n_embd_per_layer=p["n_embd_per_layer"],
        causal=spec.causal, pooling=p["pooling"], tokenizer=spec.tokenizer,
        has_chat_template=bool(p["chat_template"]) and spec.tokenizer == "gpt2",
        weight_type=p["weight_type"], tied_output=p["tied_output"], tensor_bytes=b.nbytes,
        n_tensors=b.count,
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fakes.tiny_gguf",
                                 description="Write a tiny random-weight GGUF model.")
    ap.add_argument("arch", choices=ARCHITECTURES)
    ap.add_argument("path", type=Path)
    ap.add_argument("--layers", dest="n_layer", type=int)
    ap.add_argument("--embd", dest="n_embd", type=int)
    ap.add_argument("--heads", dest="n_head", type=int)
    ap.add_argument("--kv-heads", dest="n_head_kv", type=int)
    ap.add_argument("--head-dim", dest="head_dim", type=int)
    ap.add_argument("--ff", dest="n_ff", type=int)
    ap.add_argument("--vocab", dest="n_vocab", type=int)
    ap.add_argument("--ctx-train", dest="n_ctx_train", type=int)
    ap.add_argument("--sliding-window", dest="sliding_window", type=int)
    ap.add_argument("--swa-pattern", dest="swa_pattern", type=int)
    ap.add_argument("--experts", dest="n_expert", type=int)
    ap.add_argument("--experts-used", dest="n_expert_used", type=int)
    ap.add_argument("--weight-type", dest="weight_type", choices=sorted(_WEIGHT_TYPES))
    ap.add_argument("--seed", type=int)
    ap.add_argument("--reranker", action="store_true", default=None, help="bert: a reranker (rank pooling)")
    args = vars(ap.parse_args(argv))
    arch, path = args.pop("arch"), args.pop("path")
    model = write_tiny_model(path, arch, **{k: v for k, v in args.items() if v is not None})
    for field in attrs.fields(TinyModel):
        print(f"{field.name} = {getattr(model, field.name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
