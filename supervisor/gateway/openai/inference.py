"""The inference routes as a lean ASGI handler: validate, queue, proxy.

This is the hot path of every request, so it speaks ASGI directly rather than going
through Quart's request machinery (which costs ~0.7 ms a request on this class of
machine, research/proxy_overhead.md); everything else stays in the Quart app.

Per request: read the body (bounded), find the model (aliases) and the class, strip
steward's own fields, wait for a grant from the scheduler, then stream the engine's
answer through unbuffered over one fresh upstream connection. A client that goes
away cancels all of it: the job leaves the queue, or the upstream request is closed.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from supervisor.address import Address
from supervisor.apis import Api, api_names
from supervisor.auth.keys import ApiKey
from supervisor.observe.events import EventLog
from supervisor.gateway.openai.api_routes import API_PATHS, API_ROUTES, ApiRoute, api_route
from supervisor.gateway.openai.speech import check_speech
from supervisor.gateway.http.asgi import (
    BodyLimits,
    Disconnect,
    Receive,
    RequestError,
    Scope,
    Send,
    TrackedSend,
    dump_json,
    open_disconnect_watch,
    read_body,
    send_error,
    send_refusal,
    send_whole,
)
from supervisor.gateway.relay.answer import Answer, AnswerTap, answer_whole
from supervisor.gateway.relay.conforming import AnswerConformed
from supervisor.gateway.relay.chunked import Generation, JoinedSteps, StreamedSteps, cut_generation
from supervisor.gateway.door import CREDENTIAL_HEADERS, Exchange, FrontDoor, Refusal, exchange_of
from supervisor.gateway.relay.embeddings import AssembledStep, EmbeddingsAssembly, split_inputs
from supervisor.gateway.granted import answer_job_failed, serve_granted
from supervisor.gateway.relay.proxy import Failed, UpstreamRequest, relay
from supervisor.gateway.cloud import RemoteModels
from supervisor.gateway.remote import NodeRouter
from supervisor.gateway.relay.reshaped import reading_answer
from supervisor.gateway.relay.context_refusal import ContextWall, SlotConfig
from supervisor.gateway.routed import NotHere, RoutedRequest, route_request
from supervisor.gateway.relay.upstream import Timeouts
from supervisor.request_class import RequestClass
from supervisor.scheduler.actor import JobFailed, Lease, Request, SchedulerClient

INFERENCE_PATHS = frozenset(API_ROUTES)
_FORWARDED_REQUEST_HEADERS = frozenset({b"accept"}) | CREDENTIAL_HEADERS


# A request in steps (embeddings in chunks, a generation cut into steps) stays on the model it
# began on: no fallback (scheduler rule 11) for any of its steps, its bodies name that model.
STAY: frozenset[str] = frozenset()


@attrs.define(eq=False)
class InferenceHandler:
    scheduler: SchedulerClient
    events: EventLog
    aliases: Mapping[str, str]  # every accepted name -> model
    body_limits: BodyLimits
    embedding_chunk: int
    timeouts: Timeouts  # toward the engines
    door: FrontDoor
    # model -> the name its server knows it by, for servers that check it (runtime openai)
    served_names: Mapping[str, str] = attrs.Factory(dict)
    nodes: NodeRouter | None = None  # a front door's: the models its nodes serve
    # model -> the APIs it serves (supervisor.apis); a model missing here serves them all
    apis: Mapping[str, frozenset[Api]] = attrs.Factory(dict)
    # model -> its lower-class generations longer than this many tokens are cut into steps of it
    # (chunked.py); a model missing here, or 0: never.
    step_tokens: Mapping[str, int] = attrs.Factory(dict)
    # model -> its slot context as its config sets it: what a refusal of a prompt too long for it names
    # (context_refusal.py); a model missing here: the engine's refusal as it came, in the route's shape.
    contexts: Mapping[str, SlotConfig] = attrs.Factory(dict)
    remote: RemoteModels | None = None  # the models a cloud serves (`runtime: remote`)
    # model -> the models its fallback chain names; a model missing here has none.
    fallbacks: Mapping[str, tuple[str, ...]] = attrs.Factory(dict)
    # model -> the voices its config lists (speech models); a model missing here takes any voice.
    voices: Mapping[str, tuple[str, ...]] = attrs.Factory(dict)

    async def _serve_not_here(self, scope: Scope, receive: Receive, send: Send, not_here: NotHere,
                              exchange: Exchange) -> None:
        """A model no engine here serves: a cloud's or a node's, if one serves it, else a 404."""
        routed = not_here.request
        if self.remote is not None and self.remote.serves(not_here.name):
            try:
                async with open_disconnect_watch(receive):
                    await self.remote.serve(scope, routed, exchange, send)
            except RequestError as refused:
                await self._refuse(send, refused, routed.route, exchange)
            return
        if self.nodes is None or not self.nodes.serves(not_here.name):
            await self._refuse(send, not_here.refusal(), routed.route, exchange)
            return
        exchange.model, exchange.klass = routed.name, routed.klass
        try:
            with self.door.admit(exchange, model=routed.name, klass=routed.klass):
                async with open_disconnect_watch(receive):
                    await self.nodes.serve(scope, routed, exchange, send)
        except RequestError as refused:
            await self._refuse(send, refused, routed.route, exchange)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        exchange = exchange_of(scope)
        route = api_route(scope)
        try:
            body = await read_body(scope, receive, self.body_limits)
            if body is None:
                return  # the client left while sending
            routed = route_request(scope, body, self.aliases, self.served_names, route=route,
                                   default_class=self.door.default_class(exchange, RequestClass.INTERACTIVE))
            if isinstance(routed, NotHere):
                await self._serve_not_here(scope, receive, send, routed, exchange)
                return
            self._check_served(routed.model, route)
            if route.api is Api.SPEECH:  # refused before it waits for a slot (speech.py)
                assert routed.payload is not None
                exchange.input_chars = check_speech(routed.payload, self.voices.get(routed.model)).input_chars
            exchange.model, exchange.klass = routed.model, routed.klass
            with self.door.admit(exchange, model=routed.model, klass=routed.klass):
                await self._serve_admitted(scope, receive, send, routed, exchange)
        except RequestError as exc:
            if not isinstance(exc, Refusal):  # the door's refusals are `refused` events already
                self.events.emit("bad_request", "debug", path=scope["path"], status=exc.status, code=exc.code,
                                 detail=exc.message)
            await self._refuse(send, exc, route, exchange)

    def _may_use(self, routed: RoutedRequest, exchange: Exchange) -> frozenset[str]:
        """The models a fallback (scheduler rule 11) may send this request to: those of its
        model's chain that serve its route and that its key may use (none without a chain)."""
        return frozenset(model for model in self.fallbacks.get(routed.model, ())
                         if self._may_fall_back_to(model, routed.route, exchange.key))

    def _may_fall_back_to(self, model: str, route: ApiRoute, key: ApiKey | None) -> bool:
        """Whether a request on *route* with *key* may go to *model*: it serves the route, the key
        may use it, and a cloud's only where the key may send data out of the house."""
        if self.remote is not None and self.remote.serves(model):
            return self.remote.may_serve(model, route) and (
                key is None or (key.may_reach_remote and self.door.may_use(key, model)))
        served = self.apis.get(model)
        return (served is None or route.api in served) and (key is None or self.door.may_use(key, model))

    def _served_by(self, routed: RoutedRequest, lease: Lease) -> RoutedRequest:
        """The request as the granted engine takes it: the model asked for, or the fallback the
        scheduler sent it to (its body naming that model; the answer then names it too)."""
        engine = lease.grant.engine
        if engine is None or engine == routed.model:
            return routed
        return attrs.evolve(routed, model=engine, body=routed.body_naming(self.served_names.get(engine, engine)))

    def _context_wall(self, model: str) -> ContextWall | None:
        config = self.contexts.get(model)
        return None if config is None else ContextWall(config, self.events)

    def _check_served(self, model: str, route: ApiRoute) -> None:
        served = self.apis.get(model)
        if served is None or route.api in served:
            return
        others = ", ".join(API_PATHS[api] for api in Api if api in served)
        raise RequestError(400, f"The model '{model}' does not serve {API_PATHS[route.api]}: it serves {others} "
                                f"({', '.join(api_names(served))}).", param="model", code="model_not_supported")

    async def _refuse(self, send: Send, exc: RequestError, route: ApiRoute, exchange: Exchange) -> None:
        exchange.error = exchange.error or exc.code  # Anthropic's error shape has no field for it
        await send_refusal(send, exc, route.error_shape)

    async def _serve_admitted(self, scope: Scope, receive: Receive, send: Send, routed: RoutedRequest,
                              exchange: Exchange) -> None:
        async with open_disconnect_watch(receive) as disconnect:
            await self._serve(scope, routed, send, disconnect, exchange)

    async def _serve(self, scope: Scope, routed: RoutedRequest, send: Send, disconnect: Disconnect,
                     exchange: Exchange) -> None:
        chunks = None
        if routed.route.api is Api.EMBEDDINGS and routed.payload is not None:
            chunks = split_inputs(routed.payload, self.embedding_chunk)
        try:
            if chunks is not None:
                assert routed.payload is not None
                try:
                    # Written before the first step is queued: a body too deep to write again is a 400 now.
                    bodies = [dump_json({**routed.payload, "input": chunk}) for chunk in chunks]
                except RequestError as exc:
                    await send_refusal(send, exc)
                    return
                await self._serve_embedding_steps(scope, routed, bodies, send, exchange)
                return
            generation = cut_generation(routed, self.step_tokens.get(routed.model, 0))
            if generation is not None:
                await self._serve_generation_steps(scope, routed, generation, send, disconnect, exchange)
                return
        except JobFailed as exc:
            await answer_job_failed(send, exchange, exc, routed.route.error_shape)
            return

        async def answering(lease: Lease, tracked: Send) -> None:
            if lease.grant.remote:  # the scheduler sent it along its chain to a cloud's model
                assert self.remote is not None and lease.grant.engine is not None
                await self.remote.serve_fallback(scope, routed, lease.grant.engine, exchange, tracked)
                return
            exchange.engine = lease.grant.engine
            served = self._served_by(routed, lease)
            await self._proxy(scope, served, reading_answer(
                tracked, served.route, exchange, keep_usage_chunk=served.keep_usage_chunk,
                stream=served.stream, model=served.model, context=self._context_wall(served.model),
                request=served.payload, fallback=served is not routed), lease)

        await serve_granted(self.scheduler, exchange, send, disconnect, model=routed.model, klass=routed.klass,
                            shape=routed.route.error_shape, answering=answering,
                            may_use=self._may_use(routed, exchange))

    async def _serve_embedding_steps(self, scope: Scope, routed: RoutedRequest, chunks: list[bytes],
                                     send: Send, exchange: Exchange) -> None:
        """One step per chunk, in order; a failing step fails the request, no partial answer."""
        async with self.scheduler.open_request() as request:
            await self._run_embedding_steps(scope, routed, chunks, send, request, exchange)

    async def _run_embedding_steps(self, scope: Scope, routed: RoutedRequest, chunks: list[bytes], send: Send,
                                   request: Request, exchange: Exchange) -> None:
        assembly = EmbeddingsAssembly()
        for step, chunk in enumerate(chunks, 1):
            async with self.scheduler.open_grant(routed.model, routed.klass, request=request, step=step,
                                                 steps=len(chunks), account=exchange, may_use=STAY) as lease:
                exchange.engine = lease.grant.engine
                answer = AssembledStep(assembly)
                failed = await self._proxy(scope, routed, answer, lease, body=chunk, write_failure=False)
                if failed is not None:
                    await self._fail_step(send, lease, failed, f"engine {lease.grant.engine!r} failed during step "
                                                                f"{step}/{len(chunks)} of the request:")
                    return
                assert answer.head is not None
                if answer.head.status != 200:
                    # The engine's own error, as a single-step request would get it (in OpenAI's shape).
                    await answer_whole(AnswerTap(send, [AnswerConformed(None, exchange.engine_failed)]),
                                       answer.head.status, answer.head.headers, answer.held)
                    return
                if answer.unreadable is not None:
                    lease.status = 502
                    await send_error(send, 502, f"engine {lease.grant.engine!r} answered step {step}/{len(chunks)} "
                                     f"with an unreadable embeddings response: {answer.unreadable}",
                                     code="engine_error")
                    return
        exchange.count_tokens(assembly.usage["prompt_tokens"], None)  # read as the steps came: not again
        await send_whole(send, 200, [(b"content-type", b"application/json")], assembly.response())

    async def _fail_step(self, send: Send, lease: Lease, failed: Failed, where: str) -> None:
        """A step's failure names the step, whatever happened (the table's words left out)."""
        if lease.abort.scope.cancelled_caught:
            failure, detail = failed.failure, f"it {lease.abort.reason}"
        else:
            failure, detail = attrs.evolve(failed.failure, happened=""), failed.detail
        lease.status = failure.status
        await send_error(send, failure.status, failure.message(where, detail), code=failure.code)

    async def _serve_generation_steps(self, scope: Scope, routed: RoutedRequest, generation: Generation, send: Send,
                                      disconnect: Disconnect, exchange: Exchange) -> None:
        """One step per ``step_tokens`` tokens, each continuing the last, one answer (chunked.py)."""
        tracked = TrackedSend(send)
        # The steps read the generation's usage themselves (chunked.py): the client's tap need not.
        client = reading_answer(tracked, routed.route, exchange, keep_usage_chunk=False, stream=routed.stream,
                                model=routed.model, context=self._context_wall(routed.model), request=routed.payload)
        answer: StreamedSteps | JoinedSteps = (
            StreamedSteps(client, generation, routed.route.stream_error, exchange.count_tokens,
                          usage_kept=routed.keep_usage_chunk) if routed.stream
            else JoinedSteps(client, generation, exchange.count_tokens))
        try:
            async with self.scheduler.open_request() as request:
                while True:
                    async with self.scheduler.open_grant(routed.model, routed.klass, request=request,
                                                         step=generation.steps + 1, steps=generation.step_count,
                                                         account=exchange, may_use=STAY) as lease:
                        exchange.engine = lease.grant.engine
                        answer.begin_step()
                        try:
                            await self._proxy(scope, routed, answer, lease, body=generation.next_body())
                        finally:
                            if disconnect.happened and not tracked.complete:
                                lease.status = 499  # the client left before the answer ended
                        generation.end_step()
                    if not generation.goes_on():
                        break
            await answer.end()  # the last step's slot is free: the rest is steward's own bytes
        except JobFailed as exc:  # a later step's: refused, or steward is closing
            if isinstance(answer, StreamedSteps) and answer.started:
                exchange.error = exc.failure.code
                await answer.fail(exc.failure.message, exc.failure.code)
            else:
                await answer_job_failed(send, exchange, exc, routed.route.error_shape)
        finally:
            self.events.emit("generation_steps", "debug", request_id=exchange.request_id, model=routed.model,
                             **{"class": routed.klass}, steps=generation.steps, step_tokens=generation.step_tokens,
                             completion_tokens=generation.completion_tokens, finish_reason=generation.finish_reason,
                             ended=generation.ended)

    async def _proxy(self, scope: Scope, routed: RoutedRequest, answer: Answer, lease: Lease,
                     body: bytes | None = None, *, write_failure: bool = True) -> Failed | None:
        """Relay the request (or *body* in its place) to the lease's engine, into *answer*."""
        host, port = self._endpoint(lease.grant.endpoint)
        request = UpstreamRequest(host, port, b"POST", scope["raw_path"] or scope["path"].encode(),
                                  self._request_headers(scope, routed), routed.body if body is None else body)

        def on_status(status: int) -> None:
            lease.status = status

        return await relay(answer, request, what=f"engine {lease.grant.engine!r}", on_status=on_status,
                           error_shape=routed.route.error_shape, stream_error=routed.route.stream_error,
                           timeouts=self.timeouts, on_stall=lambda detail: self._report_stall(lease, detail),
                           abort=lease.abort, write_failure=write_failure)

    def _report_stall(self, lease: Lease, detail: str) -> None:
        assert lease.grant.engine is not None
        self.scheduler.report_stall(lease.grant.engine, lease.grant.generation, detail)

    def _endpoint(self, endpoint: Address | None) -> tuple[str, int]:
        assert endpoint is not None
        return endpoint.host, endpoint.port

    def _request_headers(self, scope: Scope, routed: RoutedRequest) -> list[tuple[bytes, bytes]]:
        wanted = _FORWARDED_REQUEST_HEADERS | routed.route.forwarded
        forwarded = [(k, v) for k, v in scope["headers"] if k in wanted]
        return [(b"content-type", routed.content_type)] + self.door.forwardable("openai", forwarded)
