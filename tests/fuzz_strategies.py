"""Hypothesis strategies for raw HTTP/1.1 requests to steward's listeners.

A request is one of the listener's real routes (:class:`Route`) called properly, with one
thing about it changed (the body most often; or the method, the path, the headers) or
all of them at once. Every body carries ``how``, a short text saying how it was built (in
Python where the body is large), so that a failure can be sent again by hand, and every
request says how its path and body were made, so that failures can be grouped.

What is generated, and why:

* methods: the route's own most of the time, else the usual ones, odd ones (``TRACE``,
  ``PROPFIND``, ``QUERY``, lower case ``get``) and made-up tokens;
* paths: the route exactly, or with a trailing or doubled slash, dot segments, one
  character percent-encoded, an encoded slash, another case, a prefix or a suffix, a
  query string, broken percent-escapes, percent-encoded unicode, a very long segment
  (up to 20,000 characters: past Hypercorn's 16 KiB limit on a request head), the
  asterisk form (``*``) and the absolute form (``http://host/path``);
* headers: Content-Type variants (none, JSON with and without charset, form, multipart,
  garbage), ``X-Steward-Class`` (the three classes, empty, wrong case, unknown, raw
  bytes, twice), ``Expect: 100-continue`` and a few others; sometimes the body goes
  chunked. Host is always right and Origin never sent;
* bodies: the route's valid body with ``stream`` on or off; the valid body with one field
  removed, given a value of the wrong type, nested a few thousand levels deep, or set to
  a huge number (``1e999999``, ``-1e309``, a 5,000-digit integer); extra fields; whole
  bodies that are empty, not JSON, invalid UTF-8, truncated JSON, UTF-16 or BOM-prefixed
  JSON, JSON arrays and scalars, deeply nested arrays or objects, and bodies around the
  listener's size limit (Content-Length always tells the truth, or is left out for a
  chunked body).

Valid bodies ask for few tokens (the fake engines answer in milliseconds), and nothing
here sets the fakes' test hooks (``FAKE_*`` prompts, ComfyUI's ``fake_seconds``).
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import attrs
from hypothesis import strategies as st

Location = tuple[str | int, ...]  # a field inside a JSON body: keys and list indices


@attrs.frozen
class Route:
    """One route of a listener: method and path, and a valid body for the routes that take one."""

    method: str
    path: str
    body: dict[str, Any] | None = None
    fields: tuple[Location, ...] = ()  # where mutations go (a missing one is added)


@attrs.frozen
class Body:
    data: bytes
    how: str  # a Python expression (or a description) that gives `data`
    kind: str = "valid"  # how it was made, for grouping: "valid", "deep", "oversized", ...


@attrs.frozen(repr=False)
class FuzzRequest:
    method: str
    target: bytes  # the request target exactly as sent: path and query
    headers: tuple[tuple[bytes, bytes], ...]
    body: Body
    route: str = ""  # the route it was made from ("POST /v1/chat/completions")
    path_kind: str = "exact"  # how the path was made from the route's
    chunked: bool = False  # the body sent with Transfer-Encoding: chunked, without a Content-Length

    def describe(self) -> str:
        """The request in one line: enough to send it again by hand."""
        headers = "".join(f" -H {k.decode()}: {v.decode('latin-1')!r}" for k, v in self.headers)
        target = self.target.decode("ascii")
        if len(target) > 120:
            target = f"{target[:60]}...({len(target)} chars)...{target[-40:]}"
        framing = " (chunked)" if self.chunked else ""
        return f"{self.method} {target}{headers} body{framing}={self.body.how}"

    def __repr__(self) -> str:  # a body can be 165 kB: say how it was made instead
        return f"<FuzzRequest {self.describe()}>"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # how Hypothesis prints a failing example
        printer.text(repr(self))


# ---- routes

CHAT_MESSAGES = [{"role": "user", "content": "hello"}]
_CHAT_FIELDS: tuple[Location, ...] = (("model",), ("messages",), ("messages", 0), ("messages", 0, "content"),
                                      ("messages", 0, "role"), ("max_tokens",), ("stream",), ("steward",),
                                      ("steward", "class"), ("temperature",))

OPENAI_ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/chat/completions", {"model": "chat", "messages": CHAT_MESSAGES, "max_tokens": 2},
          _CHAT_FIELDS),
    Route("POST", "/v1/completions", {"model": "chat", "prompt": "once upon", "max_tokens": 2},
          (("model",), ("prompt",), ("max_tokens",), ("stream",), ("steward",), ("steward", "class"))),
    Route("POST", "/v1/embeddings", {"model": "embed", "input": ["first", "second"]},
          (("model",), ("input",), ("input", 0), ("encoding_format",), ("steward",), ("steward", "class"))),
    Route("POST", "/v1/responses", {"model": "chat", "input": "hello", "max_output_tokens": 2},
          (("model",), ("input",), ("max_output_tokens",), ("stream",), ("steward",), ("steward", "class"))),
    Route("POST", "/v1/messages", {"model": "gpt-4o", "max_tokens": 2, "messages": CHAT_MESSAGES},
          (("model",), ("messages",), ("messages", 0), ("messages", 0, "content"), ("max_tokens",), ("stream",),
           ("system",), ("steward",), ("steward", "class"))),
    Route("POST", "/v1/messages/count_tokens", {"model": "chat", "messages": CHAT_MESSAGES},
          (("model",), ("messages",), ("steward",))),
    Route("GET", "/v1/models"),
    Route("GET", "/v1/models/chat"),
    Route("GET", "/v1/models/gpt-4o"),
    Route("GET", "/healthz"),
    Route("GET", "/metrics"),
)

_OLLAMA_GENERATE_FIELDS: tuple[Location, ...] = (("model",), ("prompt",), ("stream",), ("options",),
                                                 ("options", "num_predict"), ("keep_alive",), ("steward",),
                                                 ("steward", "class"), ("format",))
OLLAMA_CHAT = "gemma3:4b"
OLLAMA_EMBED = "nomic-embed-text"

OLLAMA_ROUTES: tuple[Route, ...] = (
    Route("POST", "/api/generate", {"model": OLLAMA_CHAT, "prompt": "hello", "stream": False},
          _OLLAMA_GENERATE_FIELDS),
    Route("POST", "/api/chat", {"model": OLLAMA_CHAT, "messages": CHAT_MESSAGES, "stream": False},
          (("model",), ("messages",), ("messages", 0), ("messages", 0, "content"), ("stream",), ("options",),
           ("steward",), ("steward", "class"), ("tools",))),
    Route("POST", "/api/embed", {"model": OLLAMA_EMBED, "input": ["first", "second"]},
          (("model",), ("input",), ("input", 0), ("truncate",), ("steward",))),
    Route("POST", "/api/embeddings", {"model": OLLAMA_EMBED, "prompt": "first"},
          (("model",), ("prompt",), ("steward",))),
    Route("POST", "/v1/chat/completions", {"model": OLLAMA_CHAT, "messages": CHAT_MESSAGES, "max_tokens": 2},
          _CHAT_FIELDS),
    Route("POST", "/v1/completions", {"model": OLLAMA_CHAT, "prompt": "once upon", "max_tokens": 2},
          (("model",), ("prompt",), ("max_tokens",), ("stream",), ("steward",))),
    Route("POST", "/v1/embeddings", {"model": OLLAMA_EMBED, "input": "first"},
          (("model",), ("input",), ("steward",))),
    Route("POST", "/v1/responses", {"model": OLLAMA_CHAT, "input": "hello"}, (("model",), ("input",), ("steward",))),
    Route("POST", "/v1/messages", {"model": OLLAMA_CHAT, "max_tokens": 2, "messages": CHAT_MESSAGES},
          (("model",), ("messages",), ("max_tokens",), ("stream",), ("steward",))),
    Route("POST", "/api/show", {"model": OLLAMA_CHAT}, (("model",), ("verbose",))),
    Route("GET", "/api/tags"),
    Route("GET", "/api/ps"),
    Route("GET", "/api/version"),
    Route("GET", "/"),
    Route("GET", "/v1/models"),
    Route("GET", f"/v1/models/{OLLAMA_CHAT}"),
    Route("GET", "/healthz"),
    Route("GET", "/metrics"),
)


def comfy_workflow() -> dict[str, Any]:
    """A three-node workflow the fake ComfyUI accepts (it runs for the fake's --job-time)."""
    return {"prompt": {"4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "x.safetensors"}},
                       "3": {"class_type": "KSampler", "inputs": {"model": ["4", 0], "steps": 2}},
                       "9": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "fuzz"}}},
            "client_id": "fuzz"}


_PROMPT_FIELDS: tuple[Location, ...] = (("prompt",), ("client_id",), ("prompt", "3"), ("prompt", "3", "class_type"),
                                        ("prompt", "3", "inputs"), ("prompt", "3", "inputs", "steps"),
                                        ("prompt", "3", "inputs", "model"), ("prompt", "9", "inputs", "images"),
                                        ("number",), ("front",), ("extra_data",), ("prompt_id",))

COMFY_ROUTES: tuple[Route, ...] = (
    Route("POST", "/prompt", comfy_workflow(), _PROMPT_FIELDS),
    Route("POST", "/api/prompt", comfy_workflow(), _PROMPT_FIELDS),
    Route("GET", "/prompt"),
    Route("GET", "/queue"),
    Route("POST", "/queue", {"delete": ["no-such-prompt"]}, (("delete",), ("clear",))),
    Route("GET", "/history"),
    Route("GET", "/history/no-such-prompt"),
    Route("POST", "/history", {"delete": ["no-such-prompt"]}, (("delete",), ("clear",))),
    Route("POST", "/interrupt", {}, (("prompt_id",),)),
    Route("POST", "/free", {"unload_models": False, "free_memory": False}, (("unload_models",), ("free_memory",))),
    Route("GET", "/system_stats"),
    Route("GET", "/api/system_stats"),
    Route("GET", "/object_info"),
    Route("GET", "/object_info/KSampler"),
    Route("GET", "/features"),
    Route("GET", "/embeddings"),
    Route("GET", "/view?filename=fuzz.png&type=output"),
    Route("GET", "/ws?clientId=fuzz"),  # without the upgrade headers
    Route("GET", "/"),
    Route("GET", "/healthz"),
    Route("GET", "/metrics"),
    Route("POST", "/steward/release"),
)


# ---- methods

COMMON_METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS")
ODD_METHODS = ("TRACE", "CONNECT", "PROPFIND", "MKCOL", "LOCK", "PURGE", "QUERY", "SEARCH", "get", "Post", "X-FUZZ",
               "M-SEARCH")
_TOKEN = string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~"


@st.composite
def methods(draw: st.DrawFn, route: Route) -> str:
    """The route's own method six times in ten; shrinks toward it."""
    if draw(st.integers(0, 9)) < 6:
        return route.method
    return draw(st.one_of(st.sampled_from(COMMON_METHODS), st.sampled_from(ODD_METHODS),
                          st.text(_TOKEN, min_size=1, max_size=12)))


# ---- paths

PATH_KINDS = ("trailing-slash", "double-leading-slash", "double-inner-slash", "dot-segment", "dotdot-segment",
              "encoded-char", "encoded-slash", "upper-case", "prefix", "suffix", "query", "bad-escape", "unicode",
              "long", "root-only", "asterisk", "absolute-form")


@st.composite
def paths(draw: st.DrawFn, route: Route) -> tuple[str, str]:
    """(request target, how it was made): a near miss of the route's path. The target is
    ASCII, as HTTP/1.1 requires."""
    path, _, query = route.path.partition("?")
    query = "?" + query if query else ""
    kind = draw(st.sampled_from(PATH_KINDS))
    segments = path.split("/")
    inner = [i for i, s in enumerate(segments) if s]
    if kind == "trailing-slash":
        path += "/"
    elif kind == "double-leading-slash":
        path = "/" + path
    elif kind == "double-inner-slash" and len(inner) > 1:
        i = draw(st.sampled_from(inner[1:]))
        path = "/".join(segments[:i]) + "//" + "/".join(segments[i:])
    elif kind == "dot-segment":
        i = draw(st.sampled_from(inner or [1]))
        path = "/".join(segments[:i] + ["."] + segments[i:])
    elif kind == "dotdot-segment":
        i = draw(st.sampled_from(inner or [1]))
        path = "/".join(segments[:i] + ["x", ".."] + segments[i:])
    elif kind == "encoded-char" and path.strip("/"):
        i = draw(st.sampled_from([i for i, c in enumerate(path) if c != "/"]))
        path = path[:i] + f"%{ord(path[i]):02X}" + path[i + 1:]
    elif kind == "encoded-slash" and len(inner) > 1:
        i = draw(st.sampled_from(inner[1:]))
        path = "/".join(segments[:i]) + "%2F" + "/".join(segments[i:])
    elif kind == "upper-case":
        path = path.upper()
    elif kind == "prefix":
        path = draw(st.sampled_from(["/v1", "/api", "/x", "/v1/v1", "/ollama", "/steward"])) + path
    elif kind == "suffix":
        path += draw(st.sampled_from(["/x", "/../x", "/%00", ".json", "/v1", "/stream", "//"]))
    elif kind == "query":
        query += draw(st.sampled_from(["?", "?stream=true", "?a=1&a=2", "?model=chat", "?%zz=%",
                                       "?x=" + "y" * 2000, "?#fragment"]))
    elif kind == "bad-escape":
        path += draw(st.sampled_from(["%", "%z", "%zz", "%ff%fe", "%C0%AF", "%00", "%2", "%%"]))
    elif kind == "unicode":
        text = draw(st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=12))
        path += "/" + quote(text, safe="")  # UTF-8, percent-encoded, as clients send it
    elif kind == "long":
        length = draw(st.sampled_from([1_000, 4_000, 8_000, 12_000, 20_000]))
        path += "/" + "a" * length
    elif kind == "root-only":
        path = "/"
    elif kind == "asterisk":  # OPTIONS' asterisk-form, with any method
        return "*", kind
    elif kind == "absolute-form":  # as sent to a proxy
        path = draw(st.sampled_from(["http://localhost", "http://127.0.0.1", "http://example.com"])) + path
    return path + query, kind


# ---- headers

CONTENT_TYPES = (None, "application/json", "application/json; charset=utf-8", "application/json;charset=UTF-8",
                 "APPLICATION/JSON", "text/plain", "text/plain; charset=utf-8", "application/x-www-form-urlencoded",
                 "multipart/form-data; boundary=fuzz", "application/x-ndjson", "application/octet-stream",
                 "application/json; charset=latin-1", "", "garbage", "*/*", "application/json; boundary=\x01")
CLASS_VALUES = ("interactive", "background", "batch", "", "Batch", "BACKGROUND", "urgent", "batch, background",
                "interactive\tbatch", "0", "null", "\x80\xff", "b\x7fatch", "x" * 300)
# h11 refuses a header value with leading or trailing whitespace, NUL, CR or LF: it could not be sent at all.
_HEADER_VALUE = st.text(st.characters(min_codepoint=0x21, max_codepoint=0xFF, exclude_characters="\x85\xa0"),
                        max_size=40)


@st.composite
def header_sets(draw: st.DrawFn, route: Route) -> tuple[tuple[bytes, bytes], ...]:
    headers: list[tuple[str, str]] = []
    content_type = draw(st.sampled_from(CONTENT_TYPES)) if route.body is not None else draw(
        st.sampled_from((None, None, *CONTENT_TYPES)))
    if content_type is not None:
        headers.append(("content-type", content_type))
    klass = draw(st.one_of(st.none(), st.sampled_from(CLASS_VALUES), _HEADER_VALUE))
    if klass is not None:
        headers.append(("x-steward-class", klass))
        if draw(st.integers(0, 9)) == 9:  # the header twice
            headers.append(("x-steward-class", draw(st.sampled_from(CLASS_VALUES))))
    for name, values in (("accept", ["text/event-stream", "application/json", "*/*", "garbage", ""]),
                         ("expect", ["100-continue", "garbage"]),
                         ("authorization", ["Bearer sk-fuzz", "Basic Zm9vOmJhcg==", "", "Bearer"]),
                         ("accept-encoding", ["gzip", "identity", "br, zstd", "*;q=0"]),
                         ("x-api-key", ["fuzz"])):
        if draw(st.integers(0, 5)) == 5:  # shrinks toward absent
            headers.append((name, draw(st.sampled_from(values))))
    if draw(st.integers(0, 7)) == 7:
        name = draw(st.text(string.ascii_lowercase + "-", min_size=1, max_size=20).filter(
            lambda n: n not in ("host", "origin", "content-length", "transfer-encoding", "connection", "expect",
                                "upgrade", "te", "trailer")))
        headers.append((name, draw(_HEADER_VALUE)))
    return tuple((k.encode(), v.encode("latin-1")) for k, v in headers)


JSON_TYPE = ((b"content-type", b"application/json"),)


# ---- bodies

_JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
JSON_VALUES = st.recursive(_JSON_LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)
# Each placeholder is replaced by a literal json.dumps cannot write.
_HUGE_LITERALS = {"1e999999": "1e999999", "-1e309": "-1e309", "1e-400": "1e-400", "NaN": "NaN",
                  "-Infinity": "-Infinity", "digits4000": "9" * 4000, "digits5000": "9" * 5000,
                  "2**64": str(2**64), "-2**63-1": str(-(2**63) - 1), "1.0e+30": "1.0e+30"}
DEPTHS = (10, 990, 1000, 1010, 2000, 3000, 5000)  # Python's json gives up near 1000 by default


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _set(body: Any, location: Location, value: Any) -> Any:
    """*body* with *value* at *location* (added if missing); a copy. Parents that are not
    containers are replaced by one."""
    if not location:
        return value
    head, rest = location[0], location[1:]
    if isinstance(head, int):
        items = list(body) if isinstance(body, list) else []
        while len(items) <= head:
            items.append({})
        items[head] = _set(items[head], rest, value)
        return items
    fields = dict(body) if isinstance(body, dict) else {}
    fields[head] = _set(fields.get(head), rest, value)
    return fields


def _delete(body: Any, location: Location) -> Any:
    if not location or not isinstance(body, dict | list):
        return body
    head, rest = location[0], location[1:]
    if isinstance(body, list):
        if not isinstance(head, int) or head >= len(body):
            return body
        items = list(body)
        if rest:
            items[head] = _delete(items[head], rest)
        else:
            del items[head]
        return items
    if head not in body:
        return body
    fields = dict(body)
    if rest:
        fields[head] = _delete(fields[head], rest)
    else:
        del fields[head]
    return fields


def _where(location: Location) -> str:
    return ".".join(str(part) for part in location)


def _nested(depth: int, kind: str) -> tuple[str, str]:
    """(JSON text nested *depth* levels deep, a Python expression for it)."""
    if kind == "array":
        return "[" * depth + "]" * depth, f"'[' * {depth} + ']' * {depth}"
    return '{"a":' * depth + "1" + "}" * depth, f"'{{\"a\":' * {depth} + '1' + '}}' * {depth}"


@st.composite
def mutated_bodies(draw: st.DrawFn, route: Route) -> Body:
    """The route's valid body with one change."""
    assert route.body is not None
    base = route.body
    location = draw(st.sampled_from(route.fields)) if route.fields else ("model",)
    action = draw(st.sampled_from(["missing", "wrong-type", "wrong-type", "extra", "deep", "huge-number",
                                   "stream"]))
    if action == "missing":
        return Body(_dumps(_delete(base, location)).encode(), f"valid body without {_where(location)}", action)
    if action == "wrong-type":
        value = draw(JSON_VALUES)
        text = _dumps(_set(base, location, value))
        return Body(text.encode(), f"{text!r}" if len(text) < 400 else f"valid body, {_where(location)}={value!r}",
                    action)
    if action == "extra":
        extra = draw(st.dictionaries(st.text(min_size=1, max_size=10), JSON_VALUES, min_size=1, max_size=3))
        text = _dumps({**base, **extra} if isinstance(base, dict) else base)
        return Body(text.encode(), f"{text!r}" if len(text) < 400 else f"valid body plus {sorted(extra)!r}", action)
    if action == "deep":
        depth, kind = draw(st.sampled_from(DEPTHS)), draw(st.sampled_from(["array", "object"]))
        nested, how = _nested(depth, kind)
        text = _dumps(_set(base, location, "\0DEEP\0")).replace('"\\u0000DEEP\\u0000"', nested)
        return Body(text.encode(), f"valid body with {_where(location)} = {how}", action)
    if action == "huge-number":
        name = draw(st.sampled_from(sorted(_HUGE_LITERALS)))
        text = _dumps(_set(base, location, "\0HUGE\0")).replace('"\\u0000HUGE\\u0000"', _HUGE_LITERALS[name])
        return Body(text.encode(), f"valid body with {_where(location)} = {name}", action)
    stream = draw(st.sampled_from([True, False, None, "true", 1, [], {}]))
    text = _dumps({**base, "stream": stream})
    return Body(text.encode(), repr(text), action)


OTHER_BODIES = ("empty", "not-json", "invalid-utf8", "truncated", "utf16", "bom", "scalar", "array", "deep-array",
                "deep-object", "oversized", "at-limit", "binary")


@st.composite
def other_bodies(draw: st.DrawFn, route: Route, limit: int) -> Body:
    """Bodies that are not the route's body at all."""
    kind = draw(st.sampled_from(OTHER_BODIES))
    return attrs.evolve(_other_body(draw, route, limit, kind), kind=kind)


def _other_body(draw: st.DrawFn, route: Route, limit: int, kind: str) -> Body:
    base = route.body if route.body is not None else {"model": "chat"}
    text = _dumps(base)
    if kind == "empty":
        return Body(b"", "b''")
    if kind == "not-json":
        data = draw(st.sampled_from(["model=chat&stream=true", "{not json", "<xml/>", "{'model': 'chat'}",
                                     "null null", '{"model": "chat",}', "\x00", "{" + "\n" * 100]))
        return Body(data.encode(), repr(data.encode()))
    if kind == "invalid-utf8":
        i = draw(st.integers(0, len(text)))
        junk = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80"]))
        data = text[:i].encode() + junk + text[i:].encode()
        return Body(data, repr(data))
    if kind == "truncated":
        i = draw(st.integers(1, max(1, len(text) - 1)))
        return Body(text[:i].encode(), repr(text[:i].encode()))
    if kind == "utf16":
        return Body(text.encode("utf-16"), f"{text!r}.encode('utf-16')")
    if kind == "bom":
        return Body(b"\xef\xbb\xbf" + text.encode(), f"b'\\xef\\xbb\\xbf' + {text.encode()!r}")
    if kind == "scalar":
        data = draw(st.sampled_from(["1", "-0", "true", "null", '"chat"', "1e999999", "9" * 5000, "NaN"]))
        return Body(data.encode(), repr(data) if len(data) < 50 else f"'9' * {len(data)}")
    if kind == "array":
        value = draw(st.lists(JSON_VALUES, max_size=3).map(lambda items: [base, *items]))
        data = _dumps(value)
        return Body(data.encode(), repr(data) if len(data) < 400 else "an array holding the valid body")
    if kind in ("deep-array", "deep-object"):
        depth = draw(st.sampled_from(DEPTHS))
        data, how = _nested(depth, kind.removeprefix("deep-"))
        return Body(data.encode(), how)
    if kind == "binary":
        data = draw(st.binary(min_size=1, max_size=64))
        return Body(data, repr(data))
    # Around the size limit: a padding field in the valid body.
    if kind == "oversized":
        size = limit + draw(st.sampled_from([1, 1024, 100_000]))
    else:
        size = limit - draw(st.sampled_from([0, 1, 2048]))
    pad = max(0, size - len(_dumps({**base, "pad": ""}).encode()))
    data = _dumps({**base, "pad": "x" * pad}).encode()
    return Body(data, f"valid body plus a 'pad' field: {len(data)} bytes (limit {limit})")


def bodies(route: Route, limit: int) -> st.SearchStrategy[Body]:
    """Anything but the route's own body: its valid body mutated (twice as likely), or another."""
    if route.body is None:
        return other_bodies(route, limit)
    return st.one_of(mutated_bodies(route), mutated_bodies(route), other_bodies(route, limit))


TWISTS = ("body", "body", "path", "method", "headers", "everything")


@st.composite
def requests(draw: st.DrawFn, routes: Sequence[Route], limit: int) -> FuzzRequest:
    """One request for a listener with *routes* and a body size limit of *limit* bytes:
    a route's request with one thing about it changed (the body most often), or all of
    them at once. One change at a time keeps, say, a 405 for an odd method from hiding
    what the body would have done."""
    # Routes that take a body have more to get wrong: twice as likely.
    route = draw(st.sampled_from([r for r in routes for _ in range(2 if r.body is not None else 1)]))
    twist = draw(st.sampled_from(TWISTS))
    if twist == "path" or (twist == "everything" and draw(st.booleans())):
        target, path_kind = draw(paths(route))
    else:
        target, path_kind = route.path, "exact"
    method = draw(methods(route)) if twist in ("method", "everything") else route.method
    chunked = False
    if twist in ("headers", "everything"):
        headers = draw(header_sets(route))
        chunked = draw(st.integers(0, 5)) == 5
    else:
        headers = JSON_TYPE if route.body is not None else ()
    if twist in ("body", "everything"):
        body = draw(bodies(route, limit))
    elif route.body is not None:
        valid = _dumps(route.body)
        body = Body(valid.encode(), repr(valid))
    else:
        body = Body(b"", "b''", "none")
    return FuzzRequest(method=method, target=target.encode("ascii"), headers=headers, body=body,
                       route=f"{route.method} {route.path}", path_kind=path_kind, chunked=chunked)


# ---- inputs every run tries first


def known(method: str, target: str, body: Body | dict[str, Any] | None = None,
          headers: tuple[tuple[bytes, bytes], ...] = JSON_TYPE) -> FuzzRequest:
    if isinstance(body, dict):
        text = _dumps(body)
        body = Body(text.encode(), repr(text))
    return FuzzRequest(method, target.encode("ascii"), headers, body or Body(b"", "b''", "none"),
                       route=f"{method} {target}", path_kind="known")


def _deep(depth: int, route: Route | None = None, field: str | None = None) -> Body:
    nested, how = _nested(depth, "array")
    if route is None or field is None:
        return Body(nested.encode(), how, "deep-array")
    assert route.body is not None
    text = _dumps({**route.body, field: "\0DEEP\0"}).replace('"\\u0000DEEP\\u0000"', nested)
    return Body(text.encode(), f"valid body with {field} = {how}", "deep")


def _oversized(route: Route, limit: int) -> Body:
    base = route.body if route.body is not None else {"model": "chat"}
    data = _dumps({**base, "pad": "x" * limit}).encode()
    return Body(data, f"valid body plus a 'pad' field: {len(data)} bytes (limit {limit})", "oversized")


def regressions(listener: str, limit: int) -> tuple[FuzzRequest, ...]:
    """Requests of the kinds that broke a listener before (or easily could): tried first by
    every run, whatever Hypothesis draws afterwards."""
    if listener == "openai":
        chat = OPENAI_ROUTES[0]
        return (known("POST", "//v1/chat/completions", chat.body),
                known("POST", "/v1/chat/completions", _deep(1000)),
                known("POST", "/v1/chat/completions", _deep(5000, chat, "messages")),
                known("POST", "/v1/embeddings", _deep(1000, OPENAI_ROUTES[2], "input")),
                known("POST", "/v1/chat/completions", _oversized(chat, limit)),
                known("POST", "/v1/chat/completions", Body(b'{"model": "chat\xff"}', "b'{\"model\": \"chat\\xff\"}'",
                                                           "invalid-utf8")),
                known("POST", "/v1/chat/completions", {**(chat.body or {}), "model": "chat@urgent"}),
                known("POST", "/v1/chat/completions", chat.body, ((b"x-steward-class", b"\x80\xff"),)),
                known("PUT", "/v1/chat/completions", chat.body),
                known("POST", "/v1/models"),
                known("DELETE", "/healthz"),
                known("GET", "/v1/models/" + "a" * 20_000))
    if listener == "ollama":
        generate, chat = OLLAMA_ROUTES[0], OLLAMA_ROUTES[4]
        return (known("POST", "/api/generate", _deep(1000)),
                known("POST", "/v1/chat/completions", _deep(5000, chat, "messages")),
                known("POST", "/api/tags", _oversized(generate, limit)),
                known("POST", "/api/generate", _oversized(generate, limit)),
                known("POST", "/healthz"),
                known("PUT", "/metrics"),
                known("GET", "//api/tags"),
                known("POST", "//api/generate", generate.body),
                known("POST", "/api/generate", {**(generate.body or {}), "model": f"{OLLAMA_CHAT}@urgent"}),
                known("POST", "/v1/chat/completions", {**(chat.body or {}), "model": f"{OLLAMA_CHAT}@urgent"}),
                known("POST", "/api/chat", OLLAMA_ROUTES[1].body, ((b"x-steward-class", b"urgent"),)))
    prompt = COMFY_ROUTES[0]
    return (known("POST", "/healthz"),
            known("GET", "/steward/release"),
            known("DELETE", "/metrics"),
            known("POST", "/system_stats", _oversized(prompt, limit)),
            known("POST", "/prompt", _oversized(prompt, limit)),
            known("POST", "/prompt", _deep(1000)),
            known("POST", "//prompt", prompt.body),
            known("GET", "/" + "a" * 20_000))
