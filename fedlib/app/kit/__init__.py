"""The chapter kit: what a chapter module uses besides the core and the other chapters, and nothing more.

- ``sources``: the profiles (``params/``), the papers' published numbers (``book/reference/``), the book's folder;
- ``frames``: paper-vs-ours frames, a value's mean ± std over seeds, the best method of a line;
- ``pages``: this build's parameters against the paper's, headlines for the status page, benchmark timings,
  how a page states a method's hyper-parameters;
- ``claim_types``: a paper's claims as a chapter declares them (judged by ``fedlib.app.claims``);
- ``items``: a run as the results queue takes it (``QueueItem``), the runners an item names, a run's work;
- ``stored``: the stored runs as pages read them (current, stale, by what made them, by queue cell);
- ``tables``: what a chapter's table method returns, ``Table`` (frame, glue values, note, figure), and how a
  notebook cell shows it (``Table.show``).

The application's layers, lowest first (``pyproject.toml``'s import-linter contracts): the kit; the chapters
(``fedlib.app.chapters``); the judge (``claims``, ``coverage``) and the queue (``queue``, ``cluster``,
``migrate``, ``recompute``); the build (``book``, ``progress``, ``pagecheck``) and the explorer (``explore``,
``widgets``); the command line (``fedlib.__main__``). A module imports only from its own layer or below.
"""
