"""The FedSCM chapter: sparse consensus matching, its theory checked by simulation, and the one-shot selection
pipeline (Algorithm 2) against its baselines.

``protocol`` declares its runs (the pipeline's federations and the issue-22 variants, reading a run, storing
and reading the stored runs, the queue's items, the claims and the profile schema), ``analysis`` holds the
pure functions on results and the theory's simulations the page reads, ``page`` the page class ``FedSCM``.
This module re-exports what the notebook uses and ``store_results`` (the page names
``fedlib.app.chapters.fedscm.store_results``), and declares the chapter's ``PAPER`` record (found here by
``fedlib.app.chapters.declared_chapters``).
"""

from __future__ import annotations

from .. import Paper
from .page import FedSCM
from .protocol import (
    CLAIMS,
    FedSCMProfile,
    configs,  # noqa: F401 - its runs once (``configs_of``): tools and tests read it off the chapter
    runs,
    scm_accuracy,
    selected_minus_unselected,
    store_results,
)

# the notebook's name, and store_results, which the page's note tells a reader to call from here
__all__ = ["PAPER", "FedSCM", "store_results"]

PAPER = Paper("fedscm", "FedSCM", FedSCMProfile, runs, reference="fedscm", claims=CLAIMS,
              metrics={"scm_accuracy": scm_accuracy, "selected_minus_unselected": selected_minus_unselected}, rank=3)
