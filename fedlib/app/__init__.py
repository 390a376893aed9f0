"""The book application: the chapters (one ``Paper`` record per paper), their claims and coverage, the
results queue, the book build and its page checks, the explorer and widgets. It is built on the core
(``fedlib``: data, splits, models, the population, the engine, methods, runs and their results) and the
core never imports it (an import-linter contract in pyproject.toml, tests/app/test_layers.py).

Inside it the imports run down its layers (import-linter ``layers`` contracts, same file and test): the
chapter kit (``kit``: what a chapter uses), the chapters (``chapters``), the judge and the queue
(``claims``, ``coverage``; ``queue``, ``cluster``, ``migrate``, ``recompute``), the build and the explorer
(``book``, ``progress``, ``pagecheck``; ``explore``, ``widgets``), and above them the command line
(``fedlib.__main__``)."""
