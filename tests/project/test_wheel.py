"""The wheel users install holds every module of the tree, under the one top-level package tokweight.

An editable install reads the tree itself and so hides a module the wheel leaves out; this builds
the wheel from a copy of the sources (no build isolation: setuptools from the [dev] extra) and
compares its file list with the folders it maps.
"""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "tokweight", "pipeline", "store", "training")
LAYERS = ("pipeline", "store", "training")


def tree_files() -> set[str]:
    """The installed paths the tree's modules and package data (SQL, presets) should have."""
    wanted = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tokweight").rglob("*.py")}
    wanted |= {p.relative_to(ROOT).as_posix() for p in (ROOT / "tokweight" / "presets").rglob("*.toml")}
    for layer in LAYERS:
        for p in (ROOT / layer).rglob("*"):
            if p.suffix in (".py", ".sql") and "__pycache__" not in p.parts:
                wanted.add(f"tokweight/{p.relative_to(ROOT).as_posix()}")
    return wanted


def test_the_wheel_holds_every_module_under_tokweight(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("tokweight-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    installed = {n for n in names if ".dist-info/" not in n}
    assert installed == tree_files()
    assert {n.split("/")[0] for n in installed} == {"tokweight"}
    top_level = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["tokweight"]
