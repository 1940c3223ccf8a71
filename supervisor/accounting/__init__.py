"""Memory accounting for llama-server engines: count first (from the GGUF header and the
flags), load second, then read what the engine says it allocated.

    gguf_header   read a GGUF header without touching tensor data
    server_args   the memory-relevant llama-server flags from an argv
    hparams       layer structure: heads, sliding-window, recurrent and KV-owning layers
    context       cells, streams, slots and batch sizes llama-server sets up
    placement     which device holds each weight and layer (-ngl, -ot, --cpu-moe, ...)
    kv_cache      KV cache and recurrent state per layer
    compute       compute buffer (calibrated approximation)
    mmproj        multimodal projector
    estimate      all of it per device: Estimate / DeviceEstimate / HostEstimate
    llama_logs    the buffer sizes a running llama-server logs (needs -lv 4)
"""

from supervisor.accounting.estimate import DeviceEstimate, Estimate, HostEstimate, estimate
from supervisor.accounting.gguf_header import GGUFError, GGUFHeader, TensorInfo, read_gguf_header
from supervisor.accounting.llama_logs import LlamaLogAccumulator, MeasuredBreakdown, parse_llama_log

__all__ = [
    "DeviceEstimate", "Estimate", "GGUFError", "GGUFHeader", "HostEstimate", "LlamaLogAccumulator",
    "MeasuredBreakdown", "TensorInfo", "estimate", "parse_llama_log", "read_gguf_header",
]
