"""The home-lab seed's overload test, reproduced against steward: is an overload visible?

The seed (research: seeds/home-orchestrator.md, "The most instructive bug") ran 256
concurrent requests against an engine that did about 26 requests a minute. 16 were
rejected, some waited 118 s, and nothing showed it: the waiting gauge read zero in all 253
samples taken during the overload (it counted one kind of queue only), the usage log
held only "ok" rows (rejected requests got none), the one overload event went nowhere,
and the health check answered 200 throughout.

``run_overload`` does the same to steward, time scaled down: one fake llama-server with
one slot and a fixed ``max_tokens``, so its nominal capacity is ``capacity_per_s`` requests
a second (20 by default, 46 times the seed's engine; the report gives the throughput measured,
and its scale), and ``clients`` requests sent at once by a mix of callers:

- ``family`` (interactive) and ``guest`` (interactive, at most 2 at a time: the rest get
  429 ``concurrency_limited``);
- ``agents`` (background; a few ask for interactive, which the key may not: 403);
- ``jobs`` (batch, into a queue smaller than they are: 429 ``queue_full``);
- a ``stranger`` with a key steward does not know (401).

Interactive goes first, then background, whose ``queue_timeout`` is set to pass when about
half of it is served (503 ``queue_timeout``), then what fits of batch. A webhook receiver
stands in for the operator's phone. While the load runs, ``/metrics`` and ``/healthz`` are
read every ``sample_interval``; afterwards steward is stopped (SIGTERM, so every usage row
is written) and its usage log and event log are read. What each figure proves:

- **the queue is visible**: every sample taken while the overload is surely under way has a
  non-zero ``steward_queued`` and ``steward_waiting``. A sample counts once a first request
  was served (the engine is busy and requests are queued behind it) and while more
  requests are outstanding, as the clients count them, than the engine has slots plus a
  margin for requests in transit (``margin``);
- **rejections are visible**: ``steward_rejected_total`` and the event log count, per reason,
  exactly the rejections the clients saw; the usage log has one row per request sent,
  rejected ones included, with the same statuses and error codes the clients got;
- **the overload is told**: ``/healthz`` said ``overloaded``, with reasons, as HTTP 503, and
  the webhook got exactly one alert for the whole incident (not one per rejection);
- **priority works**: interactive requests waited less than batch ones (median and worst),
  from the usage log's ``queued_s`` of the requests served.

The mix and steward's config are ``OverloadPlan``'s (overload_scenario.py); the checks are
pure (``OverloadReport.problems``, from the figures alone: overload_report.py); the I/O is
here, in ``run_overload`` and the tasks it starts. ``steward loadtest --scenario overload``
runs it from a terminal.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import random
import sqlite3
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import attrs
import h11
import httpx
import trio
import yaml

from fakes.webhook import read_request
from supervisor.auth.keys import KeyCommandError, KeyFileError
from supervisor.observe.events import read_event_log
from supervisor.tools.demo import open_workdir
from supervisor.tools.loadtest_steward import output_tail, spawn_steward, stop_steward
from supervisor.tools.overload_report import (
    Answer,
    OverloadReport,
    OverloadRun,
    ReceivedAlert,
    Sample,
    Scrape,
    assemble_report,
    format_overload_report,
    parse_scrape,
)
from supervisor.tools.overload_scenario import MODEL, SLOTS, Caller, OverloadPlan
from supervisor.usage.row import TABLE

CHAT_PATH = "/v1/chat/completions"
START_BOUND_S = 30.0  # steward listening and its engine ready
SETTLE_BOUND_S = 15.0  # after the load: the last usage rows counted, the alert delivered
POOL_SIZE = 16  # client connections per httpx pool
UNKNOWN_KEY = "sk-steward-" + "0" * 43  # shaped like a key, in no key file


def run_overload(workdir: Path, *, clients: int = 256, capacity_per_s: float = 20.0, max_tokens: int = 10,
                 sample_interval: float = 0.05, margin: int = 20, seed: int = 7,
                 client_timeout: float = 120.0) -> OverloadReport:
    """The scenario of the module docstring, with steward's files in *workdir* (which must exist).

    Raises:
        ValueError: a mix that cannot be made (too few clients, a capacity that is no number).
        RuntimeError: steward could not be started (the message has its last words).
    """
    plan = OverloadPlan.for_clients(clients, capacity_per_s, max_tokens)
    try:
        keys = plan.make_keys(workdir / "keys.json")
    except (KeyCommandError, KeyFileError) as exc:
        raise RuntimeError(f"cannot make the scenario's keys in {workdir} (it needs a fresh folder): {exc}") from None
    run = trio.run(functools.partial(_overload_session, workdir, plan, keys, sample_interval=sample_interval,
                                     margin=margin, seed=seed, client_timeout=client_timeout))
    return assemble_report(plan, run, margin, read_event_log(workdir / "events.jsonl"), _read_usage(workdir / "usage.db"))


@attrs.define
class _Tally:
    sent: int = 0
    answered: int = 0
    served: int = 0

    @property
    def outstanding(self) -> int:
        return self.sent - self.answered


async def _overload_session(workdir: Path, plan: OverloadPlan, keys: Mapping[str, str], *, sample_interval: float,
                            margin: int, seed: int, client_timeout: float) -> OverloadRun:
    alerts: list[ReceivedAlert] = []
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_webhook_receiver, alerts)
        config_path = workdir / "config.yaml"
        config_path.write_text(yaml.safe_dump(plan.config(workdir, f"http://127.0.0.1:{port}/steward")))
        outcome = await _run_steward(config_path, workdir, plan, keys, alerts, sample_interval=sample_interval,
                                     margin=margin, seed=seed, client_timeout=client_timeout)
        nursery.cancel_scope.cancel(reason="steward has stopped")
    if isinstance(outcome, RuntimeError):
        raise outcome  # out here: raised inside the nursery, it would come out wrapped in an ExceptionGroup
    return outcome


async def _run_steward(config_path: Path, workdir: Path, plan: OverloadPlan, keys: Mapping[str, str],
                       alerts: list[ReceivedAlert], *, sample_interval: float, margin: int, seed: int,
                       client_timeout: float) -> OverloadRun | RuntimeError:
    """Steward started, the load, the last scrape, steward stopped (always); a start that failed, returned."""
    stderr_path = workdir / "steward.stderr"
    process = spawn_steward(config_path, stderr_path)
    try:
        url = await _wait_ready(process, workdir / "events.jsonl", stderr_path)
        monitor = {"Authorization": f"Bearer {keys['monitor']}"}
        async with httpx.AsyncClient(base_url=url, headers=monitor, timeout=10.0) as scraper:
            answers, samples, duration = await _load(url, plan, keys, scraper, sample_interval=sample_interval,
                                                     margin=margin, seed=seed, client_timeout=client_timeout)
            final = await _settle(scraper, plan.clients, alerts)
    except RuntimeError as exc:
        return exc
    finally:
        with trio.CancelScope(shield=True):
            status = await trio.to_thread.run_sync(stop_steward, process)
    return OverloadRun(answers, samples, final, alerts, status, duration)


async def _wait_ready(process: subprocess.Popen[bytes], events: Path, stderr_path: Path) -> str:
    """Steward's URL once it listens and its engine is ready; RuntimeError if it exits or takes too long."""
    with trio.move_on_after(START_BOUND_S):
        while process.poll() is None:
            records = read_event_log(events) if events.exists() else []
            urls = [r["urls"][0] for r in records if r["event"] == "listening"]
            if urls and any(r["event"] == "ready" and r["engine"] == MODEL for r in records):
                return urls[0]
            await trio.sleep(0.05)
        raise RuntimeError(f"steward exited with status {process.returncode}{output_tail(stderr_path)}")
    raise RuntimeError(f"steward and its engine were not ready within {START_BOUND_S:g}s{output_tail(stderr_path)}")


async def _load(url: str, plan: OverloadPlan, keys: Mapping[str, str], scraper: httpx.AsyncClient, *,
                sample_interval: float, margin: int, seed: int,
                client_timeout: float) -> tuple[list[Answer], list[Sample], float]:
    """Every client at once, and the sampler beside them until the last answer."""
    callers = [caller for caller in plan.callers for _ in range(caller.count)]
    random.Random(seed).shuffle(callers)
    body = {"model": MODEL, "max_tokens": plan.max_tokens, "messages": [{"role": "user", "content": "plan my day"}]}
    tally = _Tally()
    answers: list[Answer] = []
    samples: list[Sample] = []
    started = trio.current_time()

    async def ask(http: httpx.AsyncClient, caller: Caller) -> None:
        headers = {"Authorization": f"Bearer {keys[caller.key] if caller.key else UNKNOWN_KEY}"}
        if caller.klass is not None:
            headers["X-Steward-Class"] = caller.klass
        tally.sent += 1
        try:
            response = await http.post(CHAT_PATH, json=body, headers=headers)
            status, reason = response.status_code, _error_code(response)
        except httpx.HTTPError as exc:
            status, reason = 0, f"no answer ({type(exc).__name__})"
        tally.answered += 1
        tally.served += status == 200
        answers.append(Answer(caller.name, status, reason, round(trio.current_time() - started, 3)))

    async with contextlib.AsyncExitStack() as stack:
        # Small pools: httpcore hands out connections in time quadratic in its pool's size, which at
        # 256 connections in one pool costs this process seconds of CPU, and its answers arrive late.
        pools = [await stack.enter_async_context(httpx.AsyncClient(
            base_url=url, timeout=client_timeout, limits=httpx.Limits(max_connections=POOL_SIZE)))
            for _ in range(math.ceil(len(callers) / POOL_SIZE))]
        async with trio.open_nursery() as sampling:
            sampling.start_soon(functools.partial(_sample_forever, scraper, tally, samples, plan.clients,
                                                  threshold=SLOTS + margin, interval=sample_interval,
                                                  started=started))
            async with trio.open_nursery() as load:
                for index, caller in enumerate(callers):  # all at once: each task's first step is in one batch
                    load.start_soon(ask, pools[index // POOL_SIZE], caller)
            sampling.cancel_scope.cancel(reason="every client has its answer")
    duration = max((a.at for a in answers), default=0.0)
    return answers, samples, duration


def _error_code(response: httpx.Response) -> str | None:
    if response.status_code == 200:
        return None
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        error = None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) and code else f"http_{response.status_code}"


async def _sample_forever(scraper: httpx.AsyncClient, tally: _Tally, samples: list[Sample], clients: int, *,
                          threshold: int, interval: float, started: float) -> None:
    """/metrics and /healthz every *interval* until cancelled (a slow scrape delays the next, never stacks)."""
    next_at = trio.current_time()
    while True:
        # Under way: every request sent, a first one served (the engine is busy, requests queue behind it).
        under_way = tally.sent == clients and tally.served > 0
        metrics, health = await _read_pages(scraper)
        outstanding = tally.outstanding
        scrape = _parse_or_none(metrics)
        health_json = _json_or_none(health)
        status = health_json.get("status") if isinstance(health_json, dict) else None
        reasons = health_json.get("reasons") if isinstance(health_json, dict) else None
        samples.append(Sample(
            at=round(trio.current_time() - started, 3), outstanding=outstanding,
            counted=under_way and outstanding > threshold and scrape is not None,
            queued=scrape.total_queued if scrape is not None else None,
            waiting=scrape.waiting if scrape is not None else None,
            health_http=health.status_code if health is not None else None,
            health=status if isinstance(status, str) else None,
            reasons=tuple(str(r) for r in reasons) if isinstance(reasons, list) else ()))
        next_at = max(next_at + interval, trio.current_time())
        await trio.sleep_until(next_at)


async def _read_pages(scraper: httpx.AsyncClient) -> tuple[httpx.Response | None, httpx.Response | None]:
    pages: list[httpx.Response | None] = [None, None]

    async def read(index: int, path: str) -> None:
        with contextlib.suppress(httpx.HTTPError):
            pages[index] = await scraper.get(path)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read, 0, "/metrics")
        nursery.start_soon(read, 1, "/healthz")
    return pages[0], pages[1]


def _parse_or_none(response: httpx.Response | None) -> Scrape | None:
    if response is None or response.status_code != 200:
        return None
    try:
        return parse_scrape(response.text)
    except (ValueError, KeyError):
        return None


def _json_or_none(response: httpx.Response | None) -> Any:
    try:
        return response.json() if response is not None else None
    except ValueError:
        return None


async def _settle(scraper: httpx.AsyncClient, clients: int, alerts: list[ReceivedAlert]) -> Scrape | None:
    """The last /metrics page, once every request's usage row is counted and the alert has arrived."""
    final = None
    with trio.move_on_after(SETTLE_BOUND_S):
        while True:
            response, _ = await _read_pages(scraper)
            final = _parse_or_none(response) or final
            # The door records a request's row just after its last byte went out: wait for all of them.
            if final is not None and sum(final.requests.values()) >= clients and alerts:
                break
            await trio.sleep(0.1)
    return final


async def serve_webhook_receiver(received: list[ReceivedAlert], *,
                                 task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """An ntfy stand-in on 127.0.0.1: each POST's Title, Priority, Tags and body into *received*,
    answered 200. Started with ``nursery.start``, which returns its port; runs until cancelled."""

    async def handle(stream: trio.SocketStream) -> None:
        connection = h11.Connection(h11.SERVER)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            while (alert := await _read_alert(connection, stream)) is not None:
                received.append(alert)
                answer = h11.Response(status_code=200, headers=[("Content-Length", "0")])
                await stream.send_all(connection.send(answer) + connection.send(h11.EndOfMessage()))
                if connection.our_state is not h11.DONE or connection.their_state is not h11.DONE:
                    return
                connection.start_next_cycle()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
        task_status.started(listeners[0].socket.getsockname()[1])


async def _read_alert(connection: h11.Connection, stream: trio.SocketStream) -> ReceivedAlert | None:
    received = await read_request(connection, stream)
    if received is None:
        return None
    headers = received.headers
    return ReceivedAlert(headers.get("title", ""), headers.get("priority", ""), headers.get("tags", ""), received.body)


def _read_usage(path: Path) -> list[tuple[Any, ...]]:
    """(class, status, error, queued_s) of every row; read-only, after steward has exited."""
    if not path.exists():
        return []
    connection = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True)
    try:
        return connection.execute(f'SELECT "class", status, error, queued_s FROM {TABLE}').fetchall()
    except sqlite3.Error:
        return []
    finally:
        connection.close()


def report_overload(*, clients: int = 256, capacity_per_s: float = 20.0, as_json: bool = False,
                    keep: bool = False) -> int:
    """``steward loadtest --scenario overload``: run it, print the report; 0 if every check passed."""
    started = time.monotonic()
    with open_workdir("overload", keep=keep) as workdir:
        try:
            report = run_overload(workdir, clients=clients, capacity_per_s=capacity_per_s)
        except (ValueError, RuntimeError) as exc:
            print(f"steward: loadtest: {exc}", file=sys.stderr)
            return 2
    print(json.dumps(report.to_json()) if as_json else format_overload_report(report))
    print(f"(the whole run took {time.monotonic() - started:.1f}s)", file=sys.stderr)
    return 0 if report.passed else 1
