"""The door of every listener against browsers elsewhere: DNS rebinding and cross-site requests.

A page on another site can make a browser send "simple" requests (a form POST) to
127.0.0.1, and with DNS rebinding read the answers too. ComfyUI refuses a request whose
Origin does not match its Host; steward, in front of it and of the engines, does so on
every listener, HTTP and websocket alike:

- ``Host`` must be a name or address the listener serves: loopback names and addresses,
  its listen address (any IP address when it listens on all interfaces), this machine's
  host name, or one of ``security.allowed_hosts``. A rebinding attack arrives with the
  attacker's own name, and is refused.
- ``Origin``, when present, must be the listener's own (the page steward itself served, as
  the browser addressed it) or one of ``security.allowed_origins``, which also get the
  CORS headers a browser needs to read the answer.
Requests without ``Origin`` (every non-browser client) are not affected by the second rule.
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from supervisor.address import ANY, Address, normalize_origin
from supervisor.gateway.http.asgi import ASGI, Receive, Scope, Send, header_value, send_error, send_whole
from supervisor.gateway.errors import ErrorShape

_PREFLIGHT_MAX_AGE = b"600"


@attrs.frozen
class CrossSitePolicy:
    listen: Address
    allowed_hosts: frozenset[str] = frozenset()  # lower case
    allowed_origins: frozenset[str] = frozenset()  # normalized scheme://host:port
    local_names: frozenset[str] = frozenset()  # this machine's names

    @classmethod
    def create(cls, listen: Address, allowed_hosts: Iterable[str], allowed_origins: Iterable[str]) -> CrossSitePolicy:
        name = socket.gethostname().lower()
        origins = frozenset(ANY if o == ANY else (normalize_origin(o) or o) for o in allowed_origins)
        return cls(listen, frozenset(h.lower() for h in allowed_hosts), origins,
                   frozenset({name, f"{name}.local"}))

    def host_problem(self, host: str | None) -> str | None:
        """Why a Host header is refused, or None."""
        if host is None or ANY in self.allowed_hosts:
            return None  # HTTP/1.0 without Host: no browser sends that
        name = _host_name(host)
        if name is None:
            return f"the Host header {host!r} is not a valid host"
        if name == "localhost" or name.endswith(".localhost") or name in self.local_names:
            return None
        if name in self.allowed_hosts or name == self.listen.host.lower():
            return None
        ip = _ip(name)
        listen_ip = self.listen.ip
        if ip is not None and (ip.is_loopback or (listen_ip is not None and listen_ip.is_unspecified)):
            return None
        return (f"the Host {name!r} is not a name this listener serves; add it to security.allowed_hosts "
                f"if clients really use it")

    def origin_problem(self, origin: str | None, host: str | None) -> str | None:
        """Why an Origin header is refused, or None."""
        if origin is None:
            return None
        normalized = normalize_origin(origin)
        if normalized is not None and host is not None and normalized == normalize_origin(f"http://{host}"):
            return None  # the listener's own page
        if self.cross_origin_allowed(origin):
            return None
        return (f"a request from the page {origin!r} to this listener is cross-site; add the origin to "
                f"security.allowed_origins if it is yours")

    def cross_origin_allowed(self, origin: str) -> bool:
        return ANY in self.allowed_origins or normalize_origin(origin) in self.allowed_origins


def _host_name(host: str) -> str | None:
    try:
        parts = urllib.parse.urlsplit(f"//{host.strip()}")
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return None
    return parts.hostname or None


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def cross_site_guard(app: ASGI, policy: CrossSitePolicy, shape_for: Callable[[Scope], ErrorShape],
                     on_refused: Callable[[Scope, str], None] = lambda scope, problem: None) -> ASGI:
    """*app* behind the door: refused requests get 403 in the route's error shape (websockets: closed)."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await app(scope, receive, send)
            return
        host, origin = header_value(scope, b"host"), header_value(scope, b"origin")
        problem = policy.host_problem(host) or policy.origin_problem(origin, host)
        if problem is not None:
            on_refused(scope, problem)
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})  # before accept: hypercorn answers 403
            else:
                await send_error(send, 403, f"Forbidden: {problem}.", shape=shape_for(scope), code="cross_site")
            return
        if origin is None or not policy.cross_origin_allowed(origin) or scope["type"] != "http":
            await app(scope, receive, send)
            return
        if scope["method"] == "OPTIONS" and header_value(scope, b"access-control-request-method") is not None:
            await _answer_preflight(scope, send, origin)
            return
        await app(scope, receive, _with_cors(send, origin))

    return guarded


async def _answer_preflight(scope: Scope, send: Send, origin: str) -> None:
    headers = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin"),
               (b"access-control-allow-methods", b"GET, POST, DELETE, OPTIONS"),
               (b"access-control-max-age", _PREFLIGHT_MAX_AGE)]
    requested = header_value(scope, b"access-control-request-headers")
    if requested:
        headers.append((b"access-control-allow-headers", requested.encode("latin-1")))
    await send_whole(send, 204, headers, b"")


def _with_cors(send: Send, origin: str) -> Send:
    async def send_with_cors(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()),
                                              (b"access-control-allow-origin", origin.encode("latin-1")),
                                              (b"vary", b"Origin")]}
        await send(message)

    return send_with_cors
