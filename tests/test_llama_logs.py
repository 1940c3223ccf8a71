"""supervisor.accounting.llama_logs: buffer sizes from a llama-server log, one line at a time.

The CPU lines are verbatim from llama-server b1-0c1e570 at -lv 4 (timestamp and level
prefix included); the CUDA lines follow the same format strings (research notes §2.11).
"""

from __future__ import annotations

from supervisor.accounting.llama_logs import (
    KvCacheSummary,
    LlamaLogAccumulator,
    buffer_device,
    parse_llama_log,
)

MIB = 1024 * 1024

GEMMA3_CPU = """\
0.00.012.100 I llama_model_loader: loaded meta data with 26 key-value pairs and 80 tensors from /tmp/acc/log-gemma3.gguf (version GGUF V3 (latest))
0.00.013.482 I load: token to piece cache size = 0.0005 MB
0.00.015.541 I load_tensors:   CPU_Mapped model buffer size =     0.57 MiB
0.00.015.797 I llama_context:        CPU  output buffer size =     0.01 MiB
0.00.015.798 I llama_kv_cache_iswa: creating non-SWA KV cache, size = 1024 cells
0.00.015.826 I llama_kv_cache:        CPU KV buffer size =     0.50 MiB
0.00.015.865 I llama_kv_cache: size =    0.50 MiB (  1024 cells,   1 layers,  4/4 seqs), K (f16):    0.25 MiB, V (f16):    0.25 MiB
0.00.015.866 I llama_kv_cache_iswa: creating     SWA KV cache, size = 768 cells
0.00.015.965 I llama_kv_cache:        CPU KV buffer size =     1.88 MiB
0.00.017.200 I llama_kv_cache: size =    1.88 MiB (   768 cells,   5 layers,  4/4 seqs), K (f16):    0.94 MiB, V (f16):    0.94 MiB
0.00.018.583 I sched_reserve:        CPU compute buffer size =     2.89 MiB
0.00.018.601 I sched_reserve: graph: nodes = 262, splits = 1, input objects = 6, input tensors = 9
"""

GRANITEHYBRID_CPU = """\
0.00.007.190 I llama_model_loader: loaded meta data with 28 key-value pairs and 51 tensors from /tmp/acc/log-granitehybrid.gguf (version GGUF V3 (latest))
0.00.009.474 I load_tensors:   CPU_Mapped model buffer size =     0.47 MiB
0.00.009.953 I llama_context:        CPU  output buffer size =     0.01 MiB
0.00.009.994 I llama_kv_cache:        CPU KV buffer size =     0.50 MiB
0.00.010.169 I llama_kv_cache: size =    0.50 MiB (  1024 cells,   1 layers,  4/4 seqs), K (f16):    0.25 MiB, V (f16):    0.25 MiB
0.00.010.229 I llama_memory_recurrent:        CPU RS buffer size =     0.12 MiB
0.00.010.250 I llama_memory_recurrent: size =    0.12 MiB (     4 cells,   4 layers,  4 seqs  0 rs_seq), R (f32):    0.02 MiB, S (f32):    0.09 MiB, P (f32):    0.00 MiB
0.00.011.292 I sched_reserve:        CPU compute buffer size =     3.07 MiB
"""

CUDA_PARTIAL = """\
llama_model_loader: loaded meta data with 40 key-value pairs and 579 tensors from /models/qwen3-30b-a3b.gguf (version GGUF V3 (latest))
load_tensors: offloading output layer to GPU
load_tensors: offloading 47 repeating layers to GPU
load_tensors: offloaded 48/49 layers to GPU
load_tensors:   CPU_Mapped model buffer size = 15000.25 MiB
load_tensors:        CUDA0 model buffer size =  2200.50 MiB
llama_context:  CUDA_Host  output buffer size =     2.32 MiB
llama_kv_cache:        CPU KV buffer size =    64.00 MiB
llama_kv_cache:      CUDA0 KV buffer size =  3008.00 MiB
llama_kv_cache: size = 3072.00 MiB ( 32768 cells,  48 layers,  4/1 seqs), K (f16): 1536.00 MiB, V (f16): 1536.00 MiB
sched_reserve:      CUDA0 compute buffer size =   300.75 MiB
sched_reserve:  CUDA_Host compute buffer size =    68.01 MiB
clip_ctx: CLIP using CUDA0 backend
load_hparams: model size:         812.00 MiB
alloc_compute_meta:      CUDA0 compute buffer size =    12.00 MiB
"""


def test_gemma3_sliding_window_log_sums_both_kv_caches() -> None:
    b = parse_llama_log(GEMMA3_CPU)
    assert b.component("weights") == round(0.57 * MIB)
    assert b.component("kv") == round(0.50 * MIB) + round(1.88 * MIB)
    assert b.component("compute") == round(2.89 * MIB)
    assert b.component("output") == round(0.01 * MIB)
    assert b.component("recurrent") == 0
    assert set(b.devices()) == {"host"}
    assert b.kv_caches == (
        KvCacheSummary(1024, 1, 4, 4, "f16", "f16", round(0.25 * MIB), round(0.25 * MIB)),
        KvCacheSummary(768, 5, 4, 4, "f16", "f16", round(0.94 * MIB), round(0.94 * MIB)),
    )
    assert b.total() == sum(b.devices()["host"].values())


def test_hybrid_log_has_recurrent_state() -> None:
    b = parse_llama_log(GRANITEHYBRID_CPU)
    assert b.devices() == {"host": {
        "weights": round(0.47 * MIB), "output": round(0.01 * MIB), "kv": round(0.50 * MIB),
        "recurrent": round(0.12 * MIB), "compute": round(3.07 * MIB)}}


def test_gpu_log_splits_devices_and_keeps_the_projector_apart() -> None:
    b = parse_llama_log(CUDA_PARTIAL)
    devices = b.devices()
    assert devices["gpu0"] == {"weights": round(2200.50 * MIB), "kv": 3008 * MIB,
                               "compute": round(300.75 * MIB), "mmproj": 812 * MIB, "mmproj_compute": 12 * MIB}
    assert devices["host"] == {"weights": round(15000.25 * MIB), "output": round(2.32 * MIB), "kv": 64 * MIB,
                               "compute": round(68.01 * MIB)}
    assert {buf.buffer for buf in b.buffers if buf.device == "host"} == {"CPU_Mapped", "CUDA_Host", "CPU"}
    assert b.kv_caches[0].cells == 32768 and b.kv_caches[0].streams == 1


def test_fed_line_by_line_and_a_new_load_starts_over() -> None:
    acc = LlamaLogAccumulator()
    for line in GEMMA3_CPU.splitlines():
        acc.feed(line)
    assert acc.breakdown() == parse_llama_log(GEMMA3_CPU)
    assert acc.breakdown().component("kv") > 0
    # the engine restarts (or a fit probe came first): only the latest load counts
    for line in GRANITEHYBRID_CPU.splitlines():
        acc.feed(line)
    assert acc.breakdown() == parse_llama_log(GRANITEHYBRID_CPU)


def test_unrelated_lines_are_ignored() -> None:
    acc = LlamaLogAccumulator()
    for line in ["srv  llama_server: listening on http://127.0.0.1:8080",
                 "load: token to piece cache size = 0.0005 MB",
                 "print_info: file size   = 4.13 MiB (8.50 BPW)",
                 "", "garbage = = MiB"]:
        acc.feed(line)
    assert acc.breakdown().buffers == () and acc.breakdown().total() == 0


def test_buffer_names_map_to_devices() -> None:
    assert buffer_device("CPU") == buffer_device("CPU_Mapped") == buffer_device("CPU_REPACK") == "host"
    assert buffer_device("CUDA_Host") == buffer_device("ROCm_Host") == "host"
    assert buffer_device("CUDA0") == "gpu0" and buffer_device("CUDA1") == "gpu1"
    assert buffer_device("ROCm0") == buffer_device("Vulkan0") == buffer_device("MTL0_Mapped") == "gpu0"


def test_the_load_is_whole_once_the_log_says_the_model_is_loaded() -> None:
    acc = LlamaLogAccumulator()
    acc.feed_text(GEMMA3_CPU)
    assert not acc.loaded  # a compute buffer line may still come
    acc.feed("0.00.313.088 I srv  llama_server: model loaded")  # b1-0c1e570's words
    assert acc.loaded
    acc.feed("0.00.012.100 I llama_model_loader: loaded meta data with 26 key-value pairs and 80 tensors from /m")
    assert not acc.loaded  # a new load starts over
    acc.feed("main: model loaded")  # older llama-server, and the fake
    assert acc.loaded


def test_the_buffers_event_waits_for_the_whole_load_even_when_the_probe_saw_it_ready_first() -> None:
    from types import SimpleNamespace

    from adapters.llama_server import BufferSizeReader
    from supervisor.engines.driver import _BuffersReport

    emitted: list[dict[str, object]] = []
    events = SimpleNamespace(emit=lambda name, level, **fields: emitted.append({"event": name, **fields}))
    report = _BuffersReport(SimpleNamespace(spec=SimpleNamespace(name="chat"), events=events), BufferSizeReader())
    *early, last_buffer = [line for line in GEMMA3_CPU.splitlines() if "buffer size" in line]
    for line in early:
        report.read(line)
    report.engine_ready()  # /health answered before the pipe's last lines were read (a busy host)
    report.read(last_buffer)
    assert emitted == []
    report.read("0.00.313.088 I srv  llama_server: model loaded")
    report.read("main: model loaded")  # once only
    assert emitted == [{"event": "buffers", "engine": "chat",
                        "devices": parse_llama_log(GEMMA3_CPU).devices()}]
