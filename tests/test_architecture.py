"""The house of docs/architecture.md holds: every module of gptcore is in its import table and imports only what its
row allows, every room imports only the rooms its row allows, the parts marked torch-free import no torch, the top
of gptcore holds at most 8 modules besides its rooms, and no module is over 400 lines."""

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
MAX_LINES = 400
MAX_TOP = 8


def _table(header: str) -> list[list[str]]:
    """The rows of the doc's table whose first header cell is ``header`` (escaped underscores undone)."""
    section = DOC.read_text().split("## Who may import whom", 1)[1].split("\n## ", 1)[0]
    rows, inside = [], False
    for line in section.splitlines():
        cells = [c.strip().replace("\\_", "_") for c in line.strip().strip("|").split("|")]
        if not line.startswith("|"):
            inside = False
        elif cells[0] == header:
            inside = True
        elif inside and not set(cells[0]) <= set("-"):
            rows.append(cells)
    return rows


def _parts(cell: str) -> set[str]:
    return set() if cell == "—" else {p.strip() for p in cell.split(",")}


def allowed_imports() -> dict[str, tuple[set[str], bool]]:
    """module -> (the parts it may import, whether it may import torch), from the doc's module table."""
    return {cells[0]: (_parts(cells[1]), cells[2] == "yes") for cells in _table("module")}


def allowed_rooms() -> dict[str, set[str]]:
    """room -> the rooms it may import besides itself, from the doc's room table."""
    return {cells[0]: _parts(cells[1]) for cells in _table("room")}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def room(part: str) -> str:
    """A part's room: its subpackage, or the top-level module itself."""
    return part.split(".")[0]


def _is_module(parts: list[str], package: Path) -> bool:
    base = package.joinpath(*parts)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imported_parts(path: Path, name: str | None = None, package: Path = PACKAGE) -> set[str]:
    """The gptcore parts ``path`` (module ``name`` of gptcore) imports, at module level or inside functions, by
    their table names: ``from gptcore.gate import rules`` and ``from gptcore.gate.rules import judge`` are both
    ``gate.rules``."""
    name = name or module_name(path)
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    if name in ("__init__", "__main__"):
        here = []
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative: ruff forbids it, but the table still counts it
                base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                target = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == "gptcore":
                target = node.module.split(".")[1:]
            else:
                continue
            for alias in node.names:
                below = target + [alias.name]
                found.add(".".join(below) if _is_module(below, package) or not target else ".".join(target))
        elif isinstance(node, ast.Import):
            found.update(".".join(a.name.split(".")[1:]) for a in node.names if a.name.split(".")[0] == "gptcore")
    return {f for f in found if f and f != name}


def imports_torch_when_loaded(path: Path) -> bool:
    """Whether the module imports torch at its top level (imports inside functions run only when called)."""
    return bool(re.search(r"^(import torch|from torch)", path.read_text(), re.M))


MODULES = sorted(p for p in PACKAGE.rglob("*.py"))


def test_every_module_is_in_the_table():
    assert {module_name(p) for p in MODULES} == set(allowed_imports())


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_module_imports_only_what_the_table_allows(path):
    parts, torch_ok = allowed_imports()[module_name(path)]
    forbidden = imported_parts(path) - parts
    allowed = sorted(parts)
    assert not forbidden, f"{module_name(path)} imports {sorted(forbidden)}; docs/architecture.md allows {allowed}"
    if not torch_ok:
        assert not imports_torch_when_loaded(path), f"{module_name(path)} imports torch; the table says it must not"


def test_every_room_imports_only_the_rooms_its_row_allows():
    rooms = allowed_rooms()
    assert {room(module_name(p)) for p in MODULES} == set(rooms)
    crossing = set()
    for path in MODULES:
        mine = room(module_name(path))
        for part in imported_parts(path):
            if _is_module(part.split("."), PACKAGE) and room(part) not in rooms[mine] | {mine}:
                crossing.add(f"{module_name(path)} -> {part}")
    assert not crossing, f"imports across rooms that docs/architecture.md does not allow: {sorted(crossing)}"


def test_the_top_of_gptcore_holds_at_most_8_modules_and_no_module_is_over_400_lines():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP, top
    long = {module_name(p): n for p in MODULES if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_the_import_check_catches_a_forbidden_import(tmp_path):
    # planted in a copy, never in gptcore: config importing the trainer (and so torch) is what the layering forbids
    copy = PACKAGE / "config" / "recipe.py"
    planted = tmp_path / "recipe.py"
    planted.write_text(copy.read_text() + "\nfrom gptcore.training.trainer import Trainer\n")
    assert imported_parts(copy) - allowed_imports()["config.recipe"][0] == set()
    assert imported_parts(planted, "config.recipe") - allowed_imports()["config.recipe"][0] == {"training.trainer"}


def test_the_room_check_catches_a_room_reaching_up(tmp_path):
    # planted in a copy: the measure room importing the gate's rules (a room above it) crosses the room table
    planted = tmp_path / "runner.py"
    planted.write_text((PACKAGE / "measure" / "runner.py").read_text() + "\nfrom gptcore.gate.rules import judge\n")
    parts = imported_parts(planted, "measure.runner")
    assert "gate.rules" in parts and room("gate.rules") not in allowed_rooms()["measure"]


def test_the_import_check_sees_every_form_of_import(tmp_path):
    # planted in a copy: each way of naming a part is one import of it
    planted = tmp_path / "session.py"
    planted.write_text(
        "from gptcore import identity, units as u\nfrom gptcore.gate.rules import judge\n"
        "from gptcore.gate import verdicts\nfrom . import schema\nimport gptcore.measure.work\n"
        "def f():\n    from gptcore import config\n"
    )
    assert imported_parts(planted, "gate.session") == {
        "identity",
        "units",
        "gate.rules",
        "gate.verdicts",
        "gate.schema",
        "measure.work",
        "config",
    }


def test_torch_free_modules_load_without_torch():
    torch_free = [m for m, (_, torch_ok) in allowed_imports().items() if not torch_ok and m not in ("__main__",)]
    names = ["gptcore" if m == "__init__" else f"gptcore.{m}" for m in torch_free]
    code = f"import importlib, sys\nfor n in {names!r}:\n    importlib.import_module(n)\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
