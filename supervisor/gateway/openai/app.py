"""The gateway's Quart-Trio app: model list, health, OpenAI-shaped errors.

The inference routes are served by ``InferenceHandler`` in front of Quart (an ASGI
middleware on ``app.asgi_app``), everything else by ordinary Quart routes.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import trio
from quart import Response, request
from quart_trio import QuartTrio

from supervisor.apis import ModelKind, api_names, model_kind
from supervisor.config import Config
from supervisor.gateway.admin import (EVENTS_PATH, add_admin_routes, is_admin_path, is_engine_logs_path,
                                      serve_admin_events, serve_engine_logs_follow, waiting_lines, wants_follow)
from supervisor.gateway.openai.api_routes import error_shape_for
from supervisor.gateway.http.asgi import Receive, Scope, Send, send_whole
from supervisor.gateway.catalog import ImageModel, ModelCatalog
from supervisor.gateway.cloud import RemoteModels
from supervisor.gateway.door import UI_PATH, exchange_of, is_probe
from supervisor.gateway.errors import anthropic_error_body, error_body
from supervisor.gateway.http.gate import gated
from supervisor.gateway.openai.images import FILES_PREFIX, GENERATIONS_PATH
from supervisor.gateway.openai.inference import INFERENCE_PATHS, InferenceHandler
from supervisor.videos.request import VIDEOS_PATH
from supervisor.gateway.http.quart_app import add_health_routes, json_error, new_quart_app
from supervisor.gateway.readiness import add_readiness_route
from supervisor.gateway.services import Services
from supervisor.gateway.ui.routes import add_ui_routes
from supervisor.gateway.relay.upstream import Timeouts
from supervisor.engines.memory_plan import device_label
from supervisor.config_policy import scheduling_policy
from supervisor.nodes.fleet import fleet_json, held_lines
from supervisor.nodes.state import STATE_PATH, node_state, state_to_json


def create_app(config: Config, services: Services) -> QuartTrio:
    scheduler, events, door, nodes, images = (services.scheduler, services.events, services.door, services.nodes,
                                              services.images)
    gate, health, device, videos = services.gate, services.health, services.device, services.videos
    app = new_quart_app("steward", error_body, events, lambda path: error_shape_for({"path": path}))
    started = int(time.time())
    catalog = services.catalog or ModelCatalog.of(config)
    aliases = catalog.aliases  # the same mapping as the door's: a reload replaces its contents
    policy = scheduling_policy(config)
    clouds = RemoteModels(catalog, door, events, policy.queue_timeout, policy.max_queue)
    services.metrics.watch_remote(clouds.state)
    inference = InferenceHandler(scheduler, events, aliases, services.body_limits, config.scheduler.embedding_chunk,
                                 Timeouts(config.engines.first_byte_timeout, config.engines.chunk_timeout), door,
                                 catalog.served, nodes, catalog.apis, catalog.step_tokens, catalog.contexts, clouds,
                                 catalog.fallbacks, catalog.voices)
    quart_asgi = app.asgi_app

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        if is_probe(scope):  # Claude Code's, at its start: the server is there (llama-server's web UI says 200)
            await send_whole(send, 200, [(b"content-type", b"text/plain; charset=utf-8")], b"")
        elif scope["path"] in INFERENCE_PATHS and scope["method"] == "POST":
            await inference(scope, receive, send)
        elif images is not None and scope["path"] == GENERATIONS_PATH and scope["method"] == "POST":
            await images.generate(scope, receive, send)
        elif images is not None and scope["path"].startswith(FILES_PREFIX) and scope["method"] == "GET":
            await images.serve_file(scope, send)
        elif videos is not None and videos.serves(scope):
            await videos(scope, receive, send)
        elif scope["path"] == EVENTS_PATH and scope["method"] == "GET":
            await serve_admin_events(scope, receive, send, events, gate)
        elif scope["method"] == "GET" and is_engine_logs_path(scope["path"]) and wants_follow(scope):
            await serve_engine_logs_follow(scope, receive, send, scheduler, events, gate)
        else:
            await quart_asgi(scope, receive, send)

    app.asgi_app = gated(gate, route, quart_asgi)  # type: ignore[method-assign]

    async def served_by_inference_handler() -> Response:
        # POSTs to these exact paths never reach Quart; anything that does (a trailing slash) is not a route.
        return json_error(error_shape_for({"path": request.path}), 404, "Unknown route.")

    for path in INFERENCE_PATHS:
        # Declared so that Quart answers other methods on these paths with 405, not 404.
        app.add_url_rule(path, path, served_by_inference_handler, methods=["POST"])

    @app.post(GENERATIONS_PATH)
    async def no_images() -> Response:
        # Reached only without ComfyUI (with it, the image handler answers first).
        return json_error(error_body, 404, "Image generation is not configured here: it needs a comfyui section and "
                                           "a model of runtime: comfyui.", param="model", code="model_not_found")

    @app.route(VIDEOS_PATH, methods=["GET", "POST"])
    async def no_videos() -> Response:
        # Reached only without ComfyUI (with it, the video handler answers first).
        return json_error(error_body, 404, "Video generation is not configured here: it needs a comfyui section and "
                                           "a model of runtime: comfyui with a video section.", param="model",
                          code="model_not_found")

    def model_entry(name: str) -> dict[str, Any]:
        target = aliases[name]
        engines = {e.name: e for e in scheduler.snapshot().engines}
        engine = engines[target]
        apis = catalog.apis.get(target, frozenset())
        kind = model_kind(apis)
        # What the model is for: steward's own field, and llama-server's `capabilities` (Ollama's words).
        return {"id": name, "object": "model", "created": started, "owned_by": "steward",
                "capabilities": [_CAPABILITY[kind]],
                "steward": {"alias_of": None if target == name else target, "kind": kind.value,
                            "serves": api_names(apis), "status": engine.status, "memory": engine.memory,
                            "slots": engine.slots, "pinned": engine.pinned}}

    def anthropic_entry(entry: dict[str, Any]) -> dict[str, Any]:
        """A model as Anthropic's GET /v1/models lists it (asked with an anthropic-version header)."""
        created = datetime.datetime.fromtimestamp(entry["created"], datetime.UTC).isoformat().replace("+00:00", "Z")
        return {"type": "model", "id": entry["id"], "display_name": entry["id"], "created_at": created}

    def for_anthropic() -> bool:
        return request.headers.get("anthropic-version") is not None

    def wanted(entry: dict[str, Any]) -> bool:
        kind = request.args.get("kind")  # ?kind=chat: only the models a chat client may offer
        return kind is None or entry.get("steward", {}).get("kind", ModelKind.CHAT.value) == kind

    def visible(name: str) -> bool:
        """A key limited to some models sees only those (and their aliases)."""
        key = exchange_of(request.scope).key
        return key is None or door.may_use(key, aliases[name])

    def visible_remote(name: str) -> bool:
        key = exchange_of(request.scope).key
        return key is None or door.may_use(key, name)

    def comfy_models() -> dict[str, ImageModel]:
        return {**catalog.images, **catalog.videos}

    def image_entry(name: str) -> dict[str, Any]:
        model = comfy_models()[name]
        video = model.config.video
        if video is not None:
            kind, serves = ModelKind.VIDEO, {"serves": ["videos"], "runtime": "comfyui", "sizes": video.sizes,
                                             "seconds": [str(s) for s in video.seconds], "fps": video.fps}
        else:
            kind, serves = ModelKind.IMAGE, {"serves": ["images"], "runtime": "comfyui", "size": model.config.size}
        return {"id": name, "object": "model", "created": started, "owned_by": "steward",
                "capabilities": [kind.value],
                "steward": {"alias_of": None if model.name == name else model.name, "kind": kind.value, **serves}}

    def visible_image(name: str) -> bool:
        key = exchange_of(request.scope).key
        return key is None or door.may_use(key, comfy_models()[name].name)

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        local = [model_entry(name) for name in aliases if visible(name)]
        local += [image_entry(name) for name in comfy_models() if name not in aliases and visible_image(name)]
        local += [entry for entry in clouds.model_entries(started) if visible_cloud(entry["id"])]
        remote = [entry for entry in (nodes.model_entries(started) if nodes is not None else [])
                  if entry["id"] not in aliases and visible_remote(entry["id"])]
        entries = [entry for entry in local + remote if wanted(entry)]
        if for_anthropic():
            data = [anthropic_entry(entry) for entry in entries]
            return {"data": data, "has_more": False, "first_id": data[0]["id"] if data else None,
                    "last_id": data[-1]["id"] if data else None}
        return {"object": "list", "data": entries}

    def visible_cloud(name: str) -> bool:
        """A remote model is listed to a key that may send to it (its list and its --remote)."""
        key = exchange_of(request.scope).key
        return key is None or (key.may_reach_remote and door.may_use(key, catalog.remote[name]))

    @app.get("/v1/models/<path:model_id>")
    async def get_model(model_id: str) -> Response | dict[str, Any]:
        if model_id in catalog.remote and visible_cloud(model_id):
            entry = next(e for e in clouds.model_entries(started) if e["id"] == model_id)
            return anthropic_entry(entry) if for_anthropic() else entry
        if model_id in comfy_models() and model_id not in aliases and visible_image(model_id):
            entry = image_entry(model_id)
            return anthropic_entry(entry) if for_anthropic() else entry
        if model_id not in aliases or not visible(model_id):
            shape = anthropic_error_body if for_anthropic() else error_body
            return json_error(shape, 404, f"The model '{model_id}' does not exist.", param="model",
                              code="model_not_found")
        entry = model_entry(model_id)
        return anthropic_entry(entry) if for_anthropic() else entry

    def health_details() -> dict[str, Any]:
        snapshot, now = scheduler.snapshot(explained=True), trio.current_time()
        fleet = None if nodes is None else nodes.fleet()  # a front door's nodes, and the requests held for them
        return {"mode": snapshot.mode, "budget": snapshot.budget, "reserved": snapshot.reserved,
                "devices": [{"device": device_label(device, d.index), "budget": d.budget, "reserved": d.reserved,
                             "outside": d.outside, "free": d.free} for d in snapshot.devices],
                "queued": snapshot.queued,
                "waiting": waiting_lines(snapshot, now) + ([] if fleet is None else held_lines(fleet)),
                **({} if fleet is None else fleet_json(fleet, time.time())),
                "remote": clouds.state(),  # the cloud's models: places in use, requests waiting for one
                "classes": {k: {"queued": snapshot.queued_by_class[k], "running": snapshot.running_by_class[k]}
                            for k in snapshot.queued_by_class},
                "engines": {e.name: {"status": e.status, "in_flight": e.in_flight, "slots": e.slots,
                                     "queued": e.queued, "memory": e.memory, "reserved": e.reserved,
                                     "pinned": e.pinned, "hot": e.hot, "draining": e.draining,
                                     "failures": e.failures, "healthy": e.healthy, "measured": e.measured,
                                     "devices": [device_label(device, index) for index in e.devices],
                                     # The engine's own account of its queue (vLLM) and KV cache (vLLM,
                                     # llama-server), where it gives one.
                                     "engine_load": None if e.engine_running is None and e.engine_waiting is None
                                     and e.engine_kv_usage is None else {"running": e.engine_running,
                                     "waiting": e.engine_waiting, "kv_usage": e.engine_kv_usage}}
                            for e in snapshot.engines}}

    @app.get(STATE_PATH)
    async def state() -> dict[str, Any]:
        """What a front door routes by (an admin route once keys are in force)."""
        return state_to_json(node_state(scheduler.snapshot(), health.assess(), aliases, device))

    add_health_routes(app, health, services.metrics, health_details)
    add_readiness_route(app, scheduler, aliases)
    state_now = add_admin_routes(app, scheduler, health, events, device, services.reload,  # type: ignore[arg-type]
                                 nodes, services.history, clouds.state,
                                 services.videos.service.state if services.videos is not None else list)
    add_ui_routes(app, state_now, services.history, door, services.usage_db)
    return app


_CAPABILITY = {ModelKind.CHAT: "completion", ModelKind.EMBEDDING: "embedding", ModelKind.RERANK: "rerank",
               ModelKind.TRANSCRIPTION: "audio", ModelKind.SPEECH: "speech"}


def is_admin_route(scope: Scope) -> bool:
    return scope["path"].startswith(("/steward/", UI_PATH)) or is_admin_path(scope["path"])
