"""The event log is read by steward itself: a consumed event's name and fields are a contract.

Metrics, health, alerts, the slowdown meter and the state file's load times read events by
name and field (``match event.name: case "dispatch": f["waited_s"]``). A field renamed where
it is emitted would leave them reading nothing, and no test of the emitter would notice.
This test reads both sides from the source, with ``ast``:

- **emitted**: every ``.emit("name", level, field=..., **{"class": ...})`` (and the core's
  ``_emit``) under supervisor/ and adapters/, with the fields of each call;
- **consumed**: in every function that branches on an event's name (``match X.name`` and its
  ``case "a" | "b"``, or ``if X.name == "a"`` / ``if name == "a"``), the fields read from the
  event's fields (``f``, ``fields``, ``X.fields``) in that branch and its guard: ``f["k"]`` is
  required, ``f.get("k")`` optional.

Each consumed name must be emitted; a required field must be in every call that emits the
name (a call that splats an unknown mapping is taken to have it); an optional one in at least
one. The developer tools (supervisor/tools/: the simulator, the load tests) read
kept logs of their own and are not consumers here.
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "supervisor", ROOT / "adapters"]
NOT_CONSUMERS = ("supervisor/tools/",)
EMITTERS = frozenset({"emit", "_emit", "count"})  # count: told to the metrics only (EventLog.count)
FIELD_MAPPINGS = frozenset({"f", "fields"})


@attrs.frozen
class Emission:
    where: str
    fields: frozenset[str]
    open_ended: bool  # splats a mapping whose keys are not written out


@attrs.frozen
class Reading:
    where: str
    event: str
    field: str
    required: bool


def _python_files() -> list[Path]:
    return sorted(path for root in SOURCES for path in root.rglob("*.py"))


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"


def emissions() -> dict[str, list[Emission]]:
    found: dict[str, list[Emission]] = collections.defaultdict(list)
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and _called(node) in EMITTERS and node.args
                    and (names := _constant_names(node.args[0]))):
                continue
            fields, open_ended = set(), False
            for keyword in node.keywords:
                if keyword.arg is not None:
                    fields.add(keyword.arg)
                elif isinstance(keyword.value, ast.Dict) and all(isinstance(k, ast.Constant) for k in keyword.value.keys):
                    fields.update(str(k.value) for k in keyword.value.keys if isinstance(k, ast.Constant))
                else:
                    open_ended = True
            for name in names:
                found[name].append(Emission(_where(path, node), frozenset(fields), open_ended))
    return found


def _called(call: ast.Call) -> str | None:
    """The name of what *call* calls: ``emit`` for ``events.emit(...)`` and ``emit(...)``."""
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return call.func.id if isinstance(call.func, ast.Name) else None


def _constant_names(node: ast.AST) -> list[str]:
    """An event's name as written: a string, or ``"a" if x else "b"`` (each one)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _constant_names(node.body) + _constant_names(node.orelse)
    return []


def _is_fields(node: ast.AST) -> bool:
    return ((isinstance(node, ast.Name) and node.id in FIELD_MAPPINGS)
            or (isinstance(node, ast.Attribute) and node.attr == "fields"))


def _reads(nodes: list[ast.AST]) -> list[tuple[str, bool, ast.AST]]:
    """The fields read in *nodes*: (field, required, where)."""
    reads = []
    for root in nodes:
        for node in ast.walk(root):
            if (isinstance(node, ast.Subscript) and _is_fields(node.value) and isinstance(node.slice, ast.Constant)
                    and isinstance(node.slice.value, str)):
                reads.append((node.slice.value, True, node))
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                  and _is_fields(node.func.value) and node.args and isinstance(node.args[0], ast.Constant)
                  and isinstance(node.args[0].value, str)):
                reads.append((node.args[0].value, False, node))
    return reads


def _names_in_pattern(pattern: ast.pattern) -> list[str]:
    if isinstance(pattern, ast.MatchValue) and isinstance(pattern.value, ast.Constant):
        return [pattern.value.value] if isinstance(pattern.value.value, str) else []
    if isinstance(pattern, ast.MatchOr):
        return [name for p in pattern.patterns for name in _names_in_pattern(p)]
    return []


def _is_name_of_event(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "name") or (isinstance(node, ast.Name)
                                                                          and node.id == "name")


def _names_compared(test: ast.AST) -> list[str]:
    """The event names an ``if`` test requires: ``X.name == "a"`` (alone or in an ``and``)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [name for value in test.values for name in _names_compared(value)]
    if (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)
            and _is_name_of_event(test.left) and isinstance(test.comparators[0], ast.Constant)
            and isinstance(test.comparators[0].value, str)):
        return [test.comparators[0].value]
    return []


def readings() -> list[Reading]:
    found = []
    for path in _python_files():
        if any(str(path.relative_to(ROOT)).startswith(prefix) for prefix in NOT_CONSUMERS):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            branches: list[tuple[list[str], list[ast.AST]]] = []
            if isinstance(node, ast.Match) and _is_name_of_event(node.subject):
                branches = [(_names_in_pattern(case.pattern), [*case.body, *([case.guard] if case.guard else [])])
                            for case in node.cases]
            elif isinstance(node, ast.If) and (names := _names_compared(node.test)):
                branches = [(names, [*node.body, node.test])]
            for names, body in branches:
                for field, required, where in _reads(body):
                    found.extend(Reading(_where(path, where), name, field, required) for name in names)
    return found


def test_every_field_steward_reads_from_an_event_is_emitted_with_it() -> None:
    emitted, read = emissions(), readings()
    problems = []
    for reading in read:
        calls = emitted.get(reading.event)
        if not calls:
            problems.append(f"{reading.where}: reads event {reading.event!r}, which nothing emits")
            continue
        having = [c for c in calls if reading.field in c.fields or c.open_ended]
        if reading.required and len(having) < len(calls):
            missing = [c.where for c in calls if c not in having]
            problems.append(f"{reading.where}: reads {reading.event}[{reading.field!r}], missing at {missing}")
        elif not having:
            problems.append(f"{reading.where}: reads {reading.event}.get({reading.field!r}), never emitted")
    assert problems == []


def test_the_contract_reader_sees_the_consumers_it_guards() -> None:
    """The readers above find what metrics, health, alerts, the slowdown meter and the state
    file's load times read: if a refactor changed how they branch, this says so rather than
    the contract going quietly empty."""
    read = {(r.event, r.field, r.required) for r in readings()}
    for expected in [("dispatch", "waited_s", True), ("dispatch", "class", True), ("crash", "engine", True),
                     ("request", "slowdown", False), ("reject", "reason", False), ("ready", "load_s", True),
                     ("ready", "wake", False), ("task_failed", "task", True), ("complete", "job", False),
                     ("load", "devices", False)]:
        assert expected in read
    emitted = emissions()
    assert {"dispatch", "complete", "ready", "request", "crash", "task_failed"} <= set(emitted)
    assert "class" in next(iter(emitted["dispatch"])).fields  # a ** {"class": ...} splat is read


def test_a_renamed_field_is_caught(tmp_path: Path) -> None:
    """The check fails when an emitter and a reader disagree (a rename on one side)."""
    source = tmp_path / "renamed.py"
    source.write_text('def emit_it(events):\n    events.emit("dispatch_x", "info", waited=1.0)\n\n'
                      'def read_it(event):\n    f = event.fields\n    match event.name:\n'
                      '        case "dispatch_x":\n            return f["waited_s"]\n')
    tree = ast.parse(source.read_text())
    [match] = [n for n in ast.walk(tree) if isinstance(n, ast.Match)]
    [(field, required, _)] = _reads(match.cases[0].body)
    [call] = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "emit"]
    assert (field, required) == ("waited_s", True)
    assert field not in {k.arg for k in call.keywords}
