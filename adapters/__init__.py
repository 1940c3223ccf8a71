"""One module per runtime. ``ADAPTERS`` maps a config's ``runtime`` to its adapter."""

from adapters.base import RuntimeAdapter
from adapters.llama_server import LlamaServerAdapter

ADAPTERS: dict[str, RuntimeAdapter] = {"llama-server": LlamaServerAdapter()}

__all__ = ["ADAPTERS", "LlamaServerAdapter", "RuntimeAdapter"]
