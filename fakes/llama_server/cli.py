"""The command line: llama-server's flags (unknown ones ignored) and ours -> Config; the stderr log."""

from __future__ import annotations

import argparse
import enum
import re
import sys
from collections.abc import Sequence

import attrs

from fakes.http11 import ConnectionPolicy
from fakes.llama_server.placement import PlacementFlags, SplitMode, parse_devices, parse_tensor_split
from supervisor.units import parse_duration, parse_size

N_CTX_TRAIN = 131072          # the fake model's training context; caps the slot context
AUTO_SLOTS = 4                # what --parallel -1 ("auto") means in llama-server


class Pooling(enum.Enum):
    """llama-server's ``--pooling``: how an embedding model pools; RANK scores (query, document) pairs."""

    NONE = "none"
    MEAN = "mean"
    CLS = "cls"
    LAST = "last"
    RANK = "rank"


@attrs.frozen
class Config:
    host: str
    port: int
    model_id: str
    model_path: str
    n_slots: int
    slot_n_ctx: int
    embeddings: bool              # --embeddings or --reranking: an encoder model, it cannot generate
    metrics: bool
    slots_endpoint: bool
    api_key: str | None
    sse_ping_interval: float
    verbose: bool
    log_disabled: bool
    load_time: float
    memory: int
    tokens_per_second: float
    sim_gpu: str | None
    keepalive_max: int
    keepalive_timeout: float
    embedding_dim: int
    fail_load: str | None
    max_tokens_default: int
    placement: PlacementFlags = PlacementFlags()  # where --memory goes on several simulated GPUs
    pooling: Pooling | None = None  # --pooling (--reranking: RANK); None: the model's own
    mmproj: str | None = None       # --mmproj: a multimodal projector (never read: the fake "hears" uploads)
    slot_save_path: str | None = None  # --slot-save-path: POST /slots/{id}?action=save|restore (slot_files.py)
    slot_delay: float = 0.0         # --fake-slot-delay: each slot action takes this long
    slot_fail: bool = False         # --fake-slot-fail: each slot action fails (500)

    @property
    def reranks(self) -> bool:
        """/rerank is served only by an embedding server that pools by rank (``--reranking``)."""
        return self.embeddings and self.pooling is Pooling.RANK

    @property
    def hears_audio(self) -> bool:
        return self.mmproj is not None

    @property
    def token_interval(self) -> float:
        return 1.0 / self.tokens_per_second if self.tokens_per_second > 0 else 0.0

    @property
    def connection_policy(self) -> ConnectionPolicy:
        """cpp-httplib's habits: "Keep-Alive: timeout=, max=", no reuse after an error."""
        return ConnectionPolicy(server=b"llama.cpp", idle_timeout=self.keepalive_timeout,
                                max_requests=self.keepalive_max, close_after_error=True, keep_alive_header=True)


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: a real flag such as --mem... must never be taken for one of ours.
    p = argparse.ArgumentParser(prog="python -m fakes.llama_server", allow_abbrev=False,
                                description="Fake llama-server. Unknown flags are ignored.")
    g = p.add_argument_group("llama-server flags")
    g.add_argument("-m", "--model", default=None)
    g.add_argument("-a", "--alias", default=None)
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, required=True)
    g.add_argument("-np", "--parallel", type=int, default=-1)
    g.add_argument("-c", "--ctx-size", type=int, default=4096)
    g.add_argument("--embedding", "--embeddings", dest="embeddings", action="store_true")
    g.add_argument("--rerank", "--reranking", dest="reranking", action="store_true",
                   help="embeddings with rank pooling: serve /rerank")
    g.add_argument("--pooling", choices=[pooling.value for pooling in Pooling], default=None)
    g.add_argument("-mm", "--mmproj", "-mmu", "--mmproj-url", dest="mmproj", default=None,
                   help="a multimodal projector: the fake then transcribes uploads")
    g.add_argument("--metrics", action="store_true")
    g.add_argument("--slots", dest="slots", action="store_true", default=True)
    g.add_argument("--no-slots", dest="slots", action="store_false")
    g.add_argument("-kvu", "--kv-unified", dest="kv_unified", action="store_true", default=None)
    g.add_argument("-no-kvu", "--no-kv-unified", dest="kv_unified", action="store_false")
    g.add_argument("--api-key", default=None)
    g.add_argument("--sse-ping-interval", type=float, default=30.0)
    g.add_argument("-v", "--verbose", "--log-verbose", dest="verbose", action="store_true")
    g.add_argument("--log-disable", action="store_true")
    g.add_argument("-dev", "--device", type=parse_devices, default=None)
    g.add_argument("-sm", "--split-mode", choices=[mode.value for mode in SplitMode], default=SplitMode.LAYER.value)
    g.add_argument("-ts", "--tensor-split", type=parse_tensor_split, default=())
    g.add_argument("-mg", "--main-gpu", type=int, default=0)
    g.add_argument("--slot-save-path", default=None)
    for flags in (("-ngl", "--gpu-layers", "--n-gpu-layers"), ("-t", "--threads"),
                  ("-tb", "--threads-batch"), ("-b", "--batch-size"), ("-ub", "--ubatch-size"),
                  ("--threads-http",), ("-to", "--timeout")):
        g.add_argument(*flags, nargs="?", help=argparse.SUPPRESS)  # accepted, ignored
    f = p.add_argument_group("fake-only flags")
    f.add_argument("--load-time", type=parse_duration, default=0.0, help="time to 'load' the model")
    f.add_argument("--memory", type=parse_size, default=0, help="bytes held on the simulated GPU")
    f.add_argument("--tokens-per-second", type=float, default=40.0, help="per request; <= 0: instant")
    f.add_argument("--sim-gpu", default=None, metavar="DIR", help="fakes.simgpu device to register with")
    f.add_argument("--keepalive-max", type=int, default=5, help="requests per connection")
    f.add_argument("--keepalive-timeout", type=parse_duration, default=5.0, help="idle close")
    f.add_argument("--embedding-dim", type=int, default=16)
    f.add_argument("--fail-load", default=None, metavar="MESSAGE", help="fail loading, exit 1")
    f.add_argument("--max-tokens-default", type=int, default=16)
    f.add_argument("--fake-slot-delay", type=parse_duration, default=0.0, help="each slot save/restore takes this long")
    f.add_argument("--fake-slot-fail", action="store_true", help="each slot save/restore answers 500")
    return p


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def shield_short_flags(argv: Sequence[str], known: set[str]) -> list[str]:
    """Rename llama.cpp's multi-letter single-dash flags that we do not know.

    argparse would read ``-md draft.gguf`` as ``-m d`` and ``-ctk q8_0`` as ``-c tk``;
    renamed to a long form they become plain unknown flags that parse_known_args drops.
    """
    out = []
    for arg in argv:
        if (arg.startswith("-") and not arg.startswith("--") and len(arg) > 2 and arg not in known
                and "=" not in arg and not _NEGATIVE_NUMBER.match(arg)):
            arg = "--ignored-short" + arg
        out.append(arg)
    return out


def parse_config(argv: Sequence[str] | None = None) -> Config:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args, _unknown = parser.parse_known_args(shield_short_flags(argv, _option_strings(parser)))
    if args.parallel <= 0:
        n_slots, unified = AUTO_SLOTS, args.kv_unified is not False
    else:
        n_slots, unified = args.parallel, bool(args.kv_unified)
    ctx_size = args.ctx_size if args.ctx_size > 0 else N_CTX_TRAIN
    slot_n_ctx = min(ctx_size if unified else ctx_size // n_slots, N_CTX_TRAIN)
    return Config(
        host=args.host, port=args.port,
        model_id=args.alias or args.model or "fake-model", model_path=args.model or "fake-model.gguf",
        n_slots=n_slots, slot_n_ctx=slot_n_ctx, embeddings=args.embeddings or args.reranking, metrics=args.metrics,
        slots_endpoint=args.slots, api_key=args.api_key, sse_ping_interval=args.sse_ping_interval,
        verbose=args.verbose, log_disabled=args.log_disable, load_time=args.load_time,
        memory=args.memory, tokens_per_second=args.tokens_per_second, sim_gpu=args.sim_gpu,
        keepalive_max=max(1, args.keepalive_max), keepalive_timeout=args.keepalive_timeout,
        embedding_dim=max(1, args.embedding_dim), fail_load=args.fail_load,
        max_tokens_default=args.max_tokens_default,
        placement=PlacementFlags(args.device, SplitMode(args.split_mode), args.tensor_split, args.main_gpu),
        pooling=Pooling.RANK if args.reranking else Pooling(args.pooling) if args.pooling else None,
        mmproj=args.mmproj, slot_save_path=args.slot_save_path, slot_delay=args.fake_slot_delay,
        slot_fail=args.fake_slot_fail,
    )


@attrs.define
class Log:
    """llama.cpp-style lines on stderr, flushed at once (steward and tests read them live)."""

    enabled: bool = True

    def __call__(self, line: str) -> None:
        if self.enabled:
            try:
                sys.stderr.write(line + "\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass  # nobody reads our stderr any more; keep serving
