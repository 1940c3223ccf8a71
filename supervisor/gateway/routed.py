"""An inference request read and routed: its model, its class, and the body its engine gets.

Pure: from the route (``supervisor.gateway.openai.api_routes``), the scope's headers and the body.
A JSON body must be an object with a ``model``; a form (transcriptions) must have a
``model`` field. Steward's own class field and ``@class`` suffix are removed, the model is
named as its engine knows it where the engine checks, and a stream that would not carry
its usage is asked for it. A body steward did not change goes on byte for byte.

A well-formed request naming no model here is not an error yet: ``route_request`` returns it
as ``NotHere``, which a front door may send to a node that serves it, else refuses (404).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

from supervisor.gateway.openai.api_routes import ApiRoute, BodyKind, api_route
from supervisor.gateway.http.asgi import RequestError, Scope, dump_json, header_value, parse_json
from supervisor.gateway.classes import choose_class
from supervisor.gateway.openai.forms import Form, parse_form
from supervisor.gateway.relay.stream_usage import ask_for_usage
from supervisor.request_class import RequestClass


@attrs.frozen
class RoutedRequest:
    route: ApiRoute
    name: str  # as the client named it (an alias, a capability), steward's suffix removed
    model: str  # the model here (in a NotHere: the name as asked, there being none)
    klass: RequestClass
    stream: bool
    body: bytes
    content_type: bytes
    payload: dict[str, Any] | None = None  # a JSON body's object
    form: Form | None = None  # a multipart body's parts
    # Steward asked the engine for the stream's usage chunk, which the client did not ask for.
    keep_usage_chunk: bool = False

    def body_naming(self, name: str) -> bytes:
        """The body with *name* as its model (a node's name for it)."""
        if self.form is not None:
            return self.form.changed({"model": name}).encode()
        return dump_json({**(self.payload or {}), "model": name})


@attrs.frozen
class NotHere:
    """A well-formed request naming no model here: a front door may have a node that serves it."""

    request: RoutedRequest

    @property
    def name(self) -> str:
        return self.request.name

    def refusal(self) -> RequestError:
        """What the client is told when no node serves it either."""
        return RequestError(404, f"The model '{self.name}' does not exist.", param="model", code="model_not_found")


def route_request(scope: Scope, body: bytes, aliases: Mapping[str, str],
                  served_names: Mapping[str, str] | None = None, *,
                  default_class: RequestClass = RequestClass.INTERACTIVE,
                  route: ApiRoute | None = None) -> RoutedRequest | NotHere:
    """Parse and validate *body* for *route* (the scope path's by default).

    Raises:
        RequestError: the body is not a request of the route (400).
    """
    route = route or api_route(scope)
    if route.body is BodyKind.MULTIPART:
        return _route_form(scope, body, aliases, served_names or {}, default_class, route)
    payload = parse_json(body)
    if not isinstance(payload, dict):
        raise RequestError(400, "The request body must be a JSON object.")
    name = payload.get("model")
    if not isinstance(name, str) or not name:
        raise RequestError(400, "You must provide a model parameter.", param="model")
    choice = choose_class(scope, payload, default_class)
    model = aliases.get(payload["model"])
    changed = choice.changed
    served = (served_names or {}).get(model) if model is not None else None
    requested = payload["model"]
    if served is not None and payload["model"] != served:
        payload["model"] = served  # vLLM refuses a name it does not serve, an alias included
        changed = True
    keep_usage_chunk = route.asks_usage and ask_for_usage(payload)
    routed = RoutedRequest(route=route, name=requested, model=model or requested, klass=choice.klass,
                           stream=payload.get("stream") is True,
                           body=dump_json(payload) if changed or keep_usage_chunk else body,
                           content_type=b"application/json", payload=payload, keep_usage_chunk=keep_usage_chunk)
    return routed if model is not None else NotHere(routed)


def _route_form(scope: Scope, body: bytes, aliases: Mapping[str, str], served_names: Mapping[str, str],
                default_class: RequestClass, route: ApiRoute) -> RoutedRequest | NotHere:
    content_type = header_value(scope, b"content-type")
    form = parse_form(content_type, body)
    name = form.value("model")
    if not name:
        raise RequestError(400, "You must provide a model field in the form.", param="model")
    fields: dict[str, Any] = {"model": name}
    if (extra := form.value("steward")) is not None:
        try:
            fields["steward"] = json.loads(extra)  # the JSON field's object, as a form field's text
        except (ValueError, RecursionError):
            fields["steward"] = extra  # not an object: choose_class says so
    choice = choose_class(scope, fields, default_class)
    requested = fields["model"]
    model = aliases.get(requested)
    served = served_names.get(model) if model is not None else None
    values: dict[str, str | None] = {}
    if choice.changed:
        values |= {"model": requested, "steward": None}
    if served is not None and requested != served:
        values["model"] = served
    if values:
        form = form.changed(values)
    stream = (form.value("stream") or "").strip().lower() == "true"
    routed = RoutedRequest(route=route, name=requested, model=model or requested, klass=choice.klass, stream=stream,
                           body=form.encode() if values else body,
                           content_type=(content_type or "").encode("latin-1"), form=form)
    return routed if model is not None else NotHere(routed)
