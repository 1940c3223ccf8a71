"""The routes (ComfyUI's ``server.py``), its Origin middleware, the ``/api`` prefix, signals and ``main``."""

from __future__ import annotations

import ipaddress
import json
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlparse, urlsplit

import attrs
import trio

from fakes.comfyui.assets import INDEX_HTML, object_info
from fakes.comfyui.cli import VERSION, Config, parse_config
from fakes.comfyui.memory import Gpu
from fakes.comfyui.prompts import Prompts
from fakes.comfyui.workflow import PromptRejected, no_prompt, validate
from fakes.comfyui.uploads import parse_upload
from fakes.comfyui.ws import Hub
from fakes.runner import run_fake
from fakes.http11 import Exchange, HttpServer, watch_signals
from fakes.llama_server.cli import Log

TEXT = b"text/plain; charset=utf-8"
EMPTY = b"application/octet-stream"    # aiohttp's web.Response() with no body
SERVER_ERROR = b"500 Internal Server Error\n\nServer got itself in trouble"
MAX_UPLOAD_SIZE = 100 * 1024 * 1024
Route = Callable[[Exchange, str], Awaitable[None]]


class BadJson(Exception):
    """``await request.json()`` raised: aiohttp answers 500."""


def json_body(ex: Exchange) -> Any:
    try:
        return json.loads(ex.request.body)
    except (ValueError, RecursionError):
        raise BadJson from None


def aiohttp_json(value: object) -> bytes:
    """``web.json_response``'s body: ``json.dumps`` as it is (what steward's copies of /prompt's answers match)."""
    return json.dumps(value).encode()


def _is_loopback(host: str | None) -> bool:
    """``server.is_loopback`` without DNS: an IP literal, or localhost (which resolves to loopback)."""
    if not host:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost" or host.endswith(".localhost")


def origin_mismatch(headers: dict[str, str]) -> bool:
    """``create_origin_only_middleware``: Host is loopback and Origin names another host -> 403."""
    if "host" not in headers or "origin" not in headers:
        return False
    try:
        host_domain: str | None = headers["host"].lower()
        parsed = urlparse(headers["origin"])
        origin_domain: str | None = parsed.netloc.lower()
        host_parsed = urlsplit("//" + (host_domain or ""))
        loopback = _is_loopback(host_parsed.hostname)
        if parsed.port is None:  # an origin without a port: compare host names only
            host_domain = host_parsed.hostname
        if host_parsed.port is None:
            origin_domain = parsed.hostname
    except ValueError:  # a port that is not a number
        return False
    return bool(loopback and host_domain and origin_domain and host_domain != origin_domain)


@attrs.define(eq=False)
class FakeComfyUI:
    cfg: Config
    log: Log
    gpu: Gpu = attrs.field(init=False)
    hub: Hub = attrs.field(init=False)
    prompts: Prompts = attrs.field(init=False)
    http: HttpServer = attrs.field(init=False)
    routes: dict[tuple[str, str], Route] = attrs.field(init=False)
    # Images posted to /upload/image, by (subfolder, name): what /view?type=input serves.
    uploads: dict[tuple[str, str], tuple[bytes, str]] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        self.gpu = Gpu(self.cfg)
        self.hub = Hub({"supports_preview_metadata": True, "max_upload_size": MAX_UPLOAD_SIZE})
        self.prompts = Prompts(self.cfg, self.gpu, self.hub)
        self.http = HttpServer(self.dispatch, self.cfg.connection_policy, on_failure=self._connection_failed)
        self.routes = {
            ("GET", "/"): self.index, ("GET", "/ws"): self.websocket,
            ("GET", "/prompt"): self.get_prompt, ("POST", "/prompt"): self.post_prompt,
            ("GET", "/queue"): self.get_queue, ("POST", "/queue"): self.post_queue,
            ("POST", "/interrupt"): self.interrupt, ("POST", "/free"): self.free,
            ("GET", "/history"): self.get_history, ("POST", "/history"): self.post_history,
            ("GET", "/history/"): self.get_history_item,
            ("GET", "/system_stats"): self.system_stats, ("GET", "/features"): self.features,
            ("GET", "/object_info"): self.object_info, ("GET", "/object_info/"): self.object_info_item,
            ("GET", "/embeddings"): self.empty_list, ("GET", "/extensions"): self.empty_list,
            ("GET", "/view"): self.view, ("POST", "/upload/image"): self.upload_image,
            ("POST", "/fake/drop"): self.fake_drop, ("POST", "/fake/restart"): self.fake_restart,
            ("GET", "/fake/stats"): self.fake_stats,
        }

    # ---- dispatch

    def _connection_failed(self, client: str, exc: Exception) -> None:
        self.log(f"fake: connection from {client} failed: {exc!r}")

    def _route(self, method: str, path: str) -> tuple[Route | None, str]:
        """(handler, the rest of the path after a ``/history/``-style prefix)."""
        if (handler := self.routes.get((method, path))) is not None:
            return handler, ""
        head, sep, rest = path[1:].partition("/")
        if sep and rest and (handler := self.routes.get((method, f"/{head}/"))) is not None:
            return handler, rest
        return None, ""

    async def dispatch(self, ex: Exchange) -> None:
        req = ex.request
        path = req.path[4:] if req.path.startswith("/api/") else req.path  # every route also under /api
        if self.cfg.cors_origin is not None:
            ex.headers += [(b"access-control-allow-origin", self.cfg.cors_origin.encode()),
                           (b"access-control-allow-methods", b"POST, GET, DELETE, PUT, OPTIONS, PATCH"),
                           (b"access-control-allow-headers", b"Content-Type, Authorization"),
                           (b"access-control-allow-credentials", b"true")]
        elif origin_mismatch(req.headers):
            if self.cfg.verbose:
                self.log(f"WARNING: request with non matching host and origin {req.headers['host']} != "
                         f"{req.headers['origin']}, returning 403")
            await ex.respond(403, b"", EMPTY)
            return
        handler, rest = self._route(req.method, path)
        try:
            if req.method == "OPTIONS":
                await ex.respond(200, b"", EMPTY)
            elif handler is not None:
                await handler(ex, rest)
            elif any(p == path for _, p in self.routes):
                allowed = ",".join(sorted(m for m, p in self.routes if p == path))
                ex.headers.append((b"allow", allowed.encode()))
                await ex.respond(405, b"405: Method Not Allowed", TEXT)
            else:
                await ex.respond(404, b"404: Not Found", TEXT)
        except Exception:  # noqa: BLE001 - aiohttp answers any handler exception (BadJson too) with a 500
            if ex.status:
                raise  # the answer started: aiohttp drops the connection too
            await ex.respond(500, SERVER_ERROR, TEXT)
        if self.cfg.verbose:
            self.log(f'{req.client} "{req.method} {req.path}" {ex.status}')

    async def ok(self, ex: Exchange) -> None:
        await ex.respond(200, b"", EMPTY)

    # ---- routes

    async def index(self, ex: Exchange, _rest: str) -> None:
        await ex.respond(200, INDEX_HTML, b"text/html; charset=utf-8")

    async def websocket(self, ex: Exchange, _rest: str) -> None:
        if ex.request.websocket_key is None:
            await ex.respond(400, b'400: No WebSocket UPGRADE hdr: None\n Can "Upgrade" only to "WebSocket".', TEXT)
            return
        sid = ex.request.query_params.get("clientId") or uuid.uuid4().hex
        hello: list[tuple[str, dict[str, Any]]] = [("status", {"status": self.prompts.status(), "sid": sid})]
        running = self.prompts.running
        if running is not None and running.client_id == sid and self.prompts.last_node is not None:
            hello.append(("executing", {"node": self.prompts.last_node}))
        await self.hub.serve(ex, sid, hello)

    async def get_prompt(self, ex: Exchange, _rest: str) -> None:
        await ex.respond_json(200, self.prompts.status())

    async def post_prompt(self, ex: Exchange, _rest: str) -> None:
        body = json_body(ex)
        if not isinstance(body, dict):
            raise BadJson
        if "number" in body:
            try:
                number: float = float(body["number"])
            except (TypeError, ValueError):
                raise BadJson from None
        else:
            number = self.prompts.next_number(bool(body.get("front")))
        try:
            if "prompt" not in body:
                raise no_prompt()
            plan = validate(body["prompt"], self.cfg.steps, body.get("partial_execution_targets"))
        except PromptRejected as rejected:
            if self.cfg.verbose:
                self.log(f"invalid prompt: {rejected}")
            await ex.respond(400, aiohttp_json(rejected.body))
            return
        prompt_id = str(body.get("prompt_id") or uuid.uuid4())
        extra_data = dict(body.get("extra_data") or {})
        if "client_id" in body:
            extra_data["client_id"] = body["client_id"]
        extra_data["create_time"] = int(time.time() * 1000)
        self.prompts.put(number, prompt_id, body["prompt"], extra_data, plan)
        if self.cfg.verbose:
            self.log("got prompt")
        answer = {"prompt_id": prompt_id, "number": number, "node_errors": plan.node_errors}
        await ex.respond(200, aiohttp_json(answer))

    async def get_queue(self, ex: Exchange, _rest: str) -> None:
        running = self.prompts.running
        await ex.respond_json(200, {"queue_running": [running.as_list()] if running is not None else [],
                                    "queue_pending": [i.as_list() for i in self.prompts.pending]})

    async def post_queue(self, ex: Exchange, _rest: str) -> None:
        body = json_body(ex)
        if isinstance(body, dict):
            if body.get("clear"):
                self.prompts.clear()
            if isinstance(body.get("delete"), list):
                self.prompts.delete([str(i) for i in body["delete"]])
        await self.ok(ex)

    async def interrupt(self, ex: Exchange, _rest: str) -> None:
        try:
            body = json.loads(ex.request.body)
        except ValueError:
            body = {}
        prompt_id = body.get("prompt_id") if isinstance(body, dict) else None
        self.prompts.interrupt(str(prompt_id) if prompt_id else None)
        await self.ok(ex)

    async def free(self, ex: Exchange, _rest: str) -> None:
        body = json_body(ex)
        if isinstance(body, dict):
            self.prompts.request_free(bool(body.get("unload_models")), bool(body.get("free_memory")))
        await self.ok(ex)

    async def get_history(self, ex: Exchange, _rest: str) -> None:
        query = ex.request.query_params
        max_items = int(query["max_items"]) if query.get("max_items", "").isdigit() else None
        offset = int(query.get("offset", -1)) if query.get("offset", "").lstrip("-").isdigit() else -1
        await ex.respond_json(200, self.prompts.history_slice(max_items, offset))

    async def get_history_item(self, ex: Exchange, prompt_id: str) -> None:
        entry = self.prompts.history.get(prompt_id)
        await ex.respond_json(200, {prompt_id: entry} if entry is not None else {})

    async def post_history(self, ex: Exchange, _rest: str) -> None:
        body = json_body(ex)
        if isinstance(body, dict):
            if body.get("clear"):
                self.prompts.history.clear()
            for prompt_id in body.get("delete") or []:
                self.prompts.history.pop(str(prompt_id), None)
        await self.ok(ex)

    async def system_stats(self, ex: Exchange, _rest: str) -> None:
        name, total, free = self.gpu.device()
        ram_total, ram_free = self.gpu.ram()
        await ex.respond_json(200, {
            "system": {"os": "posix", "ram_total": ram_total, "ram_free": ram_free, "comfyui_version": VERSION,
                       "required_frontend_version": "1.27.10", "python_version": sys.version,
                       "pytorch_version": "2.8.0+cu128", "embedded_python": False, "argv": ["main.py"]},
            "devices": [{"name": f"cuda:0 {name} : cudaMallocAsync", "type": "cuda", "index": 0,
                         "vram_total": total, "vram_free": free, "torch_vram_total": self.gpu.held,
                         "torch_vram_free": 0}],
        })

    async def features(self, ex: Exchange, _rest: str) -> None:
        await ex.respond_json(200, self.hub.features)

    async def object_info(self, ex: Exchange, _rest: str) -> None:
        await ex.respond_json(200, object_info())

    async def object_info_item(self, ex: Exchange, class_type: str) -> None:
        info = object_info()
        await ex.respond_json(200, {class_type: info[class_type]} if class_type in info else {})

    async def empty_list(self, ex: Exchange, _rest: str) -> None:
        await ex.respond_json(200, [])

    async def view(self, ex: Exchange, _rest: str) -> None:
        query = ex.request.query_params
        filename, subfolder = query.get("filename", ""), query.get("subfolder", "")
        if not filename:
            await ex.respond(404, b"", EMPTY)
        elif filename.startswith("/") or ".." in filename:
            await ex.respond(400, b"", EMPTY)
        elif ".." in subfolder.split("/") or subfolder.startswith("/"):
            await ex.respond(403, b"", EMPTY)
        elif query.get("type") == "input" and (subfolder, filename) in self.uploads:
            data, mimetype = self.uploads[(subfolder, filename)]
            await ex.respond(200, data, mimetype.encode())
        elif (image := self.prompts.image(filename, subfolder, query.get("type", "output"))) is None:
            await ex.respond(404, b"", EMPTY)
        else:
            ex.headers.append((b"content-disposition", f'filename="{filename}"'.encode()))
            await ex.respond(200, image, b"image/webp" if filename.endswith(".webp") else b"image/png")

    async def upload_image(self, ex: Exchange, _rest: str) -> None:
        """ComfyUI's image upload (server.py image_upload): a form with `image` (the file) and
        optional `subfolder`, `type`, `overwrite`; answers the name it was stored under."""
        try:
            fields, files = parse_upload(ex.request)
        except ValueError:
            await ex.respond(400, b"", EMPTY)
            return
        image = files.get("image")
        if image is None or not image.filename:
            await ex.respond(400, b"", EMPTY)
            return
        subfolder, kind = fields.get("subfolder", ""), fields.get("type", "input")
        name = image.filename
        if fields.get("overwrite", "") not in ("true", "1"):  # as ComfyUI: "True" does not overwrite
            stem, dot, ext = name.rpartition(".")
            counter = 1
            while (subfolder, name) in self.uploads:
                name = f"{stem} ({counter}){dot}{ext}" if dot else f"{name} ({counter})"
                counter += 1
        self.uploads[(subfolder, name)] = (image.read(), image.mimetype or "application/octet-stream")
        await ex.respond_json(200, {"name": name, "subfolder": subfolder, "type": kind})

    # ---- test hooks

    async def fake_drop(self, ex: Exchange, _rest: str) -> None:
        """Make a prompt (``{"prompt_id"}``; all without one) vanish: it never reaches the history."""
        try:
            body = json.loads(ex.request.body)
        except ValueError:
            body = {}
        prompt_id = body.get("prompt_id") if isinstance(body, dict) else None
        await ex.respond_json(200, {"dropped": self.prompts.drop(str(prompt_id) if prompt_id else None)})

    async def fake_restart(self, ex: Exchange, _rest: str) -> None:
        """What a restart looks like from outside: queue, history, sockets and memory gone."""
        dropped = self.prompts.drop(None)
        self.prompts.history.clear()
        self.prompts.number = 0
        self.hub.close_all()
        self.gpu.drop()
        await ex.respond_json(200, {"dropped": dropped})

    async def fake_stats(self, ex: Exchange, _rest: str) -> None:
        s, p, gpu = self.prompts.stats, self.prompts, self.gpu
        await ex.respond_json(200, {
            "prompts_queued": s.queued, "prompts_succeeded": s.succeeded, "prompts_failed": s.failed,
            "prompts_interrupted": s.interrupted, "prompts_dropped": s.dropped, "free_calls": s.free_calls,
            "pending": len(p.pending), "running": p.running.prompt_id if p.running is not None else None,
            "models_loaded": gpu.loaded, "memory": gpu.held, "loads": gpu.loads, "unloads": gpu.unloads,
            "ws_clients": sorted(self.hub.clients), "connections": self.http.connections,
        })


# --------------------------------------------------------------------------- main


async def run_server(cfg: Config, log: Log) -> int:
    """Serve until SIGTERM/SIGINT (0); 1 if the port cannot be bound."""
    async with trio.open_nursery() as nursery:
        await nursery.start(watch_signals, nursery.cancel_scope)
        server = FakeComfyUI(cfg, log)
        try:
            port = await nursery.start(server.http.serve, cfg.host, cfg.port)
        except OSError as exc:
            log(f"[Errno {exc.errno}] error while attempting to bind on address ({cfg.host!r}, {cfg.port}): "
                f"{exc.strerror}")
            nursery.cancel_scope.cancel()
            return 1
        nursery.start_soon(server.prompts.run_worker)
        log(f"Starting server\n\nTo see the GUI go to: http://{cfg.host}:{port}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_config(argv)
    log = Log()
    return run_fake(run_server, cfg, log)


__all__ = ["FakeComfyUI", "main", "origin_mismatch", "run_server"]
