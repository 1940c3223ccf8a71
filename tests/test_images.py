"""Image models (runtime: comfyui) and the generations request, pure: the workflow file and
its placeholders, what a /history entry gave, the request's parameters, the config's checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from supervisor.config import ConfigError, ImageModelConfig, load_config, parse_config
from supervisor.gateway.openai import images as image_api
from supervisor.gateway.http.asgi import RequestError
from supervisor.gateway.catalog import ImageModel, ModelCatalog
from supervisor.gateway.comfy.workflow import ImageParams, SavedImage, Workflow, WorkflowError, failure_of, saved_images
from supervisor.gateway.openai.images import FILE_TTL, ImageFiles, read_image_request

GRAPH = {
    "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd.safetensors"}},
    "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a photo of {{prompt}}, detailed", "clip": ["4", 1]}},
    "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "{{negative_prompt}}", "clip": ["4", 1]}},
    "5": {"class_type": "EmptyLatentImage", "inputs": {"width": "{{width}}", "height": "{{ height }}", "batch_size": 1}},
    "3": {"class_type": "KSampler", "inputs": {"seed": "{{seed}}", "steps": "{{steps}}", "cfg": 7.0,
                                               "model": ["4", 0], "positive": ["6", 0], "negative": ["7", 0],
                                               "latent_image": ["5", 0]}},
    "9": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "steward-{{seed}}"}},
}
PARAMS = ImageParams("a fox", 640, 480, 1234, 12, "blurry")


def test_a_workflow_is_filled_whole_values_as_values_and_text_as_text() -> None:
    workflow = Workflow.parse(json.dumps(GRAPH))
    assert workflow.placeholders == {"prompt", "negative_prompt", "width", "height", "seed", "steps"}
    filled = workflow.filled(PARAMS)
    assert filled["6"]["inputs"]["text"] == "a photo of a fox, detailed"
    assert filled["7"]["inputs"]["text"] == "blurry"
    assert filled["5"]["inputs"] == {"width": 640, "height": 480, "batch_size": 1}  # numbers, not "640"
    assert filled["3"]["inputs"]["seed"] == 1234 and filled["3"]["inputs"]["steps"] == 12
    assert filled["3"]["inputs"]["positive"] == ["6", 0]  # links untouched
    assert filled["9"]["inputs"]["filename_prefix"] == "steward-1234"
    assert workflow.graph["5"]["inputs"]["width"] == "{{width}}"  # the workflow itself is unchanged


@pytest.mark.parametrize(("text", "words"), [
    ("{not json", "is not JSON"),
    ("[]", "API-format workflow"),
    ('{"nodes": [], "links": []}', "Export (API)"),
    ('{"1": {"inputs": {}}}', "node '1' has no class_type"),
    ('{"1": {"class_type": "X", "inputs": []}}', "inputs must be an object"),
    ('{"1": {"class_type": "X", "inputs": {"t": "{{prompt}} {{colour}}"}}}', "unknown placeholders {{colour}}"),
    ('{"1": {"class_type": "X", "inputs": {"w": "{{width}}"}}}', "no {{prompt}} placeholder"),
])
def test_a_workflow_that_cannot_be_used_says_why(text: str, words: str) -> None:
    with pytest.raises(WorkflowError, match=words.replace("{", r"\{").replace("(", r"\(").replace(")", r"\)")):
        Workflow.parse(text)


def test_the_saved_images_of_a_history_entry_and_what_a_failure_said() -> None:
    entry = {"outputs": {"9": {"images": [{"filename": "a.png", "subfolder": "", "type": "output"},
                                          {"filename": "b.png", "subfolder": "x", "type": "output"}]},
                         "12": {"images": [{"filename": "p.png", "subfolder": "", "type": "temp"}]},
                         "13": {"text": ["not an image"]}}}
    assert saved_images(entry) == [SavedImage("a.png", "", "output"), SavedImage("b.png", "x", "output")]
    previews_only = {"outputs": {"12": {"images": [{"filename": "p.png", "subfolder": "", "type": "temp"}]}}}
    assert saved_images(previews_only) == [SavedImage("p.png", "", "temp")]
    assert saved_images({"outputs": {}}) == [] and saved_images({}) == []
    failed = {"status": {"status_str": "error", "messages": [
        ["execution_start", {}], ["execution_error", {"node_id": "3", "node_type": "KSampler",
                                                      "exception_type": "torch.OutOfMemoryError",
                                                      "exception_message": "CUDA out of memory\n"}]]}}
    assert failure_of(failed) == "KSampler (node 3): torch.OutOfMemoryError: CUDA out of memory"
    assert failure_of({"status": {"messages": [["execution_interrupted", {}]]}}) == "the prompt was interrupted"
    assert "without a message" in failure_of({})


def model(name: str = "sketch", **config: Any) -> ImageModel:
    return ImageModel(name, ImageModelConfig("comfyui", "wf.json", **config), Workflow.parse(json.dumps(GRAPH)))


def read(payload: Any, images: dict[str, ImageModel] | None = None, headers: list[tuple[bytes, bytes]] | None = None,
         seeds: list[int] | None = None) -> Any:
    drawn = iter(seeds or [11, 22, 33, 44])
    images = {"sketch": model(), "pic": model(), "photo": model("photo")} if images is None else images
    return read_image_request({"headers": headers or []}, payload, images, {"chat": "chat"},
                              default_class="interactive", random_seed=lambda: next(drawn))


def test_a_request_takes_the_models_defaults_and_random_seeds() -> None:
    request = read({"model": "pic", "prompt": "a fox"})
    assert request.model == "sketch" and request.klass == "interactive" and request.response_format == "url"
    assert request.size == "1024x1024"
    assert request.runs == (ImageParams("a fox", 1024, 1024, 11, 20, ""),)
    request = read({"model": "sketch", "prompt": "a fox", "n": 3, "size": "auto"},
                   {"sketch": model(size="512x768", steps=8, negative_prompt="ugly")})
    assert [run.seed for run in request.runs] == [11, 22, 33]
    assert request.runs[0] == ImageParams("a fox", 512, 768, 11, 8, "ugly") and request.size == "512x768"


def test_a_request_with_its_own_seed_size_steps_class_and_format() -> None:
    request = read({"model": "sketch@batch", "prompt": "a fox", "n": 2, "seed": 7, "steps": 4, "size": "256x128",
                    "negative_prompt": "", "response_format": "b64_json", "quality": "high", "user": "u1"})
    assert request.klass == "batch" and request.response_format == "b64_json" and request.size == "256x128"
    assert request.runs == (ImageParams("a fox", 256, 128, 7, 4, ""), ImageParams("a fox", 256, 128, 8, 4, ""))
    assert read({"model": "sketch", "prompt": "x"}, headers=[(b"x-steward-class", b"background")]).klass == "background"
    assert read({"prompt": "x"}, {"sketch": model()}).model == "sketch"  # the one image model needs no name


@pytest.mark.parametrize(("payload", "status", "param", "words"), [
    ([], 400, None, "JSON object"),
    ({"model": "sketch"}, 400, "prompt", "provide a prompt"),
    ({"model": "sketch", "prompt": "  "}, 400, "prompt", "provide a prompt"),
    ({"model": "sketch", "prompt": "x" * 32_001}, 400, "prompt", "the most is 32000"),
    ({"prompt": "x"}, 400, "model", "one of photo, sketch"),
    ({"model": "", "prompt": "x"}, 400, "model", "provide a model"),
    ({"model": "chat", "prompt": "x"}, 400, "model", "is a language model"),
    ({"model": "dall-e-3", "prompt": "x"}, 404, "model", "does not exist"),
    ({"model": "sketch@urgent", "prompt": "x"}, 400, "model", "Unknown class"),
    ({"model": "sketch", "prompt": "x", "n": 0}, 400, "n", "from 1 to 10"),
    ({"model": "sketch", "prompt": "x", "n": 11}, 400, "n", "from 1 to 10"),
    ({"model": "sketch", "prompt": "x", "n": True}, 400, "n", "integer"),
    ({"model": "sketch", "prompt": "x", "n": "2"}, 400, "n", "integer"),
    ({"model": "sketch", "prompt": "x", "size": "big"}, 400, "size", "WIDTHxHEIGHT"),
    ({"model": "sketch", "prompt": "x", "size": "0x512"}, 400, "size", "WIDTHxHEIGHT"),
    ({"model": "sketch", "prompt": "x", "size": 512}, 400, "size", "WIDTHxHEIGHT"),
    ({"model": "sketch", "prompt": "x", "seed": -1}, 400, "seed", "integer from 0"),
    ({"model": "sketch", "prompt": "x", "steps": 0}, 400, "steps", "from 1 to 10000"),
    ({"model": "sketch", "prompt": "x", "negative_prompt": 3}, 400, "negative_prompt", "string"),
    ({"model": "sketch", "prompt": "x", "response_format": "png"}, 400, "response_format", "'url' or 'b64_json'"),
    ({"model": "sketch", "prompt": "x", "output_format": "webp"}, 400, "output_format", "are PNG"),
    ({"model": "sketch", "prompt": "x", "stream": True}, 400, "stream", "not supported"),
])
def test_a_bad_request_names_its_parameter(payload: Any, status: int, param: str | None, words: str) -> None:
    with pytest.raises(RequestError) as caught:
        read(payload)
    assert (caught.value.status, caught.value.param) == (status, param)
    assert words in caught.value.message


@pytest.mark.parametrize(("size", "said"), [("1024x1024", True), ("1024x1536", True), ("1536x1024", True),
                                          ("512x768", False), ("1024x1025", False)])
def test_the_answer_names_a_size_only_as_openai_s_enum_does(size: str, said: bool) -> None:
    """Issue 26: OpenAI's ImagesResponse `size` is 1024x1024, 1024x1536 or 1536x1024; any other
    size was written there too. Now it is left out, and steward's own object says it."""
    request = read({"model": "sketch", "prompt": "a fox", "size": size})
    answer = image_api.images_answer(request, [{"url": "u"}], ["p1"], 1700000000)
    assert answer.get("size") == (size if said else None) and ("size" in answer) == said
    assert answer["steward"] == {"model": "sketch", "size": size, "seeds": [11], "prompt_ids": ["p1"]}
    assert (answer["created"], answer["data"], answer["output_format"]) == (1700000000, [{"url": "u"}], "png")


def test_without_image_models_a_request_is_told_so() -> None:
    with pytest.raises(RequestError, match="No image model is configured"):
        read({"prompt": "x"}, {})


def test_an_image_url_lasts_an_hour_and_the_oldest_go_first() -> None:
    files = ImageFiles()
    image = SavedImage("a.png", "", "output")
    token = files.add(image, now=100.0)
    assert len(token) >= 32 and files.find(token, 100.0 + FILE_TTL - 1) == image
    assert files.find(token, 100.0 + FILE_TTL) is None and files.find("guess", 0.0) is None
    assert token != files.add(image, now=100.0)


# --- the config -----------------------------------------------------------------------------

def write_config(tmp_path: Path, text: str, workflow: Any = GRAPH) -> Path:
    if workflow is not None:
        (tmp_path / "wf.json").write_text(workflow if isinstance(workflow, str) else json.dumps(workflow))
    path = tmp_path / "steward.yaml"
    path.write_text(text)
    return path


COMFY = 'comfyui: {upstream: "127.0.0.1:8189"}\n'


def test_an_image_model_is_read_beside_the_config_and_listed_in_the_catalog(tmp_path: Path) -> None:
    path = write_config(tmp_path, "models:\n  sketch: {runtime: comfyui, workflow: wf.json, size: 640x480, "
                                  "aliases: [pic]}\n" + COMFY)
    config = load_config(path)
    assert config.models == {} and config.image_models["sketch"].workflow == str(tmp_path / "wf.json")
    assert config.image_alias_table() == {"sketch": "sketch", "pic": "sketch"}
    catalog = ModelCatalog.of(config)
    assert set(catalog.images) == {"sketch", "pic"} and catalog.images["pic"].config.size == "640x480"
    assert catalog.aliases == {}  # not an engine: the scheduler never sees it


@pytest.mark.parametrize(("text", "workflow", "problems"), [
    ("models:\n  sketch: {runtime: comfyui, workflow: wf.json}\n", GRAPH,
     ["models.sketch.runtime: comfyui runs the workflow in the ComfyUI of the comfyui section, and there is none"]),
    ("models:\n  sketch: {runtime: comfyui}\n" + COMFY, GRAPH, ["models.sketch.workflow: required key is missing"]),
    ("models:\n  sketch: {runtime: comfyui, workflow: wf.json, size: huge, steps: 0, seed: 3}\n" + COMFY, GRAPH,
     ["models.sketch.seed: unknown key", "models.sketch.size: must be WIDTHxHEIGHT like 1024x1024, got 'huge'",
      "models.sketch.steps: must be a positive integer, got 0"]),
    ("models:\n  sketch: {runtime: comfyui, workflow: gone.json}\n" + COMFY, GRAPH,
     ["models.sketch.workflow: {dir}/gone.json cannot be read: No such file or directory"]),
    ("models:\n  sketch: {runtime: comfyui, workflow: wf.json}\n" + COMFY, '{"nodes": [], "links": []}',
     ['models.sketch.workflow: {dir}/wf.json is a ComfyUI UI workflow; export it with "Export (API)" '
      '(the API format)']),
    ("models:\n  chat: {runtime: openai, upstream: '127.0.0.1:9', memory: 1GiB}\n"
     "  sketch: {runtime: comfyui, workflow: wf.json, aliases: [chat]}\n" + COMFY, GRAPH,
     ["models.sketch.aliases: 'chat' already names 'chat'"]),
    ("models:\n  chat: {runtime: comfy}\n" + COMFY, GRAPH,
     ["models.chat.runtime: must be one of 'llama-server', 'openai', 'comfyui', got 'comfy'"]),
])
def test_an_image_model_config_error_names_the_key(tmp_path: Path, text: str, workflow: Any,
                                                   problems: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write_config(tmp_path, text, workflow))
    assert [p for p in caught.value.problems if "models.chat.memory" not in p] == [
        p.replace("{dir}", str(tmp_path)) for p in problems]


def test_image_models_are_not_a_top_level_key() -> None:
    with pytest.raises(ConfigError, match="image_models: unknown key"):
        parse_config({"models": {}, "image_models": {}})
