"""Steward's copy of ComfyUI's input validation (supervisor/gateway/comfy/inputs.py), pure.

The node classes are ComfyUI 0.3.64's own ``/object_info`` entries and the answers its own, recorded
in tests/data/comfy_object_info.json (its ``note`` says how; tests/test_real_comfyui.py checks it
against the real one): for each request steward refuses, its body is ComfyUI's byte for byte, and
each it forwards is one ComfyUI runs or refuses for a reason ``/object_info`` does not show. The
checks steward leaves out on purpose are tested here as such, beside the orders ComfyUI's sets
leave open and the catalog's refetch (MockClock, a MockTransport ComfyUI).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from fakes.comfyui.workflow import PromptRejected
from fakes.comfyui.workflow import validate as fake_validate
from supervisor.gateway.comfy.api import NodeCatalog, PromptRefused, PromptRequest, read_prompt
from supervisor.gateway.comfy.inputs import MAX_DEPTH, NodeClass, Origin, validate_outputs
from supervisor.gateway.errors import comfy_error_body

RECORDED = json.loads((Path(__file__).parent / "data" / "comfy_object_info.json").read_text())
CLASSES = {name: NodeClass.of(name, entry) for name, entry in RECORDED["object_info"].items()}


def refusal(body: dict[str, Any], classes: dict[str, NodeClass] = CLASSES) -> PromptRefused | None:
    request = read_prompt(json.dumps(body).encode())
    assert isinstance(request, PromptRequest), request
    return request.refusal(classes)


def empty(**inputs: Any) -> dict[str, Any]:
    return {"class_type": "EmptyImage", "inputs": {"width": 16, "height": 16, "batch_size": 1, "color": 0, **inputs}}


def save(source: str = "1") -> dict[str, Any]:
    return {"class_type": "SaveImage", "inputs": {"images": [source, 0], "filename_prefix": "t"}}


def entry(required: dict[str, Any], outputs: list[str], *, output_node: bool = False,
          module: str = "nodes", optional: dict[str, Any] | None = None) -> dict[str, Any]:
    """An /object_info entry of a V1 class, for shapes the recording has no class for."""
    return {"input": {"required": required, **({"optional": optional} if optional else {})}, "output": outputs,
            "python_module": module, "output_node": output_node}


# --- ComfyUI's own answers ---------------------------------------------------------------

@pytest.mark.parametrize("answer", RECORDED["answers"], ids=[a["case"] for a in RECORDED["answers"]])
def test_steward_refuses_as_comfyui_does_and_forwards_the_rest(answer: dict[str, Any]) -> None:
    refused = refusal(answer["request"])
    if answer["steward"] == "refuses":
        assert answer["status"] == 400
        assert refused is not None and refused.body() == json.dumps(answer["body"]).encode()
    else:
        assert refused is None, refused


def test_the_recording_holds_each_kind_of_answer() -> None:
    """What the parametrized test above covers: every check steward makes, and the ones it leaves out."""
    refused = {e["type"] for a in RECORDED["answers"] if a["steward"] == "refuses"
               for node in a["body"]["node_errors"].values() for e in node["errors"]}
    assert refused == {"value_smaller_than_min", "value_bigger_than_max", "invalid_input_type",
                       "required_input_missing", "bad_linked_input", "exception_during_validation",
                       "exception_during_inner_validation", "return_type_mismatch"}
    left_to_comfyui = {e["type"] for a in RECORDED["answers"] if a["steward"] == "forwards" and a["status"] == 400
                       for node in a["body"]["node_errors"].values() for e in node["errors"]}
    assert left_to_comfyui == {"value_smaller_than_min", "return_type_mismatch", "value_not_in_list",
                               "custom_validation_failed"}
    assert any(a["steward"] == "forwards" and a["status"] == 200 for a in RECORDED["answers"])


def test_the_old_refusals_keep_their_bytes() -> None:
    unknown = refusal({"prompt": {"1": {"class_type": "NoSuchNode", "inputs": {}}}})
    assert unknown is not None and unknown.body() == comfy_error_body(
        400, "Cannot execute because node NoSuchNode does not exist.", code="invalid_prompt", details="Node ID '#1'")
    no_outputs = refusal({"prompt": {"1": empty()}})
    assert no_outputs is not None and no_outputs.body() == comfy_error_body(400, "Prompt has no outputs",
                                                                            code="prompt_no_outputs")


# --- the classes ---------------------------------------------------------------------------

def test_what_a_class_is_read_as() -> None:
    image, steps, primitive = CLASSES["EmptyImage"], CLASSES["StewardSteps"], CLASSES["PrimitiveInt"]
    assert (image.origin, steps.origin, primitive.origin) == (Origin.CORE, Origin.CUSTOM, Origin.CORE)
    assert CLASSES["TripoConversionNode"].origin is Origin.CORE  # comfy_api_nodes.nodes_tripo
    assert image.outputs == ("IMAGE",) and primitive.outputs == ["INT"]  # V1's RETURN_TYPES a tuple, V3's a list
    assert [(s.name, s.required, s.type) for s in image.inputs or ()] == [
        ("width", True, "INT"), ("height", True, "INT"), ("batch_size", True, "INT"), ("color", True, "INT")]
    invert = CLASSES["ImageInvert"].inputs or ()
    assert [s.config for s in invert] == [["IMAGE", {}]]  # a one-element spec: ComfyUI's options are {}
    assert CLASSES["SaveImage"].output_node and not image.output_node
    assert [s.name for s in CLASSES["TripoConversionNode"].inputs or () if not s.required] == [
        "quad", "face_limit", "texture_size", "texture_format"]  # hidden inputs are not validated
    assert image.validate_inputs == frozenset() and steps.validate_inputs is None
    assert CLASSES["KlingCameraControls"].validate_inputs == {"horizontal_movement", "vertical_movement", "pan",
                                                              "tilt", "roll", "zoom"}


@pytest.mark.parametrize("broken", [None, [], {"input": []}, {"input": {"required": []}},
                                    {"input": {"required": {"x": "INT"}}}, {"input": {"required": {"x": []}}},
                                    {"input": {"required": {"x": ["INT", "min"]}}}])
def test_an_entry_that_cannot_be_read_leaves_its_nodes_to_comfyui(broken: object) -> None:
    klass = NodeClass.of("Broken", broken)
    assert klass.inputs is None
    classes = {**CLASSES, "Broken": klass}
    assert refusal({"prompt": {"1": {"class_type": "Broken", "inputs": {}}, "2": save("1"), "3": empty(width=0),
                               "4": save("3")}}, classes) is None


# --- what steward leaves to ComfyUI --------------------------------------------------------

def test_inputs_a_core_validate_inputs_names_keep_their_min_and_max_to_themselves() -> None:
    """KlingCameraControls.validate_inputs takes all six movements: ComfyUI checks no min or max of theirs."""
    classes = {**CLASSES, "Sink": NodeClass.of("Sink", entry({"camera": ["CAMERA_CONTROL"]}, [], output_node=True))}
    controls = {"camera_control_type": "simple", "horizontal_movement": 50.0, "vertical_movement": 0.0, "pan": 0.0,
                "tilt": 0.0, "roll": 0.0, "zoom": 0.0}
    prompt = {"1": {"class_type": "KlingCameraControls", "inputs": controls},
              "2": {"class_type": "Sink", "inputs": {"camera": ["1", 0]}}}
    assert refusal({"prompt": prompt}, classes) is None
    controls["zoom"] = "wide"  # converting a FLOAT comes before any VALIDATE_INPUTS: that one is refused
    refused = refusal({"prompt": prompt}, classes)
    assert refused is not None and refused.node_errors["1"]["errors"][0]["type"] == "invalid_input_type"


def test_a_validate_inputs_that_takes_input_types_sees_links_of_any_type() -> None:
    tripo = {"class_type": "TripoConversionNode", "inputs": {"original_model_task_id": ["1", 0], "format": "GLTF"}}
    assert refusal({"prompt": {"1": empty(), "2": tripo}}) is None  # IMAGE into MODEL_TASK_ID,...: its business
    mismatched = {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "t"}}
    latent = {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}}
    assert refusal({"prompt": {"1": latent, "2": mismatched}}) is not None  # where none takes them, ComfyUI refuses


@pytest.mark.parametrize(("received", "expected", "refused"), [
    ("IMAGE", "IMAGE", False), ("IMAGE", "IMAGE,MASK", False), ("MASK, IMAGE", "IMAGE", False),
    ("IMAGE", "*", False), ("*", "LATENT", False), ("IMAGE", ["a", "b"], False), ("IMAGE", "LATENT", True),
    ("IMAGE,MASK", "LATENT,MODEL", True)])
def test_link_types_between_core_classes(received: str, expected: object, refused: bool) -> None:
    classes = {"Source": NodeClass.of("Source", entry({}, [received])),
               "Sink": NodeClass.of("Sink", entry({"x": [expected]}, [], output_node=True))}
    prompt = {"1": {"class_type": "Source", "inputs": {}}, "2": {"class_type": "Sink", "inputs": {"x": ["1", 0]}}}
    assert (refusal({"prompt": prompt}, classes) is not None) is refused


def test_min_and_max_only_bind_ints_and_floats_of_core_classes() -> None:
    spec = {"n": ["INT", {"min": 1}], "s": ["STRING", {"min": 1}], "b": ["BOOLEAN", {"max": 0}],
            "c": [["x"], {"min": 1}]}
    inputs = {"n": 5, "s": "", "b": True, "c": "y"}  # a STRING, a BOOLEAN and a COMBO: not compared, not listed
    for module in ("nodes", "comfy_extras.nodes_x", "custom_nodes.pack"):
        classes = {"Sink": NodeClass.of("Sink", entry(spec, [], output_node=True, module=module))}
        assert refusal({"prompt": {"1": {"class_type": "Sink", "inputs": inputs}}}, classes) is None
        low = refusal({"prompt": {"1": {"class_type": "Sink", "inputs": {**inputs, "n": 0}}}}, classes)
        assert (low is not None) is (module != "custom_nodes.pack"), module  # a custom VALIDATE_INPUTS may allow it


@pytest.mark.parametrize("bound", [None, "1", [1]])
def test_a_bound_that_is_no_number_leaves_the_answer_to_comfyui(bound: object) -> None:
    classes = {"Sink": NodeClass.of("Sink", entry({"n": ["INT", {"min": bound}]}, [], output_node=True))}
    assert refusal({"prompt": {"1": {"class_type": "Sink", "inputs": {"n": 0}}}}, classes) is None


def test_cycles_deep_chains_and_odd_inputs_are_left_to_comfyui() -> None:
    def inverts(count: int, bad_width: int) -> dict[str, Any]:
        prompt = {"0": empty(width=bad_width), **{str(i): {"class_type": "ImageInvert", "inputs": {"image": [
            str(i - 1), 0]}} for i in range(1, count + 1)}}
        return {"prompt": {**prompt, "out": save(str(count))}}

    assert refusal(inverts(MAX_DEPTH - 2, 1)) is None
    assert refusal(inverts(MAX_DEPTH - 2, 0)) is not None
    assert refusal(inverts(MAX_DEPTH + 5, 0)) is None  # ComfyUI's recursion may end in a RecursionError
    loop = {"1": {"class_type": "ImageInvert", "inputs": {"image": ["2", 0]}},
            "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}}, "3": save("2"), "4": empty(width=0)}
    assert refusal({"prompt": loop}) is None
    for odd in (None, [], "width"):
        assert refusal({"prompt": {"1": {"class_type": "EmptyImage", "inputs": odd}, "2": save()}}) is None


def test_partial_targets_choose_the_outputs_validated() -> None:
    prompt = {"1": empty(width=0), "2": save(), "3": empty(), "4": save("3")}
    assert refusal({"prompt": prompt, "partial_execution_targets": ["2"]}) is not None
    assert refusal({"prompt": prompt, "partial_execution_targets": ["4"]}) is None
    assert refusal({"prompt": prompt, "partial_execution_targets": []}) is None  # no output: left to ComfyUI
    assert refusal({"prompt": prompt, "partial_execution_targets": "2"}) is None  # a string: ComfyUI's `in` is its own
    assert refusal({"prompt": prompt, "partial_execution_targets": None}) is None  # as if not given: "4" passes


# --- the orders ComfyUI's sets leave open ----------------------------------------------------

def test_several_errors_of_one_node_come_in_the_declared_order() -> None:
    """ComfyUI walks a node's inputs as a set: its order changes between processes; steward's is the declared."""
    refused = refusal({"prompt": {"1": {"class_type": "EmptyImage", "inputs": {"width": "x", "batch_size": 0}},
                                  "2": save()}})
    assert refused is not None and refused.details == ""
    assert [(e["type"], e["details"]) for e in refused.node_errors["1"]["errors"]] == [
        ("invalid_input_type", "width, x, invalid literal for int() with base 10: 'x'"),
        ("required_input_missing", "height"), ("value_smaller_than_min", "batch_size"),
        ("required_input_missing", "color")]


def test_a_failing_node_counts_every_output_that_failed_after_it_as_dependent() -> None:
    """ComfyUI's quirk: after each failing output it adds that output to every failing node validated so far."""
    prompt = {"1": empty(width=0), "2": save("1"), "3": empty(height=0), "4": save("3"), "5": save("1")}
    refused = refusal({"prompt": prompt})
    assert refused is not None
    assert {node: e["dependent_outputs"] for node, e in refused.node_errors.items()} == {
        "1": ["2", "4", "5"], "3": ["4", "5"]}


def test_an_output_with_its_own_errors_names_them_in_the_details() -> None:
    prompt = {"1": empty(), "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0, 0]}},
              "3": {"class_type": "PreviewImage", "inputs": {}}}
    refused = refusal({"prompt": prompt})
    assert refused is not None and refused.details == (
        "Bad linked input, must be a length-2 list of [node_id, slot_index]: images\n"
        "Required input is missing: filename_prefix\nRequired input is missing: images")


def test_validate_outputs_answers_none_without_outputs() -> None:
    assert validate_outputs({"1": empty(width=0)}, [], CLASSES) is None


# --- never a crash, and the fake agrees ---------------------------------------------------------

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=8)
WIDGET = st.one_of(st.integers(-3, 20000), st.floats(allow_nan=True), st.sampled_from(["16", "x", "", " 7 "]),
                   st.none(), st.booleans(), st.builds(lambda v: {"__value__": v}, st.integers(-3, 20)))


@settings(max_examples=300, deadline=None)
@given(width=WIDGET, height=WIDGET, color=WIDGET, odd=JSON, drop=st.sampled_from(["", "height", "color"]))
def test_steward_and_the_fake_refuse_the_same_widget_values_alike(width: object, height: object, color: object,
                                                                  odd: object, drop: str) -> None:
    """Two implementations written apart (fakes/comfyui/workflow.py) agree on what both check."""
    first = {"width": width, "height": height, "batch_size": 1, "color": color}
    first.pop(drop, None)
    prompt = {"1": {"class_type": "EmptyImage", "inputs": first},
              "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0], "ignored": odd}}, "3": save("2")}
    refused = refusal({"prompt": prompt})
    try:
        fake_validate(json.loads(json.dumps(prompt)), 4)
        fake: bytes | None = None
    except PromptRejected as rejected:
        fake = json.dumps(rejected.body).encode()
    assert (refused.body() if refused is not None else None) == fake


@settings(max_examples=300, deadline=None)
@given(inputs=st.dictionaries(st.sampled_from(["width", "height", "batch_size", "color", "image", "images"]), JSON),
       classes=st.lists(st.sampled_from(sorted(CLASSES)), min_size=1, max_size=4))
def test_any_inputs_are_answered_without_an_exception(inputs: dict[str, Any], classes: list[str]) -> None:
    prompt = {str(i): {"class_type": name, "inputs": inputs} for i, name in enumerate(classes)}
    refused = refusal({"prompt": prompt})
    if refused is not None:
        assert json.loads(refused.body())["error"]["type"] in ("prompt_outputs_failed_validation",
                                                                "prompt_no_outputs")


def test_a_value_nested_too_deep_to_print_is_left_to_comfyui() -> None:
    deep: Any = 0
    for _ in range(5000):  # deeper than JSON parses, but a refusal must never raise
        deep = [deep]
    assert PromptRequest({"1": empty(width={"__value__": deep}), "2": save()}).refusal(CLASSES) is None  # str() fails
    bad_link = {"class_type": "SaveImage", "inputs": {"images": [deep], "filename_prefix": "t"}}
    assert PromptRequest({"1": bad_link}).refusal(CLASSES) is None  # json.dumps fails


def test_nan_and_infinity_are_answered_as_comfyui_prints_them() -> None:
    refused = refusal({"prompt": {"1": empty(width=math.inf), "2": save()}})
    assert refused is not None and b'"received_value": Infinity' in refused.body()
    assert b"cannot convert float infinity to integer" in refused.body()


# --- the catalog -----------------------------------------------------------------------------

def comfyui_with(answers: list[dict[str, Any]]) -> tuple[httpx.AsyncClient, list[float]]:
    """A ComfyUI whose /object_info gives *answers* in turn (the last one again); the times it was asked."""
    asked: list[float] = []

    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/object_info"
        asked.append(trio.current_time())
        return httpx.Response(200, json=answers[min(len(asked), len(answers)) - 1])

    return httpx.AsyncClient(transport=httpx.MockTransport(handle)), asked


def relaxed(min_width: int) -> dict[str, Any]:
    """The recorded classes, EmptyImage's width min changed (as an update would)."""
    info = json.loads(json.dumps(RECORDED["object_info"]))
    info["EmptyImage"]["input"]["required"]["width"][1]["min"] = min_width
    return info


async def test_the_catalog_is_fetched_again_before_a_stale_copy_refuses(autojump_clock: trio.testing.MockClock) -> None:
    http, asked = comfyui_with([relaxed(1), relaxed(0)])
    catalog = NodeCatalog(http, "http://comfyui", refresh_after=10.0)
    request = read_prompt(json.dumps({"prompt": {"1": empty(width=0), "2": save()}}).encode())
    assert isinstance(request, PromptRequest)
    fine = read_prompt(json.dumps({"prompt": {"1": empty(), "2": save()}}).encode())
    assert isinstance(fine, PromptRequest)
    assert await catalog.refusal(request) is not None  # fresh: refused from it
    assert asked == [0.0]
    await trio.sleep(30)
    assert await catalog.refusal(fine) is None and asked == [0.0]  # nothing to refuse: no fetch
    assert await catalog.refusal(request) is None  # stale: fetched again, and the update allows width 0
    assert asked == [0.0, 30.0]


async def test_an_unreachable_comfyui_refuses_nothing_and_a_lookup_of_known_classes_is_not_fetched_again(
        autojump_clock: trio.testing.MockClock) -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    catalog = NodeCatalog(httpx.AsyncClient(transport=httpx.MockTransport(down)), "http://comfyui")
    request = read_prompt(json.dumps({"prompt": {"1": empty(width=0), "2": save()}}).encode())
    assert isinstance(request, PromptRequest)
    assert await catalog.refusal(request) is None and catalog.nodes is None
    http, asked = comfyui_with([RECORDED["object_info"]])
    catalog = NodeCatalog(http, "http://comfyui")
    await catalog.lookup({"EmptyImage"})
    await trio.sleep(60)
    nodes = await catalog.lookup({"EmptyImage", "SaveImage"})
    assert nodes is not None and nodes["SaveImage"].output_node and asked == [0.0]
    await catalog.lookup({"NoSuchNode"})
    assert asked == [0.0, 60.0]  # an unknown class after refresh_after: fetched again
