"""The multimodal projector (``--mmproj``): its weights and an approximate compute buffer.

``tools/mtmd/clip.cpp`` loads the whole projector on one backend: the first GPU,
or the CPU with ``--no-mmproj-offload``. Its weights are the file's tensors
(``load_hparams: model size``). Its compute buffer is reserved at warm-up for one
image of ``clip.vision.image_size`` (``alloc_compute_meta``); that is approximated
from the vision tower's shape:

    n_pos   = (image_size / patch_size)^2 + 1
    compute = f32 x n_pos x (4 n_embd + 2 n_ff) + attention scores
    scores  = f32 x n_pos^2 x n_head x 2 without flash attention, f16 x n_pos^2 with it

Dynamic-resolution projectors (Qwen2-VL and relatives) reserve for a fixed token
budget instead; the image_size rule is an approximation for them.
"""

from __future__ import annotations

import attrs

from supervisor.accounting.gguf_header import GGUFHeader


@attrs.frozen
class ProjectorEstimate:
    weights: int
    compute: int


def estimate_projector(header: GGUFHeader, *, flash_attn: bool = True) -> ProjectorEstimate:
    get = header.get
    n_embd = int(get("clip.vision.embedding_length", 0))
    n_ff = int(get("clip.vision.feed_forward_length", 4 * n_embd))
    n_head = int(get("clip.vision.attention.head_count", 1)) or 1
    image = int(get("clip.vision.image_size", 0))
    patch = int(get("clip.vision.patch_size", 0)) or 1
    compute = 0
    if n_embd and image:
        n_pos = (image // patch) ** 2 + 1
        compute = 4 * n_pos * (4 * n_embd + 2 * n_ff)
        compute += 2 * n_pos * n_pos if flash_attn else 2 * 4 * n_pos * n_pos * n_head
    return ProjectorEstimate(header.tensor_bytes, compute)
