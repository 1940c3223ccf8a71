"""The loadtest's client workload: the kinds of client, each one's loop, and the tally of what they did.

Chat clients (interactive, streaming), background agents, batch jobs and embedding
indexers each loop: ask, wait for the whole answer, think, ask again, until the
duration is over. Ollama clients (``/api/chat``) and image clients (ComfyUI's
``/prompt``) can join them. ``run_clients`` runs them against a steward's listeners
(``Endpoints``) and returns one ``Outcome`` per request; ``LoadTally`` counts them as they
come, for the progress line said every few seconds and for the report's rows
(supervisor/tools/loadtest_report.py).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import random
from collections.abc import Callable, Mapping
from typing import NoReturn

import attrs
import httpx
import trio

from supervisor.tools import chaos


@attrs.frozen
class ClientKind:
    name: str  # chat, background, batch, embedding, ollama, image
    klass: str
    model: str
    think_s: tuple[float, float]
    max_tokens: tuple[int, int] = (16, 64)
    inputs: int = 0  # > 0: an embeddings client sending this many inputs per request
    api: str = "openai"  # openai (steward's own listener), ollama (/api/chat), comfyui (/prompt)
    # Set: its prompts are this many repeats of a short phrase (about 3 tokens each, more for
    # a chat template), after a fresh number, so no engine reuses the last prompt's cache
    # (supervisor/tools/loadtest_real.py's agents); unset: a short prompt, as always.
    prompt_repeats: tuple[int, int] | None = None

    @property
    def group(self) -> str:
        """The row of the report: the class for OpenAI clients, the API for the others."""
        return self.klass if self.api == "openai" else self.name


DEFAULT_OLLAMA_MODEL = "llama3.2:3b"  # the demo's fake Ollama has it


def default_kinds(models: Mapping[str, str]) -> list[ClientKind]:
    return [
        ClientKind("chat", "interactive", models["chat"], think_s=(1.0, 3.0), max_tokens=(24, 64)),
        ClientKind("background", "background", models["background"], think_s=(0.0, 0.5), max_tokens=(32, 96)),
        ClientKind("batch", "batch", models["batch"], think_s=(0.0, 0.2), max_tokens=(32, 96)),
        ClientKind("embedding", "background", models["embedding"], think_s=(0.5, 1.0), inputs=100),
        ClientKind("ollama", "interactive", models.get("ollama", DEFAULT_OLLAMA_MODEL), think_s=(1.0, 4.0),
                   max_tokens=(8, 32), api="ollama"),
        ClientKind("image", "interactive", "", think_s=(5.0, 15.0), api="comfyui"),
    ]


@attrs.define
class Outcome:
    kind: str
    klass: str  # the report's row: a class, or ollama / image
    started: float
    latency: float
    status: int  # 0: no HTTP answer at all
    ttft: float | None = None
    # How it ended (supervisor/tools/chaos.py): answer, done, error_event, invalid (answered);
    # no_answer, timeout, truncated (lost); disconnect (the client left on purpose).
    ending: str = "answer"
    note: str = ""  # image jobs: success, error, vanished, unfinished (as /history told)

    @property
    def completed(self) -> bool:
        return self.status == 200 and self.ending in ("answer", "done")


PROGRESS_INTERVAL_S = 5.0
# A request in flight longer than this gets its age on the progress line: shorter ones
# are the mix's usual rhythm, longer ones are what a user wants explained (see /healthz).
LONG_WAIT_S = 10.0


@attrs.define
class KindCount:
    """One client kind's answered requests so far, as its clients saw them."""

    klass: str  # the class its clients ask for, or the API they use (ollama, comfyui)
    clients: int
    completed: int = 0
    failed: int = 0  # answered with an error, or lost
    left: int = 0  # its client left on purpose


@attrs.define
class LoadTally:
    """What every client kind has done so far, kept while the load runs.

    It makes the progress lines, and tells the report which kinds were started (one
    that finished no request still gets a row) and what was still in flight when the
    load was stopped. Pure: the caller says when each request was sent.
    """

    kinds: dict[str, KindCount]
    in_flight: dict[int, tuple[str, float]] = attrs.Factory(dict)  # ticket: kind, when it was sent
    _tickets: itertools.count[int] = attrs.field(factory=itertools.count, repr=False)

    @classmethod
    def of(cls, kinds: Mapping[ClientKind, int]) -> LoadTally:
        return cls({kind.name: KindCount(kind.klass if kind.api == "openai" else kind.api, count)
                    for kind, count in kinds.items() if count > 0})

    def sent(self, kind: str, at: float) -> int:
        """A request of *kind* sent at *at*; the ticket to give ``ended`` with its outcome."""
        ticket = next(self._tickets)
        self.in_flight[ticket] = (kind, at)
        return ticket

    def ended(self, ticket: int, outcome: Outcome) -> None:
        del self.in_flight[ticket]
        count = self.kinds[outcome.kind]
        if outcome.completed:
            count.completed += 1
        elif outcome.ending == chaos.LEFT:
            count.left += 1
        else:
            count.failed += 1

    def unanswered(self, kind: str) -> list[float]:
        """When each request of *kind* still in flight was sent, oldest first."""
        return sorted(at for name, at in self.in_flight.values() if name == kind)

    def progress_line(self, now: float, *, started: float, duration: float) -> str:
        """One line: how far the load is, then per kind done, failed, left and in flight."""
        elapsed = int(now - started)  # whole seconds, rounded down: never "30s/30s" before the end
        if now - started < duration:
            head = f"loadtest {elapsed}s/{duration:g}s"
        else:
            waiting = len(self.in_flight)
            answers = f"; waiting for {waiting} answer{'s' if waiting != 1 else ''}" if waiting else ""
            head = f"loadtest {elapsed}s (the {duration:g}s load is over{answers})"
        return head + ": " + "; ".join(self._kind_progress(name, now) for name in self.kinds)

    def _kind_progress(self, name: str, now: float) -> str:
        count, waiting = self.kinds[name], self.unanswered(name)
        parts = [f"{name} {count.completed} done"]
        parts += [f"{n} {what}" for n, what in ((count.failed, "failed"), (count.left, "left")) if n]
        if waiting:
            oldest = now - waiting[0]
            parts.append(f"{len(waiting)} in flight" + (f" (oldest {int(oldest)}s)" if oldest >= LONG_WAIT_S else ""))
        return ", ".join(parts)


async def serve_progress(tally: LoadTally, say: Callable[[str], None], *, started: float, duration: float,
                         interval: float = PROGRESS_INTERVAL_S,
                         task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> NoReturn:
    """Say *tally*'s progress line every *interval* seconds from *started*, until cancelled."""
    task_status.started()
    ticks = 0
    while True:
        ticks += 1
        await trio.sleep_until(started + ticks * interval)  # on the grid: a slow say does not drift it
        say(tally.progress_line(trio.current_time(), started=started, duration=duration))


def load_line(kinds: Mapping[ClientKind, int], duration: float, url: str) -> str:
    """The line that says the load begins: how long, against what, how many clients of each kind."""
    clients = ", ".join(f"{kind.name} {count}" for kind, count in kinds.items())
    return f"loadtest: clients for {duration:g}s against {url}: {clients}; progress every {PROGRESS_INTERVAL_S:g}s"


@attrs.frozen
class Endpoints:
    """A steward's listeners: its own (OpenAI's API), and its Ollama and ComfyUI ones where it has them."""

    openai: str
    ollama: str | None = None
    comfyui: str | None = None


async def run_clients(endpoints: Endpoints | str, kinds: Mapping[ClientKind, int], duration: float, seed: int = 7,
                      *, timeout: float = 600.0, disconnect_rate: float = 0.0,
                      outcomes: list[Outcome] | None = None, tally: LoadTally | None = None,
                      say: Callable[[str], None] | None = None,
                      progress_interval: float = PROGRESS_INTERVAL_S, drain: float = math.inf) -> list[Outcome]:
    """Run every client until *duration* has passed; requests in flight then are finished,
    or abandoned *drain* seconds later (left in *tally* as unanswered).

    Outcomes are appended to *outcomes* as they come, and counted in *tally* (given:
    what was done before a cancellation is kept). With *say*, a progress line every
    *progress_interval* seconds until the last answer.
    """
    if isinstance(endpoints, str):
        endpoints = Endpoints(endpoints)
    outcomes = [] if outcomes is None else outcomes
    tally = LoadTally.of(kinds) if tally is None else tally
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits) as http:
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            if say is not None:
                await nursery.start(functools.partial(serve_progress, tally, say, started=started, duration=duration,
                                                      interval=progress_interval))
            with trio.move_on_at(started + duration + drain):
                async with trio.open_nursery() as clients:
                    for kind, count in kinds.items():
                        for index in range(count):
                            clients.start_soon(_client_loop, http, endpoints, kind, random.Random(rng.random()),
                                               started + duration, outcomes, tally, disconnect_rate,
                                               name=f"{kind.name}-{index}")
            nursery.cancel_scope.cancel(reason="every client is done")
    return outcomes


async def _client_loop(http: httpx.AsyncClient, endpoints: Endpoints, kind: ClientKind, rng: random.Random,
                       deadline: float, outcomes: list[Outcome], tally: LoadTally, disconnect_rate: float) -> None:
    await trio.sleep(rng.uniform(0, 0.5))  # do not all start in the same instant
    while trio.current_time() < deadline:
        ticket = tally.sent(kind.name, trio.current_time())
        outcome = await _one_request(http, endpoints, kind, rng, disconnect_rate)
        outcomes.append(outcome)
        tally.ended(ticket, outcome)
        # A think that would end after the deadline ends at it: no request would follow it.
        await trio.sleep_until(min(trio.current_time() + rng.uniform(*kind.think_s), deadline))


@attrs.define
class _Seen:
    """What a client has seen of its request so far."""

    status: int = 0
    ending: str | None = None
    ttft: float | None = None
    note: str = ""


async def _one_request(http: httpx.AsyncClient, endpoints: Endpoints, kind: ClientKind, rng: random.Random,
                       disconnect_rate: float) -> Outcome:
    started = trio.current_time()
    seen = _Seen()
    leaves = disconnect_rate > 0 and rng.random() < disconnect_rate
    streams = kind.api == "ollama" or (kind.api == "openai" and kind.klass == "interactive" and not kind.inputs)
    # A streaming client leaves after a few chunks; the others after a moment (waiting or running).
    leave_after_chunks = rng.randint(1, 4) if leaves and streams else 0
    leave_after_s = rng.uniform(0.05, 2.0) if leaves and not streams else math.inf
    try:
        with trio.move_on_after(leave_after_s) as leaving:
            if kind.api == "ollama":
                await _ollama_chat(http, endpoints, kind, rng, seen, started, leave_after_chunks)
            elif kind.api == "comfyui":
                await _image(http, endpoints, rng, seen)
            elif kind.inputs:
                await _embeddings(http, endpoints, kind, rng, seen)
            elif streams:
                await _chat_stream(http, endpoints, kind, rng, seen, started, leave_after_chunks)
            else:
                await _chat(http, endpoints, kind, rng, seen)
        if leaving.cancelled_caught and seen.ending is None:
            seen.ending = chaos.LEFT
    except httpx.HTTPError as exc:
        # A stream that already carried its error event was answered, however it closed.
        if seen.ending not in chaos.ANSWERED:
            timeout = isinstance(exc, httpx.TimeoutException)
            seen.ending = "timeout" if timeout else "truncated" if seen.status else "no_answer"
    return Outcome(kind.name, kind.group, started, trio.current_time() - started, seen.status, seen.ttft,
                   seen.ending or "truncated", seen.note)


def _headers(kind: ClientKind) -> dict[str, str]:
    return {"X-Steward-Class": kind.klass}


async def _chat_stream(http: httpx.AsyncClient, endpoints: Endpoints, kind: ClientKind, rng: random.Random,
                       seen: _Seen, started: float, leave_after: int) -> None:
    body = {"model": kind.model, "stream": True, "max_tokens": rng.randint(*kind.max_tokens),
            "messages": [{"role": "user", "content": _prompt(kind, rng, "tell me something ", (2, 20))}]}
    async with http.stream("POST", f"{endpoints.openai}/v1/chat/completions", json=body,
                           headers=_headers(kind)) as response:
        seen.status = response.status_code
        chunks = 0
        async for line in response.aiter_lines():
            if line.startswith('data: {"error"'):
                seen.ending = "error_event"
            elif line == "data: [DONE]":
                seen.ending = seen.ending or "done"
            elif line.startswith("data: {") and '"content"' in line:
                chunks += 1
                if seen.ttft is None:
                    seen.ttft = trio.current_time() - started
                if chunks == leave_after:
                    seen.ending = chaos.LEFT
                    return  # leaving the block closes the connection mid-stream
        seen.ending = seen.ending or ("answer" if seen.status != 200 else "truncated")


def _prompt(kind: ClientKind, rng: random.Random, phrase: str, repeats: tuple[int, int]) -> str:
    if kind.prompt_repeats is None:
        return phrase * rng.randint(*repeats)
    return f"{rng.randrange(10**6)} " + phrase * rng.randint(*kind.prompt_repeats)


async def _chat(http: httpx.AsyncClient, endpoints: Endpoints, kind: ClientKind, rng: random.Random,
                seen: _Seen) -> None:
    body = {"model": kind.model, "max_tokens": rng.randint(*kind.max_tokens),
            "messages": [{"role": "user", "content": _prompt(kind, rng, "work on this ", (5, 40))}]}
    async with http.stream("POST", f"{endpoints.openai}/v1/chat/completions", json=body,
                           headers=_headers(kind)) as response:
        seen.status = response.status_code
        await response.aread()
        seen.ending = "answer"


async def _embeddings(http: httpx.AsyncClient, endpoints: Endpoints, kind: ClientKind, rng: random.Random,
                      seen: _Seen) -> None:
    body = {"model": kind.model, "input": [f"document {rng.random():.6f} " * 8 for _ in range(kind.inputs)]}
    async with http.stream("POST", f"{endpoints.openai}/v1/embeddings", json=body, headers=_headers(kind)) as response:
        seen.status = response.status_code
        content = await response.aread()
    seen.ending = "answer"
    if seen.status == 200:
        try:
            complete = len(json.loads(content)["data"]) == kind.inputs
        except (ValueError, KeyError, TypeError):
            complete = False
        if not complete:
            seen.ending = "invalid"  # a partial answer is a failure, not a success


async def _ollama_chat(http: httpx.AsyncClient, endpoints: Endpoints, kind: ClientKind, rng: random.Random,
                       seen: _Seen, started: float, leave_after: int) -> None:
    body = {"model": kind.model, "stream": True, "options": {"num_predict": rng.randint(*kind.max_tokens)},
            "messages": [{"role": "user", "content": "why is the sky blue " * rng.randint(1, 10)}]}
    async with http.stream("POST", f"{endpoints.ollama}/api/chat", json=body) as response:
        seen.status = response.status_code
        if seen.status != 200:
            await response.aread()
            seen.ending = "answer"
            return
        chunks = 0
        async for line in response.aiter_lines():
            if not line.strip():
                continue
            try:
                piece = json.loads(line)
            except ValueError:
                seen.ending = seen.ending or "invalid"
                continue
            if "error" in piece:
                seen.ending = "error_event"
            elif piece.get("done"):
                seen.ending = seen.ending or "done"
            elif (piece.get("message") or {}).get("content"):
                chunks += 1
                if chunks == leave_after:
                    seen.ending = chaos.LEFT
                    return
        seen.ending = seen.ending or "truncated"


IMAGE_FOLLOW_S = 60.0  # how long an image client follows its job in /history before it asks again


async def _image(http: httpx.AsyncClient, endpoints: Endpoints, rng: random.Random, seen: _Seen) -> None:
    """A weight-free workflow, like the demo banner's: a sampler and a SaveImage, a second or two."""
    workflow = {"3": {"class_type": "KSampler", "inputs": {"fake_seconds": round(rng.uniform(0.5, 2.0), 2)}},
                "9": {"class_type": "SaveImage", "inputs": {"images": ["3", 0]}}}
    body = {"prompt": workflow, "client_id": f"loadtest-{rng.getrandbits(32):08x}"}
    async with http.stream("POST", f"{endpoints.comfyui}/prompt", json=body) as response:
        seen.status = response.status_code
        content = await response.aread()
    seen.ending = "answer"
    if seen.status == 200:
        try:
            prompt_id = json.loads(content)["prompt_id"]
        except (ValueError, KeyError, TypeError):
            seen.ending = "invalid"
            return
        seen.note = "unfinished"
        with trio.move_on_after(IMAGE_FOLLOW_S):
            seen.note = await _follow_image(http, str(endpoints.comfyui), prompt_id)


async def _follow_image(http: httpx.AsyncClient, comfyui: str, prompt_id: str) -> str:
    """success or error from /history; vanished: in neither /history nor /queue."""

    async def history() -> str | None:
        entry = (await http.get(f"{comfyui}/history/{prompt_id}")).json().get(prompt_id)
        return None if entry is None else str((entry.get("status") or {}).get("status_str", "success"))

    while True:
        await trio.sleep(1.0)
        try:
            if (status := await history()) is not None:
                return status
            queue = (await http.get(f"{comfyui}/queue")).json()
            queued = {item[1] for item in [*queue.get("queue_running", []), *queue.get("queue_pending", [])]}
            if prompt_id not in queued:
                return await history() or "vanished"
        except (httpx.HTTPError, ValueError, AttributeError, IndexError, TypeError):
            continue  # ComfyUI is down or restarting: ask again
