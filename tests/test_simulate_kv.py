"""The simulator's keep_cache (issue 33): a conversation's carried prompt is found computed while
its engine stays loaded, and across a reload only when the engine keeps its slots' caches; the
thrash scenario with agents' conversations (supervisor/tools/simulate/thrash_kv.yaml), with and
without keep_cache, through steward's policy."""

from __future__ import annotations

from pathlib import Path

import attrs

from supervisor.tools.simulate.metrics import PolicyResult
from supervisor.tools.simulate.policies import make_policy
from supervisor.tools.simulate.runner import replay
from supervisor.tools.simulate.scenario import Scenario, load_scenario, parse_scenario

THRASH_KV = Path(__file__).resolve().parents[1] / "supervisor" / "tools" / "simulate" / "thrash_kv.yaml"


def without_keep_cache(scenario: Scenario) -> Scenario:
    return attrs.evolve(scenario, engines={name: attrs.evolve(e, keep_cache=None) for name, e in scenario.engines.items()})


def two_agents(**engine: object) -> Scenario:
    """Room for one of two models; each agent asks once at 0 s and once at 20 s, 1024 prompt tokens of
    which 768 repeat its last request's; 64 prompt tokens/s, 8 output tokens/s: exact binary times."""
    spec = {"memory": "10GiB", "speed": 8, "prompt_speed": 64, "load_time": "2s", "stop_time": "0.5s", **engine}
    clients = {m: {"model": m, "class": "background", "start": "0s" if m == "a" else "0.25s", "think": "14s",
                   "prompt_tokens": 1024, "carried_prompt_tokens": 768, "output_tokens": 8} for m in "ab"}
    return parse_scenario({"gpu": {"memory": "16GiB"}, "duration": "60s", "clients": clients,
                           "scheduler": {"swap_hold": "0s"}, "engines": {m: spec for m in "ab"}}, "two-agents")


def latencies(scenario: Scenario) -> list[float]:
    outcome = replay(scenario, make_policy("steward", scenario))
    return [r.latency for r in sorted(outcome.records, key=lambda r: r.arrival) if r.latency is not None]


def test_a_reload_loses_the_carried_prompt_unless_the_engine_keeps_its_caches() -> None:
    kept = two_agents(keep_cache={"save_time": "0.25s", "restore_time": "0.25s"})
    # a at 0 s: load 2 s (+ the restore, 0.25 s), read 1024 tokens 16 s, decode 8 in 1 s. b at 0.25 s
    # waits for a's stop (0.5 s, + the save 0.25 s), then loads and reads the same.
    assert latencies(without_keep_cache(kept))[:2] == [19.0, 38.25]
    assert latencies(kept)[:2] == [19.25, 39.0]
    # a's second turn, after b evicted it: without keep_cache it reads its whole prompt again
    # (2 + 16 + 1 s after b's stop), with it only the 256 new tokens (2.25 + 4 + 1 s after b's stop and save).
    assert latencies(without_keep_cache(kept))[2] == 25.0
    assert latencies(kept)[2] == 14.0


def test_thrash_with_conversations_keep_cache_cuts_latency() -> None:
    kept = load_scenario(THRASH_KV)
    assert all(e.keep_cache is not None for e in kept.engines.values())
    with_cache, without = (PolicyResult.of(replay(s, make_policy("steward", s))) for s in (kept, without_keep_cache(kept)))
    background = with_cache.classes["background"], without.classes["background"]
    assert background[0].p50_s is not None and background[1].p50_s is not None
    assert background[0].completed > background[1].completed
    assert background[0].p50_s < background[1].p50_s
