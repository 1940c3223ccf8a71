"""A long lower-class generation cut into steps of N tokens, one answer to the client.

A background or batch chat completion that asks for more than ``scheduler.step_tokens``
tokens (or for as many as its context holds) is one step per N tokens: each step is a
request of its own to the engine, granted by the scheduler like an embeddings chunk, so
between two steps a chat that arrived is served first (the interactive window, the guard):
it waits for one step at most, not for the whole generation.

Each step continues the last one. Its body is the client's, with ``max_tokens`` = N (or
what is left) and, after the first, the text so far as a last assistant message, which
llama-server continues as a prefill: its continuation starts where the text stopped, on
its cached prompt (``timings.prompt_n`` 1: nothing is computed again). On llama-server 0.3.36
with SmolLM2 at temperature 0 the joined text is the uncut generation's, token for token
(tests/test_real_chunked.py); a step costs about 1.5 tokens' time more (the one token evaluated
again, the request), 2 % at 64 tokens a step. Its quirk: the answer echoes
the prefill, as the start of its first content delta (and of a whole answer's content):
steward takes it off. Only llama-server continues so (runtime ``llama-server``).

Which requests are cut (``cut_generation``): the other requests go through as they came, as do
interactive ones, which are never cut. Not cut: n > 1, tools (a cut inside a call), a
response format, JSON schema or grammar (a constraint a cut could break), stop strings (one
across a cut would go unseen), logprobs, a last assistant message of the client's own (its
prefill), a prompt cache turned off (each step would compute the prompt again), reasoning
asked for (a prefill continues the content, not the thinking). A model that thinks without
being asked (its ``reasoning_content``) is not recognised: its first step's thinking has no
content to continue, and the answer ends there (``length``): ``scheduler.step_tokens: 0`` where such
models serve background work.

The client gets one answer. Streamed: the first step's role delta, and its ``id``,
``created`` and ``model`` on every chunk; no finish_reason, usage chunk or ``[DONE]`` until
the last step; then the last step's finish_reason, the usage (the first step's prompt tokens,
the sum of the completion tokens) if the stream asked for it, and ``[DONE]``. Whole: the
first step's answer with all the text, the last finish_reason and the summed usage.

A step that ends on ``stop`` (or before its N tokens) ends the request; so does one whose
prompt no longer fits the context (the uncut generation would have ended there, ``length``).
An engine's error or a failed step ends it as a single request's would end: before anything
was sent, the error as it came; in a stream, an error event (stream_errors.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import attrs

from supervisor.apis import Api
from supervisor.gateway.errors import StreamError
from supervisor.gateway.relay.answer import Answer, AnswerHead, AnswerTap, answer_whole
from supervisor.gateway.routed import RoutedRequest
from supervisor.gateway.relay.sse import EVENT_END, event_data, json_object

CUT_CLASSES = frozenset({"background", "batch"})
CUT_RUNTIME = "llama-server"  # continues a last assistant message from its cached prompt
_BUDGET_FIELDS = ("max_tokens", "max_completion_tokens", "n_predict")
# Present and not empty, each of these leaves the request whole (see the module docstring).
_NOT_CUT_FIELDS = ("tools", "tool_choice", "functions", "function_call", "response_format", "json_schema",
                   "grammar", "stop", "logprobs", "top_logprobs", "n_probs",
                   # Reasoning asked for: a prefill continues the answer's content, not its thinking.
                   "reasoning_effort", "reasoning_format", "thinking_budget_tokens", "chat_template_kwargs")
_PLAIN_TEXT = {"type": "text"}  # the one response format that constrains nothing
_CONTEXT_FULL = b"exceed_context_size_error"  # llama-server's error type: the prompt no longer fits
_DONE = b"data: [DONE]\n\n"
_MAX_ERROR_BYTES = 64 * 1024  # of a later step's error answer, read for its message


def cut_generation(routed: RoutedRequest, step_tokens: int) -> Generation | None:
    """*routed* cut into steps of *step_tokens* (its model's: 0 unless its runtime is CUT_RUNTIME);
    None: it goes whole."""
    payload = routed.payload
    if (step_tokens <= 0 or routed.route.api is not Api.CHAT or routed.klass not in CUT_CLASSES
            or payload is None):
        return None
    if payload.get("n", 1) not in (1, None) or payload.get("cache_prompt", True) is not True:
        return None
    if any(_asks(payload, field) for field in _NOT_CUT_FIELDS):
        return None
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return None
    if messages[-1].get("role") == "assistant":
        return None  # the client's own prefill: its echo is the client's to see
    budget = _budget(payload)
    if budget is False or (isinstance(budget, int) and budget <= step_tokens):
        return None
    return Generation(payload, step_tokens, budget if isinstance(budget, int) else None)


def _asks(payload: dict[str, Any], field: str) -> bool:
    value = payload.get(field)
    return value not in (None, False, [], {}) and not (field == "response_format" and value == _PLAIN_TEXT)


def _budget(payload: dict[str, Any]) -> int | None | bool:
    """The tokens asked for: a count, None (until it stops), or False (not a count steward reads)."""
    for field in _BUDGET_FIELDS:
        value = payload.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            return False  # the engine's to refuse, uncut
        return None if value < 0 else value
    return None


@attrs.define(eq=False)
class Generation:
    """The steps of one cut generation: what was generated so far, and the next step's body."""

    payload: dict[str, Any]  # the client's, as routed (with the stream's usage asked for)
    step_tokens: int
    budget: int | None  # tokens in all; None: until it stops
    text: str = ""  # the content so far
    steps: int = 0  # begun
    completion_tokens: int = 0  # of the steps that ended
    prompt_tokens: int | None = None  # the first step's
    finish_reason: str | None = None  # the last step's
    step_completion: int | None = None  # the last step's completion tokens, as its usage said
    step_max: int = 0  # the last step's max_tokens
    ended: bool = False  # by an error, or the context: no step more

    @property
    def step_count(self) -> int | None:
        """How many steps at most (None: not known; it runs until it stops)."""
        return None if self.budget is None else math.ceil(self.budget / self.step_tokens)

    @property
    def left(self) -> int | None:
        return None if self.budget is None else self.budget - self.completion_tokens

    def next_body(self) -> bytes:
        """The body of the next step (and count it begun)."""
        self.steps += 1
        self.step_completion = None
        self.finish_reason = None
        body = {k: v for k, v in self.payload.items() if k not in _BUDGET_FIELDS}
        left = self.left
        self.step_max = self.step_tokens if left is None else min(self.step_tokens, left)
        body["max_tokens"] = self.step_max
        if body.get("stream") is True:
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        if self.text:
            body["messages"] = [*self.payload["messages"], {"role": "assistant", "content": self.text}]
        return json.dumps(body).encode()

    def end_step(self) -> None:
        """The step's answer ended: count its tokens (all it was allowed, if its usage did not say
        and it ran to its length: the budget is never overrun)."""
        if self.step_completion is not None:
            self.completion_tokens += self.step_completion
        elif self.finish_reason == "length" and not self.ended:  # ended: it was refused, it made nothing
            self.completion_tokens += self.step_max

    def goes_on(self) -> bool:
        """Whether another step follows the one that ended: it used all its tokens, more are left."""
        if self.ended or self.finish_reason != "length" or not self.text:
            return False
        left = self.left
        return left is None or left > 0

    def usage(self) -> dict[str, int]:
        prompt = self.prompt_tokens or 0
        return {"completion_tokens": self.completion_tokens, "prompt_tokens": prompt,
                "total_tokens": prompt + self.completion_tokens}


def strip_echo(content: str, echo: str) -> tuple[str, str | None]:
    """*content* without the prefill llama-server echoes at its start, and what is left of the
    echo to take off the next content (None: done; also when the engine did not echo)."""
    if content.startswith(echo):
        return content[len(echo):], None
    if echo.startswith(content):
        return "", echo[len(content):]  # the echo came in pieces
    return content, None


Counted = Callable[[int | None, int | None], None]  # (prompt, completion) tokens


@attrs.define(eq=False)
class StreamedSteps(Answer):
    """The answer each streamed step is relayed into; one SSE stream to *client* for all of them.
    The generation's usage goes to *counted*, and into the stream only where its client asked."""

    client: AnswerTap
    generation: Generation
    stream_error: StreamError  # the route's
    counted: Counted
    usage_kept: bool  # steward asked for the usage: the client did not
    head: dict[str, Any] | None = None  # the first step's id, created, model, system_fingerprint, object
    started: bool = False  # the client has a 200 stream
    passed: bool = False  # the answer went to the client as it came (a first step's error): done
    errored: bool = False  # an error event went to the client: the stream ends with it
    _held: bytes = b""  # an event not yet ended
    _echo: str | None = None
    _error: AnswerHead | None = None  # a later step's error answer: its head, then its body
    _error_body: bytes = b""

    def begin_step(self) -> None:
        self._echo = self.generation.text or None
        self._held, self._error, self._error_body = b"", None, b""

    async def start(self, head: AnswerHead) -> None:
        if self.passed:
            await self.client.start(head)
            return
        if self.started:
            if not head.event_stream:
                self._error = head  # read whole, then said in the stream
            return
        if not head.event_stream:
            self.passed = True  # nothing was sent: the error goes as it came
            self.generation.ended = True
        else:
            self.started = True
        await self.client.start(head)

    async def body(self, chunk: bytes, more: bool) -> None:
        if self.passed:
            await self.client.body(chunk, more)
        elif self._error is not None:
            self._error_body = (self._error_body + chunk)[:_MAX_ERROR_BYTES]
            if not more:
                await self._step_failed()
        else:
            await self._step_body(chunk, more=more)

    async def _step_body(self, chunk: bytes, *, more: bool) -> None:
        data = self._held + chunk
        out = bytearray()
        start = 0
        for end in EVENT_END.finditer(data):
            out += self._event(data[start:end.start()], data[end.start():end.end()])
            start = end.end()
        self._held = data[start:]
        if not more and self._held:
            out += self._event(self._held, b"")  # an event the stream ended inside
            self._held = b""
        if out or not more:
            await self.client.body(bytes(out), True)

    def _event(self, event: bytes, separator: bytes) -> bytes:
        data = event_data(event)
        if data is None:
            return event + separator  # a comment, a ping
        if data.strip() == b"[DONE]":
            return b""
        try:
            value = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return event + separator
        if not isinstance(value, dict):
            return event + separator
        if "error" in value:
            self.generation.ended = self.errored = True  # an error event ends the stream, and stays its last
            return event + separator
        changed = self._same_head(value)
        choices = value.get("choices")
        usage = value.get("usage")
        if choices == [] and isinstance(usage, dict):
            self._read_usage(usage)
            return b""
        if isinstance(usage, dict):
            self._read_usage(usage)
            del value["usage"]
            changed = True
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
            return (_event_of(value) if changed else event) + separator
        keep, choice_changed = self._choice(choices[0])
        if not keep:
            return b""
        return (_event_of(value) if changed or choice_changed else event) + separator

    def _same_head(self, value: dict[str, Any]) -> bool:
        """The first step's id, created and model on every chunk; True if *value* was changed."""
        fields = ("id", "created", "model", "system_fingerprint")
        if self.head is None:
            self.head = {field: value[field] for field in fields if field in value}
            return False
        changed = False
        for field, kept in self.head.items():
            if value.get(field, kept) != kept:
                value[field] = kept
                changed = True
        return changed

    def _choice(self, choice: dict[str, Any]) -> tuple[bool, bool]:
        """(keep the chunk, it was changed): the role only once, the echo off, the finish held."""
        changed = False
        delta = choice.get("delta")
        delta = delta if isinstance(delta, dict) else {}
        if self.generation.steps > 1 and "role" in delta:
            del delta["role"]
            if delta.get("content") is None and len(delta) <= 1:
                delta.pop("content", None)
            changed = True
        content = delta.get("content")
        if isinstance(content, str):
            if self._echo is not None:
                content, self._echo = strip_echo(content, self._echo)
                if content != delta["content"]:
                    delta["content"] = content
                    changed = True
            self.generation.text += content
            if not content and changed:
                del delta["content"]
        finish = choice.get("finish_reason")
        if finish is not None:
            self.generation.finish_reason = finish
            choice["finish_reason"] = None
            changed = True
        if not delta and changed:
            return False, True  # nothing left in it
        return True, changed

    def _read_usage(self, usage: dict[str, Any]) -> None:
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if self.generation.prompt_tokens is None and _is_count(prompt):
            self.generation.prompt_tokens = prompt
        if _is_count(completion):
            self.generation.step_completion = completion

    async def _step_failed(self) -> None:
        """A later step answered with an error: the stream ends with it (or as the uncut one
        would, on ``length``, when the text so far filled the context)."""
        body = self._error_body
        self.generation.ended = True
        if _CONTEXT_FULL in body:
            self.generation.finish_reason = "length"
            return
        assert self._error is not None
        message = _error_message(body) or f"the engine answered {self._error.status}"
        self.passed = True  # what follows is the end of the stream
        await self.client.body(self.stream_error(b"text/event-stream", message, code="engine_error"), False)

    async def fail(self, message: str, code: str) -> None:
        """A later step refused by the scheduler: the stream has begun, it ends with the error."""
        self.passed = self.generation.ended = True
        await self.client.body(self.stream_error(b"text/event-stream", message, code=code), False)

    async def end(self) -> None:
        """The last step ended: its finish_reason, the usage if asked for, [DONE]."""
        if self.passed:
            return
        if self.errored:
            await self.client.body(b"", False)
            return
        head = {**(self.head or {}), "object": "chat.completion.chunk"}
        finish = {"choices": [{"finish_reason": self.generation.finish_reason or "length", "index": 0,
                               "delta": {}}], **head}
        out = _event_of(finish) + b"\n\n"
        options = self.generation.payload.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage") is True:
            usage = self.generation.usage()
            self.counted(usage["prompt_tokens"], usage["completion_tokens"])
            if not self.usage_kept:
                out += _event_of({"choices": [], **head, "usage": usage}) + b"\n\n"
        await self.client.body(out + _DONE, False)


@attrs.define(eq=False)
class JoinedSteps(Answer):
    """The answer each whole (not streamed) step is relayed into: their answers joined into one
    to *client*, its usage to *counted*."""

    client: AnswerTap
    generation: Generation
    counted: Counted
    answer: dict[str, Any] | None = None  # the first step's, which the whole answer is made of
    step_head: AnswerHead | None = None
    step_body: bytes = b""
    passed: bool = False  # a step's error went to the client as it came: done

    def begin_step(self) -> None:
        self.step_head, self.step_body = None, b""

    async def start(self, head: AnswerHead) -> None:
        if self.passed:
            await self.client.start(head)
            return
        self.step_head = head

    async def body(self, chunk: bytes, more: bool) -> None:
        if self.passed:
            await self.client.body(chunk, more)
            return
        self.step_body += chunk
        if not more:
            await self._step_answered()

    async def _step_answered(self) -> None:
        assert self.step_head is not None
        status, body = self.step_head.status, self.step_body
        value = json_object(body) if status == 200 else None
        choice = _single_choice(value)
        if choice is None:
            self.generation.ended = True
            if self.generation.steps > 1 and status == 400 and _CONTEXT_FULL in body:
                self.generation.finish_reason = "length"  # the text so far filled the context: done
                return
            self.passed = True  # an error (or an answer steward cannot join): as it came, no partial answer
            await self.client.start(self.step_head)
            await self.client.body(body, False)
            return
        assert value is not None
        message = choice.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        content = content if isinstance(content, str) else ""
        if self.generation.text:
            content, _ = strip_echo(content, self.generation.text)
        self.generation.text += content
        usage = value.get("usage") if isinstance(value.get("usage"), dict) else {}
        if self.answer is None:
            self.answer = value
            if _is_count(usage.get("prompt_tokens")):
                self.generation.prompt_tokens = usage["prompt_tokens"]
        completion = usage.get("completion_tokens")
        self.generation.step_completion = completion if _is_count(completion) else None
        self.generation.finish_reason = choice.get("finish_reason")

    async def end(self) -> None:
        if self.passed or self.answer is None:
            return
        answer = self.answer
        choice = answer["choices"][0]
        choice["message"] = {**choice.get("message", {}), "content": self.generation.text}
        choice["finish_reason"] = self.generation.finish_reason or "length"
        answer["usage"] = usage = self.generation.usage()
        self.counted(usage["prompt_tokens"], usage["completion_tokens"])
        answer.pop("timings", None)  # the first step's: not the answer's
        await answer_whole(self.client, 200, [(b"content-type", b"application/json")], json.dumps(answer).encode())


def _event_of(value: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(value, separators=(",", ":")).encode()


def _single_choice(value: dict[str, Any] | None) -> dict[str, Any] | None:
    choices = value.get("choices") if value is not None else None
    if isinstance(choices, list) and len(choices) == 1 and isinstance(choices[0], dict):
        return choices[0]
    return None


def _error_message(body: bytes) -> str | None:
    value = json_object(body)
    error = value.get("error") if value is not None else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    return None


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
