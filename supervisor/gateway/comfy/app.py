"""The ComfyUI-compatible listener: ComfyUI's clients point here instead of at ComfyUI.

`POST /prompt` (and `/api/prompt`, where ComfyUI's own page posts) is an exclusive GPU
job in steward's scheduler: once it heads its class, no new work of that class or lower
starts, running work drains, LLM engines and Ollama unload; then the prompt goes to
ComfyUI and its answer comes back unchanged; steward follows the job to its end,
`POST /free`s, waits for the memory, and releases the GPU. A rejected prompt releases at
once; a client that leaves before the prompt was sent leaves the queue cleanly.
A prompt ComfyUI would refuse anyway (not an object, no nodes, a node class ComfyUI does
not list in its ``/object_info``, no output, inputs its validation fails on:
supervisor/gateway/comfy/inputs.py) is answered in ComfyUI's own 400 shape before anything is
unloaded. The GPU itself is held through the turnstile both listeners share (comfy/jobs.py).
Everything else passes through untouched, with the Host and Origin ComfyUI expects (steward
checks Origin itself, at the door of every listener).

Keys: a workflow can load any model and run any node, so a key with a models list reaches
this listener only if the list names the scope ``comfyui`` (supervisor/auth/keys.py); a
key without one is refused 403 on every ComfyUI route and on ``/ws``. A prompt and an
upload (it fills ComfyUI's disk) are also admitted as requests of the job's class: the
key's classes, rate and concurrency apply. Everything else (ComfyUI's page polls
``/history`` and ``/queue`` all the time) needs the scope only, so a rate limit never
locks the page out.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import attrs
import trio
from quart_trio import QuartTrio

from supervisor.address import Address
from supervisor.auth.keys import ApiKey
from supervisor.backoff import Backoff, RetryEnded, retry_while_unreachable
from supervisor.config import COMFYUI_SCOPE, ComfyConfig
from supervisor.observe.events import EventLog
from supervisor.gateway.http.asgi import (
    BodyLimits,
    ClientLeft,
    Receive,
    RequestError,
    Scope,
    Send,
    TrackedSend,
    open_disconnect_watch,
    open_streamed_body,
    read_body,
    send_refusal,
    send_whole,
)
from supervisor.gateway.comfy.api import NodeCatalog, PromptRefused, find_prompt_id, read_prompt
from supervisor.gateway.comfy.jobs import ComfyTurnstile, HeldGpu
from supervisor.gateway.door import (
    MONITORING_PATHS,
    WEBSOCKET_KEY,
    Exchange,
    FrontDoor,
    Refusal,
    body_unread,
    exchange_of,
)
from supervisor.gateway.errors import comfy_error_body, error_headers
from supervisor.gateway.http.gate import gated
from supervisor.gateway.ollama.app import turnstile_health
from supervisor.gateway.http.quart_app import add_health_routes, new_quart_app
from supervisor.gateway.relay.proxy import REQUEST_FRAMING, UpstreamRequest, relay
from supervisor.gateway.relay.upstream import StreamedBody, UpstreamError, UpstreamUnreachable, fetch_upstream
from supervisor.gateway.comfy.websocket_proxy import proxy_websocket
from supervisor.gateway.services import Services
from supervisor.scheduler.actor import JobFailed
from supervisor.supervise import ContainedNursery

LISTENER = "comfyui"  # the listener's name at the front door (tree.py)
PROMPT_PATHS = frozenset({"/prompt", "/api/prompt"})
UPLOAD_PATHS = frozenset({"/upload/image", "/upload/mask", "/api/upload/image", "/api/upload/mask"})
WEBSOCKET_PATHS = frozenset({"/ws", "/api/ws"})
RELEASE_PATH = "/steward/release"
SCOPE_REFUSED = "comfyui_not_allowed"  # the code of a key refused for want of the scope


def scope_refusal(key: ApiKey | None) -> Refusal | None:
    """The 403 of a key whose models leave out the scope ``comfyui`` (None: it may come in)."""
    if key is None or key.reaches_comfyui:
        return None
    return Refusal(403, f"Key {key.name!r} may not use the ComfyUI listener: a workflow can run any model, so it "
                        f"takes a key whose models name the scope {COMFYUI_SCOPE!r} (steward keys add NAME --models "
                        f"...,{COMFYUI_SCOPE}). This key may use: {', '.join(key.models or ())}.",
                   code=SCOPE_REFUSED)


def is_admin_route(scope: Scope) -> bool:
    return scope["path"].startswith("/steward/")


@attrs.define(eq=False)
class ImageJob:
    """One `/prompt` from the handler's side: the answer to hand back, and the job's scope."""

    body: bytes
    answered: trio.Event = attrs.Factory(trio.Event)
    answer: tuple[int, list[tuple[bytes, bytes]], bytes] | None = None
    forwarded: bool = False  # the prompt is on its way to ComfyUI: the job runs on whoever waits
    client_left: bool = False
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    prompt_id: str | None = None
    exchange: Exchange | None = None  # the request's usage row in the making


@attrs.define(eq=False)
class ComfyListener:
    turnstile: ComfyTurnstile
    catalog: NodeCatalog
    jobs: ContainedNursery  # image jobs: they outlast the request that started them
    body_limits: BodyLimits
    shutting_down: trio.Event  # ends the retries of an unreachable ComfyUI
    door: FrontDoor

    @property
    def config(self) -> ComfyConfig:
        return self.turnstile.config

    @property
    def events(self) -> EventLog:
        return self.turnstile.events

    @property
    def base_url(self) -> str:
        return self.config.upstream.url

    @property
    def backoff(self) -> Backoff:
        return Backoff(self.config.retry_initial, self.config.retry_max, self.shutting_down)

    async def prompt(self, scope: Scope, receive: Receive, send: Send) -> None:
        exchange = exchange_of(scope)
        exchange.klass = self.config.job_class
        try:
            body = await read_body(scope, receive, self.body_limits)
            if body is None:
                return
            self._check_scope(exchange)
            with self.door.admit(exchange, model=None, klass=self.config.job_class):
                await self._prompt(scope, receive, send, body, exchange)
        except RequestError as exc:
            await send_refusal(send, exc, comfy_error_body)

    def _check_scope(self, exchange: Exchange) -> None:
        """Refusal (403) if the request's key may not use this listener."""
        refusal = scope_refusal(exchange.key)
        if refusal is not None:
            self.door.refuse(exchange, SCOPE_REFUSED)
            raise refusal

    def _admitted(self, scope: Scope, exchange: Exchange) -> AbstractContextManager[None]:
        """An upload counts as one of the key's requests, in the job's class; other routes do not."""
        if scope["method"] != "POST" or scope["path"] not in UPLOAD_PATHS:
            return nullcontext()
        exchange.klass = self.config.job_class
        return self.door.admit(exchange, model=None, klass=self.config.job_class)

    async def _prompt(self, scope: Scope, receive: Receive, send: Send, body: bytes, exchange: Exchange) -> None:
        # Before the GPU is taken: a prompt ComfyUI would refuse must not unload anything.
        request = read_prompt(body)
        refused = request if isinstance(request, PromptRefused) else await self.catalog.refusal(request)
        if refused is not None:
            self.events.emit("image_refused", "info", type=refused.type, detail=refused.message)
            content = refused.body()
            await send_whole(send, 400, error_headers(content, shape=comfy_error_body), content)
            return
        job = ImageJob(body, exchange=exchange)
        self.jobs.start_soon(self._run, job, scope["raw_path"] or scope["path"].encode())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_client, receive, job, nursery.cancel_scope)
            await job.answered.wait()
            nursery.cancel_scope.cancel(reason="answered")
        if job.answer is not None:
            await send_whole(send, *job.answer)

    async def _watch_client(self, receive: Receive, job: ImageJob, waiting: trio.CancelScope) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        job.client_left = True
        if not job.forwarded:
            self._abandon(job)
        waiting.cancel(reason="client left")

    def _abandon(self, job: ImageJob) -> None:
        job.scope.cancel(reason="client left before the prompt was sent")  # leaves the queue or releases
        self.events.emit("image_abandoned", "info", prompt_id=None,
                         detail="the client left before the prompt reached ComfyUI")

    async def _run(self, job: ImageJob, target: bytes) -> None:
        try:
            with job.scope:
                async with self.turnstile.open_gpu(self.config.job_class, job.exchange) as held:
                    held.lease.status = await self._forward_and_follow(job, target, held)
        except JobFailed as exc:
            failure = exc.failure
            content = comfy_error_body(failure.status, failure.message, code=failure.code)
            job.answer = (failure.status, error_headers(content, failure.retry_after, shape=comfy_error_body), content)
        finally:
            job.answered.set()

    async def _forward_and_follow(self, job: ImageJob, target: bytes, held: HeldGpu) -> int:
        status, headers, content = await self._post_prompt(job, target)
        job.answer = (status, [(k, v) for k, v in headers if k not in REQUEST_FRAMING], content)
        job.answered.set()
        job.prompt_id = find_prompt_id(content[: self.config.prompt_capture_limit]) if status == 200 else None
        self.events.emit("image_forwarded", "info", prompt_id=job.prompt_id, status=status)
        if job.prompt_id is None:
            return status  # rejected (or unreadable): release at once
        await self.turnstile.follow(held, job.prompt_id)
        await self.turnstile.free(held)
        return status

    async def _post_prompt(self, job: ImageJob, target: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """POST the prompt, retrying while ComfyUI refuses connections (nothing was sent then),
        until the client leaves or steward shuts down."""
        upstream = self.config.upstream
        headers = [(b"content-type", b"application/json")]

        async def attempt() -> tuple[int, list[tuple[bytes, bytes]], bytes]:
            job.forwarded = True  # from here on ComfyUI may have it: the job must not vanish
            return await fetch_upstream(upstream.host, upstream.port, b"POST", target, headers, job.body)

        async def on_retry(exc: Exception, delay: float) -> None:
            job.forwarded = False
            if job.client_left:
                self._abandon(job)
                await trio.lowlevel.checkpoint()  # raises Cancelled out of the job's scope
            self.events.emit("upstream_retry", "warning", service="comfyui", detail=str(exc), retry_in_s=delay)

        try:
            return await retry_while_unreachable(self.backoff, attempt, UpstreamUnreachable, on_retry)
        except RetryEnded as exc:
            status, content = 503, comfy_error_body(
                503, f"steward is shutting down and ComfyUI cannot be reached: {exc}", code="shutting_down")
        except UpstreamError as exc:
            status, content = 502, comfy_error_body(502, f"ComfyUI failed during the request: {exc}",
                                                    code="engine_error")
        return status, error_headers(content, shape=comfy_error_body), content

    async def passthrough(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Everything but /prompt, as it is, once the key may (see the module docstring)."""
        exchange = exchange_of(scope)
        try:
            self._check_scope(exchange)
            with self._admitted(scope, exchange):
                await self._passthrough(scope, receive, send)
        except Refusal as exc:  # before the body was read: as the door's own refusals, it closes if there is one
            exc.close = exc.close or body_unread(scope)
            await send_refusal(send, exc, comfy_error_body)

    async def _passthrough(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A body (an image upload) goes on as it arrives, within comfyui.max_body_size, never held whole."""
        limits = BodyLimits(self.config.max_body_size, self.body_limits.timeout)
        try:
            body = await open_streamed_body(scope, receive, limits)
        except RequestError as exc:
            await send_refusal(send, exc, comfy_error_body)
            return
        upstream = self.config.upstream
        target = scope["raw_path"] or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        headers = self.door.forwardable("comfyui", upstream_headers(scope["headers"], self.config.upstream))
        request = UpstreamRequest(upstream.host, upstream.port, scope["method"].encode(), target, headers,
                                  StreamedBody(body.length, body.chunks()))
        tracked = TrackedSend(send)
        refusal: RequestError | None = None
        async with open_disconnect_watch(body.receive_after):
            try:
                await relay(tracked, request, what="ComfyUI", on_status=lambda status: None, retry=self.backoff,
                            error_shape=comfy_error_body, on_retry=lambda delay, detail: self.events.emit(
                                "upstream_retry", "warning", service="comfyui", detail=detail, retry_in_s=delay))
            except ClientLeft:
                return  # gone while uploading: the upstream request was dropped with it
            except RequestError as exc:  # past the limit, or stalled, while streaming on
                refusal = exc
        if refusal is not None and not tracked.started:
            await send_refusal(send, refusal, comfy_error_body)


def upstream_headers(headers: list[tuple[bytes, bytes]], upstream: Address) -> list[tuple[bytes, bytes]]:
    """ComfyUI refuses a request whose Origin does not match its Host: speak as its own page would
    (steward's own door has already refused a cross-site Origin)."""
    out = [(k, v) for k, v in headers if k not in REQUEST_FRAMING]
    return [(k, upstream.url.encode() if k == b"origin" else v) for k, v in out]


def create_comfy_app(turnstile: ComfyTurnstile, catalog: NodeCatalog, services: Services) -> QuartTrio:
    config, scheduler, events, gate = turnstile.config, turnstile.scheduler, turnstile.events, services.gate
    app = new_quart_app("steward-comfyui", comfy_error_body, events)
    listener = ComfyListener(turnstile, catalog, turnstile.jobs, services.body_limits, gate.closed, services.door)
    quart_asgi = app.asgi_app

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] in MONITORING_PATHS or scope["path"] == RELEASE_PATH:
            await quart_asgi(scope, receive, send)
        elif scope["method"] == "POST" and scope["path"] in PROMPT_PATHS:
            await listener.prompt(scope, receive, send)
        else:
            await listener.passthrough(scope, receive, send)

    async def other(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and scope["path"] in WEBSOCKET_PATHS:
            key = scope.get(WEBSOCKET_KEY)  # the door let it in: its key, if it needed one
            if key is not None and (refusal := scope_refusal(key)) is not None:
                await services.door.refuse_websocket(scope, send, LISTENER, refusal.code, key)
                return
            # Outside the gate: a websocket only reports; it closes as the gate does.
            await proxy_websocket(scope, receive, send, config.upstream.host, config.upstream.port,
                                  [(k, v) for k, v in upstream_headers(scope["headers"], config.upstream)
                                   if k == b"origin"], gate.closed)
        else:
            await quart_asgi(scope, receive, send)

    app.asgi_app = gated(gate, route, other)  # type: ignore[method-assign]

    add_health_routes(app, services.health, services.metrics,
                      lambda: {**turnstile_health(scheduler), "image_running": len(turnstile.running)})

    @app.post(RELEASE_PATH)
    async def release() -> dict[str, Any]:
        released = turnstile.force_release()
        events.emit("image_force_release", "warning", released=released)
        return {"released": released}

    return app
