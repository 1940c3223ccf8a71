"""``steward demo``: the whole system on a simulated 16 GiB GPU with fake engines.

Needs no GPU, no model files and no config: four fake llama-servers shaped like the
GridCore article's models (research: seeds/gridcore-article.md) and one always-on fake
vLLM behind one gateway and one queue, and a fake Ollama and a fake ComfyUI on the same
GPU; ``sketch`` is an image model (a ComfyUI workflow) for ``/v1/images/generations``.
``--real``: the same four names on real llama-server engines (CPU). The three chat names
serve a real instruct model, SmolLM2-135M-Instruct (fakes/real_model.py, fetched once into
the cache), each slot at its trained context (8,192 tokens: less than the 16k an agent
would like, and the banner says so); the embedder is a tiny model of random weights written
on the fly (another architecture: a BERT). Their memory is estimated, then measured. Each
is served under its name (``--alias``), so answers say ``gemma4-12b``, not the path of a GGUF.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from fakes import simgpu
from supervisor.config import Config, parse_config

GIB = 1024**3
DEMO_GPU_BYTES = 16 * GIB
SHARED_MODEL = "qwen3-4b-shared"  # the demo's always-on engine (runtime openai)
IMAGE_MODEL = "sketch"  # the demo's image model: a text-to-image workflow run by the fake ComfyUI
SPEECH_MODEL = "kokoro"  # the demo's speech model: a fake Kokoro-FastAPI (POST /v1/audio/speech)
SPEECH_VOICES = ["af_heart", "af_bella", "am_adam", "bm_george", "alloy", "nova"]  # Kokoro's, and OpenAI's names
# Shaped as ComfyUI's default text-to-image workflow, exported with "Export (API)".
DEMO_WORKFLOW = {
    "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "fake.safetensors"}},
    "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "{{prompt}}", "clip": ["4", 1]}},
    "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "{{negative_prompt}}", "clip": ["4", 1]}},
    "5": {"class_type": "EmptyLatentImage", "inputs": {"width": "{{width}}", "height": "{{height}}", "batch_size": 1}},
    "3": {"class_type": "KSampler", "inputs": {"seed": "{{seed}}", "steps": "{{steps}}", "cfg": 7.0,
                                               "sampler_name": "euler", "scheduler": "normal", "denoise": 1.0,
                                               "model": ["4", 0], "positive": ["6", 0], "negative": ["7", 0],
                                               "latent_image": ["5", 0]}},
    "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
    "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "steward"}},
}
VIDEO_MODEL = "clip"  # the demo's video model: an animation workflow run by the fake ComfyUI (/v1/videos)
# EmptyImage's batch of frames into an animated WEBP (the fake writes it with Pillow, as ComfyUI does).
DEMO_VIDEO_WORKFLOW = {
    "1": {"class_type": "EmptyImage", "inputs": {"width": "{{width}}", "height": "{{height}}",
                                                 "batch_size": "{{frames}}", "color": 0x2050A0}},
    "2": {"class_type": "SaveAnimatedWEBP", "inputs": {"images": ["1", 0], "filename_prefix": "steward/clip",
                                                       "fps": "{{fps}}"}},
    "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "{{prompt}}"}},  # a real one would condition a model
}

# A chat slot's context in both demos: SmolLM2-135M-Instruct's trained context, the most a slot
# of the real demo's chat engines can hold (llama-server caps a slot there).
CHAT_SLOT_CONTEXT = 8192
CHAT_SLOTS = 2
# name: (memory, slots, context, fake flags, extra config). The fake and the real demo give an engine
# the same context (-c, split between its slots: 8,192 tokens a slot for a chat model, 512 for the
# embedder), so a prompt the real engine refuses (400 exceed_context_size_error) the fake refuses too.
DEMO_MODELS: dict[str, dict[str, object]] = {
    "gemma4-12b": {"memory": "8.3GiB", "parallel": CHAT_SLOTS, "ctx": CHAT_SLOT_CONTEXT * CHAT_SLOTS,
                   "aliases": ["gpt-4o"], "fake": ["--load-time", "2s", "--tokens-per-second", "40"],
                   # Background and batch work that would have to evict a hot chat model goes to the
                   # smaller variant of the same family (scheduler rule 11).
                   "fallback": [{"model": "gemma4-e4b", "when": ["no_room"], "classes": ["background", "batch"]}]},
    "gemma4-e4b": {"memory": "4.0GiB", "parallel": CHAT_SLOTS, "ctx": CHAT_SLOT_CONTEXT * CHAT_SLOTS,
                   "aliases": ["gpt-4o-mini"], "fake": ["--load-time", "1s", "--tokens-per-second", "80"]},
    "gemma4-e2b": {"memory": "2.8GiB", "parallel": CHAT_SLOTS, "ctx": CHAT_SLOT_CONTEXT * CHAT_SLOTS,
                   "fake": ["--load-time", "0.7s", "--tokens-per-second", "120"]},
    "nomic-embed": {"memory": "0.4GiB", "parallel": 4, "ctx": 2048, "pinned": True,
                    "aliases": ["text-embedding-3-small"], "fake": ["--load-time", "0.3s", "--embeddings", "--embedding-dim", "64"]},
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
            "fallback": spec.get("fallback", []),
            "args": ["--alias", name, "--memory", memory, "--sim-gpu", str(gpu_dir), "--ctx-size", str(spec["ctx"]),
                     *spec["fake"]],  # type: ignore[misc]
        }
    # An always-on engine behind the same queue: a fake vLLM that the agents share (it batches
    # many requests in one KV pool), its memory held in a child process as vLLM's is.
    models[SHARED_MODEL] = {
        "runtime": "openai", "memory": "3GiB", "parallel": 16, "always_on": True, "aliases": ["agents"],
        "command": [sys.executable, "-m", "fakes.openai_server", "--port", "${PORT}", "--served-model-name",
                    SHARED_MODEL, "--memory", "3GiB", "--sim-gpu", str(gpu_dir), "--memory-in-child",
                    "--max-num-seqs", "64", "--tokens-per-second", "150"],
    }
    # A speech server, loaded when asked for like the llama-servers: its audio streamed as it is made.
    models[SPEECH_MODEL] = {
        "runtime": "openai", "memory": "0.5GiB", "parallel": 2, "serves": ["speech"], "aliases": ["tts-1"],
        "voices": SPEECH_VOICES,
        "command": [sys.executable, "-m", "fakes.speech_server", "--port", "${PORT}", "--memory", "0.5GiB",
                    "--sim-gpu", str(gpu_dir), "--real-time-factor", "10"],
    }
    workflow = workdir / "workflows" / f"{IMAGE_MODEL}.json"
    workflow.parent.mkdir(parents=True, exist_ok=True)
    workflow.write_text(json.dumps(DEMO_WORKFLOW, indent=2))
    models[IMAGE_MODEL] = {"runtime": "comfyui", "workflow": str(workflow), "size": "512x512",
                           "aliases": ["dall-e-3"]}
    video_workflow = workdir / "workflows" / f"{VIDEO_MODEL}.json"
    video_workflow.write_text(json.dumps(DEMO_VIDEO_WORKFLOW, indent=2))
    models[VIDEO_MODEL] = {"runtime": "comfyui", "workflow": str(video_workflow), "aliases": ["sora-2"],
                           "video": {"seconds": [4, 8], "sizes": ["720x1280", "1280x720"], "fps": 4}}
    ollama_port, comfy_port = _free_port(), _free_port()
    return {
        "listen": f"127.0.0.1:{port}",
        "models": models,
        "gpu": {"probe": "simulated", "simulated_dir": str(gpu_dir), "poll_interval": "1s"},
        "engines": {"stop_grace": "3s", "restart_backoff": "0.5s"},
        "log": {"file": str(workdir / "events.jsonl")},
        "state_file": str(workdir / "state.json"),
        "videos": {"dir": str(workdir / "videos")},
        "usage": {"db": str(workdir / "usage.db")},
        "auth": {"keys_file": str(workdir / "keys.json")},
        # A fake Ollama and a fake ComfyUI behind their own listeners, on the same GPU.
        "ollama": {"upstream": f"127.0.0.1:{ollama_port}", "listen": f"127.0.0.1:{_beside(port, 1)}",
                   "memory": "4GiB", "ps_poll": "1s",
                   "command": [sys.executable, "-m", "fakes.ollama", "--port", str(ollama_port),
                               "--sim-gpu", str(gpu_dir), "--model", "llama3.2:3b,size=3.5GiB,load=1s,tps=60",
                               "--model", "nomic-embed-text,size=0.3GiB,load=0.3s,embed"]},
        "comfyui": {"upstream": f"127.0.0.1:{comfy_port}", "listen": f"127.0.0.1:{_beside(port, 2)}",
                    "history_poll": "0.5s",
                    "command": [sys.executable, "-m", "fakes.comfyui", "--port", str(comfy_port),
                                "--sim-gpu", str(gpu_dir), "--model-memory", "6GiB", "--job-time", "3s",
                                "--free-delay", "0.5s"]},
    }


def _beside(port: int, offset: int) -> int:
    """The Ollama and ComfyUI listeners sit next to the OpenAI one (any free port with --port 0)."""
    return 0 if port == 0 else port + offset


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# The real demo's chat names serve SmolLM2-135M-Instruct; the other names, tiny models of random
# weights written on the fly, of the architecture the name needs: name -> (architecture, writer
# overrides, engine args). Same names (and contexts) as the fake demo.
REAL_CHAT_MODEL = "SmolLM2-135M-Instruct"
TINY_MODELS: dict[str, tuple[str, dict[str, object], list[str]]] = {
    "nomic-embed": ("bert", {}, ["--embeddings"]),
}
# Three chat engines of 8,192-token slots (their KV cache estimated whole) and the embedder fit at once.
REAL_BUDGET = "2GiB"


class RealEnginesUnavailable(Exception):
    pass


def real_demo_config_dict(workdir: Path, port: int) -> dict[str, object]:
    """Real llama-server engines on this host's CPU: SmolLM2 under the chat names, the tiny
    models written into *workdir* under the others."""
    from fakes.llama_binary import llama_server_path
    from fakes.real_model import smollm2_gguf
    from fakes.tiny_gguf import write_tiny_model

    try:
        binary = str(llama_server_path())
        chat_model = str(smollm2_gguf())
    except FileNotFoundError as exc:
        raise RealEnginesUnavailable(str(exc)) from None
    models_dir = workdir / "models"
    models_dir.mkdir(parents=True, exist_ok=True)
    models = {}
    for name, fake in DEMO_MODELS.items():
        if name in TINY_MODELS:
            arch, overrides, args = TINY_MODELS[name]
            model = str(write_tiny_model(models_dir / f"{name}.gguf", arch, **overrides).path)
        else:
            model, args = chat_model, []
        models[name] = {"command": binary, "model": model, "parallel": fake["parallel"],
                        "aliases": fake.get("aliases", []), "pinned": fake.get("pinned", False),
                        "fallback": fake.get("fallback", []), "args": ["-c", str(fake["ctx"]), *args, "--threads", "1", "--alias", name]}
    return {
        "listen": f"127.0.0.1:{port}",
        "models": models,
        "gpu": {"probe": "host", "budget": REAL_BUDGET, "poll_interval": "0.5s"},
        "engines": {"stop_grace": "3s", "restart_backoff": "0.5s"},
        "log": {"file": str(workdir / "events.jsonl")},
        "state_file": str(workdir / "state.json"),
        "videos": {"dir": str(workdir / "videos")},
        "usage": {"db": str(workdir / "usage.db")},
        "auth": {"keys_file": str(workdir / "keys.json")},
    }


@contextlib.contextmanager
def open_workdir(kind: str, *, keep: bool) -> Iterator[Path]:
    """A fresh folder for one run (a demo's, a loadtest's steward): removed at the end unless *keep*."""
    workdir = Path(tempfile.mkdtemp(prefix=f"steward-{kind}-"))
    try:
        yield workdir
    finally:
        if keep:
            print(f"steward: {kind} folder kept: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def banner(url: str, workdir: Path, *, real: bool = False, keep: bool = False, ollama: str | None = None,
           comfyui: str | None = None) -> str:
    kind = (f"real llama-server engines on this CPU, {REAL_CHAT_MODEL}" if real
            else "a simulated 16 GiB GPU, fake llama-servers, an always-on fake vLLM, a fake speech server, a fake Ollama "
                 "and a fake ComfyUI")
    base = f"{url}/v1"
    services = ""
    if ollama:
        services += f"""  Ollama            {ollama}   (OLLAMA_HOST for Open WebUI, n8n, the ollama client)
"""
    if comfyui:
        services += f"""  ComfyUI           {comfyui}   (image jobs take the whole GPU, then give it back)
"""
    tries = ""
    if ollama:
        tries += f"""  curl -s {ollama}/api/chat -d '{{"model": "llama3.2:3b", "messages": [{{"role": "user", "content": "hi"}}]}}'
"""
    if comfyui:
        tries += f"""  curl -s {comfyui}/prompt -H 'content-type: application/json' -d '{{"prompt": {{"3": {{"class_type": "KSampler", "inputs": {{}}}}, "9": {{"class_type": "SaveImage", "inputs": {{"images": ["3", 0]}}}}}}}}'
"""
    stops = f" and keeps {workdir}" if keep else f" and removes {workdir} (--keep keeps it)"
    chat_names = ", ".join(name for name in DEMO_MODELS if name not in TINY_MODELS)
    real_models = "" if not real else f"""
{REAL_CHAT_MODEL} answers under the chat names ({chat_names}): a real
instruct model, if a small one. Each slot holds {CHAT_SLOT_CONTEXT:,} tokens, the model's trained
context: an agent that wants 16k or more needs a bigger model. The embedder ({', '.join(TINY_MODELS)})
is a tiny model of random weights written on the fly: its vectors are noise by design.
"""
    images = "" if real else f"""  curl -s {base}/images/generations -H 'content-type: application/json' \\
       -d '{{"model": "{IMAGE_MODEL}", "prompt": "a lighthouse", "response_format": "b64_json"}}'   # via ComfyUI
  curl -s {base}/videos -F model={VIDEO_MODEL} -F prompt=waves -F seconds=4   # queued at once; its id:
  curl -s {base}/videos/VIDEO_ID                              # status, progress
  curl -s {base}/videos/VIDEO_ID/content -o clip.webp         # the animated WEBP (?variant=thumbnail)
"""
    speech = "" if real else f"""  curl -s {base}/audio/speech -H 'content-type: application/json' -o hello.wav \\
       -d '{{"model": "{SPEECH_MODEL}", "voice": "af_heart", "input": "Hello from steward.", "response_format": "wav"}}'   # speech
"""
    shared = "" if real else f"""  curl -s {base}/chat/completions -H 'content-type: application/json' \\
       -d '{{"model": "agents@batch", "messages": [{{"role": "user", "content": "plan"}}]}}'   # the always-on engine
"""
    return f"""
gpu-steward demo: one front door ({kind}).
{real_models}
  OpenAI base URL   {base}
{services}  event log         {workdir / 'events.jsonl'}   (tail -f it, or pipe through jq)
  usage log         {workdir / 'usage.db'}   (steward usage --db {workdir / 'usage.db'} --by model)
  metrics           {url}/metrics
  live view         steward top {url}   (what the GPU holds, who waits and why)

Try:
  curl -s {base}/models | python3 -m json.tool
  curl -s {base}/chat/completions -H 'content-type: application/json' \\
       -d '{{"model": "gpt-4o", "messages": [{{"role": "user", "content": "hello"}}]}}'
  curl -sN {base}/chat/completions -H 'content-type: application/json' \\
       -d '{{"model": "gemma4-e4b@background", "stream": true, "messages": [{{"role": "user", "content": "hi"}}]}}'
  curl -s {base}/embeddings -H 'content-type: application/json' \\
       -d '{{"model": "nomic-embed", "input": ["one", "two"]}}'
  curl -s {base}/responses -H 'content-type: application/json' \\
       -d '{{"model": "gpt-4o", "input": "hello"}}'   # OpenAI's Responses API
  curl -s {base}/messages -H 'content-type: application/json' -H 'anthropic-version: 2023-06-01' \\
       -d '{{"model": "gemma4-12b", "max_tokens": 32, "messages": [{{"role": "user", "content": "hi"}}]}}'   # Anthropic's
{shared}{images}{speech}  curl -s {url}/healthz | python3 -m json.tool
{tries}
  OPENAI_BASE_URL={base} OPENAI_API_KEY=none python3 your_agent.py
  ANTHROPIC_BASE_URL={url} ANTHROPIC_API_KEY=none python3 your_claude_agent.py   # the Anthropic SDK

Ctrl-C stops it (requests in flight finish first){stops}.
"""
