"""Imports flow one way: store <- pipeline <- training <- experiments and the CLI's root.

Every import of every module counts, function-level ones included: a lazy import is
still a dependency. The table below is the whole rule; README "Code layout" explains it.
"""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("store", "pipeline", "training", "tokweight")  # folders; the first three install as tokweight.<folder>
LAYERS = {"store": 0, "pipeline": 1, "training": 2}
TOP = 3  # the only modules that may import everything
TOP_MODULES = ("tokweight.cli", "tokweight.training.demo", "tokweight.training.experiment_cli",
               "tokweight.training.experiments")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join(parts if parts[0] == "tokweight" else ("tokweight", *parts))


def layer(module: str) -> int:
    if any(module == top or module.startswith(top + ".") for top in TOP_MODULES):
        return TOP
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
    (tmp_path / "store" / "x.py").write_text("def f():\n    from tokweight.training.train import run\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert upward_imports() == ["store/x.py:2 (tokweight.store.x, layer 0) imports tokweight.training.train (layer 2)"]


def test_every_project_import_names_the_tokweight_package():
    """A bare ``import store`` works only from the repository root; installed, it is an ImportError."""
    bare = [f"{path.relative_to(ROOT)}:{line} imports {target}"
            for folder in (*PACKAGES, "tests", "scripts") for path in sorted((ROOT / folder).rglob("*.py"))
            for target, line in project_imports(path) if target.split(".")[0] != "tokweight"]
    assert not bare, "imports outside the tokweight package:\n" + "\n".join(bare)
