"""The layering of docs/architecture.md holds: no module of gptcore imports a part the table does not allow, every
module is in the table, and the parts marked torch-free import no torch."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gptcore"
DOC = ROOT / "docs" / "architecture.md"


def allowed_imports() -> dict[str, tuple[set[str], bool]]:
    """module -> (the parts it may import, whether it may import torch), from the doc's table."""
    table = DOC.read_text().split("## Who may import whom", 1)[1].split("\n## ", 1)[0]
    rules = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("module", "") or set(cells[0]) <= set("-"):
            continue
        module = cells[0].replace("\\_", "_")
        parts = set() if cells[1] == "—" else {p.strip() for p in cells[1].split(",")}
        rules[module] = (parts, cells[2] == "yes")
    return rules


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def imported_parts(path: Path, name: str | None = None) -> set[str]:
    """The gptcore parts ``path`` (module ``name`` of gptcore) imports, at module level or inside functions, by
    their table names."""
    name = name or module_name(path)
    package = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".")
    if name in ("__init__", "__main__"):
        package = []
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                target = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == "gptcore":
                target = node.module.split(".")[1:]
            else:
                continue
            if node.module is None or not target:  # from . import x, from gptcore import x
                found.update(".".join(target + [alias.name]) for alias in node.names)
            else:
                found.add(".".join(target))
        elif isinstance(node, ast.Import):
            found.update(".".join(a.name.split(".")[1:]) for a in node.names if a.name.split(".")[0] == "gptcore")
    return {f for f in found if f}


def imports_torch_when_loaded(path: Path) -> bool:
    """Whether the module imports torch at its top level (imports inside functions run only when called)."""
    return bool(re.search(r"^(import torch|from torch)", path.read_text(), re.M))


MODULES = sorted(p for p in PACKAGE.rglob("*.py"))


def test_every_module_is_in_the_table():
    rules = allowed_imports()
    assert {module_name(p) for p in MODULES} == set(rules)


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_module_imports_only_what_the_table_allows(path):
    parts, torch_ok = allowed_imports()[module_name(path)]
    forbidden = imported_parts(path) - parts
    assert not forbidden, (
        f"{module_name(path)} imports {sorted(forbidden)}; docs/architecture.md allows {sorted(parts)}"
    )
    if not torch_ok:
        assert not imports_torch_when_loaded(path), f"{module_name(path)} imports torch; the table says it must not"


def test_the_import_check_catches_a_forbidden_import(tmp_path):
    # planted in a copy, never in gptcore: config importing data (and so torch) is what the layering forbids
    copy = PACKAGE / "config.py"
    planted = tmp_path / "config.py"
    planted.write_text(copy.read_text() + "\nfrom .data import CORPORA\n")
    assert imported_parts(copy) - allowed_imports()["config"][0] == set()
    assert imported_parts(planted, "config") - allowed_imports()["config"][0] == {"data"}


def test_the_import_check_sees_every_form_of_import(tmp_path):
    # planted in a copy: each way of naming a part is one import of it
    planted = tmp_path / "gate.py"
    planted.write_text(
        "from gptcore import identity, units as u\nfrom gptcore.gate.rules import judge\n"
        "from . import verdicts\nimport gptcore.measure.work\n"
        "def f():\n    from gptcore import config\n"
    )
    assert imported_parts(planted, "gate") == {"identity", "units", "rules", "verdicts", "work", "config"}


def test_torch_free_modules_load_without_torch():
    torch_free = [m for m, (_, torch_ok) in allowed_imports().items() if not torch_ok and m not in ("__main__",)]
    names = ["gptcore" if m == "__init__" else f"gptcore.{m}" for m in torch_free]
    code = f"import importlib, sys\nfor n in {names!r}:\n    importlib.import_module(n)\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
