"""What a llama-server process says it allocated, read from its log line by line.

The lines (formats from llama.cpp b1-0c1e570; the function prefix changes between
versions, so only the tail is matched)::

    load_tensors:   CPU_Mapped model buffer size =     1.52 MiB
    llama_kv_cache:        CPU KV buffer size =     4.00 MiB
    llama_kv_cache: size =    4.00 MiB (  1024 cells,   2 layers,  1/1 seqs), K (f16):    2.00 MiB, V (f16):    2.00 MiB
    llama_memory_recurrent:        CPU RS buffer size =     0.06 MiB
    sched_reserve:        CPU compute buffer size =     1.62 MiB
    llama_context:        CPU  output buffer size =     0.01 MiB
    alloc_compute_meta:        CPU compute buffer size =    12.00 MiB   (mmproj / clip)
    load_hparams: model size:         812.00 MiB                         (mmproj / clip)

Values print with two decimals, so each is known to ±0.005 MiB. A new model load
(``llama_model_loader: loaded meta data with ...``) starts the tally over, so a fit
probe before the real load, or a restart, does not count twice.
"""

from __future__ import annotations

import re

import attrs

MIB = 1024 * 1024
HOST = "host"

_BUFFER = re.compile(r"(?P<name>\S+)\s+(?P<kind>model|KV|RS|compute|output)"
                     r"\s+buffer size\s*=\s*(?P<mib>[\d.]+)\s*MiB")
_KV_SUMMARY = re.compile(r"size\s*=\s*(?P<mib>[\d.]+)\s*MiB\s*\(\s*(?P<cells>\d+)\s*cells,\s*(?P<layers>\d+)\s*layers,"
                         r"\s*(?P<seqs>\d+)/(?P<streams>\d+)\s*seqs\),\s*K\s*\((?P<k_type>\w+)\):\s*(?P<k_mib>[\d.]+)\s*MiB,"
                         r"\s*V\s*\((?P<v_type>\w+)\):\s*(?P<v_mib>[\d.]+)\s*MiB")
_CLIP_MODEL = re.compile(r"model size:\s*(?P<mib>[\d.]+)\s*MiB")
_CLIP_BACKEND = re.compile(r"CLIP using (?P<name>\S+) backend")
_NEW_LOAD = re.compile(r"loaded meta data with \d+ key-value pairs")
# llama-server, after every buffer line of its load ("srv  llama_server: model loaded"; older: "main: model loaded")
_LOADED = re.compile(r": model loaded\s*$")
_KINDS = {"model": "weights", "KV": "kv", "RS": "recurrent", "compute": "compute", "output": "output"}


def buffer_device(name: str) -> str:
    """``host`` for CPU/pinned buffers, ``gpuN`` for a GPU's own buffers (CUDA0, ROCm1, MTL0_Mapped, ...)."""
    base = re.sub(r"_(Mapped|REPACK|Private)$", "", name)
    if base.upper().startswith("CPU") or base.endswith("_Host") or base in ("BLAS", "AMX", "KLEIDIAI"):
        return HOST
    digits = re.search(r"(\d+)", base)
    return f"gpu{digits.group(1)}" if digits else base


def _bytes(mib: str) -> int:
    return round(float(mib) * MIB)


@attrs.frozen
class MeasuredBuffer:
    component: str  # weights | kv | recurrent | compute | output | mmproj | mmproj_compute
    buffer: str  # the backend buffer name as logged: CPU_Mapped, CUDA0, CUDA_Host, ...
    device: str  # host | gpu0 | ...
    nbytes: int


@attrs.frozen
class KvCacheSummary:
    cells: int  # per stream
    layers: int
    seqs: int
    streams: int
    k_type: str
    v_type: str
    k_bytes: int
    v_bytes: int


@attrs.frozen
class MeasuredBreakdown:
    buffers: tuple[MeasuredBuffer, ...]
    kv_caches: tuple[KvCacheSummary, ...]

    def component(self, component: str, device: str | None = None) -> int:
        """Bytes of one component (on one device, or everywhere)."""
        return sum(b.nbytes for b in self.buffers
                   if b.component == component and (device is None or b.device == device))

    def devices(self) -> dict[str, dict[str, int]]:
        """device -> component -> bytes."""
        out: dict[str, dict[str, int]] = {}
        for b in self.buffers:
            per = out.setdefault(b.device, {})
            per[b.component] = per.get(b.component, 0) + b.nbytes
        return out

    def total(self, device: str | None = None) -> int:
        return sum(b.nbytes for b in self.buffers if device is None or b.device == device)


class LlamaLogAccumulator:
    """Feed llama-server output one line at a time; ask for the breakdown at any point."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, str], int] = {}
        self._kv: list[KvCacheSummary] = []
        self._clip_backend = "CPU"
        self.loaded = False  # the log said the load is over: every buffer of it is in

    def feed(self, line: str) -> None:
        if _NEW_LOAD.search(line):
            self._buffers = {k: v for k, v in self._buffers.items() if k[0].startswith("mmproj")}
            self._kv = []
            self.loaded = False
            return
        if _LOADED.search(line):
            self.loaded = True
            return
        match = _BUFFER.search(line)
        if match:
            component = _KINDS[match["kind"]]
            if component == "compute" and "alloc_compute_meta" in line:
                component = "mmproj_compute"  # the clip (mmproj) graph, not the LLM's
            key = (component, match["name"])
            self._buffers[key] = self._buffers.get(key, 0) + _bytes(match["mib"])
            return
        match = _KV_SUMMARY.search(line)
        if match:
            self._kv.append(KvCacheSummary(
                int(match["cells"]), int(match["layers"]), int(match["seqs"]), int(match["streams"]),
                match["k_type"], match["v_type"], _bytes(match["k_mib"]), _bytes(match["v_mib"])))
            return
        match = _CLIP_BACKEND.search(line)
        if match:
            self._clip_backend = match["name"]
            return
        match = _CLIP_MODEL.search(line)
        if match and "load_hparams" in line:
            self._buffers[("mmproj", "")] = _bytes(match["mib"])

    def feed_text(self, text: str) -> None:
        for line in text.splitlines():
            self.feed(line)

    def breakdown(self) -> MeasuredBreakdown:
        buffers = []
        for (component, name), nbytes in self._buffers.items():
            name = name or self._clip_backend  # the clip weights' line does not name its buffer
            buffers.append(MeasuredBuffer(component, name, buffer_device(name), nbytes))
        return MeasuredBreakdown(tuple(buffers), tuple(self._kv))


def parse_llama_log(text: str) -> MeasuredBreakdown:
    acc = LlamaLogAccumulator()
    acc.feed_text(text)
    return acc.breakdown()
