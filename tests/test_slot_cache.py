"""keep_cache: a conversation's slot KV cache saved when its model is evicted, restored when it loads
again (supervisor/slot_cache/), against fake llama-servers in this process (no child process):
the save picks the slots with the most cached tokens within the bounds, the restore lets the next
turn find its prompt (``cache_n``), a changed engine (fingerprint) is refused, the folder's total
cap and expiry, and every failure is an event, never an exception."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio

from fakes.llama_server.cli import Log, parse_config
from fakes.llama_server.server import FakeLlamaServer
from supervisor.config import ConfigError
from supervisor.config.loading import parse_config as parse_steward_config
from supervisor.config_policy import engine_specs
from supervisor.observe.events import EventLog
from supervisor.scheduler.types import ReloadCost
from supervisor.slot_cache.fingerprint import cache_types, changed, fingerprint
from supervisor.slot_cache.keeper import SlotKeeper
from supervisor.slot_cache.plan import SlotCachePlan
from supervisor.slot_cache.store import CacheFolder, SavedSet, SavedSlot

SYSTEM = "You are a coding agent. " + " ".join(f"line {i}: def f{i}(x): return x * {i}" for i in range(150))


@asynccontextmanager
async def fake_llama(save_dir: Path, *flags: str) -> AsyncIterator[str]:
    """A fake llama-server in this process, started with --slot-save-path; its base URL."""
    cfg = parse_config(["--port", "0", "--tokens-per-second", "0", "-np", "2", "-c", "8192",
                        "--slot-save-path", str(save_dir), *flags])
    server = FakeLlamaServer(cfg, Log(enabled=False))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.http.serve, "127.0.0.1", 0)
        await server.load(port)
        yield f"http://127.0.0.1:{port}"
        nursery.cancel_scope.cancel()


def make_plan(root: Path, model: str = "chat", **changes: Any) -> SlotCachePlan:
    plan = SlotCachePlan(CacheFolder(root), model, slots=1, max_bytes=1 << 30, min_tokens=16,
                         total_bytes=1 << 30, keep_s=3600.0, save_within=10.0, restore_within=10.0,
                         cache_types=("f16", "f16"))
    return attrs.evolve(plan, **changes)


def events_log() -> EventLog:
    send, _ = trio.open_memory_channel[Any](10_000)
    return EventLog(send, recent_max=10_000)


def emitted(events: EventLog, name: str) -> list[dict[str, Any]]:
    return [event.fields for event in events.recent if event.name == name]


def turn(system: str, *exchanges: str) -> list[dict[str, str]]:
    """A conversation: the system prompt, then user and assistant messages in turn."""
    roles = ["user", "assistant"] * len(exchanges)
    return [{"role": "system", "content": system}, *({"role": r, "content": c} for r, c in zip(roles, exchanges))]


async def chat(http: httpx.AsyncClient, base: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    answer = await http.post(f"{base}/v1/chat/completions", json={"messages": messages, "max_tokens": 4})
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as client:
        yield client


# ---- the folder


def test_a_new_set_replaces_the_last_and_its_files_and_leftovers_go(tmp_path: Path) -> None:
    folder = CacheFolder(tmp_path)
    target = folder.prepare("org/model:7b")  # a model name's '/' and ':' make one folder
    assert target.parent == tmp_path and target.name == "org%2Fmodel%3A7b"
    (target / "old.bin").write_bytes(b"x" * 10)
    folder.write("org/model:7b", SavedSet({"n_ctx": 1}, 1.0, (SavedSlot("old.bin", 100, 10),)))
    (target / "new.bin").write_bytes(b"y" * 20)
    (target / "cut-short.bin").write_bytes(b"z")
    folder.write("org/model:7b", SavedSet({"n_ctx": 1}, 2.0, (SavedSlot("new.bin", 200, 20),)))
    assert not (target / "old.bin").exists()
    folder.prepare("org/model:7b")  # a file no manifest lists (a save cut short) goes at the next save
    assert sorted(p.name for p in target.iterdir()) == ["manifest.json", "new.bin"]
    assert folder.sets() == {"org/model:7b": SavedSet({"n_ctx": 1}, 2.0, (SavedSlot("new.bin", 200, 20),))}


def test_a_manifest_that_is_not_steward_s_reads_as_no_save(tmp_path: Path) -> None:
    folder = CacheFolder(tmp_path)
    target = folder.prepare("chat")
    for text in ("not json", "[]", json.dumps({"fingerprint": {}, "saved_at": 1, "slots": [
            {"file": "../../etc/passwd.bin", "tokens": 1, "nbytes": 1}]})):
        (target / "manifest.json").write_text(text)
        assert folder.read("chat") is None


def test_prune_drops_expired_sets_then_the_oldest_past_the_cap(tmp_path: Path) -> None:
    folder = CacheFolder(tmp_path)
    for model, saved_at, nbytes in (("old", 100.0, 10), ("mid", 900.0, 40), ("new", 950.0, 40), ("newest", 990.0, 40)):
        target = folder.prepare(model)
        (target / "a.bin").write_bytes(b"x" * nbytes)
        folder.write(model, SavedSet({}, saved_at, (SavedSlot("a.bin", 50, nbytes),)))
    pruned = folder.prune(keep_s=500.0, max_bytes=80, now=1000.0)
    assert [(p.model, p.why, p.nbytes) for p in pruned] == [("old", "expired", 10), ("mid", "cap", 40)]
    assert sorted(folder.sets()) == ["new", "newest"]
    assert not (folder.model_dir("mid") / "a.bin").exists()


# ---- the fingerprint


def test_cache_types_come_from_the_args_over_the_environment() -> None:
    assert cache_types([], {}) == ("f16", "f16")
    assert cache_types(["-ctk", "q8_0", "--cache-type-v=q4_0"], {"LLAMA_ARG_CACHE_TYPE_K": "bf16"}) == ("q8_0", "q4_0")
    assert cache_types([], {"LLAMA_ARG_CACHE_TYPE_V": "q8_0"}) == ("f16", "q8_0")


def test_the_fingerprint_names_the_model_file_by_path_size_and_time(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 60)
    props = {"model_path": str(model), "default_generation_settings": {"n_ctx": 4096}, "total_slots": 2,
             "build_info": "b1-0c1e570"}
    before = fingerprint(props, ("f16", "f16"))
    assert before["model_size"] == 64 and before["n_ctx"] == 4096
    assert changed(before, fingerprint(props, ("f16", "f16"))) == []
    assert changed(before, fingerprint({**props, "total_slots": 4}, ("f16", "q8_0"))) == ["cache_type_v", "total_slots"]
    model.write_bytes(b"GGUF" + b"\1" * 61)  # replaced in place: another size (and, mostly, time)
    assert "model_size" in changed(before, fingerprint(props, ("f16", "f16")))


# ---- save and restore against the fake


async def test_an_evicted_conversation_is_saved_and_its_next_turn_finds_its_prompt(
        tmp_path: Path, http: httpx.AsyncClient) -> None:
    plan = make_plan(tmp_path / "cache")
    events = events_log()
    keeper = SlotKeeper(plan, events)
    async with fake_llama(Path(plan.save_path)) as base:
        await trio.to_thread.run_sync(plan.folder.prepare, "chat")
        first = await chat(http, base, turn(SYSTEM, "What does f3 return?"))
        await chat(http, base, turn("Short.", "hi"))  # the other slot: fewer tokens, not kept (slots: 1)
        assert first["timings"]["cache_n"] == 0
        seconds = await keeper.save(http, base)
    saved = emitted(events, "cache_saved")
    assert len(saved) == 1 and saved[0]["slots"] == 1 and saved[0]["tokens"] == first["usage"]["prompt_tokens"]
    assert saved[0]["left_out"] == ["slot 1: beyond keep_cache.slots"] and seconds >= 0
    kept = plan.folder.read("chat")
    assert kept is not None and [s.tokens for s in kept.slots] == [first["usage"]["prompt_tokens"]]

    async with fake_llama(Path(plan.save_path)) as base:  # the model's next load: a fresh process
        await keeper.restore(http, base)
        restored = emitted(events, "cache_restored")
        assert len(restored) == 1 and restored[0]["tokens"] == first["usage"]["prompt_tokens"]
        await chat(http, base, turn("Another conversation.", "hi"))  # the free slot is taken first
        following = await chat(http, base, turn(SYSTEM, "What does f3 return?", "3 * x", "And f4?"))
    assert following["timings"]["cache_n"] == first["usage"]["prompt_tokens"]


async def test_a_changed_engine_is_never_restored_into_and_its_save_is_deleted(
        tmp_path: Path, http: httpx.AsyncClient) -> None:
    plan = make_plan(tmp_path / "cache")
    events = events_log()
    async with fake_llama(Path(plan.save_path)) as base:
        await trio.to_thread.run_sync(plan.folder.prepare, "chat")
        await chat(http, base, turn(SYSTEM, "q"))
        await SlotKeeper(plan, events).save(http, base)
    assert plan.folder.read("chat") is not None
    async with fake_llama(Path(plan.save_path), "-c", "16384") as base:  # another --ctx-size: another n_ctx
        keeper = SlotKeeper(plan, events)
        await keeper.restore(http, base)
        answer = await chat(http, base, turn(SYSTEM, "q", "a", "q2"))
    skipped = emitted(events, "cache_skipped")
    assert [(s["action"], s["why"], s["changed"]) for s in skipped] == [("restore", "fingerprint", ["n_ctx"])]
    assert not emitted(events, "cache_restored") and keeper.restored == {}
    assert answer["timings"]["cache_n"] == 0
    assert plan.folder.read("chat") is None  # never restored by a later load either
    # Other cache types (the args only say them) are refused the same way.
    async with fake_llama(Path(plan.save_path)) as base:
        await chat(http, base, turn(SYSTEM, "q"))
        await SlotKeeper(plan, events).save(http, base)
    async with fake_llama(Path(plan.save_path)) as base:
        await SlotKeeper(attrs.evolve(plan, cache_types=("q8_0", "q8_0")), events).restore(http, base)
    assert emitted(events, "cache_skipped")[-1]["changed"] == ["cache_type_k", "cache_type_v"]


async def test_the_save_keeps_the_fullest_slots_within_its_count_and_bytes(
        tmp_path: Path, http: httpx.AsyncClient) -> None:
    events = events_log()
    plan = make_plan(tmp_path / "cache", slots=2)
    async with fake_llama(Path(plan.save_path)) as base:
        await trio.to_thread.run_sync(plan.folder.prepare, "chat")
        long = await chat(http, base, turn(SYSTEM, "q"))
        short = await chat(http, base, turn(SYSTEM[: len(SYSTEM) // 2], "q"))
        await SlotKeeper(plan, events).save(http, base)
        kept = plan.folder.read("chat")
        assert kept is not None
        assert [s.tokens for s in kept.slots] == [long["usage"]["prompt_tokens"], short["usage"]["prompt_tokens"]]
        # A byte bound that holds the fuller slot only: the other is left out, and said so.
        one = kept.slots[0].nbytes
        await SlotKeeper(attrs.evolve(plan, max_bytes=one + 10), events).save(http, base)
        assert [s.tokens for s in plan.folder.read("chat").slots] == [long["usage"]["prompt_tokens"]]  # type: ignore[union-attr]
        assert "keep_cache.max_bytes" in emitted(events, "cache_saved")[-1]["left_out"][0]
        # No slot holds min_tokens: nothing is kept (the last save goes), said as nothing_cached.
        await SlotKeeper(attrs.evolve(plan, min_tokens=10**6), events).save(http, base)
    assert emitted(events, "cache_skipped")[-1]["why"] == "nothing_cached"
    assert plan.folder.read("chat") is None


async def test_the_folder_s_cap_and_expiry_drop_the_oldest_saves(tmp_path: Path, http: httpx.AsyncClient) -> None:
    events = events_log()
    root = tmp_path / "cache"
    first, second = make_plan(root, "first"), make_plan(root, "second")
    async with fake_llama(Path(first.save_path)) as base:
        await trio.to_thread.run_sync(first.folder.prepare, "first")
        await chat(http, base, turn(SYSTEM, "q"))
        await SlotKeeper(first, events).save(http, base)
    one = first.folder.read("first").nbytes  # type: ignore[union-attr]
    async with fake_llama(Path(second.save_path)) as base:
        await trio.to_thread.run_sync(second.folder.prepare, "second")
        await chat(http, base, turn(SYSTEM, "q"))
        await SlotKeeper(attrs.evolve(second, total_bytes=one + one // 2), events).save(http, base)
    assert [(p["engine"], p["why"]) for p in emitted(events, "cache_pruned")] == [("first", "cap")]
    assert sorted(second.folder.sets()) == ["second"]
    # A save older than kv_cache.keep is deleted, never restored.
    backdate(second, 60)
    async with fake_llama(Path(second.save_path)) as base:
        await SlotKeeper(attrs.evolve(second, keep_s=30), events).restore(http, base)
    assert emitted(events, "cache_skipped")[-1]["why"] == "expired"
    assert second.folder.read("second") is None


def backdate(plan: SlotCachePlan, seconds: float) -> None:
    """Make the plan's save *seconds* older (the manifest's wall time), as if it were kept that long."""
    saved = plan.folder.read(plan.model)
    assert saved is not None
    plan.folder.write(plan.model, attrs.evolve(saved, saved_at=time.time() - seconds))


async def test_a_failed_or_slow_save_is_an_event_and_the_stop_goes_on(tmp_path: Path, http: httpx.AsyncClient) -> None:
    events = events_log()
    plan = make_plan(tmp_path / "cache")
    async with fake_llama(Path(plan.save_path), "--fake-slot-fail") as base:
        await chat(http, base, turn(SYSTEM, "q"))
        await SlotKeeper(plan, events).save(http, base)
        await SlotKeeper(plan, events).restore(http, base)  # nothing saved: nothing to restore, no event
    assert [(s["action"], s["why"]) for s in emitted(events, "cache_skipped")] == [("save", "failed")]
    assert "500" in emitted(events, "cache_skipped")[0]["detail"]
    async with fake_llama(Path(plan.save_path), "--fake-slot-delay", "30s") as base:
        await chat(http, base, turn(SYSTEM, "q"))
        start = trio.current_time()
        seconds = await SlotKeeper(attrs.evolve(plan, save_within=0.3), events).save(http, base)
        assert trio.current_time() - start < 10  # cut at save_within, not the fake's 30 s
    assert seconds >= 0.3
    skipped = emitted(events, "cache_skipped")[-1]
    assert (skipped["action"], skipped["why"]) == ("save", "deadline")
    assert "save_within" in skipped["detail"]
    assert not emitted(events, "cache_saved")


async def test_an_engine_without_the_slot_api_is_a_failed_restore_not_an_error(
        tmp_path: Path, http: httpx.AsyncClient) -> None:
    events = events_log()
    plan = make_plan(tmp_path / "cache")
    async with fake_llama(Path(plan.save_path)) as base:
        await trio.to_thread.run_sync(plan.folder.prepare, "chat")
        await chat(http, base, turn(SYSTEM, "q"))
        await SlotKeeper(plan, events).save(http, base)
    kept = plan.folder.read("chat")
    assert kept is not None
    (Path(plan.save_path) / kept.slots[0].file).unlink()  # its file went missing
    async with fake_llama(Path(plan.save_path)) as base:
        await SlotKeeper(plan, events).restore(http, base)
    skipped = emitted(events, "cache_skipped")[-1]
    assert (skipped["action"], skipped["why"]) == ("restore", "failed")


# ---- the config and the scheduler's cost


def steward_config(model: dict[str, Any], **sections: Any) -> Any:
    return parse_steward_config({"models": {"chat": model}, **sections})


def test_keep_cache_adds_the_save_path_and_is_refused_where_it_cannot_work(tmp_path: Path) -> None:
    model = {"command": ["/opt/llama-server"], "memory": "1GiB", "args": ["-ctv", "q8_0"],
             "keep_cache": {"slots": 2, "max_bytes": "1GiB"}}
    config = steward_config(model, kv_cache={"dir": str(tmp_path / "kv"), "max_bytes": "512MiB"})
    spec = engine_specs(config)["chat"]
    assert spec.slot_cache is not None and spec.slot_cache.max_bytes == 512 * 2**20  # the folder's cap bounds it
    assert spec.slot_cache.cache_types == ("f16", "q8_0")
    argv = spec.command(8000)
    assert argv is not None and argv[argv.index("--slot-save-path") + 1] == str(tmp_path / "kv" / "chat")
    assert "--slot-save-path" not in (engine_specs(steward_config({**model, "keep_cache": None}))["chat"].command(1) or [])
    with pytest.raises(ConfigError) as refused:
        steward_config({**model, "args": ["--slot-save-path", "/tmp/x"]})
    assert "models.chat.args: --slot-save-path is steward's" in str(refused.value)
    with pytest.raises(ConfigError) as refused:
        steward_config({"runtime": "openai", "command": ["vllm", "${PORT}"], "memory": "1GiB", "keep_cache": {}})
    assert "models.chat.keep_cache: only a llama-server" in str(refused.value)
    with pytest.raises(ConfigError) as refused:
        steward_config({**model, "keep_cache": {"slots": 0}})
    assert "models.chat.keep_cache.slots" in str(refused.value)


def test_a_measured_save_joins_the_cost_of_evicting() -> None:
    cost = ReloadCost(load_s=10.0, measured=True, recent_uses=0.0, queued=True, save_s=1.5)
    assert cost.cost == 11.5 and cost.fields()["save_s"] == 1.5
    assert ReloadCost(load_s=10.0, measured=True, recent_uses=0.0, queued=False, save_s=1.5).cost == 1.5


async def test_a_restored_slot_no_request_used_is_saved_again(tmp_path: Path, http: httpx.AsyncClient) -> None:
    """A restored slot says nothing of its cache in /slots until it runs a task: the keeper knows
    what it restored, so an eviction before the next turn keeps the conversation all the same."""
    events = events_log()
    plan = make_plan(tmp_path / "cache")
    keeper = SlotKeeper(plan, events)
    async with fake_llama(Path(plan.save_path)) as base:
        await trio.to_thread.run_sync(plan.folder.prepare, "chat")
        first = await chat(http, base, turn(SYSTEM, "q"))
        await keeper.save(http, base)
    async with fake_llama(Path(plan.save_path)) as base:
        await keeper.restore(http, base)
        await keeper.save(http, base)  # evicted again before anyone asked
    async with fake_llama(Path(plan.save_path)) as base:
        await keeper.restore(http, base)
        following = await chat(http, base, turn(SYSTEM, "q", "a", "q2"))
    assert [e["tokens"] for e in emitted(events, "cache_saved")] == [first["usage"]["prompt_tokens"]] * 2
    assert following["timings"]["cache_n"] == first["usage"]["prompt_tokens"]


def test_a_folder_that_cannot_be_made_is_an_event(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    events = events_log()
    SlotKeeper(make_plan(tmp_path / "a-file" / "cache"), events).before_spawn()
    skipped = emitted(events, "cache_skipped")
    assert [(s["action"], s["why"]) for s in skipped] == [("start", "failed")]
