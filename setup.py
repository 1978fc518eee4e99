"""The folders pipeline/, store/ and training/ at the repository root install as the subpackages
tokweight.pipeline, tokweight.store and tokweight.training of one top-level package, tokweight
(tokweight/: the CLI root and the reporting layer, tokweight.report). Every subpackage below them
is found here, so none can be left out; the SQL files and the preset files (tokweight/presets/<kind>/*.toml, which
config_files reads beside itself) go in as package data."""

from setuptools import find_packages, setup

LAYERS = ("store", "pipeline", "training")

packages = ["tokweight"] + [f"tokweight.{sub}" for sub in find_packages("tokweight")]
packages += [f"tokweight.{layer}" for layer in LAYERS]
packages += [f"tokweight.{layer}.{sub}" for layer in LAYERS for sub in find_packages(layer)]

setup(
    packages=packages,
    package_dir={"tokweight": "tokweight", **{f"tokweight.{layer}": layer for layer in LAYERS}},
    package_data={"tokweight.store": ["sql/*.sql"], "tokweight": ["presets/*/*.toml"]},
)
