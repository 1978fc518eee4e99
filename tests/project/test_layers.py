"""Imports flow one way: store <- pipeline <- training <- report <- experiments and the CLI's root; and no
module imports itself back through others (no import cycle).

Every import of every module counts, function-level ones included: a lazy import is
still a dependency. The table below is the whole rule; docs/reference.md, "Code layout", explains it.
"""

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("store", "pipeline", "training", "tokweight")  # folders; the first three install as tokweight.<folder>
LAYERS = {"store": 0, "pipeline": 1, "training": 2, "report": 3}  # report: the folder tokweight/report/
TOP = 4  # the rest of tokweight/: the CLI and its command modules, the demo, the experiments


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join(parts if parts[0] == "tokweight" else ("tokweight", *parts))


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS[parts[1]] if len(parts) > 1 and parts[1] in LAYERS else TOP


def project_imports(path: Path) -> list[tuple[str, int]]:
    """(imported project module, line) for every absolute import of a project package."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found += [(name, node.lineno) for name in names if name.split(".")[0] in ("tokweight", *LAYERS)]
    return found


def upward_imports() -> list[str]:
    arrows = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            here = module_name(path)
            for target, line in project_imports(path):
                if layer(target) > layer(here):
                    arrows.append(f"{path.relative_to(ROOT)}:{line} ({here}, layer {layer(here)}) imports "
                                  f"{target} (layer {layer(target)})")
    return arrows


def test_no_module_imports_a_higher_layer():
    arrows = upward_imports()
    assert not arrows, "imports against the layers:\n" + "\n".join(arrows)


def test_the_rule_sees_function_level_imports(tmp_path, monkeypatch):
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "x.py").write_text("def f():\n    from tokweight.training.loop.train import run\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert upward_imports() == ["store/x.py:2 (tokweight.store.x, layer 0) imports tokweight.training.loop.train (layer 2)"]


def test_every_project_import_names_the_tokweight_package():
    """A bare ``import store`` works only from the repository root; installed, it is an ImportError."""
    bare = [f"{path.relative_to(ROOT)}:{line} imports {target}"
            for folder in (*PACKAGES, "tests", "scripts") for path in sorted((ROOT / folder).rglob("*.py"))
            for target, line in project_imports(path) if target.split(".")[0] != "tokweight"]
    in_strings = re.compile(r"(?:from|import|-m) (?:pipeline|store|training)\.\w")  # code run in a subprocess
    bare += [f"{path.relative_to(ROOT)}: {match.group(0)!r} in a string"
             for folder in (*PACKAGES, "tests", "scripts") for path in sorted((ROOT / folder).rglob("*.py"))
             for match in in_strings.finditer(path.read_text())]
    assert not bare, "imports outside the tokweight package:\n" + "\n".join(bare)


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports, at module or function level; ``from package import name``
    is an import of the module ``package.name`` where there is one, else of ``package``. An import under
    ``if TYPE_CHECKING:`` runs only in a type checker and closes no cycle."""
    paths = {module_name(path): path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}
    graph = {}
    for module, path in paths.items():
        targets = set()
        tree = ast.parse(path.read_text(), str(path))
        typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                       and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
                       for n in ast.walk(block)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in paths else node.module
                            for alias in node.names}
        graph[module] = targets & paths.keys()
    return graph


def import_cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected groups of modules: each module of a group reaches every other by imports."""
    reach = {}
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            module = todo.pop()
            if module not in seen:
                seen.add(module)
                todo += graph[module]
        reach[start] = seen
    return {frozenset(m for m in reach[start] if start in reach[m]) for start in graph if start in reach[start]}


def test_no_import_cycle_anywhere_in_the_package():
    cycles = import_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(sorted(", ".join(sorted(c)) for c in cycles))


def test_a_function_level_import_closes_a_cycle(tmp_path, monkeypatch):
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "a.py").write_text("from tokweight.store import b\n")
    (tmp_path / "store" / "b.py").write_text("def f():\n    from tokweight.store.a import g\n")
    (tmp_path / "store" / "c.py").write_text("import tokweight.store.a\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    graph = import_graph()
    assert graph["tokweight.store.c"] == {"tokweight.store.a"}
    assert import_cycles(graph) == {frozenset({"tokweight.store.a", "tokweight.store.b"})}
