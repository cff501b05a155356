"""The house's layers: every import in specgen/ (lazy ones inside functions too) points down, and
only specgen/llama/ imports llama_cpp. A new arrow up fails here, naming the file and the import."""

from __future__ import annotations

import ast
from pathlib import Path

import specgen

# Bottom first. A package may import its own modules and anything on a lower floor; the floor of
# small shared modules (errors, host, files, report) may import within itself.
FLOORS = (
    {"__init__", "errors", "host", "files", "reporter", "__version__"},
    {"core"},
    {"costs"},
    {"llama"},
    {"models"},
    {"drafting"},
    {"app"},
    {"serve", "bench"},
    {"cli"},
    {"__main__"},
)
FLOOR = {room: i for i, rooms in enumerate(FLOORS) for room in rooms}
ROOT = Path(specgen.__file__).parent


def room_of(path: Path) -> str:
    parts = path.relative_to(ROOT).parts
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported top-level module or specgen room) of every import in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "specgen":
                found += [(node.lineno, f"specgen.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, node.module))
    return found


def test_every_import_points_down_a_floor():
    ups = []
    for path in sorted(ROOT.rglob("*.py")):
        room = room_of(path)
        assert room in FLOOR, f"{path.relative_to(ROOT)}: {room!r} is on no floor of FLOORS: add it"
        for line, module in imports(path):
            parts = module.split(".")
            if parts[0] != "specgen" or len(parts) < 2 or parts[1] == room:
                continue
            target = parts[1]
            assert target in FLOOR, f"{path.relative_to(ROOT)}:{line}: specgen.{target} is on no floor"
            same_base = FLOOR[room] == FLOOR[target] == 0
            if FLOOR[target] >= FLOOR[room] and not same_base:
                ups.append(f"{path.relative_to(ROOT)}:{line} ({room}) imports {module} ({target}, not below)")
    assert not ups, "imports that point up or across:\n" + "\n".join(ups)


def test_only_the_llama_package_imports_llama_cpp():
    outside = [f"{path.relative_to(ROOT)}:{line}" for path in sorted(ROOT.rglob("*.py")) if room_of(path) != "llama"
               for line, module in imports(path) if module.split(".")[0] == "llama_cpp"]
    assert not outside, f"llama_cpp imported outside specgen/llama/: {outside}"


def test_the_check_sees_an_arrow_up(tmp_path):
    """The walk reads lazy imports inside functions too (the kind that slips by)."""
    probe = tmp_path / "probe.py"
    probe.write_text("import os\n\ndef f():\n    from specgen.app import session\n    from specgen import host\n")
    assert imports(probe) == [(1, "os"), (4, "specgen.app"), (5, "specgen.host")]


def test_every_specgen_import_names_a_module_that_exists():
    """Lazy imports inside functions fail only when run: a module moved or renamed leaves them behind."""
    import importlib.util

    root = ROOT.parent
    missing = []
    for path in sorted([*ROOT.rglob("*.py"), *(root / "scripts").glob("*.py"), *(root / "tests").glob("*.py")]):
        for line, module in imports(path):
            parent, _, name = module.rpartition(".")
            if module.split(".")[0] == "specgen" and importlib.util.find_spec(module) is None \
                    and not (parent == "specgen" and hasattr(specgen, name)):  # from specgen import __version__
                missing.append(f"{path.relative_to(root)}:{line} imports {module}")
    assert not missing, "imports of modules that do not exist:\n" + "\n".join(missing)


MAX_LINES = 400  # the house's rule: a module a reader can hold


def test_no_module_is_over_the_line_limit():
    long = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}, f"modules over {MAX_LINES} lines: {long}"
