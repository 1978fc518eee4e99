"""Shared fixtures live in one module per area; pytest loads them all as plugins."""

pytest_plugins = ["tests.fixtures_extract", "tests.fixtures_sql", "tests.fixtures_train", "tests.fixtures_experiment",
                  "tests.fixtures_hf"]
