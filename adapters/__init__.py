"""One module per runtime. ``RUNTIMES`` maps a model's ``runtime`` key to its adapter."""

from collections.abc import Callable

from adapters.base import EngineUsage, LogReader, Residence, Runtime
from adapters.llama_server import LlamaServerRuntime
from adapters.ollama import OllamaRuntime
from adapters.openai import OpenAIRuntime
from supervisor.config import ModelConfig

RUNTIMES: dict[str, Callable[[ModelConfig], Runtime]] = {
    "llama-server": LlamaServerRuntime,
    "openai": OpenAIRuntime,
}


def model_runtime(model: ModelConfig) -> Runtime:
    return RUNTIMES[model.runtime](model)


__all__ = ["RUNTIMES", "EngineUsage", "LlamaServerRuntime", "LogReader", "OllamaRuntime", "OpenAIRuntime",
           "Residence", "Runtime", "model_runtime"]
