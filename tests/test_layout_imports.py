"""The layout's dependency rules, read from the source with ``ast`` (nothing is imported).

- ``adapters/`` holds the Runtimes, one module per runtime. The service (``supervisor/``) may
  import them; they import only the small leaf modules of ``ADAPTERS_MAY_IMPORT``, and nothing
  those import, at any depth, imports the adapters back or the service's core (no cycle).
- ``supervisor/config/`` reads and checks the config file: it imports none of the services it
  configures (nodes, scheduler, engines, adapters). ``supervisor/config_policy.py`` is the step
  from the config to those services, so it is the one config module outside that rule.

Every import counts, a function's lazy one included, and so does each package's ``__init__``
on the way to a module (importing ``a.b.c`` runs ``a`` and ``a.b`` first).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# What a runtime may import from the service, and why each is a leaf:
ADAPTERS_MAY_IMPORT = {
    "supervisor.apis",  # the APIs a runtime serves: an enum
    "supervisor.observe.events",  # EventLog, through which a runtime reports (an unload, a load it measured)
    "supervisor.config.schema",  # the runtime's own config section: attrs classes and typed values
    "supervisor.accounting",  # llama.cpp's memory and threads, from GGUF headers and its logs: pure
}
# What no module an adapter imports may reach, at any depth: the adapters themselves (a cycle),
# and the service's core, which drives the runtimes.
CORE = ("adapters", "supervisor.scheduler", "supervisor.nodes", "supervisor.engines.driver", "supervisor.tree",
        "supervisor.config_policy")
# What the config must not reach, at any depth: what it configures.
CONFIGURED = ("adapters", "supervisor.nodes", "supervisor.scheduler", "supervisor.engines.driver", "supervisor.tree")


def _within(module: str, prefixes: tuple[str, ...] | set[str]) -> bool:
    return any(module == prefix or module.startswith(f"{prefix}.") for prefix in prefixes)


def _path(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def imports_of(module: str) -> frozenset[str]:
    """The project's modules *module* imports (``supervisor.*``, ``adapters.*``), lazy ones too."""
    path = _path(module)
    if path is None:
        return frozenset()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from a.b import c` imports the module a.b.c where there is one, else a name of a.b.
            found.update(f"{base}.{alias.name}" if _path(f"{base}.{alias.name}") else base for alias in node.names)
    return frozenset(name for name in found if _within(name, ("supervisor", "adapters")))


def _with_packages(module: str) -> list[str]:
    """*module* and the packages whose ``__init__`` importing it runs."""
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def reached(start: str) -> dict[str, str]:
    """Every project module importing *start* runs, each mapped to a module that imports it."""
    by: dict[str, str] = {}
    todo = [start]
    while todo:
        module = todo.pop()
        for name in {*_with_packages(module)[:-1], *imports_of(module)}:
            for step in _with_packages(name):
                if step not in by and step != start:
                    by[step] = module
                    todo.append(step)
    return by


def _chain(by: dict[str, str], start: str, end: str) -> str:
    steps = [end]
    while steps[-1] != start and steps[-1] in by:
        steps.append(by[steps[-1]])
    return " <- ".join(steps)


def _modules(folder: str) -> list[str]:
    return sorted(_module_of(path) for path in (ROOT / folder).rglob("*.py"))


def test_the_rules_read_real_modules() -> None:
    assert {"adapters.base", "adapters.llama_server", "adapters.ollama", "adapters.openai"} <= set(_modules("adapters"))
    assert {"supervisor.config.schema", "supervisor.config.loading"} <= set(_modules("supervisor/config"))
    assert "supervisor.config.schema" in imports_of("adapters.llama_server")
    assert "supervisor.nodes.spec" in imports_of("supervisor.config_policy")  # the ast reading sees imports
    assert "supervisor.config" in reached("supervisor.config.schema")  # and the packages on the way


def test_adapters_import_only_leaf_modules_of_the_service() -> None:
    outside = {f"{module} imports {name}" for module in _modules("adapters") for name in imports_of(module)
               if _within(name, ("supervisor",)) and not _within(name, ADAPTERS_MAY_IMPORT)}
    assert not outside, f"adapters/ may import only {sorted(ADAPTERS_MAY_IMPORT)} of supervisor/: {sorted(outside)}"


def test_what_adapters_import_never_leads_back_to_them_or_to_the_core() -> None:
    problems = []
    for leaf in sorted(ADAPTERS_MAY_IMPORT):
        by = reached(leaf)
        problems += [_chain(by, leaf, module) for module in sorted(by) if _within(module, CORE)]
    assert not problems, f"a leaf module adapters/ imports reaches the core: {problems}"


def test_only_runtimes_are_in_adapters() -> None:
    """One module per runtime (each defines its NameRuntime class), beside the package and the protocol (base)."""
    others = []
    for module in _modules("adapters"):
        tree = ast.parse(_path(module).read_text(encoding="utf-8"))  # type: ignore[union-attr]
        classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
        if module not in ("adapters", "adapters.base") and not any(name.endswith("Runtime") for name in classes):
            others.append(module)
    assert not others, f"adapters/ holds runtimes only; these define none: {others}"


def test_the_config_imports_nothing_it_configures() -> None:
    problems = []
    for module in _modules("supervisor/config"):
        by = reached(module)
        problems += [_chain(by, module, name) for name in sorted(by) if _within(name, CONFIGURED)]
    assert not problems, f"supervisor/config/ reaches what it configures: {problems}"
