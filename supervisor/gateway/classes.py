"""Which class a request asks for, the same way on every listener.

A header ``X-Steward-Class``, a body field ``"steward": {"class": ...}`` or a model suffix
``name@class``; the most specific wins (suffix, then body field, then header), and steward
removes its own field and suffix before forwarding. An empty header counts as no header.
"""

from __future__ import annotations

from typing import Any

import attrs

from supervisor.gateway.http.asgi import RequestError, Scope, header_value
from supervisor.request_class import RequestClass

CLASS_HEADER = b"x-steward-class"
_PARAMS = {"header": "X-Steward-Class", "steward.class": "steward.class", "model": "model"}


@attrs.frozen
class ClassChoice:
    klass: RequestClass
    changed: bool  # steward's own field or suffix was removed from the payload


def choose_class(scope: Scope, payload: dict[str, Any], default: RequestClass) -> ClassChoice:
    """The requested class; removes steward's field and model suffix from *payload* (in place)."""
    klass = (header_value(scope, CLASS_HEADER) or "").strip() or None
    source = "header"
    changed = False
    if "steward" in payload:
        extra = payload.pop("steward")
        changed = True
        if not isinstance(extra, dict):
            raise RequestError(400, "'steward' must be an object like {\"class\": \"background\"}.", param="steward")
        if "class" in extra:
            klass, source = extra["class"], "steward.class"
    model = payload.get("model")
    if isinstance(model, str) and "@" in model:
        payload["model"], _, klass = model.rpartition("@")
        source = "model"
        changed = True
    if klass is None:
        return ClassChoice(default, changed)
    chosen = RequestClass.named(klass) if isinstance(klass, str) else None
    if chosen is None:
        raise RequestError(400, f"Unknown class {klass!r}: use one of {', '.join(RequestClass)}.",
                           param=_PARAMS[source], code="invalid_class")
    return ClassChoice(chosen, changed)
