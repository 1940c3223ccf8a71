"""What the listeners' apps serve with: the services the composition root (supervisor/tree.py)
started, handed over as one bundle to each listener's ``create_*_app``."""

from __future__ import annotations

import attrs

from supervisor.config import Config
from supervisor.gateway.catalog import ModelCatalog
from supervisor.gateway.door import FrontDoor
from supervisor.gateway.http.asgi import BodyLimits
from supervisor.gateway.http.gate import RequestGate
from supervisor.gateway.openai.images import ImageHandler
from supervisor.gateway.openai.videos import VideoHandler
from supervisor.gateway.remote import NodeRouter
from supervisor.observe.events import EventLog
from supervisor.observe.health import HealthWatch
from supervisor.observe.history import History
from supervisor.observe.metrics import StewardMetrics
from supervisor.reload import Reload
from supervisor.scheduler.actor import SchedulerClient


def body_limits(config: Config) -> BodyLimits:
    return BodyLimits(config.limits.max_body_size, config.limits.body_timeout)


@attrs.frozen
class Services:
    """Every listener's: the scheduler, the event log, the gate, the metrics, the front door,
    the health watch and the body limits; the OpenAI listener's alone: the rest."""

    scheduler: SchedulerClient
    events: EventLog
    gate: RequestGate
    metrics: StewardMetrics
    door: FrontDoor
    health: HealthWatch
    body_limits: BodyLimits
    device: str = "gpu"  # where the engines' memory lives: "gpu", or "cpu" for host RAM (tree.memory_device)
    nodes: NodeRouter | None = None  # a front door's: the nodes it routes to
    catalog: ModelCatalog | None = None  # default: the config's own (no reload replaces it)
    reload: Reload | None = None  # /steward/reload, where the config came from a file
    images: ImageHandler | None = None  # /v1/images/generations, with a comfyui section and an image model
    videos: VideoHandler | None = None  # /v1/videos, with a comfyui section
    history: History | None = None  # the last hour, sampled (/admin/history, /ui); None: no sampler runs
    usage_db: str | None = None  # the usage log /ui reports from
