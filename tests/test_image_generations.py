"""POST /v1/images/generations through steward, with the official `openai` client, in front of
a fake ComfyUI (a real process) on the simulated GPU: one exclusive image job per request,
every image's workflow filled from the request, the images as b64_json or as URLs steward
serves, errors in OpenAI's shape, and a client that leaves stopping its job."""

from __future__ import annotations

import base64
import io
import json
import socket
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from PIL import Image

from supervisor.auth.keys import add_key
from tests import test_comfy_listener
from tests.conftest import RunningSteward, StewardFactory, fake_model
from tests.test_comfy_listener import names, steward_with

pytestmark = pytest.mark.slow

comfy = test_comfy_listener.comfy  # the fake ComfyUI, a fixture
PHASES = ["image_queued", "image_granted", "image_forwarded", "image_finished", "image_freed", "image_released"]


def sketch(seconds: float = 0.3, *, error: bool = False) -> dict[str, Any]:
    """A text-to-image workflow in ComfyUI's API format, as "Export (API)" writes one."""
    sampler = "FAKE_ERROR" if error else "KSampler"
    return {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "fake.safetensors"}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "{{prompt}}", "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "{{negative_prompt}}", "clip": ["4", 1]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": "{{width}}", "height": "{{height}}",
                                                           "batch_size": 1}},
        "3": {"class_type": sampler, "inputs": {"seed": "{{seed}}", "steps": "{{steps}}", "cfg": 7.0,
                                                "sampler_name": "euler", "scheduler": "normal", "denoise": 1.0,
                                                "model": ["4", 0], "positive": ["6", 0], "negative": ["7", 0],
                                                "latent_image": ["5", 0], "fake_seconds": seconds}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "steward/{{seed}}"}},
    }


def image_model(tmp_path: Path, name: str = "sketch", workflow: dict[str, Any] | None = None,
                **config: Any) -> dict[str, Any]:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(workflow or sketch()))
    return {"runtime": "comfyui", "workflow": str(path), **config}


def with_images(start_steward: StewardFactory, comfy_port: int, gpu: Path, tmp_path: Path,
                **models: Any) -> tuple[RunningSteward, openai.OpenAI]:
    steward, _ = steward_with(start_steward, comfy_port, gpu, {
        "chat": fake_model("8GiB", gpu_dir=gpu), "sketch": image_model(tmp_path, aliases=["dall-e-3"]), **models})
    return steward, openai.OpenAI(base_url=steward.base_url, api_key="unused", max_retries=0)


def fake_history(port: int) -> dict[str, Any]:
    return httpx.get(f"http://127.0.0.1:{port}/history", timeout=10).json()  # type: ignore[no-any-return]


def test_images_come_from_one_image_job_with_the_workflow_filled_per_image(  # type: ignore[no-untyped-def]
        start_steward: StewardFactory, comfy, tmp_path: Path) -> None:
    port, gpu = comfy()
    steward, client = with_images(start_steward, port, gpu, tmp_path)
    client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}])  # chat is loaded
    result = client.images.generate(model="dall-e-3", prompt="a red fox", n=2, size="64x32",
                                    response_format="b64_json", extra_body={"seed": 7, "negative_prompt": "blur"})
    assert len(result.data) == 2 and result.output_format == "png"
    # Not one of OpenAI's sizes (1024x1024, 1024x1536, 1536x1024): steward's own object says it (issue 26).
    assert result.size is None and result.model_extra["steward"]["size"] == "64x32"  # type: ignore[index]
    assert result.usage is not None and result.usage.total_tokens == 0  # ComfyUI counts no tokens
    for item in result.data:
        assert item.url is None
        Image.open(io.BytesIO(base64.b64decode(item.b64_json or ""))).verify()  # a PNG
    # The GPU was ComfyUI's for the whole request: the chat engine was unloaded first, once.
    assert names(steward, *PHASES) == ["image_queued", "image_granted", "image_forwarded", "image_finished",
                                       "image_forwarded", "image_finished", "image_freed", "image_released"]
    assert [e["engine"] for e in steward.events("evict")] == ["chat"]
    assert httpx.get(f"http://127.0.0.1:{port}/fake/stats", timeout=10).json()["free_calls"] == 1
    prompts = [entry["prompt"][2] for entry in fake_history(port).values()]
    assert sorted(p["3"]["inputs"]["seed"] for p in prompts) == [7, 8]
    for prompt in prompts:
        assert prompt["5"]["inputs"] == {"width": 64, "height": 32, "batch_size": 1}
        assert prompt["6"]["inputs"]["text"] == "a red fox" and prompt["7"]["inputs"]["text"] == "blur"
        assert prompt["3"]["inputs"]["steps"] == 20  # the model's default
    row = steward.wait_event("request", route="/v1/images/generations")
    assert (row["status"], row["model"], row["class"]) == (200, "sketch", "interactive")
    assert row["queued_s"] is not None
    assert steward.wait_event("images_generated")["seeds"] == [7, 8]
    assert 'steward_images_generated_total{model="sketch"} 2.0' in httpx.get(f"{steward.url}/metrics").text
    # A chat after it loads its model again.
    client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "again"}])
    assert [e["engine"] for e in steward.events("load")] == ["chat", "chat"]


def test_an_image_url_is_served_to_whoever_holds_it_and_nothing_else_is(  # type: ignore[no-untyped-def]
        start_steward: StewardFactory, comfy, tmp_path: Path) -> None:
    port, gpu = comfy()
    keys_file = tmp_path / "keys.json"
    key = add_key(keys_file, "artist", models=["pic"], known_models=["sketch", "pic"])  # by the alias
    steward = start_steward({"sketch": image_model(tmp_path, aliases=["pic"]), "other": image_model(tmp_path, "other")},
                            auth={"keys_file": str(keys_file)}, comfyui={
        "upstream": f"127.0.0.1:{port}", "listen": None, "history_poll": "0.1s", "free_timeout": "5s"},
        gpu={"probe": "simulated", "simulated_dir": str(gpu), "poll_interval": "0.1s"})
    client = openai.OpenAI(base_url=steward.base_url, api_key=key, max_retries=0)
    with pytest.raises(openai.PermissionDeniedError):  # the key names only sketch (as pic)
        client.images.generate(model="other", prompt="a lighthouse", size="32x32")
    assert {m.id for m in client.models.list()} == {"sketch", "pic"}
    result = client.images.generate(model="sketch", prompt="a lighthouse", size="32x32")  # url: OpenAI's default
    url = result.data[0].url
    assert url is not None and url.startswith(f"{steward.url}/v1/images/files/") and result.data[0].b64_json is None
    served = httpx.get(url, timeout=10)  # no key: the link is the key
    assert served.status_code == 200 and served.headers["content-type"] == "image/png"
    entry = next(iter(fake_history(port).values()))
    image = next(iter(entry["outputs"].values()))["images"][0]
    direct = httpx.get(f"http://127.0.0.1:{port}/view", params=image, timeout=10)
    assert served.content == direct.content
    guessed = httpx.get(f"{steward.url}/v1/images/files/{'A' * 32}", timeout=10)
    assert guessed.status_code == 404 and guessed.json()["error"]["code"] == "not_found"
    assert httpx.post(f"{steward.base_url}/images/generations", json={"model": "sketch", "prompt": "x"},
                      timeout=10).status_code == 401  # making images still takes a key
    assert all("/v1/images/files/" not in e.get("route", "") or e["route"] == "/v1/images/files/{token}"
               for e in steward.events("request"))  # the token is never logged


def test_bad_requests_and_failures_are_openai_errors_and_unload_nothing(  # type: ignore[no-untyped-def]
        start_steward: StewardFactory, comfy, tmp_path: Path) -> None:
    port, gpu = comfy()
    invert = {"1": {"class_type": "EmptyImage", "inputs": {"width": "{{width}}", "height": "{{height}}",
                                                           "batch_size": 1, "color": 0}},
              "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
              "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "{{prompt}}"}}}
    steward, client = with_images(start_steward, port, gpu, tmp_path, invert=image_model(tmp_path, "invert", invert),
                                  broken=image_model(tmp_path, "broken", sketch(error=True)))
    client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError) as caught:
        client.images.generate(model="sketch", prompt="x", size="big")
    assert caught.value.body["param"] == "size"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as caught:
        client.images.generate(model="chat", prompt="x")
    assert caught.value.body["code"] == "model_not_supported"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.images.generate(model="dall-e-2", prompt="x")
    with pytest.raises(openai.BadRequestError) as caught:  # past EmptyImage's maximum, as ComfyUI's specs say
        client.images.generate(model="invert", prompt="x", size="16x20000")
    assert caught.value.body["message"].endswith(  # type: ignore[index]
        "EmptyImage (node 1): Value 20000 bigger than max of 16384: height")
    assert steward.wait_event("image_refused")["model"] == "invert"
    assert not steward.events("evict") and not steward.events("image_queued")
    with pytest.raises(openai.APIStatusError) as failed:
        client.images.generate(model="broken", prompt="x", response_format="b64_json")
    assert failed.value.status_code == 502 and "ComfyUI failed to run the workflow" in failed.value.message
    assert failed.value.body["code"] == "engine_error"  # type: ignore[index]
    assert names(steward, "image_freed", "image_released") == ["image_freed", "image_released"]
    assert 'steward_image_failures_total{code="engine_error"} 1.0' in httpx.get(f"{steward.url}/metrics").text
    listed = {m.id: m for m in client.models.list()}
    assert listed["sketch"].model_extra["steward"]["kind"] == "image"  # type: ignore[index]
    assert listed["dall-e-3"].model_extra["steward"]["alias_of"] == "sketch"  # type: ignore[index]
    chat_only = httpx.get(f"{steward.base_url}/models", params={"kind": "chat"}, timeout=10).json()["data"]
    assert [m["id"] for m in chat_only] == ["chat"]


def test_a_client_that_leaves_stops_its_prompt_and_gives_the_gpu_back(  # type: ignore[no-untyped-def]
        start_steward: StewardFactory, comfy, tmp_path: Path) -> None:
    port, gpu = comfy()
    steward, _ = steward_with(start_steward, port, gpu, {"slow": image_model(tmp_path, "slow", sketch(60.0))})
    body = json.dumps({"model": "slow", "prompt": "a slow fox", "n": 3}).encode()
    host, _, listen = steward.url.removeprefix("http://").rpartition(":")
    with socket.create_connection((host, int(listen))) as sock:
        sock.sendall(b"POST /v1/images/generations HTTP/1.1\r\nhost: " + f"{host}:{listen}".encode() + b"\r\n"
                     b"content-type: application/json\r\n"
                     b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        prompt_id = steward.wait_event("image_forwarded", timeout=30)["prompt_id"]
    abandoned = steward.wait_event("image_abandoned", timeout=30)
    assert abandoned["prompt_id"] == prompt_id
    steward.wait_event("image_released", timeout=30)
    assert names(steward, "image_forwarded") == ["image_forwarded"]  # the other two never went
    entry = fake_history(port)[prompt_id]
    assert entry["status"]["status_str"] == "error"
    assert "execution_interrupted" in [message[0] for message in entry["status"]["messages"]]
    assert steward.wait_event("request", route="/v1/images/generations")["status"] == 499


def test_without_comfyui_image_generation_says_what_it_needs(start_steward: StewardFactory) -> None:
    steward = start_steward({"chat": fake_model()})
    answer = httpx.post(f"{steward.base_url}/images/generations", json={"model": "x", "prompt": "x"}, timeout=10)
    assert answer.status_code == 404 and "needs a comfyui section" in answer.json()["error"]["message"]
