"""steward in front of the real llama-server (CPU backend) with tiny GGUF models written
here: estimate → load → the measured RSS replaces the estimate, and survives a restart."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from fakes.llama_binary import llama_server_path
from fakes.tiny_gguf import write_tiny_model
from tests.conftest import StewardFactory

pytestmark = pytest.mark.slow  # every test here starts steward and llama-server as real processes


@pytest.fixture(scope="module")
def binary() -> str:
    return str(llama_server_path())  # fails (never skips) with the build command when missing


def real_model(binary: str, path: Path, **config: object) -> dict[str, object]:
    return {"command": binary, "model": str(path), "args": ["-c", "1024", "--threads", "1"], "parallel": 1,
            **config}


def test_cpu_only_host_estimate_then_measured_rss_replaces_it_and_survives_a_restart(
        start_steward: StewardFactory, binary: str, tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "tiny-llama.gguf", "llama")
    state = tmp_path / "state.json"
    config = {"gpu": {"probe": "auto", "budget": "2GiB", "poll_interval": "0.2s"}, "state_file": str(state)}
    steward = start_steward({"tiny": real_model(binary, model.path)}, **config)
    probe = steward.wait_event("probe")
    assert probe["probe"] == "host" and "no NVIDIA GPU" in probe["note"]  # no driver here: said once, cleanly
    plan = steward.wait_event("memory_plan", engine="tiny")
    assert plan["source"] == "estimate"
    client = openai.OpenAI(base_url=steward.base_url, api_key="x", max_retries=0, timeout=60)
    reply = client.completions.create(model="tiny", prompt="hello", max_tokens=4)
    assert reply.choices[0].text is not None
    buffers = steward.wait_event("buffers", engine="tiny")["devices"]["host"]
    assert buffers["weights"] > 0 and buffers["kv"] > 0 and buffers["compute"] > 0
    measured = steward.wait_event("measured", engine="tiny", timeout=10)
    assert measured["estimate"] == plan["memory"]
    assert measured["measured"] != plan["memory"]  # the process's RSS, not the estimate
    assert steward.health()["engines"]["tiny"]["reserved"] >= measured["measured"]
    assert steward.stop() == 0
    # A new steward, same model and arguments: the measurement is the plan from the start.
    again = start_steward({"tiny": real_model(binary, model.path)}, **config)
    replan = again.wait_event("memory_plan", engine="tiny")
    assert replan["source"] == "measured" and replan["memory"] >= measured["measured"]


def test_every_tiny_architecture_answers_through_steward(start_steward: StewardFactory, binary: str,
                                                         tmp_path: Path) -> None:
    models = {}
    for arch in ("llama", "gemma3", "qwen3moe", "lfm2", "granitehybrid"):
        written = write_tiny_model(tmp_path / f"{arch}.gguf", arch)
        models[arch] = real_model(binary, written.path)
    bert = write_tiny_model(tmp_path / "bert.gguf", "bert")
    models["embed"] = real_model(binary, bert.path, args=["-c", "512", "--embeddings", "--threads", "1"])
    steward = start_steward(models, gpu={"probe": "host", "budget": "4GiB"})
    client = openai.OpenAI(base_url=steward.base_url, api_key="x", max_retries=0, timeout=60)
    for arch in ("llama", "gemma3", "qwen3moe", "lfm2", "granitehybrid"):
        reply = client.chat.completions.create(model=arch, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=3)
        assert reply.choices[0].message.content is not None, arch
    vectors = client.embeddings.create(model="embed", input=["one", "two", "three"], encoding_format="float")
    assert [d.index for d in vectors.data] == [0, 1, 2] and len(vectors.data[0].embedding) == bert.n_embd
