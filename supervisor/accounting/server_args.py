"""The llama-server flags that decide memory, read from an argv list.

Spellings and defaults are those of llama.cpp b1-0c1e570 (``common/arg.cpp``,
``common/common.h``, ``tools/server/server.cpp``). Flags that do not change memory
are skipped; a flag's value may be the next word or follow ``=``.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

# common/common.h LLM_FFN_EXPS_REGEX / LLM_FFN_DENSE_REGEX (--cpu-moe, --n-cpu-moe, --n-cpu-ffn)
FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
FFN_DENSE_REGEX = r"\.ffn_(up|down|gate)\."

KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


class ServerArgsError(ValueError):
    """A memory-relevant flag with a value llama-server would reject."""


@attrs.frozen
class TensorOverride:
    """``-ot PATTERN=BUFT``: tensors whose name matches PATTERN (re.search) go to BUFT."""

    pattern: str
    buffer_type: str


@attrs.frozen
class ServerArgs:
    model: str | None = None
    ctx_size: int | None = None  # None: not given (llama-server then uses the training context)
    n_parallel: int = -1  # -1: auto = 4 slots with a unified KV cache
    kv_unified: bool | None = None  # None: not given
    kv_unified_per_slot: int = 0
    n_batch: int = 2048
    n_ubatch: int = 512
    n_gpu_layers: int = -1  # < 0: all layers + the output layer ("auto" / "all")
    split_mode: str = "layer"
    tensor_split: tuple[float, ...] = ()
    main_gpu: int = 0
    devices: tuple[str, ...] = ()  # -dev; ("none",) keeps everything on the CPU
    overrides: tuple[TensorOverride, ...] = ()  # in argv order: the first match wins
    no_kv_offload: bool = False
    flash_attn: str = "auto"
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    swa_full: bool = False
    mmproj: str | None = None
    mmproj_offload: bool = True
    embedding: bool = False
    pooling: str | None = None
    op_offload: bool = True

    @property
    def gpu_disabled(self) -> bool:
        return self.devices == ("none",)


def _parse_int(flag: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ServerArgsError(f"{flag}: expected an integer, got {value!r}") from None


def _parse_overrides(value: str) -> list[TensorOverride]:
    out = []
    for item in value.split(","):
        pattern, eq, buft = item.partition("=")
        if not eq or not pattern:
            raise ServerArgsError(f"--override-tensor: expected PATTERN=BUFFER_TYPE, got {item!r}")
        out.append(TensorOverride(pattern, buft))
    return out


def _parse_ngl(value: str) -> int:
    if value in ("auto", "all"):
        return -1
    return _parse_int("--gpu-layers", value)


def _parse_fa(value: str) -> str:
    lowered = value.lower()
    if lowered in ("on", "1", "true", "enabled", "yes"):
        return "on"
    if lowered in ("off", "0", "false", "disabled", "no"):
        return "off"
    if lowered == "auto":
        return "auto"
    raise ServerArgsError(f"--flash-attn: expected on|off|auto, got {value!r}")


def _parse_cache_type(flag: str, value: str) -> str:
    lowered = value.lower()
    if lowered not in KV_CACHE_TYPES:
        raise ServerArgsError(f"{flag}: expected one of {', '.join(KV_CACHE_TYPES)}, got {value!r}")
    return lowered


def _n_cpu_overrides(value: str, flag: str, regex: str) -> list[TensorOverride]:
    count = _parse_int(flag, value)
    if count < 0:
        raise ServerArgsError(f"{flag}: must be >= 0, got {count}")
    return [TensorOverride(rf"blk\.{i}{regex}", "CPU") for i in range(count)]


# flag spelling -> (field, how to read the value); None for switches without a value
_VALUED = {
    ("-m", "--model"): ("model", str),
    ("-c", "--ctx-size"): ("ctx_size", lambda v: _parse_int("--ctx-size", v)),
    ("-np", "--parallel"): ("n_parallel", lambda v: _parse_int("--parallel", v)),
    ("--kv-unified-per-slot",): ("kv_unified_per_slot", lambda v: _parse_int("--kv-unified-per-slot", v)),
    ("-b", "--batch-size"): ("n_batch", lambda v: _parse_int("--batch-size", v)),
    ("-ub", "--ubatch-size"): ("n_ubatch", lambda v: _parse_int("--ubatch-size", v)),
    ("-ngl", "--gpu-layers", "--n-gpu-layers"): ("n_gpu_layers", _parse_ngl),
    ("-sm", "--split-mode"): ("split_mode", str),
    ("-ts", "--tensor-split"): ("tensor_split",
                                lambda v: tuple(float(x) for x in v.replace("/", ",").split(",") if x)),
    ("-mg", "--main-gpu"): ("main_gpu", lambda v: _parse_int("--main-gpu", v)),
    ("-dev", "--device"): ("devices", lambda v: tuple(x.strip() for x in v.split(",") if x.strip())),
    ("-fa", "--flash-attn"): ("flash_attn", _parse_fa),
    ("-ctk", "--cache-type-k"): ("cache_type_k", lambda v: _parse_cache_type("--cache-type-k", v)),
    ("-ctv", "--cache-type-v"): ("cache_type_v", lambda v: _parse_cache_type("--cache-type-v", v)),
    ("-mm", "--mmproj"): ("mmproj", str),
    ("--pooling",): ("pooling", str),
}
_SWITCHES = {
    ("-kvu", "--kv-unified"): ("kv_unified", True),
    ("-no-kvu", "--no-kv-unified"): ("kv_unified", False),
    ("-nkvo", "--no-kv-offload"): ("no_kv_offload", True),
    ("-kvo", "--kv-offload"): ("no_kv_offload", False),
    ("--swa-full",): ("swa_full", True),
    ("--mmproj-offload",): ("mmproj_offload", True),
    ("--no-mmproj-offload",): ("mmproj_offload", False),
    ("--no-mmproj", "--no-mmproj-auto"): ("mmproj", None),
    ("--embedding", "--embeddings"): ("embedding", True),
    ("--no-op-offload",): ("op_offload", False),
}
_VALUED_BY_FLAG = {flag: spec for flags, spec in _VALUED.items() for flag in flags}
_SWITCH_BY_FLAG = {flag: spec for flags, spec in _SWITCHES.items() for flag in flags}
_OTHER_VALUED = {"-ot", "--override-tensor", "-ncmoe", "--n-cpu-moe", "-ncffn", "--n-cpu-ffn",
                 "-mmdev", "--mmproj-device"}


def parse_server_args(argv: Sequence[str]) -> ServerArgs:
    """The memory-relevant settings in a llama-server argv (program name optional)."""
    fields: dict[str, object] = {}
    overrides: list[TensorOverride] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        name, eq, inline = word.partition("=") if word.startswith("-") else (word, "", "")
        spec = _VALUED_BY_FLAG.get(name)
        takes_value = spec is not None or name in _OTHER_VALUED
        value = None
        if takes_value:
            if eq:
                value = inline
            elif i < len(argv):
                value = argv[i]
                i += 1
            else:
                raise ServerArgsError(f"{name}: expects a value")
        if spec is not None:
            field, read = spec
            fields[field] = read(value)
        elif name in _SWITCH_BY_FLAG:
            field, setting = _SWITCH_BY_FLAG[name]
            fields[field] = setting
        elif name in ("-ot", "--override-tensor"):
            overrides += _parse_overrides(value)
        elif name in ("-cmoe", "--cpu-moe"):
            overrides.append(TensorOverride(FFN_EXPS_REGEX, "CPU"))
        elif name in ("-ncmoe", "--n-cpu-moe"):
            overrides += _n_cpu_overrides(value, "--n-cpu-moe", FFN_EXPS_REGEX)
        elif name in ("-ncffn", "--n-cpu-ffn"):
            overrides += _n_cpu_overrides(value, "--n-cpu-ffn", FFN_DENSE_REGEX)
        elif name in ("--rerank", "--reranking"):
            fields["embedding"] = True
            fields["pooling"] = "rank"
        elif name in ("-mmdev", "--mmproj-device"):
            if value == "none":
                fields["mmproj_offload"] = False
    return ServerArgs(overrides=tuple(overrides), **fields)  # type: ignore[arg-type]
