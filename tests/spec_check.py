"""Answers checked against OpenAI's OpenAPI spec: what the spec requires of them, strictly.

The spec is OpenAI's own (openai/openai-openapi's ``openapi.yaml``), read from beside the project
(``../shared/vendor/openai-openapi/``); a test that needs it skips, saying so, where it is absent.
``check(value, "CreateChatCompletionResponse")`` validates a JSON value against one of the
spec's component schemas, ``$ref`` resolved, with ``jsonschema``'s draft 2020-12 validator (the
file is OpenAPI 3.1, whose schemas are JSON Schema 2020-12), and raises ``SpecViolation`` naming
every place the value breaks it. ``check_event`` takes a Responses stream event by its ``type``
(the spec's ``ResponseStreamEvent`` is a union of ~60 event schemas: the one its type names
gives a readable error, where the union would give sixty).

What it checks: every required key, every type (``integer`` is not ``number``; null only where
the spec allows it), every ``enum`` and ``const``, ``oneOf``/``anyOf`` unions, array items,
nested objects, ``minimum``/``maximum``. That is what the SDKs' parsers and clients' code read:
a missing required key or a null where a list is due is what makes a client raise.

What it does not check, and why:

* ``format`` (``unixtime``, ``uri``, ``float``): an annotation in draft 2020-12, and the SDKs do
  not check it either.
* Keys the spec does not name: its objects seldom say ``additionalProperties: false``, and the
  engines' extra keys (llama-server's ``timings``) are allowed by it and harmless to clients.
* ``discriminator``: an OpenAPI annotation; the ``oneOf`` it sits on is checked in full.
* The spec's own 3.0 leftovers are read as 3.0 meant them: ``nullable: true`` (111 schemas still
  use it) admits null beside the schema's type, or every streamed chat chunk would fail on
  ``finish_reason: null``.
* A streamed ``/v1/completions`` has no chunk schema in the spec: ``COMPLETION_CHUNK`` is the
  whole answer's (``CreateCompletionResponse``, as the openai SDK reads each chunk) with a
  choice's ``finish_reason`` null until its last chunk, as OpenAI's own stream sends it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

SPEC_PATH = Path(__file__).resolve().parents[2] / "shared" / "vendor" / "openai-openapi" / "openapi.yaml"
COMPLETION_CHUNK = "steward:CompletionChunk"  # see the module docstring
_ROOT = "#/components/schemas/"


class SpecViolation(AssertionError):
    """A value that breaks the spec's schema: every place it does, one line each."""


def need_spec() -> None:
    """Skip the calling test where the spec is not there (it is not part of the project)."""
    if not SPEC_PATH.is_file():
        pytest.skip(f"OpenAI's OpenAPI spec is not at {SPEC_PATH} (openai/openai-openapi's openapi.yaml): "
                    "the answers' conformance cannot be checked")


def check(value: Any, schema: str) -> None:
    """*value* as the spec's component *schema* requires it; SpecViolation where it is not."""
    errors = sorted(_validator(schema).iter_errors(value), key=lambda error: list(error.absolute_path))
    if errors:
        lines = [f"  at {_path(error)}: {_message(error)}" for error in errors[:12]]
        raise SpecViolation(f"{schema} violated:\n" + "\n".join(lines) + f"\nin {_short(value)}")


def check_event(event: Any) -> None:
    """One Responses stream event, by the schema its ``type`` names (within ``ResponseStreamEvent``)."""
    kind = event.get("type") if isinstance(event, dict) else None
    schema = _stream_event_schemas().get(kind)  # type: ignore[arg-type]
    if schema is None:
        raise SpecViolation(f"no ResponseStreamEvent has the type {kind!r}: {_short(event)}")
    check(event, schema)


def schema_names() -> frozenset[str]:
    return frozenset(_components())


@functools.cache
def _components() -> dict[str, Any]:
    need_spec()
    with SPEC_PATH.open("rb") as spec:
        document = yaml.load(spec, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    schemas = {name: _as_2020_12(schema) for name, schema in document["components"]["schemas"].items()}
    schemas[COMPLETION_CHUNK] = _completion_chunk(schemas["CreateCompletionResponse"])
    return schemas


@functools.cache
def _validator(name: str) -> jsonschema.Draft202012Validator:
    components = _components()
    if name not in components:
        raise KeyError(f"the spec has no schema {name!r}")
    # One resource holds every schema: "#/components/schemas/X" resolves within it.
    return jsonschema.Draft202012Validator({"$ref": _ROOT + name, "components": {"schemas": components}})


@functools.cache
def _stream_event_schemas() -> dict[str, str]:
    """Each Responses stream event's type -> the name of its schema."""
    union = _components()["ResponseStreamEvent"]["anyOf"]
    by_type = {}
    for member in union:
        name = member["$ref"].removeprefix(_ROOT)
        kinds = _components()[name].get("properties", {}).get("type", {}).get("enum", [])
        for kind in kinds:
            by_type[kind] = name
    return by_type


def _as_2020_12(schema: Any) -> Any:
    """*schema* with OpenAPI 3.0's ``nullable: true`` as JSON Schema says it (null admitted beside it)."""
    if isinstance(schema, list):
        return [_as_2020_12(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    converted = {key: _as_2020_12(value) for key, value in schema.items() if key != "nullable"}
    if schema.get("nullable") is True:
        return {"anyOf": [converted, {"type": "null"}]}
    return converted


def _completion_chunk(whole: dict[str, Any]) -> dict[str, Any]:
    choice = whole["properties"]["choices"]["items"]
    reason = choice["properties"]["finish_reason"]
    chunk_choice = {**choice, "properties": {**choice["properties"],
                                             "finish_reason": {"anyOf": [reason, {"type": "null"}]}}}
    return {**whole, "properties": {**whole["properties"], "choices": {"type": "array", "items": chunk_choice}}}


def _path(error: jsonschema.ValidationError) -> str:
    return "$" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path)


def _message(error: jsonschema.ValidationError) -> str:
    """The error, or for a union none of whose members fit, why the member that came closest did not."""
    if error.context:
        best = jsonschema.exceptions.best_match(error.context)
        return f"{best.message} (in {_path(best)}; the closest of a union)"
    return error.message


def _short(value: Any, limit: int = 600) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def stream_events(body: bytes) -> Iterator[tuple[str | None, bytes]]:
    """The (name, data) of each server-sent event with data in *body*: the test's own reading of a
    stream, apart from steward's (``supervisor.gateway.relay.sse``), as a client reads it."""
    for block in body.replace(b"\r\n", b"\n").split(b"\n\n"):
        name, data = None, []
        for line in block.split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].strip().decode()
            elif line.startswith(b"data:"):
                data.append(line[5:].removeprefix(b" "))
        if data:
            yield name, b"\n".join(data)
