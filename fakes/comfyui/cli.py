"""The command line: ComfyUI's flags that matter here (others ignored) and ours -> Config."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import attrs

from fakes.http11 import ConnectionPolicy
from supervisor.units import parse_duration, parse_size

DEFAULT_PORT = 8188
VERSION = "0.3.64"


@attrs.frozen
class Config:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    sim_gpu: str | None = None
    vram: int = 16 * 1024**3            # the device size when there is no simulated GPU
    job_time: float = 2.0
    model_memory: int = 6 * 1024**3     # held from the first job until /free
    load_time: float = 0.0              # loading the models at the first job
    free_delay: float = 0.5             # /free -> memory dropped this much later
    steps: int = 4                      # progress max of a sampler without a "steps" input
    disable_smart_memory: bool = False  # unload after every prompt
    cors_origin: str | None = None      # --enable-cors-header: no Origin check, CORS headers
    verbose: bool = False

    @property
    def connection_policy(self) -> ConnectionPolicy:
        """aiohttp's habits: its Server header, keep-alive closed after 75 s idle."""
        return ConnectionPolicy(server=b"Python/3.12 aiohttp/3.12.15", idle_timeout=75.0)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fakes.comfyui", allow_abbrev=False,
                                description="Fake ComfyUI server. Unknown flags are ignored.")
    g = p.add_argument_group("ComfyUI flags")
    g.add_argument("--listen", "--host", dest="host", nargs="?", const="0.0.0.0", default="127.0.0.1")
    g.add_argument("--port", type=int, default=DEFAULT_PORT)
    g.add_argument("--enable-cors-header", dest="cors_origin", nargs="?", const="*", default=None)
    g.add_argument("--disable-smart-memory", action="store_true")
    g.add_argument("-v", "--verbose", nargs="?", const="DEBUG", default=None, help="one stderr line per request")
    f = p.add_argument_group("fake-only flags")
    f.add_argument("--sim-gpu", default=None, metavar="DIR", help="fakes.simgpu device to register with")
    f.add_argument("--vram", type=parse_size, default=16 * 1024**3, help="device size without --sim-gpu")
    f.add_argument("--job-time", type=parse_duration, default=2.0, help="per prompt; a node input "
                                                                         "fake_seconds overrides it")
    f.add_argument("--model-memory", type=parse_size, default=6 * 1024**3, help="held from a job until /free")
    f.add_argument("--load-time", type=parse_duration, default=0.0, help="model load at the first job")
    f.add_argument("--free-delay", type=parse_duration, default=0.5, help="/free -> memory dropped")
    f.add_argument("--steps", type=int, default=4, help="progress steps of a sampler without 'steps'")
    return p


def parse_config(argv: Sequence[str] | None = None) -> Config:
    args, _unknown = build_parser().parse_known_args(list(sys.argv[1:] if argv is None else argv))
    host = "0.0.0.0" if args.host == "0.0.0.0,::" else args.host.split(",")[0]
    return Config(host=host, port=args.port, sim_gpu=args.sim_gpu, vram=args.vram, job_time=args.job_time,
                  model_memory=args.model_memory, load_time=args.load_time, free_delay=args.free_delay,
                  steps=max(1, args.steps), disable_smart_memory=args.disable_smart_memory,
                  cors_origin=args.cors_origin, verbose=args.verbose is not None)
