"""``steward demo``: the whole system on a simulated 16 GiB GPU with fake engines.

Needs no GPU, no model files and no config: four fake llama-servers shaped like the
GridCore article's models (research: seeds/gridcore-article.md) behind one gateway.
``--real``: the same four names on real llama-server engines (CPU) with tiny models
written on the fly; their memory is estimated, then measured.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from fakes import simgpu
from supervisor.config import Config, parse_config

GIB = 1024**3
DEMO_GPU_BYTES = 16 * GIB

# name: (memory, fake flags, extra config)
DEMO_MODELS: dict[str, dict[str, object]] = {
    "gemma4-12b": {"memory": "8.3GiB", "parallel": 2, "aliases": ["gpt-4o"],
                   "fake": ["--load-time", "2s", "--tokens-per-second", "40", "--ctx-size", "8192"]},
    "gemma4-e4b": {"memory": "4.0GiB", "parallel": 2, "aliases": ["gpt-4o-mini"],
                   "fake": ["--load-time", "1s", "--tokens-per-second", "80", "--ctx-size", "8192"]},
    "gemma4-e2b": {"memory": "2.8GiB", "parallel": 2,
                   "fake": ["--load-time", "0.7s", "--tokens-per-second", "120", "--ctx-size", "8192"]},
    "nomic-embed": {"memory": "0.4GiB", "parallel": 4, "pinned": True, "aliases": ["text-embedding-3-small"],
                    "fake": ["--load-time", "0.3s", "--embeddings", "--embedding-dim", "64", "--ctx-size", "8192"]},
}


def demo_config(workdir: Path, port: int) -> Config:
    return parse_config(demo_config_dict(workdir, port))


def demo_config_dict(workdir: Path, port: int) -> dict[str, object]:
    """The demo's config as it would be written in YAML; makes the simulated GPU too."""
    gpu_dir = workdir / "gpu"
    simgpu.create_device(gpu_dir, total_bytes=DEMO_GPU_BYTES, name="Simulated RTX 4060 Ti 16GB")
    models = {}
    for name, spec in DEMO_MODELS.items():
        memory = str(spec["memory"])
        models[name] = {
            "command": [sys.executable, "-m", "fakes.llama_server"],
            "model": f"/models/{name}.gguf",
            "memory": memory,
            "parallel": spec["parallel"],
            "aliases": spec.get("aliases", []),
            "pinned": spec.get("pinned", False),
            "args": ["--alias", name, "--memory", memory, "--sim-gpu", str(gpu_dir), *spec["fake"]],  # type: ignore[misc]
        }
    return {
        "listen": f"127.0.0.1:{port}",
        "models": models,
        "gpu": {"probe": "simulated", "simulated_dir": str(gpu_dir), "poll_interval": "1s"},
        "engines": {"stop_grace": "3s", "restart_backoff": "0.5s"},
        "log": {"file": str(workdir / "events.jsonl")},
        "state_file": str(workdir / "state.json"),
    }


# name: (tiny architecture, writer overrides, engine args); same names as the fake demo.
REAL_MODELS: dict[str, tuple[str, dict[str, object], list[str]]] = {
    "gemma4-12b": ("llama", {"n_layer": 4, "n_embd": 256, "n_head": 8, "n_head_kv": 2}, ["-c", "4096"]),
    "gemma4-e4b": ("qwen3moe", {}, ["-c", "4096"]),
    "gemma4-e2b": ("gemma3", {}, ["-c", "4096"]),
    "nomic-embed": ("bert", {}, ["-c", "2048", "--embeddings"]),
}
REAL_BUDGET = "1GiB"


class RealEnginesUnavailable(Exception):
    pass


def real_demo_config_dict(workdir: Path, port: int) -> dict[str, object]:
    """Real llama-server engines on this host's CPU, with tiny models written into *workdir*."""
    from fakes.llama_binary import llama_server_path
    from fakes.tiny_gguf import write_tiny_model

    try:
        binary = str(llama_server_path())
    except FileNotFoundError as exc:
        raise RealEnginesUnavailable(str(exc)) from None
    models_dir = workdir / "models"
    models_dir.mkdir(parents=True, exist_ok=True)
    models = {}
    for name, (arch, overrides, args) in REAL_MODELS.items():
        written = write_tiny_model(models_dir / f"{name}.gguf", arch, **overrides)
        fake = DEMO_MODELS[name]
        models[name] = {"command": binary, "model": str(written.path), "parallel": fake["parallel"],
                        "aliases": fake.get("aliases", []), "pinned": fake.get("pinned", False),
                        "args": [*args, "--threads", "1"]}
    return {
        "listen": f"127.0.0.1:{port}",
        "models": models,
        "gpu": {"probe": "host", "budget": REAL_BUDGET, "poll_interval": "0.5s"},
        "engines": {"stop_grace": "3s", "restart_backoff": "0.5s"},
        "log": {"file": str(workdir / "events.jsonl")},
        "state_file": str(workdir / "state.json"),
    }


def make_workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="steward-demo-"))


def banner(url: str, workdir: Path, *, real: bool = False) -> str:
    kind = ("real llama-server engines on this CPU, tiny models" if real
            else "a simulated 16 GiB GPU, fake llama-servers")
    base = f"{url}/v1"
    return f"""
gpu-steward demo: four engines behind one front door ({kind}).

  OpenAI base URL   {base}
  event log         {workdir / 'events.jsonl'}   (tail -f it, or pipe through jq)

Try:
  curl -s {base}/models | python3 -m json.tool
  curl -s {base}/chat/completions -H 'content-type: application/json' \\
       -d '{{"model": "gpt-4o", "messages": [{{"role": "user", "content": "hello"}}]}}'
  curl -sN {base}/chat/completions -H 'content-type: application/json' \\
       -d '{{"model": "gemma4-e4b@background", "stream": true, "messages": [{{"role": "user", "content": "hi"}}]}}'
  curl -s {base}/embeddings -H 'content-type: application/json' \\
       -d '{{"model": "nomic-embed", "input": ["one", "two"]}}'
  curl -s {url}/healthz | python3 -m json.tool

  OPENAI_BASE_URL={base} OPENAI_API_KEY=none python3 your_agent.py

Ctrl-C stops it (requests in flight finish first).
"""
