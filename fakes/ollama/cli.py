"""The command line -> Config: the models on offer (``--model SPEC``), the scheduler knobs, the log."""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Sequence

import attrs

from fakes.http11 import ConnectionPolicy
from fakes.ollama.gotime import FOREVER, parse_go_duration
from supervisor.units import parse_duration, parse_size

DEFAULT_PORT = 11434
VERSION = "0.12.6"


def full_name(name: str) -> str:
    """``gemma3`` -> ``gemma3:latest``, as Ollama names a model without a tag."""
    return name if ":" in name.rsplit("/", 1)[-1] else name + ":latest"


@attrs.frozen
class ModelSpec:
    """One model the fake "has pulled"."""

    name: str                      # with its tag: "gemma3:4b", "nomic-embed-text:latest"
    size: int                      # bytes on the GPU once loaded (weights + KV + graph)
    load_time: float = 0.5
    tokens_per_second: float = 50.0
    embedding_only: bool = False
    embedding_dim: int = 16
    context_length: int = 4096
    family: str = ""
    parameter_size: str = ""
    quantization: str = ""

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.name.encode()).hexdigest()

    @property
    def token_interval(self) -> float:
        return 1.0 / self.tokens_per_second if self.tokens_per_second > 0 else 0.0

    @property
    def capabilities(self) -> list[str]:
        return ["embedding"] if self.embedding_only else ["completion"]

    def details(self) -> dict[str, object]:
        family = self.family or ("nomic-bert" if self.embedding_only else "llama")
        return {"parent_model": "", "format": "gguf", "family": family, "families": [family],
                "parameter_size": self.parameter_size or f"{self.size / 0.6e9:.1f}B",
                "quantization_level": self.quantization or ("F16" if self.embedding_only else "Q4_K_M")}


_SPEC_KEYS = {"size", "load", "tps", "embed", "dim", "ctx", "family", "params", "quant"}


def parse_model_spec(text: str) -> ModelSpec:
    """``gemma3:4b,size=4GiB,load=1s,tps=50`` or ``nomic-embed-text,size=0.3GiB,embed``."""
    name, *items = [part.strip() for part in text.split(",")]
    if not name:
        raise argparse.ArgumentTypeError(f"model spec {text!r}: the name comes first")
    fields: dict[str, str] = {}
    for item in items:
        key, _, value = item.partition("=")
        if key not in _SPEC_KEYS:
            raise argparse.ArgumentTypeError(f"model spec {text!r}: unknown key {key!r} "
                                             f"(known: {', '.join(sorted(_SPEC_KEYS))})")
        fields[key] = value
    try:
        return ModelSpec(
            name=full_name(name), size=parse_size(fields.get("size", "1GiB")),
            load_time=parse_duration(fields.get("load", "0.5s")),
            tokens_per_second=float(fields.get("tps", 50)), embedding_only="embed" in fields,
            embedding_dim=int(fields.get("dim", 16)), context_length=int(fields.get("ctx", 4096)),
            family=fields.get("family", ""), parameter_size=fields.get("params", ""),
            quantization=fields.get("quant", ""))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"model spec {text!r}: {exc}") from None


def _keep_alive(text: str) -> float:
    try:
        return parse_go_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@attrs.frozen
class Config:
    host: str
    port: int
    models: tuple[ModelSpec, ...]
    sim_gpu: str | None = None
    keep_alive: float = 300.0          # OLLAMA_KEEP_ALIVE; FOREVER for a negative value
    unload_lag: float = 0.5            # unload -> gone from /api/ps and memory freed
    max_queue: int = 512               # OLLAMA_MAX_QUEUE
    num_parallel: int = 1              # OLLAMA_NUM_PARALLEL (embedding-only models: always 1)
    max_loaded_models: int = 0         # OLLAMA_MAX_LOADED_MODELS; 0 = no limit
    num_predict: int = 8               # tokens of an answer that sets no num_predict/max_tokens
    version: str = VERSION
    verbose: bool = False

    def find(self, name: str) -> ModelSpec | None:
        wanted = full_name(name)
        return next((m for m in self.models if m.name == wanted), None)

    @property
    def connection_policy(self) -> ConnectionPolicy:
        """Go net/http as Ollama runs it: no Server header, no idle timeout of its own."""
        return ConnectionPolicy(server=b"", idle_timeout=3600.0)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fakes.ollama", allow_abbrev=False, description="Fake Ollama server.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--model", dest="models", action="append", type=parse_model_spec, default=[],
                   metavar="SPEC", help="NAME[,size=4GiB][,load=1s][,tps=50][,embed][,dim=16][,ctx=4096]"
                                        "[,family=][,params=][,quant=]; repeat for more")
    p.add_argument("--models", dest="more_models", nargs="+", type=parse_model_spec, default=[], metavar="SPEC")
    p.add_argument("--sim-gpu", default=None, metavar="DIR", help="fakes.simgpu device to register with")
    p.add_argument("--keep-alive", type=_keep_alive, default=300.0, help="default keep_alive (Go duration)")
    p.add_argument("--unload-lag", type=parse_duration, default=0.5,
                   help="how long an unloading model stays in /api/ps (and holds its memory)")
    p.add_argument("--max-queue", type=int, default=512, help="waiting requests beyond this get 503")
    p.add_argument("--num-parallel", type=int, default=1, help="requests one model serves at once")
    p.add_argument("--max-loaded-models", type=int, default=0, help="0: no limit")
    p.add_argument("--num-predict", type=int, default=8, help="tokens of an answer without a limit")
    p.add_argument("--version-string", default=VERSION)
    p.add_argument("-v", "--verbose", action="store_true", help="one stderr line per request")
    return p


def parse_config(argv: Sequence[str] | None = None) -> Config:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    models = tuple(args.models) + tuple(args.more_models)
    return Config(host=args.host, port=args.port, models=models, sim_gpu=args.sim_gpu, keep_alive=args.keep_alive,
                  unload_lag=args.unload_lag, max_queue=max(0, args.max_queue),
                  num_parallel=max(1, args.num_parallel), max_loaded_models=max(0, args.max_loaded_models),
                  num_predict=max(0, args.num_predict), version=args.version_string, verbose=args.verbose)


__all__ = ["FOREVER", "Config", "ModelSpec", "full_name", "parse_config", "parse_model_spec"]
