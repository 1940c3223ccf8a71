"""Alerts to the operator's phone: a POST to an ntfy-compatible webhook when capacity stops being enough.

Two kinds of trouble are worth a buzz: steward is overloaded (it turns requests away for
capacity, or its health enters ``overloaded``) and an engine is crash-looping. Both are
read from the event log: ``Alerter.observe`` is one of its listeners.

The rule is one buzz per incident. An overload is an incident from the first capacity
rejection after a quiet period (none in the last ``min_interval``) for as long as
rejections keep coming, however long that is; health entering ``overloaded`` belongs to
the same incident, so it shares the kind and its ``min_interval``. A crash loop is an
incident from the ``crash_loop``-th crash in a row of one engine until its count starts
again. On top of that, at most one alert per kind (and engine) goes out per ``min_interval``.

The decisions are pure (``AlertPolicy``: explicit times, no I/O), so hours of incidents are
tested in microseconds. ``observe`` runs inside ``EventLog.emit``: it decides at once,
and hands an alert to the sender task through a small bounded queue without waiting, so
no request ever waits for an alert. The sender (``serve_alerts``) posts them one after
another, each POST bounded by a timeout and retried a few times; whatever the webhook
does (slow, closed, 500, a redirect, garbage), the outcome is an event, never a crash.
"""

from __future__ import annotations

import contextlib
import enum
import unicodedata
from collections.abc import Sequence
from typing import Any

import attrs
import httpx
import trio

from supervisor.backoff import Backoff
from supervisor.observe.events import Event, EventLog
from supervisor.units import format_duration, format_elapsed

# Rejections that say capacity is not enough (``shutting_down`` says steward is stopping).
CAPACITY_REASONS = frozenset({"queue_full", "insufficient_memory", "engine_failed", "engine_start_failed",
                              "queue_timeout"})
OVERLOADED = "overloaded"
# Alerts are rare (one per kind per min_interval): a full queue means the webhook is stuck.
QUEUE_SIZE = 16
RETRY = Backoff(initial=1.0, maximum=8.0)
HEADER_MAX = 200
DETAIL_MAX = 500

_REASON_TEXT = {
    "queue_full": "its class's queue is full",
    "queue_timeout": "it waited its class's whole queue_timeout",
    "insufficient_memory": "its model can never fit in the GPU memory steward manages",
    "engine_start_failed": "its engine failed to start",
    "engine_failed": "its engine failed and restarts too late",
}


class AlertKind(enum.Enum):
    OVERLOAD = "overload"
    CRASH_LOOP = "crash_loop"


class Priority(enum.Enum):
    """ntfy's names for a message's priority."""

    DEFAULT = "default"
    HIGH = "high"
    URGENT = "urgent"


class Suppression(enum.Enum):
    """Why a trigger sent no alert."""

    WITHIN_MIN_INTERVAL = "within_min_interval"  # one of this kind (and engine) went out less than min_interval ago
    # The incident was already told: a rejection with no quiet period before it, a crash loop still counting.
    ONGOING = "ongoing"


@attrs.frozen
class Alert:
    kind: AlertKind
    title: str
    body: str
    priority: Priority
    tags: tuple[str, ...]
    engine: str | None = None

    def headers(self) -> dict[str, str]:
        """ntfy's headers: single-line ASCII, whatever an engine's name or output holds."""
        tags = (_header_value(tag).replace(",", " ") for tag in self.tags)
        return {"Title": _header_value(self.title) or "steward", "Priority": self.priority.value,
                "Tags": ",".join(tag for tag in tags if tag), "Content-Type": "text/plain; charset=utf-8"}

    def payload(self) -> bytes:
        # "replace": an engine's last words may hold lone surrogates (undecodable output).
        return self.body.encode("utf-8", "replace")


@attrs.frozen
class Suppressed:
    kind: AlertKind
    reason: Suppression
    engine: str | None = None


@attrs.define
class AlertPolicy:
    """What to tell the operator, and when. Pure: every call says what time it is."""

    min_interval: float = 600.0
    crash_loop: int = 3
    _last_alert: dict[tuple[AlertKind, str | None], float] = attrs.field(factory=dict, init=False)
    _last_rejection: float | None = attrs.field(default=None, init=False)
    # Engine -> its failure count when its crash loop was told; a count that is not higher is a new loop.
    _loops_told: dict[str, int] = attrs.field(factory=dict, init=False)

    def on_rejection(self, now: float, reason: str, klass: str, model: str | None, *,
                     waited_s: float | None = None) -> Alert | Suppressed | None:
        """A request was refused; None unless it was refused for capacity."""
        if reason not in CAPACITY_REASONS:
            return None
        previous, self._last_rejection = self._last_rejection, now
        if previous is not None and now - previous <= self.min_interval:
            return Suppressed(AlertKind.OVERLOAD, Suppression.ONGOING)
        article = "An" if klass[:1].lower() in "aeiou" else "A"
        request = f"{article} {klass} request" + (f" for {model}" if model else "")
        waited = f" It waited {format_duration(round(waited_s, 3))}." if waited_s is not None else ""
        since = ("the first since steward started" if previous is None
                 else f"the first in {format_elapsed(now - previous)}")
        body = (f"{request} was rejected: {_REASON_TEXT[reason]} ({reason}).{waited}\n"
                f"This capacity rejection is {since}; more without a {format_duration(self.min_interval)} "
                f"pause send no alert.\nLook at /healthz and the reject and timeout events in the event log.")
        return self._unless_recent(now, Alert(AlertKind.OVERLOAD, f"Steward is rejecting {klass} requests", body,
                                              Priority.HIGH, ("warning", "steward")))

    def on_health(self, now: float, status: str, previous: str | None,
                  reasons: Sequence[str]) -> Alert | Suppressed | None:
        """Steward's health changed; None unless it entered ``overloaded``."""
        if status != OVERLOADED or previous == OVERLOADED:
            return None
        because = "; ".join(reasons) or "no reason given"
        body = (f"Steward's health went from {previous or 'unknown'} to overloaded: {because}.\n"
                f"Look at /healthz and the event log.")
        return self._unless_recent(now, Alert(AlertKind.OVERLOAD, "Steward is overloaded", body, Priority.HIGH,
                                              ("warning", "steward")))

    def on_crash(self, now: float, engine: str, failures: int, detail: str) -> Alert | Suppressed | None:
        """An engine crashed, its *failures*-th time in a row; None until that is a crash loop."""
        if failures < self.crash_loop:
            self._loops_told.pop(engine, None)  # its count started again: that loop is over
            return None
        told = self._loops_told.get(engine)
        if told is not None and failures > told:
            return Suppressed(AlertKind.CRASH_LOOP, Suppression.ONGOING, engine)
        # Not told yet, or a new loop whose count started again (at 1, with crash_loop 1).
        self._loops_told.pop(engine, None)
        last = detail if len(detail) <= DETAIL_MAX else detail[: DETAIL_MAX - 3] + "..."
        body = (f"Engine {engine} crashed {failures} times in a row. The last time: {last}\n"
                f"Look at its crash events in the event log, and its own output: steward logs {engine}.")
        decision = self._unless_recent(now, Alert(AlertKind.CRASH_LOOP, f"Engine {engine} is crash-looping", body,
                                                  Priority.URGENT, ("rotating_light", "steward"), engine))
        if isinstance(decision, Alert):
            self._loops_told[engine] = failures
        return decision

    def _unless_recent(self, now: float, alert: Alert) -> Alert | Suppressed:
        # An alert counts once decided, delivered or not: a broken webhook is not hammered.
        key = (alert.kind, alert.engine)
        last = self._last_alert.get(key)
        if last is not None and now - last < self.min_interval:
            return Suppressed(alert.kind, Suppression.WITHIN_MIN_INTERVAL, alert.engine)
        self._last_alert[key] = now
        return alert


@attrs.define(eq=False)
class Alerter:
    """The event log's listener: triggers to the policy, alerts to the sender's queue.

    ``observe`` is called inside ``EventLog.emit`` for every event: it never blocks and
    never raises. Without a channel (no webhook) it does nothing.
    """

    policy: AlertPolicy
    _events: EventLog
    _send: trio.MemorySendChannel[Alert] | None

    def observe(self, event: Event) -> None:
        if self._send is None or event.name not in _TRIGGERS:
            return
        decision = self._decide(event.name, _now(event), event.fields)
        if isinstance(decision, Suppressed):
            # Emitted while the trigger is being emitted, so it comes just before it in the log.
            self._events.emit("alert_suppressed", "debug", kind=decision.kind.value, reason=decision.reason.value,
                              engine=decision.engine)
        elif isinstance(decision, Alert):
            try:
                self._send.send_nowait(decision)
            except trio.WouldBlock:
                waiting = self._send.statistics().current_buffer_used
                self._events.emit("alert_failed", "warning", kind=decision.kind.value, title=decision.title,
                                  detail=f"dropped: {waiting} alerts already wait to be sent", attempts=0)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                pass  # the sender has stopped: steward is stopping

    def _decide(self, name: str, now: float, fields: dict[str, Any]) -> Alert | Suppressed | None:
        # The fields are steward's own, but a listener must not raise: anything unexpected is no trigger.
        klass, model = _text(fields.get("class")), _optional_text(fields.get("model"))
        if name == "reject":
            reason = fields.get("reason")
            return self.policy.on_rejection(now, reason, klass, model) if isinstance(reason, str) else None
        if name == "timeout":
            waited = fields.get("waited_s")
            waited_s = float(waited) if isinstance(waited, int | float) and not isinstance(waited, bool) else None
            return self.policy.on_rejection(now, "queue_timeout", klass, model, waited_s=waited_s)
        if name == "health":
            status, reasons = fields.get("status"), fields.get("reasons")
            reasons = [_text(reason) for reason in reasons] if isinstance(reasons, list | tuple) else []
            return self.policy.on_health(now, _text(status), _optional_text(fields.get("previous")), reasons)
        failures = fields.get("failures")  # a crash
        if not isinstance(failures, int) or isinstance(failures, bool):
            return None
        return self.policy.on_crash(now, _text(fields.get("engine")), failures, _text(fields.get("detail"), ""))


_TRIGGERS = frozenset({"reject", "timeout", "health", "crash"})


async def serve_alerts(webhook: str | None, policy: AlertPolicy, events: EventLog, http: httpx.AsyncClient, *,
                       timeout: float = 10.0, attempts: int = 3,
                       task_status: trio.TaskStatus[Alerter] = trio.TASK_STATUS_IGNORED) -> None:
    """Listen to *events* and post each alert to *webhook*, one after another, until cancelled.

    The ``Alerter`` is registered in ``events.listeners`` here (and removed on the way out).
    With no webhook nothing listens: no alert is decided, sent or logged, and this returns.
    """
    if webhook is None:
        task_status.started(Alerter(policy, events, None))
        return
    send, receive = trio.open_memory_channel[Alert](QUEUE_SIZE)
    alerter = Alerter(policy, events, send)
    events.listeners.append(alerter.observe)
    try:
        task_status.started(alerter)
        async with receive:
            async for alert in receive:
                await _deliver(webhook, alert, events, http, timeout=timeout, attempts=max(1, attempts))
    finally:
        with contextlib.suppress(ValueError):
            events.listeners.remove(alerter.observe)
        send.close()


async def _deliver(webhook: str, alert: Alert, events: EventLog, http: httpx.AsyncClient, *, timeout: float,
                   attempts: int) -> None:
    delays = RETRY.delays()
    detail = ""
    for attempt in range(1, attempts + 1):
        status, detail = await _post(webhook, alert, http, timeout)
        if status is not None:
            events.emit("alert_sent", "info", kind=alert.kind.value, title=alert.title, status=status,
                        attempts=attempt, engine=alert.engine)
            return
        if attempt < attempts:
            await trio.sleep(next(delays))
    events.emit("alert_failed", "warning", kind=alert.kind.value, title=alert.title, detail=detail,
                attempts=attempts)


async def _post(webhook: str, alert: Alert, http: httpx.AsyncClient, timeout: float) -> tuple[int | None, str]:
    """One POST: (its 2xx status, "") or (None, what went wrong)."""
    no_answer = f"no answer within {format_duration(timeout)}"
    # httpx's timeout bounds each step (connect, each read); the scope bounds the whole (a trickling answer).
    with trio.move_on_after(timeout):
        try:
            # Streamed and never read: the answer's body, however large or endless, is not ours to wait for.
            async with http.stream("POST", webhook, content=alert.payload(), headers=alert.headers(),
                                   timeout=timeout, follow_redirects=False) as response:
                status = response.status_code
        except httpx.TimeoutException:
            return None, no_answer
        except Exception as exc:  # whatever the webhook does is an event, never a crash
            return None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if 200 <= status < 300:
            return status, ""
        if 300 <= status < 400:
            return None, f"answered {status} (redirects are not followed)"
        return None, f"answered {status}"
    return None, no_answer


def _header_value(text: str) -> str:
    # Headers travel as latin-1 and one line: fold accents to ASCII, drop the rest, flatten control characters.
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    line = " ".join("".join(char if char.isprintable() else " " for char in ascii_text).split())
    return line if len(line) <= HEADER_MAX else line[: HEADER_MAX - 3] + "..."


def _text(value: object, default: str = "unknown") -> str:
    return default if value is None else value if isinstance(value, str) else str(value)


def _optional_text(value: object) -> str | None:
    return None if value is None else _text(value)


def _now(event: Event) -> float:
    try:
        return trio.current_time()
    except RuntimeError:
        return event.mono  # emitted outside trio: its own stamp is the same clock
