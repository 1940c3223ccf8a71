"""The starvation guard's lane shared fairly among a class's models (issue 30, item 5), in
virtual time: MockClock(autojump_threshold=0), scripted engines, exact times.

The rule (guard.turn_order): a class's guard turns go round-robin among the models whose
steps wait, the model whose last turn is the oldest first (never had one: first), the oldest
request on a tie. Before it, every turn went to the oldest request: an indexer's long
embeddings request took them all while an agent's model starved behind it.
"""

from __future__ import annotations

import trio
import trio.testing

from supervisor.scheduler.core import Scheduler
from supervisor.scheduler.explain import WaitReason, explain
from supervisor.scheduler.types import EngineProfile, Grant
from tests.harness import GIB, LOAD_S, Harness, client_loop, hold_steps, start_harness
from tests.test_scheduler_explain import wall_offset_for
from tests.test_scheduler_rules import eager, pinned, policy


async def test_the_guards_turns_alternate_between_an_indexer_and_an_agent(
        autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    h = await start_harness(nursery, 16, pinned("chat", 8, 2), pinned("emb", 2, 1), pinned("agent", 4, 1),
                            policy=eager())
    await trio.sleep(LOAD_S)
    chats: list[tuple[str, float]] = []
    indexer: list[tuple[str, float]] = []
    agent: list[tuple[str, float]] = []
    async with trio.open_nursery() as clients:
        clients.start_soon(constant_chats, h, chats, 40.0)
        await trio.sleep(0.5)
        clients.start_soon(hold_steps, h.client, "emb", "background", 6, 1.0, indexer)  # the oldest request
        await trio.sleep(0.5)
        clients.start_soon(client_loop, h.client, "agent", "background", 1.0, 0.0, agent, 30.0)
    # Due 3 s after the class's last progress, each turn a 1 s step: a turn every 4 s from 5.5,
    # the indexer's (the oldest request) first, then the agent's, and so on in turn.
    steps = [(str(e["model"]), e["at"]) for e in h.names("starvation_step")]
    assert steps[:8] == [("emb", 5.5), ("agent", 9.5), ("emb", 13.5), ("agent", 17.5),
                         ("emb", 21.5), ("agent", 25.5), ("emb", 29.5), ("agent", 33.5)]
    assert [t for _, t in agent][:2] == [9.5, 17.5]  # before: 29.5, after all six of the indexer's steps
    assert len(chats) > 50  # and the chats kept going all along


async def constant_chats(h: Harness, log: list[tuple[str, float]], until: float) -> None:
    """Six chat clients on two slots: interactive work never stops."""
    async with trio.open_nursery() as clients:
        for _ in range(6):
            clients.start_soon(client_loop, h.client, "chat", "interactive", 1.25, 0.125, log, until)


def waiting_behind_chats(**overrides: object) -> Scheduler:
    """chat (1 slot), emb and agent resident; a chat computing from 0.0 to 64.0; the indexer's
    request (2 steps) asked at 1.0, the agent's at 2.0; background starves after 4 s."""
    s = Scheduler.create(16 * GIB, [EngineProfile("chat", 8 * GIB, 1, pinned=True),
                                    EngineProfile("emb", 2 * GIB, 1, pinned=True),
                                    EngineProfile("agent", 4 * GIB, 1, pinned=True)],
                         policy(background=4.0, **overrides))
    s.start(0.0)
    for name in ("chat", "emb", "agent"):
        s.engine_ready(name, 1, f"http://127.0.0.1:1/{name}", 0.0)
    assert Grant(1, "chat", "http://127.0.0.1:1/chat") in s.submit(1, "chat", "interactive", 0.0)
    s.submit(2, "emb", "background", 1.0, request=2, step=1, steps=2)
    s.submit(3, "agent", "background", 2.0)
    return s


def test_the_why_of_a_waiting_step_names_the_model_whose_turn_is_next_and_when_the_turn_goes_anyway() -> None:
    s = waiting_behind_chats(guard_gap_wait=8.0, guard_share=0.5)
    s.wall_offset = wall_offset_for(0.0, "09:00:00")

    def why(job: int) -> str:
        return explain(s, s.waiting[job]).why

    s.tick(5.0)  # due at 5.0 (1.0 + 4 s): it waits for a moment no chat computes, until 13.0 at most
    assert explain(s, s.waiting[3]).reason is WaitReason.GUARD_SHARE
    assert why(3) == (
        "background request for agent waits: its starvation guard turn is due and waits for a moment no "
        "interactive step computes, until 09:00:13 at the latest; the guard's next background turn goes to "
        "emb (the request for emb is older; the turns go round-robin among the models that wait), then to agent")
    assert why(2) == (
        "background request for emb waits: its starvation guard turn is due and waits for a moment no "
        "interactive step computes, until 09:00:13 at the latest")
    assert not [e for e in s.tick(12.5) if isinstance(e, Grant)]
    effects = s.tick(13.0)
    assert [e.job_id for e in effects if isinstance(e, Grant)] == [2]  # the indexer's first step
    # Its step ends at 14.0: the class made progress; the lane rests 1 s (guard_share 0.5). The
    # next turn is the agent's (emb had the last), though the indexer's request is older.
    s.finish(2, 14.0)
    s.submit(4, "emb", "background", 14.0, seq=2, request=2, step=2, steps=2)  # keeps its place
    assert why(4) == (
        "background request for emb waits: 1 interactive step(s) running; the starvation guard lets one step "
        "through beside them, not before 09:00:18; the guard's next background turn goes to agent (emb had the "
        "last; the turns go round-robin among the models that wait), then to emb")
    assert not [e for e in s.tick(18.0) if isinstance(e, Grant)]  # due again at 18.0; no gap: it goes at 26.0
    assert not [e for e in s.tick(25.5) if isinstance(e, Grant)]
    effects = s.tick(26.0)
    assert [e.job_id for e in effects if isinstance(e, Grant)] == [3]
