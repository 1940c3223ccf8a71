"""OpenAI's Responses API as its spec requires it, whatever the engine left out.

What the engines send (llama-server b1-0c1e570, as llama-cpp-python 0.3.36 builds it; Ollama):

* a stream's events without ``sequence_number`` (llama-server), nor ``output_index`` and
  ``content_index`` (llama-server): the openai SDK's ``responses.stream()`` reads the output
  item an event belongs to by them, and fails without ("list indices must be integers or
  slices, not NoneType");
* with a first token that is half a character, ``response.created`` and ``response.in_progress``
  again before almost every delta (llama-server notes the response as created only with token
  1's event, which it never sent);
* the response object in ``response.created`` and ``response.in_progress`` with only ``id``,
  ``object`` and ``status`` (llama-server); in ``response.completed`` and a whole answer, none
  of ``error``, ``incomplete_details``, ``instructions``, ``tools``, ``parallel_tool_calls``,
  ``metadata``, ``tool_choice``, ``temperature``, ``top_p`` (llama-server); usage without
  ``output_tokens_details`` nor ``cache_write_tokens`` (llama-server, Ollama), or null until
  the response completed (Ollama);
* deltas and text parts without ``logprobs``, and a text part announced without
  ``annotations`` (llama-server).

Steward puts these right on the way through, never holding more than the one event whose end
is still to come: it numbers every event it sends from 0 (the events it writes itself too:
an opening event where the engine sent none, stream_start.py; an error event and
``response.failed``, reshaped.py), so it is the last reader before the client; it drops a
repeated opening event; it derives an event's ``output_index`` from the output item it names
(the items in the order they were added) and ``content_index`` from the content parts added
to that item; it gives the response object its required keys with their null or empty
defaults, or the request's own values for the settings a response repeats (``instructions``,
``tools``, ``tool_choice``, ``temperature``, ``top_p``, ``parallel_tool_calls``, ``metadata``,
``max_output_tokens``: ``request_echo``), and keeps its ``id`` the one its first event named
(the SDK checks that it stays). What an engine did send is kept, but for a null where the
request gave a value.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from typing import Any

import attrs

from supervisor.gateway.relay.sse import EventsRewritten, event_data, json_bytes, json_object, with_data

# The events that open a stream: each is sent once.
OPENING = frozenset({"response.created", "response.in_progress", "response.queued"})
# The events whose item's content part is named by a content_index (the spec requires one there).
_IN_A_PART = frozenset({"response.content_part.done", "response.output_text.delta", "response.output_text.done",
                        "response.output_text.annotation.added", "response.refusal.delta", "response.refusal.done",
                        "response.reasoning_text.delta", "response.reasoning_text.done"})
_WITH_LOGPROBS = frozenset({"response.output_text.delta", "response.output_text.done"})


# The settings a response object repeats of its request (OpenAI's own answers do).
_ECHOED = ("instructions", "tools", "tool_choice", "temperature", "top_p", "parallel_tool_calls", "metadata",
           "max_output_tokens")
NO_ECHO: Mapping[str, Any] = {}


def request_echo(request: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """What a response to *request* (a Responses request's JSON object) repeats of it."""
    if not request:
        return NO_ECHO
    echo = {key: request[key] for key in _ECHOED if request.get(key) is not None}
    if isinstance(tools := echo.get("tools"), list):
        echo["tools"] = [_as_answered(tool) for tool in tools]
    return echo


def _as_answered(tool: object) -> object:
    """A request's tool as a response names it: a function tool's ``strict`` and ``parameters``,
    which a request may leave out, are required there (null: not said)."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        return tool
    return {"strict": None, "parameters": None, **tool}


def conformed_response(response: dict[str, Any], *, model: str, created_at: float,
                       echo: Mapping[str, Any] = NO_ECHO) -> bool:
    """A response object (``Response``) put right in place: its required keys (*echo*'s values, the
    request's, before the defaults), its usage and its output's parts as the spec requires them;
    True if anything changed."""
    missing = {key: value for key, value in echo.items() if response.get(key) is None}
    missing.update({key: value() for key, value in _RESPONSE_DEFAULTS.items()
                    if key not in response and key not in missing})
    missing.update({key: value for key, value in (("model", model), ("created_at", created_at))
                    if key not in response})
    if response.get("output", missing.get("output")) is None:
        missing["output"] = []  # Ollama's, for a response with no text: typed an array
    response.update(missing)
    changed = bool(missing)
    for item in response["output"] if isinstance(response["output"], list) else []:
        changed |= conformed_item(item)
    if "usage" in response and response["usage"] is None:
        del response["usage"]  # Ollama's, before the response completed: not typed null
        changed = True
    elif isinstance(response.get("usage"), dict):
        changed |= _conformed_usage(response["usage"])
    if missing and "usage" in response:
        response["usage"] = response.pop("usage")  # last still: the usage log reads it off a stream's tail
    return changed


_RESPONSE_DEFAULTS = {"object": lambda: "response", "output": list, "error": lambda: None,
                      "incomplete_details": lambda: None, "instructions": lambda: None, "tools": list,
                      "parallel_tool_calls": lambda: True, "metadata": dict, "tool_choice": lambda: "auto",
                      "temperature": lambda: None, "top_p": lambda: None}


def conformed_item(item: object) -> bool:
    """An output item put right in place: a message's text parts, a reasoning item's summary."""
    if not isinstance(item, dict):
        return False
    if item.get("type") == "reasoning":
        return _put(item, "summary", [])
    content = item.get("content") if item.get("type") == "message" else None
    return any([conformed_part(part) for part in content]) if isinstance(content, list) else False


def conformed_part(part: object) -> bool:
    if not isinstance(part, dict) or part.get("type") != "output_text":
        return False
    return _put(part, "annotations", []) | _put(part, "logprobs", [])


def _conformed_usage(usage: dict[str, Any]) -> bool:
    changed = False
    for key, counts in (("input_tokens_details", ("cached_tokens", "cache_write_tokens")),
                        ("output_tokens_details", ("reasoning_tokens",))):
        if not isinstance(usage.get(key), dict):
            usage[key] = {}
            changed = True
        for count in counts:
            changed |= _put(usage[key], count, 0)
    return changed


def _put(value: dict[str, Any], key: str, default: Any) -> bool:
    if key in value:
        return False
    value[key] = default
    return True


def response_events_conformed(model: str, echo: Mapping[str, Any] = NO_ECHO) -> EventsRewritten:
    """A reader (answer.py): a Responses stream's events as the spec requires them (see the module
    docstring); *model* is what a response object that names none is given, *echo* what it repeats
    of its request (``request_echo``)."""
    return EventsRewritten(ResponseEvents(model, echo).rewrite)


@attrs.define(eq=False)
class ResponseEvents:
    """One Responses stream's events, each put right as it comes (``rewrite``), and what that
    takes knowing of the events before it."""

    model: str
    echo: Mapping[str, Any] = NO_ECHO
    _next: int = 0  # the sequence_number of the next event sent
    _opened: set[str] = attrs.Factory(set)  # the opening events sent
    _id: str | None = None  # the response's id, as its first event named it
    _created_at: float | None = None
    _items: dict[str, int] = attrs.Factory(dict)  # an output item's id (or call_id) -> its output_index
    _last_item: int = -1  # the output_index of the last item added
    _parts: dict[str, int] = attrs.Factory(dict)  # an output item's id -> the content parts added to it

    def rewrite(self, event: bytes) -> bytes | None:
        """*event* (without its blank line) put right and numbered; None: as it came; empty: dropped."""
        data = event_data(event)
        value = json_object(data) if data is not None else None
        if value is None or not isinstance(kind := value.get("type"), str):
            return None  # a ping, a comment, or no event of the API: as it came
        if kind in OPENING:
            if kind in self._opened:
                return b""  # llama-server's again, before a delta
            self._opened.add(kind)
        if isinstance(value.get("response"), dict):
            self._conform_response(value["response"])
        self._place(kind, value)
        value["sequence_number"] = self._next
        self._next += 1
        written = json_bytes(value)
        return None if written is None else with_data(event, written)

    def _conform_response(self, response: dict[str, Any]) -> None:
        if self._id is None:
            self._id = response["id"] if isinstance(response.get("id"), str) else "resp_" + secrets.token_hex(16)
        response["id"] = self._id  # one stream, one response (steward's own opening event may have named another)
        if self._created_at is None:
            created_at = response.get("created_at")
            self._created_at = created_at if isinstance(created_at, int | float) else int(time.time())
        conformed_response(response, model=self.model, created_at=self._created_at, echo=self.echo)

    def _place(self, kind: str, value: dict[str, Any]) -> None:
        """The event's output_index and content_index where it has none, from the item it names."""
        item = value.get("item")
        if kind.startswith("response.output_item."):
            conformed_item(item)
            key = item.get("id") or item.get("call_id") if isinstance(item, dict) else None
            if "output_index" not in value:
                value["output_index"] = self._index(key, added=kind.endswith(".added"))
            elif isinstance(index := value["output_index"], int):  # the engine's own: later events follow it
                self._last_item = max(self._last_item, index)
                if isinstance(key, str):
                    self._items.setdefault(key, index)
            return
        item_id = value.get("item_id")
        if not isinstance(item_id, str):
            return
        value.setdefault("output_index", self._index(item_id, added=False))
        if isinstance(value.get("part"), dict):
            conformed_part(value["part"])
        if kind == "response.content_part.added":
            value.setdefault("content_index", self._parts.get(item_id, 0))
            if isinstance(value["content_index"], int):
                self._parts[item_id] = max(self._parts.get(item_id, 0), value["content_index"] + 1)
        elif kind in _IN_A_PART:
            value.setdefault("content_index", max(self._parts.get(item_id, 1) - 1, 0))
        if kind in _WITH_LOGPROBS:
            value.setdefault("logprobs", [])

    def _index(self, key: object, *, added: bool) -> int:
        """The output_index of the item *key* names: a new one's is the next."""
        if isinstance(key, str) and key in self._items:
            return self._items[key]
        if added or self._last_item < 0:
            self._last_item += 1
            if isinstance(key, str):
                self._items[key] = self._last_item
        return self._last_item
