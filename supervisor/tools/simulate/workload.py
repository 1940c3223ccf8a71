"""Clients and their requests: what each asks for, drawn from the scenario with its own seed.

Every client has its own random stream, named by the scenario's seed, its group and
its index, so a client asks for the same sequence of requests and thinks the same
times whatever the policy and whatever else runs: runs are paired, and replaying
only the interactive clients gives them exactly the requests they had in the mix.
"""

from __future__ import annotations

import math
import random

import attrs

from supervisor.tools.simulate.scenario import ClientSpec, EngineSpec, Scenario


@attrs.frozen
class StepWork:
    """One step's work in seconds alone, and how much of it is reading its prompt (first)."""

    seconds: float
    prefill: float = 0.0


@attrs.frozen
class Drawn:
    """What one request asks, drawn once: the same whichever engine serves it (a fallback)."""

    prompt: int = 0
    output: int = 0
    inputs: tuple[tuple[int, ...], ...] = ()  # an embeddings request: the tokens of each step's inputs


@attrs.define(eq=False)
class Client:
    name: str
    spec: ClientSpec
    engine: EngineSpec
    rng: random.Random
    chunk: int  # inputs per step, for an embeddings client
    step_tokens: int = 0  # tokens out per step of a generation (scheduler.step_tokens); 0: one step
    # The engine generation that served its last request: while that engine is loaded, or when it
    # keeps caches, its next prompt's carried tokens are found computed. None: never served.
    served_by: tuple[str, int] | None = None

    def cached_on(self, engine: str, generation: int, spec: EngineSpec) -> int:
        """The tokens of its next prompt that *engine* (this *generation* of it) holds computed."""
        carried = (self.served_by is not None and self.served_by[0] == engine
                   and (self.served_by[1] == generation or spec.keep_cache is not None))
        return max(self.spec.cached_prompt_tokens, self.spec.carried_prompt_tokens if carried else 0)

    def first_arrival(self) -> float:
        """By default the clients' first requests are spread over one think time, so they do not all start at 0."""
        if self.spec.start is not None:
            return self.spec.start.draw(self.rng)
        return self.rng.uniform(0.0, self.spec.think.high)

    def think(self) -> float:
        return self.spec.think.draw(self.rng)

    def draw(self) -> Drawn:
        """The next request: its sizes, drawn from this client's own stream."""
        spec = self.spec
        if spec.inputs is None:
            return Drawn(spec.prompt_tokens.draw_int(self.rng), spec.output_tokens.draw_int(self.rng))
        chunks = math.ceil(spec.inputs / self.chunk)
        sizes = [min(self.chunk, spec.inputs - k * self.chunk) for k in range(chunks)]
        return Drawn(inputs=tuple(tuple(spec.prompt_tokens.draw_int(self.rng) for _ in range(size)) for size in sizes))

    def draw_steps(self) -> list[StepWork]:
        """The work of each step of the next request on this client's engine."""
        return self.steps_on(self.draw(), self.engine)

    def steps_on(self, drawn: Drawn, engine: EngineSpec, cached: int | None = None) -> list[StepWork]:
        """The work of each step of *drawn* on *engine*, in seconds alone (see sharing.py);
        *cached*: the prompt's tokens the engine holds computed (default: cached_prompt_tokens)."""
        if drawn.inputs:
            reads = [sum(engine.embed_seconds(tokens) for tokens in step) for step in drawn.inputs]
            return [StepWork(seconds, seconds) for seconds in reads]  # embeddings only read
        prompt, output = drawn.prompt, drawn.output
        cut = self.step_tokens if 0 < self.step_tokens < output else output
        # A cut generation continues from its cached prompt: each later step reads only the
        # tokens it adds (gateway/relay/chunked.py), negligible beside decoding them.
        starts = list(range(0, output, cut)) or [0]
        decodes = [engine.decode_seconds(prompt + done, min(cut, output - done)) for done in starts]
        cached = self.spec.cached_prompt_tokens if cached is None else cached
        reading = engine.read_seconds(min(cached, prompt), prompt)
        return [StepWork(reading + decodes[0], reading), *(StepWork(s) for s in decodes[1:])]


def make_clients(scenario: Scenario) -> list[Client]:
    def step_tokens(spec: ClientSpec) -> int:
        """Background and batch generations are cut into steps (scheduler.step_tokens); chats never."""
        return 0 if spec.klass == "interactive" else scenario.scheduler.step_tokens

    return [Client(f"{group}/{index}", spec, scenario.engines[spec.model],
                   random.Random(f"{scenario.seed}/{group}/{index}"), spec.chunk or scenario.scheduler.embedding_chunk,
                   step_tokens(spec))
            for group, spec in scenario.clients.items() for index in range(spec.count)]


@attrs.define(eq=False)
class Request:
    id: int
    client: Client
    arrival: float
    steps: list[StepWork]  # work of each step, seconds alone
    drawn: Drawn = Drawn()  # what it asks, for the work on another engine (a fallback)
    step: int = 0  # index of the step submitted or running
    job: int = 0  # job id of that step
    started: float | None = None  # when its first step started computing

    @property
    def last_step(self) -> bool:
        return self.step == len(self.steps) - 1
