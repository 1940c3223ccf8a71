"""Config parsing: sizes, durations, and errors that name the key and what is wrong."""

from __future__ import annotations

import collections
import enum
import itertools
import json
import math
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.backoff import Backoff
from supervisor.config import Config, ConfigError, load_config, parse_config
from supervisor.config_policy import (
    build_scheduler,
    engine_profiles,
    engine_specs,
    listen_addresses,
    node_specs,
    scheduling_policy,
    slo_waits,
)
from supervisor.engines.driver import placed_command
from supervisor.gateway.services import body_limits
from supervisor.gateway.http.cross_site import CrossSitePolicy
from supervisor.engines.measurements import MeasurementStore
from supervisor.engines.memory_plan import MemoryPlan, budget_problems, plan_all
from supervisor.tree import resolve_budgets
from supervisor.units import parse_duration, parse_size, show

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
    ({"models": {"chat": {"memory": "1GiB"}}},
     "models.chat.command: required key is missing (the engine's program); or set models.chat.upstream "
     "to attach to a server that runs already"),
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
    ({"models": {"chat": {**GOOD, "runtime": "openai"}}, "gpu": {"budget": "4GiB"}},
     "models.chat.memory: 8912057139 bytes is more than gpu.budget (4294967296 bytes); it could never load"),
    ({"models": {"chat": {**GOOD, "devices": [0, "one"]}}},
     "models.chat.devices[1]: must be a device index like 0 or 1, got 'one'"),
    ({"models": {"chat": {**GOOD, "devices": [1, 1]}}}, "models.chat.devices: device 1 is named twice"),
    ({"models": {"chat": {**GOOD, "devices": [1], "env": {"CUDA_VISIBLE_DEVICES": "0"}}}},
     "models.chat.env: CUDA_VISIBLE_DEVICES is set by steward from models.chat.devices; keep one"),
    ({"models": {"chat": GOOD}, "gpu": {"devices": {"-1": {"budget": "4GiB"}}}},
     "gpu.devices.-1: must be a device index like 0 or 1, got '-1'"),
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
    assert config.listen.port == 9000
    assert config.models["chat"].args == ["-c", "8192", "-ngl", "99"]  # YAML numbers become text
    assert config.classes.background.queue_timeout == 120.0 and config.limits.max_body_size == 1024**2
    assert config.classes.batch.queue_timeout is None  # the class default applies
    assert config.scheduler.interactive_window == 0.5 and config.scheduler.background_max_starvation == 0.0
    assert config.alias_table() == {"chat": "chat", "gpt-4o": "chat", "gpt-4": "chat"}


# --- holes that used to pass as valid, or end in a traceback ----------------------------------------

def load_problems(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    return caught.value.problems


def with_model(**fields: object) -> dict[str, object]:
    return {"models": {"chat": {**GOOD, **fields}}}


@pytest.mark.parametrize(("raw", "expected"), [
    (with_model(aliases="gpt-4o"), "models.chat.aliases: must be a list like [\"gpt-4o\"], got a string 'gpt-4o'"),
    (with_model(args="-c 4096"), "models.chat.args: must be a list like [\"-c\", \"4096\"], got a string '-c 4096'"),
    (with_model(args={"-c": 4096}), "models.chat.args: must be a list, got a mapping"),
    ({**with_model(), "security": {"allowed_hosts": "gpu.lan"}},
     "security.allowed_hosts: must be a list like [\"gpu.lan\"], got a string 'gpu.lan'"),
    ({**with_model(), "security": {"allowed_origins": 7}}, "security.allowed_origins: must be a list, got 7"),
    ({**with_model(), "ollama": {"upstream": "127.0.0.1:11435", "command": "ollama serve"}},
     "ollama.command: must be a list like [\"ollama\", \"serve\"], got a string 'ollama serve'"),
])
def test_a_string_where_a_list_belongs(raw: object, expected: str) -> None:
    assert expected in problems(raw)


def test_keys_given_twice_name_the_path_and_both_lines(tmp_path: Path) -> None:
    found = load_problems(tmp_path, "models:\n  chat:\n    command: llama-server\n    memory: 1GiB\n"
                                    "    args: [-c, '4096']\n    args: [-c, '8192']\n"
                                    "gpu: {probe: none, probe: host}\n")
    assert found == ["models.chat.args: key given twice, on lines 5 and 6; keep one",
                     "gpu.probe: key given twice, on line 7; keep one"]


def test_merge_keys_are_not_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("models:\n  a: &m {command: llama-server, memory: 1GiB}\n  b:\n    <<: *m\n    memory: 2GiB\n")
    assert load_config(path).models["b"].memory == 2 * 1024**3


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "gpu-box.lan", "gpu-box.lan.", "0.0.0.0"])
def test_good_engine_hosts(host: str) -> None:
    assert parse_config({**with_model(), "engines": {"host": host}}).engines.host == host


@pytest.mark.parametrize("host", ["not a host!", "999.1.1.1", "-bad", "a_b", "[::1]", "", "8080", "a" * 64])
def test_bad_engine_hosts(host: str) -> None:
    assert problems({**with_model(), "engines": {"host": host}}) == [
        f"engines.host: must be an IP address or a host name, got {show(host)}"]


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("listen", "not a host!:8080", ("listen: must have an IP address or a host name before the port, "
                                   "got 'not a host!:8080'")),
    ("listen", "[gpu.lan]:8080", ("listen: must have an IP address or a host name before the port, "
                                 "got '[gpu.lan]:8080'")),
    ("listen", "127.0.0.1:70000", ("listen: must have a port 0..65535 after the host (0: any free one), "
                                  "got '127.0.0.1:70000'")),
    ("ollama.upstream", "bad_host:11435", ("ollama.upstream: must have an IP address or a host name before the "
                                          "port, got 'bad_host:11435'")),
    ("ollama.upstream", "127.0.0.1:0", ("ollama.upstream: must have a port 1..65535 after the host, "
                                       "got '127.0.0.1:0'")),
    ("comfyui.listen", "::1:8188", "comfyui.listen: must be HOST:PORT like 127.0.0.1:8080, got '::1:8188'"),
])
def test_bad_host_port_values(key: str, value: str, expected: str) -> None:
    raw: dict[str, object] = {**with_model(), "ollama": {"upstream": "127.0.0.1:11435"},
                              "comfyui": {"upstream": "127.0.0.1:8189"}}
    section, _, field = key.rpartition(".")
    if section:
        raw[section] = {**raw[section], field: value}  # type: ignore[dict-item]
    else:
        raw[field] = value
    assert problems(raw) == [expected]


def test_an_ipv6_listen_address() -> None:
    config = parse_config({**with_model(), "listen": "[::1]:0"})
    assert (config.listen.host, config.listen.port) == ("::1", 0)


@pytest.mark.parametrize("port", [0, 70000, -1, "8080"])
def test_engine_ports_are_port_numbers(port: object) -> None:
    assert problems(with_model(port=port)) == [f"models.chat.port: must be a port number 1..65535, got {port!r}"]


def two_models(a: dict[str, object], b: dict[str, object], **sections: object) -> dict[str, object]:
    return {"models": {"a": {**GOOD, **a}, "b": {**GOOD, **b}}, **sections}


@pytest.mark.parametrize(("raw", "expected"), [
    (two_models({"port": 9000}, {"port": 9000}),
     "models.b.port: port 9000 on 127.0.0.1 is already used by models.a.port; give each its own port"),
    (two_models({"port": 8080}, {}), ("models.a.port: port 8080 on 127.0.0.1 is already used by listen; "
                                     "give each its own port")),
    (two_models({"port": 8080}, {}, listen="0.0.0.0:8080"),
     "models.a.port: port 8080 on 127.0.0.1 is already used by listen; give each its own port"),
    (two_models({}, {}, ollama={"upstream": "127.0.0.1:11435", "listen": "localhost:8188"},
                comfyui={"upstream": "127.0.0.1:8189"}),
     "comfyui.listen: port 8188 on 127.0.0.1 is already used by ollama.listen; give each its own port"),
    (two_models({}, {}, ollama={"upstream": "127.0.0.1:8080"}),
     "ollama.upstream: port 8080 on 127.0.0.1 is already used by listen; give each its own port"),
    (two_models({"port": 11434}, {}, ollama={"upstream": "127.0.0.1:11435"}),
     "models.a.port: port 11434 on 127.0.0.1 is already used by ollama.listen; give each its own port"),
])
def test_two_things_on_one_port(raw: object, expected: str) -> None:
    assert problems(raw) == [expected]


def test_different_hosts_or_port_zero_do_not_conflict() -> None:
    parse_config(two_models({"port": 8080}, {"port": 8081}, listen="127.0.0.2:8080"))
    parse_config(two_models({}, {}, listen="127.0.0.1:0", ollama={"upstream": "127.0.0.1:11435",
                                                                   "listen": "127.0.0.1:0"}))


POSITIVE_DURATIONS = [
    ("gpu", "poll_interval"), ("limits", "body_timeout"),
    ("engines", "start_timeout"), ("engines", "health_interval"), ("engines", "restart_backoff"),
    ("engines", "restart_backoff_max"), ("engines", "first_byte_timeout"), ("engines", "chunk_timeout"),
    ("engines", "health_check_interval"), ("engines", "health_check_timeout"),
    ("ollama", "unload_poll"), ("ollama", "ps_poll"), ("ollama", "retry_initial"), ("ollama", "retry_max"),
    ("ollama", "first_byte_timeout"), ("ollama", "chunk_timeout"),
    ("comfyui", "job_timeout"), ("comfyui", "history_poll"), ("comfyui", "retry_initial"),
    ("comfyui", "retry_max"),
]
UPSTREAMS = {"ollama": {"upstream": "127.0.0.1:11435"}, "comfyui": {"upstream": "127.0.0.1:8189"}}


@pytest.mark.parametrize(("section", "key"), POSITIVE_DURATIONS)
@pytest.mark.parametrize("zero", ["0s", 0, "0ms"])
def test_polls_and_timeouts_must_be_more_than_zero(section: str, key: str, zero: object) -> None:
    raw = {**with_model(), section: {**UPSTREAMS.get(section, {}), key: zero}}
    assert f"{section}.{key}: must be a positive duration like 1s or 250ms, got {zero!r}" in problems(raw)


def test_zero_keeps_its_documented_meaning_where_it_has_one() -> None:
    config = parse_config({**with_model(), "scheduler": {"background_max_starvation": "0s", "guard_gap_wait": 0,
                                                         "interactive_window": "0s"}})
    assert config.scheduler.guard_gap_wait == 0.0


@pytest.mark.parametrize(("text", "expected"), [
    ("gpu: {poll_interval: .nan}", "gpu.poll_interval: must be a finite duration like 2s or 5m, got nan"),
    ("gpu: {poll_interval: .inf}", "gpu.poll_interval: must be a finite duration like 2s or 5m, got inf"),
    ("scheduler: {hot_window: -.inf}", "scheduler.hot_window: must be a finite duration like 2s or 5m, got -inf"),
    (f"scheduler: {{hot_window: {'9' * 400}s}}",
     "scheduler.hot_window: must be a finite duration like 2s or 5m, got '" + "9" * 57 + "...'"),
    ("gpu: {budget: .inf}", "gpu.budget: must be a size like 16GiB or 8.3GB, got inf"),
    (f"gpu: {{budget: {'9' * 400}GiB}}", "gpu.budget: must be less than 8 EiB, got '" + "9" * 57 + "...'"),
    (f"gpu: {{budget: {'9' * 5000}}}", ("gpu.budget: line 3: an integer of 5000 digits is more than any setting "
                                        "takes")),
])
def test_non_finite_and_huge_numbers(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in load_problems(tmp_path, f"models:\n  chat: {{command: llama-server, memory: 1GiB}}\n{text}\n")


def test_yaml_nested_thousands_deep_is_a_clear_error(tmp_path: Path) -> None:
    deep = "[" * 5000 + "]" * 5000
    found = load_problems(tmp_path, f"models:\n  chat:\n    command: llama-server\n    args: {deep}\n")
    assert found == [(f"{tmp_path / 'config.yaml'}, line 4, column 108: not valid YAML: "
                     f"nested more than 100 levels deep")]


def test_many_aliases_of_aliases_are_read_once(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    text = "models:\n  chat:\n    command: llama-server\n    memory: 1GiB\n    env: {" + ", ".join(lines) + "}\n"
    assert "models.chat.env.a0: must be a string, got a list" in load_problems(tmp_path, text)


@pytest.mark.parametrize(("text", "expected"), [
    ("models:\n  chat: &m {command: llama-server, env: *m}\n",
     "models.chat.env: line 2: an alias refers to the list or mapping that holds it"),
    ("models:\n  chat: &m {command: llama-server, <<: *m}\n",
     "models.chat: line 2: an alias refers to the list or mapping that holds it"),
    ("models:\n  chat: {command: llama-server, memory: 1GiB, env: {A: 2001-13-45}}\n",
     "models.chat.env.A: line 2: cannot read '2001-13-45' as timestamp: month must be in 1..12"),
])
def test_values_yaml_cannot_build_name_the_key_and_line(tmp_path: Path, text: str, expected: str) -> None:
    assert load_problems(tmp_path, text) == [expected]


@pytest.mark.parametrize(("raw", "expected"), [
    ({**with_model(), "engines": {"restart_backoff": "10s", "restart_backoff_max": "5s"}},
     "engines.restart_backoff_max: 5s is less than engines.restart_backoff (10s)"),
    ({**with_model(), "ollama": {"upstream": "127.0.0.1:11435", "retry_initial": "2m"}},
     "ollama.retry_max: 60s is less than ollama.retry_initial (2m)"),
    ({**with_model(), "comfyui": {"upstream": "127.0.0.1:8189", "retry_max": "500ms"}},
     "comfyui.retry_max: 500ms is less than comfyui.retry_initial (1s)"),
])
def test_a_backoff_cap_below_its_first_delay(raw: object, expected: str) -> None:
    assert problems(raw) == [expected]


@pytest.mark.parametrize(("raw", "expected"), [
    (with_model(aliases=["gpt-4o@batch"]),
     "models.chat.aliases: 'gpt-4o@batch' holds '@', which separates a class suffix (model@batch)"),
    (with_model(aliases=[""]), "models.chat.aliases: an alias must not be empty"),
    ({**with_model(), "aliases": {"a@b": "chat"}}, ("aliases: 'a@b' holds '@', which separates a class suffix "
                                                   "(model@batch)")),
    ({**with_model(), "aliases": {"": "chat"}}, "aliases: an alias must not be empty"),
])
def test_aliases_are_not_empty_and_hold_no_at(raw: object, expected: str) -> None:
    assert problems(raw) == [expected]


@pytest.mark.parametrize(("args", "expected"), [
    (["-np", "two"], "models.chat.args: -np must be followed by an integer, got 'two'"),
    (["--parallel=x"], "models.chat.args: --parallel must be followed by an integer, got 'x'"),
    (["-c", "4096", "--parallel"], "models.chat.args: --parallel must be followed by an integer, got nothing"),
    (["-np", "-5"], "models.chat.args: -np must be followed by a slot count or -1 (auto), got '-5'"),
])
def test_parallel_in_args_is_an_integer(args: list[str], expected: str) -> None:
    assert problems(with_model(args=args)) == [expected]


@pytest.mark.parametrize("args", [["-np", "-1"], ["--parallel", "3"], ["--parallel=2"]])
def test_good_parallel_in_args(args: list[str]) -> None:
    assert parse_config(with_model(args=args)).models["chat"].args == args


def test_budget_problems() -> None:
    config = parse_config({"models": {"big": {**GOOD, "memory": "9GiB"},
                                      "a": {**GOOD, "memory": "3GiB", "pinned": True},
                                      "b": {**GOOD, "memory": "6GiB", "pinned": True}},
                           "comfyui": {"upstream": "127.0.0.1:8189", "memory": "10GiB"}})
    plans = {name: MemoryPlan(model.memory or 0, "config", name) for name, model in config.models.items()}
    profiles = engine_profiles(config, engine_specs(config), plans)
    assert budget_problems(config, profiles, [8 * 1024**3]) == [
        "models.big.memory: 9.0 GiB exceeds the budget 8.0 GiB; it could never load",
        "models: the pinned models (a, b) need 9.0 GiB, more than the budget 8.0 GiB",
        "comfyui.memory: 10.0 GiB exceeds the budget 8.0 GiB; an image job could never run"]
    assert budget_problems(config, profiles, [16 * 1024**3]) == []


def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path: Path) -> None:
    found = load_problems(tmp_path, "models:\n  chat: [unclosed\n")
    assert len(found) == 1
    assert found[0].startswith(f"{tmp_path / 'config.yaml'}, line 3, column 1: not valid YAML: ")
    assert "<unicode string>" not in found[0]


def test_unreadable_bytes_are_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(b"models: {}\nlisten: \xff\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(path)
    path.write_text("models: {}\nlisten: \x00\n")
    with pytest.raises(ConfigError, match=r"line 2: not valid YAML: .*#x0000"):
        load_config(path)


# --- property: whatever the YAML, a Config or a ConfigError naming a key; a Config run starts with ------

@attrs.frozen
class Raw:
    """YAML text written as it is (numbers no Python value can be dumped as, nesting too deep to build).
    No str subclass: hypothesis re-encodes a drawn value as a text choice, and fails on a str subclass."""

    text: str


WEIRD = [Raw("9" * 5000), Raw(".nan"), Raw(".inf"), Raw("-.inf"), Raw("[" * 3000 + "]" * 3000),
         Raw("{a: 1, a: 2}"), Raw("2001-13-45"), Raw("!!int nope"), Raw("*undefined"), Raw("&x [*x]"),
         Raw("&y {<<: *y}"), Raw("!!python/object:os.system ls")]
# Any code point: control characters, NUL, lone surrogates (YAML's "\\ud800" gives one), RTL marks.
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=12)
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.builds(pow, st.just(10), st.just(5000)), st.floats(),
                    st.text(max_size=12), ANY_TEXT, st.sampled_from(WEIRD))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=8) | ANY_TEXT, inner, max_size=4), max_leaves=12)
# Strings that exec, a path, a URL, an event or a terminal cannot take (or can only just): NUL, a lone
# surrogate, control characters, an RTL override, '=' (an environment variable's name), past exec's
# 128 KiB for one argument.
HOSTILE_TEXT = ["a\0b", "\0", "x\ud800", "\udfff", "\x1b[31m", "\x7f", "\x85", "\u202egpt", "line\nbreak", "\t",
                "A=B", "=", " ", "\ufeff", "\U0010ffff", "a" * 140_000]
# Values of the kind each key takes: (good ones, ones on or past an edge).
BY_TYPE: dict[str, tuple[list[object], list[object]]] = {
    "Size": (["8GiB", "512MiB", 1024], [0, "1e9", 2**63 - 1, 2**63, 10**100]),
    "Duration": (["1s", "250ms", "0s", 0, 2.5, "5m"], [math.nan, -math.inf, 1e300, 10**100]),
    "PositiveDuration": (["1s", "250ms", 2.5, "5m"], ["0s", 0, math.inf, 1e300, 1e-300]),
    "PositiveInt": ([1, 4], [0, -1, 2**63 - 1, 2**63, 10**100]),
    "Count": ([0, 1, 3], [-1, 1.5, 2**63 - 1, 10**100]),
    "ThreadCount": ([1, 4, "auto"], [0, -1, 8193, "all"]),
    "CpuSet": (["0-3,6", "1", 0], ["3-1", "x", 8192, [0, 1]]),
    "Port": ([8080, 8081, 11434], [0, 65536]),
    "DeviceIndex": ([0, 1, "1"], [-1, "gpu0"]),
    "Host": (["127.0.0.1", "::1", "localhost", "0.0.0.0"], ["not a host!"]),
    "ListenAddress": (["127.0.0.1:8080", "127.0.0.1:0", "localhost:11434", "[::1]:8188", "0.0.0.0:8081"],
                      ["x:70000"]),
    "UpstreamAddress": (["127.0.0.1:11435", "127.0.0.1:8189", "localhost:8080"], ["127.0.0.1:0"]),
    "NodeAddress": (["http://192.168.1.20:8080", "http://[::1]:8080", "http://lab:8080/"],
                    ["https://lab:8080", "lab:8080", "http://lab"]),
    "MacAddress": (["aa:bb:cc:dd:ee:ff", "AA-BB-CC-DD-EE-FF", "aabbccddeeff"], ["aa:bb", "zz:zz:zz:zz:zz:zz"]),
    "Fraction": ([0.5, "10%", 1], [0]),
    "SlowdownFactor": ([0, 1, 3.0, 10], [0.5, -1, "x", True, math.inf]),
    "ImageSize": (["1024x1024", "512x768"], ["big", "0x512", 1024]),
    "RemoteUrl": (["https://api.openai.com/v1", "http://127.0.0.1:8443/v1", "https://[::1]:443"],
                  ["http://api.openai.com/v1", "ftp://x", "https://", "https://h:99999"]),
    "EnvName": (["OPENAI_API_KEY", "_K"], ["1X", "A-B", ""]),
    "Price": ([0, 0.15, 60], [-1, math.inf, math.nan, "free"]),
    "str": (["llama-server", "/models/m.gguf", "gpt-4o", "chat", "-np", "--parallel=3", "4"],
            ["a@b", "", "two", *HOSTILE_TEXT]),
    "bool": ([True, False], ["yes"]),
}


def plausible(type_: Any, edges: bool) -> st.SearchStrategy[object]:
    """Values of the kind *type_* takes (with *edges*: also ones just past what it takes)."""
    origin, args = get_origin(type_), get_args(type_)
    if origin is Literal:
        return st.sampled_from(args)
    if isinstance(type_, type) and issubclass(type_, enum.Enum):  # named in the file by its value
        return st.sampled_from([member.value for member in type_])
    if origin in (Union, UnionType):
        return st.one_of(*(plausible(arg, edges) for arg in args))
    if origin is list:  # and a string where a list belongs
        items = st.lists(plausible(args[0], edges), max_size=3)
        return items | plausible(str, edges) if edges else items
    if origin is dict:
        return st.dictionaries(plausible(args[0], edges), plausible(args[1], edges), max_size=3)
    if attrs.has(type_) and type_.__name__ not in BY_TYPE:  # its required keys and up to four others
        hints = get_type_hints(type_)
        required = [field.name for field in attrs.fields(type_) if field.default is attrs.NOTHING]
        return st.lists(st.sampled_from(sorted(hints)), max_size=4, unique=True).flatmap(
            lambda keys: st.fixed_dictionaries({key: plausible(hints[key], edges) for key in {*required, *keys}}))
    if type_ is type(None):
        return st.none()
    good, bad = BY_TYPE.get(type_.__name__, ([], ["anything"]))
    return st.sampled_from(good + bad if edges else good)


# Configs of the right shape, near and past the edges; real keys with anything under them; anything.
configs = st.one_of(plausible(Config, edges=False), plausible(Config, edges=True), st.fixed_dictionaries(
    {}, optional={name: values for name in [*get_type_hints(Config), "surprise"]}), values)


def to_yaml(value: object) -> str:
    """Flow-style YAML of a generated value, Python's oddities (huge ints, nan) included."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ", ".join(f"{to_yaml(k)}: {to_yaml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(to_yaml(item) for item in value) + "]"
    if isinstance(value, str):
        return yaml_string(value)
    if isinstance(value, float) and not math.isfinite(value):
        return {"nan": ".nan", "inf": ".inf", "-inf": "-.inf"}[repr(value)]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**4000:
        return "9" * 5000
    return json.dumps(value)


def yaml_string(text: str) -> str:
    """*text* as a double-quoted YAML scalar that gives it back exactly: everything but printable
    ASCII as an escape, so a NUL, a control character or a lone surrogate reaches the config."""
    def escape(char: str) -> str:
        if " " <= char <= "~":
            return "\\" + char if char in '"\\' else char
        code = ord(char)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"

    return '"' + "".join(map(escape, text)) + '"'


GIVEN_TWICE = re.compile(r"[^\n]+: key given twice, on lines? \d+")


def only_config_errors(load: Callable[[], Config], raw: object = None, where: str = "") -> Config | None:
    """What *load* gives: a Config, or None for a ConfigError whose every line names a key (or
    the file), printably. *raw*: the mapping it was made from, whose unknown keys are named too."""
    try:
        config = load()
    except ConfigError as exc:
        keys = [*get_type_hints(Config), "(top level)", "image_models", "remote_models", *(map(key_text, raw) if isinstance(raw, dict)
                                                                         else [])]
        heads = "|".join(re.escape(printable(key)) for key in [*keys, where] if key)
        assert exc.problems
        for line in exc.problems:
            # A key given twice is named by its path in the file, whatever that key is.
            assert line.isprintable() and (re.match(rf"({heads})[.:\[ ,]", line) or GIVEN_TWICE.match(line)), line
        return None
    assert isinstance(config, Config)
    return config


def key_text(key: object) -> str:
    return key if isinstance(key, str) and key else show(key)


def printable(text: str) -> str:
    """As a ConfigError shows it: what a terminal would act on, as its escape."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def run_would_start(config: Config) -> None:
    """What `steward run` does with a config before it serves, short of opening files and ports and
    starting anything: each engine's argv and environment as exec gets them, the budgets, the memory
    plans, the scheduler, the listeners' guards. Only a ConfigError may come out (from the same
    functions `steward check` calls: it refuses those configs too)."""
    specs = engine_specs(config)
    for spec in specs.values():
        collections.deque(maxlen=spec.tail_lines)  # each engine's output tail
        command = spec.command(PORT)
        if command is not None:
            exec_would_take(*placed_command(spec, command, None))
    for address in listen_addresses(config).values():
        CrossSitePolicy.create(address, config.security.allowed_hosts, config.security.allowed_origins)
    body_limits(config)
    slo_waits(config)
    node_specs(config, {node.key_env: "a key" for node in config.nodes.values() if node.key_env is not None})
    for backoff in [Backoff(config.engines.restart_backoff, config.engines.restart_backoff_max)]:
        list(itertools.islice(backoff.delays(), 70))
    try:
        budgets = [budget.nbytes for budget in resolve_budgets(config, [])]
        plans = plan_all(config, {name: specs[name].command(0) for name in config.models}, MeasurementStore(None),
                         "gpu")
    except ConfigError:
        return
    profiles = engine_profiles(config, specs, plans)
    if not budget_problems(config, profiles, budgets):
        build_scheduler(config, specs, plans, budgets, observe_memory=True)


PORT = 18080


def exec_would_take(argv: list[str], env: dict[str, str]) -> None:
    """What Popen (open_child) does with *argv* and *env* up to the exec itself, which finds no
    program: an OSError is a failed start (no such program; E2BIG), anything else a crash."""
    try:
        subprocess.Popen(argv, executable="/nonexistent/steward-config-fuzz", env={**os.environ, **env},
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        return
    raise AssertionError(f"{argv} ran")


@settings(max_examples=200, database=None, deadline=None)
@given(configs)
def test_any_structure_gives_a_config_or_a_config_error(raw: object) -> None:
    config = only_config_errors(lambda: parse_config(raw), raw)
    if config is not None:
        run_would_start(config)


@settings(max_examples=200, database=None, deadline=None)
@given(raw=configs, text=st.text(max_size=40))
def test_any_yaml_file_gives_a_config_or_a_config_error(tmp_path_factory: pytest.TempPathFactory, raw: object,
                                                       text: str) -> None:
    path = tmp_path_factory.getbasetemp() / "any.yaml"
    for content, mapping in ((to_yaml(raw), raw), (text, None)):
        path.write_text(content)
        config = only_config_errors(lambda: load_config(path), mapping, str(path))
        if config is not None:
            run_would_start(config)


# Configs close to ones that run, with hostile text and huge numbers where run takes text and numbers
# (most of them are accepted: the property above, on these, is about what run does with them).
TEXT = st.one_of(st.sampled_from(HOSTILE_TEXT), ANY_TEXT, st.text(max_size=8))
ARGUMENT = st.one_of(st.sampled_from(["-c", "4096", "--alias", "${PORT}", "--port", "-np", "2"]), TEXT)
DURATION = st.sampled_from(["1s", "250ms", 1e300, 10**100, 1e-300])
COUNT = st.sampled_from([1, 4, 2**63 - 1, 2**63 - 1, 10**100])  # the largest taken, mostly; one past it
SIZE = st.sampled_from(["1GiB", "1MiB", 2**63 - 1, 2**63 - 1, 2**63])
EITHER_RUNTIME = {"args": st.lists(ARGUMENT, max_size=4), "parallel": COUNT, "idle_unload": DURATION,
                  "env": st.dictionaries(st.one_of(st.sampled_from(["HF_HOME", "A=B", "", "X\0"]), TEXT), ARGUMENT,
                                         max_size=3),
                  "aliases": st.lists(st.one_of(st.sampled_from(["gpt-4o", "gpt\u202e4o", "a\nb"]), TEXT), max_size=2),
                  "devices": st.sampled_from([[0], [0, 1]])}
near_models = st.one_of(
    st.fixed_dictionaries({"command": st.lists(ARGUMENT, min_size=1, max_size=3), "memory": SIZE},
                          optional={**EITHER_RUNTIME, "model": st.one_of(st.just("/models/m.gguf"), TEXT)}),
    st.fixed_dictionaries(
        {"runtime": st.just("openai"), "memory": SIZE,
         "command": st.lists(ARGUMENT, min_size=1, max_size=3).map(lambda parts: [*parts, "--port", "${PORT}"])},
        optional={**EITHER_RUNTIME, "served_name": TEXT,
                  "health": st.one_of(st.just("/health"), TEXT.map(lambda text: "/" + text))}))
near_configs = st.fixed_dictionaries(
    {"models": st.dictionaries(st.sampled_from(["chat", "embed", "coder"]), near_models, min_size=1, max_size=2)},
    optional={
        "engines": st.fixed_dictionaries({}, optional={
            "stderr_tail_lines": COUNT, "restart_backoff": DURATION, "restart_backoff_max": DURATION,
            "start_timeout": DURATION, "health_interval": DURATION, "unhealthy_after": COUNT,
            "host": st.sampled_from(["127.0.0.1", "localhost", "::1"])}),
        "security": st.fixed_dictionaries({}, optional={
            "allowed_origins": st.lists(st.one_of(st.sampled_from(["*", "https://app.example.com", "not a url"]),
                                                  TEXT.map(lambda text: "https://" + text)), max_size=2),
            "allowed_hosts": st.lists(st.one_of(st.sampled_from(["*", "lab.local", "lab:80"]), TEXT), max_size=2)}),
        "limits": st.fixed_dictionaries({}, optional={"max_connections": COUNT, "body_timeout": DURATION,
                                                      "max_body_size": SIZE}),
        "log": st.fixed_dictionaries({}, optional={"keep": COUNT, "max_size": SIZE}),
        "scheduler": st.fixed_dictionaries({}, optional={"embedding_chunk": COUNT, "lower_class_engines": COUNT,
                                                         "hot_window": DURATION, "swap_hold": DURATION}),
        "aliases": st.dictionaries(TEXT, st.just("chat"), max_size=2),
        "gpu": st.fixed_dictionaries({"probe": st.just("none")}, optional={
            "budget": SIZE, "devices": st.just({1: {"budget": "8GiB"}})}),
        "nodes": st.just({"lab": {"url": "http://192.168.1.20:8080", "models": ["qwen"]}}),
        "capabilities": st.dictionaries(TEXT, st.lists(st.one_of(st.just("qwen"), TEXT), max_size=2), max_size=2),
    })


@settings(max_examples=300, database=None, deadline=None)
@given(near_configs)
def test_a_config_check_accepts_is_one_run_starts_with(raw: dict[str, Any]) -> None:
    config = only_config_errors(lambda: parse_config(raw), raw)
    if config is not None:
        run_would_start(config)

@pytest.mark.parametrize(("section", "expected"), [
    ({"alerts": {"webhook": "ntfy.sh/topic"}}, "alerts.webhook: must be an http:// or https:// URL, got 'ntfy.sh/topic'"),
    ({"auth": {"open_paths": ["livez"]}}, "auth.open_paths: 'livez' is not a path like /livez"),
    ({"auth": {"allow_unauthenticated": "yes"}}, "auth.allow_unauthenticated: must be true or false, got 'yes'"),
    ({"classes": {"batch": {"slo_wait": "0s"}}}, "classes.batch.slo_wait: must be a positive duration"),
    ({"usage": {"db": ""}}, "usage.db: must be a file path, or null for no usage log"),
    ({"health": {"window": 0}}, "health.window: must be a positive duration"),
])
def test_front_door_keys_say_what_is_wrong(section: dict[str, object], expected: str) -> None:
    assert any(p.startswith(expected) for p in problems({"models": {"chat": GOOD}, **section})), problems(
        {"models": {"chat": GOOD}, **section})


def test_steward_files_live_beside_the_config_unless_a_path_says_otherwise(tmp_path: Path) -> None:
    folder = tmp_path / "lab"
    folder.mkdir()
    (folder / "config.yaml").write_text(json.dumps({
        "models": {"chat": GOOD}, "usage": {"db": "data/usage.db"}, "log": {"file": "/var/log/steward.jsonl"}}))
    config = load_config(folder / "config.yaml")
    assert config.auth.keys_file == str(folder / "steward-keys.json")
    assert config.usage.db == str(folder / "data/usage.db")
    assert config.log.file == "/var/log/steward.jsonl"
    assert config.state_file == str(folder / "steward-state.json")
    assert parse_config({"models": {"chat": GOOD}}).usage.db == "steward-usage.db"  # as given, without a file


# --- scheduler.warm -----------------------------------------------------------------------------------

def test_scheduler_warm_names_models_in_order_and_reaches_the_policy() -> None:
    config = parse_config({"models": {"chat": GOOD, "coder": GOOD}, "scheduler": {"warm": ["coder", "chat"]}})
    assert config.scheduler.warm == ["coder", "chat"]
    assert scheduling_policy(config).warm == ("coder", "chat")
    assert scheduling_policy(parse_config({"models": {"chat": GOOD}})).warm == ()  # default: recent use only


@pytest.mark.parametrize(("scheduler", "expected"), [
    ({"warm": ["chat", "nope"]}, "scheduler.warm[1]: names model 'nope', which is not under models"),
    ({"warm": ["chat", "coder", "chat"]}, "scheduler.warm[2]: 'chat' is named already, at scheduler.warm[0]; keep one"),
    ({"warm": ["gpt-4o"]}, "scheduler.warm[0]: 'gpt-4o' is an alias; name the model, 'chat'"),
    ({"warm": ["ollama"]}, "scheduler.warm[0]: 'ollama' is not under models; to warm an Ollama model after an image "
                           "job, set comfyui.warm_model"),
    ({"warm": "chat"}, "scheduler.warm: must be a list like [\"chat\"], got a string 'chat'"),
    ({"warm": [7]}, "scheduler.warm[0]: names model '7', which is not under models"),  # YAML numbers become text
])
def test_scheduler_warm_problems_name_the_entry(scheduler: dict[str, object], expected: str) -> None:
    raw = {"models": {"chat": {**GOOD, "aliases": ["gpt-4o"]}, "coder": GOOD}, "scheduler": scheduler,
           "ollama": {"upstream": "127.0.0.1:11435"}}
    assert problems(raw) == [expected]


def test_scheduler_warm_does_not_take_an_image_model(tmp_path: Path) -> None:
    (tmp_path / "flux.json").write_text("{}")
    raw = {"models": {"chat": GOOD, "flux": {"runtime": "comfyui", "workflow": str(tmp_path / "flux.json")}},
           "comfyui": {"upstream": "127.0.0.1:8189"}, "scheduler": {"warm": ["flux"]}}
    assert problems(raw) == ["scheduler.warm[0]: 'flux' is an image model: its workflow runs in ComfyUI, which "
                             "steward does not load"]


# --- what `steward run` cannot take: refused by the config, naming the key (issue 26, defect 4) --------

NUL = "must not contain a NUL character (an argument, a path or the environment cannot hold one)"
NODES = {"lab": {"url": "http://192.168.1.20:8080", "models": ["qwen3-32b", "qwen3-8b"]},
         "den": {"url": "http://192.168.1.21:8080", "models": ["gemma"]}}


@pytest.mark.parametrize(("raw", "expected"), [
    (with_model(args=["-c", "4096", "a\0b"]), f"models.chat.args[2]: {NUL}, got 'a\\x00b'"),
    (with_model(command=["llama-server", "--x\0"]), f"models.chat.command: {NUL}, got '--x\\x00' (item [1])"),
    (with_model(command="llama\0server"), f"models.chat.command: {NUL}, got 'llama\\x00server'"),
    (with_model(env={"HF_HOME": "/data\0"}), f"models.chat.env.HF_HOME: {NUL}, got '/data\\x00'"),
    (with_model(env={"HF\0HOME": "/data"}), f"models.chat.env.HF\\x00HOME: {NUL}, got 'HF\\x00HOME'"),
    (with_model(model="/models/m\0.gguf"), f"models.chat.model: {NUL}, got '/models/m\\x00.gguf'"),
    ({**with_model(), "log": {"file": "events\0.jsonl"}}, f"log.file: {NUL}, got 'events\\x00.jsonl'"),
    (with_model(args=["x\ud800"]), "models.chat.args[0]: must be text UTF-8 can write; it holds the lone surrogate "
                                   "'\\ud800', got 'x\\ud800'"),
    (with_model(env={"A=B": "c"}), "models.chat.env.A=B: a variable's name cannot hold '=' (the environment is "
                                   "NAME=VALUE)"),
    (with_model(env={"": "c"}), "models.chat.env: a variable needs a name, got ''"),
    (with_model(aliases=["gpt\x1b[31m"]), "models.chat.aliases: 'gpt\\x1b[31m' holds '\\x1b', a control or "
                                          "invisible character; a name is visible text"),
    (with_model(aliases=["gpt\u202e4o"]), "models.chat.aliases: 'gpt\\u202e4o' holds '\\u202e', a control or "
                                          "invisible character; a name is visible text"),
    (with_model(health="/health\x01", runtime="openai", upstream="127.0.0.1:9000", command=None),
     "models.chat.health: must be a path like /health (invalid non-printable ASCII character in URL), got "
     "'/health\\x01'"),
    (with_model(parallel=10**100), "models.chat.parallel: must be a positive integer less than 2**63, got a "
                                   "101-digit integer"),
    ({**with_model(), "engines": {"stderr_tail_lines": 2**63}},
     "engines.stderr_tail_lines: must be a positive integer less than 2**63, got 9223372036854775808"),
    ({**with_model(), "scheduler": {"lower_class_engines": 10**100}},
     "scheduler.lower_class_engines: must be a whole number, 0 or more less than 2**63, got a 101-digit integer"),
    ({**with_model(), "alerts": {"webhook": "https://ntfy.sh/lab\x01"}},
     "alerts.webhook: invalid non-printable ASCII character in URL, got 'https://ntfy.sh/lab\\x01'"),
    ({**with_model(), "security": {"allowed_origins": ["not a url"]}},
     "security.allowed_origins[0]: must be an origin, scheme://host[:port] like https://app.example.com or "
     "http://localhost:3000, or '*'; got 'not a url'"),
    ({**with_model(), "security": {"allowed_origins": ["*", "https://app.example.com/chat"]}},
     "security.allowed_origins[1]: must be an origin, scheme://host[:port] like https://app.example.com or "
     "http://localhost:3000, or '*'; got 'https://app.example.com/chat'"),
    ({**with_model(), "security": {"allowed_origins": ["ftp://files.lan"]}}, "security.allowed_origins[0]: must be"),
    ({**with_model(), "security": {"allowed_hosts": ["lab.local:8080"]}},
     "security.allowed_hosts[0]: must be a host name or an IP address without a port, like lab.local or "
     "192.168.1.20, or '*'; got 'lab.local:8080'"),
    ({**with_model(), "security": {"allowed_hosts": ["lab", "[::1]"]}}, "security.allowed_hosts[1]: must be a host"),
    ({**with_model(), "security": {"allowed_hosts": ["http://lab.local"]}}, "security.allowed_hosts[0]: must be"),
    ({**with_model(), "nodes": NODES, "capabilities": {"reasoning": ["qwen3-32b", "qwen3-70b"]}},
     "capabilities.reasoning[1]: names model 'qwen3-70b', which no node serves (nodes.NAME.models lists what each "
     "serves)"),
    ({**with_model(), "capabilities": {"reasoning": ["chat"]}},
     "capabilities: a capability chooses among the models of the nodes, and no node is configured (nodes)"),
    ({**with_model(), "nodes": {"lab": {"url": "http://192.168.1.20:8080"}}, "capabilities": {"smart": ["a\nb"]}},
     "capabilities.smart[0]: 'a\\nb' holds '\\n', a control or invisible character; a name is visible text"),
])
def test_what_run_cannot_take_is_refused_naming_the_key(raw: dict[str, Any], expected: str) -> None:
    found = problems(raw)
    assert any(problem.startswith(expected) for problem in found), found
    assert all(problem.isprintable() for problem in found), found


@pytest.mark.parametrize("raw", [
    # A chat template is text with line breaks and tabs; an environment value may hold any of them.
    with_model(args=["--chat-template", "{% for m in messages %}\n\t{{ m.content }}{% endfor %}"],
               env={"PROMPT": "line one\nline two", "PATH_WITH_SPACE": "/opt/my models"}),
    with_model(args=["--alias", "gpt-4o", "--api-key", "sk-\u00e9\u00e8"], aliases=["modèle", "模型"]),
    {**with_model(), "security": {"allowed_origins": ["*", "https://app.example.com", "http://localhost:3000",
                                                      "http://[::1]:8080", "https://app.example.com/"],
                                  "allowed_hosts": ["*", "lab.local", "192.168.1.20", "::1", "gpu-box.",
                                                    "my_service"]}},
    {**with_model(), "nodes": NODES, "capabilities": {"reasoning": ["qwen3-32b", "qwen3-8b"]}},
    # A node that lists no models serves what it says once it answers: any name may be one of them.
    {**with_model(), "nodes": {**NODES, "new": {"url": "http://192.168.1.22:8080"}},
     "capabilities": {"reasoning": ["qwen3-70b"]}},
    with_model(parallel=2**63 - 1),
])
def test_what_run_takes_is_accepted(raw: dict[str, Any]) -> None:
    run_would_start(parse_config(raw))


def test_a_problem_shows_what_a_key_holds_as_escapes_never_raw(tmp_path: Path) -> None:
    """A terminal must not act on a config's escape sequences (a colour, a cleared screen) or lose a line to them."""
    found = load_problems(tmp_path, 'models:\n  "chat\\e[2J": {command: llama-server, memory: 1GiB}\n'
                                    '"\\0": 1\n"": 2\n')
    assert found == ["\\x00: unknown key", "'': unknown key"]
    found = load_problems(tmp_path, 'models:\n  "chat\\e[2J": {command: llama-server, memory: 1GiB}\n')
    assert found == ["models.chat\\x1b[2J: a model name may hold letters, digits and ._:/- (no '@')"]


# --- models.NAME.fallback (issue 31) --------------------------------------------------------------

def test_a_fallback_chain_reaches_the_schedulers_profile_and_check_shows_it(capsys: pytest.CaptureFixture[str]) -> None:
    from supervisor.check import describe_route
    from supervisor.config_policy import fallback_routes
    from supervisor.request_class import RequestClass
    from supervisor.scheduler.types import FallbackRoute, FallbackWhen

    raw = {"models": {"big": {**GOOD, "fallback": [
        {"model": "small", "when": ["no_room", "wait"], "classes": ["background", "batch"], "wait": "20s"},
        {"model": "tiny", "when": ["failed"]}]}, "small": GOOD, "tiny": GOOD}}
    config = parse_config(raw)
    assert fallback_routes(config.models["big"].fallback) == (
        FallbackRoute("small", frozenset({FallbackWhen.NO_ROOM, FallbackWhen.WAIT}),
                      frozenset({RequestClass.BACKGROUND, RequestClass.BATCH}), 20.0),
        FallbackRoute("tiny", frozenset({FallbackWhen.FAILED})))
    assert [describe_route(route) for route in config.models["big"].fallback] == [
        "-> small for background, batch when no_room or wait (past 20s)", "-> tiny for every class when failed"]
    assert scheduling_policy(config).slo_wait[RequestClass.INTERACTIVE] == 30.0


@pytest.mark.parametrize(("route", "expected"), [
    ({"model": "nope", "when": ["wait"]}, "models.big.fallback[0].model: names model 'nope', which is not under models"),
    ({"model": "big", "when": ["wait"]}, "models.big.fallback[0].model: names the model itself"),
    ({"model": "tiny", "when": ["wait"]}, "models.big.fallback[0].model: 'tiny' is an alias; name the model, 'small'"),
    ({"model": "small", "when": []}, "models.big.fallback[0].when: name at least one of no_room, wait, failed"),
    ({"model": "small", "when": ["failed"], "wait": "5s"},
     "models.big.fallback[0].wait: a bound for `wait`, which is not in its `when`"),
    ({"model": "small", "when": ["soon"]}, "models.big.fallback[0].when[0]: must be one of 'no_room', 'wait', "
                                           "'failed', got 'soon'"),
])
def test_fallback_problems_name_the_route(route: dict[str, object], expected: str) -> None:
    raw = {"models": {"big": {**GOOD, "fallback": [route]}, "small": {**GOOD, "aliases": ["tiny"]}}}
    assert problems(raw) == [expected]


def test_a_fallback_to_a_remote_model_reaches_the_profile_marked_remote(monkeypatch: pytest.MonkeyPatch) -> None:
    from supervisor.check import describe_route
    from supervisor.config_policy import fallback_routes
    from supervisor.scheduler.types import FallbackRoute, FallbackWhen

    monkeypatch.setenv("CLOUD_KEY", "sk-test")
    raw = {"models": {"big": {**GOOD, "fallback": [{"model": "cloud", "when": ["wait"]}]},
                      "cloud": {"runtime": "remote", "upstream": "https://api.example.com/v1", "api": "openai",
                                "key_env": "CLOUD_KEY"}}}
    config = parse_config(raw)  # no problem: it would raise
    assert fallback_routes(config.models["big"].fallback, config.remote_models) == (
        FallbackRoute("cloud", frozenset({FallbackWhen.WAIT}), remote=True),)
    assert describe_route(config.models["big"].fallback[0], config.remote_models) == \
        "-> cloud (a cloud: runtime remote) for every class when wait (past the class's slo_wait)"
