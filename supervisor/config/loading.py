"""Reading the config: the file, its YAML, structured by the converter into the schema, checked.

Every error names the key path and what is wrong, e.g.
``models.chat.parallel: must be a positive integer, got 'two'``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TypeVar

import attrs
import yaml
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError

from supervisor.config.checks import check_semantics
from supervisor.config.hooks import converter
from supervisor.config.schema import IMAGE_RUNTIME, REMOTE_RUNTIME, Config, ImageModelConfig, RemoteModelConfig
from supervisor.gateway.comfy.workflow import load_workflow
from supervisor.units import show


_Model = TypeVar("_Model")


class ConfigError(Exception):
    """A config problem a person can fix; ``problems`` holds one line per problem, as a terminal
    shows it: a control character, a lone surrogate or a line break a key or value holds is
    written as its escape (``\\x1b``), never acted on by the terminal that shows the problem."""

    def __init__(self, problems: list[str]) -> None:
        problems = [_printable(problem) for problem in problems]
        super().__init__("\n".join(problems))
        self.problems = problems


def _printable(text: str) -> str:
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def load_config(path: str | Path) -> Config:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read config: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{path}: cannot read config: not UTF-8 text (byte {exc.start})"]) from None
    config = resolve_paths(parse_config(_read_yaml(text, str(path))), path.parent)
    if problems := workflow_problems(config):
        raise ConfigError(problems)
    return config


def workflow_problems(config: Config) -> list[str]:
    """What is wrong with the image models' workflow files (read here, and again when served)."""
    problems = []
    for name, model in config.image_models.items():
        try:
            load_workflow(model.workflow)
        except ValueError as exc:
            problems.append(f"models.{name}.workflow: {model.workflow} {exc}")
    return problems


def load_config_for_command(path: str | Path) -> Config | None:
    """The config a `steward` command was given, or None once what is wrong with it is on stderr."""
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"steward: {path} is not a valid config:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return None


def resolve_paths(config: Config, folder: Path) -> Config:
    """Steward's own files (event log, state, keys, usage log) live beside the config unless a
    path says otherwise, so `steward keys add --config` and `steward run` agree from any folder."""

    def beside(value: str | None) -> str | None:
        return None if value is None else str(folder / Path(value).expanduser())

    return attrs.evolve(
        config, state_file=beside(config.state_file),
        image_models={name: attrs.evolve(model, workflow=beside(model.workflow))
                      for name, model in config.image_models.items()},
        remote_models={name: attrs.evolve(model, ca_file=beside(model.ca_file))
                       for name, model in config.remote_models.items()},
        log=attrs.evolve(config.log, file=beside(config.log.file)),
        videos=attrs.evolve(config.videos, dir=beside(config.videos.dir)),
        auth=attrs.evolve(config.auth, keys_file=beside(config.auth.keys_file)),
        usage=attrs.evolve(config.usage, db=beside(config.usage.db)),
        kv_cache=attrs.evolve(config.kv_cache, dir=beside(config.kv_cache.dir)))


# Far deeper than any config; PyYAML's composer recurses, and Python's stack ends near 1000.
_MAX_DEPTH = 100
_MERGE_TAG = "tag:yaml.org,2002:merge"
_INT_TAG = "tag:yaml.org,2002:int"


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, bounded in depth, whose errors name the file, the line and the key."""

    def __init__(self, text: str, where: str) -> None:
        super().__init__(text)
        self.name = where  # the marks in its errors would say "<unicode string>"
        self._depth = 0
        self._paths: dict[yaml.Node, str] = {}  # each node's key path, filled by check_tree

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node | None:
        if self._depth >= _MAX_DEPTH:
            raise yaml.composer.ComposerError(None, None, f"nested more than {_MAX_DEPTH} levels deep",
                                              self.peek_event().start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as exc:  # int() past Python's digit limit, a 13th month, ...
            where = f"{self._paths.get(node, '(top level)')}: line {node.start_mark.line + 1}"
            raise ConfigError([f"{where}: {_unreadable(node, exc)}"]) from None

    def check_tree(self, node: yaml.Node, path: str = "", holders: tuple[yaml.Node, ...] = ()) -> list[str]:
        """Keys given twice, and aliases to their own holder; notes each node's key path."""
        if node in holders:
            where = f"{path or '(top level)'}: line {node.start_mark.line + 1}"
            return [f"{where}: an alias refers to the list or mapping that holds it"]
        if node in self._paths:
            return []  # reached again through an alias: checked once (so a billion laughs stay ten)
        self._paths[node] = path or "(top level)"
        holders = (*holders, node)
        if isinstance(node, yaml.SequenceNode):
            return [p for i, item in enumerate(node.value)
                    for p in self.check_tree(item, f"{path or '(top level)'}[{i}]", holders)]
        if isinstance(node, yaml.MappingNode):
            return self._check_mapping(node, path, holders)
        return []

    def _check_mapping(self, node: yaml.MappingNode, path: str, holders: tuple[yaml.Node, ...]) -> list[str]:
        problems: list[str] = []
        lines: dict[tuple[str, str], int] = {}  # each key's first line
        for key, value in node.value:
            child = path  # a merge key (`<<: *base`) adds its keys to this mapping
            if isinstance(key, yaml.ScalarNode) and key.tag != _MERGE_TAG:
                child = f"{path}.{_key_text(key.value)}" if path else _key_text(key.value)
                problems += _given_twice(lines, key, child)
            problems += self.check_tree(key, child, holders) + self.check_tree(value, child, holders)
        return problems


def _given_twice(lines: dict[tuple[str, str], int], key: yaml.ScalarNode, path: str) -> list[str]:
    line, first = key.start_mark.line + 1, lines.get((key.tag, key.value))
    if first is None:
        lines[key.tag, key.value] = line
        return []
    where = f"lines {first} and {line}" if line != first else f"line {line}"
    return [f"{path}: key given twice, on {where}; keep one"]


def _read_yaml(text: str, where: str) -> object:
    try:
        loader = _Loader(text, where)
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow; found before any parsing
        line = text.count("\n", 0, exc.position) + 1
        problem = f"{where}, line {line}: not valid YAML: character #x{exc.character:04x} is not allowed"
        raise ConfigError([problem]) from None
    try:
        root = loader.get_single_node()
        problems = [] if root is None else loader.check_tree(root)
        if problems:
            raise ConfigError(problems)
        return None if root is None else loader.construct_document(root)
    except yaml.YAMLError as exc:
        raise ConfigError([_yaml_problem(exc, where)]) from None
    finally:
        loader.dispose()


def _yaml_problem(exc: yaml.YAMLError, where: str) -> str:
    mark = getattr(exc, "problem_mark", None)
    if not isinstance(exc, yaml.MarkedYAMLError) or mark is None:
        return f"{where}: not valid YAML: {exc}"
    context = ""
    if exc.context and exc.context_mark is not None:
        context = f" ({exc.context} that starts on line {exc.context_mark.line + 1})"
    return (f"{where}, line {mark.line + 1}, column {mark.column + 1}: not valid YAML: "
            f"{exc.problem or exc.context}{context}")


def _unreadable(node: yaml.Node, exc: Exception) -> str:
    if node.tag == _INT_TAG and len(node.value) > sys.get_int_max_str_digits():
        return f"an integer of {len(node.value)} digits is more than any setting takes"
    return f"cannot read {show(node.value)} as {node.tag.rsplit(':', 1)[-1]}: {exc}"


def parse_config(raw: object) -> Config:
    if not isinstance(raw, dict):
        raise ConfigError([f"(top level): must be a mapping of keys, got {show(raw)}"])
    if "models" not in raw:
        raise ConfigError(["models: required key is missing (a mapping of model name to its engine)"])
    if "image_models" in raw:
        raise ConfigError(["image_models: unknown key (an image model goes under models, with runtime: comfyui)"])
    if "remote_models" in raw:
        raise ConfigError(["remote_models: unknown key (a remote model goes under models, with runtime: remote)"])
    raw, images = _split_models(raw, IMAGE_RUNTIME)
    raw, remotes = _split_models(raw, REMOTE_RUNTIME)
    problems = []
    try:
        config = converter.structure(raw, Config)
    except ClassValidationError as exc:
        problems = _describe(exc, "")
    image_models, image_problems = _structure_models(images, ImageModelConfig)
    remote_models, remote_problems = _structure_models(remotes, RemoteModelConfig)
    problems += image_problems + remote_problems
    if problems:
        raise ConfigError(problems)
    config = attrs.evolve(config, image_models=image_models, remote_models=remote_models)
    problems = check_semantics(config)
    if problems:
        raise ConfigError(problems)
    return config


def _split_models(raw: dict[str, Any], runtime: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The config without its models of *runtime*, and those: image models (workflows) and remote
    models (cloud APIs) are not engines, and have a schema of their own."""
    models = raw["models"]
    if not isinstance(models, dict):
        return raw, {}
    split = {name: entry for name, entry in models.items() if isinstance(entry, dict) and entry.get("runtime") == runtime}
    return {**raw, "models": {name: entry for name, entry in models.items() if name not in split}}, split


def _structure_models(entries: dict[str, Any], kind: type[_Model]) -> tuple[dict[str, _Model], list[str]]:
    models, problems = {}, []
    for name, entry in entries.items():
        try:
            models[name] = converter.structure(entry, kind)
        except ClassValidationError as exc:
            problems += _describe(exc, f"models.{name}")
    return models, problems


def _describe(exc: BaseException, path: str) -> list[str]:
    """Flatten cattrs' nested exception groups into `key.path: what is wrong` lines."""
    if isinstance(exc, ClassValidationError | IterableValidationError):
        with_notes, without_notes = exc.group_exceptions()
        lines = [line for sub in without_notes for line in _describe(sub, path)]
        for sub, note in with_notes:
            name = getattr(note, "name", None)
            index = getattr(note, "index", None)
            if name is not None:
                child = f"{path}.{name}" if path else str(name)
            else:
                child = f"{path}[{show(index)}]" if not isinstance(index, str) else (
                    f"{path}.{_key_text(index)}" if path else _key_text(index))
            lines.extend(_describe(sub, child))
        return lines
    if isinstance(exc, ForbiddenExtraKeysError):
        prefix = f"{path}." if path else ""
        return [f"{prefix}{key}: unknown key" for key in sorted(map(_key_text, exc.extra_fields))]
    if isinstance(exc, KeyError):
        return [f"{path}: required key is missing"]
    if isinstance(exc, ValueError) and str(exc).startswith("must"):
        return [f"{path}: {exc}"]
    return [f"{path}: invalid value ({exc})"]


def _key_text(key: object) -> str:
    """A key as a key path shows it: the empty one as '' (so that it is seen, not taken for its parent)."""
    return key if isinstance(key, str) and key else show(key)
