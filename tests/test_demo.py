"""``steward demo`` as a person runs it: the banner, the OpenAI SDK against it, Ctrl-C.

The fake demo needs nothing; ``--real`` needs the llama-server build (the test fails, never
skips, with the command that builds it, as tests/test_real_engines.py does).
"""

from __future__ import annotations

import base64
import contextlib
import io
import re
import signal
import subprocess
import sys
import time
import warnings
import wave
from collections.abc import Iterator
from pathlib import Path

import anthropic
import attrs
import openai
import pytest
from PIL import Image

from fakes.llama_binary import llama_server_path
from supervisor.tools.demo import banner
from tests.conftest import ROOT
from tests.fake_processes import wait_until

REAL_CHAT = "SmolLM2-135M-Instruct answers under the chat names (gemma4-12b, gemma4-e4b, gemma4-e2b)"
SYSTEM = "You are a helpful assistant."  # tests/test_real_model.py's: SmolLM2 names Paris with it


@attrs.frozen
class Demo:
    banner: str  # what it printed up to its event log's line
    base_url: str
    event_log: Path

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key="none", max_retries=0, timeout=60)

    def anthropic(self) -> anthropic.Anthropic:
        # Anthropic's SDK adds /v1 itself: its base URL is steward's own.
        return anthropic.Anthropic(base_url=self.base_url.removesuffix("/v1"), api_key="none", max_retries=0,
                                   timeout=60)


def answers_the_agent_apis(demo: Demo, model: str) -> None:
    """OpenAI's Responses API and Anthropic's Messages through the demo, changed only in the base URL.
    Greedy (temperature 0): a tiny real model sampled may end its answer at its first token, and
    llama-server's stream then lacks message_start (tests/test_real_apis.py)."""
    answer = demo.client().responses.create(model=model, input="hello", max_output_tokens=3, temperature=0)
    assert answer.status == "completed" and answer.output_text and answer.model == model
    streamed = list(demo.client().responses.create(model=model, input="hi", max_output_tokens=2, stream=True,
                                                   temperature=0))
    assert streamed[-1].type == "response.completed"
    claude = demo.anthropic()
    message = claude.messages.create(model=model, max_tokens=3, extra_body={"temperature": 0},
                                     messages=[{"role": "user", "content": "hello"}])
    assert message.content[0].text and message.model == model
    with claude.messages.stream(model=model, max_tokens=2, extra_body={"temperature": 0},
                                messages=[{"role": "user", "content": "hi"}]) as stream:
        assert stream.get_final_message().usage.output_tokens == 2
    assert claude.messages.count_tokens(model=model, messages=[{"role": "user", "content": "hi"}]).input_tokens > 0


@contextlib.contextmanager
def running_demo(*flags: str) -> Iterator[Demo]:
    """``steward demo --port 0 FLAGS`` until its banner is out; then Ctrl-C, and it must exit 0."""
    process = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "demo", "--port", "0", *flags],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    try:
        assert process.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 60
        while not any("event log" in line for line in lines) and time.monotonic() < deadline:
            if not (line := process.stdout.readline()):
                break  # it exited
            lines.append(line)
        text = "".join(lines)
        base_url, event_log = re.search(r"OpenAI base URL\s+(\S+)", text), re.search(r"event log\s+(\S+)", text)
        assert base_url and event_log, f"the demo did not print its URL and event log: {text!r}"
        yield Demo(text, base_url.group(1), Path(event_log.group(1)))
    finally:
        process.send_signal(signal.SIGINT)
        status = process.wait(30)
    assert status == 0


@pytest.mark.slow
def test_demo_answers_the_openai_sdk_and_stops_on_ctrl_c() -> None:
    with running_demo() as demo:
        client = demo.client()
        ids = {m.id for m in client.models.list()}
        assert {"gemma4-12b", "gemma4-e4b", "gemma4-e2b", "nomic-embed", "gpt-4o"} <= ids
        reply = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hello"}],
                                               max_tokens=4)
        assert reply.choices[0].message.content
        stream = client.chat.completions.create(model="gemma4-e2b@background", stream=True, max_tokens=3,
                                                messages=[{"role": "user", "content": "hi"}])
        assert len([c for c in stream if c.choices and c.choices[0].delta.content]) == 3
        embedded = client.embeddings.create(model="nomic-embed", input=["a", "b"])
        assert len(embedded.data) == 2 and len(embedded.data[0].embedding) == 64
        # The always-on fake vLLM, behind the same queue.
        shared = client.chat.completions.create(model="agents", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=4)
        assert shared.model == "qwen3-4b-shared" and shared.usage is not None
        assert shared.usage.completion_tokens == 4
        answers_the_agent_apis(demo, "gemma4-e2b")
        # An image, from the fake ComfyUI, as the GPU's one job for a moment.
        image = client.images.generate(model="sketch", prompt="a lighthouse", size="64x64",
                                       response_format="b64_json")
        Image.open(io.BytesIO(base64.b64decode(image.data[0].b64_json or ""))).verify()
        # Speech, from the fake Kokoro-FastAPI, loaded on demand; a WAV the standard library reads.
        speech = client.audio.speech.create(model="tts-1", voice="af_heart", input="Hello from steward.",
                                            response_format="wav")
        with wave.open(io.BytesIO(speech.content)) as audio:
            assert audio.getframerate() == 24_000 and audio.getnframes() > 0
        # A video: queued at once, made by the fake ComfyUI, an animated WEBP of seconds * fps frames.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the SDK's note on OpenAI's own Sora API
            video = client.videos.create(model="clip", prompt="waves", seconds="4", size="1280x720")
            wait_until(lambda: client.videos.retrieve(video.id).status == "completed", timeout=60)
            clip = Image.open(io.BytesIO(client.videos.download_content(video.id).content))
        assert clip.n_frames == 16 and clip.size == (1280, 720)
        assert REAL_CHAT not in demo.banner
    assert not demo.event_log.parent.exists()  # the demo's folder goes with it (unless --keep)


@pytest.fixture(scope="module")
def binary() -> str:
    return str(llama_server_path())  # fails (never skips) with the build command when missing


@pytest.mark.slow
def test_the_real_demo_answers_in_words_under_the_chat_names(binary: str) -> None:
    with running_demo("--real") as demo:
        assert REAL_CHAT in " ".join(demo.banner.split())
        client = demo.client()
        reply = client.chat.completions.create(model="gpt-4o", max_tokens=24, temperature=0, messages=[
            {"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is the capital of France?"}])
        assert reply.model == "gemma4-12b"  # the model gpt-4o names, not the path of its GGUF
        assert "Paris" in (reply.choices[0].message.content or "")
        # The banner's first example, as it is written there: an answer a person reads, which ends.
        hello = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hello"}])
        assert hello.choices[0].finish_reason == "stop" and re.search(r"[A-Za-z]{2,} [A-Za-z]{2,}",
                                                                       hello.choices[0].message.content or "")
        stream = client.chat.completions.create(model="gemma4-e2b", stream=True, max_tokens=2,
                                                messages=[{"role": "user", "content": "hi"}])
        assert {chunk.model for chunk in stream} == {"gemma4-e2b"}
        completion = client.completions.create(model="gemma4-e4b", prompt="hi", max_tokens=2)
        assert completion.model == "gemma4-e4b"
        answers_the_agent_apis(demo, "gemma4-e2b")
        # A slot holds the model's trained context, and a longer prompt is told so.
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="gemma4-e2b", max_tokens=1,
                                           messages=[{"role": "user", "content": "word " * 9000}])
        assert caught.value.code == "context_length_exceeded" and "a slot of it holds 8,192" in caught.value.message
        assert caught.value.message.endswith("shorten the prompt (a slot already holds the model's trained context, "
                                             "8,192)")
    assert not demo.event_log.parent.exists()


def test_the_real_demos_banner_names_its_model_its_slots_and_its_random_embedder(tmp_path: Path) -> None:
    real = " ".join(banner("http://127.0.0.1:8080", tmp_path, real=True).split())
    assert REAL_CHAT in real and "Each slot holds 8,192 tokens, the model's trained context" in real
    assert "The embedder (nomic-embed) is a tiny model of random weights" in real
    assert "random" not in banner("http://127.0.0.1:8080", tmp_path)


def test_the_fake_demos_banner_shows_an_image_request_and_the_real_ones_does_not(tmp_path: Path) -> None:
    fake = banner("http://127.0.0.1:8080", tmp_path)
    assert "http://127.0.0.1:8080/v1/images/generations" in fake and '"model": "sketch"' in fake
    assert "curl -s http://127.0.0.1:8080/v1/videos -F model=clip" in fake
    assert "images/generations" not in banner("http://127.0.0.1:8080", tmp_path, real=True)
    assert "http://127.0.0.1:8080/v1/audio/speech" in fake and '"model": "kokoro"' in fake
    assert "audio/speech" not in banner("http://127.0.0.1:8080", tmp_path, real=True)
