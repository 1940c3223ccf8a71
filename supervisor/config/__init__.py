"""The YAML config, structured into attrs classes by one cattrs converter.

One module per role:

- ``schema``: the attrs classes (one per section) and the typed values their keys take;
- ``hooks``: the converter, with one structure hook per typed value;
- ``loading``: the file, its YAML, structured and checked; every error names the key path and
  what is wrong, e.g. ``models.chat.parallel: must be a positive integer, got 'two'``;
- ``checks``: what the keys mean together, checked once the config is structured.

The config depends on no service it configures (scheduler, nodes, engines): those read it
(supervisor/config_policy.py turns it into their specs). Every public name is here, so
``from supervisor.config import Config`` is how the rest of steward reads it.
"""

from supervisor.config.checks import check_semantics
from supervisor.config.hooks import converter, make_converter
from supervisor.config.loading import (
    ConfigError,
    _describe,  # simulate/scenario.py words its errors the same way
    load_config,
    load_config_for_command,
    parse_config,
    resolve_paths,
    workflow_problems,
)
from supervisor.config.schema import (
    COMFYUI_SCOPE,
    IMAGE_RUNTIME,
    OLLAMA_ENGINE,
    PORT_PLACEHOLDER,
    AlertsConfig,
    ApiName,
    AuthConfig,
    ClassConfig,
    ClassesConfig,
    ComfyConfig,
    Config,
    Count,
    DeviceConfig,
    DeviceIndex,
    Duration,
    EngineDefaults,
    Fraction,
    GpuConfig,
    HealthConfig,
    Host,
    ImageModelConfig,
    ImageSize,
    LimitsConfig,
    ListenAddress,
    LogConfig,
    LogLevel,
    FallbackConfig,
    ModelConfig,
    NodeAddress,
    NodeConfig,
    OllamaConfig,
    Port,
    PositiveDuration,
    PositiveInt,
    PriceConfig,
    ProbeName,
    REMOTE_RUNTIME,
    RemoteModelConfig,
    RuntimeName,
    SchedulerConfig,
    SecurityConfig,
    Size,
    SleepConfig,
    SleepLevel,
    SlowdownFactor,
    ThreadCount,
    UpstreamAddress,
    UsageConfig,
    VideoSpec,
    VideosConfig,
    WakeConfig,
)

__all__ = [
    "COMFYUI_SCOPE", "IMAGE_RUNTIME", "OLLAMA_ENGINE", "PORT_PLACEHOLDER", "AlertsConfig", "ApiName", "AuthConfig",
    "ClassConfig", "ClassesConfig", "ComfyConfig", "Config", "ConfigError", "Count", "DeviceConfig",
    "DeviceIndex", "Duration", "EngineDefaults", "FallbackConfig", "Fraction", "GpuConfig", "HealthConfig", "Host", "ImageModelConfig",
    "ImageSize", "LimitsConfig", "ListenAddress", "LogConfig", "LogLevel", "ModelConfig", "NodeAddress",
    "NodeConfig", "OllamaConfig", "Port", "PositiveDuration", "PositiveInt", "PriceConfig", "ProbeName",
    "REMOTE_RUNTIME", "RemoteModelConfig", "RuntimeName",
    "SchedulerConfig", "SecurityConfig", "Size", "SleepConfig", "SleepLevel", "SlowdownFactor", "ThreadCount",
    "UpstreamAddress", "UsageConfig", "VideoSpec", "VideosConfig", "WakeConfig", "_describe", "check_semantics", "converter", "load_config",
    "load_config_for_command", "make_converter", "parse_config", "resolve_paths", "workflow_problems",
]
