"""One node of the directory as the config gives it: a value, apart from the directory's
HTTP client (httpx), so that ``steward check`` reads the nodes without importing it."""

from __future__ import annotations

import attrs

from supervisor.config import WakeConfig


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be more than 0, got {value!r}")


def _without_trailing_slash(url: str) -> str:
    return url.rstrip("/")  # STATE_PATH is appended


@attrs.frozen
class NodeSpec:
    name: str
    url: str = attrs.field(converter=_without_trailing_slash)  # http://host:port
    key: str | None = None  # the node's key text (read from its key_env by the caller)
    wake: WakeConfig | None = None  # the config's own: mac, broadcast, port, timeout
    models: tuple[str, ...] | None = None  # configured: wins over what the node said when last awake
    poll: float = attrs.field(default=2.0, validator=_positive)
