"""The command line: vLLM's flags that matter here (unknown ones ignored) and ours -> Config; the log."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Sequence

import attrs

from fakes.http11 import ConnectionPolicy
from supervisor.units import parse_duration, parse_size

VERSION = "0.32.0"
DEFAULT_MODEL = "Qwen/Qwen3-0.6B"   # vLLM's default --model (the fake: unless a served name is given)
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
SLEEP_MEMORY_SHARE = 0.05           # CUDA context and friends stay on the device while asleep


@attrs.frozen
class Config:
    host: str
    port: int
    model: str
    served_model_names: tuple[str, ...]  # the first is the one answers and metrics carry
    max_num_seqs: int
    max_model_len: int
    block_size: int                      # tokens per KV block (vLLM's --block-size)
    num_gpu_blocks: int                  # the KV cache's blocks: --num-gpu-blocks-override, else max_num_seqs sequences
    api_key: str | None
    ssl_certfile: str | None             # uvicorn's: serve HTTPS with this certificate (and ssl_keyfile)
    ssl_keyfile: str | None
    anthropic_key: bool                  # --api-key is checked in x-api-key, as Anthropic's API does
    dev_mode: bool                       # VLLM_SERVER_DEV_MODE=1: /sleep, /wake_up, /is_sleeping
    access_log: bool
    tokens_per_second: float
    default_max_tokens: int
    start_delay: float
    memory: int                          # awake: weights + KV cache + sleep_memory
    kv_cache_memory: int
    sleep_memory: int                    # what stays registered while asleep
    sim_gpu: str | None                  # --simulated-dir (run_fake unregisters it on exit)
    memory_in_child: bool
    wake_delay: float
    fail_health_after: int | None
    crash_after_requests: int | None
    hang_after_requests: int | None
    wake_fails: bool

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    @property
    def weights_memory(self) -> int:
        return self.memory - self.kv_cache_memory - self.sleep_memory

    @property
    def token_interval(self) -> float:
        return 1.0 / self.tokens_per_second if self.tokens_per_second > 0 else 0.0

    @property
    def connection_policy(self) -> ConnectionPolicy:
        """uvicorn's habits: its Server header, keep-alive closed after 5 s idle (vLLM's default)."""
        return ConnectionPolicy(server=b"uvicorn", idle_timeout=5.0)


def human_int(value: str) -> int:
    """vLLM's ``human_readable_int``: ``2k`` is 2000, ``2K`` is 2048."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgKMG]?)", value.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}")
    number, unit = float(match.group(1)), match.group(2)
    scale = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}[unit]
    return int(number * scale)


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: a real vLLM flag such as --mem... must never be taken for one of ours.
    p = argparse.ArgumentParser(prog="python -m fakes.openai_server", allow_abbrev=False,
                                description="Fake vLLM OpenAI-compatible server. Unknown flags are ignored.")
    g = p.add_argument_group("vLLM flags")
    g.add_argument("--model", default=None)
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--served-model-name", nargs="+", default=None)
    g.add_argument("--max-num-seqs", type=int, default=256)
    g.add_argument("--max-model-len", type=human_int, default=2048)
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--num-gpu-blocks-override", type=int, default=None,
                   help="the KV cache's size in blocks (default: room for --max-num-seqs sequences of --max-model-len)")
    g.add_argument("--api-key", default=None)
    g.add_argument("--ssl-certfile", default=None)
    g.add_argument("--ssl-keyfile", default=None)
    g.add_argument("--kv-cache-memory-bytes", type=parse_size, default=None,
                   help="the KV cache share of --memory (default: half of what sleep does not keep)")
    g.add_argument("--disable-uvicorn-access-log", action="store_true")
    for flag in ("--enforce-eager", "--enable-sleep-mode", "--trust-remote-code", "--enable-prefix-caching",
                 "--disable-log-requests", "--disable-log-stats", "--enable-log-requests"):
        g.add_argument(flag, action="store_true", help=argparse.SUPPRESS)  # accepted, ignored
    f = p.add_argument_group("fake-only flags")
    f.add_argument("--tokens-per-second", type=float, default=200.0, help="per request; <= 0: instant")
    f.add_argument("--default-max-tokens", type=int, default=16, help="max_tokens when a request has none")
    f.add_argument("--start-delay", type=parse_duration, default=0.0, help="engine start; nothing listens")
    f.add_argument("--memory", type=parse_size, default=0, help="bytes held on the simulated GPU awake")
    f.add_argument("--sleep-memory", type=parse_size, default=None, help="held asleep (default 5%% of --memory)")
    f.add_argument("--simulated-dir", "--sim-gpu", dest="sim_gpu", default=None, metavar="DIR",
                   help="fakes.simgpu device to register with")
    f.add_argument("--memory-in-child", action="store_true", help="an engine-core child holds the memory")
    f.add_argument("--wake-delay", type=parse_duration, default=0.2)
    f.add_argument("--fail-health-after", type=int, default=None, metavar="N", help="then /health is 500")
    f.add_argument("--crash-after-requests", type=int, default=None, metavar="N", help="then exit 1")
    f.add_argument("--hang-after-requests", type=int, default=None, metavar="N", help="then answer nothing")
    f.add_argument("--anthropic-key", action="store_true",
                   help="check --api-key in x-api-key (Anthropic's header), not Authorization: Bearer")
    f.add_argument("--wake-fails", action="store_true", help="/wake_up answers 500 and stays asleep")
    return p


def normalize_flags(argv: Sequence[str]) -> list[str]:
    """vLLM's FlexibleArgumentParser takes ``--max_model_len`` for ``--max-model-len``."""
    out = []
    for arg in argv:
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            arg = name.replace("_", "-") + eq + value
        out.append(arg)
    return out


def parse_config(argv: Sequence[str] | None = None, environ: dict[str, str] | None = None) -> Config:
    argv = normalize_flags(list(sys.argv[1:] if argv is None else argv))
    environ = dict(os.environ) if environ is None else environ
    # `vllm serve MODEL ...`: a leading positional is the model (no positional in the parser,
    # so the value of an unknown flag is never taken for one).
    positional = argv.pop(0) if argv and not argv[0].startswith("-") else None
    args, _unknown = build_parser().parse_known_args(argv)
    # The model is the cards' "root"; a fake given only a served name has that as its root too.
    model = args.model or positional or (args.served_model_name or [DEFAULT_MODEL])[0]
    memory = args.memory
    sleep_memory = min(memory, int(memory * SLEEP_MEMORY_SHARE) if args.sleep_memory is None else args.sleep_memory)
    kv = (memory - sleep_memory) // 2 if args.kv_cache_memory_bytes is None else args.kv_cache_memory_bytes
    max_num_seqs, max_model_len = max(1, args.max_num_seqs), max(1, args.max_model_len)
    block_size = max(1, args.block_size)
    return Config(
        host=args.host, port=args.port, model=model,
        served_model_names=tuple(args.served_model_name or [model]),
        max_num_seqs=max_num_seqs, max_model_len=max_model_len, block_size=block_size,
        num_gpu_blocks=max(1, args.num_gpu_blocks_override or -(-max_num_seqs * max_model_len // block_size)),
        api_key=args.api_key,
        ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile, anthropic_key=args.anthropic_key,
        dev_mode=environ.get(DEV_MODE_ENV, "0") not in ("", "0", "false", "False"),
        access_log=not args.disable_uvicorn_access_log, tokens_per_second=args.tokens_per_second,
        default_max_tokens=max(1, args.default_max_tokens), start_delay=args.start_delay,
        memory=memory, kv_cache_memory=max(0, min(kv, memory - sleep_memory)), sleep_memory=sleep_memory,
        sim_gpu=args.sim_gpu, memory_in_child=args.memory_in_child, wake_delay=args.wake_delay,
        fail_health_after=args.fail_health_after, crash_after_requests=args.crash_after_requests,
        hang_after_requests=args.hang_after_requests, wake_fails=args.wake_fails,
    )


@attrs.define
class Log:
    """vLLM's and uvicorn's lines on stderr, flushed at once (steward and tests read them live)."""

    def write(self, line: str) -> None:
        try:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass  # nobody reads our stderr any more; keep serving

    def vllm(self, where: str, message: str, level: str = "INFO") -> None:
        """``INFO 12-01 10:00:00 [api_server.py:1885] message``"""
        self.write(f"{level} {time.strftime('%m-%d %H:%M:%S')} [{where}] {message}")

    def uvicorn(self, message: str, level: str = "INFO") -> None:
        """``INFO:     message`` (the level padded to nine columns, as uvicorn does)."""
        self.write(f"{level + ':':<9} {message}")
