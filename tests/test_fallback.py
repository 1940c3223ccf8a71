"""Fallback chains through a real steward (issue 31): the answer, its header, the usage row and
the `fallback` event say what served a request and why; a key's models bound the fallback."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import openai
import pytest

from supervisor.auth.keys import add_key
from tests.conftest import StewardFactory, fake_model

pytestmark = pytest.mark.slow  # every test here starts steward as a real process

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
MODELS = {"chat": fake_model("10GiB"),
          "big": fake_model("12GiB", fallback=[{"model": "small", "when": ["no_room"], "classes": ["background"]}]),
          "small": fake_model("4GiB")}


def test_a_background_request_that_would_evict_a_hot_chat_is_served_by_the_smaller_model(
        start_steward: StewardFactory, tmp_path: Path) -> None:
    steward = start_steward(MODELS, gpu={"probe": "none", "budget": "16GiB"}, usage={"db": str(tmp_path / "u.db")})
    client = openai.OpenAI(base_url=steward.base_url, api_key="none", max_retries=0)
    client.chat.completions.create(model="chat", **CHAT)  # chat is hot now: background may not evict it
    raw = client.chat.completions.with_raw_response.create(model="big", extra_headers={"X-Steward-Class": "background"},
                                                           **CHAT)
    answer = raw.parse()
    assert (answer.model, raw.headers["x-steward-model"]) == ("small", "small")
    assert answer.choices[0].message.content
    moved = steward.wait_event("fallback")
    assert (moved["model"], moved["to"], moved["class"], moved["when"]) == ("big", "small", "background", "no_room")
    assert moved["why"].startswith("background request for big goes to small: ")
    assert not steward.events("evict")  # chat stayed
    # An interactive request for big keeps its model (the route is for background only).
    assert client.chat.completions.create(model="big", **CHAT).model == "big"
    steward.stop()
    with sqlite3.connect(tmp_path / "u.db") as db:
        rows = db.execute("SELECT model, engine, class FROM requests ORDER BY ts").fetchall()
    assert rows == [("chat", "chat", "interactive"), ("big", "small", "background"), ("big", "big", "interactive")]


def test_a_fallback_never_goes_to_a_model_the_key_may_not_use(start_steward: StewardFactory, tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    agent = add_key(keys, "agent", models=["chat", "big"], known_models=list(MODELS)).split()[-1]
    steward = start_steward(MODELS, gpu={"probe": "none", "budget": "16GiB"}, auth={"keys_file": str(keys)},
                            classes={"background": {"queue_timeout": "1s"}})
    headers = {"authorization": f"Bearer {agent}"}
    assert httpx.post(f"{steward.base_url}/chat/completions", headers=headers, timeout=30,
                      json={"model": "chat", **CHAT}).status_code == 200
    waited = httpx.post(f"{steward.base_url}/chat/completions", timeout=30,
                        headers={**headers, "x-steward-class": "background"}, json={"model": "big", **CHAT})
    assert waited.status_code == 503 and waited.json()["error"]["code"] == "queue_timeout"  # as without a chain
    assert not steward.events("fallback")
