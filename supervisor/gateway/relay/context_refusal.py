"""A prompt too long for a slot of its engine, said plainly: the model, its slot, its config, what to change.

llama-server refuses a prompt that does not fit the slot it landed on with its own 400 (the
same body whether or not a stream was asked for: nothing was sent yet)::

    {"error": {"code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": 9512, "n_ctx": 2048,
               "message": "request (9512 tokens) exceeds the available context size (2048 tokens), try increasing it"}}

Its words name neither the model nor the keys of steward.yaml that decide a slot's size (``-c``
/ ``--ctx-size`` in the model's ``args``, split between its ``parallel`` slots). Steward says it in
each API's error shape, with the type its clients know (OpenAI's ``invalid_request_error`` and
code ``context_length_exceeded``; Anthropic's ``invalid_request_error``), and begins with the words
agents look for to compact their history (Anthropic's "prompt is too long")::

    prompt is too long: model 'chat' took 9,512 prompt tokens; a slot of it holds 2,048 (--ctx-size 8192
    / parallel 4 in its config); raise --ctx-size in models.chat.args, lower models.chat.parallel, or
    shorten the prompt

Each such refusal is a ``context_exceeded`` event (docs/events.md), counted in /metrics.
"""

from __future__ import annotations

import enum
from typing import Any

import attrs

from adapters import LlamaServerRuntime
from supervisor.accounting.gguf_header import GGUFError, read_gguf_header
from supervisor.accounting.server_args import ServerArgsError, parse_server_args
from supervisor.apis import Api
from supervisor.config.schema import ModelConfig
from supervisor.observe.events import EventLog
from supervisor.request_class import RequestClass

ENGINE_TYPE = "exceed_context_size_error"  # llama-server's error type (tools/server/server-common.cpp)
CODE = "context_length_exceeded"  # OpenAI's code for it, which agents (Codex) read
# The request field that holds the prompt, per API (OpenAI's `param`).
_PARAMS = {Api.CHAT: "messages", Api.COMPLETIONS: "prompt", Api.RESPONSES: "input", Api.MESSAGES: "messages"}


class ParallelSource(enum.Enum):
    """Where a model's slot count comes from."""

    KEY = "key"  # models.NAME.parallel
    ARGS = "args"  # --parallel / -np in models.NAME.args
    DEFAULT = "default"  # llama-server's own: 4 slots sharing one context


@attrs.frozen
class SlotConfig:
    """A llama-server model's slot context as its config sets it (what a refusal names)."""

    model: str
    ctx_size: int | None  # -c / --ctx-size in its args; None: not given (the model's trained context)
    slots: int
    parallel: ParallelSource
    trained: int | None = None  # the model's trained context (its GGUF's context_length); None: not known

    @property
    def parallel_key(self) -> str:
        """The key a user edits to change the slot count."""
        if self.parallel is ParallelSource.ARGS:
            return f"--parallel in models.{self.model}.args"
        return f"models.{self.model}.parallel"

    def described(self) -> str:
        """How the config sizes a slot, e.g. ``--ctx-size 8192 / parallel 4 in its config``."""
        context = f"--ctx-size {self.ctx_size}" if self.ctx_size else "no --ctx-size: the model's trained context"
        if self.parallel is ParallelSource.DEFAULT:
            return f"{context} in its config, shared by llama-server's {self.slots} default slots"
        return f"{context} / parallel {self.slots} in its config"

    def remedies(self, slot: int) -> list[str]:
        """What would let a longer prompt in, for a slot that holds *slot* tokens."""
        if self.trained is not None and slot >= self.trained:
            return [f"shorten the prompt (a slot already holds the model's trained context, {self.trained:,})"]
        split = self.slots > 1 and self.parallel is not ParallelSource.DEFAULT  # one context cut into slots
        return [f"raise --ctx-size in models.{self.model}.args",
                *([f"lower {self.parallel_key}"] if split else []), "shorten the prompt"]


def slot_config(name: str, model: ModelConfig) -> SlotConfig | None:
    """*model*'s slot context as its config sets it; None for a model llama-server does not run."""
    if model.runtime != "llama-server":
        return None
    runtime = LlamaServerRuntime(model)
    try:
        args = parse_server_args(model.args)
    except ServerArgsError:
        return None  # `steward check` says what is wrong with them
    if model.parallel is not None:
        parallel = ParallelSource.KEY
    elif args.n_parallel >= 1:
        parallel = ParallelSource.ARGS
    else:
        parallel = ParallelSource.DEFAULT
    return SlotConfig(name, args.ctx_size or None, runtime.slots, parallel, _trained_context(model.model or args.model))


def _trained_context(path: str | None) -> int | None:
    if path is None:
        return None
    try:
        trained = read_gguf_header(path, check_size=False).arch_get("context_length")
    except GGUFError:
        return None
    return trained if isinstance(trained, int) and trained > 0 else None


@attrs.frozen
class Refusal:
    """What llama-server's refusal said: the prompt's tokens and what its slot holds."""

    prompt_tokens: int
    slot_tokens: int

    @classmethod
    def of(cls, status: int, value: dict[str, Any]) -> Refusal | None:
        error = value.get("error")
        if status != 400 or not isinstance(error, dict) or error.get("type") != ENGINE_TYPE:
            return None
        prompt, slot = error.get("n_prompt_tokens"), error.get("n_ctx")
        if not (_is_count(prompt) and _is_count(slot)):
            return None
        return cls(prompt, slot)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def refusal_message(config: SlotConfig, refusal: Refusal) -> str:
    remedies = config.remedies(refusal.slot_tokens)
    said = remedies[0] if len(remedies) == 1 else ", ".join(remedies[:-1]) + ", or " + remedies[-1]
    return (f"prompt is too long: model '{config.model}' took {refusal.prompt_tokens:,} prompt tokens; "
            f"a slot of it holds {refusal.slot_tokens:,} ({config.described()}); {said}")


def refusal_error(config: SlotConfig, refusal: Refusal, api: Api) -> dict[str, Any]:
    """The refusal as OpenAI's error object (the Anthropic shape takes its message); llama-server's
    counts stay beside it for the clients that read them."""
    return {"error": {"message": refusal_message(config, refusal), "type": "invalid_request_error",
                      "param": _PARAMS.get(api), "code": CODE, "n_prompt_tokens": refusal.prompt_tokens,
                      "n_ctx": refusal.slot_tokens}}


@attrs.frozen
class ContextWall:
    """A model's slot config and the log its refusals are counted in: what ``reading_answer``
    (reshaped.py) explains llama-server's refusal with."""

    config: SlotConfig
    events: EventLog

    def explained(self, status: int, value: dict[str, Any], *, api: Api, request_id: str,
                  klass: RequestClass | None) -> dict[str, Any] | None:
        """*value* (an engine's error answer of *status*) in steward's words if it is a context
        refusal, told as an event; None: it is not one."""
        refusal = Refusal.of(status, value)
        if refusal is None:
            return None
        config = self.config
        self.events.emit("context_exceeded", "info", model=config.model, request_id=request_id, api=api.value,
                         **{"class": klass}, prompt_tokens=refusal.prompt_tokens, slot_tokens=refusal.slot_tokens,
                         ctx_size=config.ctx_size, parallel=config.slots, trained=config.trained)
        return refusal_error(config, refusal, api)
