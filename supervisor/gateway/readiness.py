"""``GET /healthz/models/NAME``: may a cluster's router send this model's requests here now?

A kubelet's readiness probe (or a router's health check) asks it: 200 while the model is
resident, loading, or loadable without evicting hot or busy work; 503 with the reason while
it is not (supervisor/scheduler/readiness.py says which and why); 404 for a name steward does
not serve. It is as open as ``/healthz`` (``auth.open_paths``): a probe sends no key, and it
says less than ``/healthz``, which lists every engine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from quart import Response
from quart_trio import QuartTrio

from supervisor.gateway.door import READINESS_PREFIX
from supervisor.gateway.errors import error_body
from supervisor.gateway.http.quart_app import json_error
from supervisor.scheduler.actor import SchedulerClient


def add_readiness_route(app: QuartTrio, scheduler: SchedulerClient, aliases: Mapping[str, str]) -> None:
    """*aliases*: every accepted model name -> its model (an alias is as ready as its model)."""

    @app.get(READINESS_PREFIX + "<path:name>")
    async def model_readiness(name: str) -> Response:
        target = aliases.get(name)
        readiness = None if target is None else scheduler.readiness(target)
        if readiness is None:
            return json_error(error_body, 404, f"The model '{name}' does not exist.", param="model",
                              code="model_not_found")
        body = {**readiness.to_json(), "model": name, "alias_of": None if target == name else target}
        return Response(json.dumps(body), status=200 if readiness.ready else 503, content_type="application/json")
