"""The Quart-Trio app under each listener, with errors in the listener's own shape.

Quart answers what steward's own ASGI handlers do not take (health, metrics, model list,
unknown routes, wrong methods); left to itself it would answer 404/405 as HTML pages and
merge ``//v1/...`` into ``/v1/...``, routing it to a handler that is never meant to run.
It serves no websocket (ComfyUI's ``/ws`` is relayed before Quart is reached): a websocket
handshake is refused with a 404 in the listener's shape, before Quart's routing, whose
errors in a websocket's context were 500s.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from quart import Response, has_request_context, request, websocket
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from supervisor.observe.events import EventLog
from supervisor.gateway.http.asgi import Receive, Scope, Send, refuse_websocket
from supervisor.gateway.errors import ErrorShape, content_type_of
from supervisor.observe.health import HealthStatus, HealthWatch
from supervisor.observe.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from supervisor.observe.metrics import StewardMetrics

_MESSAGES = {404: "Unknown route.", 405: "Method not allowed on this route."}


def new_quart_app(name: str, shape: ErrorShape, events: EventLog,
                  shape_of: Callable[[str], ErrorShape] | None = None) -> QuartTrio:
    """*shape_of* names the shape by the request's path where the listener speaks several (Anthropic's routes)."""
    app = QuartTrio(name)

    def shape_at(path: str) -> ErrorShape:
        return shape_of(path) if shape_of is not None else shape

    def shape_here() -> ErrorShape:
        return shape_at(request.path if has_request_context() else websocket.path)

    app.url_map.merge_slashes = False  # `//v1/models` is not `/v1/models`: 404, not a redirect
    app.url_map.strict_slashes = False

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        return json_error(shape_here(), status, _MESSAGES.get(status, exc.description or exc.name))

    @app.errorhandler(Exception)
    async def internal_error(exc: Exception) -> Response:
        # A bug of ours: logged with what failed, answered in the listener's shape.
        events.emit("internal_error", "error", source=name, error=f"{type(exc).__name__}: {exc}")
        return json_error(shape_here(), 500, f"steward failed to handle this request ({type(exc).__name__}).")

    quart_asgi = app.asgi_app

    async def without_websockets(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await refuse_websocket(scope, send, shape_at(scope["path"]), 404, "steward serves no websocket here.")
        else:
            await quart_asgi(scope, receive, send)

    app.asgi_app = without_websockets  # type: ignore[method-assign]
    return app


def json_error(shape: ErrorShape, status: int, message: str, *, param: str | None = None,
               code: str | None = None) -> Response:
    return Response(shape(status, message, param=param, code=code), status=status,
                    content_type=content_type_of(shape).decode())


def add_health_routes(app: QuartTrio, health: HealthWatch, metrics: StewardMetrics,
                      details: Callable[[], dict[str, Any]]) -> None:
    """/livez (the process serves), /healthz (is capacity enough: 503 when overloaded) and /metrics,
    the same on every listener; *details* adds what the listener's own clients read there."""

    @app.get("/livez")
    async def livez() -> dict[str, Any]:
        return {"status": "alive"}

    @app.get("/healthz")
    async def healthz() -> Response:
        assessed = health.assess()
        body = {**assessed.to_json(), **details()}
        status = 503 if assessed.status is HealthStatus.OVERLOADED else 200
        return Response(json.dumps(body), status=status, content_type="application/json")

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), content_type=METRICS_CONTENT_TYPE)
