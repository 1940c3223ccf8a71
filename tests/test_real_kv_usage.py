"""The KV-cache figure of the cluster contract (vllm:kv_cache_usage_perc) from the REAL llama-server
(CPU build, llama.cpp from llama-cpp-python 0.3.36) and SmolLM2-135M-Instruct, through steward.

While a prompt of N token ids is answered, the engine's /slots says its computing slot holds the
prompt and the tokens decoded so far (``n_prompt_tokens``), and steward's gauge is that over the
engine's cache: two separate 2048-token slots (``--parallel 2 -c 4096``) make 4096 cells; four
slots sharing one cache (the number of slots left to llama-server, with ``-c 2048``) make 2048,
however many slots. Once the client has left the slot is idle, its cache kept but free: 0.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fakes.llama_binary import llama_server_path
from fakes.real_model import smollm2_gguf
from tests.conftest import RunningSteward, launch_steward
from tests.test_deploy import wait_until

pytestmark = pytest.mark.slow

PROMPT = 600  # token ids: N tokens to llama-server, whatever they say
# Decoded past the end of text, so the slot computes for as long as the test looks; the client
# leaves once it has seen the figure (the slot stops then), so a fast host waits no longer for it.
ANSWER = 1400
CAPACITY = {"split": 4096, "shared": 2048}


@pytest.fixture(scope="module")
def steward(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSteward]:
    binary, model = str(llama_server_path()), str(smollm2_gguf())
    models = {"split": {"command": binary, "model": model, "args": ["-c", "4096", "--threads", "1"], "parallel": 2},
              "shared": {"command": binary, "model": model, "args": ["-c", "2048", "--threads", "1"]}}
    registry: list[RunningSteward] = []
    launch_steward(tmp_path_factory.mktemp("real-kv"), models, registry, gpu={"probe": "host", "budget": "4GiB"})
    yield registry[0]
    assert registry[0].stop() == 0


@pytest.fixture(autouse=True)
def no_leaked_children() -> Iterator[None]:
    yield  # the module's steward lives across tests; its stop, above, checks it ends cleanly


def kv_gauge(steward: RunningSteward, model: str) -> float | None:
    page = httpx.get(f"{steward.url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(page):
        if family.name == "vllm:kv_cache_usage_perc":
            return next((s.value for s in family.samples if s.labels["model_name"] == model), None)
    return None


def engine_kv(steward: RunningSteward, model: str) -> float | None:
    """What the engine said of its KV cache, as /healthz shows it (None: nothing yet)."""
    load = httpx.get(f"{steward.url}/healthz", timeout=10).json()["engines"][model]["engine_load"]
    return None if load is None else load["kv_usage"]


@pytest.mark.parametrize("model", ["split", "shared"])
def test_the_kv_gauge_is_the_computing_slots_tokens_over_the_engines_cache(steward: RunningSteward,
                                                                          model: str) -> None:
    capacity, answers, seen = CAPACITY[model], [], threading.Event()

    def complete() -> None:
        with httpx.stream("POST", f"{steward.base_url}/completions", timeout=120, json={
                "model": model, "prompt": [1000] * PROMPT, "max_tokens": ANSWER, "ignore_eos": True,
                "temperature": 0, "stream": True}) as answer:
            answers.append(answer.status_code)
            for _ in answer.iter_bytes():
                if seen.is_set():
                    break  # the client leaves: steward stops the slot

    computing = threading.Thread(target=complete)
    computing.start()
    try:
        # The engine's figure: at least the prompt (llama-server may add a BOS), at most prompt and answer.
        said = wait_until(lambda: (kv := engine_kv(steward, model)) and kv, "the engine's KV figure", timeout=60)
        assert PROMPT / capacity <= said <= (PROMPT + 1 + ANSWER) / capacity, said
        gauge = kv_gauge(steward, model)  # the cluster's gauge is that figure (a later poll's, maybe)
        assert gauge is not None and PROMPT / capacity <= gauge <= (PROMPT + 1 + ANSWER) / capacity, gauge
        assert gauge != 1 / (2 if model == "split" else 4)  # not the busy-slot share it falls back to
    finally:
        seen.set()
        computing.join(120)
    assert answers == [200]
    wait_until(lambda: kv_gauge(steward, model) == 0.0, "the idle slot's cache counts as free", timeout=30)
