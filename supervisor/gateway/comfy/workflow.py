"""A text-to-image model as ComfyUI runs it: an API-format workflow with placeholders.

The workflow is ComfyUI's own "Export (API)" JSON, a graph of nodes, in which some input
values are placeholders steward fills per image: ``{{prompt}}``, ``{{negative_prompt}}``,
``{{width}}``, ``{{height}}``, ``{{seed}}`` and ``{{steps}}``; a video's also ``{{frames}}``,
``{{seconds}}``, ``{{fps}}`` and ``{{input_reference}}`` (the name of the reference image the
request uploaded into ComfyUI's input folder, for a LoadImage node). A value that *is* a
placeholder (``"seed": "{{seed}}"``) becomes the value itself, a number where the
placeholder is a number; one placeholder inside a longer text (``"a photo of {{prompt}}"``)
is replaced as text. Steward's images come from what the prompt's output nodes saved
(``/history``: ``outputs.NODE.images``). Pure: reading the file is the caller's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import attrs

PLACEHOLDER = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")
NUMBERS = frozenset({"width", "height", "seed", "steps", "frames", "seconds", "fps"})
TEXTS = frozenset({"prompt", "negative_prompt", "input_reference"})
KNOWN = NUMBERS | TEXTS
SAVED = "output"  # /history's image type for files written by SaveImage (PreviewImage's are "temp")


class WorkflowError(ValueError):
    """Why a workflow file cannot be used, in words for `models.NAME.workflow: ...`."""


@attrs.frozen
class ImageParams:
    """What one run of a workflow is asked for."""

    prompt: str
    width: int
    height: int
    seed: int
    steps: int
    negative_prompt: str = ""
    frames: int = 1  # a video's: seconds * fps
    seconds: int = 0
    fps: int = 0
    input_reference: str = ""  # a video's reference image, as ComfyUI's input folder names it

    def value(self, name: str) -> str | int:
        return getattr(self, name)  # type: ignore[no-any-return]


@attrs.frozen
class Workflow:
    graph: dict[str, dict[str, Any]]
    placeholders: frozenset[str]

    @classmethod
    def parse(cls, text: str | bytes) -> Workflow:
        """A workflow from its JSON text; WorkflowError says what is wrong with it."""
        try:
            graph = json.loads(text)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise WorkflowError(f"is not JSON ({exc})") from None
        if isinstance(graph, dict) and "nodes" in graph and "links" in graph:
            raise WorkflowError("is a ComfyUI UI workflow; export it with \"Export (API)\" (the API format)")
        if not isinstance(graph, dict) or not graph:
            raise WorkflowError("must be an API-format workflow: a JSON object of nodes")
        for node_id, node in graph.items():
            if not isinstance(node, dict) or not isinstance(node.get("class_type"), str):
                raise WorkflowError(f"node {node_id!r} has no class_type (is it ComfyUI's API format?)")
            if not isinstance(node.get("inputs", {}), dict):
                raise WorkflowError(f"node {node_id!r}: inputs must be an object")
        found = frozenset(name for value in _strings(graph) for name in PLACEHOLDER.findall(value))
        if unknown := sorted(found - KNOWN):
            raise WorkflowError(f"has unknown placeholders {', '.join('{{' + n + '}}' for n in unknown)}; "
                                f"steward fills {', '.join('{{' + n + '}}' for n in sorted(KNOWN))}")
        if "prompt" not in found:
            raise WorkflowError("holds no {{prompt}} placeholder: the request's prompt would go nowhere")
        return cls(graph, found)

    def filled(self, params: ImageParams) -> dict[str, dict[str, Any]]:
        """The graph with every placeholder replaced by *params* (a new graph)."""
        return {node_id: {**node, "inputs": {key: _fill(value, params) for key, value in node.get("inputs", {}).items()}}
                for node_id, node in self.graph.items()}


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def _fill(value: Any, params: ImageParams) -> Any:
    if isinstance(value, str):
        whole = PLACEHOLDER.fullmatch(value)
        if whole is not None:
            return params.value(whole.group(1))
        return PLACEHOLDER.sub(lambda m: str(params.value(m.group(1))), value)
    if isinstance(value, list):
        return [_fill(item, params) for item in value]
    if isinstance(value, dict):
        return {key: _fill(item, params) for key, item in value.items()}
    return value


@attrs.frozen
class SavedImage:
    """One image a prompt produced, as ``/view`` finds it."""

    filename: str
    subfolder: str
    type: str
    animated: bool = False  # saved by SaveAnimatedWEBP / SaveAnimatedPNG / SaveVideo ("animated": [true])

    def query(self) -> dict[str, str]:
        return {"filename": self.filename, "subfolder": self.subfolder, "type": self.type}


def saved_images(entry: Mapping[str, Any]) -> list[SavedImage]:
    """The images in a ``/history`` entry's outputs: the saved ones, else the previews."""
    found = []
    for output in (entry.get("outputs") or {}).values():
        animated = isinstance(output, dict) and any(flag is True for flag in output.get("animated") or [])
        for image in (output.get("images") or []) if isinstance(output, dict) else []:
            if isinstance(image, dict) and isinstance(image.get("filename"), str):
                found.append(SavedImage(image["filename"], str(image.get("subfolder") or ""),
                                        str(image.get("type") or SAVED), animated))
    saved = [image for image in found if image.type == SAVED]
    return saved or found


def failure_of(entry: Mapping[str, Any]) -> str:
    """What a failed prompt's ``/history`` entry says went wrong, in ComfyUI's words."""
    for message in reversed((entry.get("status") or {}).get("messages") or []):
        if isinstance(message, list) and len(message) == 2 and message[0] == "execution_error":
            data = message[1] if isinstance(message[1], dict) else {}
            node = f"{data.get('node_type', '?')} (node {data.get('node_id', '?')})"
            return f"{node}: {data.get('exception_type', 'error')}: {data.get('exception_message', '').strip()}"
        if isinstance(message, list) and message and message[0] == "execution_interrupted":
            return "the prompt was interrupted"
    return "ComfyUI reported an error without a message"


def load_workflow(path: str) -> Workflow:
    """The workflow in the file at *path*; ValueError (WorkflowError) says what is wrong."""
    try:
        with open(path, "rb") as file:
            return Workflow.parse(file.read())
    except OSError as exc:
        raise WorkflowError(f"cannot be read: {exc.strerror or exc}") from None
