"""What a reload says changed in each model: pure, two model configs in, a line per key out."""

from __future__ import annotations

from supervisor.config.schema import ModelConfig, SleepConfig
from supervisor.reload import model_changes


def test_each_changed_key_is_one_line_with_sizes_as_sizes() -> None:
    old = ModelConfig(command=["llama-server"], memory=4 * 1024**3, args=["-c", "4096"])
    new = ModelConfig(command=["llama-server"], memory=6 * 1024**3, args=["-c", "8192"], idle_unload=600.0,
                      sleep=SleepConfig(level=1))
    assert model_changes(old, new) == (
        "memory: 4.0 GiB -> 6.0 GiB",
        'args: ["-c", "4096"] -> ["-c", "8192"]',
        'sleep: unset -> {"level": 1, "memory": null}',
        "idle_unload: unset -> 600.0")


def test_of_env_only_the_names_are_said_and_long_values_are_cut() -> None:
    old = ModelConfig(env={"HF_TOKEN": "hf_secret_one", "KEEP": "1"}, args=["x" * 200])
    new = ModelConfig(env={"HF_TOKEN": "hf_secret_two", "KEEP": "1", "NEW": "2"}, args=["y" * 200])
    lines = model_changes(old, new)
    assert lines[1] == "env: HF_TOKEN, NEW changed"
    assert "secret" not in "".join(lines)
    before, after = lines[0].removeprefix("args: ").split(" -> ")
    assert len(before) == len(after) == 100 and before.endswith("...")
