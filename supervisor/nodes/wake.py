"""Wake-on-LAN: the packet that wakes a sleeping node, and the one-shot task that sends it.

A *magic packet* is six 0xFF bytes followed by the target's MAC address sixteen times
(102 bytes), optionally followed by a 4- or 6-byte SecureOn password. A sleeping NIC does
not run an IP stack: it scans every frame it sees for that pattern, whatever the
protocol, so the usual carrier is a UDP datagram to port 9 (discard) or port 7 (echo).
The port does not matter to the NIC; 9 is the common default because a host that happens
to be awake throws the datagram away, where 7 would echo it back.

Why broadcast: a sleeping machine answers no ARP, so a unicast IPv4 datagram to it never
leaves the sender (no MAC to address the frame to). A broadcast frame reaches every NIC
on the segment. That means the front door and the node must share a broadcast domain
(the same LAN/VLAN) for ``255.255.255.255``; across a router, use the node subnet's
directed broadcast address (``192.168.20.255``, if the router forwards it) or a relay on
the node's LAN. IPv6 has no broadcast: an IPv6 ``broadcast`` is sent to as is, over
AF_INET6, which is useful for the link-local all-nodes multicast ``ff02::1%eth0``.
Host names are refused: the packet goes to an address, and a name of a sleeping host
would resolve to the one address that cannot be reached.

Why repeats: UDP is fire and forget, and nothing answers a magic packet, so a few copies
a moment apart cover a dropped datagram. Whether the node woke is for the caller to see
(its steward starts answering).

The node must have Wake-on-LAN enabled on its NIC (``ethtool -s eth0 wol g``, made
persistent by the distribution's network configuration) and in its firmware.
"""

from __future__ import annotations

import ipaddress
import socket

import trio

from supervisor.address import MacAddress
from supervisor.units import show

_SYNC = b"\xff" * 6
_PASSWORD_LENGTHS = (0, 4, 6)
# Long enough for a busy switch queue to drain, short enough that waking is not held up.
_REPEAT_GAP = 0.05


class WakeError(Exception):
    """The magic packet could not be sent; the message says where to and why."""


def magic_packet(mac: MacAddress, password: bytes = b"") -> bytes:
    """The 102-byte packet that wakes *mac*, with a SecureOn *password* (4 or 6 bytes) if the NIC wants one."""
    if not isinstance(password, bytes) or len(password) not in _PASSWORD_LENGTHS:
        raise ValueError(f"a SecureOn password must be 4 or 6 bytes, got {password!r}")
    return _SYNC + mac.octets * 16 + password


async def send_magic_packet(
    mac: MacAddress, broadcast: str = "255.255.255.255", port: int = 9, *, repeat: int = 3, password: bytes = b""
) -> None:
    """Send *mac*'s magic packet *repeat* times to *broadcast*:*port* over UDP; raises WakeError.

    *broadcast* is an IP address: an IPv4 broadcast (limited or directed) or any IPv4
    address, or an IPv6 address (sent to as is; ``ff02::1%eth0`` for the whole link).
    """
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    packet = magic_packet(mac, password)
    # The brackets keep an IPv6 address apart from its port, as in a URL.
    destination = f"[{broadcast}]:{port}" if ":" in str(broadcast) else f"{broadcast}:{port}"
    try:
        family = _family(broadcast)
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise ValueError(f"the port must be 1 to 65535, got {show(port)}")
    except ValueError as error:
        raise WakeError(f"cannot send the Wake-on-LAN packet to {destination}: {error}") from None
    try:
        with trio.socket.socket(family, socket.SOCK_DGRAM) as sock:
            if family == socket.AF_INET:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
            for attempt in range(repeat):
                if attempt:
                    await trio.sleep(_REPEAT_GAP)
                await sock.sendto(packet, (broadcast, port))
    except OSError as error:  # also socket.gaierror: an IPv6 scope naming no interface
        reason = error.strerror or str(error)
        raise WakeError(f"cannot send the Wake-on-LAN packet to {destination}: {reason}") from error


def _family(address: str) -> socket.AddressFamily:
    # Only text: ipaddress would take an int (3232235775 is 192.168.0.255) without a word.
    try:
        if not isinstance(address, str):
            raise ValueError
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise ValueError(f"must be an IP address like 192.168.1.255, got {show(address)}") from None
    return socket.AF_INET6 if ip.version == 6 else socket.AF_INET


__all__ = ["MacAddress", "WakeError", "magic_packet", "send_magic_packet"]
