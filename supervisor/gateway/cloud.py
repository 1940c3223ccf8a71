"""Remote models (`runtime: remote`): a cloud API served as one of steward's models.

A request for one never meets the scheduler: a cloud takes no GPU memory and no engine slot.
It waits instead for one of the model's ``max_concurrency`` places (a ``trio.CapacityLimiter``
per model), at most its class's queue timeout (then 503 ``queue_timeout``, in the route's
shape), and goes to the cloud over HTTPS, its certificate checked against the system's CAs and
the model's ``ca_file`` (https_upstream.py), with the key from the model's ``key_env`` and
``model`` as the cloud names it (``served_name``). The answer comes back through the same relay
and readers as an engine's, unbuffered, its ``model`` naming steward's model. Only a refused
connection is tried again (a few times, soon); a timeout, a failed TLS handshake or the
cloud's own error is answered in the route's shape.

A key reaches a remote model only if it may send private data out of the house: a key whose
model list names the model, or one added with ``--remote``; ``--no-remote`` forbids it whatever
the list says (supervisor/auth/keys.py). The usage row names the engine ``remote:NAME`` and
holds the request's ``cost`` at the model's prices.
"""

from __future__ import annotations

import enum
import math
import os
import ssl
import urllib.parse
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from supervisor.backoff import Backoff
from supervisor.config import RemoteModelConfig
from supervisor.gateway.catalog import ModelCatalog
from supervisor.gateway.door import Exchange, FrontDoor, Refusal
from supervisor.gateway.http.asgi import Scope, Send, send_error
from supervisor.gateway.openai.api_routes import ApiRoute
from supervisor.gateway.relay.answer_model import ModelNamed
from supervisor.gateway.relay.https_upstream import HttpsOpener
from supervisor.gateway.relay.tls import tls_context
from supervisor.gateway.relay.proxy import UpstreamRequest, relay
from supervisor.gateway.relay.reshaped import reading_answer
from supervisor.gateway.relay.upstream import Timeouts
from supervisor.gateway.routed import RoutedRequest
from supervisor.observe.events import EventLog
from supervisor.request_class import RequestClass

REMOTE_ENGINE_PREFIX = "remote:"  # how a remote model is named as the engine of a request in the usage log
# A refused connection is tried again this many times, 0.25 s, 0.5 s, 1 s apart: a cloud's
# load balancer between two backends, not one that is down.
_REFUSED_RETRIES = Backoff(0.25, 1.0, retries=3)
_API_PREFIX = "/v1"  # a route's path after this is appended to the model's upstream (the API's base URL)
_ANTHROPIC_VERSION = b"2023-06-01"  # sent when the client gave none: Anthropic's API requires one


class RemoteApi(enum.StrEnum):
    """What the cloud speaks: how the key is sent."""

    OPENAI = "openai"  # Authorization: Bearer KEY
    ANTHROPIC = "anthropic"  # x-api-key: KEY, and an anthropic-version


@attrs.define(eq=False)
class RemoteModels:
    """The remote models of the catalog (replaced on a reload), and each one's places at the cloud."""

    catalog: ModelCatalog
    door: FrontDoor
    events: EventLog
    queue_timeout: Mapping[RequestClass, float]  # per class: how long a request may wait for a place
    # per class: how many requests may wait for one of a model's places (then 429 queue_full)
    max_queue: Mapping[RequestClass, float] = attrs.Factory(lambda: dict.fromkeys(RequestClass, math.inf))
    environ: Mapping[str, str] = attrs.Factory(lambda: os.environ)
    _limiters: dict[str, trio.CapacityLimiter] = attrs.Factory(dict)
    _contexts: dict[str | None, ssl.SSLContext] = attrs.Factory(dict)  # per ca_file

    def serves(self, name: str) -> bool:
        return name in self.catalog.remote

    def model_entries(self, created: int) -> list[dict[str, Any]]:
        """The remote models and their aliases, as /v1/models lists them: a cloud's, no memory."""
        entries = []
        for alias, name in self.catalog.remote.items():
            model = self.catalog.remote_models[name]
            entries.append({"id": alias, "object": "model", "created": created, "owned_by": "remote",
                            "capabilities": ["completion"],
                            "steward": {"alias_of": None if alias == name else name, "kind": "chat",
                                        "serves": _SERVES[RemoteApi(model.api)], "runtime": "remote",
                                        "api": model.api, "status": "remote", "memory": 0,
                                        "slots": model.max_concurrency, "in_flight": self.in_flight(name)}})
        return entries

    def may_serve(self, name: str, route: ApiRoute) -> bool:
        """Whether remote model *name* serves *route* (its cloud's API is the route's)."""
        return route.api.value in _SERVES[RemoteApi(self.catalog.remote_models[name].api)]

    def in_flight(self, name: str) -> int:
        limiter = self._limiters.get(name)
        return 0 if limiter is None else limiter.borrowed_tokens

    def state(self) -> list[dict[str, Any]]:
        """Each remote model as /admin/state shows it: where it goes, its places in use, who waits."""
        rows = []
        for name, model in self.catalog.remote_models.items():
            limiter = self._limiters.get(name)
            rows.append({"name": name, "upstream": model.upstream, "api": model.api, "memory": 0,
                         "max_concurrency": model.max_concurrency, "in_flight": self.in_flight(name),
                         "waiting": 0 if limiter is None else limiter.statistics().tasks_waiting})
        return rows

    async def serve(self, scope: Scope, routed: RoutedRequest, exchange: Exchange, send: Send) -> None:
        """Admit the request (its key), wait for a place at the cloud, relay it there and the answer back."""
        name = self.catalog.remote[routed.name]
        model = self.catalog.remote_models[name]
        shape = routed.route.error_shape
        exchange.model, exchange.klass, exchange.engine = name, routed.klass, f"{REMOTE_ENGINE_PREFIX}{name}"
        exchange.price = model.price
        if RemoteApi(model.api) is RemoteApi.ANTHROPIC and not routed.route.anthropic:
            exchange.error = "model_not_supported"
            await send_error(send, 400, f"The model '{name}' is Anthropic's API: it serves /v1/messages only.",
                             shape=shape, param="model", code="model_not_supported")
            return
        if RemoteApi(model.api) is RemoteApi.OPENAI and routed.route.anthropic:
            exchange.error = "model_not_supported"
            await send_error(send, 400, f"The model '{name}' is an OpenAI API: it does not serve /v1/messages.",
                             shape=shape, param="model", code="model_not_supported")
            return
        key = exchange.key
        if key is not None and not key.may_reach_remote:
            self.door.refuse(exchange, "remote_not_allowed")
            raise Refusal(403, f"Key {key.name!r} may not use remote models ({name!r} is served by a cloud); add a "
                               f"key with --remote, or one whose --models name {name!r}.", param="model",
                          code="remote_not_allowed")
        with self.door.admit(exchange, model=name, klass=routed.klass):
            await self._serve_placed(scope, routed, name, exchange, send)

    async def serve_fallback(self, scope: Scope, routed: RoutedRequest, name: str, exchange: Exchange,
                             send: Send) -> None:
        """A request the scheduler sent along its model's fallback chain to remote model *name*
        (its key's leave was asked before it was queued): the usage row names the model asked for,
        the answer and its ``x-steward-model`` header the one that served it."""
        model = self.catalog.remote_models[name]
        exchange.engine, exchange.price = f"{REMOTE_ENGINE_PREFIX}{name}", model.price
        await self._serve_placed(scope, routed, name, exchange, send, fallback=True)

    async def _serve_placed(self, scope: Scope, routed: RoutedRequest, name: str, exchange: Exchange, send: Send,
                            *, fallback: bool = False) -> None:
        """Wait for one of the model's places at its cloud (its class's queue timeout at most), and relay."""
        model = self.catalog.remote_models[name]
        limiter = self._limiter(name, model)
        if limiter.available_tokens == 0 and limiter.statistics().tasks_waiting >= self.max_queue[routed.klass]:
            exchange.error = "queue_full"
            self.events.emit("remote_queue_full", "info", model=name, **{"class": routed.klass},
                             request_id=exchange.request_id, waiting=limiter.statistics().tasks_waiting)
            await send_error(send, 429, f"{limiter.statistics().tasks_waiting} requests wait for remote model "
                             f"{name!r} already, the most its {routed.klass} class may have waiting "
                             f"(classes.{routed.klass}.max_queue)", shape=routed.route.error_shape,
                             code="queue_full", retry_after=5.0)
            return
        waited_from = trio.current_time()
        with trio.move_on_after(self.queue_timeout[routed.klass]) as waiting:
            await limiter.acquire()
        exchange.waited(trio.current_time() - waited_from)
        if waiting.cancelled_caught:
            exchange.error = "queue_timeout"
            self.events.emit("remote_wait", "info", model=name, **{"class": routed.klass},
                             request_id=exchange.request_id, waited_s=trio.current_time() - waited_from)
            await send_error(send, 503, f"the {model.max_concurrency} requests remote model {name!r} may have "
                             f"at its cloud at once are taken, and none came free in time",
                             shape=routed.route.error_shape, code="queue_timeout", retry_after=5.0)
            return
        try:
            await self._relay(scope, routed, name, model, exchange, send, fallback=fallback)
        finally:
            limiter.release()

    async def _relay(self, scope: Scope, routed: RoutedRequest, name: str, model: RemoteModelConfig,
                     exchange: Exchange, send: Send, *, fallback: bool) -> None:
        url = urllib.parse.urlsplit(model.upstream)
        port = url.port or (443 if url.scheme == "https" else 80)
        path = (scope["raw_path"] or scope["path"].encode()).decode("latin-1")
        target = (url.path + path.removeprefix(_API_PREFIX)).encode("latin-1")
        key = self.environ.get(model.key_env, "")
        api = RemoteApi(model.api)
        headers = [(b"content-type", routed.content_type)]
        headers += [(k, v) for k, v in scope["headers"] if k in _FORWARDED | routed.route.forwarded]
        if api is RemoteApi.OPENAI:
            headers.append((b"authorization", f"Bearer {key}".encode("latin-1", "replace")))
        else:
            headers.append((b"x-api-key", key.encode("latin-1", "replace")))
            if not any(k == b"anthropic-version" for k, _ in headers):
                headers.append((b"anthropic-version", _ANTHROPIC_VERSION))
        try:
            context = self._context(model.ca_file)
        except (OSError, ssl.SSLError) as exc:  # the file changed since steward started
            exchange.error = "remote_error"
            await send_error(send, 502, f"remote model {name!r}: cannot read its ca_file {model.ca_file}: {exc}",
                             shape=routed.route.error_shape, code="remote_error")
            return
        body = routed.body_naming(model.served_name or name)
        request = UpstreamRequest(url.hostname or "", port, b"POST", target, headers, body,
                                  opener=HttpsOpener(url.scheme, context))
        self.events.emit("remote_request", "debug", model=name, upstream=f"{url.hostname}:{port}",
                         **{"class": routed.klass}, request_id=exchange.request_id)
        tap = reading_answer(send, routed.route, exchange, keep_usage_chunk=routed.keep_usage_chunk,
                             stream=routed.stream, model=name, request=routed.payload, fallback=fallback)
        tap.readers.insert(0, ModelNamed(name))  # the cloud names its own model; the client is told steward's

        def on_status(status: int) -> None:
            exchange.status = status

        await relay(tap, request, what=f"remote model {name!r}", on_status=on_status, retry=_REFUSED_RETRIES,
                    timeouts=Timeouts(model.timeout, model.timeout), error_shape=routed.route.error_shape,
                    stream_error=routed.route.stream_error)
        await tap.end()

    def _limiter(self, name: str, model: RemoteModelConfig) -> trio.CapacityLimiter:
        limiter = self._limiters.get(name)
        if limiter is None:
            limiter = self._limiters[name] = trio.CapacityLimiter(model.max_concurrency)
        elif limiter.total_tokens != model.max_concurrency:
            limiter.total_tokens = model.max_concurrency  # a reload changed it: more waiters go at once
        return limiter

    def _context(self, ca_file: str | None) -> ssl.SSLContext:
        context = self._contexts.get(ca_file)
        if context is None:
            context = self._contexts[ca_file] = tls_context(ca_file)
        return context


_FORWARDED = frozenset({b"accept"})
_SERVES = {RemoteApi.OPENAI: ["chat", "completions", "responses", "embeddings"], RemoteApi.ANTHROPIC: ["messages"]}
