"""Hypothesis strategies for raw HTTP/1.1 requests to steward's listeners.

A request is one of the listener's real routes (:class:`Route`) called properly, with one
thing about it changed (the body most often; or the method, the path, the headers) or
all of them at once. Every body carries ``how``, a short text saying how it was built (in
Python where the body is large), so that a failure can be sent again by hand, and every
request says how its path and body were made and which classes of input it carries
(:meth:`FuzzRequest.input_classes`), so that failures can be grouped and runs counted.

What is generated, and why:

* methods: the route's own most of the time, else the usual ones, odd ones (``TRACE``,
  ``PROPFIND``, ``QUERY``, lower case ``get``) and made-up tokens;
* paths: the route exactly, or with a trailing or doubled slash, dot segments, one
  character percent-encoded, an encoded slash, another case, a prefix or a suffix, a
  query string, broken percent-escapes, percent-encoded unicode, a hostile string
  (below) percent-encoded as a last segment or in the query, a very long segment
  (up to 20,000 characters: past Hypercorn's 16 KiB limit on a request head), the
  asterisk form (``*``) and the absolute form (``http://host/path``);
* headers: Content-Type variants (none, JSON with and without charset, form, multipart,
  garbage), ``X-Steward-Class`` (the three classes, empty, wrong case, unknown, raw
  bytes, twice), ``Expect: 100-continue`` and a few others, and a hostile string as
  the bytes of a header steward or an engine reads (as UTF-8, lone surrogates
  included, or as latin-1; only NUL, CR and LF, which HTTP/1.1 cannot carry, left
  out); sometimes the body goes chunked. Host is always right and Origin never sent;
* bodies: the route's valid body with ``stream`` on or off; the valid body with one field
  removed, given a value of the wrong type, nested a few thousand levels deep, set to
  a huge number (``1e999999``, ``-1e309``, a 5,000-digit integer, a 10,000-digit
  fraction), set to a hostile string, given a field named with one, or with every
  string in it made hostile; extra fields; whole bodies that are empty, not JSON,
  invalid UTF-8, truncated JSON, UTF-16 or BOM-prefixed JSON, JSON arrays and scalars,
  deeply nested arrays or objects, and bodies around the listener's size limit
  (Content-Length always tells the truth, or is left out for a chunked body);
* keys (:func:`keyed_requests`, for a steward with :data:`FUZZ_KEYS` in force): a
  valid key most of the time (as ``Authorization: Bearer``, as ``x-api-key``), or a
  key limited to some models, to the batch class, to one request a minute, an admin
  key, an unknown key, none, a hostile string where the key goes.

Hostile strings (:data:`HOSTILE_STRINGS`, and any code point at all, surrogates
included): lone UTF-16 surrogates (high, low, a pair reversed, a pair split), NUL and
other C0 and C1 controls, bidi and zero-width marks, the BOM, noncharacters
(U+FFFE, U+FFFF, U+10FFFF), private use, line separators, a combining mark a thousand
times, and text that only looks like an escape; alone or around the field's valid
value, once or repeated to tens of kilobytes. A lone surrogate is valid JSON (``"\\ud800"``)
but not UTF-8: a body holding one is written with every non-ASCII character escaped,
as a client's ``json.dumps`` writes it by default; other bodies are UTF-8 as often.

Valid bodies ask for few tokens (the fake engines answer in milliseconds), and nothing
here sets the fakes' test hooks (``FAKE_*`` prompts, ComfyUI's ``fake_seconds``).
"""

from __future__ import annotations

import hashlib
import json
import string
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import attrs
from hypothesis import strategies as st

from supervisor.auth.keys import KEY_PREFIX

Location = tuple[str | int, ...]  # a field inside a JSON body: keys and list indices
Headers = tuple[tuple[bytes, bytes], ...]


@attrs.frozen
class Route:
    """One route of a listener: method and path, and a valid body for the routes that take one."""

    method: str
    path: str
    body: dict[str, Any] | None = None
    fields: tuple[Location, ...] = ()  # where mutations go (a missing one is added): every field steward reads


@attrs.frozen
class Body:
    data: bytes
    how: str  # a Python expression (or a description) that gives `data`
    kind: str = "valid"  # how it was made, for grouping: "valid", "deep", "oversized", "hostile", ...
    hostile: str = ""  # the class of hostile string in it (HOSTILE_STRINGS), if any


@attrs.frozen(repr=False)
class FuzzRequest:
    method: str
    target: bytes  # the request target exactly as sent: path and query
    headers: Headers
    body: Body
    route: str = ""  # the route it was made from ("POST /v1/chat/completions")
    path_kind: str = "exact"  # how the path was made from the route's
    chunked: bool = False  # the body sent with Transfer-Encoding: chunked, without a Content-Length
    credential: str = ""  # how the key was sent (CREDENTIALS), for a steward with keys in force
    # Whether it carries a key of FUZZ_KEYS as the door reads it; None: not told (keys off, or a form
    # whose reading is the door's choice, such as two different keys).
    keyed: bool | None = None
    # (where, kind) of each hostile string outside the body: ("header:x-api-key", "bidi"), ("path", "nul")
    hostile: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        """The request in one line: enough to send it again by hand."""
        headers = "".join(f" -H {k.decode()}: {v.decode('latin-1')!r}" for k, v in self.headers)
        target = self.target.decode("ascii")
        if len(target) > 120:
            target = f"{target[:60]}...({len(target)} chars)...{target[-40:]}"
        framing = " (chunked)" if self.chunked else ""
        return f"{self.method} {target}{headers} body{framing}={self.body.how}"

    def input_classes(self) -> tuple[str, ...]:
        """What this request is made of, one "dimension:class" each: what a long run counts."""
        classes = [f"body:{self.body.kind}", f"path:{self.path_kind}"]
        if self.route and self.method != self.route.split(" ", 1)[0]:
            classes.append("method:other")
        if self.chunked:
            classes.append("framing:chunked")
        if self.credential:
            classes.append(f"key:{self.credential}")
        hostile = [("body", self.body.hostile)] if self.body.hostile else []
        hostile += self.hostile
        for where, kind in hostile:
            classes.append(f"hostile-in:{where.split(':', 1)[0]}")
            classes.append(f"hostile:{kind.removeprefix('long:')}")
            if kind.startswith("long:"):
                classes.append("hostile:long")
        if hostile:
            classes.append("hostile:any")
        return tuple(dict.fromkeys(classes))
        return tuple(classes)

    def __repr__(self) -> str:  # a body can be 165 kB: say how it was made instead
        return f"<FuzzRequest {self.describe()}>"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # how Hypothesis prints a failing example
        printer.text(repr(self))


# ---- routes

CHAT_MESSAGES = [{"role": "user", "content": "hello"}]
_CLASS_FIELDS: tuple[Location, ...] = (("steward",), ("steward", "class"))
_CHAT_FIELDS: tuple[Location, ...] = (("model",), ("messages",), ("messages", 0), ("messages", 0, "content"),
                                      ("messages", 0, "role"), ("messages", 0, "content", 0, "text"),
                                      ("messages", 0, "name"), ("max_tokens",), ("stream",), ("stream_options",),
                                      ("stream_options", "include_usage"), ("temperature",), ("stop",), ("user",),
                                      ("tools",), ("tools", 0, "function", "name"), ("response_format",),
                                      *_CLASS_FIELDS)
_MESSAGES_FIELDS: tuple[Location, ...] = (("model",), ("messages",), ("messages", 0), ("messages", 0, "content"),
                                          ("messages", 0, "role"), ("messages", 0, "content", 0, "text"),
                                          ("max_tokens",), ("stream",), ("system",), ("system", 0, "text"),
                                          ("tools",), ("tools", 0, "name"), ("metadata", "user_id"),
                                          ("stop_sequences",), *_CLASS_FIELDS)
IMAGE_MODEL = "sketch"  # the fuzzed steward's image model (runtime: comfyui)

OPENAI_ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/chat/completions", {"model": "chat", "messages": CHAT_MESSAGES, "max_tokens": 2},
          _CHAT_FIELDS),
    Route("POST", "/v1/completions", {"model": "chat", "prompt": "once upon", "max_tokens": 2},
          (("model",), ("prompt",), ("prompt", 0), ("max_tokens",), ("stream",), ("stop",), ("suffix",),
           *_CLASS_FIELDS)),
    Route("POST", "/v1/embeddings", {"model": "embed", "input": ["first", "second"]},
          (("model",), ("input",), ("input", 0), ("encoding_format",), ("dimensions",), ("user",), *_CLASS_FIELDS)),
    Route("POST", "/v1/responses", {"model": "chat", "input": "hello", "max_output_tokens": 2},
          (("model",), ("input",), ("input", 0, "content"), ("input", 0, "role"), ("instructions",),
           ("max_output_tokens",), ("stream",), ("tools",), ("previous_response_id",), *_CLASS_FIELDS)),
    Route("POST", "/v1/responses/input_tokens", {"model": "chat", "input": "hello"},
          (("model",), ("input",), ("instructions",), *_CLASS_FIELDS)),
    Route("POST", "/v1/messages", {"model": "gpt-4o", "max_tokens": 2, "messages": CHAT_MESSAGES}, _MESSAGES_FIELDS),
    Route("POST", "/v1/messages/count_tokens", {"model": "chat", "messages": CHAT_MESSAGES},
          (("model",), ("messages",), ("messages", 0, "content"), ("system",), ("tools",), *_CLASS_FIELDS)),
    Route("POST", "/v1/rerank", {"model": "chat", "query": "which", "documents": ["one", "two"]},
          (("model",), ("query",), ("documents",), ("documents", 0), ("top_n",), *_CLASS_FIELDS)),
    Route("POST", "/v1/images/generations", {"model": IMAGE_MODEL, "prompt": "a red square", "size": "64x64",
                                             "n": 1, "response_format": "b64_json"},
          (("model",), ("prompt",), ("size",), ("n",), ("seed",), ("steps",), ("negative_prompt",),
           ("response_format",), ("output_format",), ("quality",), ("user",), ("stream",), *_CLASS_FIELDS)),
    Route("GET", "/v1/models"),
    Route("GET", "/v1/models/chat"),
    Route("GET", "/v1/models/gpt-4o"),
    Route("GET", f"/v1/models/{IMAGE_MODEL}"),
    Route("GET", "/v1/images/files/no-such-token"),
    Route("GET", "/admin/state"),
    Route("GET", "/healthz"),
    Route("GET", "/livez"),
    Route("GET", "/metrics"),
)

_OLLAMA_GENERATE_FIELDS: tuple[Location, ...] = (("model",), ("prompt",), ("system",), ("template",), ("suffix",),
                                                 ("stream",), ("raw",), ("options",), ("options", "num_predict"),
                                                 ("options", "stop"), ("keep_alive",), ("format",), ("images",),
                                                 ("images", 0), ("context",), *_CLASS_FIELDS)
OLLAMA_CHAT = "gemma3:4b"
OLLAMA_EMBED = "nomic-embed-text"

OLLAMA_ROUTES: tuple[Route, ...] = (
    Route("POST", "/api/generate", {"model": OLLAMA_CHAT, "prompt": "hello", "stream": False},
          _OLLAMA_GENERATE_FIELDS),
    Route("POST", "/api/chat", {"model": OLLAMA_CHAT, "messages": CHAT_MESSAGES, "stream": False},
          (("model",), ("messages",), ("messages", 0), ("messages", 0, "content"), ("messages", 0, "role"),
           ("messages", 0, "images"), ("stream",), ("options",), ("options", "num_predict"), ("keep_alive",),
           ("format",), ("tools",), ("tools", 0, "function", "name"), *_CLASS_FIELDS)),
    Route("POST", "/api/embed", {"model": OLLAMA_EMBED, "input": ["first", "second"]},
          (("model",), ("input",), ("input", 0), ("truncate",), ("keep_alive",), ("options",), ("dimensions",),
           *_CLASS_FIELDS)),
    Route("POST", "/api/embeddings", {"model": OLLAMA_EMBED, "prompt": "first"},
          (("model",), ("prompt",), ("keep_alive",), ("options",), *_CLASS_FIELDS)),
    Route("POST", "/v1/chat/completions", {"model": OLLAMA_CHAT, "messages": CHAT_MESSAGES, "max_tokens": 2},
          _CHAT_FIELDS),
    Route("POST", "/v1/completions", {"model": OLLAMA_CHAT, "prompt": "once upon", "max_tokens": 2},
          (("model",), ("prompt",), ("max_tokens",), ("stream",), ("stop",), *_CLASS_FIELDS)),
    Route("POST", "/v1/embeddings", {"model": OLLAMA_EMBED, "input": "first"},
          (("model",), ("input",), ("encoding_format",), *_CLASS_FIELDS)),
    Route("POST", "/v1/responses", {"model": OLLAMA_CHAT, "input": "hello"},
          (("model",), ("input",), ("instructions",), ("stream",), *_CLASS_FIELDS)),
    Route("POST", "/v1/messages", {"model": OLLAMA_CHAT, "max_tokens": 2, "messages": CHAT_MESSAGES},
          (("model",), ("messages",), ("messages", 0, "content"), ("max_tokens",), ("stream",), ("system",),
           *_CLASS_FIELDS)),
    Route("POST", "/api/show", {"model": OLLAMA_CHAT}, (("model",), ("name",), ("verbose",))),
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


def image_workflow() -> dict[str, Any]:
    """The image model's workflow, as ComfyUI's "Export (API)" writes one, with steward's placeholders."""
    return {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "fake.safetensors"}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "{{prompt}}", "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "{{negative_prompt}}", "clip": ["4", 1]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": "{{width}}", "height": "{{height}}",
                                                           "batch_size": 1}},
        "3": {"class_type": "KSampler", "inputs": {"seed": "{{seed}}", "steps": "{{steps}}", "cfg": 7.0,
                                                   "sampler_name": "euler", "scheduler": "normal", "denoise": 1.0,
                                                   "model": ["4", 0], "positive": ["6", 0], "negative": ["7", 0],
                                                   "latent_image": ["5", 0]}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "steward/{{seed}}"}},
    }


_PROMPT_FIELDS: tuple[Location, ...] = (("prompt",), ("client_id",), ("prompt", "3"), ("prompt", "3", "class_type"),
                                        ("prompt", "3", "inputs"), ("prompt", "3", "inputs", "steps"),
                                        ("prompt", "3", "inputs", "model"), ("prompt", "9", "inputs", "images"),
                                        ("prompt", "4", "class_type"), ("prompt", "4", "inputs", "ckpt_name"),
                                        ("prompt", "9", "inputs", "filename_prefix"), ("number",), ("front",),
                                        ("extra_data",), ("extra_data", "extra_pnginfo"), ("prompt_id",),
                                        ("partial_execution_targets",), ("partial_execution_targets", 0))

COMFY_ROUTES: tuple[Route, ...] = (
    Route("POST", "/prompt", comfy_workflow(), _PROMPT_FIELDS),
    Route("POST", "/api/prompt", comfy_workflow(), _PROMPT_FIELDS),
    Route("GET", "/prompt"),
    Route("GET", "/queue"),
    Route("POST", "/queue", {"delete": ["no-such-prompt"]}, (("delete",), ("delete", 0), ("clear",))),
    Route("GET", "/history"),
    Route("GET", "/history/no-such-prompt"),
    Route("POST", "/history", {"delete": ["no-such-prompt"]}, (("delete",), ("delete", 0), ("clear",))),
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

# Paths any caller reaches without a key (auth.open_paths, steward's default), and the image
# files' prefix, open to GET on the OpenAI listener (the token in the path is the key).
OPEN_PATHS = frozenset({"/livez", "/healthz"})
CAPABILITY_PREFIX = "/v1/images/files/"


# ---- hostile strings

# Each class of string that has broken, or could break, something that handles text: a UTF-8
# encoder (lone surrogates), a C string or a path (NUL), a terminal or a log (controls, bidi),
# a JSON or HTTP parser (BOM, separators, noncharacters), a length check (combining marks).
HOSTILE_STRINGS: dict[str, tuple[str, ...]] = {
    "lone-high-surrogate": ("\ud800", "\udbff", "x\ud800", "\ud83dchat"),
    "lone-low-surrogate": ("\udc00", "\udfff", "\ude00x"),
    "reversed-surrogate-pair": ("\udc00\ud800", "\ude00\ud83d"),
    "split-surrogate-pair": ("\ud83d \ude00", "\ud83d\x00\ude00"),
    "nul": ("\x00", "chat\x00", "\x00\x00\x00", "\x00.json"),
    "c0-control": ("\x01", "\x07", "\x08\x08\x08", "\x1b[2J\x1b[31m", "\x1f", "\x7f", "\t\n\r\x0b\x0c", "\r\n\r\n"),
    "c1-control": ("\x80", "\x85", "\x9b2J", "\x9f", "\x8d\x8e"),
    "bidi": ("\u202e", "\u200f", "\u200e", "\u2066\u2067\u2068\u2069", "\u061c", "abc\u202egpj.exe"),
    "zero-width": ("\u200b", "\u200c\u200d", "\u2060", "\u180e", "\u034f"),
    "line-separator": ("\u2028", "\u2029", "a\u2028b"),
    "bom": ("\ufeff", "\ufeffchat", "\ufffe"),
    "noncharacter": ("\ufffe", "\uffff", "\ufdd0", "\ufdef", "\U0001fffe", "\U0010fffe", "\U0010ffff"),
    "replacement": ("\ufffd", "\ufffd\ufffd"),
    "private-use": ("\ue000", "\uf8ff", "\U000f0000", "\U00100000"),
    "astral": ("\U0001f600", "\U0001d54f", "\U00020000", "\ud83d\ude00"),  # the last: a valid pair, one character
    "combining": ("e" + "\u0301" * 1000, "\u0e47" * 500),
    "escape-lookalike": ("\\ud800", "\\u0000", "%00", "%ED%A0%80", "\\x00", "${jndi:x}", "{{prompt}}", "'\";--"),
}
_SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
# Every code point, surrogates included (st.characters leaves them out unless told; even
# then they are 2,048 of 1.1 million, so a third of the characters are drawn from them alone).
ANY_CHARACTER = st.one_of(st.characters(exclude_categories=()), st.characters(exclude_categories=()), _SURROGATES)
# The surrogate classes twice as often as the others: what UTF-8 cannot carry is what broke steward.
_HOSTILE_KINDS = tuple(sorted(HOSTILE_STRINGS)) + tuple(k for k in sorted(HOSTILE_STRINGS) if "surrogate" in k)
LONG_LENGTHS = (1_000, 4_000, 9_000)  # repeats: 9,000 escaped surrogates are 54 kB, within the 64 KiB limit


@attrs.frozen
class Hostile:
    kind: str  # a class of HOSTILE_STRINGS, "any-unicode" or "long:<class>"
    text: str


@st.composite
def hostile_strings(draw: st.DrawFn) -> Hostile:
    """A hostile string: from HOSTILE_STRINGS (most often), any code points, or one repeated to tens of kB."""
    how = draw(st.sampled_from(["catalog", "catalog", "catalog", "any", "long"]))
    if how == "any":
        return Hostile("any-unicode", draw(st.text(ANY_CHARACTER, min_size=1, max_size=24)))
    kind = draw(st.sampled_from(_HOSTILE_KINDS))
    text = draw(st.sampled_from(HOSTILE_STRINGS[kind]))
    if how == "long":
        return Hostile(f"long:{kind}", text * max(1, draw(st.sampled_from(LONG_LENGTHS)) // len(text)))
    return Hostile(kind, text)


@st.composite
def hostile_values(draw: st.DrawFn, valid: Any) -> Hostile:
    """A hostile string in place of *valid*: alone, or around or inside it where it is a string."""
    hostile = draw(hostile_strings())
    if not isinstance(valid, str) or not valid:
        return hostile
    where = draw(st.sampled_from(["alone", "after", "before", "inside"]))
    if where == "after":
        return attrs.evolve(hostile, text=valid + hostile.text)
    if where == "before":
        return attrs.evolve(hostile, text=hostile.text + valid)
    if where == "inside":
        i = draw(st.integers(0, len(valid)))
        return attrs.evolve(hostile, text=valid[:i] + hostile.text + valid[i:])
    return hostile


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def header_bytes(text: str, encoding: str) -> bytes:
    """*text* as a header value's bytes: UTF-8 (lone surrogates as their three bytes, as a careless
    encoder writes them) or latin-1 where it can be; without what h11 refuses to send (NUL, CR, LF,
    vertical tab and form feed anywhere; a space or tab at either end)."""
    if encoding == "latin-1":
        try:
            data = text.encode("latin-1")
        except UnicodeEncodeError:
            data = text.encode("utf-8", "surrogatepass")
    else:
        data = text.encode("utf-8", "surrogatepass")
    data = data.translate(None, b"\x00\r\n\x0b\x0c").strip(b" \t")
    return data or b"x"


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
              "hostile-segment", "hostile-query", "long", "root-only", "asterisk", "absolute-form")


def _quoted(text: str) -> str:
    """*text* percent-encoded as UTF-8, as clients send it (a lone surrogate as its three bytes)."""
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


@st.composite
def paths(draw: st.DrawFn, route: Route) -> tuple[str, str, Hostile | None]:
    """(request target, how it was made, the hostile string in it if any): a near miss of the
    route's path. The target is ASCII, as HTTP/1.1 requires."""
    path, _, query = route.path.partition("?")
    query = "?" + query if query else ""
    kind = draw(st.sampled_from(PATH_KINDS))
    segments = path.split("/")
    inner = [i for i, s in enumerate(segments) if s]
    hostile = None
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
    elif kind == "hostile-segment":  # in place of the last segment (a model's or a prompt's name), or after it
        hostile = draw(hostile_values(segments[-1]))
        text = _quoted(hostile.text[:2000])
        path = "/".join(segments[:-1] + [text]) if draw(st.booleans()) and inner else path + "/" + text
    elif kind == "hostile-query":
        hostile = draw(hostile_strings())
        name = draw(st.sampled_from(["filename", "clientId", "model", "type", "x"]))
        query += ("&" if query else "?") + f"{name}={_quoted(hostile.text[:2000])}"
    elif kind == "long":
        length = draw(st.sampled_from([1_000, 4_000, 8_000, 12_000, 20_000]))
        path += "/" + "a" * length
    elif kind == "root-only":
        path = "/"
    elif kind == "asterisk":  # OPTIONS' asterisk-form, with any method
        return "*", kind, None
    elif kind == "absolute-form":  # as sent to a proxy
        path = draw(st.sampled_from(["http://localhost", "http://127.0.0.1", "http://example.com"])) + path
    return path + query, kind, hostile


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
# Headers steward or an engine reads, where a hostile value goes (with a prefix that makes it look right).
HOSTILE_HEADERS = (("x-steward-class", ""), ("authorization", "Bearer "), ("x-api-key", ""),
                   ("content-type", "application/json; charset="), ("accept", ""), ("anthropic-version", ""),
                   ("anthropic-beta", ""), ("user-agent", ""), ("x-request-id", ""), ("openai-organization", ""))


@st.composite
def header_sets(draw: st.DrawFn, route: Route) -> tuple[Headers, tuple[tuple[str, str], ...]]:
    """(headers, ("header:<name>", hostile kind) for the hostile value among them if any)."""
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
                         ("x-api-key", ["fuzz"]),
                         ("anthropic-version", ["2023-06-01", "garbage"])):
        if draw(st.integers(0, 5)) == 5:  # shrinks toward absent
            headers.append((name, draw(st.sampled_from(values))))
    if draw(st.integers(0, 7)) == 7:
        name = draw(st.text(string.ascii_lowercase + "-", min_size=1, max_size=20).filter(
            lambda n: n not in ("host", "origin", "content-length", "transfer-encoding", "connection", "expect",
                                "upgrade", "te", "trailer")))
        headers.append((name, draw(_HEADER_VALUE)))
    encoded = [(k.encode(), v.encode("latin-1")) for k, v in headers]
    hostile: tuple[tuple[str, str], ...] = ()
    if draw(st.integers(0, 2)) == 2:  # a third of header sets carry a hostile value
        name, prefix = draw(st.sampled_from(HOSTILE_HEADERS))
        value = draw(hostile_strings())
        data = header_bytes(prefix + value.text[:4000], draw(st.sampled_from(["utf-8", "latin-1"])))
        encoded = [(k, v) for k, v in encoded if k != name.encode()] + [(name.encode(), data)]
        hostile = ((f"header:{name}", value.kind),)
    return tuple(encoded), hostile


JSON_TYPE = ((b"content-type", b"application/json"),)


# ---- bodies

_JSON_TEXT = st.text(ANY_CHARACTER, max_size=20)
_JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                         st.floats(allow_nan=False, allow_infinity=False), _JSON_TEXT)
JSON_VALUES = st.recursive(_JSON_LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(ANY_CHARACTER, max_size=8), inner, max_size=4)),
    max_leaves=12)
# Each placeholder is replaced by a literal json.dumps cannot write: numbers past any float or
# int64, and number literals longer than any parser expects (Python's int() stops at 4,300 digits).
_HUGE_LITERALS = {"1e999999": "1e999999", "-1e309": "-1e309", "1e-400": "1e-400", "NaN": "NaN",
                  "-Infinity": "-Infinity", "digits4000": "9" * 4000, "digits5000": "9" * 5000,
                  "2**64": str(2**64), "-2**63-1": str(-(2**63) - 1), "1.0e+30": "1.0e+30",
                  "fraction10000": "0." + "0" * 9999 + "1", "mantissa10000": "1." + "3" * 10000,
                  "exponent-digits5000": "1e" + "9" * 5000, "negative-zeros": "-0.0e-0000000000000000",
                  "max-double-plus": "1.7976931348623159e308", "min-subnormal-minus": "4.9e-325",
                  "int-4301-digits": "1" * 4301, "exponent-zeros": "1E+" + "0" * 3000 + "1"}
DEPTHS = (10, 990, 1000, 1010, 2000, 3000, 5000)  # Python's json gives up near 1000 by default


def _dumps(value: Any, escaped: bool = False) -> str:
    """*value* as JSON text: UTF-8-ready, or with every non-ASCII character escaped (``\\u00e9``), as
    it must be where a string holds a lone surrogate (UTF-8 cannot carry one)."""
    text = json.dumps(value, ensure_ascii=escaped)
    return text if escaped or not _has_surrogate(text) else json.dumps(value)


def _text_body(text: str, kind: str, how: str | None = None, hostile: str = "") -> Body:
    how = how or (repr(text) if len(text) < 400 else f"{len(text)} characters of JSON")
    return Body(text.encode("utf-8"), how, kind, hostile)


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


def _get(body: Any, location: Location) -> Any:
    """The value at *location* in *body*, or None."""
    for part in location:
        if isinstance(part, int):
            body = body[part] if isinstance(body, list) and part < len(body) else None
        else:
            body = body.get(part) if isinstance(body, dict) else None
    return body


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


def _strings_replaced(body: Any, replace: Any) -> Any:
    """*body* with every string value (not the keys) passed through *replace*."""
    if isinstance(body, str):
        return replace(body)
    if isinstance(body, list):
        return [_strings_replaced(item, replace) for item in body]
    if isinstance(body, dict):
        return {key: _strings_replaced(value, replace) for key, value in body.items()}
    return body


def _where(location: Location) -> str:
    return ".".join(str(part) for part in location)


def _nested(depth: int, kind: str) -> tuple[str, str]:
    """(JSON text nested *depth* levels deep, a Python expression for it)."""
    if kind == "array":
        return "[" * depth + "]" * depth, f"'[' * {depth} + ']' * {depth}"
    return '{"a":' * depth + "1" + "}" * depth, f"'{{\"a\":' * {depth} + '1' + '}}' * {depth}"


# Half of the mutations put a hostile string in: the one field, a field's name, or every string.
MUTATIONS = ("missing", "wrong-type", "wrong-type", "extra", "deep", "huge-number", "stream", "hostile", "hostile",
             "hostile", "hostile", "hostile-name", "hostile-name", "hostile-everywhere", "hostile-everywhere")


@st.composite
def mutated_bodies(draw: st.DrawFn, route: Route) -> Body:
    """The route's valid body with one change."""
    assert route.body is not None
    base = route.body
    location = draw(st.sampled_from(route.fields)) if route.fields else ("model",)
    action = draw(st.sampled_from(MUTATIONS))
    if action == "missing":
        return _text_body(_dumps(_delete(base, location)), action, f"valid body without {_where(location)}")
    if action == "wrong-type":
        value = draw(JSON_VALUES)
        text = _dumps(_set(base, location, value))
        return _text_body(text, action, None if len(text) < 400 else f"valid body, {_where(location)}={value!r}")
    if action == "extra":
        extra = draw(st.dictionaries(st.text(ANY_CHARACTER, min_size=1, max_size=10), JSON_VALUES, min_size=1,
                                     max_size=3))
        text = _dumps({**base, **extra} if isinstance(base, dict) else base)
        return _text_body(text, action, None if len(text) < 400 else f"valid body plus {sorted(extra)!r}")
    if action == "deep":
        depth, kind = draw(st.sampled_from(DEPTHS)), draw(st.sampled_from(["array", "object"]))
        nested, how = _nested(depth, kind)
        text = _dumps(_set(base, location, "\0DEEP\0")).replace('"\\u0000DEEP\\u0000"', nested)
        return _text_body(text, action, f"valid body with {_where(location)} = {how}")
    if action == "huge-number":
        name = draw(st.sampled_from(sorted(_HUGE_LITERALS)))
        text = _dumps(_set(base, location, "\0HUGE\0")).replace('"\\u0000HUGE\\u0000"', _HUGE_LITERALS[name])
        return _text_body(text, action, f"valid body with {_where(location)} = {name}")
    if action == "stream":
        stream = draw(st.sampled_from([True, False, None, "true", 1, [], {}]))
        return _text_body(_dumps({**base, "stream": stream}), action)
    escaped = draw(st.booleans())  # a body without surrogates goes as UTF-8 or escaped; with one, escaped
    if action == "hostile":
        hostile = draw(hostile_values(_get(base, location)))
        text = _dumps(_set(base, location, hostile.text), escaped)
        how = None if len(text) < 400 else f"valid body, {_where(location)}={hostile.text[:60]!r}..."
        return _text_body(text, action, how, hostile.kind)
    if action == "hostile-name":  # a field beside the location, named with a hostile string
        hostile = draw(hostile_strings())
        parent = location[:-1] if isinstance(location[-1], str) else location
        if not isinstance(_get(base, parent) if parent else base, dict | None):
            parent = ()
        value = _get(base, location) if draw(st.booleans()) else "x"
        text = _dumps(_set(base, (*parent, hostile.text[:2000]), value), escaped)
        how = None if len(text) < 400 else f"valid body, a field named {hostile.text[:60]!r}... in {_where(parent)}"
        return _text_body(text, action, how, hostile.kind)
    hostile = draw(hostile_strings())  # hostile-everywhere: every string of the valid body
    where = draw(st.sampled_from(["alone", "after", "before"]))
    piece = hostile.text[:3000]

    def replace(valid: str) -> str:
        return piece if where == "alone" else valid + piece if where == "after" else piece + valid

    text = _dumps(_strings_replaced(base, replace), escaped)
    how = None if len(text) < 400 else f"valid body, {piece[:60]!r}... {where} every string"
    return _text_body(text, action, how, hostile.kind)


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
        data = draw(st.sampled_from(["1", "-0", "true", "null", '"chat"', "1e999999", "9" * 5000, "NaN",
                                     '"\\ud800"', '"\\u0000"']))
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


# ---- keys


@attrs.frozen
class FuzzKey:
    """A key of the fuzzed steward's key file (written with supervisor.auth.keys by the test), its
    text known here so that a request can be sent again by hand."""

    name: str
    models: tuple[str, ...] | None = None
    classes: tuple[str, ...] | None = None
    rpm: int | None = None
    concurrency: int | None = None
    admin: bool = False

    @property
    def text(self) -> str:
        return f"{KEY_PREFIX}fuzz-{self.name}-{hashlib.sha256(self.name.encode()).hexdigest()[:24]}"


ALL_KEY = FuzzKey("all")
FUZZ_KEYS = (ALL_KEY,
             FuzzKey("embed-only", models=("embed", OLLAMA_EMBED)),  # chat, images and workflows refused: 403
             FuzzKey("batch-only", classes=("batch",)),
             FuzzKey("one-a-minute", rpm=1, concurrency=1),  # past its first request: 429
             FuzzKey("admin", admin=True))
UNKNOWN_KEY = f"{KEY_PREFIX}fuzz-unknown-{'0' * 24}"


@attrs.frozen
class Credential:
    kind: str  # how the key is sent, for counting ("bearer:all", "x-api-key:hostile", ...)
    headers: Headers
    keyed: bool | None  # carries a key of FUZZ_KEYS as the door reads it; None: the door's choice
    hostile: str = ""  # the class of hostile string sent as the key


def _bearer(text: str | bytes) -> tuple[bytes, bytes]:
    return b"authorization", b"Bearer " + (text.encode() if isinstance(text, str) else text)


@st.composite
def credentials(draw: st.DrawFn) -> Credential:
    """How a request shows its key: a valid one, half the time the unlimited one, in either header;
    or a limited one, none, an unknown one, a hostile string, or a key sent oddly."""
    form = draw(st.sampled_from(["valid", "valid", "valid", "limited", "none", "unknown", "hostile", "odd"]))
    if form == "valid":
        key, header = ALL_KEY, draw(st.sampled_from(["bearer", "bearer", "x-api-key"]))
        value = _bearer(key.text) if header == "bearer" else (b"x-api-key", key.text.encode())
        return Credential(f"{header}:{key.name}", (value,), True)
    if form == "limited":
        key = draw(st.sampled_from(FUZZ_KEYS[1:]))
        return Credential(f"bearer:{key.name}", (_bearer(key.text),), True)
    if form == "none":
        return Credential("none", (), False)
    if form == "unknown":
        header = draw(st.sampled_from(["bearer", "x-api-key"]))
        value = _bearer(UNKNOWN_KEY) if header == "bearer" else (b"x-api-key", UNKNOWN_KEY.encode())
        return Credential(f"{header}:unknown", (value,), False)
    if form == "hostile":
        hostile = draw(hostile_values(ALL_KEY.text))  # around a valid key, too: then no longer one
        header = draw(st.sampled_from(["bearer", "x-api-key"]))
        data = header_bytes(hostile.text[:4000], draw(st.sampled_from(["utf-8", "latin-1"])))
        value = _bearer(data) if header == "bearer" else (b"x-api-key", data)
        # A hostile string with nothing to send (all NUL, CR, LF) is no key; one whose bytes are the
        # key's own (only blanks around it, stripped) is the key: not told.
        keyed = None if ALL_KEY.text.encode() in data else False
        return Credential(f"{header}:hostile", (value,), keyed, hostile.kind)
    odd = draw(st.sampled_from(["lower-case-scheme", "tab-after-scheme", "basic", "bearer-alone", "empty-x-api-key",
                                "basic-and-x-api-key", "unknown-bearer-and-x-api-key", "bearer-twice"]))
    key = ALL_KEY.text.encode()
    headers, keyed = {
        "lower-case-scheme": (((b"authorization", b"bearer " + key),), True),
        "tab-after-scheme": (((b"authorization", b"Bearer \t" + key),), True),
        "basic": (((b"authorization", b"Basic " + key),), False),
        "bearer-alone": (((b"authorization", b"Bearer"),), False),
        "empty-x-api-key": (((b"x-api-key", b""),), False),
        "basic-and-x-api-key": (((b"authorization", b"Basic Zm9vOmJhcg=="), (b"x-api-key", key)), True),
        "unknown-bearer-and-x-api-key": ((_bearer(UNKNOWN_KEY), (b"x-api-key", key)), None),
        "bearer-twice": ((_bearer(key), _bearer(UNKNOWN_KEY)), None),
    }[odd]
    return Credential(f"odd:{odd}", headers, keyed)


# ---- requests

TWISTS = ("body", "body", "path", "method", "headers", "everything")
CREDENTIAL_HEADERS = (b"authorization", b"x-api-key")


@st.composite
def requests(draw: st.DrawFn, routes: Sequence[Route], limit: int, keys: bool = False) -> FuzzRequest:
    """One request for a listener with *routes* and a body size limit of *limit* bytes:
    a route's request with one thing about it changed (the body most often), or all of
    them at once. One change at a time keeps, say, a 405 for an odd method from hiding
    what the body would have done. With *keys*, for a steward with FUZZ_KEYS in force,
    the request shows a key (credentials()), whatever else changed."""
    # Routes that take a body have more to get wrong: twice as likely.
    route = draw(st.sampled_from([r for r in routes for _ in range(2 if r.body is not None else 1)]))
    twist = draw(st.sampled_from(TWISTS))
    hostile: tuple[tuple[str, str], ...] = ()
    if twist == "path" or (twist == "everything" and draw(st.booleans())):
        target, path_kind, in_path = draw(paths(route))
        hostile += (("path", in_path.kind),) if in_path is not None else ()
    else:
        target, path_kind = route.path, "exact"
    method = draw(methods(route)) if twist in ("method", "everything") else route.method
    chunked = False
    if twist in ("headers", "everything"):
        headers, in_headers = draw(header_sets(route))
        hostile += in_headers
        chunked = draw(st.integers(0, 5)) == 5
    else:
        headers = JSON_TYPE if route.body is not None else ()
    if twist in ("body", "everything"):
        body = draw(bodies(route, limit))
    elif route.body is not None:
        body = _text_body(_dumps(route.body), "valid")
    else:
        body = Body(b"", "b''", "none")
    credential, keyed = "", None
    if keys:  # the key alone decides what the door sees: other credentials drawn above go
        shown = draw(credentials())
        headers = tuple((k, v) for k, v in headers if k not in CREDENTIAL_HEADERS) + shown.headers
        hostile = tuple((where, kind) for where, kind in hostile
                        if where.removeprefix("header:").encode() not in CREDENTIAL_HEADERS)
        hostile += (("key", shown.hostile),) if shown.hostile else ()
        credential, keyed = shown.kind, shown.keyed
    return FuzzRequest(method=method, target=target.encode("ascii"), headers=headers, body=body,
                       route=f"{route.method} {route.path}", path_kind=path_kind, chunked=chunked,
                       credential=credential, keyed=keyed, hostile=hostile)


def keyed_requests(routes: Sequence[Route], limit: int) -> st.SearchStrategy[FuzzRequest]:
    """requests() for a steward with FUZZ_KEYS in force: each shows a key, or none, or a bad one."""
    return requests(routes, limit, keys=True)


# ---- inputs every run tries first


def known(method: str, target: str, body: Body | dict[str, Any] | None = None, headers: Headers = JSON_TYPE,
          credential: Credential | None = None) -> FuzzRequest:
    if isinstance(body, dict):
        body = _text_body(_dumps(body), "valid")
    if credential is not None:
        headers = headers + credential.headers
    return FuzzRequest(method, target.encode("ascii"), headers, body or Body(b"", "b''", "none"),
                       route=f"{method} {target}", path_kind="known",
                       credential=credential.kind if credential is not None else "",
                       keyed=credential.keyed if credential is not None else None)


def _hostile(route: Route, location: Location, text: str, kind: str) -> Body:
    """*route*'s valid body with *text* (of the HOSTILE_STRINGS class *kind*) at *location*, escaped."""
    assert route.body is not None
    data = _dumps(_set(route.body, location, text), escaped=True)
    return _text_body(data, "hostile", None, kind)


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


def _route(routes: Sequence[Route], method: str, path: str) -> Route:
    return next(r for r in routes if r.method == method and r.path == path)


def regressions(listener: str, limit: int) -> tuple[FuzzRequest, ...]:
    """Requests of the kinds that broke a listener before (or easily could): tried first by
    every run, whatever Hypothesis draws afterwards (with keys off)."""
    if listener == "openai":
        chat, embed = _route(OPENAI_ROUTES, "POST", "/v1/chat/completions"), _route(OPENAI_ROUTES, "POST",
                                                                                   "/v1/embeddings")
        images = _route(OPENAI_ROUTES, "POST", "/v1/images/generations")
        return (known("POST", "//v1/chat/completions", chat.body),
                known("POST", "/v1/chat/completions", _deep(1000)),
                known("POST", "/v1/chat/completions", _deep(5000, chat, "messages")),
                known("POST", "/v1/embeddings", _deep(1000, embed, "input")),
                known("POST", "/v1/chat/completions", _oversized(chat, limit)),
                known("POST", "/v1/chat/completions", Body(b'{"model": "chat\xff"}', "b'{\"model\": \"chat\\xff\"}'",
                                                           "invalid-utf8")),
                known("POST", "/v1/chat/completions", {**(chat.body or {}), "model": "chat@urgent"}),
                known("POST", "/v1/chat/completions", chat.body, ((b"x-steward-class", b"\x80\xff"),)),
                known("PUT", "/v1/chat/completions", chat.body),
                known("POST", "/v1/models"),
                known("DELETE", "/healthz"),
                known("GET", "/v1/models/" + "a" * 20_000),
                # issue 26, defect 1: a lone surrogate where steward reads or records it
                known("POST", "/v1/chat/completions", _hostile(chat, ("model",), "chat\ud800", "lone-high-surrogate")),
                known("POST", "/v1/chat/completions", _hostile(chat, ("messages", 0, "content"), "\udc00\ud800",
                                                              "reversed-surrogate-pair")),
                known("POST", "/v1/images/generations", _hostile(images, ("prompt",), "a \ud800 square",
                                                                "lone-high-surrogate")),
                known("POST", "/v1/chat/completions", _hostile(chat, ("steward", "class"), "batch\ud800",
                                                              "lone-high-surrogate")),
                known("POST", "/v1/chat/completions", chat.body, ((b"x-steward-class", b"\xed\xa0\x80"),)),
                # the long run at 16d3fd0: a path that begins as the Messages routes' is answered in their shape
                known("POST", "/v1/messages/", _route(OPENAI_ROUTES, "POST", "/v1/messages").body),
                known("POST", "/v1/messages%00", _route(OPENAI_ROUTES, "POST", "/v1/messages").body),
                known("LOCK", "//v1/messages", _route(OPENAI_ROUTES, "POST", "/v1/messages").body))
    if listener == "ollama":
        generate, chat = _route(OLLAMA_ROUTES, "POST", "/api/generate"), _route(OLLAMA_ROUTES, "POST", "/api/chat")
        openai_chat = _route(OLLAMA_ROUTES, "POST", "/v1/chat/completions")
        embed = _route(OLLAMA_ROUTES, "POST", "/api/embed")
        return (known("POST", "/api/generate", _deep(1000)),
                known("POST", "/v1/chat/completions", _deep(5000, openai_chat, "messages")),
                known("POST", "/api/tags", _oversized(generate, limit)),
                known("POST", "/api/generate", _oversized(generate, limit)),
                known("POST", "/healthz"),
                known("PUT", "/metrics"),
                known("GET", "//api/tags"),
                known("POST", "//api/generate", generate.body),
                known("POST", "/api/generate", {**(generate.body or {}), "model": f"{OLLAMA_CHAT}@urgent"}),
                known("POST", "/v1/chat/completions", {**(openai_chat.body or {}), "model": f"{OLLAMA_CHAT}@urgent"}),
                known("POST", "/api/chat", chat.body, ((b"x-steward-class", b"urgent"),)),
                # issue 26, defect 1: `{"model":"x\ud800","messages":[]}` stopped steward (the usage row)
                known("POST", "/api/chat", _text_body('{"model":"x\\ud800","messages":[]}', "hostile", None,
                                                      "lone-high-surrogate")),
                known("POST", "/api/embed", _hostile(embed, ("model",), "x\ud800", "lone-high-surrogate")),
                known("POST", "/v1/chat/completions", _hostile(openai_chat, ("model",), "x\ud800",
                                                               "lone-high-surrogate")),
                known("POST", "/api/generate", _hostile(generate, ("keep_alive",), "\udfff", "lone-low-surrogate")))
    prompt = COMFY_ROUTES[0]
    workflow = comfy_workflow()
    return (known("POST", "/healthz"),
            known("GET", "/steward/release"),
            known("DELETE", "/metrics"),
            known("POST", "/system_stats", _oversized(prompt, limit)),
            known("POST", "/prompt", _oversized(prompt, limit)),
            known("POST", "/prompt", _deep(1000)),
            known("POST", "//prompt", prompt.body),
            known("GET", "/" + "a" * 20_000),
            # issue 26: lone surrogates in what steward reads of a workflow, and in a passed-through query
            known("POST", "/prompt", _hostile(prompt, ("client_id",), "\ud800", "lone-high-surrogate")),
            known("POST", "/prompt", _hostile(prompt, ("prompt", "3", "class_type"), "K\ud800Sampler",
                                              "lone-high-surrogate")),
            known("POST", "/prompt", _text_body(_dumps({**workflow, "prompt": {"\udc00": workflow["prompt"]["3"]}},
                                                       escaped=True), "hostile", None, "lone-low-surrogate")))


def keyed_regressions(listener: str, limit: int) -> tuple[FuzzRequest, ...]:
    """As regressions(), for a steward with FUZZ_KEYS in force."""
    embed_only = FUZZ_KEYS[1]
    limited = Credential(f"bearer:{embed_only.name}", (_bearer(embed_only.text),), True)
    surrogate_key = Credential("bearer:hostile", (_bearer(b"\xed\xa0\x80"),), False, "lone-high-surrogate")
    hostile_x_api_key = Credential("x-api-key:hostile", ((b"x-api-key", "\u202e\ufeff".encode()),), False, "bidi")
    none = Credential("none", (), False)
    if listener == "openai":
        chat = _route(OPENAI_ROUTES, "POST", "/v1/chat/completions")
        images = _route(OPENAI_ROUTES, "POST", "/v1/images/generations")
        return (known("POST", "/v1/chat/completions", chat.body, credential=none),
                known("POST", "/v1/chat/completions", chat.body, credential=surrogate_key),
                known("POST", "/v1/chat/completions", chat.body, credential=hostile_x_api_key),
                known("POST", "/v1/chat/completions", chat.body, credential=limited),
                known("POST", "/v1/chat/completions", _hostile(chat, ("model",), "chat\ud800", "lone-high-surrogate"),
                      credential=limited),
                known("POST", "/v1/images/generations", images.body, credential=limited),
                known("GET", "/healthz", credential=surrogate_key))
    if listener == "ollama":
        chat = _route(OLLAMA_ROUTES, "POST", "/api/chat")
        return (known("POST", "/api/chat", chat.body, credential=none),
                known("POST", "/api/chat", chat.body, credential=limited),
                known("POST", "/api/chat", _hostile(chat, ("model",), "x\ud800", "lone-high-surrogate"),
                      credential=limited),
                known("GET", "/api/tags", credential=surrogate_key))
    prompt = COMFY_ROUTES[0]
    return (known("POST", "/prompt", prompt.body, credential=none),
            known("POST", "/prompt", prompt.body, credential=limited),  # issue 26, defect 3
            known("GET", "/system_stats", credential=hostile_x_api_key))
