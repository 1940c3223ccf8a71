"""How much lower-class work fits in the time the interactive clients leave the GPU idle.

An upper bound, from the scenario alone and the idle seconds of its interactive-alone
replay: every idle second computes the lower classes' requests at the best rate the card
allows (each engine with all its slots batched, as many engines at once as pays on this
card's ``alpha``), all of mean size, with no load, no switch and no chat ever slowed. A
target that asks for more lower-class requests than this, under a bound on the chats'
tail, asks the chats to give up time they are using: every request beyond it shares the
card with a chat (on ``alpha: 1``, each second of its card time is a second the chat loses).
"""

from __future__ import annotations

from supervisor.tools.simulate.scenario import ClientSpec, EngineSpec, Scenario


def mean_work(client: ClientSpec, engine: EngineSpec) -> float:
    """The expected work of one of *client*'s requests, all its steps, in seconds alone
    (workload.py draws them)."""
    prompt = client.prompt_tokens.mean
    if client.inputs is not None:
        return client.inputs * engine.embed_seconds(prompt)
    return (engine.read_seconds(min(client.cached_prompt_tokens, prompt), prompt)
            + engine.decode_seconds(prompt, client.output_tokens.mean))


def lower_rate(scenario: Scenario) -> float:
    """The most lower-class requests the card completes per second with nothing else on it."""
    sharing = scenario.gpu.sharing
    per_engine = []
    for name, engine in scenario.engines.items():
        works = [mean_work(c, engine) for c in scenario.clients.values()
                 if c.model == name and c.klass != "interactive"]
        if works and (smallest := min(works)) > 0:
            # All slots busy decode as one batch: slot_share x slots of one slot's speed.
            per_engine.append(sharing.slot_share(engine.slots) * engine.slots / smallest)
    per_engine.sort(reverse=True)
    return max((sharing.engine_share(k, 0) * sum(per_engine[:k]) for k in range(1, len(per_engine) + 1)), default=0.0)


def lower_room(scenario: Scenario, idle_s: float) -> float | None:
    """At most how many lower-class requests *idle_s* seconds of an idle card complete; None
    when the scenario has no lower-class client."""
    if not any(c.klass != "interactive" for c in scenario.clients.values()):
        return None
    return idle_s * lower_rate(scenario)
