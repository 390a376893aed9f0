"""The logit-based FL chapter ("Who to trust?", arXiv 2509.15147).

``protocol`` declares its runs (the logit runs and their FedAvg baselines, reading a run, the stored runs, the
queue's items, the claims and the profile schema), ``calibration`` the search over the protocol choices the
paper leaves open and its record, ``page`` the page class ``LogitFL``; ``__main__`` runs the calibration
(``python -m fedlib.app.chapters.logitfl [stage ...] [--shard i/n]``). This module re-exports what the notebook
uses and what its text names here (``calibrate()``, ``SEARCH_SPACE``), and declares the chapter's
``PAPER`` record (found here by ``fedlib.app.chapters.declared_chapters``).
"""

from __future__ import annotations

from .. import Paper
from .calibration import SEARCH_SPACE, calibrate
from .page import LogitFL
from .protocol import CLAIMS, LogitFLProfile, configs, runs  # noqa: F401 - configs: tools read it off the chapter

# the notebook's name, and what its text names here: calibrate (to call) and SEARCH_SPACE
__all__ = ["PAPER", "SEARCH_SPACE", "LogitFL", "calibrate"]

PAPER = Paper("logitfl", "Logit-based FL", LogitFLProfile, runs, reference="logitfl", claims=CLAIMS, rank=4)
