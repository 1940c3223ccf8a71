"""A workflow ("prompt" in the API format) checked like ``execution.validate_prompt`` and planned for the worker.

Its node registry is its ``/object_info`` (assets.py): like ComfyUI, a ``class_type`` it does
not know is refused (``invalid_prompt``, "node X does not exist"). What else it looks at:

* output nodes are those whose class is in ``OUTPUT_CLASSES``; no output -> ``prompt_no_outputs``;
* each output and, through the links of its declared inputs, what it depends on: a required input
  missing (``required_input_missing``), an INT or FLOAT that does not convert
  (``invalid_input_type``), one below its min or above its max (``value_smaller_than_min``,
  ``value_bigger_than_max``), in ComfyUI's shapes; a node of class ``FAKE_INVALID`` fails too
  (``value_not_in_list``). A failing node fails every output that depends on it; all outputs
  failed -> 400 ``prompt_outputs_failed_validation`` (its ``details`` from the outputs' own
  errors, as ComfyUI's), some -> 200 with ``node_errors`` and only the good outputs run. Written
  apart from steward's own check (supervisor/gateway/comfy/inputs.py), which it is there to test;
* a node of class ``FAKE_ERROR`` raises when it runs (``execution_error``);
* the first node with an integer ``steps`` input (or a class named like a sampler) reports
  ``progress``; any node input ``fake_seconds`` overrides the job time;
* links are inputs of the form ``["<node id>", <output index>]``;
* what each SaveImage / PreviewImage saves: the `Picture` its EmptyImage / ImageInvert chain
  makes, or (from a stand-in) None, the fake's one tiny PNG; SaveAnimatedWEBP saves the batch
  as one animated WEBP (``animated: [true]``), each frame a shade apart so that a decoder
  counts every one (libwebp merges identical frames).
"""

from __future__ import annotations

from typing import Any

import attrs

from fakes.comfyui.assets import Picture

OUTPUT_CLASSES = frozenset({"SaveImage", "PreviewImage", "SaveAnimatedWEBP", "SaveAnimatedPNG", "SaveVideo",
                            "SaveWEBM", "SaveAudio", "SaveLatent", "FAKE_OUTPUT"})
PICTURE_CLASSES = frozenset({"SaveImage", "PreviewImage"})  # save each image of the batch they are given
ANIMATION_CLASS = "SaveAnimatedWEBP"  # saves the batch as one animated WEBP (assets.Animation)
INVALID_CLASS = "FAKE_INVALID"
ERROR_CLASS = "FAKE_ERROR"
MAX_STEPS = 1000


class PromptRejected(Exception):
    """A 400 from ``POST /prompt``: ``{"error": {...}, "node_errors": {...}}``."""

    def __init__(self, error: dict[str, Any], node_errors: dict[str, Any] | None = None) -> None:
        super().__init__(error["message"])
        self.body = {"error": error, "node_errors": node_errors or {}}


def _error(type_: str, message: str, details: str = "", extra_info: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": type_, "message": message, "details": details, "extra_info": extra_info or {}}


def no_prompt() -> PromptRejected:
    return PromptRejected(_error("no_prompt", "No prompt provided", "No prompt provided"))


def _inputs(node: dict[str, Any]) -> dict[str, Any]:
    inputs = node.get("inputs")
    return inputs if isinstance(inputs, dict) else {}


def _links(node: dict[str, Any]) -> list[str]:
    return [str(v[0]) for v in _inputs(node).values() if isinstance(v, list) and len(v) == 2 and isinstance(v[1], int)]


def _dependencies(prompt: dict[str, Any], node_id: str) -> list[str]:
    """*node_id* and everything it needs, dependencies first (dangling links ignored)."""
    order: list[str] = []
    seen: set[str] = set()
    stack: list[tuple[str, bool]] = [(node_id, False)]
    while stack:
        current, expanded = stack.pop()
        if expanded:
            order.append(current)
            continue
        if current in seen or current not in prompt:
            continue
        seen.add(current)
        stack.append((current, True))
        stack.extend((dep, False) for dep in reversed(_links(prompt[current])) if dep not in seen)
    return order


@attrs.frozen
class Plan:
    outputs: list[str]               # output nodes to execute ("outputs_to_execute")
    node_errors: dict[str, Any]      # outputs that failed validation, reported on a 200 too
    nodes: list[str]                 # execution order
    classes: dict[str, str]          # node id -> class_type
    progress_node: str | None
    steps: int
    seconds: float | None            # fake_seconds from the workflow
    pictures: dict[str, Picture | None] = attrs.Factory(dict)  # output node -> what it saves


def validate(prompt: object, job_steps: int, targets: object = None) -> Plan:
    """The plan for a workflow, or PromptRejected with ComfyUI's 400 body."""
    if not isinstance(prompt, dict):
        raise PromptRejected(_error("invalid_prompt", "Cannot execute because the prompt is not an object.",
                                    f"{type(prompt).__name__}"))
    for node_id, node in prompt.items():
        if not isinstance(node, dict) or "class_type" not in node:
            raise PromptRejected(_error("invalid_prompt",
                                        "Cannot execute because a node is missing the class_type property.",
                                        f"Node ID '#{node_id}'"))
    known = registry()
    for node_id, node in prompt.items():
        if not isinstance(node["class_type"], str) or node["class_type"] not in known:
            raise PromptRejected(_error("invalid_prompt",
                                        f"Cannot execute because node {node['class_type']} does not exist.",
                                        f"Node ID '#{node_id}'"))
    classes = {str(k): str(v["class_type"]) for k, v in prompt.items()}
    outputs = [k for k, c in classes.items() if c in OUTPUT_CLASSES]
    if isinstance(targets, list):
        outputs = [k for k in outputs if k in {str(t) for t in targets}]
    if not outputs:
        raise PromptRejected(_error("prompt_no_outputs", "Prompt has no outputs"))
    checked = _Checked(prompt, known)
    node_errors: dict[str, Any] = {}
    good: list[str] = []
    own_errors: list[dict[str, Any]] = []
    for out in outputs:
        if checked.valid(out):
            good.append(out)
            continue
        own_errors += checked.errors[out]
        for node_id in checked.failed():  # as ComfyUI: every failing node so far depends on this output
            entry = node_errors.setdefault(node_id, {"errors": checked.errors[node_id], "dependent_outputs": [],
                                                     "class_type": classes[node_id]})
            entry["dependent_outputs"].append(out)
    if not good:
        details = "\n".join(f"{e['message']}: {e['details']}" for e in own_errors)
        raise PromptRejected(_error("prompt_outputs_failed_validation", "Prompt outputs failed validation",
                                    details), node_errors)
    nodes: list[str] = []
    for out in good:
        nodes += [n for n in _dependencies(prompt, out) if n not in nodes]
    progress_node, steps, seconds = None, job_steps, None
    for node_id in nodes:
        inputs = _inputs(prompt[node_id])
        given = inputs.get("steps")
        if progress_node is None and (_is_int(given) or "Sampler" in classes[node_id]):
            progress_node = node_id
            steps = max(1, min(int(given), MAX_STEPS)) if _is_int(given) else job_steps
        fake_seconds = inputs.get("fake_seconds")
        if seconds is None and isinstance(fake_seconds, int | float) and not isinstance(fake_seconds, bool):
            seconds = max(0.0, float(fake_seconds))
    pictures = {out: _picture(prompt, _inputs(prompt[out]).get("images")) for out in good
                if classes[out] in PICTURE_CLASSES | {ANIMATION_CLASS}}
    return Plan(good, node_errors, nodes, classes, progress_node, steps, seconds, pictures)


def registry() -> dict[str, Any]:
    from fakes.comfyui.assets import object_info

    return object_info()


@attrs.define
class _Checked:
    """Each node's validation, done once, in the order ComfyUI's ``validated`` fills."""

    prompt: dict[str, Any]
    known: dict[str, Any]  # /object_info
    errors: dict[str, list[dict[str, Any]]] = attrs.Factory(dict)  # node -> its own errors
    verdicts: dict[str, bool] = attrs.Factory(dict)
    visiting: set[str] = attrs.Factory(set)

    def valid(self, node_id: str) -> bool:
        if node_id in self.verdicts:
            return self.verdicts[node_id]
        self.visiting.add(node_id)
        node = self.prompt[node_id]
        inputs, errors, links_ok = _inputs(node), [], True
        for name, spec, required in _declared(self.known[node["class_type"]]):
            if name not in inputs:
                if required:
                    errors.append(_error("required_input_missing", "Required input is missing", name,
                                         {"input_name": name}))
            elif isinstance(inputs[name], list):
                target = inputs[name][0] if inputs[name] else None
                if isinstance(target, str) and target in self.prompt and target not in self.visiting:
                    links_ok = self.valid(target) and links_ok  # every link is followed, as ComfyUI does
            else:
                errors += _value_errors(name, spec, inputs[name])
        if node["class_type"] == INVALID_CLASS:
            errors.append(_invalid_input_error())
        self.visiting.discard(node_id)
        self.errors[node_id], self.verdicts[node_id] = errors, links_ok and not errors
        return self.verdicts[node_id]

    def failed(self) -> list[str]:
        return [node_id for node_id, ok in self.verdicts.items() if not ok and self.errors[node_id]]


def _declared(entry: dict[str, Any]) -> list[tuple[str, list[Any], bool]]:
    spec = entry["input"]
    return [(name, value, category == "required") for category in ("required", "optional")
            for name, value in spec.get(category, {}).items()]


def _value_errors(name: str, spec: list[Any], value: Any) -> list[dict[str, Any]]:
    """ComfyUI's conversion of an INT or FLOAT widget value, then its min and max."""
    kind, options = spec[0], spec[1] if len(spec) > 1 else {}
    if isinstance(value, dict) and "__value__" in value:
        value = value["__value__"]
    if kind not in ("INT", "FLOAT"):
        return []
    extra = {"input_name": name, "input_config": [kind, options]}
    try:
        number = int(value) if kind == "INT" else float(value)
    except Exception as exc:  # noqa: BLE001 - ComfyUI reports whatever the conversion raised
        return [_error("invalid_input_type", f"Failed to convert an input value to a {kind} value",
                       f"{name}, {value}, {exc}", {**extra, "received_value": value, "exception_message": str(exc)})]
    if "min" in options and number < options["min"]:
        return [_error("value_smaller_than_min", f"Value {number} smaller than min of {options['min']}", name,
                       {**extra, "received_value": number})]
    if "max" in options and number > options["max"]:
        return [_error("value_bigger_than_max", f"Value {number} bigger than max of {options['max']}", name,
                       {**extra, "received_value": number})]
    return []


def _picture(prompt: dict[str, Any], link: object, depth: int = 0) -> Picture | None:
    """What an IMAGE link carries, where the fake knows: EmptyImage, and ImageInvert of what it knows."""
    if not (isinstance(link, list) and link and isinstance(link[0], str) and link[0] in prompt) or depth > 100:
        return None
    node = prompt[link[0]]
    inputs = _inputs(node)
    if node["class_type"] == "ImageInvert":
        source = _picture(prompt, inputs.get("image"), depth + 1)
        return source.inverted() if source is not None else None
    if node["class_type"] != "EmptyImage":
        return None
    values = [inputs.get(name) for name in ("width", "height", "batch_size", "color")]
    values = [v["__value__"] if isinstance(v, dict) and "__value__" in v else v for v in values]
    if any(isinstance(v, list) for v in values):
        return None  # a link into a number: the fake does not compute it
    width, height, batch, color = (int(v) for v in values)  # validated: they convert
    return Picture.empty(width, height, batch, color)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _invalid_input_error() -> dict[str, Any]:
    return _error("value_not_in_list", "Value not in list", "fake_input: 'invalid' not in (list of length 0)",
                  {"input_name": "fake_input", "input_config": [[]], "received_value": "invalid"})
