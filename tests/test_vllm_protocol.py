"""What steward relies on in the real vLLM's answers, asked of vLLM directly (no steward).

One server (fakes/tiny_hf.py's model, tests/vllm_server.py) serves the whole module: it
takes about a minute to start. Greedy decoding of the tiny model never stops early, so a
reply is exactly max_tokens tokens.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import attrs
import httpx
import openai
import pytest

from fakes.tiny_hf import write_tiny_model
from supervisor.process_tree import read_parents, rss_bytes, tree_of
from tests.vllm_server import require_vllm_python, running_vllm

pytestmark = pytest.mark.slow

NAME = "tiny"
MAX_TOKENS = 4
CHAT = [{"role": "user", "content": "hello"}]


@attrs.frozen
class Server:
    process: subprocess.Popen[bytes]
    base_url: str

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="x", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    require_vllm_python()
    log = Path(tmp_path_factory.mktemp("vllm")) / "vllm.log"
    with running_vllm(write_tiny_model(), NAME, log=log) as (process, base_url):
        yield Server(process, base_url)


def test_health_is_200_with_an_empty_body(vllm: Server) -> None:
    reply = httpx.get(f"{vllm.base_url}/health", timeout=10)
    assert reply.status_code == 200
    assert reply.content == b""


def test_models_lists_the_served_name(vllm: Server) -> None:
    models = vllm.client().models.list()
    assert [m.id for m in models.data] == [NAME]
    assert models.data[0].model_extra is not None and models.data[0].model_extra["max_model_len"] == 512


def test_chat_completion(vllm: Server) -> None:
    reply = vllm.client().chat.completions.create(model=NAME, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == MAX_TOKENS
    assert reply.model == NAME


def test_streamed_chat_ends_with_a_usage_chunk_then_done(vllm: Server) -> None:
    body = {"model": NAME, "messages": CHAT, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{vllm.base_url}/v1/chat/completions", json=body, timeout=60) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        events = [line.removeprefix("data: ") for line in reply.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == MAX_TOKENS
    assert all(chunk.get("usage") is None for chunk in chunks[:-1])  # vLLM leaves the key out
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1])
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


def test_streamed_chat_with_the_openai_client(vllm: Server) -> None:
    stream = vllm.client().chat.completions.create(model=NAME, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0,
                                                   stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == MAX_TOKENS


def test_unknown_model_is_404_with_the_error_shape(vllm: Server) -> None:
    body = {"model": "nope", "messages": CHAT, "max_tokens": 1}
    reply = httpx.post(f"{vllm.base_url}/v1/chat/completions", json=body, timeout=30)
    assert reply.status_code == 404
    error = reply.json()["error"]
    assert error.keys() >= {"message", "type", "param", "code"}
    assert (error["type"], error["param"], error["code"]) == ("NotFoundError", "model", 404)
    with pytest.raises(openai.NotFoundError):
        vllm.client().chat.completions.create(model="nope", messages=CHAT, max_tokens=1)


def test_metrics_has_the_running_and_waiting_gauges(vllm: Server) -> None:
    reply = httpx.get(f"{vllm.base_url}/metrics", timeout=10)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    lines = reply.text.splitlines()
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert f"# TYPE {gauge} gauge" in lines
        samples = [line for line in lines if line.startswith(f"{gauge}{{")]
        assert samples and all(f'model_name="{NAME}"' in line for line in samples), samples
        assert float(samples[0].rsplit(" ", 1)[1]) == 0  # nothing in flight between tests


def test_the_memory_is_in_child_processes(vllm: Server) -> None:
    own = rss_bytes(vllm.process.pid)
    children = [rss_bytes(pid) or 0 for pid in tree_of(vllm.process.pid, read_parents()) - {vllm.process.pid}]
    assert own is not None and children
    assert sum(children) > own
