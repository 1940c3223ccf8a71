"""The routes, the (fake) model load, signals and ``main``: binding comes before loading."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence

import attrs
import trio

from fakes import simgpu
from fakes.chat_template import TEMPLATE_PATH
from fakes.http11 import Exchange, HttpServer, Request
from fakes.llama_server.cli import N_CTX_TRAIN, Config, Log, Pooling, parse_config
from fakes.llama_server.engine import Engine
from fakes.llama_server.errors import (
    NOT_FOUND_BODY,
    ApiError,
    invalid_request,
    loading,
    no_audio,
    not_supported,
    respond_error,
)
from fakes.llama_server.formats import (
    BUILD_INFO,
    ChatFormat,
    NativeFormat,
    TextFormat,
    completion_id,
    embed,
    native_embeddings,
    oai_embeddings,
)
from fakes.llama_server.messages import MessagesFormat, count_tokens, messages_job
from fakes.llama_server.parsing import (
    body_json,
    build_job,
    chat_job,
    chat_prefill,
    chat_request,
    continuing,
    embedding_inputs,
    text_prompt,
)
from fakes.llama_server.placement import PlacementError, place_on_sim_gpu
from fakes.llama_server.rerank import rerank_body, rerank_request
from fakes.llama_server.responses import ResponsesFormat, input_tokens, responses_chat, responses_job
from fakes.llama_server.slot_files import slot_action, slot_id
from fakes.llama_server.slots import Slot
from fakes.llama_server.transcription import TranscriptionFormat, read_upload, transcription_job
from fakes.runner import run_fake

MIB = 1 << 20
CHAT_TEMPLATE = TEMPLATE_PATH.read_text()
PUBLIC_PATHS = frozenset({"/health", "/v1/health", "/models", "/v1/models", "/fake/stats"})


@attrs.define(eq=False)
class FakeLlamaServer:
    cfg: Config
    log: Log
    engine: Engine = attrs.field(init=False)
    http: HttpServer = attrs.field(init=False)
    ready: bool = attrs.field(default=False, init=False)
    created: int = attrs.field(factory=lambda: int(time.time()), init=False)
    routes: dict[tuple[str, str], Callable[[Exchange], Awaitable[None]]] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.engine = Engine(self.cfg, self.log)
        self.http = HttpServer(self.dispatch, self.cfg.connection_policy, on_failure=self._connection_failed)
        chat, text, native = self.chat_completions, self.completions, self.native_completion
        responses, transcriptions, rerank = self.responses, self.transcriptions, self.rerank
        self.routes = {
            ("GET", "/health"): self.health, ("GET", "/v1/health"): self.health,
            ("GET", "/v1/models"): self.models, ("GET", "/models"): self.models,
            ("GET", "/props"): self.props, ("POST", "/props"): self.props_update,
            ("GET", "/slots"): self.slots, ("GET", "/metrics"): self.metrics,
            ("POST", "/v1/chat/completions"): chat, ("POST", "/chat/completions"): chat,
            ("POST", "/v1/completions"): text,
            ("POST", "/completion"): native, ("POST", "/completions"): native,
            ("POST", "/v1/embeddings"): self.oai_embeddings,
            ("POST", "/embeddings"): self.native_embeddings, ("POST", "/embedding"): self.native_embeddings,
            ("POST", "/v1/responses"): responses, ("POST", "/responses"): responses,
            ("POST", "/v1/messages"): self.messages,
            ("POST", "/v1/audio/transcriptions"): transcriptions, ("POST", "/audio/transcriptions"): transcriptions,
            ("POST", "/v1/rerank"): rerank, ("POST", "/v1/reranking"): rerank,
            ("POST", "/rerank"): rerank, ("POST", "/reranking"): rerank,
            ("POST", "/v1/responses/input_tokens"): self.responses_input_tokens,
            ("POST", "/responses/input_tokens"): self.responses_input_tokens,
            ("POST", "/v1/chat/completions/input_tokens"): self.chat_input_tokens,
            ("POST", "/chat/completions/input_tokens"): self.chat_input_tokens,
            ("POST", "/v1/messages/count_tokens"): self.messages_count_tokens,
            ("GET", "/fake/stats"): self.fake_stats,
        }

    # ---- lifecycle

    async def load(self, port: int) -> bool:
        cfg, log = self.cfg, self.log
        log("main: loading model")
        log(f"srv    load_model: loading model '{cfg.model_path}'")
        if cfg.sim_gpu:
            try:
                shares = place_on_sim_gpu(cfg.sim_gpu, cfg.memory, cfg.placement)
            except PlacementError as exc:
                self._log_load_failure(f"llama_model_load_from_file_impl: {exc}")
                return False
            for device, nbytes in shares:
                simgpu.register(device, nbytes, label=cfg.model_id)
                log(f"srv    load_model: fake: {nbytes / MIB:.2f} MiB on simulated GPU {device}")
            if not shares:
                log("srv    load_model: fake: no simulated GPU to use, a CPU run")
        await trio.sleep(cfg.load_time)
        if cfg.fail_load is not None:
            self._log_load_failure(f"llama_model_load: error loading model: {cfg.fail_load}",
                                   "llama_model_load_from_file_impl: failed to load model")
            return False
        log(f"srv    load_model: initializing slots, n_slots = {cfg.n_slots}")
        for slot in self.engine.pool.slots:
            log(f"slot   load_model: id  {slot.id} | task -1 | new slot, n_ctx = {slot.n_ctx}")
        log("main: model loaded")
        self.ready = True
        log(f"main: server is listening on http://{cfg.host}:{port} - starting the main loop")
        log("srv  update_slots: all slots are idle")
        return True

    def _log_load_failure(self, *why: str) -> None:
        for line in why:
            self.log(line)
        self.log(f"srv    load_model: failed to load model, '{self.cfg.model_path}'")
        self.log("srv    operator(): operator(): cleaning up before exit...")
        self.log("main: exiting due to model loading error")

    # ---- requests

    def _connection_failed(self, client: str, exc: Exception) -> None:
        self.log(f"srv  fake: connection from {client} failed: {exc!r}")

    async def dispatch(self, ex: Exchange) -> None:
        req = ex.request
        try:
            if not self.ready:
                raise loading()
            self._check_api_key(req)
            handler = self.routes.get((req.method, req.path))
            if handler is None and req.method == "POST" and slot_id(req.path) is not None:
                handler = self.slot_action
            if handler is None:
                await ex.respond_json(404, NOT_FOUND_BODY)
            else:
                await handler(ex)
        except ApiError as err:  # raised before anything was sent
            await respond_error(ex, err)
        except Exception as exc:  # noqa: BLE001 - llama-server's exception handler: a 500 error object
            if ex.status:
                raise
            await respond_error(ex, ApiError(500, str(exc), "server_error"))
        if self.cfg.verbose:
            self.log(f"srv  log_server_r: request: {req.method} {req.path} {req.client} {ex.status}")

    def _check_api_key(self, req: Request) -> None:
        if self.cfg.api_key is None or req.path in PUBLIC_PATHS:
            return
        auth = req.headers.get("authorization", "")
        given = auth[7:] if auth.startswith("Bearer ") else req.headers.get("x-api-key")
        if given != self.cfg.api_key:
            raise ApiError(401, "Invalid API Key", "authentication_error")

    # ---- simple routes

    async def health(self, ex: Exchange) -> None:
        await ex.respond_json(200, {"status": "ok"})

    async def fake_stats(self, ex: Exchange) -> None:
        s, pool = self.engine.stats, self.engine.pool
        await ex.respond_json(200, {"started": s.started, "completed": s.completed, "cancelled": s.cancelled,
                                    "active": pool.active, "deferred": pool.deferred,
                                    "connections": self.http.connections})

    async def models(self, ex: Exchange) -> None:
        cfg = self.cfg
        details = {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                   "parameter_size": "", "quantization_level": ""}
        meta = {"vocab_type": 2, "n_vocab": 32000, "n_ctx_train": N_CTX_TRAIN, "n_embd": cfg.embedding_dim,
                "n_params": 1_000_000_000, "size": cfg.memory}
        await ex.respond_json(200, {
            "models": [{"name": cfg.model_id, "model": cfg.model_id, "modified_at": "", "size": "", "digest": "",
                        "type": "model", "description": "", "tags": [""], "capabilities": ["completion"],
                        "parameters": "", "details": details}],
            "object": "list",
            "data": [{"id": cfg.model_id, "object": "model", "created": self.created, "owned_by": "llamacpp",
                      "meta": meta}],
        })

    async def props(self, ex: Exchange) -> None:
        cfg = self.cfg
        await ex.respond_json(200, {
            "default_generation_settings": Slot(0, cfg.slot_n_ctx).to_json(),
            "total_slots": cfg.n_slots, "model_alias": cfg.model_id, "model_path": cfg.model_path,
            "modalities": {"vision": False, "audio": cfg.hears_audio}, "chat_template": CHAT_TEMPLATE,
            "chat_template_caps": {}, "bos_token": "<s>", "eos_token": "</s>", "media_marker": "<__media__>",
            "build_info": BUILD_INFO, "is_sleeping": False,
        })

    async def props_update(self, ex: Exchange) -> None:
        raise not_supported("changing global properties", "--props")

    async def slots(self, ex: Exchange) -> None:
        pool = self.engine.pool
        if not self.cfg.slots_endpoint:
            raise not_supported("slots endpoint", "--slots")
        if "fail_on_no_slot=1" in ex.request.query and pool.active == len(pool.slots):
            raise ApiError(503, "no slot available", "unavailable_error")
        await ex.respond_json(200, [slot.to_json() for slot in pool.slots])

    async def slot_action(self, ex: Exchange) -> None:
        cfg, slot = self.cfg, slot_id(ex.request.path)
        assert slot is not None
        await ex.respond_json(200, await slot_action(self.engine.pool.slots, cfg.slot_save_path, slot,
                                                     ex.request.query_params.get("action"), body_json(ex.request), cfg.slot_delay,
                                                     cfg.slot_fail))

    async def metrics(self, ex: Exchange) -> None:
        if not self.cfg.metrics:
            raise not_supported("metrics endpoint", "--metrics")
        s, pool = self.engine.stats, self.engine.pool
        rows = [
            ("prompt_tokens_total", "counter", "Number of prompt tokens processed.", s.prompt_tokens),
            ("prompt_seconds_total", "counter", "Prompt process time", s.prompt_seconds),
            ("tokens_predicted_total", "counter", "Number of generation tokens processed.", s.predicted_tokens),
            ("tokens_predicted_seconds_total", "counter", "Predict process time", s.predicted_seconds),
            ("n_decode_total", "counter", "Total number of llama_decode() calls", s.predicted_tokens),
            ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.",
             s.prompt_tokens / s.prompt_seconds if s.prompt_seconds else 0.0),
            ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.",
             s.predicted_tokens / s.predicted_seconds if s.predicted_seconds else 0.0),
            ("requests_processing", "gauge", "Number of requests processing.", pool.active),
            ("requests_deferred", "gauge", "Number of requests deferred.", pool.deferred),
        ]
        text = "".join(f"# HELP llamacpp:{name} {doc}\n# TYPE llamacpp:{name} {kind}\nllamacpp:{name} {value}\n"
                       for name, kind, doc, value in rows)
        await ex.respond(200, text.encode(), b"text/plain; version=0.0.4")

    # ---- completions and embeddings

    async def chat_completions(self, ex: Exchange) -> None:
        body = body_json(ex.request)
        chat = chat_request(body)
        prefill = chat_prefill(chat)
        job = continuing(chat_job(chat, body, self.cfg), prefill)
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        await self.engine.complete(ex, job, ChatFormat(completion_id(), self.cfg.model_id, job.n_prompt,
                                                       include_usage, prefill))

    async def completions(self, ex: Exchange) -> None:
        body = body_json(ex.request)
        prompt_text, n_prompt = text_prompt(body)
        job = build_job(body, self.cfg, prompt_text, n_prompt)
        await self.engine.complete(ex, job, TextFormat(completion_id(), self.cfg.model_id, n_prompt))

    async def native_completion(self, ex: Exchange) -> None:
        body = body_json(ex.request)
        prompt_text, n_prompt = text_prompt(body)
        job = build_job(body, self.cfg, prompt_text, n_prompt)
        await self.engine.complete(ex, job, NativeFormat(self.cfg.model_id, n_prompt))

    async def oai_embeddings(self, ex: Exchange) -> None:
        await self._embeddings(ex, oai=True)

    async def native_embeddings(self, ex: Exchange) -> None:
        await self._embeddings(ex, oai=False)

    async def _embeddings(self, ex: Exchange, *, oai: bool) -> None:
        cfg = self.cfg
        if not cfg.embeddings:
            raise not_supported("embeddings", "--embeddings")
        if oai and cfg.pooling is Pooling.NONE:
            raise invalid_request("Pooling type 'none' is not OAI compatible. Please use a different pooling type")
        body = body_json(ex.request)
        inputs = embedding_inputs(body)
        encoding = body.get("encoding_format", "float")

        def answer() -> object:
            vectors = [embed(text, cfg.embedding_dim) for text, _ in inputs]
            if oai:
                return oai_embeddings(cfg.model_id, vectors, sum(n for _, n in inputs), encoding)
            return native_embeddings(vectors)

        await self.engine.encode(ex, [n for _, n in inputs], answer)

    async def rerank(self, ex: Exchange) -> None:
        if not self.cfg.reranks:
            raise not_supported("reranking", "--reranking")
        request = rerank_request(body_json(ex.request))
        await self.engine.encode(ex, request.pair_tokens, lambda: rerank_body(request, self.cfg.model_id))

    # ---- the APIs llama-server converts to chat

    async def responses(self, ex: Exchange) -> None:
        job = responses_job(body_json(ex.request), self.cfg)
        await self.engine.complete(ex, job, ResponsesFormat(self.cfg.model_id))

    async def messages(self, ex: Exchange) -> None:
        job = messages_job(body_json(ex.request), self.cfg)
        await self.engine.complete(ex, job, MessagesFormat(completion_id(), self.cfg.model_id, job.n_prompt))

    async def transcriptions(self, ex: Exchange) -> None:
        if not self.cfg.hears_audio:
            raise no_audio()
        job = transcription_job(read_upload(ex.request), self.cfg)
        await self.engine.complete(ex, job, TranscriptionFormat())

    async def responses_input_tokens(self, ex: Exchange) -> None:
        await ex.respond_json(200, input_tokens(responses_chat(body_json(ex.request))))

    async def chat_input_tokens(self, ex: Exchange) -> None:
        await ex.respond_json(200, input_tokens(chat_request(body_json(ex.request))))

    async def messages_count_tokens(self, ex: Exchange) -> None:
        await ex.respond_json(200, count_tokens(body_json(ex.request)))


# --------------------------------------------------------------------------- main


async def _watch_signals(cancel_scope: trio.CancelScope, log: Log,
                         task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for _ in signals:
            log("srv    operator(): operator(): cleaning up before exit...")
            cancel_scope.cancel()
            return


async def run_server(cfg: Config, log: Log) -> int:
    """Serve until SIGTERM/SIGINT (0) or a failed load (1). Binding comes before loading."""
    async with trio.open_nursery() as nursery:
        await nursery.start(_watch_signals, nursery.cancel_scope, log)
        server = FakeLlamaServer(cfg, log)
        try:
            port = await nursery.start(server.http.serve, cfg.host, cfg.port)
        except OSError as exc:
            log(f"main: couldn't bind HTTP server socket, hostname: {cfg.host}, port: {cfg.port} ({exc.strerror})")
            nursery.cancel_scope.cancel()
            return 1
        log(f"main: HTTP server is listening, hostname: {cfg.host}, port: {port}, http threads: {cfg.n_slots + 4}")
        if not await server.load(port):
            nursery.cancel_scope.cancel()
            return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_config(argv)
    if cfg.slot_save_path is not None and not os.path.isdir(cfg.slot_save_path):
        print(f'error while handling argument "--slot-save-path": not a directory: {cfg.slot_save_path}',
              file=sys.stderr)  # as llama-server refuses it, before it logs anything
        return 1
    log = Log(enabled=not cfg.log_disabled)
    log(f"build: {BUILD_INFO.split('-')[0][1:]} ({BUILD_INFO.split('-')[1]}) with fakes.llama_server")
    return run_fake(run_server, cfg, log)
