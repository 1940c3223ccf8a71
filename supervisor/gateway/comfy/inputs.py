"""ComfyUI's input validation, mirrored from its ``/object_info``: will every output of a prompt fail?

ComfyUI 0.3.64 (``execution.validate_prompt`` / ``validate_inputs``) validates each output node
and, depth first through its links, every node it depends on; when every output fails it answers
400 ``prompt_outputs_failed_validation`` with each failing node's errors, when at least one passes
it answers 200 and runs those. Steward asks the same question before it takes the GPU, so that a
prompt ComfyUI will refuse unloads nothing, and answers with the body ComfyUI would send. Pure: the
prompt as parsed, the output ids ComfyUI would validate, and the node classes read from
``/object_info`` (`NodeClass.of`) in; `OutputsFailed` or None out.

A refusal ComfyUI would not make is far worse than a late one, so steward checks only what is
certain from ``/object_info``. What it checks, for every class:

* a required input that is missing (``required_input_missing``);
* a list that is not ``[node_id, slot]`` (``bad_linked_input``); a link to a node the prompt lacks
  or to an output slot its class lacks, and a node without ``inputs``: ComfyUI raises there
  (``exception_during_validation``, or ``..._inner_validation`` on the node that links to it);
* an INT or FLOAT that ``int()`` / ``float()`` cannot convert (``invalid_input_type``), after
  unwrapping ``{"__value__": v}``.

A class's ``VALIDATE_INPUTS`` (``validate_inputs`` in the V3 API) turns off the min/max (and COMBO)
checks of the inputs it names, or of all of them with ``**kwargs``, and the link types when it takes
``input_types``; and custom types (``"*"`` and other ``AnyType`` strings) override ``!=``.
``/object_info`` says neither, so two checks are made only where ComfyUI's own code is known:

* below min / above max (``value_smaller_than_min`` / ``value_bigger_than_max``) for INT and FLOAT
  inputs of ComfyUI's own classes (``python_module`` ``nodes``, ``comfy_extras.*``,
  ``comfy_api_nodes.*``), except the inputs their ``VALIDATE_INPUTS`` names (`CORE_VALIDATE_INPUTS`);
* a link from an output of the wrong type (``return_type_mismatch``) between two such classes, where
  no type holds ``*`` and the comma-separated types share none.

Never checked: a COMBO value that is not in its list (an image uploaded, a model copied in, after
``/object_info`` was read is in ComfyUI's list but not in steward's), the custom validation itself,
min/max of custom classes, types of links that touch a custom class. Where the outcome is not
modelled at all (a cycle, a chain deeper than `MAX_DEPTH`, ``inputs`` that are not an object, an
``/object_info`` entry that cannot be read, a bound that is not a number) steward refuses nothing.

The answer is ComfyUI's byte for byte when every error in the prompt is one steward checks, except
that steward cannot know the traceback of an exception (its ``traceback`` is ``[]``). ComfyUI walks
a node's inputs and the outputs as Python sets, so with several errors in one node, or several
failing outputs, the order of its answer changes from one ComfyUI process to the next; steward uses
the declared input order and the prompt's order, one of the orders ComfyUI may answer in. A custom
node's ``on_prompt`` handler, which may rewrite a prompt before ComfyUI validates it, is invisible
here.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

# ComfyUI 0.3.64's own classes with a VALIDATE_INPUTS / validate_inputs, and the arguments it
# takes (listed from a running ComfyUI with inspect.getfullargspec): min/max of these inputs, and
# with "input_types" the link types, are the class's own business.
CORE_VALIDATE_INPUTS: Mapping[str, frozenset[str]] = {
    "LoadImage": frozenset({"image"}), "LoadImageMask": frozenset({"image"}),
    "LoadImageOutput": frozenset({"image"}), "LoadLatent": frozenset({"latent"}),
    "WebcamCapture": frozenset({"image"}), "LoadVideo": frozenset({"file"}),
    "KlingCameraControls": frozenset({"horizontal_movement", "vertical_movement", "pan", "tilt", "roll", "zoom"}),
    "FluxProUltraImageNode": frozenset({"aspect_ratio"}), "TripoConversionNode": frozenset({"input_types"}),
}
CORE_MODULES = ("comfy_extras.", "comfy_api_nodes.")  # and "nodes" itself
MAX_DEPTH = 200  # ComfyUI recurses through links in Python: far deeper chains end in a RecursionError
_NUMBERS = frozenset({"INT", "FLOAT"})


class Origin(enum.Enum):
    """Whose code a node class is: how much of ComfyUI's validation steward can predict for it."""

    CORE = "core"  # ComfyUI's own: its VALIDATE_INPUTS are known (CORE_VALIDATE_INPUTS)
    CUSTOM = "custom"  # a custom node: a VALIDATE_INPUTS may take over any check it is allowed to


@attrs.frozen
class InputSpec:
    """One declared input: ``"name": [type, options]`` under ``required`` or ``optional``."""

    name: str
    required: bool
    type: Any  # "INT", "IMAGE", "MODEL_TASK_ID,RIG_TASK_ID", or a COMBO's list of choices
    options: Mapping[str, Any]  # the spec's second element: default, min, max, tooltip...

    @property
    def config(self) -> list[Any]:
        """``input_config`` as ComfyUI's errors carry it."""
        return [self.type, self.options]

    @property
    def numeric(self) -> bool:
        return isinstance(self.type, str) and self.type in _NUMBERS


@attrs.frozen
class NodeClass:
    """What validation needs of one ``/object_info`` entry. An entry steward cannot read has
    ``inputs`` or ``outputs`` None: a prompt that reaches it is left to ComfyUI."""

    name: str
    output_node: bool
    inputs: tuple[InputSpec, ...] | None
    outputs: tuple[Any, ...] | list[Any] | None  # a V3 class's RETURN_TYPES is a list, a V1 one's a tuple
    origin: Origin

    @classmethod
    def of(cls, name: str, entry: object) -> NodeClass:
        if not isinstance(entry, dict):
            return cls(name, False, None, None, Origin.CUSTOM)
        module = entry.get("python_module")
        core = module == "nodes" or (isinstance(module, str) and module.startswith(CORE_MODULES))
        return cls(name, bool(entry.get("output_node")), _inputs(entry.get("input")), _outputs(entry),
                   Origin.CORE if core else Origin.CUSTOM)

    @property
    def validate_inputs(self) -> frozenset[str] | None:
        """The arguments of the class's VALIDATE_INPUTS (empty: none); None: a custom class, unknown."""
        return CORE_VALIDATE_INPUTS.get(self.name, frozenset()) if self.origin is Origin.CORE else None

    def checks_bounds(self, spec: InputSpec) -> bool:
        named = self.validate_inputs
        return spec.numeric and named is not None and spec.name not in named

    def checks_link_types(self, source: NodeClass) -> bool:
        named = self.validate_inputs
        return named is not None and "input_types" not in named and source.origin is Origin.CORE


def _inputs(spec: object) -> tuple[InputSpec, ...] | None:
    if not isinstance(spec, dict):
        return None
    inputs: dict[str, InputSpec] = {}
    for category in ("required", "optional"):
        declared = spec.get(category, {})
        if not isinstance(declared, dict):
            return None
        for name, entry in declared.items():
            if not isinstance(entry, list) or not entry or (len(entry) > 1 and not isinstance(entry[1], dict)):
                return None
            # An input both required and optional is required (get_input_info looks there first).
            inputs.setdefault(name, InputSpec(name, category == "required", entry[0],
                                              entry[1] if len(entry) > 1 else {}))
    return tuple(inputs.values())


def _outputs(entry: dict[str, Any]) -> tuple[Any, ...] | list[Any] | None:
    outputs = entry.get("output")
    if not isinstance(outputs, list):
        return None
    # Only a V3 schema's entry has all three keys (V1 adds each only when true): its RETURN_TYPES
    # is a list, which ComfyUI's IndexError names.
    v3 = all(key in entry for key in ("deprecated", "experimental", "api_node"))
    return list(outputs) if v3 else tuple(outputs)


@attrs.frozen
class OutputsFailed:
    """ComfyUI's 400 ``prompt_outputs_failed_validation``: its ``details`` and ``node_errors``."""

    details: str
    node_errors: dict[str, Any]


def validate_outputs(prompt: Mapping[str, Any], outputs: Sequence[str],
                     classes: Mapping[str, NodeClass]) -> OutputsFailed | None:
    """What ComfyUI answers when every one of *outputs* fails validation; None when one passes
    (ComfyUI runs it) or when steward cannot tell (a class *classes* lacks among them)."""
    walk = _Walk(prompt, classes)
    failed: list[list[dict[str, Any]]] = []
    node_errors: dict[str, Any] = {}
    try:
        for output in outputs:
            verdict = walk.output(output)
            if verdict.valid:
                return None
            failed.append(verdict.errors)
            # As ComfyUI does: every failing node validated so far counts this output as dependent.
            for node_id, seen in walk.validated.items():
                if not seen.valid and seen.errors:
                    entry = node_errors.setdefault(node_id, {"errors": seen.errors, "dependent_outputs": [],
                                                             "class_type": prompt[node_id]["class_type"]})
                    entry["dependent_outputs"].append(output)
    except (_Unmodeled, RecursionError):  # RecursionError: a value nested too deep to print, as ComfyUI prints it
        return None
    if not failed:
        return None
    return OutputsFailed("\n".join(f"{e['message']}: {e['details']}" for errors in failed for e in errors),
                         node_errors)


@attrs.frozen
class _Verdict:
    valid: bool
    errors: list[dict[str, Any]]  # the node's own; a node that fails only through a link has none


class _Unmodeled(Exception):
    """The prompt reaches what steward does not model: the answer is left to ComfyUI."""


class _Raised(Exception):
    """Where ComfyUI's validation raises: *error* is what the same Python operation raised here."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


@attrs.define
class _Walk:
    prompt: Mapping[str, Any]
    classes: Mapping[str, NodeClass]
    validated: dict[str, _Verdict] = attrs.Factory(dict)  # in the order ComfyUI's own dict fills
    validating: list[str] = attrs.Factory(list)  # the nodes being validated, outermost first

    def output(self, node_id: str) -> _Verdict:
        try:
            return self.node(node_id)
        except _Raised as raised:
            verdict = _Verdict(False, [_error("exception_during_validation", "Exception when validating node",
                                              str(raised.error), {"exception_type": _type_name(raised.error),
                                                                  "traceback": []})])
            self.validated[node_id] = verdict
            return verdict

    def node(self, node_id: str) -> _Verdict:
        if node_id in self.validated:
            return self.validated[node_id]
        if node_id in self.validating or len(self.validating) >= MAX_DEPTH:
            raise _Unmodeled  # ComfyUI recurses until Python stops it
        self.validating.append(node_id)
        try:
            verdict = self._inputs(node_id)
        finally:
            self.validating.pop()
        self.validated[node_id] = verdict
        return verdict

    def _inputs(self, node_id: str) -> _Verdict:
        node = self.prompt[node_id]
        if "inputs" not in node:
            raise _Raised(KeyError("inputs"))
        inputs, klass = node["inputs"], self._class_of(node)
        if not isinstance(inputs, dict) or klass.inputs is None:
            raise _Unmodeled
        errors: list[dict[str, Any]] = []
        valid = True
        for spec in klass.inputs:
            if spec.name not in inputs:
                if spec.required:
                    errors.append(_error("required_input_missing", "Required input is missing", spec.name,
                                         {"input_name": spec.name}))
                continue
            value = inputs[spec.name]
            if isinstance(value, list):
                error, linked = self._link(klass, spec, value)
                errors += [error] if error is not None else []
                valid = valid and linked
            elif (error := _value_error(klass, spec, value)) is not None:
                errors.append(error)
        return _Verdict(valid and not errors, errors)

    def _class_of(self, node: Mapping[str, Any]) -> NodeClass:
        klass = self.classes.get(node["class_type"])
        if klass is None:
            raise _Unmodeled  # the caller refuses unknown classes first; never guess here
        return klass

    def _link(self, klass: NodeClass, spec: InputSpec, link: list[Any]) -> tuple[dict[str, Any] | None, bool]:
        """(this input's error, whether the node it links to is valid)."""
        if len(link) != 2:
            return _error("bad_linked_input", "Bad linked input, must be a length-2 list of [node_id, slot_index]",
                          spec.name, {"input_name": spec.name, "input_config": spec.config,
                                      "received_value": link}), True
        # ComfyUI's prompt[o_id]['class_type'] and RETURN_TYPES[slot]: what they raise here, they raise there.
        try:
            source_node = self.prompt[link[0]]
        except (KeyError, TypeError) as exc:
            raise _Raised(exc) from None
        source = self._class_of(source_node)
        if source.outputs is None:
            raise _Unmodeled
        try:
            received = source.outputs[link[1]]
        except (IndexError, TypeError) as exc:
            raise _Raised(exc) from None
        if klass.checks_link_types(source) and not _types_match(received, spec.type):
            return _error("return_type_mismatch", "Return type mismatch between linked nodes",
                          f"{spec.name}, received_type({received}) mismatch input_type({spec.type})",
                          {"input_name": spec.name, "input_config": spec.config, "received_type": received,
                           "linked_node": link}), True
        try:
            return None, self.node(link[0]).valid
        except _Raised as raised:
            self.validated[link[0]] = _Verdict(False, [_error(
                "exception_during_inner_validation", "Exception when validating inner node", str(raised.error),
                {"input_name": spec.name, "input_config": spec.config, "exception_message": str(raised.error),
                 "exception_type": _type_name(raised.error), "traceback": [], "linked_node": link})])
            return None, False


def _value_error(klass: NodeClass, spec: InputSpec, value: Any) -> dict[str, Any] | None:
    """A widget value's error: ComfyUI's conversion, then its bounds."""
    if isinstance(value, dict) and "__value__" in value:
        value = value["__value__"]  # a list-valued widget, wrapped so that it is not read as a link
    if not spec.numeric:
        return None  # STRING and BOOLEAN convert anything; COMBO membership is left to ComfyUI
    try:
        number = int(value) if spec.type == "INT" else float(value)
    except Exception as exc:  # noqa: BLE001 - whatever int() or float() raise, ComfyUI reports
        return _error("invalid_input_type", f"Failed to convert an input value to a {spec.type} value",
                      f"{spec.name}, {value}, {exc}", {"input_name": spec.name, "input_config": spec.config,
                                                       "received_value": value, "exception_message": str(exc)})
    if not klass.checks_bounds(spec):
        return None
    if (low := _bound(spec, "min")) is not None and number < low:
        return _error("value_smaller_than_min", f"Value {number} smaller than min of {low}", spec.name,
                      {"input_name": spec.name, "input_config": spec.config, "received_value": number})
    if (high := _bound(spec, "max")) is not None and number > high:
        return _error("value_bigger_than_max", f"Value {number} bigger than max of {high}", spec.name,
                      {"input_name": spec.name, "input_config": spec.config, "received_value": number})
    return None


def _bound(spec: InputSpec, key: str) -> int | float | None:
    if key not in spec.options:
        return None
    limit = spec.options[key]
    if not isinstance(limit, int | float):
        raise _Unmodeled  # ComfyUI compares anyway, and raises or not
    return limit


def _types_match(received: object, expected: object) -> bool:
    """``validate_node_input``, and lenient where a type could be a custom one: only two type
    strings that share no type, neither with a ``*``, are a mismatch."""
    if not isinstance(received, str) or not isinstance(expected, str) or received == expected:
        return True
    got = {t.strip() for t in received.split(",")}
    wanted = {t.strip() for t in expected.split(",")}
    return "*" in got or "*" in wanted or bool(got & wanted)


def _error(kind: str, message: str, details: str, extra_info: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "message": message, "details": details, "extra_info": extra_info}


def _type_name(error: Exception) -> str:
    """``execution.full_type_name``: builtins bare, others with their module."""
    kind = type(error)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
