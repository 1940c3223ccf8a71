"""Serving a request on the slot the scheduler granted it: the same for every listener that
queues (the OpenAI listener's inference routes, the Ollama listener's).

Wait for a slot of the model's engine, answer on it, and leave on the lease what the client
was answered: the upstream's status, or 499 when the client left before its answer ended. A
job the scheduler failed (refused, timed out in the queue, steward closing) is answered with
the scheduler's status and message, in the route's error shape.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from supervisor.gateway.http.asgi import Disconnect, Send, TrackedSend, send_error
from supervisor.gateway.door import Exchange
from supervisor.gateway.errors import ErrorShape
from supervisor.request_class import RequestClass
from supervisor.scheduler.actor import JobFailed, Lease, SchedulerClient

# Answers on a granted slot: the lease, and the client's send.
Answering = Callable[[Lease, Send], Awaitable[None]]


async def serve_granted(scheduler: SchedulerClient, exchange: Exchange, send: Send, disconnect: Disconnect, *,
                        model: str, klass: RequestClass, shape: ErrorShape, answering: Answering,
                        may_use: frozenset[str] | None = None) -> None:
    """*answering* on a slot of *model*'s engine, once the scheduler grants one (see the module
    docstring); *may_use*: the models a fallback may send it to (None: any)."""
    try:
        async with scheduler.open_grant(model, klass, account=exchange, may_use=may_use) as lease:
            tracked = TrackedSend(send)
            try:
                await answering(lease, tracked)
            finally:
                if disconnect.happened and not tracked.complete:
                    lease.status = 499  # the client left before the answer ended
    except JobFailed as exc:
        await answer_job_failed(send, exchange, exc, shape)


async def answer_job_failed(send: Send, exchange: Exchange, exc: JobFailed, shape: ErrorShape) -> None:
    """The scheduler's failure of the request's job, in *shape*; the usage row keeps its code
    (some shapes, Ollama's and Anthropic's, have no field for it)."""
    failure = exc.failure
    exchange.error = failure.code
    await send_error(send, failure.status, failure.message, shape=shape, code=failure.code,
                     retry_after=failure.retry_after)
