"""The routes (Ollama's ``server/routes.go``, its OpenAI and Anthropic middleware), signals and ``main``."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs
import trio

from fakes.http11 import Exchange, HttpServer, watch_signals
from fakes.llama_server.cli import Log
from fakes.llama_server.formats import oai_embeddings
from fakes.ollama.anthropic_messages import STRUCT as MESSAGES_STRUCT
from fakes.ollama.anthropic_messages import MessagesFormat, parse_messages_request
from fakes.ollama.cli import Config, ModelSpec, parse_config
from fakes.ollama.engine import Engine
from fakes.ollama.errors import (
    ErrorShape,
    OllamaError,
    bad_request,
    model_not_found,
    model_not_pulled,
    respond_error,
    unsupported,
)
from fakes.ollama.formats import (
    ChatFormat,
    Format,
    GenerateFormat,
    OpenAIChatFormat,
    OpenAITextFormat,
    Outcome,
    openai_model,
    show,
    tags_entry,
)
from fakes.ollama.gotime import nanoseconds
from fakes.ollama.openai_responses import STRUCT as RESPONSES_STRUCT
from fakes.ollama.openai_responses import ResponsesFormat, parse_responses_request
from fakes.ollama.parsing import (
    Job,
    body_json,
    chat_messages,
    conversation,
    count_words,
    embed_inputs,
    keep_alive,
    model_name,
    num_predict,
    stream_flag,
    string_field,
)
from fakes.ollama.sched import Scheduler
from fakes.runner import run_fake

TEXT = b"text/plain; charset=utf-8"
Route = Callable[[Exchange], Awaitable[None]]


@attrs.define(eq=False)
class FakeOllama:
    cfg: Config
    log: Log
    nursery: trio.Nursery
    sched: Scheduler = attrs.field(init=False)
    engine: Engine = attrs.field(init=False)
    http: HttpServer = attrs.field(init=False)
    modified: float = attrs.field(factory=lambda: time.time() - 86400.0, init=False)  # "pulled yesterday"
    routes: dict[tuple[str, str], Route] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.sched = Scheduler(self.cfg, self.nursery)
        self.engine = Engine(self.cfg, self.sched)
        self.http = HttpServer(self.dispatch, self.cfg.connection_policy, on_failure=self._connection_failed)
        self.routes = {
            ("GET", "/"): self.root, ("HEAD", "/"): self.root,
            ("GET", "/api/version"): self.version, ("HEAD", "/api/version"): self.version,
            ("GET", "/api/tags"): self.tags, ("HEAD", "/api/tags"): self.tags,
            ("GET", "/api/ps"): self.ps, ("POST", "/api/show"): self.show,
            ("POST", "/api/generate"): self.generate, ("POST", "/api/chat"): self.chat,
            ("POST", "/api/embed"): self.embed, ("POST", "/api/embeddings"): self.embeddings_legacy,
            ("POST", "/v1/chat/completions"): self.oai_chat, ("POST", "/v1/completions"): self.oai_completions,
            ("POST", "/v1/embeddings"): self.oai_embeddings, ("GET", "/v1/models"): self.oai_models,
            ("POST", "/v1/responses"): self.oai_responses, ("POST", "/v1/messages"): self.anthropic_messages,
            ("GET", "/fake/stats"): self.fake_stats,
        }

    # ---- dispatch

    def _connection_failed(self, client: str, exc: Exception) -> None:
        self.log(f'time={time.strftime("%Y-%m-%dT%H:%M:%S")} level=ERROR msg="fake: connection from {client} '
                 f'failed: {exc!r}"')

    async def dispatch(self, ex: Exchange) -> None:
        req, started = ex.request, time.monotonic()
        shape = error_shape(req.path)
        handler = self.routes.get((req.method, req.path))
        if handler is None and req.method == "GET" and req.path.startswith("/v1/models/"):
            handler = self.oai_model
        try:
            if handler is not None:
                await handler(ex)
            elif any(path == req.path for _, path in self.routes):
                await ex.respond(405, b"405 method not allowed", TEXT)  # gin's HandleMethodNotAllowed
            else:
                await ex.respond(404, b"404 page not found", TEXT)
        except OllamaError as err:  # raised before anything was sent
            await respond_error(ex, err, shape)
        except Exception:  # noqa: BLE001 - gin's Recovery middleware: a panic is a 500 with no body
            if ex.status:
                raise
            await ex.respond(500, b"", TEXT)
        if self.cfg.verbose:
            took = (time.monotonic() - started) * 1000
            self.log(f'[GIN] {time.strftime("%Y/%m/%d - %H:%M:%S")} | {ex.status:3d} | {took:10.3f}ms | '
                     f'{req.client:>15} | {req.method:<7} "{req.path}"')

    def _model(self, name: str, missing: Callable[[str], OllamaError] = model_not_found) -> ModelSpec:
        spec = self.cfg.find(name)
        if spec is None:
            raise missing(name)
        return spec

    # ---- simple routes

    async def root(self, ex: Exchange) -> None:
        await ex.respond(200, b"Ollama is running", TEXT)

    async def version(self, ex: Exchange) -> None:
        await ex.respond_json(200, {"version": self.cfg.version})

    async def tags(self, ex: Exchange) -> None:
        await ex.respond_json(200, {"models": [tags_entry(m, self.modified) for m in self.cfg.models]})

    async def ps(self, ex: Exchange) -> None:
        await ex.respond_json(200, {"models": self.sched.ps()})

    async def show(self, ex: Exchange) -> None:
        body = body_json(ex.request, "api.ShowRequest")
        spec = self._model(model_name(body, "api.ShowRequest"))
        await ex.respond_json(200, show(spec, self.modified))

    async def fake_stats(self, ex: Exchange) -> None:
        s, sched = self.sched.stats, self.sched
        await ex.respond_json(200, {
            "loaded": {name: r.state for name, r in sched.runners.items()},
            "memory": sum(r.spec.size for r in sched.runners.values()),
            "requests_started": s.started, "requests_completed": s.completed, "requests_cancelled": s.cancelled,
            "requests_rejected": s.rejected, "requests_failed": s.failed, "waiting": sched.waiting,
            "active": sched.active, "loads": s.loads, "unloads": s.unloads, "unload_calls": s.unload_requests,
            "connections": self.http.connections,
        })

    # ---- native generation

    async def generate(self, ex: Exchange) -> None:
        struct = "api.GenerateRequest"
        body = body_json(ex.request, struct)
        ka = keep_alive(body)
        name = model_name(body, struct)
        prompt = string_field(body, "prompt", struct)
        spec = self._model(name)
        fmt = GenerateFormat(name)
        await self._generate_or_load(ex, spec, name, "generate", prompt == "", ka, fmt,
                                     lambda: Job(count_words(prompt), self._num_predict(body),
                                                 stream_flag(body, True), prompt))

    async def chat(self, ex: Exchange) -> None:
        struct = "api.ChatRequest"
        body = body_json(ex.request, struct)
        ka = keep_alive(body)
        name = model_name(body, struct)
        text, n_prompt, n_messages = chat_messages(body)
        spec = self._model(name)
        await self._generate_or_load(ex, spec, name, "chat", n_messages == 0, ka, ChatFormat(name),
                                     lambda: Job(n_prompt, self._num_predict(body), stream_flag(body, True), text))

    async def _generate_or_load(self, ex: Exchange, spec: ModelSpec, name: str, what: str, empty: bool,
                                ka: float | None, fmt: Format, job: Callable[[], Job], *,
                                stream_load: bool = False) -> None:
        """The order of routes.go: unload request, capability check, load-only, generation.

        *stream_load*: the load-only answer goes out as a stream (a middleware writer asked to stream).
        """
        if empty and ka == 0:
            self.sched.expire(spec)
            await ex.respond_json(200, fmt.response(Outcome("", 0, 0, "unload")))
            return
        if spec.embedding_only:
            raise unsupported(name, what)
        if empty:
            await self.engine.load_only(ex, spec, ka, fmt, stream=stream_load)
        else:
            await self.engine.generate(ex, spec, ka, job(), fmt)

    @staticmethod
    def _num_predict(body: dict[str, Any]) -> int | None:
        options = body.get("options")
        return num_predict(options.get("num_predict")) if isinstance(options, dict) else None

    # ---- native embeddings

    async def embed(self, ex: Exchange) -> None:
        struct = "api.EmbedRequest"
        body = body_json(ex.request, struct)
        ka = keep_alive(body)
        texts = embed_inputs(body.get("input"))
        name = model_name(body, struct)
        spec = self._model(name)

        def render(vectors: list[list[float]], n_tokens: int, out: Outcome) -> dict[str, Any]:
            if not vectors:
                return {"model": name, "embeddings": []}
            return {"model": name, "embeddings": vectors, "total_duration": nanoseconds(out.total_s),
                    "load_duration": nanoseconds(out.load_s), "prompt_eval_count": n_tokens}
        await self.engine.embed(ex, spec, ka, texts, render)

    async def embeddings_legacy(self, ex: Exchange) -> None:
        struct = "api.EmbeddingRequest"
        body = body_json(ex.request, struct)
        ka = keep_alive(body)
        prompt = string_field(body, "prompt", struct)
        name = model_name(body, struct)
        spec = self._model(name, model_not_pulled)
        await self.engine.embed(ex, spec, ka, [prompt] if prompt else [],
                                lambda vectors, _n, _out: {"embedding": vectors[0] if vectors else []})

    # ---- OpenAI compatibility (no keep_alive: the server default applies)

    async def oai_chat(self, ex: Exchange) -> None:
        struct = "openai.ChatCompletionRequest"
        body = body_json(ex.request, struct)
        name = model_name(body, struct)
        text, n_prompt, n_messages = chat_messages(body)
        spec = self._model(name)
        fmt = OpenAIChatFormat(name, _include_usage(body))
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        await self._generate_or_load(ex, spec, name, "chat", n_messages == 0, None, fmt,
                                     lambda: Job(n_prompt, num_predict(limit), stream_flag(body, False), text))

    async def oai_completions(self, ex: Exchange) -> None:
        struct = "openai.CompletionRequest"
        body = body_json(ex.request, struct)
        name = model_name(body, struct)
        prompt = body.get("prompt", "")
        if isinstance(prompt, list):
            prompt = prompt[0] if prompt and isinstance(prompt[0], str) else ""
        if not isinstance(prompt, str):
            raise bad_request("invalid type for 'prompt' field")
        spec = self._model(name)
        fmt = OpenAITextFormat(name, _include_usage(body))
        await self._generate_or_load(ex, spec, name, "generate", prompt == "", None, fmt,
                                     lambda: Job(count_words(prompt), num_predict(body.get("max_tokens")),
                                                 stream_flag(body, False), prompt))

    async def oai_embeddings(self, ex: Exchange) -> None:
        struct = "openai.EmbedRequest"
        body = body_json(ex.request, struct)
        texts = embed_inputs(body.get("input"), openai=True)
        name = model_name(body, struct)
        spec = self._model(name)
        encoding = body.get("encoding_format", "float")
        await self.engine.embed(ex, spec, None, texts,
                                lambda vectors, n, _out: oai_embeddings(name, vectors, n, encoding),
                                shape=ErrorShape.OPENAI)

    async def oai_responses(self, ex: Exchange) -> None:
        req = parse_responses_request(body_json(ex.request, RESPONSES_STRUCT))
        await self._chat_through_middleware(ex, req.model, req.messages, num_predict(req.max_output_tokens),
                                            req.stream, ResponsesFormat(req))

    async def anthropic_messages(self, ex: Exchange) -> None:
        req = parse_messages_request(body_json(ex.request, MESSAGES_STRUCT))
        await self._chat_through_middleware(ex, req.model, req.messages, req.max_tokens, req.stream,
                                            MessagesFormat(req.model, req.estimated_input_tokens))

    async def _chat_through_middleware(self, ex: Exchange, name: str, messages: Sequence[str], limit: int | None,
                                       stream: bool, fmt: Format) -> None:
        """A request a middleware turned into a chat request: the chat handler runs it, *fmt* writes it back."""
        text, n_prompt, n_messages = conversation(list(messages))
        spec = self._model(name)
        await self._generate_or_load(ex, spec, name, "chat", n_messages == 0, None, fmt,
                                     lambda: Job(n_prompt, limit, stream, text), stream_load=stream)

    async def oai_models(self, ex: Exchange) -> None:
        await ex.respond_json(200, {"object": "list",
                                    "data": [openai_model(m, self.modified) for m in self.cfg.models]})

    async def oai_model(self, ex: Exchange) -> None:
        spec = self._model(ex.request.path.removeprefix("/v1/models/"))
        await ex.respond_json(200, openai_model(spec, self.modified))


def error_shape(path: str) -> ErrorShape:
    """The envelope a route's errors come in: the middleware in front of its handler decides."""
    if path == "/v1/messages":
        return ErrorShape.ANTHROPIC
    return ErrorShape.OPENAI if path.startswith("/v1/") else ErrorShape.NATIVE


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


# --------------------------------------------------------------------------- main


async def run_server(cfg: Config, log: Log) -> int:
    """Serve until SIGTERM/SIGINT (0); 1 if the port cannot be bound."""
    async with trio.open_nursery() as nursery:
        await nursery.start(watch_signals, nursery.cancel_scope)
        server = FakeOllama(cfg, log, nursery)
        try:
            port = await nursery.start(server.http.serve, cfg.host, cfg.port)
        except OSError as exc:
            log(f"Error: listen tcp {cfg.host}:{cfg.port}: bind: {exc.strerror}")
            nursery.cancel_scope.cancel()
            return 1
        names = ", ".join(m.name for m in cfg.models) or "none"
        log(f'time={time.strftime("%Y-%m-%dT%H:%M:%S")} level=INFO source=routes.go '
            f'msg="Listening on {cfg.host}:{port} (version {cfg.version})" models="{names}"')
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_config(argv)
    log = Log()
    return run_fake(run_server, cfg, log)
