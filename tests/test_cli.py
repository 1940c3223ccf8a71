"""The steward command as a person uses it: check, run with a bad config (the demo: tests/test_demo.py)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from supervisor.accounting.cpu_share import usable_cpus
from tests.conftest import ROOT, descendants

pytestmark = pytest.mark.slow  # every test here runs steward's command line as a real process


def steward(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def write(tmp_path: Path, config: object) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config) if not isinstance(config, str) else config)
    return str(path)


def test_check_prints_the_resolved_plan(tmp_path: Path) -> None:
    path = write(tmp_path, {
        "gpu": {"probe": "none", "budget": "16GiB"},
        "models": {
            "chat": {"command": "/opt/llama/llama-server", "model": "/models/gemma.gguf", "memory": "8.3GiB",
                     "parallel": 2, "args": ["-c", 8192, "-ngl", 99], "aliases": ["gpt-4o"]},
            "embed": {"command": "llama-server", "memory": "0.4GiB", "pinned": True, "args": ["--embeddings"]},
        }})
    result = steward("check", path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "budget   16.0 GiB (17179869184 bytes) from gpu.budget" in out
    threads = max(1, usable_cpus().count // 2)  # two engines may compute at once (docs/compute.md)
    assert ("command  /opt/llama/llama-server --model /models/gemma.gguf --host 127.0.0.1 --port '<port>' "
            f"--parallel 2 -lv 4 --fit off --threads {threads} --threads-batch {threads} --alias chat -c 8192 -ngl 99") in out
    assert "memory   8.3 GiB (8912057139 bytes) reserved while loaded" in out
    assert "aliases  gpt-4o" in out
    assert "slots    4" in out  # embed: llama-server's automatic --parallel
    assert "(llama-server, pinned)" in out


def test_check_on_a_broken_config_exits_non_zero_and_names_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, {"models": {"chat": {"command": "llama-server", "memory": "8GiB", "parallel": "two"}}})
    result = steward("check", path)
    assert result.returncode == 2
    assert "models.chat.parallel: must be a positive integer, got 'two'" in result.stderr
    assert "Traceback" not in result.stderr


def test_check_on_unreadable_or_invalid_yaml(tmp_path: Path) -> None:
    result = steward("check", str(tmp_path / "missing.yaml"))
    assert result.returncode == 2 and "cannot read config" in result.stderr
    path = write(tmp_path, "models: [unclosed")
    result = steward("check", path)
    assert result.returncode == 2 and "not valid YAML" in result.stderr
    assert f"{path}, line 1, column 18: not valid YAML: " in result.stderr and "<unicode string>" not in result.stderr


def test_version() -> None:
    result = steward("--version")
    assert result.returncode == 0
    assert result.stdout == f"steward {importlib.metadata.version('gpu-steward')}\n"


MODEL = "{command: llama-server, memory: 1GiB"


@pytest.mark.parametrize(("text", "expected"), [
    (f"models:\n  chat: {MODEL}, args: [-np, two]}}\n", ("models.chat.args: -np must be followed by an integer, "
                                                       "got 'two'")),
    (f"models:\n  chat: {MODEL}, aliases: gpt-4o}}\n",
     "models.chat.aliases: must be a list like [\"gpt-4o\"], got a string 'gpt-4o'"),
    (f"models:\n  a: {MODEL}, port: 9000}}\n  b: {MODEL}, port: 9000}}\n",
     "models.b.port: port 9000 on 127.0.0.1 is already used by models.a.port; give each its own port"),
    (f"models:\n  chat: {{command: llama-server, memory: {'9' * 5000}}}\n",
     "models.chat.memory: line 2: an integer of 5000 digits is more than any setting takes"),
    (f"models:\n  chat: {MODEL}, args: {'[' * 5000}{']' * 5000}}}\n", "nested more than 100 levels deep"),
    (f"models:\n  chat: {MODEL}}}\nmodels: {{}}\n", "models: key given twice, on lines 1 and 3; keep one"),
])
@pytest.mark.parametrize("command", ["check", "run"])
def test_config_holes_exit_2_and_start_nothing(tmp_path: Path, command: str, text: str, expected: str) -> None:
    result = steward(command, write(tmp_path, text))
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert not descendants()


def test_check_refuses_pinned_models_over_the_budget(tmp_path: Path) -> None:
    path = write(tmp_path, {"gpu": {"probe": "none", "budget": "4GiB"},
                            "models": {"a": {"command": "llama-server", "memory": "3GiB", "pinned": True},
                                       "b": {"command": "llama-server", "memory": "2GiB", "pinned": True}}})
    result = steward("check", path)
    assert result.returncode == 2
    assert "steward: models: the pinned models (a, b) need 5.0 GiB, more than the budget 4.0 GiB" in result.stderr


def test_run_with_a_broken_config_starts_nothing(tmp_path: Path) -> None:
    path = write(tmp_path, {"models": {"chat": {"command": "llama-server", "memory": "lots"}}})
    result = steward("run", path)
    assert result.returncode == 2
    assert "models.chat.memory: must be a size" in result.stderr
    assert not descendants()


def test_run_on_a_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = write(tmp_path, {"listen": f"127.0.0.1:{port}", "gpu": {"probe": "none", "budget": "1GiB"},
                                "log": {"file": None},
                                "models": {"m": {"command": "llama-server", "memory": "1MiB"}}})
        result = steward("run", path)
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


def test_check_shows_the_demos_always_on_engine(tmp_path: Path) -> None:
    from supervisor.tools.demo import SHARED_MODEL, demo_config_dict

    path = write(tmp_path, demo_config_dict(tmp_path, 0))
    result = steward("check", path)
    assert result.returncode == 0, result.stderr
    assert f"model {SHARED_MODEL}  (openai, always on)" in result.stdout
    assert "--port '<port>' --served-model-name" in result.stdout  # ${PORT}, filled in at start
    assert "slots    16 (requests steward sends at once; the rest wait in its queue)" in result.stdout
    assert "fit      llama-server's own --fit is off" in result.stdout


def test_every_example_config_is_valid(tmp_path: Path) -> None:
    examples = sorted((ROOT / "deploy" / "examples").glob("*.yaml"))
    assert examples
    for path in examples:
        # check opens the files run opens: the container's config has its /data volume (here a folder).
        text = path.read_text().replace(" /data/", f" {tmp_path}/")
        result = steward("check", write(tmp_path, text) if text != path.read_text() else str(path))
        assert result.returncode == 0, f"{path.name}: {result.stderr}"


def test_check_shows_the_ollama_and_comfyui_listeners(tmp_path: Path) -> None:
    path = write(tmp_path, {"gpu": {"probe": "none", "budget": "16GiB"}, "models": {},
                            "ollama": {"upstream": "127.0.0.1:11435", "command": ["ollama", "serve"]},
                            "comfyui": {"upstream": "127.0.0.1:8189", "listen": None}})
    result = steward("check", path)
    assert result.returncode == 0, result.stderr
    assert "ollama   listen 127.0.0.1:11434 -> upstream 127.0.0.1:11435 (supervised: ollama serve)" in result.stdout
    assert "comfyui  listen (off) -> upstream 127.0.0.1:8189 (attached)" in result.stdout
    assert "images   exclusive jobs in the interactive class, 16.0 GiB each" in result.stdout


def test_check_shows_an_image_model_and_names_a_broken_workflow(tmp_path: Path) -> None:
    (tmp_path / "wf.json").write_text('{"1": {"class_type": "SaveImage", "inputs": {"filename_prefix": "{{prompt}}"}}}')
    config = {"gpu": {"probe": "none", "budget": "8GiB"}, "comfyui": {"upstream": "127.0.0.1:8189"},
              "models": {"sdxl": {"runtime": "comfyui", "workflow": "wf.json", "size": "64x32", "aliases": ["pic"]}}}
    result = steward("check", write(tmp_path, config))
    assert result.returncode == 0, result.stderr
    assert f"model    sdxl (pic): /v1/images/generations from {tmp_path / 'wf.json'}, 64x32, 20 steps" in result.stdout
    config["models"]["clip"] = {"runtime": "comfyui", "workflow": "wf.json", "video": {"seconds": [4, 8], "fps": 6}}
    config["videos"] = {"dir": "clips", "max_bytes": "2GiB", "keep": "48h"}
    result = steward("check", write(tmp_path, config))
    assert result.returncode == 0, result.stderr
    assert (f"model    clip: /v1/videos from {tmp_path / 'wf.json'}, 4/8 s at 6 fps, "
            "720x1280, 1280x720, 1024x1792, 1792x1024") in result.stdout
    assert f"videos   kept in {tmp_path / 'clips'}, up to 2.0 GiB, for " in result.stdout
    config["models"]["clip"]["video"] = {"seconds": []}
    refused = steward("check", write(tmp_path, config))
    assert refused.returncode != 0 and "models.clip.video.seconds: must list at least one value" in refused.stderr
    del config["models"]["clip"], config["videos"]
    (tmp_path / "wf.json").write_text("{}")
    broken = steward("check", write(tmp_path, config))
    assert broken.returncode != 0 and "models.sdxl.workflow:" in broken.stderr and "Traceback" not in broken.stderr
