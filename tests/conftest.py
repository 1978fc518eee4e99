"""Shared fixtures live in one module per area; pytest loads them all as plugins."""

pytest_plugins = ["tests.support.fixtures_extract", "tests.support.fixtures_sql", "tests.support.fixtures_train", "tests.support.fixtures_experiment",
                  "tests.support.fixtures_hf"]
