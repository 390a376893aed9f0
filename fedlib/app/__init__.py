"""The book application: the chapters (one ``Paper`` record per paper), their claims and coverage, the
results queue, the book build and its page checks, the explorer and widgets. It is built on the core
(``fedlib``: data, splits, models, the population, the engine, methods, runs and their results) and the
core never imports it (an import-linter contract in pyproject.toml, tests/test_layers.py)."""
