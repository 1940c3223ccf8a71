"""The routes, the engine start, signals and ``main``: the port is bound at once but listened on
only when the engine is up, as vLLM does (connections are refused until then).
"""

from __future__ import annotations

import os
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import parse_qsl

import attrs
import trio

from fakes.http11 import Exchange, HttpServer, watch_signals
from fakes.openai_server.cli import VERSION, Config, Log, parse_config
from fakes.openai_server.engine import Engine
from fakes.openai_server.errors import METHOD_NOT_ALLOWED, NOT_FOUND, UNAUTHORIZED, ApiError, server_error
from fakes.openai_server.formats import AnswerShape, Format, model_cards
from fakes.openai_server.memory import ALL_TAGS, EngineMemory
from fakes.openai_server.messages import MessagesFormat, count_body, messages_body, messages_job, token_count
from fakes.openai_server.metrics import CONTENT_TYPE, Metrics
from fakes.openai_server.parsing import body_json, build_job, chat_tokens, prompt_tokens
from fakes.openai_server.reply import Reply
from fakes.runner import run_fake

BACKLOG = 2048  # uvicorn's
Route = Callable[[Reply], Awaitable[None]]


@attrs.define(eq=False)
class FakeVllm:
    cfg: Config
    log: Log
    engine: Engine
    metrics: Metrics = attrs.field(init=False)
    http: HttpServer = attrs.field(init=False)
    created: int = attrs.field(factory=lambda: int(time.time()), init=False)
    good_health: int = attrs.field(default=0, init=False)  # /health 200s given (--fail-health-after)
    api_requests: int = attrs.field(default=0, init=False)  # /v1 requests let in (the key checked)
    unauthorized: int = attrs.field(default=0, init=False)  # /v1 requests refused for their key
    routes: dict[tuple[str, str], Route] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.metrics = Metrics(self.engine)
        self.http = HttpServer(self.dispatch, self.cfg.connection_policy, on_failure=self._connection_failed)
        self.routes = {
            ("GET", "/health"): self.health, ("GET", "/ping"): self.health, ("POST", "/ping"): self.health,
            ("GET", "/version"): self.version, ("GET", "/v1/models"): self.models, ("GET", "/metrics"): self.prom,
            ("POST", "/v1/chat/completions"): self.chat, ("POST", "/v1/completions"): self.completions,
            ("POST", "/v1/messages"): self.messages, ("POST", "/v1/messages/count_tokens"): self.count_tokens,
            ("GET", "/fake/stats"): self.fake_stats,
        }
        if self.cfg.dev_mode:  # vLLM registers these routes only in dev mode: 404 otherwise
            self.routes |= {("POST", "/sleep"): self.sleep, ("POST", "/wake_up"): self.wake_up,
                            ("GET", "/is_sleeping"): self.is_sleeping}

    # ---- dispatch

    def _connection_failed(self, client: str, exc: Exception) -> None:
        self.log.vllm("api_server.py:1", f"fake: connection from {client} failed: {exc!r}", "ERROR")

    async def dispatch(self, ex: Exchange) -> None:
        reply = Reply(ex, self.log if self.cfg.access_log else None)
        if self.engine.hung:
            await trio.sleep_forever()  # --hang-after-requests: the socket stays open, nothing answers
        req = ex.request
        try:
            if self._unauthorized(ex):
                self.unauthorized += 1
                await reply.json(401, UNAUTHORIZED)
                return
            self.api_requests += req.path.startswith("/v1")
            handler = self.routes.get((req.method, req.path))
            if handler is not None:
                await handler(reply)
            elif methods := sorted(m for m, path in self.routes if path == req.path):
                await reply.json(405, METHOD_NOT_ALLOWED, [(b"allow", ", ".join(methods).encode())])
            else:
                await reply.json(404, NOT_FOUND)
        except ApiError as err:
            if reply.started:
                raise
            await reply.json(err.code, err.body)
        except Exception as exc:  # Starlette's ServerErrorMiddleware: a plain-text 500
            if reply.started:
                raise
            self.log.vllm("api_server.py:1", f"Exception in ASGI application: {exc!r}", "ERROR")
            await reply.text(500, b"Internal Server Error")

    def _unauthorized(self, ex: Exchange) -> bool:
        """vLLM's --api-key middleware guards /v1 only."""
        key = self.cfg.api_key
        if self.cfg.anthropic_key:  # --anthropic-key: the cloud a test stands up speaks as Anthropic's
            return key is not None and ex.request.path.startswith("/v1") and ex.request.headers.get("x-api-key") != key
        return (key is not None and ex.request.path.startswith("/v1")
                and ex.request.headers.get("authorization") != f"Bearer {key}")

    # ---- simple routes

    async def health(self, reply: Reply) -> None:
        limit = self.cfg.fail_health_after
        if limit is not None and self.good_health >= limit:
            await reply.empty(500)
            return
        self.good_health += 1
        await reply.empty(200)

    async def version(self, reply: Reply) -> None:
        await reply.json(200, {"version": VERSION})

    async def models(self, reply: Reply) -> None:
        cfg = self.cfg
        await reply.json(200, model_cards(cfg.served_model_names, cfg.model, cfg.max_model_len, self.created))

    async def prom(self, reply: Reply) -> None:
        await reply.text(200, self.metrics.render(), CONTENT_TYPE)

    async def fake_stats(self, reply: Reply) -> None:
        s, engine = self.engine.stats, self.engine
        await reply.json(200, {"started": s.started, "running": s.running, "waiting": s.waiting,
                               "max_running": s.max_running, "max_waiting": s.max_waiting,
                               "sleep_level": engine.sleep_level, "held_bytes": engine.memory.held,
                               "holder_pid": engine.memory.holder_pid, "api_requests": self.api_requests,
                               "unauthorized": self.unauthorized})

    # ---- sleep mode (VLLM_SERVER_DEV_MODE=1)

    async def sleep(self, reply: Reply) -> None:
        level = int(reply.ex.request.query_params.get("level", "1"))  # not a number: vLLM's 500 too
        self.log.vllm("api_server.py:1", f"sleep the engine with level {level}")
        await self.engine.sleep(level)
        await reply.json(200, {"status": "sleeping", "level": level})

    async def wake_up(self, reply: Reply) -> None:
        tags = {v for k, v in parse_qsl(reply.ex.request.query) if k == "tags"}
        self.log.vllm("api_server.py:1", f"wake up the engine with tags: {sorted(tags) or None}")
        if self.cfg.wake_fails and self.engine.sleeping:
            raise server_error("fake: waking the engine failed (--wake-fails)")
        if tags - (ALL_TAGS - self.engine.memory.awake_parts):
            self.log.vllm("abstract.py:111", f"Tags {sorted(tags)} are not all in the sleeping tags", "WARNING")
        else:
            await self.engine.wake_up(tags or None)
        await reply.json(200, {"status": "awake"})

    async def is_sleeping(self, reply: Reply) -> None:
        self.log.vllm("api_server.py:1", "check whether the engine is sleeping")
        await reply.json(200, {"is_sleeping": self.engine.sleeping})

    # ---- completions

    async def chat(self, reply: Reply) -> None:
        await self._complete(reply, chat=True)

    async def completions(self, reply: Reply) -> None:
        await self._complete(reply, chat=False)

    async def _complete(self, reply: Reply, *, chat: bool) -> None:
        body = body_json(reply.ex.request.body)
        n_prompt = chat_tokens(body) if chat else prompt_tokens(body)
        job = build_job(body, self.cfg, n_prompt, chat=chat)
        await self._generate(reply, Format(job, chat))

    async def messages(self, reply: Reply) -> None:
        job = messages_job(messages_body(reply.ex.request), self.cfg)
        await self._generate(reply, MessagesFormat(job))

    async def count_tokens(self, reply: Reply) -> None:
        await reply.json(200, token_count(count_body(reply.ex.request), self.cfg))

    async def _generate(self, reply: Reply, shape: AnswerShape) -> None:
        self.engine.arrive()
        await reply.ex.run_until_client_leaves(lambda: self._answer(reply, shape))

    async def _answer(self, reply: Reply, shape: AnswerShape) -> None:
        if not shape.job.stream:
            async def keep(piece: str, n_done: int, last: bool) -> None:
                pass  # a whole answer: generate() returns its text at the end

            text, n = await self.engine.generate(shape.job, keep)
            await reply.json(200, shape.response(text, n))
            return

        async def send(piece: str, n_done: int, last: bool) -> None:
            # What opens the stream comes with the first output, as in vLLM (its role chunk).
            for event in [*(shape.opening() if n_done == 1 else []), *shape.token(piece, n_done, last)]:
                await reply.send(event)

        await reply.start_stream()  # StreamingResponse: the head goes out before the engine answers
        _text, n = await self.engine.generate(shape.job, send)
        for event in shape.closing(n):
            await reply.send(event)
        await reply.end()


# --------------------------------------------------------------------------- main


def bind(host: str, port: int) -> socket.socket:
    """vLLM binds its port before the engine starts (and listens only once it is up)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


async def run_server(cfg: Config, log: Log) -> int:
    """Serve until SIGTERM/SIGINT (0); 1 if the port cannot be bound."""
    log.vllm("api_server.py:1885", f"vLLM API server version {VERSION}")
    log.vllm("utils.py:328", f"non-default args: {{'model': {cfg.model!r}, 'max_model_len': {cfg.max_model_len}}}")
    try:
        sock = bind(cfg.host, cfg.port)
    except OSError as exc:
        log.write(f"OSError: [Errno {exc.errno}] {exc.strerror}")
        return 1
    memory: EngineMemory | None = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(watch_signals, nursery.cancel_scope, lambda _: log.uvicorn("Shutting down"))
            memory = await EngineMemory.open(cfg)
            if memory.child is not None:
                log.vllm("core.py:1", f"EngineCore_DP0 started, pid {memory.child.pid}")
            server = FakeVllm(cfg, log, Engine(cfg, log, memory))
            await server.engine.load()
            sock.listen(BACKLOG)
            listener: trio.abc.Listener[Any] = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
            scheme = "http"
            if cfg.ssl_certfile is not None:  # uvicorn's --ssl-certfile: the cloud a test stands up
                context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                context.load_cert_chain(cfg.ssl_certfile, cfg.ssl_keyfile)
                listener, scheme = trio.SSLListener(listener, context, https_compatible=True), "https"
            port = sock.getsockname()[1]
            log.vllm("api_server.py:1971", f"Starting vLLM API server 0 on {scheme}://{cfg.host}:{port}")
            log.uvicorn(f"Started server process [{os.getpid()}]")
            log.uvicorn("Waiting for application startup.")
            log.uvicorn("Application startup complete.")
            await trio.serve_listeners(server.http.serve_connection, [listener])
    finally:
        if memory is not None:
            memory.close()
        sock.close()
    log.uvicorn("Waiting for application shutdown.")
    log.uvicorn("Application shutdown complete.")
    log.uvicorn(f"Finished server process [{os.getpid()}]")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_config(argv)
    return run_fake(run_server, cfg, Log())
