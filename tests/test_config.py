"""Config parsing: sizes, durations, and errors that name the key and what is wrong."""

from __future__ import annotations

import pytest

from supervisor.config import ConfigError, parse_config
from supervisor.units import parse_duration, parse_size

GOOD = {"command": "llama-server", "memory": "8.3GiB"}


@pytest.mark.parametrize(("text", "expected"), [
    ("16GiB", 16 * 1024**3), ("8.3GB", 8_300_000_000), ("512MiB", 512 * 1024**2), ("1.5 GiB", int(1.5 * 1024**3)),
    (1024, 1024), ("100", 100),
])
def test_sizes(text: object, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("2s", 2.0), ("5m", 300.0), ("250ms", 0.25), ("1h", 3600.0), ("0s", 0.0), (3, 3.0), ("1.5s", 1.5),
])
def test_durations(text: object, expected: float) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("bad", ["16 GiBs", "lots", "-1", True, None, "1e9"])
def test_bad_sizes_say_what_is_expected(bad: object) -> None:
    with pytest.raises(ValueError, match="must"):
        parse_size(bad)


def problems(raw: object) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    return caught.value.problems


def test_the_issue_example_message() -> None:
    assert problems({"models": {"chat": {**GOOD, "parallel": "two"}}}) == [
        "models.chat.parallel: must be a positive integer, got 'two'"]


@pytest.mark.parametrize(("raw", "expected"), [
    ({"models": {"chat": {**GOOD, "memory": "8.3XB"}}},
     "models.chat.memory: must be a size like 16GiB or 8.3GB, got '8.3XB'"),
    ({"models": {"chat": {**GOOD, "parralel": 2}}}, "models.chat.parralel: unknown key"),
    ({"models": {"chat": {"memory": "1GiB"}}}, "models.chat.command: required key is missing"),
    ({"models": {"chat": GOOD}, "classes": {"batch": {"queue_timeout": "soon"}}},
     "classes.batch.queue_timeout: must be a duration like 2s or 5m, got 'soon'"),
    ({"models": {"chat": GOOD}, "classes": {"urgent": {}}}, "classes.urgent: unknown key"),
    ({"models": {"chat": GOOD}, "gpu": {"probe": "cuda"}},
     "gpu.probe: must be one of 'auto', 'nvml', 'simulated', 'host', 'none', got 'cuda'"),
    ({"models": {"chat": {**GOOD, "pinned": "yes"}}}, "models.chat.pinned: must be true or false, got 'yes'"),
    ({"models": {"chat": GOOD}, "listen": "localhost"},
     "listen: must be HOST:PORT like 127.0.0.1:8080, got 'localhost'"),
    ({"models": {"chat": GOOD}, "aliases": {"gpt-4o": "missing"}},
     "aliases.gpt-4o: names model 'missing', which is not under models"),
    ({"models": {"chat": {**GOOD, "parallel": 2, "args": ["--parallel", "4"]}}},
     "models.chat.parallel: set here and as --parallel in args; keep one"),
    ({"models": {"chat": GOOD}, "gpu": {"budget": "4GiB"}},
     "models.chat.memory: 8912057139 bytes is more than gpu.budget (4294967296 bytes); it could never load"),
    ({"models": []}, "models: must be a mapping of keys, got a list"),
    ({"listen": "127.0.0.1:1"}, "models: required key is missing (a mapping of model name to its engine)"),
    ({"models": {"chat": GOOD}, "gpu": {"probe": "simulated"}},
     "gpu.simulated_dir: required when gpu.probe is 'simulated'"),
])
def test_errors_name_the_key_path(raw: object, expected: str) -> None:
    assert expected in problems(raw)


def test_every_problem_is_reported_at_once() -> None:
    found = problems({"models": {"chat": {**GOOD, "memory": "x", "parallel": 0}}, "surprise": 1})
    assert len(found) == 3


def test_a_full_config_resolves() -> None:
    config = parse_config({
        "listen": "0.0.0.0:9000",
        "models": {"chat": {**GOOD, "args": ["-c", 8192, "-ngl", 99], "aliases": ["gpt-4o"]}},
        "aliases": {"gpt-4": "chat"},
        "limits": {"max_body_size": "1MiB"},
        "classes": {"background": {"queue_timeout": "2m"}},
        "scheduler": {"interactive_window": "500ms", "background_max_starvation": "0s"},
    })
    assert config.listen_port == 9000
    assert config.models["chat"].args == ["-c", "8192", "-ngl", "99"]  # YAML numbers become text
    assert config.classes.background.queue_timeout == 120.0 and config.limits.max_body_size == 1024**2
    assert config.classes.batch.queue_timeout is None  # the class default applies
    assert config.scheduler.interactive_window == 0.5 and config.scheduler.background_max_starvation == 0.0
    assert config.alias_table() == {"chat": "chat", "gpt-4o": "chat", "gpt-4": "chat"}
