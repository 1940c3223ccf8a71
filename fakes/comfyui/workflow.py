"""A workflow ("prompt" in the API format) checked like ``execution.validate_prompt`` and planned for the worker.

Its node registry is its ``/object_info`` (assets.py): like ComfyUI, a ``class_type`` it does
not know is refused (``invalid_prompt``, "node X does not exist"). What else it looks at:

* output nodes are those whose class is in ``OUTPUT_CLASSES``; no output -> ``prompt_no_outputs``;
* a node of class ``FAKE_INVALID`` fails validation (``value_not_in_list``), and with it every
  output that depends on it; all outputs failed -> 400 ``prompt_outputs_failed_validation``,
  some -> 200 with ``node_errors`` and only the good outputs run;
* a node of class ``FAKE_ERROR`` raises when it runs (``execution_error``);
* the first node with an integer ``steps`` input (or a class named like a sampler) reports
  ``progress``; any node input ``fake_seconds`` overrides the job time;
* links are inputs of the form ``["<node id>", <output index>]``.
"""

from __future__ import annotations

from typing import Any

import attrs

OUTPUT_CLASSES = frozenset({"SaveImage", "PreviewImage", "SaveAnimatedWEBP", "SaveAnimatedPNG", "SaveVideo",
                            "SaveWEBM", "SaveAudio", "SaveLatent", "FAKE_OUTPUT"})
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


def _links(node: dict[str, Any]) -> list[str]:
    inputs = node.get("inputs") or {}
    return [str(v[0]) for v in inputs.values() if isinstance(v, list) and len(v) == 2 and isinstance(v[1], int)]


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
    node_errors: dict[str, Any] = {}
    good: list[str] = []
    for out in outputs:
        bad = [n for n in _dependencies(prompt, out) if classes[n] == INVALID_CLASS]
        for node_id in bad:
            entry = node_errors.setdefault(node_id, {"errors": [_invalid_input_error()], "dependent_outputs": [],
                                                     "class_type": INVALID_CLASS})
            entry["dependent_outputs"].append(out)
        if not bad:
            good.append(out)
    if not good:
        details = "\n".join(f"{e['message']}: {e['details']}" for entry in node_errors.values()
                            for e in entry["errors"])
        raise PromptRejected(_error("prompt_outputs_failed_validation", "Prompt outputs failed validation",
                                    details), node_errors)
    nodes: list[str] = []
    for out in good:
        nodes += [n for n in _dependencies(prompt, out) if n not in nodes]
    progress_node, steps, seconds = None, job_steps, None
    for node_id in nodes:
        inputs = prompt[node_id].get("inputs") or {}
        given = inputs.get("steps")
        if progress_node is None and (_is_int(given) or "Sampler" in classes[node_id]):
            progress_node = node_id
            steps = max(1, min(int(given), MAX_STEPS)) if _is_int(given) else job_steps
        fake_seconds = inputs.get("fake_seconds")
        if seconds is None and isinstance(fake_seconds, int | float) and not isinstance(fake_seconds, bool):
            seconds = max(0.0, float(fake_seconds))
    return Plan(good, node_errors, nodes, classes, progress_node, steps, seconds)


def registry() -> frozenset[str]:
    from fakes.comfyui.assets import object_info

    return frozenset(object_info())


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _invalid_input_error() -> dict[str, Any]:
    return _error("value_not_in_list", "Value not in list", "fake_input: 'invalid' not in (list of length 0)",
                  {"input_name": "fake_input", "input_config": [[]], "received_value": "invalid"})
