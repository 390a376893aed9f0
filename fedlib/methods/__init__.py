"""Aggregation, valuation and selection methods, registered by name.

Every module of this package registers its methods when it is imported (``@register``), and importing
the package imports every module in it, in name order, as the book discovers its chapters: a new
method module needs no edit here."""

import importlib
import pkgutil

from .base import (METHODS, ClientData, ClientState, ClientUpdates, DistillationProtocol, Federation, LocalPhase,
                   Method, RoundState, TestSet, build_method, register)

MODULES = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "base"))
for _name in MODULES:
    importlib.import_module(f"{__name__}.{_name}")

__all__ = ["METHODS", "MODULES", "ClientData", "ClientState", "ClientUpdates", "DistillationProtocol", "Federation",
           "LocalPhase", "Method", "TestSet", "RoundState", "build_method", "register"]
