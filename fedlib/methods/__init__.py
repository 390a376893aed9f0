"""Aggregation, valuation and selection methods, registered by name."""

from .base import METHODS, ClientData, ClientState, ClientUpdates, Federation, LocalPhase, Method, TestSet, RoundState, build_method, register
from . import fedavg  # noqa: F401  (registers fedavg, fedavg_uniform, fedprox)
from . import gradient, fairness  # noqa: F401  (registers cgsv, shapfed, cffl)
from . import celm  # noqa: F401
from . import flce  # noqa: F401
from . import scm  # noqa: F401  (FedSCM selection; its pipeline is fedlib.scm_pipeline)
from . import shapley, selection  # noqa: F401  (fedms, shapley_rewards, s_fedavg, greedyfed, poc, fedemd)
from . import scm_selection  # noqa: F401  (fedscm_select: FedSCM's weights each round, the leaderboard)
from . import logit  # noqa: F401  (logit_simple, logit_uwa, logit_meta: the logit-based protocol)
from . import robust  # noqa: F401  (fedmedian, fedtrimmedavg, krum: Byzantine-robust aggregation)

__all__ = ["METHODS", "ClientData", "ClientState", "ClientUpdates", "Federation", "LocalPhase", "Method", "TestSet", "RoundState", "build_method", "register"]
