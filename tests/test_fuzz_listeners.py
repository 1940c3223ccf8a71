"""Property-based tests of every listener: whatever a client sends, steward answers it
itself in the listener's error shape, or passes on the engine's own answer, and stays up;
with keys in force, nothing gets through without one.

One steward for the whole module, with all three listeners, every process real: fake
llama-servers (``chat``, alias ``gpt-4o``, and a pinned ``embed``) and an image model
(``sketch``, a workflow run on ComfyUI) behind the OpenAI listener, a fake Ollama behind
the Ollama listener and a fake ComfyUI behind the ComfyUI listener, both supervised by
steward. Hypothesis sends each listener raw HTTP/1.1 requests built in
``tests/fuzz_strategies.py`` (methods, paths and near misses of the real routes, headers,
valid bodies mutated, hostile strings over the whole of Unicode in every field, header and
path steward reads, and bodies that are not bodies at all), one fresh connection per
example, first with no keys, then with the keys of ``FUZZ_KEYS`` in force (written to the
steward's key file with ``supervisor.auth.keys``, picked up by its key watcher: one steward
for both), each request then showing a key, a limited one, a bad one or none. It checks
four things per example:

1. steward never answers 5xx itself. An engine's or upstream's own 5xx, passed through,
   is fine; so is the 502 steward answers when the upstream broke the connection without
   answering, if the upstream's own log says it failed on that request (every fake logs
   ``fake: connection from ... failed: <exception>`` then, ``fakes/http11.py``; steward
   writes that line into its event log as ``engine_output``). Such a 502 is a fake that
   is less robust than the runtime it copies (rule 2 still applies to it); the
   benchmark counts them apart.
2. Every error steward writes itself (a 4xx or 5xx not from the upstream) has the
   listener's error shape, exactly:

   * the OpenAI listener, and the Ollama listener on paths under ``/v1/``:
     ``{"error": {"message": str, "type": str, "param": str | null, "code": str | null}}``,
     with no other key at either level;
   * the Ollama listener on paths under ``/api/``: ``{"error": str}``, no other key;
   * the Ollama listener on any other path: either of the two;
   * the ComfyUI listener: a JSON object with an ``"error"`` key whose value is an
     object with a string ``"message"`` and a string ``"type"`` (ComfyUI's own
     ``{"error": {"type", "message", "details", "extra_info"}, "node_errors"}`` and
     OpenAI's object both qualify).

   On ``/v1/models`` an ``anthropic-version`` header asks for Anthropic's shape: either
   qualifies there. The path is the one steward sees: the request target before ``?``,
   percent-decoded (for the absolute form, ``http://host/path``, the shape of either that
   or the URL's path qualifies). Answers to ``HEAD`` have no body; for them only rule 1
   is checked.
3. Afterwards a known-good request on the same listener answers 200 within 30 s: a chat
   (OpenAI), a ``/api/generate`` (Ollama), ``/healthz`` and a passed-through
   ``/system_stats`` (ComfyUI), with the unlimited key while keys are in force; and the
   steward process is still running.
4. With keys in force, a request that shows no key of the file (none, an unknown one, a
   hostile string) is never answered with a status below 400, nor by an upstream that
   signs its answers (llama-server, ComfyUI: below), except on the paths open to all
   (``/livez``, ``/healthz``; GET of an image's URL on the OpenAI listener, where the
   path is the key). A 400 for a string steward refuses (a lone surrogate, say) is an
   error like any other: rule 2 applies to it.

A request that gets no answer at all (the connection closed, or nothing within 15 s)
fails too.

Who wrote an answer is told by what the fakes themselves send (``fakes/``):

* the fake llama-server signs every answer ``Server: llama.cpp``
  (``fakes/llama_server/cli.py``); an answer with that Server value is the engine's;
* the fake ComfyUI signs every answer ``Server: Python/3.12 aiohttp/3.12.15``
  (``fakes/comfyui/cli.py``); an answer with a Server value starting ``Python/`` and
  naming ``aiohttp`` is ComfyUI's;
* the fake Ollama, like Go's net/http, sends no Server header, so its answers are told
  by their Content-Type: it writes ``application/json; charset=utf-8`` (``fakes/http11.py``)
  or ``text/plain; charset=utf-8`` (``fakes/ollama/server.py``), where steward's own
  errors are ``application/json`` (``supervisor/gateway/errors.py``) and Quart's pages
  ``text/html``; its bare 400 for an unreadable request has an empty Server value.
  Should steward ever write errors with one of those two types, this rule would take
  them for Ollama's: they would go unchecked, never fail wrongly (rule 4 therefore
  trusts it only for answers below 400, which are wrong without a key whoever wrote them).

Hypercorn adds its own ``Server: hypercorn-h11`` to every answer; it is ignored.

Examples per listener: ``STEWARD_FUZZ_EXAMPLES`` (default 80: half with no keys, half with
keys in force; with the regressions below the module takes about what it took with 100
examples and keys off alone; Hypothesis draws many a request twice, and a request is sent
only once, so about half as many are sent), plus the listener's regressions (``regressions`` and ``keyed_regressions``
in ``tests/fuzz_strategies.py``: kinds of request that broke a listener before), each its
own test so that every one is reported. Runs are reproducible (``derandomize=True``, no
example database). ``tests/benchmarks/fuzz_listeners.py --long`` runs the same properties
until each listener has had thousands of distinct requests, and counts what it saw.
"""

from __future__ import annotations

import collections
import datetime
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import attrs
import httpcore
import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings

from supervisor.auth.keys import ApiKey, KeyFile, KeyHash, KeyName, key_digest, write_key_file
from tests.conftest import RunningSteward, fake_model, kill_leftovers, free_port, launch_steward
from tests.fuzz_strategies import (
    ALL_KEY,
    CAPABILITY_PREFIX,
    COMFY_ROUTES,
    FUZZ_KEYS,
    IMAGE_MODEL,
    OLLAMA_CHAT,
    OLLAMA_EMBED,
    OLLAMA_ROUTES,
    OPEN_PATHS,
    OPENAI_ROUTES,
    FuzzKey,
    FuzzRequest,
    Route,
    comfy_workflow,
    image_workflow,
    keyed_regressions,
    keyed_requests,
    regressions,
    requests,
)

EXAMPLES = int(os.environ.get("STEWARD_FUZZ_EXAMPLES", "80"))  # per listener: keys off and on together
KEYED_EXAMPLES = max(1, EXAMPLES // 2)
BODY_LIMIT = 64 * 1024            # limits.max_body_size of the module's steward
REQUEST_TIMEOUT_S = 15.0          # one fuzzed request: connect, send, each read
GOOD_TIMEOUT_S = 30.0             # the known-good request after it
MAX_READ = 4 * 1024 * 1024        # of an answer's body; the rest is not read


# ---- what is wrong with an answer


class ListenerViolation(AssertionError):
    """A property failed. Each (kind, status) is its own subclass, so that Hypothesis
    reports (and shrinks) each distinct failure on its own."""


class StewardAnswered5xx(ListenerViolation):
    """Rule 1: a 5xx that steward wrote itself."""


class NotTheListenersErrorShape(ListenerViolation):
    """Rule 2: an error that steward wrote itself (a 4xx, or the 502 for an upstream that
    broke), in some other shape."""


class NoAnswer(ListenerViolation):
    """The connection closed, or nothing came within the timeout."""


class StewardDown(ListenerViolation):
    """Rule 3: the known-good request after the example failed."""


class ServedWithoutAKey(ListenerViolation):
    """Rule 4: with keys in force, a request without a valid key got through."""


@cache
def violation(kind: type[ListenerViolation], status: int | None) -> type[ListenerViolation]:
    return type(f"{kind.__name__}_{status}", (kind,), {"__module__": __name__})


# ---- talking to steward


class _Body(httpx.SyncByteStream):
    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        yield from self._stream

    def close(self) -> None:
        self._stream.close()


class RawTargetTransport(httpx.BaseTransport):
    """httpx's HTTP/1.1 transport, except that the request target goes out exactly as
    given in ``extensions["raw_target"]`` (``httpx.URL`` removes dot segments). One fresh
    connection, closed with the transport."""

    def __init__(self) -> None:
        self._pool = httpcore.ConnectionPool(http1=True, http2=False, max_keepalive_connections=0)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        target = request.extensions.get("raw_target", url.raw_path)
        core = httpcore.Request(request.method, httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port,
                                                             target=target),
                                headers=request.headers.raw, content=request.stream,  # type: ignore[arg-type]
                                extensions=request.extensions)
        response = self._pool.handle_request(core)
        return httpx.Response(response.status, headers=response.headers, stream=_Body(response.stream),
                              extensions=response.extensions)

    def close(self) -> None:
        self._pool.close()


TRANSPORT_ERRORS = (httpx.HTTPError, httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError)


@attrs.frozen
class Answer:
    status: int | None  # None: no answer
    headers: httpx.Headers
    body: bytes
    failure: str = ""  # why there was no answer

    @property
    def servers(self) -> list[str]:
        return self.headers.get_list("server")

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")

    def summary(self) -> str:
        if self.status is None:
            return f"no answer ({self.failure})"
        servers = ", ".join(self.servers)
        return f"{self.status} [{self.content_type or 'no content-type'}; server {servers}] {self.body[:200]!r}"


def send(base_url: str, request: FuzzRequest) -> Answer:
    """*request* on a fresh connection; the answer read in full (up to MAX_READ), as it
    came (no content decoding: neither steward nor the fakes compress)."""
    with httpx.Client(transport=RawTargetTransport(), timeout=REQUEST_TIMEOUT_S) as client:
        content = iter([request.body.data]) if request.chunked else request.body.data
        built = client.build_request(request.method, base_url, headers=list(request.headers),
                                     content=content, extensions={"raw_target": request.target})
        try:
            response = client.send(built, stream=True)
            try:
                body = bytearray()
                for chunk in response.iter_raw():
                    body += chunk
                    if len(body) >= MAX_READ:
                        break
            finally:
                response.close()
        except httpcore.LocalProtocolError:
            raise  # the request itself cannot be sent: a bug in the strategies, not in steward
        except TRANSPORT_ERRORS as exc:
            return Answer(None, httpx.Headers(), b"", f"{type(exc).__name__}: {exc}")
    return Answer(response.status_code, response.headers, bytes(body))


# ---- the listeners


def _openai_problem(value: Any) -> str | None:
    if not isinstance(value, dict) or set(value) != {"error"}:
        return "not {'error': {...}} alone"
    error = value["error"]
    if not isinstance(error, dict) or set(error) != {"message", "type", "param", "code"}:
        return "the error object's keys are not exactly message, type, param, code"
    if not isinstance(error["message"], str) or not isinstance(error["type"], str):
        return "message or type is not a string"
    if not all(error[k] is None or isinstance(error[k], str) for k in ("param", "code")):
        return "param or code is neither a string nor null"
    return None


def _ollama_native_problem(value: Any) -> str | None:
    if not isinstance(value, dict) or set(value) != {"error"} or not isinstance(value["error"], str):
        return "not Ollama's {'error': '...'}"
    return None


def _comfy_problem(value: Any) -> str | None:
    error = value.get("error") if isinstance(value, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str) \
            or not isinstance(error.get("type"), str):
        return "not a JSON object whose 'error' has a string message and type"
    return None


def _as_json(body: bytes) -> tuple[Any, str | None]:
    try:
        return json.loads(body), None
    except ValueError:
        return None, "not JSON"


def _anthropic_problem(value: Any) -> str | None:
    if not isinstance(value, dict) or set(value) != {"type", "error"} or value["type"] != "error":
        return "not Anthropic's {'type': 'error', 'error': {...}}"
    error = value["error"]
    if not isinstance(error, dict) or set(error) != {"type", "message"} \
            or not all(isinstance(error[k], str) for k in ("type", "message")):
        return "the error object is not exactly a string type and message"
    return None


def _openai_or_anthropic_problem(path: str, value: Any, anthropic: bool) -> str | None:
    """The error object of a /v1 path: Anthropic's on the Messages routes, and on /v1/models
    asked with an anthropic-version header (either there); else OpenAI's."""
    if path.startswith("/v1/messages"):
        return _anthropic_problem(value)
    problem = _openai_problem(value)
    if problem and anthropic and path.startswith("/v1/models") and _anthropic_problem(value) is None:
        return None
    return problem


def openai_shape(path: str, body: bytes, anthropic: bool = False) -> str | None:
    value, problem = _as_json(body)
    return problem or _openai_or_anthropic_problem(path, value, anthropic)


def ollama_shape(path: str, body: bytes, anthropic: bool = False) -> str | None:
    value, problem = _as_json(body)
    if problem:
        return problem
    if path.startswith("/api/"):
        return _ollama_native_problem(value)
    if path.startswith("/v1/"):
        return _openai_or_anthropic_problem(path, value, anthropic)
    if _ollama_native_problem(value) and _openai_problem(value):
        return "neither Ollama's {'error': '...'} nor OpenAI's error object"
    return None


def comfy_shape(path: str, body: bytes, anthropic: bool = False) -> str | None:
    value, problem = _as_json(body)
    return problem or _comfy_problem(value)


def from_llama_server(answer: Answer) -> bool:
    return "llama.cpp" in answer.servers


def from_ollama(answer: Answer) -> bool:
    kind = answer.content_type.lower().replace(" ", "")
    return kind in ("application/json;charset=utf-8", "text/plain;charset=utf-8") or "" in answer.servers


def from_comfyui(answer: Answer) -> bool:
    return any(s.startswith("Python/") and "aiohttp" in s for s in answer.servers)


@attrs.frozen
class GoodRequest:
    method: str
    path: str
    body: dict[str, Any] | None = None


@attrs.frozen
class Listener:
    name: str
    url: str
    routes: tuple[Route, ...]
    from_upstream: Callable[[Answer], bool]
    # (path steward sees, body, an anthropic-version header sent) -> what is wrong, or None
    error_shape: Callable[[str, bytes, bool], str | None]
    good: tuple[GoodRequest, ...]
    upstreams: frozenset[str]  # the engines behind it, as the event log names them
    # Its upstream signs every answer (a Server header): from_upstream is then sure, not a guess.
    upstream_signs: bool = True

    def open_to_all(self, method: str, path: str) -> bool:
        """Whether the door lets *path* through without a key (rule 4); on the OpenAI listener also
        Claude Code's probe, `HEAD /` (steward answers it 200 itself: supervisor/gateway/door.py PROBE)."""
        return path in OPEN_PATHS or (self.name == "openai" and (
            (method == "GET" and path.startswith(CAPABILITY_PREFIX)) or (method, path) == ("HEAD", "/")))


UPSTREAM_FAILED = "fake: connection from "  # ... failed: <exception>, logged by every fake (fakes/http11.py)


def api_key(key: FuzzKey) -> ApiKey:
    """*key* as the key file holds it (as `steward keys add` would write it: its default class
    the highest it may ask for)."""
    return ApiKey(name=KeyName(key.name), hash=KeyHash(key_digest(key.text)), models=key.models,
                  classes=key.classes, default_class=key.classes[0] if key.classes else None, rpm=key.rpm,
                  concurrency=key.concurrency, admin=key.admin,
                  created=datetime.datetime.now(datetime.UTC).replace(microsecond=0))


@attrs.define(eq=False, repr=False)
class FuzzSteward:
    steward: RunningSteward
    listeners: dict[str, Listener]
    keys_path: Path  # auth.keys_file: FUZZ_KEYS while keys are on, no key while off
    keys_on: bool = False
    _log_offset: int = 0  # how far upstream_failures has read the event log
    # The requests sent last, newest last: a task steward shares (the usage writer, say) may fail
    # a moment after the request that broke it, when the next one is under way.
    recent: collections.deque[str] = attrs.Factory(lambda: collections.deque(maxlen=4))
    # What check() found per (listener, keys on, request): Hypothesis draws many a request twice.
    outcomes: dict[tuple[str, bool, FuzzRequest], tuple[type[ListenerViolation], str] | None] = attrs.Factory(dict)

    def __repr__(self) -> str:
        keys = "keys on" if self.keys_on else "keys off"
        return f"<FuzzSteward pid={self.steward.process.pid} {' '.join(sorted(self.listeners))}, {keys}>"

    def use_keys(self, on: bool, timeout: float = 30.0) -> None:
        """Put FUZZ_KEYS in force (*on*) or none, and wait until steward has loaded the file."""
        if on == self.keys_on:
            return
        offset = self.steward.events_path.stat().st_size
        keys = tuple(api_key(key) for key in FUZZ_KEYS) if on else ()
        write_key_file(self.keys_path, KeyFile(keys=keys))
        deadline = time.monotonic() + timeout
        while not any(record.get("event") == "keys_loaded" and record.get("keys") == len(keys)
                      for record in self._records_from(offset)):
            if time.monotonic() > deadline or self.steward.process.poll() is not None:
                raise AssertionError(f"steward did not load the key file ({len(keys)} keys) within {timeout} s")
            time.sleep(0.02)
        self.keys_on = on

    def credential(self) -> dict[str, str]:
        """The header the known-good requests send: the unlimited key while keys are on."""
        return {"authorization": f"Bearer {ALL_KEY.text}"} if self.keys_on else {}

    def _records_from(self, offset: int) -> Iterator[dict[str, Any]]:
        with open(self.steward.events_path, "rb") as log:
            log.seek(offset)
            lines = log.read().splitlines()
        for line in lines:
            try:
                yield json.loads(line)
            except ValueError:
                continue  # a line still being written

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # how Hypothesis prints a failing example
        printer.text(repr(self))

    def mark(self) -> None:
        """From here on, upstream_failures sees only what is logged from now on."""
        self._log_offset = self.steward.events_path.stat().st_size

    def upstream_failures(self, engines: frozenset[str], wait: float = 2.0) -> list[str]:
        """Lines in which one of *engines* logged, since mark(), that a request broke it
        (waiting up to *wait* seconds for steward to pass the engine's output on)."""
        deadline = time.monotonic() + wait
        while True:
            found = []
            for record in self._records_from(self._log_offset):
                text = str(record.get("line", ""))
                if record.get("event") == "engine_output" and record.get("engine") in engines \
                        and UPSTREAM_FAILED in text and "failed:" in text:
                    found.append(text)
            if found or time.monotonic() > deadline:
                return found
            time.sleep(0.05)


def seen_path(target: bytes) -> str:
    """The path as Hypercorn hands it to steward: before '?', percent-decoded."""
    return unquote(target.split(b"?", 1)[0].decode("ascii"))


def seen_paths(target: bytes) -> tuple[str, ...]:
    """The paths a layer of steward may read from *target*: Hypercorn's (seen_path); for the
    absolute form (``http://host/path``, as sent to a proxy) also the URL's path, which Quart's
    routing reads where the front door sees the whole URL; and for a path that begins with
    several slashes also the one werkzeug's routing matches (``//v1/messages`` is the Messages
    route to it: a wrong method there is its 405, in Anthropic's shape)."""
    path = seen_path(target)
    if path.startswith(("http://", "https://")):
        return path, "/" + path.split("://", 1)[1].partition("/")[2]
    if path.startswith("//"):
        return path, "/" + path.lstrip("/")
    return (path,)


@attrs.frozen
class Verdict:
    origin: str  # "upstream", "steward", "upstream broke" (a 502 for a fake that failed), "none" (no answer)
    failure: ListenerViolation | None = None


def judge(fuzz: FuzzSteward, listener: Listener, request: FuzzRequest, answer: Answer) -> Verdict:
    """Who wrote *answer*, and what rules 1, 2 and 4 (and the need for an answer) say about it.
    Call fuzz.mark() before sending *request*."""
    keys = "keys on" if fuzz.keys_on else "keys off"
    where = f"{listener.name} listener, {keys}: {request.describe()}\n  -> {answer.summary()}"
    if answer.status is None:
        return Verdict("none", violation(NoAnswer, None)(where))
    paths = seen_paths(request.target)
    upstream = listener.from_upstream(answer)
    if fuzz.keys_on and request.keyed is False and not any(listener.open_to_all(request.method, p) for p in paths) \
            and ((upstream and listener.upstream_signs) or answer.status < 400):
        served = "the upstream answered" if upstream else "steward answered"
        return Verdict("upstream" if upstream else "steward", violation(ServedWithoutAKey, answer.status)(
            f"{where}\n  ({served} a request without a valid key)"))
    if upstream:
        return Verdict("upstream")
    if answer.status < 400:
        return Verdict("steward")
    anthropic = any(name.lower() == b"anthropic-version" for name, _ in request.headers)
    problem = None
    if request.method != "HEAD":  # its answer has no body
        problems = [listener.error_shape(p, answer.body, anthropic) for p in paths]
        problem = None if None in problems else problems[0]  # fine if fine for one reading of the path
    broke = fuzz.upstream_failures(listener.upstreams) if answer.status == 502 else []
    origin = "upstream broke" if broke else "steward"
    if answer.status >= 500 and not broke:
        return Verdict(origin, violation(StewardAnswered5xx, answer.status)(f"{where}\n  (shape: {problem or 'fine'})"))
    if problem:
        return Verdict(origin, violation(NotTheListenersErrorShape, answer.status)(f"{where}\n  ({problem})"))
    return Verdict(origin)


def still_up(fuzz: FuzzSteward, listener: Listener, after: FuzzRequest | None = None) -> ListenerViolation | None:
    """Rule 3: the listener's known-good requests answer 200; None if they all do."""
    context = f" after {after.describe()}" if after is not None else ""
    for good in listener.good:
        try:
            response = httpx.request(good.method, listener.url + good.path, json=good.body, timeout=GOOD_TIMEOUT_S,
                                     headers=fuzz.credential())
            outcome = f"{response.status_code} {response.content[:200]!r}"
            ok = response.status_code == 200
        except httpx.HTTPError as exc:
            outcome, ok = f"{type(exc).__name__}: {exc}", False
        if not ok or fuzz.steward.process.poll() is not None:
            exited = fuzz.steward.process.poll() is not None
            state = f"exited {fuzz.steward.process.returncode}" if exited else "running"
            before = list(fuzz.recent)[:-1] if after is not None else list(fuzz.recent)
            earlier = "".join(f"\n    {line}" for line in before) if exited and before else ""
            return violation(StewardDown, None)(
                f"{listener.name} listener: {good.method} {good.path} -> {outcome} (steward {state}){context}"
                + (f"\n  sent before it, newest last:{earlier}" if earlier else ""))
    return None


def exercise(fuzz: FuzzSteward, name: str, request: FuzzRequest) -> tuple[Answer, Verdict, ListenerViolation | None]:
    """Send *request* to listener *name*, judge the answer, check the listener is still up."""
    listener = fuzz.listeners[name]
    fuzz.mark()
    fuzz.recent.append(f"{name} listener, keys {'on' if fuzz.keys_on else 'off'}: {request.describe()[:300]}")
    answer = send(listener.url, request)
    verdict = judge(fuzz, listener, request, answer)
    return answer, verdict, still_up(fuzz, listener, request)


def check(fuzz: FuzzSteward, name: str, request: FuzzRequest) -> None:
    """Raise what exercise() finds; a request seen before is not sent again, the same
    outcome is raised again (so Hypothesis sees one outcome per request)."""
    key = (name, fuzz.keys_on, request)
    if key not in fuzz.outcomes:
        _, verdict, down = exercise(fuzz, name, request)
        failure = verdict.failure or down
        fuzz.outcomes[key] = None if failure is None else (type(failure), str(failure))
    if (outcome := fuzz.outcomes[key]) is not None:
        kind, message = outcome
        raise kind(message)


# ---- the module's steward

CHAT_OK = GoodRequest("POST", "/v1/chat/completions", {"model": "chat", "max_tokens": 1,
                                                       "messages": [{"role": "user", "content": "still there?"}]})
GENERATE_OK = GoodRequest("POST", "/api/generate", {"model": OLLAMA_CHAT, "prompt": "still there?", "stream": False})


def steward_sections(ollama_port: int, comfy_port: int, keys_path: Path) -> dict[str, Any]:
    """The module steward's config: fast fakes, short polls, a 64 KiB body limit, the key file
    looked at every 0.1 s."""
    return {
        "limits": {"max_body_size": f"{BODY_LIMIT // 1024}KiB"},
        "auth": {"keys_file": str(keys_path), "reload_interval": "0.1s"},
        "gpu": {"probe": "none", "budget": "16GiB"},
        "scheduler": {"interactive_window": "50ms"},
        "ollama": {"upstream": f"127.0.0.1:{ollama_port}", "listen": f"127.0.0.1:{free_port()}", "memory": "2GiB",
                   "parallel": 2, "ps_poll": "0.2s", "unload_poll": "0.05s", "unload_timeout": "3s",
                   "retry_initial": "0.1s", "retry_max": "1s",
                   "command": [sys.executable, "-m", "fakes.ollama", "--port", str(ollama_port),
                               "--model", f"{OLLAMA_CHAT},size=1GiB,load=0.05s,tps=2000",
                               "--model", f"{OLLAMA_EMBED},size=0.2GiB,load=0.05s,embed",
                               "--num-predict", "4", "--unload-lag", "0.05s"]},
        "comfyui": {"upstream": f"127.0.0.1:{comfy_port}", "listen": f"127.0.0.1:{free_port()}", "memory": "4GiB",
                    "history_poll": "0.05s", "free_timeout": "3s", "job_timeout": "10s",
                    "retry_initial": "0.1s", "retry_max": "1s",
                    "command": [sys.executable, "-m", "fakes.comfyui", "--port", str(comfy_port),
                                "--job-time", "0.05s", "--free-delay", "0.05s", "--model-memory", "2GiB"]},
    }


MODELS = {
    "chat": fake_model("1GiB", parallel=2, load_time="0.05s", tps=2000, aliases=["gpt-4o"],
                       extra=["--ctx-size", "512", "--max-tokens-default", "4"]),
    "embed": fake_model("0.5GiB", parallel=2, load_time="0.05s", extra=["--embeddings"], pinned=True),
}


def image_model(run_dir: Path) -> dict[str, Any]:
    """The image model (its workflow written to *run_dir*): small images, two steps."""
    workflow = run_dir / f"{IMAGE_MODEL}.json"
    workflow.write_text(json.dumps(image_workflow()))
    return {"runtime": "comfyui", "workflow": str(workflow), "size": "64x64", "steps": 2}


@contextmanager
def open_fuzz_steward(run_dir: Path) -> Iterator[FuzzSteward]:
    """Start the module's steward (which starts the fake Ollama and ComfyUI), wait until
    every listener does real work, and stop it all afterwards, leaving no process behind."""
    registry: list[RunningSteward] = []
    try:
        keys_path = run_dir / "steward-keys.json"
        steward = launch_steward(run_dir, {**MODELS, IMAGE_MODEL: image_model(run_dir)}, registry,
                                 **steward_sections(free_port(), free_port(), keys_path))
        listening = steward.wait_event("listening")
        for service in ("ollama", "comfyui"):
            steward.wait_event("upstream_probe", timeout=30, service=service)
        fuzz = FuzzSteward(steward, {
            "openai": Listener("openai", steward.url, OPENAI_ROUTES, from_llama_server, openai_shape, (CHAT_OK,),
                               frozenset(MODELS)),
            "ollama": Listener("ollama", listening["ollama"][0], OLLAMA_ROUTES, from_ollama, ollama_shape,
                               (GENERATE_OK,), frozenset({"ollama"}), upstream_signs=False),
            "comfyui": Listener("comfyui", listening["comfyui"][0], COMFY_ROUTES, from_comfyui, comfy_shape,
                                (GoodRequest("GET", "/healthz"), GoodRequest("GET", "/system_stats")),
                                frozenset({"comfyui"})),
        }, keys_path)
        for listener in fuzz.listeners.values():
            deadline = time.monotonic() + 30
            while (failure := still_up(fuzz, listener)) is not None:  # loads the chat engine and Ollama's model
                if time.monotonic() > deadline:
                    raise failure
                time.sleep(0.2)
        yield fuzz
        assert steward.stop() == 0, steward.stderr_path.read_text()[-3000:]
    finally:
        for started in registry:
            if started.process.poll() is None:
                started.stop(signal.SIGKILL)
        left = kill_leftovers()
        assert not left, f"processes outlived the fuzzed steward: {left}"


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzSteward]:
    with open_fuzz_steward(tmp_path_factory.mktemp("fuzz")) as running:
        yield running


@pytest.fixture(autouse=True)
def no_leaked_children() -> Iterator[None]:
    # The module's steward lives across tests (conftest's per-test check would flag it);
    # open_fuzz_steward checks for leftovers once it has stopped.
    yield


def fuzz_settings(examples: int = EXAMPLES) -> settings:
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None, print_blob=False,
                    phases=(Phase.explicit, Phase.generate, Phase.shrink),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---- the properties


@pytest.mark.slow
@fuzz_settings(max(1, EXAMPLES - KEYED_EXAMPLES))
@given(request=requests(OPENAI_ROUTES, BODY_LIMIT))
def test_the_openai_listener_answers_anything_in_openai_error_shape_and_stays_up(
        fuzz: FuzzSteward, request: FuzzRequest) -> None:
    fuzz.use_keys(False)
    check(fuzz, "openai", request)


@pytest.mark.slow
@fuzz_settings(max(1, EXAMPLES - KEYED_EXAMPLES))
@given(request=requests(OLLAMA_ROUTES, BODY_LIMIT))
def test_the_ollama_listener_answers_anything_in_ollamas_error_shapes_and_stays_up(
        fuzz: FuzzSteward, request: FuzzRequest) -> None:
    fuzz.use_keys(False)
    check(fuzz, "ollama", request)


@pytest.mark.slow
@fuzz_settings(max(1, EXAMPLES - KEYED_EXAMPLES))
@given(request=requests(COMFY_ROUTES, BODY_LIMIT))
def test_the_comfyui_listener_answers_anything_with_an_error_object_and_stays_up(
        fuzz: FuzzSteward, request: FuzzRequest) -> None:
    fuzz.use_keys(False)
    check(fuzz, "comfyui", request)


@pytest.mark.slow
@fuzz_settings(KEYED_EXAMPLES)
@given(request=keyed_requests(OPENAI_ROUTES, BODY_LIMIT))
def test_with_keys_in_force_the_openai_listener_lets_nothing_through_without_one_and_stays_up(
        fuzz: FuzzSteward, request: FuzzRequest) -> None:
    fuzz.use_keys(True)
    check(fuzz, "openai", request)


@pytest.mark.slow
@fuzz_settings(KEYED_EXAMPLES)
@given(request=keyed_requests(OLLAMA_ROUTES, BODY_LIMIT))
def test_with_keys_in_force_the_ollama_listener_lets_nothing_through_without_one_and_stays_up(
        fuzz: FuzzSteward, request: FuzzRequest) -> None:
    fuzz.use_keys(True)
    check(fuzz, "ollama", request)


@pytest.mark.slow
@fuzz_settings(KEYED_EXAMPLES)
@given(request=keyed_requests(COMFY_ROUTES, BODY_LIMIT))
def test_with_keys_in_force_the_comfyui_listener_lets_nothing_through_without_one_and_stays_up(
        fuzz: FuzzSteward, request: FuzzRequest) -> None:
    fuzz.use_keys(True)
    check(fuzz, "comfyui", request)


REGRESSIONS = [(name, keys, request) for name in ("openai", "ollama", "comfyui")
               for keys, made in ((False, regressions), (True, keyed_regressions))
               for request in made(name, BODY_LIMIT)]
# Keys off first, then on: the key file changes once.
REGRESSIONS.sort(key=lambda case: case[1])


def _regression_id(name: str, keys: bool, request: FuzzRequest) -> str:
    body = request.body.kind + (f":{request.body.hostile}" if request.body.hostile else "")
    credential = f" {request.credential}" if keys else ""
    return f"{name}:{request.method} {request.target[:40].decode()} {body}{credential}"


@pytest.mark.slow
@pytest.mark.parametrize(("listener", "keys", "request_"), REGRESSIONS,
                         ids=[_regression_id(*case) for case in REGRESSIONS])
def test_requests_that_broke_a_listener_before_hold_the_same_properties(
        fuzz: FuzzSteward, listener: str, keys: bool, request_: FuzzRequest) -> None:
    fuzz.use_keys(keys)
    check(fuzz, listener, request_)


@pytest.mark.slow
def test_after_the_fuzz_every_listener_still_does_real_work(fuzz: FuzzSteward) -> None:
    fuzz.use_keys(False)
    openai, ollama, comfy = (fuzz.listeners[name].url for name in ("openai", "ollama", "comfyui"))
    assert httpx.post(f"{openai}/v1/embeddings", json={"model": "embed", "input": ["a", "b"]},
                      timeout=GOOD_TIMEOUT_S).status_code == 200
    assert httpx.post(f"{ollama}/api/chat", timeout=GOOD_TIMEOUT_S, json={
        "model": OLLAMA_CHAT, "messages": [{"role": "user", "content": "hi"}], "stream": False}).status_code == 200
    answer = httpx.post(f"{comfy}/prompt", json=comfy_workflow(), timeout=GOOD_TIMEOUT_S)
    assert answer.status_code == 200, answer.text
    fuzz.steward.wait_event("image_released", timeout=GOOD_TIMEOUT_S, prompt_id=answer.json()["prompt_id"])
    image = httpx.post(f"{openai}/v1/images/generations", timeout=GOOD_TIMEOUT_S,
                       json={"model": IMAGE_MODEL, "prompt": "a red square", "response_format": "b64_json"})
    assert image.status_code == 200, image.text
    for listener in fuzz.listeners.values():
        assert still_up(fuzz, listener) is None
    assert httpx.get(f"{comfy}/healthz", timeout=GOOD_TIMEOUT_S).json()["state"] == "idle"
