"""A ``POST /v1/videos`` request read and checked: pure.

The ``openai`` SDK sends ``videos.create`` as multipart/form-data (its ``input_reference`` may
be a file); OpenAI also takes JSON, where a reference is ``{"image_url": "data:..."}``. Either
way the fields are ``model``, ``prompt``, ``seconds`` (a string: "4"), ``size``
("720x1280") and ``input_reference``; ``seconds`` and ``size`` must be among the model's
(``models.NAME.video``), else a 400 naming the parameter, as OpenAI's.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from supervisor.gateway.catalog import ImageModel
from supervisor.gateway.classes import choose_class
from supervisor.gateway.comfy.workflow import ImageParams
from supervisor.gateway.http.asgi import RequestError, Scope, header_value
from supervisor.gateway.openai.forms import parse_form
from supervisor.gateway.openai.images import pick_model, prompt_text, read_number
from supervisor.request_class import RequestClass

VIDEOS_PATH = "/v1/videos"
MAX_REFERENCE = 20 * 2**20  # bytes of a reference image (OpenAI's image_url maxLength is 20 MiB of text)


@attrs.frozen
class Reference:
    """The request's reference image, to upload into ComfyUI's input folder."""

    data: bytes
    filename: str
    content_type: str


@attrs.frozen
class VideoRequest:
    model: str
    klass: RequestClass
    params: ImageParams
    seconds: str
    size: str
    reference: Reference | None = None


def read_video_request(scope: Scope, body: bytes, videos: Mapping[str, ImageModel], aliases: Mapping[str, str], *,
                       default_class: RequestClass, random_seed: Callable[[], int]) -> VideoRequest:
    """The request in *body*, or RequestError naming the parameter that is wrong."""
    fields, reference = _fields(scope, body)
    prompt = prompt_text(fields)
    named = "model" in fields
    choice = choose_class(scope, fields, default_class)
    model = pick_model(fields.get("model"), named, videos, aliases, route=VIDEOS_PATH, kind="video")
    spec = model.config.video
    assert spec is not None  # the catalog's videos all have one
    allowed = [str(s) for s in spec.seconds]
    seconds = fields.get("seconds", allowed[0])
    if isinstance(seconds, int) and not isinstance(seconds, bool):
        seconds = str(seconds)
    if seconds not in allowed:
        raise RequestError(400, f"Invalid seconds {json.dumps(seconds)[:40]}: '{model.name}' makes clips of "
                                f"{', '.join(repr(s) for s in allowed)} seconds.", param="seconds",
                           code="invalid_value")
    size = fields.get("size", spec.sizes[0])
    if size not in spec.sizes:
        raise RequestError(400, f"Invalid size {json.dumps(size)[:40]}: '{model.name}' makes "
                                f"{', '.join(spec.sizes)}.", param="size", code="invalid_value")
    seed = fields.get("seed")
    seed = read_number(fields, "seed", 0, 0, 2**64 - 1) if seed is not None else random_seed()
    if reference is not None and "input_reference" not in model.workflow.placeholders:
        raise RequestError(400, f"'{model.name}' takes no input_reference (its workflow has no "
                                "{{input_reference}}).", param="input_reference")
    width, height = (int(side) for side in size.split("x"))
    params = ImageParams(prompt, width, height, seed, model.config.steps, model.config.negative_prompt,
                         frames=int(seconds) * spec.fps, seconds=int(seconds), fps=spec.fps,
                         input_reference=reference.filename if reference is not None else "")
    return VideoRequest(model.name, choice.klass, params, seconds, size, reference)


def _fields(scope: Scope, body: bytes) -> tuple[dict[str, Any], Reference | None]:
    """The request's fields as a JSON object would hold them, and its reference image."""
    content_type = (header_value(scope, b"content-type") or "").lower()
    if content_type.startswith("multipart/form-data"):
        form = parse_form(content_type, body)
        fields: dict[str, Any] = {}
        reference = None
        for part in form.parts:
            if part.name == "input_reference" and part.filename is not None:
                reference = _reference(part.data, part.filename, part.headers.get("content-type") or "image/png")
            elif part.filename is None and part.name not in fields:
                fields[part.name] = part.data.decode("utf-8", errors="replace")
        return fields, reference
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise RequestError(400, "The body must be JSON, or multipart/form-data as the openai SDK sends.") from None
    if not isinstance(payload, dict):
        raise RequestError(400, "The request body must be a JSON object.")
    given = payload.pop("input_reference", None)
    if given is None:
        return payload, None
    url = given.get("image_url") if isinstance(given, dict) else None
    if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url:
        raise RequestError(400, "input_reference must be a file, or {\"image_url\": \"data:image/png;base64,...\"}: "
                                "steward fetches no URLs and keeps no files by id.", param="input_reference")
    header, _, encoded = url.partition(";base64,")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(400, "input_reference's image_url is not valid base64.", param="input_reference") from None
    kind = header.removeprefix("data:") or "image/png"
    return payload, _reference(data, "reference." + kind.rpartition("/")[2][:8], kind)


def _reference(data: bytes, filename: str, content_type: str) -> Reference:
    if not data or len(data) > MAX_REFERENCE:
        raise RequestError(400, f"input_reference must be an image of 1 byte to {MAX_REFERENCE // 2**20} MiB.",
                           param="input_reference")
    suffix = "".join(c for c in filename.rpartition(".")[2].lower() if c.isalnum())[:8] or "png"
    return Reference(data, f"steward_reference.{suffix}", content_type)

