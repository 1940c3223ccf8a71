"""OpenAI's image API on the OpenAI listener, served by ComfyUI.

``POST /v1/images/generations`` (the ``openai`` SDK's ``images.generate``, Open WebUI's
image generation) names a model of ``runtime: comfyui``: its workflow is filled once per
image (``n`` runs, seeds ``seed``, ``seed + 1``, ... or random ones), each checked against
ComfyUI's node catalog before anything is unloaded, then all of them run in one exclusive
image job through the same turnstile as ComfyUI's own clients (comfy/jobs.py). The images
the workflow saved come back from ``/view`` as ``b64_json``, or as a URL steward serves
(``response_format: url``, OpenAI's default): ``/v1/images/files/TOKEN``, where the token is
the capability (a link anyone holding it may open, like OpenAI's, for an hour).

A client that leaves ends its job: the prompt is taken out of ComfyUI's queue or
interrupted, and the GPU freed and released. Errors are OpenAI's error object.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import attrs
import httpx
import trio

from supervisor.backoff import Backoff, RetryEnded, retry_while_unreachable
from supervisor.gateway.http.asgi import (
    BodyLimits,
    Receive,
    RequestError,
    Scope,
    Send,
    dump_json,
    header_value,
    open_disconnect_watch,
    parse_json,
    read_body,
    send_refusal,
    send_whole,
)
from supervisor.gateway.catalog import ImageModel, ModelCatalog
from supervisor.gateway.classes import choose_class
from supervisor.gateway.comfy.api import NodeCatalog, PromptRefused, find_prompt_id, read_prompt
from supervisor.gateway.comfy.jobs import ComfyTurnstile, HeldGpu
from supervisor.gateway.comfy.workflow import ImageParams, SavedImage, failure_of, saved_images
from supervisor.gateway.door import CAPABILITY_PREFIX, Exchange, FrontDoor, exchange_of
from supervisor.gateway.errors import error_body, error_headers
from supervisor.request_class import RequestClass
from supervisor.scheduler.actor import JobFailed

GENERATIONS_PATH = "/v1/images/generations"
FILES_PREFIX = CAPABILITY_PREFIX  # + a token: open without a key (the token is the key)
MAX_IMAGES = 10  # OpenAI's bound on n
MAX_PROMPT = 32_000  # characters, OpenAI's for gpt-image-1
MAX_SEED = 2**32  # random seeds below this; a client's own may go to 2**64
FILE_TTL = 3600.0  # seconds a URL stays valid, as OpenAI's do
MAX_FILES = 4096  # URLs remembered at once; the oldest go first
RESPONSE_FORMATS = ("url", "b64_json")
OPENAI_SIZES = frozenset({"1024x1024", "1024x1536", "1536x1024"})  # the answer's `size` enum


@attrs.frozen
class ImageRequest:
    """A generations request read and checked: pure (read_image_request)."""

    model: str  # the image model's name
    klass: RequestClass
    runs: tuple[ImageParams, ...]  # one per image asked for
    response_format: str
    size: str


class ImageFailed(Exception):
    """A job that ran, or was meant to, and gave no image: the status and words for the client."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


def read_image_request(scope: Scope, payload: Any, images: Mapping[str, ImageModel], aliases: Mapping[str, str], *,
                       default_class: str, random_seed: Any) -> ImageRequest:
    """The request in *payload*, or RequestError saying which parameter is wrong (OpenAI's words
    where it has them). *images*: accepted image model names -> ImageModel; *aliases*: the chat
    models' names (asked for here, they get a clear 400). *random_seed*: () -> int."""
    if not isinstance(payload, dict):
        raise RequestError(400, "The request body must be a JSON object.")
    prompt = prompt_text(payload)
    named = "model" in payload
    choice = choose_class(scope, payload, default_class)
    model = pick_model(payload.get("model"), named, images, aliases)
    n = read_number(payload, "n", 1, 1, MAX_IMAGES)
    steps = read_number(payload, "steps", model.config.steps, 1, 10_000)
    seed = payload.get("seed")
    if seed is not None:
        seed = read_number(payload, "seed", 0, 0, 2**64 - n)
    negative = payload.get("negative_prompt", model.config.negative_prompt)
    if not isinstance(negative, str):
        raise RequestError(400, "negative_prompt must be a string.", param="negative_prompt")
    response_format = payload.get("response_format") or "url"
    if response_format not in RESPONSE_FORMATS:
        raise RequestError(400, f"Invalid response_format {response_format!r}: use 'url' or 'b64_json'.",
                           param="response_format")
    if payload.get("output_format") not in (None, "png"):
        raise RequestError(400, "Steward's images are PNG, as ComfyUI saves them: output_format must be 'png'.",
                           param="output_format")
    if payload.get("stream"):
        raise RequestError(400, "Streaming partial images is not supported: leave stream out.", param="stream")
    size = payload.get("size")
    if size is None or size == "auto":
        size = model.config.size
    width, height = _size(size)
    seeds = [seed + i for i in range(n)] if seed is not None else [random_seed() for _ in range(n)]
    runs = tuple(ImageParams(prompt, width, height, s, steps, negative) for s in seeds)
    return ImageRequest(model.name, choice.klass, runs, response_format, f"{width}x{height}")


def prompt_text(fields: Mapping[str, Any]) -> str:
    """The request's ``prompt``: text with something in it, at most MAX_PROMPT characters (OpenAI's)."""
    prompt = fields.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise RequestError(400, "You must provide a prompt.", param="prompt")
    if len(prompt) > MAX_PROMPT:
        raise RequestError(400, f"The prompt is {len(prompt)} characters long; the most is {MAX_PROMPT}.",
                           param="prompt", code="string_above_max_length")
    return prompt


def pick_model(name: Any, named: bool, models: Mapping[str, ImageModel], aliases: Mapping[str, str], *,
               route: str = GENERATIONS_PATH, kind: str = "image") -> ImageModel:
    """The ComfyUI model a request names (*models*: its accepted names), or the only one when it
    names none; RequestError otherwise (*aliases*: the chat models' names, a clear 400)."""
    if not named:
        found = {model.name: model for model in models.values()}
        if len(found) == 1:
            return next(iter(found.values()))
        raise RequestError(400, f"You must provide a model parameter: one of {', '.join(sorted(found))}."
                           if found else f"No {kind} model is configured here.", param="model")
    if not isinstance(name, str) or not name:
        raise RequestError(400, "You must provide a model parameter.", param="model")
    if name in models:
        return models[name]
    if name in aliases:
        raise RequestError(400, f"The model '{name}' does not serve {route}: it is a language model; "
                                f"{kind} models here: {', '.join(sorted({m.name for m in models.values()})) or 'none'}.",
                           param="model", code="model_not_supported")
    raise RequestError(404, f"The model '{name}' does not exist.", param="model", code="model_not_found")


def read_number(payload: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = payload.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise RequestError(400, f"{key} must be an integer from {low} to {high}, got {json.dumps(value)[:40]}.",
                           param=key)
    return value


def _size(size: Any) -> tuple[int, int]:
    width, sep, height = size.partition("x") if isinstance(size, str) else ("", "", "")
    if sep and width.isdigit() and height.isdigit() and int(width) > 0 and int(height) > 0:
        return int(width), int(height)
    raise RequestError(400, f"Invalid size {json.dumps(size)[:40]}: use WIDTHxHEIGHT like 1024x1024, or auto.",
                       param="size")


def images_answer(request: ImageRequest, data: list[dict[str, str]], prompt_ids: list[str],
                  created: int) -> dict[str, Any]:
    """OpenAI's ImagesResponse for *request*, with steward's own object beside it. Its ``size``
    is an enum there (1024x1024, 1024x1536, 1536x1024): another size is left out, where a typed
    client could not read it, and said in ``steward.size``."""
    size = {"size": request.size} if request.size in OPENAI_SIZES else {}
    return {"created": created, "data": data, "output_format": "png", **size,
            "usage": {"input_tokens": 0, "input_tokens_details": {"image_tokens": 0, "text_tokens": 0},
                      "output_tokens": 0, "total_tokens": 0},
            "steward": {"model": request.model, "size": request.size, "seeds": [run.seed for run in request.runs],
                        "prompt_ids": prompt_ids}}


def refusal_words(model: str, refused: PromptRefused) -> str:
    """ComfyUI's refusal in one line: its message, and each failing node's errors (where the
    request's own values usually are: a size past the node's maximum, say)."""
    why = [f"{entry.get('class_type', '?')} (node {node}): {error.get('message', '')}"
           + (f": {error['details']}" if error.get("details") else "")
           for node, entry in refused.node_errors.items() for error in entry.get("errors", [])]
    details = f" ({refused.details})" if refused.details and not why else ""
    return f"ComfyUI would refuse the workflow of '{model}' as asked: {refused.message}{details}" + (
        f": {'; '.join(why)}" if why else "")


@attrs.define(eq=False)
class ImageFiles:
    """The URLs handed out: token -> the image in ComfyUI's output, until it expires."""

    files: OrderedDict[str, tuple[SavedImage, float]] = attrs.Factory(OrderedDict)

    def add(self, image: SavedImage, now: float) -> str:
        token = secrets.token_urlsafe(24)
        self.files[token] = (image, now + FILE_TTL)
        while len(self.files) > MAX_FILES:
            self.files.popitem(last=False)
        return token

    def find(self, token: str, now: float) -> SavedImage | None:
        for old in [t for t, (_, expires) in self.files.items() if expires <= now]:
            del self.files[old]
        entry = self.files.get(token)
        return entry[0] if entry is not None else None


@attrs.define(eq=False)
class ImageHandler:
    turnstile: ComfyTurnstile
    nodes: NodeCatalog  # ComfyUI's node classes: what it would refuse
    catalog: ModelCatalog
    door: FrontDoor
    body_limits: BodyLimits
    shutting_down: trio.Event
    files: ImageFiles = attrs.Factory(ImageFiles)

    @property
    def http(self) -> httpx.AsyncClient:
        return self.turnstile.http

    @property
    def base_url(self) -> str:
        return self.turnstile.base_url

    async def generate(self, scope: Scope, receive: Receive, send: Send) -> None:
        exchange = exchange_of(scope)
        events = self.turnstile.events
        try:
            body = await read_body(scope, receive, self.body_limits)
            if body is None:
                return
            request = read_image_request(scope, parse_json(body), self.catalog.images, self.catalog.aliases,
                                         default_class=self.door.default_class(exchange,
                                                                               self.turnstile.config.job_class),
                                         random_seed=lambda: secrets.randbelow(MAX_SEED))
            exchange.model, exchange.klass = request.model, request.klass
            graphs = [self.catalog.images[request.model].workflow.filled(run) for run in request.runs]
            with self.door.admit(exchange, model=request.model, klass=request.klass):
                failure: Exception | None = None
                async with open_disconnect_watch(receive) as disconnect:
                    try:
                        await self.check(request.model, graphs)
                        answer = await self._generate(request, graphs, exchange, base_url_of(scope))
                    except (JobFailed, ImageFailed, RequestError) as exc:
                        failure = exc  # raised out here: inside the watch's nursery it would come grouped
                if disconnect.happened:
                    return
                if failure is not None:
                    raise failure
            events.emit("images_generated", "info", model=request.model, images=len(answer["data"]),
                        size=request.size, seeds=[run.seed for run in request.runs])
            content = dump_json(answer)
            await send_whole(send, 200, [(b"content-type", b"application/json"),
                                         (b"content-length", str(len(content)).encode())], content)
        except JobFailed as exc:
            failure = exc.failure
            exchange.error = failure.code
            content = error_body(failure.status, failure.message, code=failure.code)
            await send_whole(send, failure.status, error_headers(content, failure.retry_after), content)
        except ImageFailed as exc:
            exchange.error = exc.code
            events.emit("images_failed", "warning", model=exchange.model, status=exc.status, code=exc.code,
                        detail=exc.message)
            await send_refusal(send, RequestError(exc.status, exc.message, code=exc.code), error_body)
        except RequestError as exc:
            exchange.error = exchange.error or exc.code
            await send_refusal(send, exc, error_body)

    async def check(self, model: str, graphs: list[dict[str, Any]]) -> None:
        """ComfyUI's refusal, before the GPU is taken: nothing is unloaded for a workflow it would refuse."""
        for graph in graphs:
            request = read_prompt(dump_json({"prompt": graph}))
            refused = request if isinstance(request, PromptRefused) else await self.nodes.refusal(request)
            if refused is not None:
                self.turnstile.events.emit("image_refused", "info", type=refused.type, detail=refused.message,
                                           model=model)
                raise RequestError(400, refusal_words(model, refused), code=refused.type)

    async def _generate(self, request: ImageRequest, graphs: list[dict[str, Any]], exchange: Exchange,
                        base_url: str) -> dict[str, Any]:
        saved: list[SavedImage] = []
        async with self.turnstile.open_gpu(request.klass, exchange) as held:
            try:
                for graph in graphs:
                    saved += await self.run(held, graph)
                held.lease.status = 200
            finally:
                with trio.CancelScope(shield=True):
                    await self.clean_up(held)
        if held.force_released:
            raise ImageFailed(503, "An operator released the GPU while the images were being made; try again.",
                              "force_released")
        data = [await self._item(image, request.response_format, base_url) for image in saved]
        return images_answer(request, data, list(held.prompt_ids), int(time.time()))

    async def run(self, held: HeldGpu, graph: dict[str, Any], client_id: str | None = None) -> list[SavedImage]:
        """Run one filled workflow on the held GPU: what it saved, or ImageFailed."""
        prompt_id = await self.queue(graph, client_id)
        outcome = await self.turnstile.follow(held, prompt_id)
        entry = await self.history(prompt_id)
        if outcome == "timeout":
            raise ImageFailed(504, f"The image took longer than comfyui.job_timeout "
                                   f"({self.turnstile.config.job_timeout:g} s).", "timeout")
        if outcome == "vanished" or entry is None:
            raise ImageFailed(502, "The prompt vanished from ComfyUI's queue (was ComfyUI restarted?).",
                              "engine_error")
        if outcome == "error":
            raise ImageFailed(502, f"ComfyUI failed to run the workflow: {failure_of(entry)}", "engine_error")
        images = saved_images(entry)
        if not images:
            raise ImageFailed(502, "The workflow saved no image: does it end in a SaveImage node?", "engine_error")
        return images

    async def queue(self, graph: dict[str, Any], client_id: str | None = None) -> str:
        """POST the prompt, retrying while ComfyUI cannot be reached (nothing was sent then).
        *client_id*: the websocket client ComfyUI sends the prompt's progress to."""
        config = self.turnstile.config
        body = {"prompt": graph, **({"client_id": client_id} if client_id is not None else {})}

        async def attempt() -> httpx.Response:
            return await self.http.post(f"{self.base_url}/prompt", json=body, timeout=httpx.Timeout(30.0, connect=5.0))

        async def on_retry(exc: Exception, delay: float) -> None:
            self.turnstile.events.emit("upstream_retry", "warning", service="comfyui", detail=str(exc),
                                       retry_in_s=delay)

        try:
            answer = await retry_while_unreachable(Backoff(config.retry_initial, config.retry_max, self.shutting_down),
                                                   attempt, httpx.ConnectError, on_retry)
        except RetryEnded:
            raise ImageFailed(503, "Steward is shutting down and ComfyUI cannot be reached.", "shutting_down") from None
        except httpx.HTTPError as exc:
            raise ImageFailed(502, f"ComfyUI failed during the request: {exc}", "engine_error") from None
        prompt_id = find_prompt_id(answer.content[: config.prompt_capture_limit]) if answer.status_code == 200 \
            else None
        self.turnstile.events.emit("image_forwarded", "info", prompt_id=prompt_id, status=answer.status_code)
        if prompt_id is None:
            raise ImageFailed(400 if answer.status_code == 400 else 502, _comfy_refusal(answer), "engine_error"
                              if answer.status_code != 400 else "prompt_refused")
        return prompt_id

    async def history(self, prompt_id: str) -> dict[str, Any] | None:
        try:
            entry = (await self.http.get(f"{self.base_url}/history/{prompt_id}")).json().get(prompt_id)
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        return entry if isinstance(entry, dict) else None

    async def clean_up(self, held: HeldGpu) -> None:
        """After the last prompt, or when the client left or an operator released the GPU: nothing
        of this job stays queued or running in ComfyUI, and its memory is freed."""
        if not held.prompt_ids:
            return
        if held.lease.status != 200:
            prompt_id = held.prompt_ids[-1]
            with trio.move_on_after(10):
                try:
                    await self.http.post(f"{self.base_url}/queue", json={"delete": [prompt_id]})
                    await self.http.post(f"{self.base_url}/interrupt", json={"prompt_id": prompt_id})
                except httpx.HTTPError:
                    pass  # the free below, or ComfyUI's own end of the prompt, still comes
                self.turnstile.events.emit("image_abandoned", "info", prompt_id=prompt_id,
                                           detail="the images were not wanted any more; the prompt was stopped")
        with trio.move_on_after(self.turnstile.config.free_timeout + 10):
            await self.turnstile.free(held)

    async def _item(self, image: SavedImage, response_format: str, base_url: str) -> dict[str, str]:
        if response_format == "url":
            token = self.files.add(image, trio.current_time())
            return {"url": f"{base_url}{FILES_PREFIX}{token}"}
        content, _ = await self.view(image)
        return {"b64_json": base64.b64encode(content).decode()}

    async def view(self, image: SavedImage) -> tuple[bytes, bytes]:
        try:
            answer = await self.http.get(f"{self.base_url}/view", params=image.query(), timeout=60.0)
        except httpx.HTTPError as exc:
            raise ImageFailed(502, f"ComfyUI failed to hand over the image {image.filename}: {exc}",
                              "engine_error") from None
        if answer.status_code != 200:
            raise ImageFailed(502, f"ComfyUI answered {answer.status_code} for the image {image.filename}.",
                              "engine_error")
        return answer.content, answer.headers.get("content-type", "image/png").encode()

    async def serve_file(self, scope: Scope, send: Send) -> None:
        """GET /v1/images/files/TOKEN: an image handed out as a URL."""
        image = self.files.find(scope["path"].removeprefix(FILES_PREFIX), trio.current_time())
        try:
            if image is None:
                raise RequestError(404, "No such image here (the link may have expired: they last an hour).",
                                   code="not_found")
            content, content_type = await self.view(image)
        except ImageFailed as exc:
            await send_refusal(send, RequestError(exc.status, exc.message, code=exc.code), error_body)
            return
        except RequestError as exc:
            await send_refusal(send, exc, error_body)
            return
        await send_whole(send, 200, [(b"content-type", content_type), (b"content-length", str(len(content)).encode()),
                                     (b"cache-control", b"private, max-age=3600")], content)


def _comfy_refusal(answer: httpx.Response) -> str:
    try:
        error = answer.json()["error"]
        return f"ComfyUI refused the workflow: {error['message']}" + (
            f" ({error['details']})" if error.get("details") else "")
    except (ValueError, KeyError, TypeError):
        return f"ComfyUI answered {answer.status_code} to the prompt."


def base_url_of(scope: Scope) -> str:
    """How the client reached steward, for the URLs it is handed."""
    host = header_value(scope, b"host")
    if not host:
        server = scope.get("server") or ("127.0.0.1", 80)
        host = f"[{server[0]}]:{server[1]}" if ":" in server[0] else f"{server[0]}:{server[1]}"
    return f"{scope.get('scheme', 'http')}://{host}"
