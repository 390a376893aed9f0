"""Shared fixtures. The tests mirror the code: ``tests/core/`` tests the library (``fedlib``, never its
``app``), ``tests/app/`` the book application (chapters, claims, queue, build, explorer, CLI); the modules
both share (``golden_methods``, ``reliability_common``) sit here, on the import path of both."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared modules beside this file


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: extra threads only add synchronisation, which on a busy CPU costs 10x."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
