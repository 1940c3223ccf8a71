"""keep_cache through a running steward: a model evicted for another saves its conversation's
slot after the drain and before the stop, and its next load restores it before the first request,
whose answer's ``timings.cache_n`` says the prompt was found computed: with fake llama-servers
(eviction for memory), and with the REAL llama-server and SmolLM2-135M (an admin's unload)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from fakes.llama_binary import llama_server_path
from fakes.real_model import smollm2_gguf
from tests.conftest import RunningSteward, StewardFactory, fake_model

pytestmark = pytest.mark.slow  # every test here starts steward as a real process

SYSTEM = "You are a coding agent. " + " ".join(f"line {i}: def f{i}(x): return x * {i}" for i in range(60))


def ask(steward: RunningSteward, model: str, messages: list[dict[str, str]], timeout: float = 60) -> dict[str, Any]:
    answer = httpx.post(f"{steward.base_url}/chat/completions", timeout=timeout,
                        json={"model": model, "messages": messages, "max_tokens": 4, "temperature": 0})
    assert answer.status_code == 200, answer.text
    return answer.json()


def conversation(system: str, *turns: str) -> list[dict[str, str]]:
    roles = ["user", "assistant"] * len(turns)
    return [{"role": "system", "content": system}, *({"role": r, "content": t} for r, t in zip(roles, turns))]


def test_an_evicted_model_s_conversation_is_saved_and_restored_for_its_next_turn(
        start_steward: StewardFactory, tmp_path: Path) -> None:
    keep = {"slots": 1, "min_tokens": 64}
    steward = start_steward(
        {"a": fake_model("3GiB", keep_cache=keep), "b": fake_model("3GiB", keep_cache=keep)},
        gpu={"probe": "none", "budget": "4GiB"}, kv_cache={"dir": str(tmp_path / "kv")})
    first = ask(steward, "a", conversation(SYSTEM, "What does f3 return?"))
    assert first["timings"]["cache_n"] == 0
    ask(steward, "b", conversation("Short.", "hi"))  # a is evicted for b: drained, saved, stopped
    saved = steward.wait_event("cache_saved", engine="a")
    assert saved["tokens"] == first["usage"]["prompt_tokens"] and saved["slots"] == 1
    names = [e["event"] for e in steward.events() if e.get("engine") == "a" and e["event"] in
             ("evict", "cache_saved", "exit", "stopped")]
    assert names[:3] == ["evict", "cache_saved", "exit"]  # after the drain, before the stop
    following = ask(steward, "a", conversation(SYSTEM, "What does f3 return?", "3 * x", "And f4?"))
    restored = steward.wait_event("cache_restored", engine="a")
    assert restored["tokens"] == first["usage"]["prompt_tokens"]
    assert following["timings"]["cache_n"] == first["usage"]["prompt_tokens"]
    # b held too little (min_tokens) to be worth a file, and said so.
    assert steward.wait_event("cache_skipped", engine="b")["why"] == "nothing_cached"
    evict_b = steward.wait_event("evict", engine="b")
    assert evict_b["save_s"] == 0  # b saved nothing before: its eviction costs no save yet
    # a's next eviction carries its measured save time in its cost.
    ask(steward, "b", conversation("Short.", "hi"))
    evicted_again = [e for e in steward.events("evict") if e["engine"] == "a"][-1]
    assert evicted_again["save_s"] == pytest.approx(saved["seconds"], abs=1e-3)
    metrics = httpx.get(f"{steward.url}/metrics", timeout=5).text
    assert 'steward_kv_cache_total{engine="a",outcome="saved"}' in metrics
    assert 'steward_kv_cache_total{engine="a",outcome="restored"} 1.0' in metrics


def test_a_failed_save_is_an_event_and_the_eviction_goes_on(start_steward: StewardFactory, tmp_path: Path) -> None:
    keep = {"slots": 1, "min_tokens": 64}
    steward = start_steward(
        {"a": fake_model("3GiB", keep_cache=keep, extra=["--fake-slot-fail"]), "b": fake_model("3GiB")},
        gpu={"probe": "none", "budget": "4GiB"}, kv_cache={"dir": str(tmp_path / "kv")})
    ask(steward, "a", conversation(SYSTEM, "q"))
    ask(steward, "b", conversation("Short.", "hi"))  # served: the failed save held nothing up
    skipped = steward.wait_event("cache_skipped", engine="a")
    assert (skipped["action"], skipped["why"]) == ("save", "failed")
    assert not steward.events("cache_saved")


@pytest.fixture
def real_llama() -> tuple[str, str]:
    return str(llama_server_path()), str(smollm2_gguf())  # fails (never skips) with the command when missing


def test_the_real_llama_server_restores_an_unloaded_conversation(
        start_steward: StewardFactory, tmp_path: Path, real_llama: tuple[str, str]) -> None:
    binary, model = real_llama
    system = "You are a helpful assistant. " + " ".join(f"Note {i}: item {i * 7 % 13}." for i in range(60))
    steward = start_steward(
        {"smollm2": {"command": binary, "model": model, "args": ["-c", "2048", "--threads", "1"], "parallel": 1,
                     "keep_cache": {"slots": 1, "min_tokens": 64}}},
        gpu={"probe": "host", "budget": "4GiB"}, kv_cache={"dir": str(tmp_path / "kv")})
    first = ask(steward, "smollm2", conversation(system, "What is note 5?"), timeout=120)
    assert first["timings"]["cache_n"] == 0
    unloaded = httpx.post(f"{steward.url}/admin/engines/smollm2/unload", timeout=30)
    assert unloaded.status_code == 200, unloaded.text
    saved = steward.wait_event("cache_saved", engine="smollm2", timeout=30)
    assert saved["tokens"] >= first["usage"]["prompt_tokens"] and saved["bytes"] > 0
    steward.wait_event("stopped", engine="smollm2", timeout=30)
    reply = first["choices"][0]["message"]["content"]
    following = ask(steward, "smollm2", conversation(system, "What is note 5?", reply, "And note 6?"), timeout=120)
    restored = steward.wait_event("cache_restored", engine="smollm2")
    assert restored["tokens"] == saved["tokens"]
    # The restored slot was chosen by prompt similarity: the prompt before the new turn was not read again.
    assert following["timings"]["cache_n"] >= first["usage"]["prompt_tokens"] - 1
    assert following["timings"]["prompt_n"] < 64
