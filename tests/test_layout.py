"""The layout shows the architecture: the service in supervisor/, its developer tools in supervisor/tools/.

The tools (demo, load tests, the simulator, calibrate, chaos) run steward on the fakes;
the service itself never needs them: nothing in supervisor/ outside supervisor/tools/
imports ``fakes``, and nothing there but the command line (which runs the tools'
commands) imports the tools.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import ROOT

SERVICE = ROOT / "supervisor"
TOOLS = SERVICE / "tools"
COMMAND_LINE = {SERVICE / "cli.py"}


def imported_modules(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for each import in *path*, at any depth (a function's lazy imports too)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            yield node.lineno, node.module
            if node.module == "supervisor":  # from supervisor import tools
                for alias in node.names:
                    yield node.lineno, f"supervisor.{alias.name}"


def service_files() -> list[Path]:
    return sorted(path for path in SERVICE.rglob("*.py") if not path.is_relative_to(TOOLS))


def is_within(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def test_the_tree_is_walked() -> None:
    files = service_files()
    assert SERVICE / "engines" / "probes.py" in files and SERVICE / "gateway" / "openai" / "app.py" in files
    assert not any(path.is_relative_to(TOOLS) for path in files)
    assert (TOOLS / "demo.py").exists() and (TOOLS / "simulate" / "scenario.py").exists()


def test_only_the_tools_import_the_fakes() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}: {module}" for path in service_files()
             for line, module in imported_modules(path) if is_within(module, "fakes")]
    assert found == [], "the service imports the fakes (only supervisor/tools/ may):\n" + "\n".join(found)


def test_the_service_does_not_import_its_tools() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}: {module}" for path in service_files() if path not in COMMAND_LINE
             for line, module in imported_modules(path) if is_within(module, "supervisor.tools")]
    assert found == [], "the service imports its developer tools:\n" + "\n".join(found)


def test_the_checks_see_an_import_of_the_fakes(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import os\n\ndef f():\n    from fakes import simgpu\n    import fakes.webhook\n")
    assert [m for _, m in imported_modules(sample) if is_within(m, "fakes")] == ["fakes", "fakes.webhook"]


MODULE_LINES = 700  # a module longer than this holds more than one role (issue 28)


def test_no_module_holds_more_than_one_role_s_worth_of_lines() -> None:
    long = [f"{path.relative_to(ROOT)}: {lines} lines" for path in sorted([*SERVICE.rglob("*.py"),
                                                                           *(ROOT / "adapters").rglob("*.py")])
            if (lines := len(path.read_text().splitlines())) > MODULE_LINES]
    assert long == [], f"split these by role (at most {MODULE_LINES} lines a module):\n" + "\n".join(long)
