"""API keys: the key file, ``steward keys``, the per-key limits and the reloading watcher.

The file and command tests use real files in tmp_path; the limits are pure and take explicit
times; the watcher runs on trio's real clock with a short interval, and every wait in it is
for a state (bounded by ``fail_after``), never for a fixed time.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import stat
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import yaml

import supervisor.config
from supervisor.auth.commands import add_keys_parser, format_key_table, run_keys
from supervisor.auth.keys import (
    KEY_PREFIX,
    ApiKey,
    KeyCommandError,
    KeyFile,
    KeyFileError,
    KeyTable,
    add_key,
    key_digest,
    list_keys,
    load_key_file,
    remove_key,
    write_key_file,
)
from supervisor.auth.limits import Admission, KeyLimiter, RefusalReason, Refused
from supervisor.auth.watch import serve_key_file
from supervisor.observe.events import EventLog

KNOWN = {"chat": "chat", "gpt-4o": "chat", "embed": "embed"}
WHEN = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def make_key(name: str = "agents", **limits: Any) -> ApiKey:
    return ApiKey(name=name, hash=key_digest(f"{KEY_PREFIX}{name}"), created=WHEN, **limits)


def keys_path(tmp_path: Path) -> Path:
    return tmp_path / "steward-keys.json"


# --- the key file -----------------------------------------------------------------------------------------


def test_add_writes_only_the_hash_in_a_private_file(tmp_path: Path) -> None:
    path = keys_path(tmp_path)
    text = add_key(path, "agents", models=["chat", "gpt-4o"], classes=["background", "batch"], rpm=30,
                   concurrency=2, known_models=KNOWN, now=WHEN)
    assert text.startswith(KEY_PREFIX) and len(text) == len(KEY_PREFIX) + 43
    content = path.read_text()
    assert text not in content and text[len(KEY_PREFIX):] not in content
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(content) == {"version": 1, "keys": [{
        "name": "agents", "hash": key_digest(text), "models": ["chat", "gpt-4o"], "classes": ["background", "batch"],
        "default_class": "background", "rpm": 30, "concurrency": 2, "admin": False, "no_remote": None,
        "created": "2025-06-01T12:00:00Z",
    }]}
    assert (tmp_path / "steward-keys.json.lock").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    assert "hash" not in repr(list_keys(path)[0]) and key_digest(text) not in repr(list_keys(path)[0])


def test_two_keys_are_never_the_same(tmp_path: Path) -> None:
    first, second = add_key(keys_path(tmp_path), "a"), add_key(keys_path(tmp_path), "b")
    assert first != second
    assert [key.name for key in list_keys(keys_path(tmp_path))] == ["a", "b"]


@pytest.mark.parametrize(("options", "problem"), [
    ({"name": "-bad"}, "NAME: '-bad' is not a key name"),
    ({"name": "x" * 65}, "is not a key name"),
    ({"name": KEY_PREFIX + "A" * 43}, f"NAME: '{KEY_PREFIX}...' is not a key name"),
    ({"classes": ["urgent"]}, "--classes: not a class: 'urgent' (classes: interactive, background, batch)"),
    ({"classes": []}, "--classes: name at least one class"),
    ({"classes": ["batch"], "default_class": "interactive"},
     "--default-class: 'interactive' is not one of the key's classes (batch)"),
    ({"rpm": 0}, "--rpm: must be a positive integer, got 0"),
    ({"concurrency": -1}, "--concurrency: must be a positive integer, got -1"),
    ({"models": ["llama3"]}, "--models: not a model or alias in the config: 'llama3' (known: chat, embed, gpt-4o)"),
    ({"models": []}, "--models: name at least one model"),
])
def test_add_refuses_bad_options_and_writes_nothing(tmp_path: Path, options: dict[str, Any], problem: str) -> None:
    name = options.pop("name", "agents")
    with pytest.raises(KeyCommandError) as caught:
        add_key(keys_path(tmp_path), name, known_models=KNOWN, **options)
    assert problem in str(caught.value)
    assert not keys_path(tmp_path).exists()


def test_add_refuses_a_name_taken(tmp_path: Path) -> None:
    add_key(keys_path(tmp_path), "agents")
    with pytest.raises(KeyCommandError, match="a key named 'agents' exists already"):
        add_key(keys_path(tmp_path), "agents")
    assert len(list_keys(keys_path(tmp_path))) == 1


def test_with_ollama_unknown_model_names_are_accepted(tmp_path: Path) -> None:
    add_key(keys_path(tmp_path), "local", models=["llama3.2:3b", "chat"], known_models=KNOWN, ollama=True)
    assert list_keys(keys_path(tmp_path))[0].models == ("llama3.2:3b", "chat")


def test_the_default_class_is_the_highest_allowed_or_the_listeners(tmp_path: Path) -> None:
    path = keys_path(tmp_path)
    add_key(path, "restricted", classes=["batch", "background"])
    add_key(path, "open")
    restricted, unrestricted = list_keys(path)
    assert restricted.classes == ("background", "batch") and restricted.default_class == "background"
    assert unrestricted.classes is None and unrestricted.default_class is None


def test_remove(tmp_path: Path) -> None:
    path = keys_path(tmp_path)
    add_key(path, "a")
    add_key(path, "b")
    assert remove_key(path, "a").name == "a"
    assert [key.name for key in list_keys(path)] == ["b"]
    with pytest.raises(KeyCommandError, match=r"no key named 'a' in .* \(keys: b\)"):
        remove_key(path, "a")


def test_concurrent_adds_are_serialized(tmp_path: Path) -> None:
    path = keys_path(tmp_path)
    with ThreadPoolExecutor(max_workers=8) as pool:
        texts = list(pool.map(lambda i: add_key(path, f"key{i}"), range(16)))
    assert sorted(key.name for key in list_keys(path)) == sorted(f"key{i}" for i in range(16))
    table = KeyTable.from_key_file(load_key_file(path))
    assert [table.lookup(text).name for text in texts] == [f"key{i}" for i in range(16)]  # type: ignore[union-attr]


def test_a_missing_file_has_no_keys(tmp_path: Path) -> None:
    assert load_key_file(keys_path(tmp_path)) == KeyFile()
    assert list_keys(keys_path(tmp_path)) == ()


def test_a_file_others_may_read_is_refused(tmp_path: Path) -> None:
    path = keys_path(tmp_path)
    add_key(path, "agents")
    path.chmod(0o644)
    with pytest.raises(KeyFileError) as caught:
        load_key_file(path)
    assert str(caught.value) == (f"{path}: others may read or write it (mode 0644); it holds key hashes, so steward "
                                 f"refuses it: run chmod 600 {path}")


def write_private(path: Path, content: str | bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "wb") as file:
        file.write(content.encode() if isinstance(content, str) else content)


def good_entry(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "hash": "0" * 64, "created": "2025-06-01T12:00:00Z", **fields}


@pytest.mark.parametrize(("content", "problems"), [
    ("", ["not valid JSON: Expecting value: line 1 column 1 (char 0)"]),
    ("[1]", ["(top level): must be a mapping of keys, got a list"]),
    ('{"version": 1, "version": 1}', ["not valid JSON: key 'version' given twice in one object"]),
    ({"version": 2, "keys": []}, ["version: must be one of 1, got 2"]),
    ({"version": 1, "keys": [good_entry("a"), good_entry("b"), good_entry("c", rpm=0)]},
     ["keys[2].rpm: must be a positive integer, got 0"]),
    ({"version": 1, "keys": [good_entry("a", models="chat", extra=1), {"name": "b"}]},
     ["keys[0].models: must be a list like [\"chat\"], got a string 'chat'", "keys[0]: unknown key: extra",
      "keys[1].hash: required key is missing", "keys[1].created: required key is missing"]),
    ({"version": 1, "keys": [good_entry("a", classes=["batch"], default_class="interactive"), good_entry("a")]},
     ["keys[0].default_class: 'interactive' is not one of the key's classes (batch)",
      "keys[1].name: 'a' is the name of keys[0] too"]),
    ({"version": 1, "keys": [good_entry("a", created="yesterday", admin="yes", classes=["now"])]},
     ["keys[0].classes[0]: must be one of 'interactive', 'background', 'batch', got 'now'",
      "keys[0].admin: must be true or false, got 'yes'",
      "keys[0].created: must be an ISO-8601 time like 2025-06-01T12:00:00Z, got 'yesterday'"]),
    (b"\xff\xfe", ["not UTF-8 text (byte 0)"]),
    ("[" * 100_000, ["not valid JSON: nested too deeply"]),
])
def test_a_bad_file_names_the_file_and_each_problem(tmp_path: Path, content: Any, problems: list[str]) -> None:
    path = keys_path(tmp_path)
    write_private(path, content if isinstance(content, str | bytes) else json.dumps(content))
    with pytest.raises(KeyFileError) as caught:
        load_key_file(path)
    assert caught.value.problems == problems
    assert str(caught.value) == "\n".join(f"{path}: {problem}" for problem in problems)


def test_a_key_pasted_into_the_file_is_never_quoted_back(tmp_path: Path) -> None:
    path = keys_path(tmp_path)
    text = "sk-steward-" + "A" * 43
    write_private(path, json.dumps({"version": 1, "keys": [good_entry("a", hash=text), good_entry(text)]}))
    with pytest.raises(KeyFileError) as caught:
        load_key_file(path)
    assert text not in str(caught.value) and "A" * 20 not in str(caught.value)
    assert caught.value.problems == [
        "keys[0].hash: must be the SHA-256 of the key as 64 lowercase hex digits (steward keys add writes it)",
        "keys[1].name: must be 1 to 64 letters, digits and ._- (starting with a letter or digit, not with "
        "sk-steward-), got 'sk-steward-...'"]


def test_an_unreadable_file_or_folder_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "folder").mkdir()
    with pytest.raises(KeyFileError, match="folder: cannot read the key file: not a regular file"):
        load_key_file(tmp_path / "folder")
    with pytest.raises(KeyFileError, match="cannot read the key file: embedded null byte"):
        load_key_file(tmp_path / "bad\0name")
    with pytest.raises(KeyFileError, match="cannot write the key file: No such file or directory"):
        write_key_file(tmp_path / "missing" / "keys.json", KeyFile())


def test_created_round_trips_in_utc(tmp_path: Path) -> None:
    path = keys_path(tmp_path)
    write_private(path, json.dumps({"version": 1, "keys": [good_entry("a", created="2025-06-01T14:00:00+02:00")]}))
    key_file = load_key_file(path)
    assert key_file.keys[0].created == WHEN
    write_key_file(path, key_file)
    assert json.loads(path.read_text())["keys"][0]["created"] == "2025-06-01T12:00:00Z"


# --- what the door uses -----------------------------------------------------------------------------------


def test_lookup_finds_the_key_whose_text_is_presented() -> None:
    keys = (make_key("a"), make_key("b"), make_key("c"))
    table = KeyTable.from_key_file(KeyFile(keys=keys))
    assert table.lookup(f"{KEY_PREFIX}b") is keys[1]
    assert table.lookup(f"{KEY_PREFIX}d") is None
    assert table.lookup("") is None
    assert table.lookup("\udcff not even text") is None
    assert table.get("c") is keys[2] and table.get("d") is None
    assert len(table) == 3 and not table.empty
    empty = KeyTable.from_key_file(KeyFile())
    assert empty.empty and len(empty) == 0 and empty.lookup(f"{KEY_PREFIX}a") is None


def test_what_a_key_may_do() -> None:
    key = make_key(models=("chat",), classes=("batch", "background"))
    assert key.may_use("chat") and not key.may_use("embed")
    assert key.allowed_classes == ("background", "batch")
    assert key.may_ask("batch") and not key.may_ask("interactive")
    assert key.default_class_or("interactive") == "background"
    assert key.default_class_or("batch") == "batch"
    assert attrs.evolve(key, default_class="batch").default_class_or("background") == "batch"
    anything = make_key()
    assert anything.may_use("whatever") and anything.allowed_classes == ("interactive", "background", "batch")
    assert anything.default_class_or("background") == "background"


# --- per-key limits, at explicit times --------------------------------------------------------------------


def admitted(result: Admission | Refused) -> Admission:
    assert isinstance(result, Admission), result
    return result


def refused(result: Admission | Refused) -> Refused:
    assert isinstance(result, Refused), result
    return result


def test_rpm_admits_at_most_n_in_any_minute() -> None:
    limiter = KeyLimiter()
    key = make_key(rpm=30)
    for second in range(30):
        limiter.release(admitted(limiter.admit(key, float(second))))
    assert refused(limiter.admit(key, 48.0)) == Refused(
        RefusalReason.RATE, "key 'agents' is limited to 30 requests per minute; try again in 12s", 12)
    assert refused(limiter.admit(key, 59.5)).retry_after == 1  # rounded up: 0.5 s
    admitted(limiter.admit(key, 60.0))  # the one of t=0 left the window
    assert refused(limiter.admit(key, 60.0)).retry_after == 1  # t=1 leaves at 61
    admitted(limiter.admit(key, 61.0))


def test_refusals_do_not_count_toward_the_rate() -> None:
    limiter = KeyLimiter()
    key = make_key(rpm=1)
    admitted(limiter.admit(key, 0.0))
    for second in range(1, 60):
        assert refused(limiter.admit(key, float(second))).retry_after == 60 - second
    admitted(limiter.admit(key, 60.0))


def test_concurrency_refuses_until_a_release() -> None:
    limiter = KeyLimiter()
    key = make_key(concurrency=2)
    first, _second = admitted(limiter.admit(key, 0.0)), admitted(limiter.admit(key, 0.0))
    assert refused(limiter.admit(key, 100.0)) == Refused(
        RefusalReason.CONCURRENCY, "key 'agents' is limited to 2 requests at a time; try again when one has finished",
        1)
    limiter.release(first)
    limiter.release(first)  # twice: harmless
    assert limiter.running("agents") == 1
    admitted(limiter.admit(key, 100.0))
    refused(limiter.admit(key, 100.0))


def test_rpm_and_concurrency_together() -> None:
    limiter = KeyLimiter()
    key = make_key(rpm=3, concurrency=1)
    first = admitted(limiter.admit(key, 0.0))
    assert refused(limiter.admit(key, 1.0)).reason is RefusalReason.CONCURRENCY
    limiter.release(first)
    limiter.release(admitted(limiter.admit(key, 2.0)))
    limiter.release(admitted(limiter.admit(key, 3.0)))
    assert refused(limiter.admit(key, 4.0)) == Refused(
        RefusalReason.RATE, "key 'agents' is limited to 3 requests per minute; try again in 56s", 56)


def test_keys_are_independent() -> None:
    limiter = KeyLimiter()
    one, other = make_key("one", rpm=1, concurrency=1), make_key("other", rpm=1, concurrency=1)
    admitted(limiter.admit(one, 0.0))
    refused(limiter.admit(one, 0.0))
    admitted(limiter.admit(other, 0.0))
    unlimited = make_key("unlimited")
    for _ in range(1000):
        admitted(limiter.admit(unlimited, 0.0))


def test_limits_survive_a_reload_and_removed_keys_are_forgotten() -> None:
    limiter = KeyLimiter()
    for second in range(10):
        admitted(limiter.admit(make_key(rpm=10), float(second)))
    # Reloaded with a lower rpm: wait until all but 4 of the 10 in the window have left.
    lowered = make_key(rpm=5)
    assert refused(limiter.admit(lowered, 10.0)).retry_after == 65 - 10
    limiter.forget(["agents"])
    assert limiter.running("agents") == 10
    old = admitted(limiter.admit(make_key(), 11.0))
    limiter.forget([])
    assert limiter.running("agents") == 0
    limiter.release(old)  # a request of the removed key ends: the new key of that name is not touched
    admitted(limiter.admit(make_key(concurrency=1), 12.0))
    refused(limiter.admit(make_key(concurrency=1), 12.0))


# --- `steward keys` end to end ----------------------------------------------------------------------------


def keys_command(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="steward")
    add_keys_parser(parser.add_subparsers(dest="command", required=True))
    return run_keys(parser.parse_args(["keys", *argv]))


@pytest.fixture
def config_path(tmp_path: Path) -> str:
    if not hasattr(supervisor.config, "AuthConfig"):
        pytest.skip("supervisor.config has no AuthConfig (auth.keys_file) yet")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "gpu": {"probe": "none", "budget": "16GiB"},
        "auth": {"keys_file": str(keys_path(tmp_path))},
        "models": {"chat": {"command": "llama-server", "memory": "1GiB", "aliases": ["gpt-4o"]}},
    }))
    return str(path)


def test_keys_add_list_remove(config_path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert keys_command("add", "agents", "--config", config_path, "--models", "gpt-4o", "--classes",
                        "background,batch", "--rpm", "30", "--concurrency", "2") == 0
    out, err = capsys.readouterr()
    text = out.strip()
    assert out == text + "\n" and text.startswith(KEY_PREFIX)
    assert "Store it now: it is not shown again." in err and text not in err
    assert keys_command("add", "admin", "--config", config_path, "--admin", "--default-class", "batch") == 0
    capsys.readouterr()

    assert keys_command("list", "--config", config_path) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0].split() == ["NAME", "MODELS", "CLASSES", "DEFAULT", "RPM", "CONCURRENCY", "ADMIN",
                                           "REMOTE", "BUDGETS", "CREATED"]
    assert out.splitlines()[1].split()[:8] == ["agents", "gpt-4o", "background,batch", "background", "30", "2", "no",
                                               "listed"]
    assert out.splitlines()[2].split()[:8] == ["admin", "all", "all", "batch", "-", "-", "yes", "no"]
    assert key_digest(text) not in out and err == ""

    assert keys_command("remove", "agents", "--config", config_path) == 0
    assert keys_command("remove", "agents", "--config", config_path) == 2
    out, err = capsys.readouterr()
    assert "no key named 'agents'" in err and "Traceback" not in err
    assert [key.name for key in list_keys(keys_path(tmp_path))] == ["admin"]


def test_keys_errors_exit_2_without_a_traceback(config_path: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert keys_command("add", "agents", "--config", config_path, "--models", "llama3", "--rpm", "0") == 2
    _, err = capsys.readouterr()
    assert err == ("steward: --rpm: must be a positive integer, got 0\n"
                   "steward: --models: not a model or alias in the config: 'llama3' (known: chat, gpt-4o)\n")
    write_private(keys_path(tmp_path), "{")
    assert keys_command("list", "--config", config_path) == 2
    _, err = capsys.readouterr()
    assert err.startswith(f"steward: {keys_path(tmp_path)}: not valid JSON") and "Traceback" not in err
    assert keys_command("list", "--config", str(tmp_path / "missing.yaml")) == 2
    assert "is not a valid config" in capsys.readouterr().err


def test_keys_list_of_no_keys(config_path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert keys_command("list", "--config", config_path) == 0
    assert capsys.readouterr().out == f"no keys in {keys_path(tmp_path)}\n"
    assert format_key_table([]) == ""


def test_keys_add_with_ollama_notes_unknown_models(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if not hasattr(supervisor.config, "AuthConfig"):
        pytest.skip("supervisor.config has no AuthConfig (auth.keys_file) yet")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"models": {}, "ollama": {"upstream": "127.0.0.1:11435"},
                                    "auth": {"keys_file": str(keys_path(tmp_path))}}))
    assert keys_command("add", "local", "--config", str(path), "--models", "llama3.2:3b") == 0
    err = capsys.readouterr().err
    assert "note: not a model or alias in the config: llama3.2:3b; accepted as Ollama's own model names" in err


# --- reloading while steward runs -------------------------------------------------------------------------


watch_quickly = functools.partial(serve_key_file, interval=0.05)


async def wait_until(condition: Callable[[], bool]) -> None:
    with trio.fail_after(20):
        while not condition():
            await trio.sleep(0.01)


def event_log() -> EventLog:
    send, _receive = trio.open_memory_channel[Any](math.inf)
    return EventLog(send, recent_max=1000)


def events_named(events: EventLog, name: str) -> list[dict[str, Any]]:
    return [event.fields for event in events.recent if event.name == name]


async def test_the_watcher_picks_up_added_and_removed_keys(tmp_path: Path) -> None:
    path = keys_path(tmp_path)
    events = event_log()
    tables: list[KeyTable] = []
    async with trio.open_nursery() as nursery:
        first = await nursery.start(watch_quickly, str(path), events, tables.append)
        assert first.empty and tables == [first]  # no file yet: no keys
        text = add_key(path, "agents")
        await wait_until(lambda: len(tables[-1]) == 1)
        assert tables[-1].lookup(text) == tables[-1].get("agents")

        add_key(path, "other")
        remove_key(path, "agents")
        await wait_until(lambda: tables[-1].get("agents") is None and tables[-1].get("other") is not None)
        good = tables[-1]

        count = len(tables)
        path.write_text('{"version": 1, "keys": [')  # a hand edit, half done
        await wait_until(lambda: bool(events_named(events, "keys_file_invalid")))
        assert len(tables) == count and tables[-1] is good  # the keys in force stay

        write_key_file(path, KeyFile(keys=(*good.keys, make_key("third"))))
        await wait_until(lambda: tables[-1].get("third") is not None)
        assert tables[-1].get("other") == good.get("other")
        nursery.cancel_scope.cancel()

    assert events_named(events, "keys_loaded")[0] == {"path": str(path), "keys": 0, "added": [], "removed": [],
                                                      "changed": []}
    assert events_named(events, "keys_loaded")[1] == {"path": str(path), "keys": 1, "added": ["agents"],
                                                      "removed": [], "changed": []}
    assert events_named(events, "keys_loaded")[-1] == {"path": str(path), "keys": 2, "added": ["third"],
                                                       "removed": [], "changed": []}
    assert events_named(events, "keys_file_invalid")[0] == {
        "path": str(path), "detail": "not valid JSON: Expecting value: line 1 column 25 (char 24)"}
    logged = " ".join(str(event) for event in events.recent)
    assert text not in logged and key_digest(text) not in logged and "hash" not in logged


async def test_the_watcher_says_when_a_bad_file_is_good_again(tmp_path: Path) -> None:
    path = keys_path(tmp_path)
    add_key(path, "agents")
    before = path.read_bytes()
    events = event_log()
    tables: list[KeyTable] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(watch_quickly, str(path), events, tables.append)
        path.chmod(0o644)
        await wait_until(lambda: bool(events_named(events, "keys_file_invalid")))
        assert "run chmod 600" in events_named(events, "keys_file_invalid")[0]["detail"]
        path.chmod(0o600)
        await wait_until(lambda: len(events_named(events, "keys_loaded")) == 2)
        nursery.cancel_scope.cancel()
    assert path.read_bytes() == before
    assert len(tables) == 1  # nothing changed: no new table
    assert events_named(events, "keys_loaded")[1] == {"path": str(path), "keys": 1, "added": [], "removed": [],
                                                      "changed": []}


async def test_a_bad_file_at_start_is_an_error_before_started(tmp_path: Path) -> None:
    path = keys_path(tmp_path)
    write_private(path, "{}garbage")
    tables: list[KeyTable] = []
    async with trio.open_nursery() as nursery:
        with pytest.raises(KeyFileError, match="not valid JSON: Extra data"):
            await nursery.start(serve_key_file, str(path), event_log(), tables.append)
    assert tables == []


async def test_a_changed_key_is_reloaded(tmp_path: Path) -> None:
    path = keys_path(tmp_path)
    write_key_file(path, KeyFile(keys=(make_key(rpm=10),)))
    events = event_log()
    tables: list[KeyTable] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(watch_quickly, str(path), events, tables.append)
        write_key_file(path, KeyFile(keys=(make_key(rpm=20),)))
        await wait_until(lambda: tables[-1].get("agents").rpm == 20)  # type: ignore[union-attr]
        nursery.cancel_scope.cancel()
    assert events_named(events, "keys_loaded")[-1]["changed"] == ["agents"]


def test_the_first_key_warns_that_loopback_and_the_tools_need_a_key_now(config_path: str,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert keys_command("add", "app", "--config", config_path) == 0
    err = capsys.readouterr().err
    assert ("steward: this is the first key: from now on every client needs a key, loopback clients too, and so do "
            "`steward top`, `ps`, `load`, `unload`, `pin`, `unpin` and `reload` (an admin key).\n") in err
    assert ("steward: those tools find the key in $STEWARD_KEY (or --key): export STEWARD_KEY=<an admin key>; this key "
            "is not one: make one with `steward keys add NAME --admin --config CONFIG`\n") in err
    assert keys_command("add", "ops", "--config", config_path, "--admin") == 0
    assert "first key" not in capsys.readouterr().err  # said once, with the first key only
    assert keys_command("remove", "app", "--config", config_path) == 0
    assert keys_command("remove", "ops", "--config", config_path) == 0
    assert keys_command("add", "ops", "--config", config_path, "--admin") == 0
    err = capsys.readouterr().err
    assert err.endswith("those tools find the key in $STEWARD_KEY (or --key): export STEWARD_KEY=<an admin key>\n")
