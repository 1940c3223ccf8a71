"""Memory a llama-server process will take, per device, from the GGUF header and its flags.

    estimate("model.gguf", ["-c", "8192", "-np", "4", "-ngl", "99"])

Per GPU: weights + KV cache + recurrent state + compute buffer + projector + a
runtime reserve (CUDA context, cuBLAS workspace and pools, which llama.cpp does not
report). Host: weights left in RAM (input embeddings, layers not offloaded,
``--cpu-moe`` experts), caches of host layers (or all with ``-nkvo``), the host
compute buffer and the output (logits) buffer, which llama.cpp always keeps in host
memory. With ``device="cpu"`` (no GPU, or ``-dev none``) everything is host memory.

Assumptions (llama.cpp b1-0c1e570, the build the tests run):

* ``-ngl`` unset ("auto") means every layer and the output layer on the GPU;
  llama-server's ``--fit`` may lower it, or ``-c``, when memory is short at load time,
  which an estimate made beforehand cannot know. Give ``-ngl`` and ``-c`` explicitly for
  a footprint that does not move.
* Without ``-c`` the context is the model's training context.
* ``-fa auto`` means flash attention on.
* GPUs share layers equally unless ``-ts`` says otherwise (llama.cpp splits by free
  memory at load time).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import attrs

from supervisor.accounting.compute import compute_bytes
from supervisor.accounting.context import ContextPlan, plan_context
from supervisor.accounting.gguf_header import GGUFHeader, read_gguf_header, read_gguf_model
from supervisor.accounting.hparams import ModelHParams, read_hparams
from supervisor.accounting.kv_cache import QUANTIZED_CACHE_TYPES, kv_layers, recurrent_layers
from supervisor.accounting.mmproj import estimate_projector
from supervisor.accounting.placement import HOST, gpu_device, place_weights, weight_bytes_by_device
from supervisor.accounting.server_args import ServerArgs, parse_server_args

MIB = 1024 * 1024
# CUDA context + cuBLAS workspace + memory pools per GPU: 250-500 MiB in published
# measurements (research notes §0, §3.1); the middle of that range.
DEFAULT_GPU_RESERVE = 400 * MIB
F32 = 4


@attrs.frozen
class DeviceEstimate:
    weights: int = 0
    kv: int = 0
    recurrent: int = 0
    compute: int = 0
    mmproj: int = 0
    output: int = 0
    reserve: int = 0
    total: int = attrs.field(init=False)

    @total.default
    def _sum(self) -> int:
        return self.weights + self.kv + self.recurrent + self.compute + self.mmproj + self.output + self.reserve


@attrs.frozen
class HostEstimate:
    weights: int = 0
    kv: int = 0
    recurrent: int = 0
    compute: int = 0
    mmproj: int = 0
    output: int = 0
    total: int = attrs.field(init=False)

    @total.default
    def _sum(self) -> int:
        return self.weights + self.kv + self.recurrent + self.compute + self.mmproj + self.output


@attrs.frozen
class Estimate:
    model: str
    devices: dict[str, DeviceEstimate]
    host: HostEstimate
    context: ContextPlan
    notes: tuple[str, ...] = ()

    @property
    def gpu_total(self) -> int:
        return sum(d.total for d in self.devices.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "devices": {name: attrs.asdict(d) for name, d in self.devices.items()},
            "host": attrs.asdict(self.host),
        }


def estimate(model: str | os.PathLike[str] | GGUFHeader, argv: Sequence[str] = (), *,
             device: str = "gpu", n_gpu: int = 1, gpu_reserve: int = DEFAULT_GPU_RESERVE) -> Estimate:
    """Estimate the memory of ``llama-server -m MODEL *argv`` (argv: llama-server flags).

    *device* ``"cpu"`` estimates a CPU-only server (no GPU layers; all memory is host RAM);
    ``"gpu"`` counts *n_gpu* GPUs named gpu0, gpu1, ...
    """
    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
    header = model if isinstance(model, GGUFHeader) else read_gguf_model(model)
    args = parse_server_args(list(argv))
    hp = read_hparams(header)
    return estimate_from(header, hp, args, n_gpu=0 if device == "cpu" or args.gpu_disabled else n_gpu,
                         gpu_reserve=gpu_reserve)


def estimate_from(header: GGUFHeader, hp: ModelHParams, args: ServerArgs, *, n_gpu: int,
                  gpu_reserve: int = DEFAULT_GPU_RESERVE) -> Estimate:
    notes: list[str] = []
    ctx = plan_context(hp, args)
    if args.cache_type_v in QUANTIZED_CACHE_TYPES and not ctx.flash_attn:
        notes.append("a quantized V cache needs flash attention: llama-server will refuse -fa off "
                     f"with -ctv {args.cache_type_v}")
    placement = place_weights(header, hp, args, n_gpu)
    offload = not args.no_kv_offload
    kv = kv_layers(hp, ctx, placement, cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v,
                   swa_full=args.swa_full, offload=offload)
    recurrent = recurrent_layers(hp, ctx, placement, offload=offload)
    weights = weight_bytes_by_device(header, placement)
    compute = compute_bytes(header, hp, ctx, placement, kv)

    # llama_context::output_reserve: logits (+ embeddings) for n_seq_max outputs, in host memory
    n_embd_out = int(header.arch_get("embedding_length_out", hp.n_embd))
    output = (hp.n_vocab + (n_embd_out if ctx.embeddings else 0)) * ctx.n_seq_max * F32

    mmproj_weights = mmproj_compute = 0
    mmproj_device = HOST
    if args.mmproj:
        projector = estimate_projector(read_gguf_header(args.mmproj), flash_attn=ctx.flash_attn)
        mmproj_weights, mmproj_compute = projector.weights, projector.compute
        if n_gpu and args.mmproj_offload:
            mmproj_device = gpu_device(0)

    def sum_on(items: list[Any], name: str) -> int:
        return sum(item.nbytes for item in items if item.device == name)

    devices = {}
    for index in range(n_gpu):
        name = gpu_device(index)
        devices[name] = DeviceEstimate(
            weights=weights.get(name, 0), kv=sum_on(kv, name), recurrent=sum_on(recurrent, name),
            compute=compute.get(name, 0),
            mmproj=mmproj_weights + mmproj_compute if mmproj_device == name else 0,
            output=0, reserve=gpu_reserve,
        )
    host = HostEstimate(
        weights=weights.get(HOST, 0), kv=sum_on(kv, HOST), recurrent=sum_on(recurrent, HOST),
        compute=compute.get(HOST, 0),
        mmproj=mmproj_weights + mmproj_compute if mmproj_device == HOST else 0, output=output,
    )
    return Estimate(header.path, devices, host, ctx, tuple(notes))


def format_estimate(result: Estimate) -> str:
    """A table: one row per component, one column per device and the host."""
    from supervisor.units import format_size

    ctx = result.context
    streams = f"{ctx.n_stream} x {ctx.n_ctx_seq}" if ctx.n_stream > 1 else "unified" if ctx.n_seq_max > 1 else "1 slot"
    lines = [
        f"model    {result.model}",
        f"context  {ctx.n_ctx} cells ({streams}), {ctx.n_seq_max} slot(s), ubatch {ctx.n_ubatch}, "
        f"flash attention {'on' if ctx.flash_attn else 'off'}",
        "",
    ]
    columns = [(name, attrs.asdict(device)) for name, device in result.devices.items()]
    columns.append(("host", attrs.asdict(result.host)))
    rows = ["weights", "kv", "recurrent", "compute", "mmproj", "output", "reserve", "total"]
    lines.append(f"{'':10}" + "".join(f"{name:>12}" for name, _ in columns))
    for row in rows:
        cells = [format_size(values[row]) if row in values else "-" for _, values in columns]
        lines.append(f"{row:10}" + "".join(f"{cell:>12}" for cell in cells))
    if result.devices:
        lines.append(f"\nGPU total {format_size(result.gpu_total)} ({result.gpu_total} bytes), "
                     f"host total {format_size(result.host.total)} ({result.host.total} bytes)")
    else:
        lines.append(f"\nhost total {format_size(result.host.total)} ({result.host.total} bytes)")
    lines += [f"note: {note}" for note in result.notes]
    return "\n".join(lines)
