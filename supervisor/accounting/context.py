"""Context sizing: how many KV cells, streams, slots and batch tokens llama-server sets up.

From ``tools/server/server.cpp`` (auto slots), ``server-context.cpp``
(``server_output_limits``) and the ``llama_context`` constructor in
``src/llama-context.cpp`` (padding to 256, per-stream split).
"""

from __future__ import annotations

import attrs

from supervisor.accounting.hparams import ModelHParams
from supervisor.accounting.server_args import ServerArgs

AUTO_SLOTS = 4  # server.cpp: n_parallel < 0 -> 4 slots sharing one unified KV cache
KV_PAD = 256  # llama_context: n_ctx = GGML_PAD(n_ctx, 256)


def pad(value: int, to: int) -> int:
    return -(-value // to) * to


@attrs.frozen
class ContextPlan:
    n_ctx: int  # total KV cells over all streams (after padding and the per-stream split)
    n_ctx_seq: int  # cells of one stream
    n_seq_max: int  # slots
    n_stream: int  # 1 when unified, else one stream per slot
    kv_unified: bool
    n_batch: int
    n_ubatch: int
    flash_attn: bool
    causal: bool
    embeddings: bool
    n_outputs_max: int  # outputs reserved in the compute graph

    @property
    def n_tokens_reserve(self) -> int:
        """Tokens of the worst-case graph llama_context::sched_reserve builds."""
        return min(self.n_ctx, self.n_ubatch)


def plan_context(hp: ModelHParams, args: ServerArgs) -> ContextPlan:
    n_seq, unified = args.n_parallel, bool(args.kv_unified)
    if n_seq < 0:
        n_seq, unified = AUTO_SLOTS, True
    n_seq = max(1, n_seq)

    n_batch, n_ubatch = args.n_batch, args.n_ubatch
    if args.embedding and n_batch > n_ubatch:
        n_batch = n_ubatch  # server.cpp: embeddings need the whole input in one ubatch

    n_ctx = args.ctx_size or 0
    if args.ctx_size is None and args.kv_unified_per_slot > 0:
        n_ctx = n_seq * args.kv_unified_per_slot
    if n_ctx <= 0:
        n_ctx = hp.n_ctx_train  # -c 0 or no -c: the training context

    causal = hp.causal
    if causal:
        n_batch = min(n_ctx, n_batch)
    n_ubatch = min(n_batch, n_ubatch or n_batch)

    n_ctx = pad(n_ctx, KV_PAD)
    if unified:
        n_ctx_seq = n_ctx
    else:
        n_ctx_seq = pad(n_ctx // n_seq, KV_PAD)
        n_ctx = n_ctx_seq * n_seq  # raised to fit N whole streams

    if args.embedding or args.pooling not in (None, "none"):
        n_outputs_max = n_batch
    else:
        n_outputs_max = min(n_batch, n_seq)
    return ContextPlan(
        n_ctx=n_ctx, n_ctx_seq=n_ctx_seq, n_seq_max=n_seq, n_stream=1 if unified else n_seq,
        kv_unified=unified, n_batch=n_batch, n_ubatch=n_ubatch,
        # "auto" resolves to on when every FA node lands on its layer's device: true on the
        # CPU (measured, §9 of the research notes) and on CUDA for the usual head sizes.
        flash_attn=args.flash_attn != "off", causal=causal, embeddings=args.embedding,
        n_outputs_max=n_outputs_max,
    )
