"""The FedMS chapter: Maverick-Shapley valuation and FedMS client selection.

``protocol`` declares its runs (Table 1, Fig. 2, Table 2 and the readings of §5.1 and of the CIFAR-10
protocol, readings of a run, the queue's items, the claims and the profile schema), ``analysis`` holds the
pure functions on results the page reads, ``page`` the page class ``FedMS``. This module re-exports what
the notebook uses and the method labels the build reads, and declares the chapter's ``PAPER`` record
(found here by ``fedlib.app.chapters.declared_chapters``).
"""

from __future__ import annotations

from .. import Paper
from .page import FedMS
from .protocol import (
    CLAIMS,
    METHOD_LABELS,
    FedMSProfile,
    configs,  # noqa: F401 - its runs once (``configs_of``): tools and tests read it off the chapter
    maverick_participation,
    maverick_reward_gap,
    runs,
    table1_claim_score,
)

# the notebook's name, and METHOD_LABELS, which the build reads off the chapter's module
__all__ = ["METHOD_LABELS", "PAPER", "FedMS"]

PAPER = Paper("fedms", "FedMS", FedMSProfile, runs, reference="fedms", claims=CLAIMS,
              metrics={"maverick_reward_gap": maverick_reward_gap, "maverick_participation": maverick_participation,
                       "fedms_table1": table1_claim_score}, rank=5)
