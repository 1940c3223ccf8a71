"""Wake-on-LAN: MAC parsing, the magic packet's bytes, and real UDP sends to a listener on loopback.

A test cannot count on receiving a real broadcast (the sandbox may have no LAN), so the
sends go to a UDP socket bound on loopback; a failing send is provoked with an address
that cannot be sent to, or with trio's custom socket factory for an error the kernel
would only give on a broken network.
"""

from __future__ import annotations

import errno
import socket

import attrs
import pytest
import trio

from supervisor.nodes.wake import MacAddress, WakeError, magic_packet, send_magic_packet

MAC = MacAddress(bytes.fromhex("aabbccddeeff"))
PACKET = magic_packet(MAC)


@pytest.mark.parametrize("text", [
    "aa:bb:cc:dd:ee:ff", "AA:BB:CC:DD:EE:FF", "AA-BB-CC-DD-EE-FF", "aa-bb-cc-dd-ee-ff", "aabb.ccdd.eeff",
    "AABB.CCDD.EEFF", "aabbccddeeff", "AaBbCcDdEeFf", "  aa:bb:cc:dd:ee:ff\n",
])
def test_the_accepted_forms_parse_to_one_address(text: str) -> None:
    mac = MacAddress.parse(text)
    assert mac == MAC
    assert str(mac) == "aa:bb:cc:dd:ee:ff"


@pytest.mark.parametrize(("value", "shown"), [
    ("aa:bb:cc:dd:ee", "'aa:bb:cc:dd:ee'"),  # too short
    ("aa:bb:cc:dd:ee:fg", "'aa:bb:cc:dd:ee:fg'"),  # not hex
    ("aa:bb:cc:dd:ee:ff:00", "'aa:bb:cc:dd:ee:ff:00'"),  # 7 bytes
    ("aabbccddeeff00", "'aabbccddeeff00'"),
    ("aa:bb-cc:dd:ee:ff", "'aa:bb-cc:dd:ee:ff'"),  # one separator throughout
    ("a:b:c:d:e:f", "'a:b:c:d:e:f'"),
    ("aabb.ccdd.eef", "'aabb.ccdd.eef'"),
    ("aa bb cc dd ee ff", "'aa bb cc dd ee ff'"),
    ("", "''"),
    (None, "None"),
    (187723572702975, "187723572702975"),  # the int of aa:bb:cc:dd:ee:ff is no MAC in a config
    (b"\xaa\xbb\xcc\xdd\xee\xff", "a bytes"),
])
def test_anything_else_is_refused_with_the_config_style_message(value: object, shown: str) -> None:
    with pytest.raises(ValueError) as caught:
        MacAddress.parse(value)
    assert str(caught.value) == f"must be a MAC address like aa:bb:cc:dd:ee:ff, got {shown}"


def test_an_address_holds_exactly_six_bytes() -> None:
    for octets in (b"", b"\x00" * 5, b"\x00" * 7):
        with pytest.raises(ValueError, match="a MAC address is 6 bytes"):
            MacAddress(octets)
    assert len({MacAddress.parse("AA-BB-CC-DD-EE-FF"), MacAddress.parse("aabb.ccdd.eeff"), MAC}) == 1


def test_the_magic_packet_is_six_ff_then_the_mac_sixteen_times() -> None:
    assert len(PACKET) == 102
    assert PACKET[:6] == b"\xff\xff\xff\xff\xff\xff"
    assert [PACKET[6 + 6 * i: 12 + 6 * i] for i in range(16)] == [b"\xaa\xbb\xcc\xdd\xee\xff"] * 16
    assert PACKET == bytes.fromhex("ff" * 6 + "aabbccddeeff" * 16)


def test_a_secureon_password_of_four_or_six_bytes_follows_the_packet() -> None:
    assert magic_packet(MAC, b"\x01\x02\x03\x04") == PACKET + b"\x01\x02\x03\x04"
    assert magic_packet(MAC, b"secret") == PACKET + b"secret"
    for password in (b"12345", b"1234567", "1234"):
        with pytest.raises(ValueError, match="a SecureOn password must be 4 or 6 bytes"):
            magic_packet(MAC, password)  # type: ignore[arg-type]


async def receive_datagrams(family: socket.AddressFamily, host: str, count: int, **send: object) -> list[bytes]:
    """Bind a UDP listener on *host*, send *MAC*'s packet to it, and return the first *count* datagrams."""
    with trio.socket.socket(family, socket.SOCK_DGRAM) as listener:
        await listener.bind((host, 0))
        port = listener.getsockname()[1]
        with trio.fail_after(10):
            await send_magic_packet(MAC, host, port, **send)  # type: ignore[arg-type]
            return [(await listener.recvfrom(2048))[0] for _ in range(count)]


async def test_the_packet_arrives_as_many_times_as_asked() -> None:
    assert await receive_datagrams(socket.AF_INET, "127.0.0.1", 3, repeat=3) == [PACKET] * 3


async def test_one_datagram_carries_the_password() -> None:
    assert await receive_datagrams(socket.AF_INET, "127.0.0.1", 1, repeat=1, password=b"secret") == [PACKET + b"secret"]


async def test_an_ipv6_address_is_sent_to_as_is() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    try:
        packets = await receive_datagrams(socket.AF_INET6, "::1", 2, repeat=2)
    except OSError as error:  # a container with IPv6 switched off cannot bind ::1
        pytest.skip(f"no IPv6 loopback here: {error}")
    assert packets == [PACKET] * 2


@pytest.mark.parametrize(("broadcast", "port", "message"), [
    ("256.0.0.1", 9, "256.0.0.1:9: must be an IP address like 192.168.1.255, got '256.0.0.1'"),
    ("nodes.lan", 9, "nodes.lan:9: must be an IP address like 192.168.1.255, got 'nodes.lan'"),
    ("", 9, ":9: must be an IP address like 192.168.1.255, got ''"),
    (None, 9, "None:9: must be an IP address like 192.168.1.255, got None"),
    ("192.168.1.255", 0, "192.168.1.255:0: the port must be 1 to 65535, got 0"),
    ("192.168.1.255", 65536, "192.168.1.255:65536: the port must be 1 to 65535, got 65536"),
    ("ff02::1", -1, "[ff02::1]:-1: the port must be 1 to 65535, got -1"),
])
async def test_an_address_that_cannot_be_sent_to_is_a_wake_error(broadcast: object, port: int, message: str) -> None:
    with pytest.raises(WakeError) as caught:
        await send_magic_packet(MAC, broadcast, port)  # type: ignore[arg-type]
    assert str(caught.value) == f"cannot send the Wake-on-LAN packet to {message}"


async def test_an_ipv6_scope_naming_no_interface_is_a_wake_error() -> None:
    with pytest.raises(WakeError, match=r"^cannot send the Wake-on-LAN packet to \[fe80::1%nosuchif0\]:9: \S"):
        await send_magic_packet(MAC, "fe80::1%nosuchif0")


@attrs.define
class UnreachableSocket:
    """A datagram socket on a host whose network is down: what the kernel says when the LAN is gone."""

    family: int
    options: list[tuple[int, int, int]] = attrs.Factory(list)
    sends: int = 0
    closed: bool = False

    def __enter__(self) -> UnreachableSocket:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.closed = True

    def setsockopt(self, level: int, option: int, value: int) -> None:
        self.options.append((level, option, value))

    async def sendto(self, data: bytes, address: tuple[str, int]) -> int:
        await trio.lowlevel.checkpoint()
        self.sends += 1
        raise OSError(errno.ENETUNREACH, "Network is unreachable")


@attrs.define
class UnreachableNetwork(trio.abc.SocketFactory):
    made: list[UnreachableSocket] = attrs.Factory(list)

    def socket(  # type: ignore[override]
        self, family: int = socket.AF_INET, type: int = socket.SOCK_DGRAM, proto: int = 0
    ) -> UnreachableSocket:
        self.made.append(UnreachableSocket(family))
        return self.made[-1]


async def test_a_send_the_network_refuses_is_a_wake_error_and_the_socket_is_closed() -> None:
    network = UnreachableNetwork()
    trio.socket.set_custom_socket_factory(network)  # a RunVar: this test's trio run only
    with pytest.raises(WakeError) as caught:
        await send_magic_packet(MAC, "192.168.1.255")
    assert str(caught.value) == "cannot send the Wake-on-LAN packet to 192.168.1.255:9: Network is unreachable"
    [sock] = network.made
    assert (sock.family, sock.options, sock.sends, sock.closed) == (
        socket.AF_INET, [(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)], 1, True)


async def test_at_least_one_packet_is_sent() -> None:
    with pytest.raises(ValueError, match="repeat must be at least 1, got 0"):
        await send_magic_packet(MAC, "127.0.0.1", 9, repeat=0)
