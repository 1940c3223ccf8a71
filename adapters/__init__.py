"""One module per runtime. ``RUNTIMES`` maps a model's ``runtime`` key to its adapter.

The service drives the runtimes; they import only leaf modules of supervisor/ (the rule and its
allow-list: tests/test_layout_imports.py)."""

from collections.abc import Callable

from adapters.base import EngineUsage, LogReader, Residence, Runtime
from adapters.llama_server import LlamaServerRuntime
from adapters.ollama import OllamaRuntime
from adapters.openai import OpenAIRuntime
from supervisor.apis import Api
from supervisor.config.schema import ModelConfig

RUNTIMES: dict[str, Callable[[ModelConfig], Runtime]] = {
    "llama-server": LlamaServerRuntime,
    "openai": OpenAIRuntime,
}


def model_runtime(model: ModelConfig) -> Runtime:
    return RUNTIMES[model.runtime](model)


def model_apis(model: ModelConfig) -> frozenset[Api]:
    """The APIs a model serves: its config's ``serves``, else what its runtime serves with its args."""
    if model.serves:
        return frozenset(Api(name) for name in model.serves)
    return model_runtime(model).apis


__all__ = ["RUNTIMES", "EngineUsage", "LlamaServerRuntime", "LogReader", "OllamaRuntime", "OpenAIRuntime",
           "Residence", "Runtime", "model_apis", "model_runtime"]
