"""The one cattrs converter, and the structure hook of each typed value of the schema.

A hook refuses what its key cannot take with a ValueError that starts with "must", which
``loading`` shows after the key's path, e.g. ``models.chat.parallel: must be a positive
integer, got 'two'``.
"""

from __future__ import annotations

import enum
import json
import re
import urllib.parse
from collections.abc import Callable
from typing import Any, Literal, get_args, get_origin

import attrs
import cattrs
import cattrs.cols

from supervisor.accounting.cpu_share import MAX_CPU, CpuSet
from supervisor.address import Address, MacAddress
from supervisor.config.schema import (
    Count,
    DeviceIndex,
    Duration,
    EnvName,
    Fraction,
    Host,
    ImageSize,
    ListenAddress,
    ModelConfig,
    NodeAddress,
    Port,
    PositiveDuration,
    PositiveInt,
    Price,
    RemoteUrl,
    Size,
    SlowdownFactor,
    UpstreamAddress,
)
from supervisor.safe_text import encodes
from supervisor.units import is_host, parse_duration, parse_size, show


def _structure_size(value: Any, _: Any) -> int:
    return parse_size(value)


def _structure_duration(value: Any, _: Any) -> float:
    return parse_duration(value)


def _structure_positive_duration(value: Any, _: Any) -> float:
    seconds = parse_duration(value)
    if seconds > 0:
        return seconds
    raise ValueError(f"must be a positive duration like 1s or 250ms, got {show(value)}")


def _structure_image_size(value: Any, _: Any) -> str:
    if isinstance(value, str) and (match := re.fullmatch(r"([1-9][0-9]{0,5})x([1-9][0-9]{0,5})", value)):
        return f"{match.group(1)}x{match.group(2)}"
    raise ValueError(f"must be WIDTHxHEIGHT like 1024x1024, got {show(value)}")


# Counts go where sizes go (C's 64-bit integers: a deque's maxlen, SQLite, JSON readers): 10**100 is no setting.
_COUNT_LIMIT = 2**63


def _structure_positive_int(value: Any, _: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < _COUNT_LIMIT:
        return value
    raise ValueError(f"must be a positive integer{_below_limit(value)}, got {show(value)}")


def _structure_count(value: Any, _: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _COUNT_LIMIT:
        return value
    raise ValueError(f"must be a whole number, 0 or more{_below_limit(value)}, got {show(value)}")


def _below_limit(value: Any) -> str:
    return " less than 2**63" if isinstance(value, int) and value >= _COUNT_LIMIT else ""


def _structure_port(value: Any, _: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 65535:
        return value
    raise ValueError(f"must be a port number 1..65535, got {show(value)}")


def _structure_device_index(value: Any, _: Any) -> int:
    if isinstance(value, str) and value.isdigit():
        value = int(value)  # a YAML mapping key may come quoted
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(f"must be a device index like 0 or 1, got {show(value)}")


def _structure_host(value: Any, _: Any) -> str:
    if isinstance(value, str) and is_host(value):
        return value
    raise ValueError(f"must be an IP address or a host name, got {show(value)}")


# An IPv6 host goes in brackets: in `::1:8080` no one can tell where the address ends.
_HOST_PORT = re.compile(r"(?:\[(?P<v6>[^\]]*)\]|(?P<host>[^:\[\]]*)):(?P<port>[0-9]+)")


def _address_hook(lowest_port: int, note: str) -> Callable[[Any, Any], Address]:
    """HOST:PORT (IPv6 in brackets) into a typed Address, parsed once here."""

    def structure(value: Any, _: Any) -> Address:
        match = _HOST_PORT.fullmatch(value) if isinstance(value, str) else None
        if match is None:
            raise ValueError(f"must be HOST:PORT like 127.0.0.1:8080, got {show(value)}")
        v6, host, port = match.group("v6", "host", "port")
        if not (is_host(host) if v6 is None else ":" in v6 and is_host(v6)):
            raise ValueError(f"must have an IP address or a host name before the port, got {show(value)}")
        if len(port) > 5 or not lowest_port <= int(port) <= 65535:
            raise ValueError(f"must have a port {lowest_port}..65535 after the host{note}, got {show(value)}")
        return Address(host if v6 is None else v6, int(port))

    return structure


def _structure_node_address(value: Any, _: Any) -> Address:
    if isinstance(value, str) and value.startswith("http://"):
        return _address_hook(1, "")(value.removeprefix("http://").rstrip("/"), None)
    if isinstance(value, str) and value.startswith("https://"):
        raise ValueError(f"must be http://HOST:PORT (steward speaks plain HTTP to its nodes; put TLS in a "
                         f"tunnel or VPN between them), got {show(value)}")
    raise ValueError(f"must be a node's URL like http://192.168.1.20:8080, got {show(value)}")


def _structure_remote_url(value: Any, _: Any) -> str:
    """A cloud API's base URL: https, or plain http to this machine only (a key must never cross
    a network in clear text)."""
    if not isinstance(value, str):
        raise ValueError(f"must be an API's base URL like https://api.openai.com/v1, got {show(value)}")
    parsed = urllib.parse.urlsplit(value)
    try:
        port = parsed.port
    except ValueError:
        port = -1
    if (parsed.scheme not in ("https", "http") or not parsed.hostname or port == -1 or parsed.query
            or parsed.fragment or parsed.username is not None or parsed.password is not None):
        raise ValueError(f"must be an API's base URL like https://api.openai.com/v1, got {show(value)}")
    if parsed.scheme == "http" and not Address(parsed.hostname, port or 80).is_loopback:
        raise ValueError(f"must be https:// (http:// only to a loopback address: the key would cross the network "
                         f"in clear text), got {show(value)}")
    return value.rstrip("/")


def _structure_env_name(value: Any, _: Any) -> str:
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
        return value
    raise ValueError(f"must be the name of an environment variable, got {show(value)}")


def _structure_price(value: Any, _: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1e9:
        return float(value)
    raise ValueError(f"must be a price per million tokens, 0 or more (e.g. 0.15), got {show(value)}")


def _structure_mac(value: Any, _: Any) -> MacAddress:
    return MacAddress.parse(value)


def _structure_slowdown_factor(value: Any, _: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and (value == 0 or 1 <= value < 1e6):
        return float(value)
    raise ValueError(f"must be a factor of 1 or more (how many times slower than alone, e.g. 3), or 0 for off, "
                     f"got {show(value)}")


def _structure_fraction(value: Any, _: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1:
        return float(value)
    if isinstance(value, str) and value.endswith("%"):
        try:
            return _structure_fraction(float(value[:-1]) / 100, _)
        except ValueError:
            pass
    raise ValueError(f"must be a fraction in (0, 1] such as 0.1 or 10%, got {show(value)}")


def _structure_str(value: Any, _: Any) -> str:
    # YAML reads `8080` or `yes` as int/bool; a command-line argument is text.
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        return _passable(str(value))
    raise ValueError(f"must be a string, got {show(value)}")


def _passable(text: str, where: str = "") -> str:
    """*text*, if it can go where every string of a config may end up: an engine's argv or
    environment (exec takes no NUL), a file path, a URL, an event, a UTF-8 terminal. YAML's
    escapes can write a NUL (``"\\0"``) and a lone surrogate (``"\\ud800"``); both are refused here,
    once for every key, so that `steward run` never meets them at an engine's first start."""
    if "\0" in text:
        raise ValueError(f"must not contain a NUL character (an argument, a path or the environment cannot "
                         f"hold one), got {show(text)}{where}")
    if not encodes(text):
        surrogate = next(char for char in text if not encodes(char))
        raise ValueError(f"must be text UTF-8 can write; it holds the lone surrogate {surrogate!r}, got "
                         f"{show(text)}{where}")
    return text


def _structure_bool(value: Any, _: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise ValueError(f"must be true or false, got {show(value)}")


def _structure_command(value: Any, _: Any) -> list[str]:
    if isinstance(value, str) and value.strip():
        return [_passable(value)]
    if isinstance(value, list) and value and all(isinstance(part, str) for part in value):
        return [_passable(part, f" (item [{i}])" if len(value) > 1 else "") for i, part in enumerate(value)]
    raise ValueError(f"must be a program path or a non-empty list of strings, got {show(value)}")


def _structure_threads(value: Any, _: Any) -> int | None:
    if value is None or value == "auto":
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_CPU:
        return value
    raise ValueError(f"must be auto or a number of threads 1..{MAX_CPU}, got {show(value)}")


def _structure_cpus(value: Any, _: Any) -> CpuSet:
    return CpuSet.parse(value)


def _optional(structure: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def optional(value: Any, type_: Any) -> Any:
        return None if value is None else structure(value, type_)

    return optional


def _literal_hook(type_: Any, _: cattrs.Converter) -> Callable[[Any, Any], Any]:
    choices = get_args(type_)

    def structure(value: Any, _: Any) -> Any:
        if any(type(value) is type(choice) and value == choice for choice in choices):
            return value
        raise ValueError(f"must be one of {', '.join(map(repr, choices))}, got {show(value)}")

    return structure


def _structure_enum(value: Any, type_: type[enum.Enum]) -> Any:
    """A member of the enum *type_*, named by its value; refused like a Literal's (the choices named)."""
    if isinstance(value, type_):
        return value
    choices = [member.value for member in type_]
    if any(type(value) is type(choice) and value == choice for choice in choices):
        return type_(value)
    raise ValueError(f"must be one of {', '.join(map(repr, choices))}, got {show(value)}")


def _shaped(shape: type, structure: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """*structure*, for values of the YAML shape it needs: cattrs takes any iterable as a list
    (`aliases: gpt-4o` would be six one-letter aliases) and fails obscurely on a non-mapping."""

    def guarded(value: Any, type_: Any) -> Any:
        if isinstance(value, shape):
            return structure(value, type_)
        raise ValueError(_wrong_shape(shape, value))

    return guarded


def _wrong_shape(shape: type, value: object) -> str:
    if shape is dict:
        return f"must be a mapping of keys, got {show(value)}"
    if isinstance(value, str):
        example = json.dumps([word.strip(",") for word in value[:60].split()], ensure_ascii=False)
        return f"must be a list like {example}, got a string {show(value)}"
    return f"must be a list, got {show(value)}"


def make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    converter.register_structure_hook(Size, _structure_size)
    converter.register_structure_hook(Duration, _structure_duration)
    converter.register_structure_hook(PositiveDuration, _structure_positive_duration)
    converter.register_structure_hook(PositiveInt, _structure_positive_int)
    converter.register_structure_hook(Count, _structure_count)
    converter.register_structure_hook(Port, _structure_port)
    converter.register_structure_hook(DeviceIndex, _structure_device_index)
    converter.register_structure_hook(Host, _structure_host)
    converter.register_structure_hook(ListenAddress, _address_hook(0, " (0: any free one)"))
    converter.register_structure_hook(UpstreamAddress, _address_hook(1, ""))
    converter.register_structure_hook(NodeAddress, _structure_node_address)
    converter.register_structure_hook(MacAddress, _structure_mac)
    converter.register_structure_hook(RemoteUrl, _structure_remote_url)
    converter.register_structure_hook(EnvName, _structure_env_name)
    converter.register_structure_hook(Price, _structure_price)
    converter.register_structure_hook(Fraction, _structure_fraction)
    converter.register_structure_hook(SlowdownFactor, _structure_slowdown_factor)
    converter.register_structure_hook(ImageSize, _structure_image_size)
    converter.register_structure_hook(str, _structure_str)
    converter.register_structure_hook(bool, _structure_bool)
    converter.register_structure_hook_factory(lambda t: get_origin(t) is Literal, _literal_hook)
    # By the enum's class (a StrEnum's str base would otherwise take its values unchecked).
    converter.register_structure_hook(enum.Enum, _structure_enum)
    converter.register_structure_hook(enum.StrEnum, _structure_enum)
    converter.register_structure_hook_factory(
        lambda t: get_origin(t) is list, lambda t, c: _shaped(list, cattrs.cols.list_structure_factory(t, c)))
    converter.register_structure_hook_factory(
        lambda t: get_origin(t) is dict, lambda t, c: _shaped(dict, cattrs.cols.mapping_structure_factory(t, c)))
    converter.register_structure_hook_factory(attrs.has, lambda t, c: _shaped(dict, c.gen_structure_attrs_fromdict(t)))
    # `command` is the one field that takes either form; a hook on the field keeps it local.
    model_hook = cattrs.gen.make_dict_structure_fn(
        ModelConfig, converter, _cattrs_forbid_extra_keys=True,
        command=cattrs.gen.override(struct_hook=_optional(_structure_command)),
        threads=cattrs.gen.override(struct_hook=_structure_threads),
        cpus=cattrs.gen.override(struct_hook=_optional(_structure_cpus)),
    )
    converter.register_structure_hook(ModelConfig, _shaped(dict, model_hook))
    return converter


converter = make_converter()
