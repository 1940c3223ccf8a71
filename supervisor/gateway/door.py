"""The front door of every listener: who is calling, what they may do, and one usage row per request.

It is the outermost layer of each listener's ASGI app. For every HTTP request it

- opens an ``Exchange``: the request's id (sent back as ``X-Request-Id``), its key, and what
  the handlers learn on the way (model, engine, class, seconds queued), plus what the door
  itself sees pass (status, bytes, time to first byte, the token counts in the answer's
  ``usage`` and the error code the client got);
- checks the key (``Authorization: Bearer KEY`` or ``x-api-key``) when keys are in force:
  with any key in the key file, or always on a listener reachable beyond loopback. No key
  or an unknown one is a 401 in the listener's own error shape; admin routes need an admin key;
- writes the usage row, and the ``request`` event (the terminal's one line per request),
  when the answer ended, however it ended: refused, failed, cut, or left by its client (499).
  Health and metrics scrapes are not logged.

What a key limits beyond that (models, classes, budgets, requests per minute, concurrency) needs the
request's body, so the handlers ask ``FrontDoor.admit`` once they know the model and class.
The door's state (the key table, the limiter) is changed only by synchronous calls on
trio's thread, so each check-and-count is atomic; the key watcher swaps the table whole.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import attrs
import trio

from supervisor.auth.budgets import BudgetLedger
from supervisor.auth.keys import ApiKey, KeyFile, KeyTable
from supervisor.auth.limits import KeyLimiter, Refused
from supervisor.config.schema import PriceConfig
from supervisor.observe.events import EventLog
from supervisor.gateway.answer_tail import AnswerTail
from supervisor.gateway.http.asgi import ASGI, Receive, RequestError, Scope, Send, header_value, send_whole
from supervisor.gateway.errors import ErrorShape, error_headers
from supervisor.gateway.relay.answer import ANSWER_HEAD, AnswerHead, Framing
from supervisor.gateway.relay.stream_errors import Failure, final_failure
from supervisor.observe.slowdown import Pace, PaceMeter
from supervisor.nodes.state import STATE_PATH
from supervisor.request_class import RequestClass
from supervisor.observe.history import HISTORY_PATH
from supervisor.usage.row import UsageRow
from supervisor.usage.writer import UsageLog

UI_PATH = "/ui"
UI_LIVE_PATH = "/ui/live"
EXCHANGE = "steward.exchange"  # where handlers find the request's Exchange in the ASGI scope
WEBSOCKET_KEY = "steward.websocket_key"  # a websocket's key, as the door found it (None: no key needed)
# Polled every few seconds (steward top polls /admin/state; /admin/events is one long read): served by
# steward itself on every listener.
MONITORING_PATHS = frozenset({"/livez", "/healthz", "/metrics", "/admin/state", "/admin/events"})
# Those and a front door's polls of this node (/steward/state, the OpenAI listener's): no request event
# nor usage row, a count in /metrics instead (steward_polls_answered).
POLL_PATHS = MONITORING_PATHS | {STATE_PATH, HISTORY_PATH, UI_LIVE_PATH}
# A model's readiness (/healthz/models/NAME, gateway/readiness.py): open wherever /healthz is, and
# counted as one path whatever NAME.
READINESS_PREFIX = "/healthz/models/"
READINESS_PATH = READINESS_PREFIX + "NAME"
# An engine's output (`steward logs`, top's log pane): read like the state, counted as one path whatever NAME.
ENGINE_LOGS_PATH = "/admin/engines/NAME/logs"
# The /ui page's shell, its script and its style: no data in them, so a browser (which cannot send a
# key on navigation) may fetch them; the page's data comes from /ui/live, an admin route.
UI_SHELL_PATHS = frozenset({UI_PATH, UI_PATH + "/app.js", UI_PATH + "/app.css"})
# Claude Code's probe when it starts (`HEAD /`, a "preflight" that reads anything but a 2xx as the
# server being down): the OpenAI listener answers it 200 itself (app.py), as llama-server and
# Ollama answer it, without a key and without a usage row. The other listeners pass `/` on.
PROBE = ("HEAD", "/")
# Paths whose last part is itself the credential (an image's URL, as OpenAI hands them out):
# open without a key, and never written whole into a log.
CAPABILITY_PREFIX = "/v1/images/files/"
_ERROR_HEAD = 16384  # of an error answer: enough for its error object
# Token counts as OpenAI, Ollama and Anthropic name them; an escaped quote is inside a string, not a key.
_TOKENS = re.compile(rb'(?<!\\)"(prompt_tokens|completion_tokens|prompt_eval_count|eval_count|input_tokens|'
                     rb'output_tokens|cache_read_input_tokens|cache_creation_input_tokens)"\s*:\s*(\d{1,12})')
_PROMPT = frozenset({b"prompt_tokens", b"prompt_eval_count", b"input_tokens"})
# Anthropic's input beside its input_tokens (which leave the cached part out): added to the prompt.
_CACHED_INPUT = frozenset({b"cache_read_input_tokens", b"cache_creation_input_tokens"})
CREDENTIAL_HEADERS = frozenset({b"authorization", b"x-api-key"})
# llama-server's own measure of its decoding, in the last event of a stream or a whole answer's end.
_DECODED = re.compile(rb'(?<!\\)"predicted_n"\s*:\s*(\d{1,12})')
_DECODE_MS = re.compile(rb'(?<!\\)"predicted_ms"\s*:\s*(\d{1,15}(?:\.\d*)?(?:[eE][-+]?\d{1,3})?)')
_STREAMS = (Framing.EVENT_STREAM, Framing.NDJSON)


@attrs.define(eq=False)
class Exchange:
    """One HTTP request, from its arrival to the end of its answer: its usage row in the making."""

    request_id: str
    listener: str
    method: str
    route: str
    wall: float  # arrival, Unix time
    arrived: float  # arrival, trio's clock
    key: ApiKey | None = None
    model: str | None = None
    engine: str | None = None
    klass: RequestClass | None = None
    queued_s: float | None = None
    gpu_s: float | None = None  # what its steps held, added up (the scheduler's StepAccount)
    price: PriceConfig | None = None  # a remote model's: what its tokens cost (the row's cost)
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    input_chars: int | None = None  # a speech request's input (gateway/openai/speech.py)
    audio_s: float | None = None  # the seconds of audio a speech answer carried so far (relay/speech_audio.py)
    status: int | None = None  # as sent
    # The engine's own error, as a wrapper read it before putting it in the route's words (reshaped.py).
    engine_failure: Failure | None = None
    complete: bool = False
    client_left: bool = False
    # It left after the answer had told it of a failure (an error event: the SDKs stop reading there).
    left_on_failure: bool = False
    first_byte: float | None = None  # of the answer's body (a stream's keep-alive comments are not its start)
    last_byte: float | None = None
    request_bytes: int = 0
    response_bytes: int = 0
    _framing: Framing = Framing.OTHER  # the tail is kept of any other (JSON, an event stream, NDJSON)
    _tail: AnswerTail = attrs.Factory(AnswerTail)
    _tail_tokens: tuple[int | None, int | None] | None = None  # read from the tail once, when asked
    _error_head: bytes = b""

    @classmethod
    def arriving(cls, scope: Scope, listener: str) -> Exchange:
        route = CAPABILITY_PREFIX + "{token}" if scope["path"].startswith(CAPABILITY_PREFIX) else scope["path"]
        return cls(secrets.token_hex(8), listener, scope["method"], route, time.time(), trio.current_time())

    def waited(self, seconds: float) -> None:
        """A step of this request waited *seconds* in steward's queue (steps add up)."""
        self.queued_s = (self.queued_s or 0.0) + seconds

    def held(self, seconds: float) -> None:
        """A granted step of this request held its slot (or the GPU) *seconds* (steps add up)."""
        self.gpu_s = (self.gpu_s or 0.0) + seconds

    def count_tokens(self, prompt: int | None, completion: int | None) -> None:
        """Counts a handler read itself (a usage chunk it kept from a client that did not ask for it)."""
        self.prompt_tokens = prompt if prompt is not None else self.prompt_tokens
        self.completion_tokens = completion if completion is not None else self.completion_tokens

    def count_audio(self, seconds: float | None) -> None:
        """The seconds of audio a speech answer has carried so far (None: its format is not measured)."""
        self.audio_s = seconds

    def leaves(self) -> None:
        """The client hung up: before its answer ended, or on the failure the answer told it of."""
        self.client_left = True
        self.left_on_failure = self.failure() is not None

    def engine_failed(self, failure: Failure) -> None:
        """The engine's error, read before steward reshaped it: the usage row keeps its code (the
        client may get Anthropic's type instead), and a stream it ended records its status."""
        if self.engine_failure is None:
            self.engine_failure = failure

    def saw_start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.saw_head(AnswerHead.of(status, headers))

    def saw_head(self, head: AnswerHead) -> None:
        self.status = head.status
        self._framing = head.framing

    def saw_body(self, chunk: bytes, now: float) -> None:
        if not chunk:
            return
        if self.first_byte is None and not (self._framing is Framing.EVENT_STREAM and _only_comments(chunk)):
            self.first_byte = now
        self.last_byte = now
        self.response_bytes += len(chunk)
        if self._framing is not Framing.OTHER:
            self._tail.add(chunk)
            self._tail_tokens = None
            # The last event of a whole stream: a client may rightly close on it before the relay's
            # own end of the body, and that answer was still served in full.
            if self.status == 200 and self._tail.at_stream_end:
                self.complete = True
        if (self.status or 0) >= 400 and len(self._error_head) < _ERROR_HEAD:
            self._error_head += chunk[:_ERROR_HEAD - len(self._error_head)]

    def decoding(self, now: float) -> tuple[int | None, float, float, float] | None:
        """How the answer decoded: (tokens, the seconds they took, and when it decoded: from, to),
        by the engine's own ``timings`` where it sent them, else the tokens after the first as a
        stream's first and last bytes came; None when that cannot be told (an answer sent whole
        without timings, such as one steward cut into steps: gateway/chunked.py)."""
        end = self.last_byte if self.last_byte is not None else now
        streamed = self._framing in _STREAMS and self.first_byte is not None
        tail = self._tail.bytes()
        counted, spent = _DECODED.findall(tail), _DECODE_MS.findall(tail)
        if counted and spent:
            seconds = float(spent[-1]) / 1000
            start = self.first_byte if streamed and self.first_byte is not None else end - seconds
            return int(counted[-1]), seconds, start, end
        if streamed and self.first_byte is not None:
            tokens = self.completion_tokens if self.completion_tokens is not None else self.tail_tokens()[1]
            return None if tokens is None else tokens - 1, end - self.first_byte, self.first_byte, end
        return None

    def row(self, now: float, pace: Pace | None = None) -> UsageRow:
        status = self.status if self.status is not None else 500
        failure = self.failure()
        if status == 200 and failure is not None:
            status = failure.status  # the stream's 200 went out before it failed
        if self.client_left and not self.complete and not self.left_on_failure:
            status = 499  # the client left before its answer ended (not on a failure it was told of)
        prompt, completion = self.prompt_tokens, self.completion_tokens
        if prompt is None and completion is None and self._tail:
            prompt, completion = self.tail_tokens()
        error = self.error
        if error is None and status >= 400:
            if status == 499:
                error = "client_left"
            else:
                error = failure.code if failure is not None else _error_code(self._error_head)
        return UsageRow(
            ts=self.wall, request_id=self.request_id, key=self.key.name if self.key is not None else None,
            listener=self.listener, method=self.method, route=self.route, model=self.model, engine=self.engine,
            klass=self.klass, status=status, error=error, queued_s=_round(self.queued_s),
            ttft_s=_round(None if self.first_byte is None else self.first_byte - self.arrived),
            duration_s=round(now - self.arrived, 6), prompt_tokens=prompt, completion_tokens=completion,
            request_bytes=self.request_bytes, response_bytes=self.response_bytes,
            decode_tps=pace.decode_tps if pace is not None else None,
            slowdown=pace.slowdown if pace is not None else None, gpu_s=_round(self.gpu_s),
            cost=None if self.price is None else round(self.price.cost(prompt, completion), 9),
            input_chars=self.input_chars, audio_s=self.audio_s)

    def tail_tokens(self) -> tuple[int | None, int | None]:
        """The token counts at the answer's end, read once (the answer ended: its tail is whole)."""
        if self._tail_tokens is None:
            self._tail_tokens = _read_tokens(self._tail.bytes())
        return self._tail_tokens

    def failure(self) -> Failure | None:
        """The error the answer ended on, where its status does not tell it all: the engine's own
        (engine_failed), else the error event a stream ended on (stream_errors.py)."""
        if self.engine_failure is not None:
            return self.engine_failure
        if self._framing is Framing.EVENT_STREAM:
            return final_failure(self._tail.bytes(), lines=False)
        if self._framing is Framing.NDJSON:
            return final_failure(self._tail.bytes(), lines=True)
        return None


class Refusal(RequestError):
    """The door turned a request away for its key (401, 403, 429): logged as ``refused``."""


def exchange_of(scope: Scope) -> Exchange:
    """The request's Exchange; a scope that never passed the door (tests of a bare app) gets a loose one."""
    exchange = scope.get(EXCHANGE)
    if exchange is None:
        exchange = scope[EXCHANGE] = Exchange.arriving(scope, "(none)")
    return exchange


def _only_comments(chunk: bytes) -> bool:
    """An SSE chunk of nothing but comments (llama-server's keep-alive ``:`` while it reads a long prompt)."""
    return all(line.startswith(b":") for line in chunk.splitlines() if line.strip())


def _read_tokens(tail: bytes) -> tuple[int | None, int | None]:
    prompt = completion = None
    cached: dict[bytes, int] = {}
    for name, value in _TOKENS.findall(tail):  # the last count of each kind wins: the final chunk's
        if name in _PROMPT:
            prompt = int(value)
        elif name in _CACHED_INPUT:
            cached[name] = int(value)
        else:
            completion = int(value)
    if prompt is not None:
        prompt += sum(cached.values())
    return prompt, completion


def _error_code(head: bytes) -> str | None:
    """The code of an error object in any listener's shape (OpenAI's, llama-server's, ComfyUI's)."""
    try:
        body = json.loads(head)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None
    for field in ("code", "type"):  # llama-server's code is the HTTP status; its type names the error
        if isinstance(error.get(field), str) and error[field]:
            return error[field][:64]
    return None


def _round(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 6)


def presented_key(scope: Scope) -> str | None:
    """The key a client sent: `Authorization: Bearer KEY` (OpenAI's SDKs) or `x-api-key` (Anthropic's)."""
    authorization = header_value(scope, b"authorization")
    if authorization is not None:
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    api_key = header_value(scope, b"x-api-key")
    return api_key.strip() or None if api_key is not None else None


@attrs.define(eq=False)
class FrontDoor:
    """The keys in force, the per-key limits, and where the usage rows go."""

    events: EventLog
    usage: UsageLog
    # Listeners reachable beyond loopback without keys allowed: they need a key even if none exists.
    exposed: frozenset[str] = frozenset()
    open_paths: frozenset[str] = frozenset({"/livez", "/healthz"})
    aliases: Mapping[str, str] = attrs.Factory(dict)  # every accepted model name -> its model
    keys: KeyTable = attrs.Factory(lambda: KeyTable.from_key_file(KeyFile()))
    limiter: KeyLimiter = attrs.Factory(KeyLimiter)
    budgets: BudgetLedger = attrs.Factory(BudgetLedger)  # what each key used today and this month
    pace: PaceMeter | None = None  # measures each served answer's decode rate and slowdown (slowdown.py)

    def replace_keys(self, table: KeyTable) -> None:
        self.keys = table
        self.limiter.forget({key.name for key in table.keys})

    def required(self, listener: str) -> bool:
        return not self.keys.empty or listener in self.exposed

    def forwardable(self, listener: str, headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """*headers* as they may go upstream: a steward key is steward's credential, not the
        engine's, so once keys are in force it stays here (without keys, a client's own key for
        an attached server goes through)."""
        if not self.required(listener):
            return list(headers)
        return [(k, v) for k, v in headers if k not in CREDENTIAL_HEADERS]

    def is_open(self, path: str) -> bool:
        """Reached without a key: an open path, and a model's readiness where /healthz is open."""
        return path in self.open_paths or ("/healthz" in self.open_paths and path.startswith(READINESS_PREFIX))

    def authenticate(self, scope: Scope, listener: str, *, admin: bool) -> tuple[ApiKey | None, RequestError | None]:
        """The caller's key, or why the request is refused (401 without a valid key, 403 for an admin route)."""
        if not self.required(listener) or self.is_open(scope["path"]) or is_probe(scope, listener) or (
                listener == "openai" and scope.get("method") == "GET" and (
                    scope["path"].startswith(CAPABILITY_PREFIX) or scope["path"] in UI_SHELL_PATHS)):
            return None, None
        presented = presented_key(scope)
        key = self.keys.lookup(presented) if presented is not None else None
        if key is None:
            if self.keys.empty:
                message = ("steward listens beyond loopback and has no keys; add one with `steward keys add NAME "
                           "--config CONFIG`")
            elif presented is None:
                message = "This request needs an API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`."
            else:
                message = "The API key is not one steward knows (it may have been removed)."
            return None, RequestError(401, message, code="invalid_api_key")
        if admin and not key.admin:
            return key, RequestError(403, f"Key {key.name!r} is not an admin key; this route needs one.",
                                     code="admin_required")
        return key, None

    def default_class(self, exchange: Exchange, fallback: RequestClass) -> RequestClass:
        """The class a request gets when it asks for none: its key's default, else the listener's."""
        return exchange.key.default_class_or(fallback) if exchange.key is not None else fallback

    @contextmanager
    def admit(self, exchange: Exchange, *, model: str | None, klass: RequestClass) -> Iterator[None]:
        """Hold one of the key's requests for the body of the ``with``; RequestError (403, 429) if
        the key may not use *model* or *klass*, has spent a budget, or is over its rate or concurrency."""
        key = exchange.key
        if key is None:
            yield
            return
        if model is not None and not self.may_use(key, model):
            self.refuse(exchange, "model_not_allowed")
            raise Refusal(403, f"Key {key.name!r} may not use the model {model!r}; it may use: "
                               f"{', '.join(key.models or ())}.", param="model", code="model_not_allowed")
        if not key.may_ask(klass):
            self.refuse(exchange, "class_not_allowed")
            raise Refusal(403, f"Key {key.name!r} may not ask for the class {str(klass)!r}; it may use: "
                               f"{', '.join(key.allowed_classes)}.", code="class_not_allowed")
        # Before the rate: a request refused for its budget takes none of the key's rate.
        if (spent := self.budgets.check(key)) is not None:
            self.refuse(exchange, "budget_exhausted")
            raise Refusal(429, f"Key {key.name!r} has spent a budget: {spent.message}.", code="budget_exhausted",
                          retry_after=spent.retry_after(self.budgets.clock()))
        admission = self.limiter.admit(key, trio.current_time())
        if isinstance(admission, Refused):
            code = f"{admission.reason.value}_limited"
            self.refuse(exchange, code)
            raise Refusal(429, admission.message, code=code, retry_after=admission.retry_after)
        try:
            yield
        finally:
            self.limiter.release(admission)

    def may_use(self, key: ApiKey, model: str) -> bool:
        if key.models is None:
            return True
        return model in key.models or model in {self.aliases.get(name, name) for name in key.models}

    def refuse(self, exchange: Exchange, reason: str) -> None:
        exchange.error = reason
        self.events.emit("refused", "info", listener=exchange.listener, route=exchange.route, reason=reason,
                         key=exchange.key.name if exchange.key is not None else None, model=exchange.model,
                         **{"class": exchange.klass}, request_id=exchange.request_id)

    async def refuse_websocket(self, scope: Scope, send: Send, listener: str, reason: str | None,
                               key: ApiKey | None) -> None:
        """A websocket the door or a listener turns away: a ``refused`` event, then closed before
        it is accepted (hypercorn answers the handshake 403)."""
        self.events.emit("refused", "info", listener=listener, route=scope["path"], reason=reason,
                         key=key.name if key is not None else None, model=None, **{"class": None}, request_id=None)
        await send({"type": "websocket.close", "code": 1008})

    def record(self, exchange: Exchange) -> None:
        """The request ended: its usage row, and its one line in the event log (``request``)."""
        now = trio.current_time()
        pace = self._pace(exchange, now)
        row = exchange.row(now, pace)
        self.usage.record(row)
        beside = None if pace is None or pace.beside is None else [c.label() for c in pace.beside]
        self.events.emit("request", "info", listener=row.listener, method=row.method, route=row.route,
                         model=row.model, **{"class": row.klass}, status=row.status, error=row.error,
                         queued_s=row.queued_s, duration_s=row.duration_s, prompt_tokens=row.prompt_tokens,
                         completion_tokens=row.completion_tokens, key=row.key, request_id=row.request_id,
                         ttft_s=row.ttft_s, decode_tps=row.decode_tps, slowdown=row.slowdown, beside=beside,
                         gpu_s=row.gpu_s, cost=row.cost, input_chars=row.input_chars, audio_s=row.audio_s)

    def _pace(self, exchange: Exchange, now: float) -> Pace | None:
        """A served answer's decode rate and slowdown, and what computed beside it."""
        if (self.pace is None or exchange.status != 200 or (exchange.client_left and not exchange.complete)
                or exchange.failure() is not None):
            return None
        decoding = exchange.decoding(now)
        if decoding is None:
            return None
        tokens, seconds, start, end = decoding
        return self.pace.measure(exchange.engine, exchange.klass, tokens, seconds, start, end, exchange.prompt_tokens)


def front_door(app: ASGI, door: FrontDoor, listener: str, shape_for: Callable[[Scope], ErrorShape],
               is_admin_route: Callable[[Scope], bool] = lambda scope: False) -> ASGI:
    """*app* behind the door of *listener* (see the module docstring)."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            key, refusal = door.authenticate(scope, listener, admin=is_admin_route(scope))
            if refusal is not None:
                await door.refuse_websocket(scope, send, listener, refusal.code, None)
                return
            scope[WEBSOCKET_KEY] = key
            await app(scope, receive, send)
            return
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        exchange = Exchange.arriving(scope, listener)
        scope[EXCHANGE] = exchange
        request_id = exchange.request_id.encode()

        async def observed_receive() -> dict[str, Any]:
            message = await receive()
            if message["type"] == "http.request":
                exchange.request_bytes += len(message.get("body", b""))
            elif message["type"] == "http.disconnect":
                exchange.leaves()
            return message

        async def observed_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                head = message.get(ANSWER_HEAD)  # read by the relay; else read here
                headers = message.get("headers", ())
                exchange.saw_head(head if head is not None else AnswerHead.of(message["status"], headers))
                message = {**message, "headers": [*headers, (b"x-request-id", request_id)]}
            elif message["type"] == "http.response.body":
                exchange.saw_body(message.get("body", b""), trio.current_time())
                if not message.get("more_body", False):
                    exchange.complete = True
            await send(message)

        try:
            exchange.key, refusal = door.authenticate(scope, listener, admin=is_admin_route(scope))
            if refusal is None:
                await app(scope, observed_receive, observed_send)
            else:
                door.refuse(exchange, refusal.code or "unauthorized")
                await _send_auth_refusal(observed_send, refusal, shape_for(scope), body_unread(scope))
        finally:
            if (polled := polled_path(scope["path"])) is not None:
                door.events.count("poll_answered", listener=listener, path=polled)
            elif not is_probe(scope, listener):
                door.record(exchange)

    return guarded


def polled_path(path: str) -> str | None:
    """*path* as ``steward_polls_answered`` counts it if it is a poll (``ENGINE_LOGS_PATH`` for
    every engine's logs: a label per name a client sends would grow without end), else None."""
    if path in POLL_PATHS:
        return path
    if path.startswith(READINESS_PREFIX):
        return READINESS_PATH
    return ENGINE_LOGS_PATH if engine_logs_name(path) is not None else None


def engine_logs_name(path: str) -> str | None:
    """NAME of ``/admin/engines/NAME/logs``, else None."""
    prefix, _, rest = path.partition("/admin/engines/")
    name, slash, tail = rest.rpartition("/")
    return name if not prefix and slash and tail == "logs" and name and "/" not in name else None


def is_probe(scope: Scope, listener: str = "openai") -> bool:
    return listener == "openai" and (scope.get("method"), scope.get("path")) == PROBE


def body_unread(scope: Scope) -> bool:
    """Whether the request has a body the refusal goes out before: the connection cannot be
    used again until that body was read, so the answer says it closes (a client that sent the
    body in a second packet would otherwise send its next request on a closed connection)."""
    length = header_value(scope, b"content-length")
    return (length is not None and length.strip() not in ("", "0")) or header_value(scope, b"transfer-encoding") \
        is not None


async def _send_auth_refusal(send: Send, refusal: RequestError, shape: ErrorShape, close: bool) -> None:
    body = shape(refusal.status, refusal.message, code=refusal.code)
    headers = error_headers(body, shape=shape)
    if close:
        headers.append((b"connection", b"close"))
    if refusal.status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="steward"'))
    await send_whole(send, refusal.status, headers, body)
