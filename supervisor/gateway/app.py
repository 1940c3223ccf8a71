"""The gateway's Quart-Trio app: model list, health, OpenAI-shaped errors.

The inference routes are served by ``InferenceHandler`` in front of Quart (an ASGI
middleware on ``app.asgi_app``), everything else by ordinary Quart routes.
"""

from __future__ import annotations

import time
from typing import Any

from quart import Response
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from supervisor.config import Config
from supervisor.events import EventLog
from supervisor.gateway.errors import error_body
from supervisor.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from supervisor.metrics import StewardMetrics
from supervisor.gateway.gate import RequestGate, gated
from supervisor.gateway.inference import INFERENCE_PATHS, InferenceHandler, Receive, Scope, Send
from supervisor.scheduler.actor import SchedulerClient


def create_app(config: Config, scheduler: SchedulerClient, events: EventLog, gate: RequestGate,
               metrics: StewardMetrics) -> QuartTrio:
    app = QuartTrio("steward")
    started = int(time.time())
    aliases = config.alias_table()
    inference = InferenceHandler(scheduler, events, aliases, config.limits.max_body_size,
                                 config.scheduler.embedding_chunk)
    quart_asgi = app.asgi_app

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] in INFERENCE_PATHS and scope["method"] == "POST":
            await inference(scope, receive, send)
        else:
            await quart_asgi(scope, receive, send)

    app.asgi_app = gated(gate, route, quart_asgi)  # type: ignore[method-assign]

    async def served_by_inference_handler() -> Response:
        raise AssertionError("POSTs to inference routes never reach Quart")

    for path in INFERENCE_PATHS:
        # Declared so that Quart answers other methods on these paths with 405, not 404.
        app.add_url_rule(path, path, served_by_inference_handler, methods=["POST"])

    def model_entry(name: str) -> dict[str, Any]:
        target = aliases[name]
        engines = {e.name: e for e in scheduler.snapshot().engines}
        engine = engines[target]
        return {"id": name, "object": "model", "created": started, "owned_by": "steward",
                "steward": {"alias_of": None if target == name else target, "status": engine.status,
                            "memory": engine.memory, "slots": engine.slots, "pinned": engine.pinned}}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [model_entry(name) for name in aliases]}

    @app.get("/v1/models/<path:model_id>")
    async def get_model(model_id: str) -> Response | dict[str, Any]:
        if model_id not in aliases:
            return _error(404, f"The model '{model_id}' does not exist.", param="model", code="model_not_found")
        return model_entry(model_id)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        snapshot = scheduler.snapshot()
        return {"status": "ok", "mode": snapshot.mode, "budget": snapshot.budget, "reserved": snapshot.reserved,
                "queued": snapshot.queued,
                "classes": {k: {"queued": snapshot.queued_by_class[k], "running": snapshot.running_by_class[k]}
                            for k in snapshot.queued_by_class},
                "engines": {e.name: {"status": e.status, "in_flight": e.in_flight, "slots": e.slots,
                                     "queued": e.queued, "memory": e.memory, "reserved": e.reserved,
                                     "pinned": e.pinned, "hot": e.hot, "draining": e.draining,
                                     "failures": e.failures}
                            for e in snapshot.engines}}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), content_type=METRICS_CONTENT_TYPE)

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        messages = {404: "Unknown route.", 405: "Method not allowed on this route."}
        return _error(status, messages.get(status, exc.description or exc.name))

    return app


def _error(status: int, message: str, *, param: str | None = None, code: str | None = None) -> Response:
    return Response(error_body(status, message, param=param, code=code), status=status,
                    content_type="application/json")
