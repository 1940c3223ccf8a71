"""Several hosts on one machine: node stewards and a front door steward on loopback, fake
engines behind them. Routing by residency and by free memory, a capability served by its
second choice (its answer, streamed or not, and its usage row name the model that served
it), a node stopped mid-request, and a sleeping node woken by its magic packet (received
by a UDP listener here) and started by the test, while its request waits.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from supervisor.nodes.wake import MacAddress, magic_packet
from tests.conftest import ROOT, RunningSteward, StewardFactory, fake_model, free_port
from tests.test_front_door import usage_rows
from tests.test_top import tmux, wait_pane  # noqa: F401 - tmux: a fixture

pytestmark = pytest.mark.slow
GPU = {"probe": "none", "budget": "24GiB"}
MAC = "aa:bb:cc:dd:ee:01"


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3, **extra}


def front_door(start_steward: StewardFactory, nodes: dict[str, RunningSteward | dict[str, Any]],
               **sections: Any) -> RunningSteward:
    section = {name: node if isinstance(node, dict) else {"url": node.url, "poll": "0.2s"}
               for name, node in nodes.items()}
    steward = start_steward({}, gpu=GPU, nodes=section, **sections)
    return steward


def routes(steward: RunningSteward) -> list[tuple[str, str, str]]:
    return [(e["node"], e["model"], e["reason"]) for e in steward.events("route")]


def test_a_front_door_routes_by_residency_then_by_free_memory(start_steward: StewardFactory) -> None:
    big = start_steward({"hog": fake_model("20GiB"), "m": fake_model("8GiB")}, gpu=GPU)
    small = start_steward({"qwen": fake_model("8GiB"), "m": fake_model("8GiB")}, gpu=GPU)
    httpx.post(f"{small.base_url}/chat/completions", json=chat("qwen"), timeout=30)  # qwen resident on small
    httpx.post(f"{big.base_url}/chat/completions", json=chat("hog"), timeout=30)  # hog hot on big: 4 GiB free
    door = front_door(start_steward, {"big": big, "small": small})
    door.wait_event("node_state", node="small", availability="awake")
    client = openai.OpenAI(base_url=door.base_url, api_key="none", max_retries=0)
    assert {m.id for m in client.models.list()} >= {"qwen", "hog", "m"}  # the union of the nodes' models
    assert client.chat.completions.create(**chat("qwen")).choices
    assert client.chat.completions.create(**chat("m")).choices
    assert client.chat.completions.create(**chat("hog")).choices
    assert routes(door) == [("small", "qwen", "resident"), ("small", "m", "fits"), ("big", "hog", "resident")]


def test_a_capability_is_served_by_its_second_choice_when_the_first_cannot_fit(start_steward: StewardFactory,
                                                                               tmp_path: Path) -> None:
    node = start_steward({"huge": fake_model("20GiB"), "little": fake_model("2GiB"),
                          "chat": fake_model("8GiB")}, gpu=GPU)
    httpx.post(f"{node.base_url}/chat/completions", json=chat("chat"), timeout=30)  # hot: huge cannot fit by it
    door = front_door(start_steward, {"lab": node}, capabilities={"reasoning": ["huge", "little"]},
                      usage={"db": str(tmp_path / "door-usage.db")})
    door.wait_event("node_state", node="lab", availability="awake")
    reply = httpx.post(f"{door.base_url}/chat/completions", json=chat("reasoning"), timeout=30)
    assert reply.status_code == 200 and reply.headers["x-steward-model"] == "little"
    assert reply.json()["model"] == "little"  # the answer names the model that served it (the engine's own name not)
    assert door.wait_event("capability")["model"] == "little"
    assert routes(door) == [("lab", "little", "fits")]

    client = openai.OpenAI(base_url=door.base_url, api_key="x", max_retries=0)
    assert client.chat.completions.create(**chat("reasoning")).model == "little"
    chunks = list(client.chat.completions.create(**chat("reasoning"), stream=True))
    assert chunks and {chunk.model for chunk in chunks} == {"little"}
    door.stop()  # every usage row written
    rows = usage_rows(tmp_path / "door-usage.db")
    assert [(row["model"], row["engine"]) for row in rows] == [("little", "node:lab")] * 3  # not "reasoning"
    # The stream's too: a client that closes once it has [DONE] was served in full.
    assert [row["status"] for row in rows] == [200, 200, 200]


def test_a_node_stopped_mid_request_gives_a_clean_error_and_new_requests_go_elsewhere(
        start_steward: StewardFactory) -> None:
    first = start_steward({"qwen": fake_model("8GiB", tps=20)}, gpu=GPU)
    second = start_steward({"qwen": fake_model("8GiB")}, gpu=GPU)
    httpx.post(f"{first.base_url}/chat/completions", json=chat("qwen"), timeout=30)  # resident on first
    door = front_door(start_steward, {"first": first, "second": second})
    door.wait_event("node_state", node="first", availability="awake")
    with httpx.stream("POST", f"{door.base_url}/chat/completions", timeout=30,
                      json=chat("qwen", max_tokens=400, stream=True)) as stream:
        chunks = stream.iter_bytes()
        assert b"data:" in next(chunks)
        first.process.kill()  # the node's host goes away mid-answer
        rest = b"".join(chunks)
    assert b'"error"' in rest and b"[DONE]" not in rest  # an error event in the stream, not a hang
    reply = httpx.post(f"{door.base_url}/chat/completions", json=chat("qwen"), timeout=30)
    assert reply.status_code == 200
    assert routes(door)[-1][0] == "second"


class UdpListener:
    """Receives the magic packets a front door sends (a test cannot receive real broadcasts)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(30)
        self.port = self.sock.getsockname()[1]

    def receive(self) -> bytes:
        return self.sock.recvfrom(2048)[0]


def test_a_sleeping_node_is_woken_and_the_request_waits_for_it(start_steward: StewardFactory) -> None:
    udp = UdpListener()
    port = free_port()
    sleepy = {"url": f"http://127.0.0.1:{port}", "poll": "0.2s", "models": ["qwen"],
              "wake": {"mac": MAC, "broadcast": "127.0.0.1", "port": udp.port, "timeout": "60s"}}
    door = front_door(start_steward, {"sleepy": sleepy})
    door.wait_event("node_state", node="sleepy", availability="asleep")
    answers: list[httpx.Response] = []
    asking = threading.Thread(target=lambda: answers.append(httpx.post(
        f"{door.base_url}/chat/completions", json=chat("qwen"), timeout=90)))
    asking.start()
    packet = udp.receive()
    sent_at = time.monotonic()
    assert packet == magic_packet(MacAddress.parse(MAC))
    node = start_steward({"qwen": fake_model("8GiB")}, gpu=GPU, listen=f"127.0.0.1:{port}")  # the machine wakes
    asking.join(90)
    assert answers and answers[0].status_code == 200, answers
    woken = door.wait_event("node_woken", node="sleepy")
    assert woken["after_s"] > 0 and time.monotonic() - sent_at < 90
    assert routes(door) == [("sleepy", "qwen", "fits")]
    assert node.events("dispatch")  # it was served by the node that woke


def test_a_node_that_does_not_wake_in_time_is_503_with_retry_after(start_steward: StewardFactory) -> None:
    udp = UdpListener()
    sleepy = {"url": f"http://127.0.0.1:{free_port()}", "poll": "0.2s", "models": ["qwen"],
              "wake": {"mac": MAC, "broadcast": "127.0.0.1", "port": udp.port, "timeout": "1s"}}
    door = front_door(start_steward, {"sleepy": sleepy})
    door.wait_event("node_state", node="sleepy", availability="asleep")
    reply = httpx.post(f"{door.base_url}/chat/completions", json=chat("qwen"), timeout=30)
    assert reply.status_code == 503 and reply.json()["error"]["code"] == "node_asleep"
    assert int(reply.headers["retry-after"]) >= 1
    assert udp.receive() == magic_packet(MacAddress.parse(MAC))
    door.wait_event("node_wake_timeout", node="sleepy")


def test_a_front_door_serves_every_api_of_its_nodes(start_steward: StewardFactory) -> None:
    node = start_steward({"chat": fake_model("2GiB"), "asr": fake_model("1GiB", extra=["--mmproj", "/m/audio.gguf"])},
                         gpu=GPU)
    door = front_door(start_steward, {"lab": node})
    door.wait_event("node_state", node="lab", availability="awake")
    claude = anthropic.Anthropic(base_url=door.url, api_key="none", max_retries=0, timeout=30)
    message = claude.messages.create(model="chat", max_tokens=3, messages=[{"role": "user", "content": "hi"}])
    assert message.model == "chat" and message.content[0].text  # named as the door names it
    with claude.messages.stream(model="chat@background", max_tokens=3,
                                messages=[{"role": "user", "content": "hi"}]) as stream:
        started = next(event for event in stream if event.type == "message_start")
        assert started.message.model == "chat"
        assert stream.get_final_message().usage.output_tokens == 3
    client = openai.OpenAI(base_url=door.base_url, api_key="none", max_retries=0, timeout=30)
    events = list(client.responses.create(model="chat", input="hi", max_output_tokens=2, stream=True))
    assert events[-1].type == "response.completed" and events[-1].response.model == "chat"
    heard = client.audio.transcriptions.create(model="asr", file=("a.wav", b"RIFF" + b"\0" * 64, "audio/wav"))
    assert heard.text == "transcript of 68 bytes"
    assert [(node, model) for node, model, _ in routes(door)] == [("lab", "chat")] * 3 + [("lab", "asr")]
    assert [d["class"] for d in node.events("dispatch") if d["model"] == "chat"][-3:] == [
        "interactive", "background", "interactive"]  # the class travels to the node
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.messages.create(model="nowhere", max_tokens=1, messages=[{"role": "user", "content": "hi"}])
    assert missing.value.body == {"type": "error", "error": {"type": "not_found_error",
                                                             "message": "The model 'nowhere' does not exist."}}


def test_the_front_door_shows_its_fleet_and_the_request_it_holds_for_a_sleeping_node(
        start_steward: StewardFactory) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from supervisor.top.model import Top
    from tests.test_top import screen

    udp = UdpListener()
    port = free_port()
    awake = start_steward({"chat": fake_model("8GiB")}, gpu=GPU)
    sleepy = {"url": f"http://127.0.0.1:{port}", "poll": "0.2s", "models": ["qwen"],
              "wake": {"mac": MAC, "broadcast": "127.0.0.1", "port": udp.port, "timeout": "50s"}}
    door = front_door(start_steward, {"a": awake, "b": sleepy})
    door.wait_event("node_state", node="b", availability="asleep")
    door.wait_event("node_state", node="a", availability="awake")
    answers: list[httpx.Response] = []
    asking = threading.Thread(target=lambda: answers.append(httpx.post(
        f"{door.base_url}/chat/completions", json=chat("qwen"), timeout=150)))
    asking.start()
    try:
        udp.receive()  # the magic packet: the request is held from before it was sent
        state = httpx.get(f"{door.url}/admin/state", timeout=10).json()
        nodes = {node["name"]: node for node in state["nodes"]}
        assert (nodes["a"]["state"], nodes["b"]["state"]) == ("awake", "waking")
        b = nodes["b"]
        assert b["since"] <= state["time"] and 0 <= b["for_s"] < 60
        assert b["last_poll"]["answered"] is False and 0 <= b["last_poll"]["age_s"] < 60
        assert (b["serves"], b["held"], b["wake_timeout_s"]) == (["qwen"], 1, 50.0)
        assert b["wake_deadline"] == pytest.approx(b["since"] + 50.0, abs=0.01)
        assert nodes["a"]["models"][0]["name"] == "chat" and nodes["a"]["devices"][0]["free_text"] == "24.0 GiB"
        [held] = state["held"]
        assert (held["node"], held["model"], held["class"], held["bound"]) == ("b", "qwen", "interactive",
                                                                             "wake_timeout")
        assert held["deadline"] == pytest.approx(held["since"] + 50.0, abs=0.01) and held["limit_s"] == 50.0
        assert held["why"].startswith("interactive request for qwen waits for node b to wake: ")
        assert held["why"].endswith(" of 50s (the node's wake.timeout)")
        assert state["classes"]["interactive"]["held"] == 1 and state["engines"] == []
        assert [(line["node"], line["reason"]) for line in state["waiting"]] == [("b", "node_waking")]

        health = door.health()
        # Its waiting list is not empty while one is held.
        assert [line["why"].split(": ")[0] for line in health["waiting"]] == [held["why"].split(": ")[0]]
        assert {node["name"]: node["state"] for node in health["nodes"]} == {"a": "awake", "b": "waking"}
        assert [entry["node"] for entry in health["held"]] == ["b"]

        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in text_string_to_metric_families(httpx.get(f"{door.url}/metrics", timeout=10).text)
                   for s in family.samples}
        assert samples["steward_node_state", (("node", "b"), ("state", "waking"))] == 1.0
        assert samples["steward_node_state", (("node", "a"), ("state", "awake"))] == 1.0
        assert samples["steward_held_requests", (("node", "b"),)] == 1.0
        assert samples["steward_held_requests", (("node", "a"),)] == 0.0
        assert 0 <= samples["steward_node_last_poll_age_seconds", (("node", "b"),)] < 60
        device = nodes["a"]["devices"][0]["device"]
        assert samples["steward_node_free_bytes", (("device", device), ("node", "a"))] == 24 * 1024**3
        assert not [key for key in samples if key[0] == "steward_node_free_bytes" and ("node", "b") in key[1]]
        assert samples["steward_route_waits_total", (("node", "b"),)] == 1.0

        # steward top on the front door: the nodes and the held request, no bar of its own 1 GiB budget.
        top = Top(door.url)
        top.saw_state(state)
        lines = screen(top.frame(), width=100, height=24)
        print("\n".join(lines))  # the capture of top on a front door with a sleeping node
        assert not any("free of" in line for line in lines)
        assert next(line for line in lines if line.startswith("2 b")).split()[2] == "waking"
        assert any("waits for node b to wake:" in line for line in lines)
        # Its key switches to node a's own view, read by the front door with its key for the node.
        top.press("1")
        node_state = httpx.get(f"{door.url}{top.state_path()}", timeout=10).json()
        assert [engine["name"] for engine in node_state["engines"]] == ["chat"]
        top.saw_state(node_state, node="a")
        node_lines = screen(top.frame(), width=100, height=12)
        print("\n".join(node_lines))
        assert node_lines[0].startswith(f"steward {door.url.removeprefix('http://')} › node a")
        assert any(line.split()[:2] == ["chat", "stopped"] for line in node_lines)
        missing = httpx.get(f"{door.url}/admin/nodes/nowhere/state", timeout=10)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "node_not_found"
        asleep = httpx.get(f"{door.url}/admin/nodes/b/state", timeout=10)
        assert asleep.status_code == 503 and "cannot be reached" in asleep.json()["error"]["message"]
    finally:
        start_steward({"qwen": fake_model("8GiB")}, gpu=GPU, listen=f"127.0.0.1:{port}")  # the machine wakes
        asking.join(150)
    assert answers and answers[0].status_code == 200, answers
    state = httpx.get(f"{door.url}/admin/state", timeout=10).json()
    assert state["held"] == [] and state["waiting"] == []  # it proceeded: held no more
    assert {node["name"]: node["state"] for node in state["nodes"]} == {"a": "awake", "b": "awake"}


def test_top_on_a_front_door_switches_to_a_node_s_own_view_by_its_key_and_back(
        start_steward: StewardFactory, tmux: Callable[..., str]) -> None:
    awake = start_steward({"chat": fake_model("8GiB")}, gpu=GPU)
    sleepy = {"url": f"http://127.0.0.1:{free_port()}", "poll": "0.2s", "models": ["qwen"],
              "wake": {"mac": MAC, "broadcast": "127.0.0.1", "port": UdpListener().port, "timeout": "50s"}}
    door = front_door(start_steward, {"a": awake, "b": sleepy})
    door.wait_event("node_state", node="b", availability="asleep")
    tmux("new-session", "-d", "-s", "top", "-x", "100", "-y", "30", "-c", str(ROOT),
         f"{sys.executable} -m supervisor.cli top {door.url}")

    def header(pane: str) -> str:
        return pane.splitlines()[0] if pane else ""

    def row(pane: str, first: str) -> list[str]:
        return next((line.split() for line in pane.splitlines() if line.startswith(first + " ")), [])

    pane = wait_pane(tmux, lambda p: row(p, "1 a")[2:3] == ["awake"] and row(p, "2 b")[2:3] == ["asleep"],
                     "the nodes, a awake and b asleep")
    assert "free of" not in pane and header(pane).endswith("1-9 node  p pause  e events  q quit")
    tmux("send-keys", "-t", "top", "1")
    pane = wait_pane(tmux, lambda p: "› node a" in header(p) and row(p, "chat")[1:2] == ["stopped"],
                     "node a's own view: its engine")
    assert "0 fleet  n next  p pause  e events  q quit" in pane  # beside the header, or the events' title
    tmux("send-keys", "-t", "top", "n")  # the next node: b sleeps, and the front door says so
    wait_pane(tmux, lambda p: "› node b" in header(p) and "node 'b' cannot be reached" in p, "node b unreachable")
    tmux("send-keys", "-t", "top", "0")
    wait_pane(tmux, lambda p: "›" not in header(p) and row(p, "2 b")[2:3] == ["asleep"], "the fleet again")
    tmux("send-keys", "-t", "top", "q")
    deadline = time.monotonic() + 30
    while "top" in tmux("list-sessions", "-F", "#{session_name}", check=False).split():
        assert time.monotonic() < deadline, "top did not quit on q"
        time.sleep(0.05)
