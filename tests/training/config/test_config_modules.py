"""Config modules import no implementation: a command's --help, a config file's check and the config reference
build configs without loading torch, numpy or pyarrow.

The rule, by name: a config module is a module of the package (store/, pipeline/, training/, tokweight/, at any
depth) in a folder named ``config`` (training/config/), or named ``config.py``, ``config_*.py`` or ``*_config.py``
(pipeline/config_build.py, the builder, among them). Every import it makes, function-level ones included, is of the standard library, another config
module, or a name-only module: a module of the package whose module-level imports are all of the standard library
(pipeline/models/dtypes.py: names, and a function that imports torch when it is called). And imported in a fresh
interpreter, each leaves torch, numpy and pyarrow out of ``sys.modules``.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.project.test_layers import PACKAGES, ROOT, module_name

CONFIG_NAMES = ("config.py", "config_*.py", "*_config.py")
HEAVY = ("torch", "numpy", "pyarrow")


def is_config_module(path: Path) -> bool:
    return path.parent.name == "config" or any(fnmatch.fnmatch(path.name, pattern) for pattern in CONFIG_NAMES)


def package_modules(root: Path = ROOT) -> dict[str, Path]:
    return {module_name_at(path, root): path for package in PACKAGES for path in sorted((root / package).rglob("*.py"))}


def module_name_at(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join(parts if parts[0] == "tokweight" else ("tokweight", *parts))


def imports(path: Path, module_level: bool = False) -> list[tuple[str, int]]:
    """(imported module, line) of every absolute import in ``path`` (only the module body's with ``module_level``);
    ``from package import name`` names ``package.name``, which ``allowed`` reads as the module where there is one."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if module_level else ast.walk(tree)
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
    return found


def is_stdlib(name: str) -> bool:
    return name.split(".")[0] in sys.stdlib_module_names or name.startswith("__future__")


def project_module(name: str, modules: dict[str, Path]) -> str | None:
    """The package module an imported name is (``a.b.c`` or, for ``from a.b import c``, ``a.b``); None outside it."""
    for candidate in (name, name.rpartition(".")[0]):
        if candidate in modules:
            return candidate
    return None


def name_only(path: Path) -> bool:
    return all(is_stdlib(name) for name, _ in imports(path, module_level=True))


def bad_imports(root: Path = ROOT) -> list[str]:
    """Every import of a config module that is not of the standard library, a config module or a name-only module."""
    modules = package_modules(root)
    bad = []
    for module, path in modules.items():
        if not is_config_module(path):
            continue
        for name, line in imports(path):
            if is_stdlib(name):
                continue
            target = project_module(name, modules)
            if target is None or not (is_config_module(modules[target]) or name_only(modules[target])):
                bad.append(f"{path.relative_to(root)}:{line} ({module}) imports {name}")
    return bad


def test_the_rule_names_every_config_module_by_its_file_name():
    config = [path.relative_to(ROOT).as_posix() for path in package_modules().values() if is_config_module(path)]
    assert {"training/config/components.py", "training/config/train.py", "training/config/migrations.py",
            "pipeline/config_build.py", "tokweight/config_files.py"} <= set(config)
    for name in ("pipeline/extract/config.py", "pipeline/data/config.py", "training/config/use.py",
                 "training/config/base.py", "training/config/plan.py", "pipeline/config_build.py", "store/sql_config.py"):
        assert is_config_module(Path(name)), name
    assert not any(is_config_module(Path(name)) for name in ("training/reconfigure.py", "training/loop/train.py",
                                                             "training/configurations.py"))


def test_config_modules_import_only_the_standard_library_and_other_config_or_name_only_modules():
    bad = bad_imports()
    assert not bad, "config modules importing an implementation:\n" + "\n".join(bad)


def test_the_rule_sees_an_implementation_import_at_any_level(tmp_path):
    (tmp_path / "training").mkdir()
    (tmp_path / "training" / "names.py").write_text("import json\n\ndef f():\n    import torch\n")
    (tmp_path / "training" / "impl.py").write_text("import torch\n")
    (tmp_path / "training" / "good_config.py").write_text(
        "import json\nfrom tokweight.training import names\nfrom tokweight.training.config.components import X\n")
    (tmp_path / "training" / "config").mkdir()
    (tmp_path / "training" / "config" / "components.py").write_text("X = 1\n")
    (tmp_path / "training" / "bad_config.py").write_text("def f():\n    from tokweight.training.impl import g\n")
    (tmp_path / "training" / "config_heavy.py").write_text("import numpy\n")
    assert sorted(bad_imports(tmp_path)) == [
        "training/bad_config.py:2 (tokweight.training.bad_config) imports tokweight.training.impl.g",
        "training/config_heavy.py:1 (tokweight.training.config_heavy) imports numpy"]


CONFIG_MODULES = sorted(module for module, path in package_modules().items() if is_config_module(path))


@pytest.mark.parametrize("module", CONFIG_MODULES)
def test_a_config_module_imported_alone_leaves_torch_numpy_and_pyarrow_out(module):
    code = f"import importlib, json, sys; importlib.import_module({module!r}); " \
           f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert json.loads(loaded.stdout.splitlines()[-1]) == [], module


def test_module_names_match_the_layer_tests():
    path = ROOT / "training" / "config" / "components.py"
    assert module_name_at(path, ROOT) == module_name(path) == "tokweight.training.config.components"
