"""Alerts: the policy with explicit times, the sender against a real local receiver.

The policy tests say in exact seconds when the phone buzzes. The sender tests post with a
real httpx.AsyncClient to a tiny h11 server on 127.0.0.1 that records what it got. They run
on ``MockClock(rate=20)``: virtual time flows, fast, and is never jumped, so the 1 s and 2 s
retry pauses pass in a blink while a localhost answer still has a whole generous timeout
(autojumping could skip over bytes in flight on a real socket). Only the receiver that
never answers runs on the autojump clock, where every way of failing is the same timeout.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import math
import socket
from collections.abc import AsyncIterator

import attrs
import h11
import httpx
import pytest
import trio
import trio.testing

from fakes.webhook import Received, read_request
from supervisor.observe.alerts import Alert, Alerter, AlertKind, AlertPolicy, Priority, Suppressed, Suppression, serve_alerts
from supervisor.observe.events import Event, EventLog

WAIT_LIMIT = 600.0  # virtual seconds: a test that hangs fails instead
ROOMY = 300.0  # a POST timeout no localhost answer comes near


# --- the policy, in exact seconds ---

def alerts(decisions: list[Alert | Suppressed | None]) -> list[Alert]:
    return [d for d in decisions if isinstance(d, Alert)]


def test_a_burst_of_rejections_sends_one_alert() -> None:
    policy = AlertPolicy(min_interval=600)
    decisions = [policy.on_rejection(i * 0.1, "queue_full", "interactive", "chat") for i in range(16)]
    assert [d.kind for d in alerts(decisions)] == [AlertKind.OVERLOAD]
    assert isinstance(decisions[0], Alert)
    assert decisions[1:] == [Suppressed(AlertKind.OVERLOAD, Suppression.ONGOING)] * 15


def test_a_rejection_after_a_quiet_period_sends_a_second_alert() -> None:
    policy = AlertPolicy(min_interval=600)
    assert isinstance(policy.on_rejection(0, "queue_full", "interactive", "chat"), Alert)
    # 600 s is not more than min_interval: still the same incident.
    assert policy.on_rejection(600, "queue_full", "interactive", "chat") == Suppressed(AlertKind.OVERLOAD,
                                                                                     Suppression.ONGOING)
    second = policy.on_rejection(1300, "insufficient_memory", "batch", "big")
    assert isinstance(second, Alert)
    assert second.body.startswith("A batch request for big was rejected")
    assert "is the first in 12m;" in second.body


def test_continuous_rejections_for_an_hour_send_one_alert() -> None:
    policy = AlertPolicy(min_interval=600)
    decisions = [policy.on_rejection(t, "queue_timeout", "background", "chat", waited_s=300) for t in
                 range(0, 3601, 30)]
    assert len(decisions) == 121
    assert len(alerts(decisions)) == 1


def test_shutting_down_is_no_capacity_rejection_and_does_not_break_the_quiet() -> None:
    policy = AlertPolicy(min_interval=600)
    assert isinstance(policy.on_rejection(0, "queue_full", "interactive", "chat"), Alert)
    assert policy.on_rejection(500, "shutting_down", "interactive", "chat") is None
    assert isinstance(policy.on_rejection(700, "engine_failed", "interactive", "chat"), Alert)


def test_entering_overloaded_shares_the_overload_incident() -> None:
    policy = AlertPolicy(min_interval=600)
    assert isinstance(policy.on_rejection(0, "queue_full", "interactive", "chat"), Alert)
    assert policy.on_health(5, "overloaded", "ok", ["interactive waits 40s (slo 30s)"]) == Suppressed(
        AlertKind.OVERLOAD, Suppression.WITHIN_MIN_INTERVAL)
    assert policy.on_health(300, "ok", "overloaded", []) is None
    assert policy.on_health(400, "degraded", "ok", ["engine chat unhealthy"]) is None
    later = policy.on_health(1205, "overloaded", "degraded", ["interactive waits 40s (slo 30s)", "12 rejections"])
    assert isinstance(later, Alert)
    assert (later.kind, later.priority, later.tags) == (AlertKind.OVERLOAD, Priority.HIGH, ("warning", "steward"))
    assert "from degraded to overloaded: interactive waits 40s (slo 30s); 12 rejections" in later.body
    # Staying overloaded is no transition.
    assert policy.on_health(2000, "overloaded", "overloaded", []) is None


def test_a_crash_loop_alerts_at_the_third_crash_once_per_loop_and_engine() -> None:
    policy = AlertPolicy(min_interval=600, crash_loop=3)
    assert policy.on_crash(0, "chat", 1, "killed by SIGSEGV") is None
    assert policy.on_crash(1, "chat", 2, "killed by SIGSEGV") is None
    third = policy.on_crash(3, "chat", 3, "exited with status 1: CUDA error: out of memory")
    assert isinstance(third, Alert)
    assert (third.kind, third.priority, third.engine) == (AlertKind.CRASH_LOOP, Priority.URGENT, "chat")
    assert "chat crashed 3 times in a row. The last time: exited with status 1: CUDA error" in third.body
    assert policy.on_crash(7, "chat", 4, "again") == Suppressed(AlertKind.CRASH_LOOP, Suppression.ONGOING, "chat")
    # The same loop a long time later is still the same incident.
    assert policy.on_crash(5000, "chat", 9, "again") == Suppressed(AlertKind.CRASH_LOOP, Suppression.ONGOING,
                                                                   "chat")
    # Another engine is another incident, even at once.
    assert isinstance(policy.on_crash(8, "embed", 3, "killed by SIGKILL"), Alert)


def test_a_new_crash_loop_of_an_engine_waits_for_min_interval() -> None:
    policy = AlertPolicy(min_interval=600, crash_loop=3)
    assert isinstance(policy.on_crash(0, "chat", 3, "x"), Alert)
    # It ran long enough to count again from 1: a new loop, but within min_interval.
    assert policy.on_crash(100, "chat", 1, "x") is None
    assert policy.on_crash(300, "chat", 3, "x") == Suppressed(AlertKind.CRASH_LOOP, Suppression.WITHIN_MIN_INTERVAL,
                                                              "chat")
    # A loop whose first alert was held back is told by its next crash after min_interval.
    assert isinstance(policy.on_crash(700, "chat", 4, "x"), Alert)


def test_a_crash_loop_of_one_means_every_new_loop() -> None:
    policy = AlertPolicy(min_interval=10, crash_loop=1)
    assert isinstance(policy.on_crash(0, "chat", 1, "x"), Alert)
    assert policy.on_crash(5, "chat", 2, "x") == Suppressed(AlertKind.CRASH_LOOP, Suppression.ONGOING, "chat")
    assert isinstance(policy.on_crash(50, "chat", 1, "x"), Alert)


def test_a_rejection_alert_says_what_and_where_to_look() -> None:
    alert = AlertPolicy().on_rejection(0, "queue_timeout", "interactive", "chat", waited_s=60.0)
    assert isinstance(alert, Alert)
    assert alert.title == "Steward is rejecting interactive requests"
    assert alert.body.splitlines() == [
        "An interactive request for chat was rejected: it waited its class's whole queue_timeout (queue_timeout). "
        "It waited 60s.",
        "This capacity rejection is the first since steward started; more without a 10m pause send no alert.",
        "Look at /healthz and the reject and timeout events in the event log."]


def test_headers_are_single_line_ascii_whatever_the_text() -> None:
    alert = Alert(AlertKind.CRASH_LOOP, "Engine mödel\r\nX-Injected: 1 ✓\x00 is crash-looping", "body \udcff ✓",
                  Priority.URGENT, ("rotating_light", "ste,ward\n"), "mödel")
    headers = alert.headers()
    assert headers == {"Title": "Engine model X-Injected: 1 is crash-looping", "Priority": "urgent",
                       "Tags": "rotating_light,ste ward", "Content-Type": "text/plain; charset=utf-8"}
    assert alert.payload() == "body ? ✓".encode()
    long = Alert(AlertKind.OVERLOAD, "x" * 500, "", Priority.HIGH, ())
    assert len(long.headers()["Title"]) == 200
    assert Alert(AlertKind.OVERLOAD, "✓", "", Priority.HIGH, ()).headers()["Title"] == "steward"


# --- the listener ---

def open_event_log() -> EventLog:
    send, _ = trio.open_memory_channel[Event](math.inf)
    return EventLog(send, recent_max=10_000)


def fields_of(events: EventLog, name: str) -> list[dict[str, object]]:
    return [e.fields for e in events.recent if e.name == name]


async def test_the_listener_ignores_malformed_triggers_and_never_raises() -> None:
    events = open_event_log()
    send, receive = trio.open_memory_channel[Alert](16)
    events.listeners.append(Alerter(AlertPolicy(), events, send).observe)
    events.emit("crash", "error", engine="chat", failures="3")
    events.emit("crash", "error", engine="chat", failures=True)
    events.emit("crash", "error")
    events.emit("reject", "warning", reason=5)
    events.emit("reject", "warning")
    events.emit("health", "info", status=None, reasons="not a list")
    events.emit("load", "info", engine="chat")
    with pytest.raises(trio.WouldBlock):
        receive.receive_nowait()
    # Odd but usable fields still make an alert.
    events.emit("timeout", "warning", waited_s="long")
    events.emit("crash", "error", engine=None, failures=7, detail=None)
    assert [a.kind for a in (receive.receive_nowait(), receive.receive_nowait())] == [AlertKind.OVERLOAD,
                                                                                     AlertKind.CRASH_LOOP]


async def test_a_full_queue_drops_the_alert_with_an_event_and_never_blocks() -> None:
    events = open_event_log()
    send, _receive = trio.open_memory_channel[Alert](1)
    events.listeners.append(Alerter(AlertPolicy(), events, send).observe)
    events.emit("crash", "error", engine="chat", failures=3, detail="x")
    events.emit("crash", "error", engine="embed", failures=3, detail="x")
    assert fields_of(events, "alert_failed") == [
        {"kind": "crash_loop", "title": "Engine embed is crash-looping",
         "detail": "dropped: 1 alerts already wait to be sent", "attempts": 0}]
    send.close()
    events.emit("crash", "error", engine="rerank", failures=3, detail="x")  # the sender has stopped: nothing


# --- the sender, against a real receiver ---

class Reply(enum.Enum):
    STATUS = "status"  # answers with the receiver's status
    SILENT = "silent"  # reads the request, never answers
    GARBAGE = "garbage"  # answers bytes that are not HTTP, and hangs up


@attrs.define(eq=False)
class Receiver:
    reply: Reply
    status: int
    port: int = 0
    requests: list[Received] = attrs.Factory(list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/steward-alerts"

    async def handle(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            while (received := await read_request(conn, stream)) is not None:
                self.requests.append(received)
                if self.reply is Reply.SILENT:
                    await trio.sleep_forever()
                if self.reply is Reply.GARBAGE:
                    await stream.send_all(b"\x00\xffnot http at all\r\n\r\n")
                    return
                headers = [("Content-Length", "0")]
                if 300 <= self.status < 400:
                    headers.append(("Location", "http://127.0.0.1:1/elsewhere"))
                response = h11.Response(status_code=self.status, headers=headers)
                await stream.send_all(conn.send(response) + conn.send(h11.EndOfMessage()))
                if conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()


@contextlib.asynccontextmanager
async def open_receiver(reply: Reply = Reply.STATUS, status: int = 200) -> AsyncIterator[Receiver]:
    receiver = Receiver(reply, status)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, receiver.handle, 0, host="127.0.0.1"))
        receiver.port = listeners[0].socket.getsockname()[1]
        yield receiver
        nursery.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def open_alerts(webhook: str | None, *, policy: AlertPolicy | None = None,
                      **options: float) -> AsyncIterator[tuple[EventLog, Alerter]]:
    events = open_event_log()
    async with httpx.AsyncClient() as http, trio.open_nursery() as nursery:
        alerter = await nursery.start(functools.partial(serve_alerts, webhook, policy or AlertPolicy(), events, http,
                                                        **options))
        yield events, alerter
        nursery.cancel_scope.cancel()


async def wait_for(events: EventLog, name: str, count: int = 1) -> list[Event]:
    """The first *count* events called *name*, once they were emitted."""
    matching = [e for e in events.recent if e.name == name]
    arrived = trio.Event()

    def listener(event: Event) -> None:
        if event.name == name:
            matching.append(event)
            if len(matching) >= count:
                arrived.set()

    if len(matching) < count:
        events.listeners.append(listener)
        try:
            with trio.fail_after(WAIT_LIMIT):
                await arrived.wait()
        finally:
            events.listeners.remove(listener)
    return matching[:count]


@pytest.fixture
def fast_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(rate=20)


async def test_alerts_reach_the_receiver_with_ntfy_headers(fast_clock: trio.testing.MockClock) -> None:
    async with open_receiver() as receiver, open_alerts(receiver.url, timeout=ROOMY) as (events, _):
        events.emit("reject", "warning", job=1, model="chat", **{"class": "interactive"}, reason="queue_full")
        events.emit("crash", "error", engine="chat", during_start=False, detail="killed by SIGSEGV", released=0,
                    failures=3, restart_in_s=4.0)
        sent = await wait_for(events, "alert_sent", 2)
    assert [e.fields for e in sent] == [
        {"kind": "overload", "title": "Steward is rejecting interactive requests", "status": 200, "attempts": 1,
         "engine": None},
        {"kind": "crash_loop", "title": "Engine chat is crash-looping", "status": 200, "attempts": 1,
         "engine": "chat"}]
    overload, crash = receiver.requests
    assert overload.target == "/steward-alerts"
    assert {k: overload.headers[k] for k in ("title", "priority", "tags", "content-type")} == {
        "title": "Steward is rejecting interactive requests", "priority": "high", "tags": "warning,steward",
        "content-type": "text/plain; charset=utf-8"}
    assert overload.body.startswith("An interactive request for chat was rejected: its class's queue is full "
                                    "(queue_full).\n")
    assert (crash.headers["title"], crash.headers["priority"], crash.headers["tags"]) == (
        "Engine chat is crash-looping", "urgent", "rotating_light,steward")
    assert crash.body.startswith("Engine chat crashed 3 times in a row. The last time: killed by SIGSEGV\n")


@pytest.mark.parametrize(("reply", "status", "detail"), [
    (Reply.STATUS, 500, "answered 500"),
    (Reply.STATUS, 302, "answered 302 (redirects are not followed)"),
    (Reply.GARBAGE, 0, "RemoteProtocolError"),
])
async def test_a_failing_receiver_gets_attempts_posts_then_alert_failed(
        fast_clock: trio.testing.MockClock, reply: Reply, status: int, detail: str) -> None:
    async with open_receiver(reply, status) as receiver, open_alerts(receiver.url, timeout=ROOMY) as (events, _):
        events.emit("crash", "error", engine="chat", failures=3, detail="x")
        [failed] = await wait_for(events, "alert_failed")
    assert failed.fields["attempts"] == 3
    assert str(failed.fields["detail"]).startswith(detail)
    assert len(receiver.requests) == 3
    assert fields_of(events, "alert_sent") == []


async def test_a_closed_port_is_alert_failed(fast_clock: trio.testing.MockClock) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/"
        async with open_alerts(url, timeout=ROOMY, attempts=2) as (events, _):
            events.emit("crash", "error", engine="chat", failures=3, detail="x")
            [failed] = await wait_for(events, "alert_failed")
    assert failed.fields["attempts"] == 2
    assert str(failed.fields["detail"]).startswith("ConnectError")


async def test_a_receiver_that_never_answers_is_bounded_by_the_timeout(
        autojump_clock: trio.testing.MockClock) -> None:
    async with open_receiver(Reply.SILENT) as receiver, open_alerts(receiver.url) as (events, _):
        events.emit("crash", "error", engine="chat", failures=3, detail="x")
        [failed] = await wait_for(events, "alert_failed")
    assert failed.fields == {"kind": "crash_loop", "title": "Engine chat is crash-looping",
                             "detail": "no answer within 10s", "attempts": 3}
    # Three tries of 10 s, with pauses of 1 s and 2 s between them.
    assert failed.mono == pytest.approx(33.0)


async def test_alerts_keep_flowing_while_the_webhook_is_stuck(autojump_clock: trio.testing.MockClock) -> None:
    async with open_receiver(Reply.SILENT) as receiver, open_alerts(receiver.url, attempts=1) as (events, _):
        for engine in ("a", "b", "c"):
            events.emit("crash", "error", engine=engine, failures=3, detail="x")
        failed = await wait_for(events, "alert_failed", 3)
    assert [e.fields["title"] for e in failed] == [f"Engine {name} is crash-looping" for name in "abc"]
    assert [e.mono for e in failed] == pytest.approx([10.0, 20.0, 30.0])


async def test_no_webhook_sends_nothing_and_says_nothing() -> None:
    async with open_alerts(None) as (events, alerter):
        assert events.listeners == []
        for failures in range(1, 6):
            events.emit("crash", "error", engine="chat", failures=failures, detail="x")
        events.emit("reject", "warning", reason="queue_full", model="chat", **{"class": "interactive"})
        alerter.observe(events.recent[-1])
    assert [e.name for e in events.recent if e.name.startswith("alert_")] == []


async def test_end_to_end_one_incident_is_one_post(fast_clock: trio.testing.MockClock) -> None:
    async with open_receiver() as receiver:
        async with open_alerts(receiver.url, timeout=ROOMY) as (events, alerter):
            assert alerter.observe in events.listeners
            for job in range(16):
                events.emit("reject", "warning", job=job, model="chat", **{"class": "interactive"},
                            reason="queue_full")
            events.emit("health", "info", status="overloaded", previous="ok", reasons=["16 rejections in 300s"])
            [sent] = await wait_for(events, "alert_sent")
        assert events.listeners == []  # serve_alerts took its listener away when it ended
    assert len(receiver.requests) == 1
    assert sent.fields["kind"] == "overload"
    assert [(f["kind"], f["reason"]) for f in fields_of(events, "alert_suppressed")] == (
        [("overload", "ongoing")] * 15 + [("overload", "within_min_interval")])
