"""Every third-party module the installed packages import comes from ``dependencies``.

The test extras (``[dev,hf,lora]``) are installed wherever tests run, so an import that only
an extra satisfies passes every test and still crashes a user's plain ``pip install .``
(scipy in the Hungarian matching once did, at the demo's first validation). This reads
the imports of every module, function-level ones included, instead of importing them.
"""

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "store", "training", "tokweight")  # folders of the installed package
# Imports an extra may satisfy: only inside a function, so that the commands that do
# not need them import without them.
OPTIONAL = {"transformers": "hf", "tokenizers": "hf", "peft": "lora", "tensorboard": "tensorboard", "mlflow": "mlflow",
            "wandb": "wandb"}


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def requirement_name(spec: str) -> str:
    return re.split(r"[<>=!~ \[;]", spec, maxsplit=1)[0].strip().lower().replace("_", "-")


def imports(path: Path) -> list[tuple[str, bool]]:
    """(top-level module, imported at module level) for every absolute import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name.split(".")[0], id(node) in top_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module.split(".")[0], id(node) in top_level))
    return found


def third_party_imports() -> dict[str, list[tuple[str, bool]]]:
    """module name -> [(file, at module level)] over every installed package's files."""
    local = {"tokweight"}
    out: dict[str, list] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name, top in imports(path):
                if name not in sys.stdlib_module_names and name not in local:
                    out.setdefault(name, []).append((str(path.relative_to(ROOT)), top))
    return out


def distribution(module: str) -> str:
    dists = importlib.metadata.packages_distributions().get(module)
    assert dists, f"{module} is imported but no installed distribution provides it"
    return dists[0].lower().replace("_", "-")


def test_every_runtime_import_is_a_dependency():
    required = {requirement_name(spec) for spec in project()["dependencies"]}
    missing = {m: files for m, files in third_party_imports().items()
               if m not in OPTIONAL and distribution(m) not in required}
    assert not missing, f"imported but only an extra (or nothing) installs them: {missing}"


def test_optional_imports_are_inside_functions_and_in_their_extra():
    extras = project()["optional-dependencies"]
    for module, extra in OPTIONAL.items():
        assert distribution(module) in {requirement_name(s) for s in extras[extra]}, (module, extra)
        at_top = [f for f, top in third_party_imports().get(module, []) if top]
        assert not at_top, f"{module} (extra [{extra}]) imported at module level in {at_top}"


def test_the_scan_sees_function_level_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import os\n\ndef f():\n    from scipy.optimize import linear_sum_assignment\n")
    assert imports(source) == [("os", True), ("scipy", False)]
