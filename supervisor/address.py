"""Network addresses as typed values: parsed once from config, printed the way URLs need them."""

from __future__ import annotations

import ipaddress

import attrs


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
