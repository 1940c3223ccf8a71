"""Network addresses as typed values: parsed once from config, printed the way URLs need them
(a MAC address the way Wake-on-LAN and people write it)."""

from __future__ import annotations

import ipaddress
import re
import socket
import urllib.parse

import attrs

from supervisor.units import show


@attrs.frozen
class Address:
    host: str  # a name or an IP address, without brackets
    port: int

    @classmethod
    def parse(cls, text: str) -> Address:
        """``HOST:PORT`` or ``[V6]:PORT``; raises ValueError."""
        host, sep, port = text.rpartition(":")
        if not sep or not port.isdigit() or not host:
            raise ValueError(f"must be HOST:PORT like 127.0.0.1:8080, got {text!r}")
        return cls(host.strip("[]"), int(port))

    @property
    def is_ipv6(self) -> bool:
        return ":" in self.host

    @property
    def ip(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None

    @property
    def is_loopback(self) -> bool:
        """Only this machine can reach it (a host name other than localhost might resolve anywhere)."""
        if self.host.lower() in ("localhost", "localhost."):
            return True
        ip = self.ip
        return ip is not None and ip.is_loopback

    @property
    def url(self) -> str:
        return f"http://{self}"

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if self.is_ipv6 else f"{self.host}:{self.port}"


# Two hex digits six times with one separator throughout, Cisco's dotted quads, or bare.
_MAC_FORMS = (
    re.compile(r"[0-9a-f]{2}(?::[0-9a-f]{2}){5}", re.IGNORECASE),
    re.compile(r"[0-9a-f]{2}(?:-[0-9a-f]{2}){5}", re.IGNORECASE),
    re.compile(r"[0-9a-f]{4}(?:\.[0-9a-f]{4}){2}", re.IGNORECASE),
    re.compile(r"[0-9a-f]{12}", re.IGNORECASE),
)


def _six_bytes(instance: object, attribute: attrs.Attribute[bytes], value: bytes) -> None:
    if not isinstance(value, bytes) or len(value) != 6:
        raise ValueError(f"a MAC address is 6 bytes, got {value!r}")


@attrs.frozen
class MacAddress:
    octets: bytes = attrs.field(validator=_six_bytes)

    @classmethod
    def parse(cls, text: object) -> MacAddress:
        """``aa:bb:cc:dd:ee:ff``, ``AA-BB-CC-DD-EE-FF``, ``aabb.ccdd.eeff`` or ``aabbccddeeff``; raises ValueError."""
        if isinstance(text, str) and any(form.fullmatch(text.strip()) for form in _MAC_FORMS):
            return cls(bytes.fromhex(re.sub(r"[:.-]", "", text.strip())))
        raise ValueError(f"must be a MAC address like aa:bb:cc:dd:ee:ff, got {show(text)}")

    def __str__(self) -> str:
        return self.octets.hex(":")


ANY = "*"  # allowed_hosts / allowed_origins: every one


def normalize_origin(origin: str) -> str | None:
    """``scheme://host:port`` with the default port spelled out; None if it is not an origin."""
    try:
        parts = urllib.parse.urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    port = port or (443 if parts.scheme == "https" else 80)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}:{port}"


def pick_port(host: str) -> int:
    """A port that is free right now (the engine may still lose a race; then it fails and restarts)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
