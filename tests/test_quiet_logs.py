"""Steward's own polls stay out of the logs: the lines an engine's access log writes for
steward's health checks and ``GET /metrics`` reads, and a front door's ``GET /steward/state``
polls of a node, are counted in /metrics, not written as events or usage rows; the engine's
other lines are kept (in its own log, ``GET /admin/engines/NAME/logs``). Against a real steward and the fake vLLM (uvicorn's access log)."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import attrs
import httpx
import pytest

from supervisor.observe.engine_output import own_poll_path
from supervisor.observe.events import RECORD_KEYS, Event
from supervisor.request_class import RequestClass
from supervisor.scheduler.eviction import LoadReason
from supervisor.scheduler.types import Job
from supervisor.tools.demo import banner
from tests.conftest import StewardFactory, fake_model
from tests.test_openai_engines import ask, fake_vllm, wait_until

POLLS = frozenset({"/health", "/metrics"})
GIB = 1024**3


@pytest.mark.parametrize(("line", "path"), [
    ('INFO:     127.0.0.1:40312 - "GET /metrics HTTP/1.1" 200 OK', "/metrics"),
    ('INFO:     127.0.0.1:40312 - "GET /health?x=1 HTTP/1.1" 200 OK', "/health"),
    ('[GIN] 2025/01/01 - 10:00:00 | 200 |      1.203ms |       127.0.0.1 | GET      "/api/ps"', "/api/ps"),
    ("srv  log_server_r: request: GET /health 127.0.0.1 200", "/health"),
    ("srv  log_server_r: request: GET /health 127.0.0.1 503", None),  # loading: worth seeing
    ("srv  log_server_r: request: POST /completion 127.0.0.1 200", None),
    # Kept: a failed poll, someone else's request, a path steward does not poll, the engine's own words.
    ('INFO:     127.0.0.1:40312 - "GET /health HTTP/1.1" 500 Internal Server Error', None),
    ('INFO:     127.0.0.1:40312 - "POST /v1/chat/completions HTTP/1.1" 200 OK', None),
    ('INFO:     127.0.0.1:40312 - "GET /v1/models HTTP/1.1" 200 OK', None),
    ('INFO 12-01 10:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s, GET /metrics', None),
    ('[GIN] 2025/01/01 - 10:00:00 | 404 |      0.2ms |       127.0.0.1 | GET      "/api/ps"', None),
])
def test_a_line_is_steward_s_own_poll_only_if_it_logs_a_successful_get_of_a_polled_path(line: str,
                                                                                        path: str | None) -> None:
    assert own_poll_path(line, POLLS | {"/api/ps"}) == path


def metric(url: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    found = re.search(rf"^{name}_total\{{{re.escape(wanted)}\}} (\S+)$", httpx.get(f"{url}/metrics").text, re.M)
    return float(found[1]) if found else 0.0


@pytest.mark.slow
@pytest.mark.parametrize("sleeps", [False, True])  # with sleep, its process is a service kept between loads
def test_steward_s_own_polls_are_counted_not_logged(start_steward: StewardFactory, sim_gpu: object,
                                                     tmp_path: Path, sleeps: bool) -> None:
    gpu = sim_gpu("16GiB")  # type: ignore[operator]
    sleep = {"sleep": {"level": 1}, "env": {"VLLM_SERVER_DEV_MODE": "1"}} if sleeps else {}
    steward = start_steward({"shared": {"runtime": "openai", "command": fake_vllm("shared", gpu, "2GiB"),
                                        "memory": "2GiB", "always_on": True, **sleep}},
                            gpu={"probe": "simulated", "simulated_dir": str(gpu)},
                            engines={"health_check_interval": "0.1s"}, usage={"db": str(tmp_path / "usage.db")})
    steward.wait_event("ready", engine="shared", timeout=30)
    assert steward.wait_event("listening")["pid"] == steward.process.pid
    # Its usage poll reads /metrics every 2 s; its health checks every 0.1 s.
    wait_until(lambda: metric(steward.url, "steward_engine_poll_lines", engine="shared", path="/metrics") >= 2
               and metric(steward.url, "steward_engine_poll_lines", engine="shared", path="/health") >= 5,
               "steward's polls of the engine counted")
    assert ask(steward.base_url, "shared").status_code == 200
    # The engine's other lines are kept: its startup, and the access-log line of a client's request.
    wait_until(lambda: any('"POST /v1/chat/completions HTTP/1.1" 200' in line
                           for line in steward.engine_lines("shared")), "the chat's access-log line")
    lines = steward.engine_lines("shared")
    assert any("vLLM API server version" in line for line in lines)
    assert not [line for line in lines if '"GET /metrics ' in line or '"GET /health ' in line]

    # A real front door polls this node every 0.1 s: answered, counted, no request event, no usage row.
    door = start_steward({}, nodes={"node": {"url": steward.url, "poll": "0.1s"}},
                         gpu={"probe": "none", "budget": "1GiB"})
    door.wait_event("node_state", node="node")
    wait_until(lambda: metric(steward.url, "steward_polls_answered", listener="openai", path="/steward/state") >= 5,
               "the front door's polls counted on the node")
    door.stop()
    steward.stop()
    assert [e["route"] for e in steward.events("request")] == ["/v1/chat/completions"]
    with sqlite3.connect(tmp_path / "usage.db") as db:
        assert [route for (route,) in db.execute("SELECT route FROM requests")] == ["/v1/chat/completions"]


def test_every_size_in_the_file_has_its_words_beside_the_bytes() -> None:
    record = json.loads(Event("load", "info", {"engine": "chat", "memory": 8912057139, "free": 0, "need": None,
                                               "per_device": [4 * GIB, 5 * GIB], "size_bytes": 512 * 1024**2},
                              0.0, 0.0).to_json())
    assert record["memory"] == 8912057139 and record["memory_text"] == "8.3 GiB"  # the bytes stay exact
    assert record["free_text"] == "0 B" and "need_text" not in record
    assert record["per_device_text"] == "[4.0 GiB, 5.0 GiB]" and record["size_text"] == "512.0 MiB"
    # Where a field's name says the wrong thing (a count of jobs), no words; a field already there is kept.
    released = json.loads(Event("image_force_release", "warning", {"released": 2}, 0.0, 0.0).to_json())
    assert "released_text" not in released
    kept = json.loads(Event("evict", "info", {"memory": GIB, "memory_text": "theirs"}, 0.0, 0.0).to_json())
    assert kept["memory_text"] == "theirs"


def test_a_why_reads_as_a_sentence() -> None:
    job = Job(id=7, model="chat", klass=RequestClass.INTERACTIVE, seq=1, submitted=0.0, deadline=1.0)
    assert LoadReason.of(job).words == "an interactive request waits for it"
    assert LoadReason.of(attrs.evolve(job, klass=RequestClass.BATCH), guard=True).words == \
        "the starvation guard lets a batch step run"


def test_the_demo_banner_names_steward_top(tmp_path: Path) -> None:
    assert "steward top http://127.0.0.1:8080" in banner("http://127.0.0.1:8080", tmp_path)


def test_a_record_read_back_reads_on_a_terminal_as_it_was_sent() -> None:
    """steward top draws the records of /admin/events with the terminal's line: the words are not said twice."""
    sent = Event("image_acquired", "info", {"job": 3, "memory": 6 * GIB, "outside": 512 * 1024**2}, 0.0, 0.0)
    record = json.loads(sent.to_json())
    fields = {key: value for key, value in record.items() if key not in RECORD_KEYS}
    assert Event(sent.name, sent.level, fields, 0.0, 0.0).to_line() == sent.to_line()
    assert sent.to_line().endswith("image_acquired job=3 memory=6.0 GiB outside=512.0 MiB")


@pytest.mark.slow
def test_a_verbose_llama_server_s_health_check_lines_are_counted_not_logged(start_steward: StewardFactory) -> None:
    steward = start_steward({"chat": fake_model("1GiB", extra=["--verbose"])}, gpu={"probe": "none", "budget": "4GiB"},
                            engines={"health_check_interval": "0.1s"})
    assert ask(steward.base_url, "chat").status_code == 200
    wait_until(lambda: metric(steward.url, "steward_engine_poll_lines", engine="chat", path="/health") >= 5,
               "its health checks counted")
    wait_until(lambda: any("request: POST /v1/chat/completions" in line for line in steward.engine_lines("chat")),
               "the chat's line kept")
    assert not [line for line in steward.engine_lines("chat") if "request: GET /health" in line
                and line.endswith(" 200")]
