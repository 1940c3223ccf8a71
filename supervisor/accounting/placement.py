"""Which device holds each weight tensor and each layer (llama.cpp b1-0c1e570).

``llama_model_base::load_tensors`` (``src/llama-model.cpp``):

* ``-ngl N`` counts the output layer too and offloads it first:
  ``i_gpu_start = max(n_layer + 1 - N, 0)``; layer ``il`` (``il == n_layer`` is the output
  layer) is on a GPU iff ``il >= i_gpu_start``. The default (``-1``, "auto"/"all") is
  ``n_layer + 1``: everything on the GPU. GPUs share the offloaded layers by ``-ts``
  (default: in proportion to free memory; assumed equal here).
* The input layer (``token_embd``, ``per_layer_token_embd``, ...) always stays in host
  memory ("very little benefit to offloading the input layer").
* ``-ot PATTERN=BUFT`` (and ``--cpu-moe``/``--n-cpu-moe``, which are such overrides) moves
  matching weights; the first matching pattern wins (``llama_model_loader::create_tensor``).
  The layer's KV cache stays on the layer's device.
* A model without ``output.weight`` uses ``token_embd`` as its output: llama.cpp creates a
  second copy on the output layer's device (``TENSOR_DUPLICATED``), unless that is the same
  buffer type as the input copy.
"""

from __future__ import annotations

import bisect
import re

import attrs

from supervisor.accounting.gguf_header import GGUFHeader, TensorInfo
from supervisor.accounting.hparams import NO_LM_HEAD_ARCHS, ModelHParams
from supervisor.accounting.server_args import ServerArgs

HOST = "host"

# LLM_TENSOR_INFOS entries of class LLM_TENSOR_LAYER_INPUT (src/llama-arch.cpp)
INPUT_TENSORS = frozenset({"token_embd", "position_embd", "token_types", "per_layer_token_embd",
                           "masked_embd_centroids", "masked_embd_ordering"})
# Repeating-class tensors without a block number: created with layer 0, copied to other devices.
_LAYER_DUPLICATED = frozenset({"rope_freqs", "rope_factors_long", "rope_factors_short"})
_BLOCK = re.compile(r"blk\.(\d+)\.")


def gpu_device(index: int) -> str:
    return f"gpu{index}"


class PlacementError(ValueError):
    pass


@attrs.frozen
class WeightPlacement:
    layer_devices: tuple[str, ...]  # device of each repeating layer (its KV and state go there too)
    output_device: str
    tensor_devices: dict[str, str] = attrs.field(eq=False)  # tensor name -> device
    duplicates: tuple[tuple[str, str], ...]  # (tensor name, device) of extra copies llama.cpp makes
    n_gpu: int
    n_layers_on_gpu: int  # counting the output layer, as llama.cpp's "offloaded N/M layers"


def layer_devices(n_layer_all: int, n_gpu_layers: int, n_gpu: int,
                  tensor_split: tuple[float, ...]) -> tuple[list[str], str]:
    """Device of every repeating layer and of the output layer."""
    ngl = n_gpu_layers if n_gpu_layers >= 0 else n_layer_all + 1
    i_gpu_start = max(n_layer_all + 1 - ngl, 0)
    act_gpu_layers = 0 if n_gpu == 0 else min(ngl, n_layer_all + 1)
    split = list(tensor_split[:n_gpu]) + [0.0] * max(0, n_gpu - len(tensor_split))
    if not any(split):
        split = [1.0] * n_gpu
    total = sum(split)
    cumulative, running = [], 0.0
    for share in split:
        running += share
        cumulative.append(running / total)

    def device(il: int) -> str:
        if il < i_gpu_start or il - i_gpu_start >= act_gpu_layers:
            return HOST
        return gpu_device(bisect.bisect_right(cumulative, (il - i_gpu_start) / act_gpu_layers))

    return [device(il) for il in range(n_layer_all)], device(n_layer_all)


def buffer_type_device(buft: str, n_gpu: int) -> str:
    """Device of a buffer type name given to ``-ot``: CPU/host types, or CUDA0/ROCm1/Vulkan0/..."""
    if buft.upper().startswith("CPU") or buft.endswith("_Host"):
        return HOST
    digits = re.search(r"(\d+)$", buft)
    if digits is None:
        raise PlacementError(f"--override-tensor: unknown buffer type {buft!r}")
    index = int(digits.group(1))
    if n_gpu == 0:
        return HOST  # a CPU-only estimate: llama-server would reject the type, nothing is offloaded
    if index >= n_gpu:
        raise PlacementError(f"--override-tensor: {buft} names GPU {index}, but only {n_gpu} GPU(s) are counted")
    return gpu_device(index)


def tensor_layer(name: str, arch: str) -> int | None:
    """The block number of a repeating-layer tensor, or None for input/output tensors."""
    match = _BLOCK.match(name)
    if match:
        return int(match.group(1))
    base = name.split(".", 1)[0]
    if base == "token_embd_norm" and arch not in ("lfm2", "lfm2moe"):
        return 0  # LLM_TENSOR_TOKEN_EMBD_NORM is a repeating tensor of layer 0 (lfm2: output norm)
    if base in _LAYER_DUPLICATED:
        return 0
    return None


def place_weights(header: GGUFHeader, hp: ModelHParams, args: ServerArgs, n_gpu: int) -> WeightPlacement:
    if args.gpu_disabled:
        n_gpu = 0
    split = args.tensor_split
    if n_gpu and args.split_mode == "none":
        # -sm none: one GPU (the main one) takes every offloaded layer
        split = tuple(1.0 if i == args.main_gpu else 0.0 for i in range(n_gpu))
    layers, output = layer_devices(hp.n_layer_all, args.n_gpu_layers, n_gpu, split)
    overrides = [(re.compile(o.pattern), buffer_type_device(o.buffer_type, n_gpu)) for o in args.overrides]

    def natural(tensor: TensorInfo) -> str:
        base = tensor.name.split(".", 1)[0]
        if base in INPUT_TENSORS:
            return HOST
        il = tensor_layer(tensor.name, hp.arch)
        if il is not None:
            return layers[il] if il < len(layers) else HOST
        return output

    def overridden(name: str) -> str | None:
        for pattern, device in overrides:
            if pattern.search(name):
                return device
        return None

    devices: dict[str, str] = {}
    for tensor in header.tensors:
        forced = overridden(tensor.name)
        devices[tensor.name] = forced if forced is not None else natural(tensor)

    duplicates: list[tuple[str, str]] = []
    embd = header.tensor("token_embd.weight")
    if embd is not None and header.tensor("output.weight") is None and hp.arch not in NO_LM_HEAD_ARCHS:
        forced = overridden(embd.name)
        target = forced if forced is not None else output
        if target != devices[embd.name]:
            duplicates.append((embd.name, target))
    for tensor in header.tensors:
        if tensor.name.split(".", 1)[0] in _LAYER_DUPLICATED and overridden(tensor.name) is None:
            for device in sorted(set(layers) - {devices[tensor.name], HOST}):
                duplicates.append((tensor.name, device))

    on_gpu = sum(1 for d in layers if d != HOST) + (output != HOST)
    return WeightPlacement(tuple(layers), output, devices, tuple(duplicates), n_gpu, on_gpu)


def weight_bytes_by_device(header: GGUFHeader, placement: WeightPlacement) -> dict[str, int]:
    """Weight bytes per device.

    Host bytes count the alignment padding between neighbouring host tensors: with
    mmap the host buffer is the file range from a tensor's first byte to the last
    (``llama_model_loader::get_mapping_range``), so a model kept wholly in host memory
    reports exactly that span (``CPU_Mapped model buffer size``).
    """
    out: dict[str, int] = {}
    ordered = sorted(header.tensors, key=lambda t: t.offset)
    for i, tensor in enumerate(ordered):
        device = placement.tensor_devices[tensor.name]
        size = tensor.nbytes
        if device == HOST and i + 1 < len(ordered) and placement.tensor_devices[ordered[i + 1].name] == HOST:
            size = ordered[i + 1].offset - tensor.offset
        out[device] = out.get(device, 0) + size
    by_name = {t.name: t for t in header.tensors}
    for name, device in placement.duplicates:
        out[device] = out.get(device, 0) + by_name[name].nbytes
    return out
