"""The CELM chapter: logit-maximization contribution estimation and its baselines.

``protocol`` declares its runs (splits, run configs, readings of a run, the queue's items, the claims and
the profile schema), ``analysis`` holds the pure functions on results the page reads, ``page`` the page
class ``CELM``. This module re-exports what the notebook uses and the method labels the build reads, and
declares the chapter's ``PAPER`` record (found here by ``fedlib.app.chapters.declared_chapters``).
"""

from __future__ import annotations

from .. import Paper
from .page import CELM, baselines_text
from .protocol import (
              CLAIMS,
              METHOD_LABELS,
              CelmProfile,
              configs,  # noqa: F401 - its runs once (``configs_of``): tools and tests read it off the chapter
              runs,
              rare_class_accuracy_of,
)

# the notebook's names, and METHOD_LABELS, which the build reads off the chapter's module
__all__ = ["CELM", "METHOD_LABELS", "PAPER", "baselines_text"]

PAPER = Paper("celm", "CELM", CelmProfile, runs, reference="celm", claims=CLAIMS,
              metrics={"rare_class_accuracy": rare_class_accuracy_of}, rank=1)
