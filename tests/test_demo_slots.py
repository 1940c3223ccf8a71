"""The fake demo's engines give each slot the context the real demo's do (issue 29).

The real demo (``steward demo --real``) starts llama-server with ``-c 16384 --parallel 2`` for the
chat models (SmolLM2-135M-Instruct, trained on 8,192) and ``-c 2048 --parallel 4`` for the
embedder; llama-server (b1-0c1e570) then gives each slot 8,192 and 512 tokens (``/slots``: with
``--parallel`` given its KV cache is not unified, and the context is split between the slots).
The fake demo's engines must have the same, so that an agent's 9,000-token prompt fails on the
fake as it fails on the real engines.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import fakes.llama_binary
import fakes.real_model
from fakes.llama_server.cli import parse_config
from supervisor.tools.demo import DEMO_MODELS, demo_config_dict, real_demo_config_dict

REAL_SLOT_CONTEXT = {"gemma4-12b": 8192, "gemma4-e4b": 8192, "gemma4-e2b": 8192, "nomic-embed": 512}


def test_the_fake_demo_s_slots_hold_what_the_real_demo_s_hold(tmp_path: Path) -> None:
    models = demo_config_dict(tmp_path, 0)["models"]
    slots = {name: parse_config([*models[name]["args"], "--port", "0", "--parallel", str(models[name]["parallel"])])
             for name in DEMO_MODELS}  # steward adds --parallel to the engine's command
    assert {name: cfg.slot_n_ctx for name, cfg in slots.items()} == REAL_SLOT_CONTEXT


def test_both_demos_ask_for_the_same_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fakes.llama_binary, "llama_server_path", lambda: Path("/usr/bin/llama-server"))
    monkeypatch.setattr(fakes.real_model, "smollm2_gguf", lambda: Path("/models/smollm2.gguf"))
    fake = demo_config_dict(tmp_path / "fake", 0)["models"]
    real = real_demo_config_dict(tmp_path / "real", 0)["models"]
    for name in DEMO_MODELS:
        fake_args, real_args = fake[name]["args"], real[name]["args"]
        assert fake_args[fake_args.index("--ctx-size") + 1] == real_args[real_args.index("-c") + 1], name
        assert fake[name]["parallel"] == real[name]["parallel"]
