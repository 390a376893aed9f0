"""Paper-vs-ours helpers shared by the chapters (fedlib.frames, the Chapter base), on hand-made runs."""

import math

import pandas as pd
import pytest

from fedlib import book, frames
from fedlib.chapters.fedms import FedMS
from fedlib.run import RunResult


class _Config:
    def __init__(self, key):
        self._key = key

    def key(self):
        return self._key


def _run(acc):
    return RunResult(config={}, history=[], final={"accuracy": acc}, meta={})


def test_seed_mean_std_leaves_out_missing_runs_and_accuracies():
    results = {"a0": _run(0.5), "a1": _run(0.7), "b0": _run(None)}
    per_method = {"a": [_Config("a0"), _Config("a1"), _Config("a2")], "b": [_Config("b0")]}
    out = frames.seed_mean_std(results, per_method)
    assert out["a"] == pytest.approx((60.0, 10.0))  # mean of 50 and 70, population std 10
    assert all(math.isnan(v) for v in out["b"])
    assert frames.seed_mean_std(results, {"a": per_method["a"]}, value=lambda r: 1.0)["a"][0] == 1.0
    chapter = FedMS("smoke", book.load_profile("fedms", "smoke"))
    chapter.results = results
    assert chapter.sources(lambda params: {"a": per_method["a"]}) == {"ours (smoke)": {"a": out["a"]}}


def test_paper_values_and_the_comparison_frame():
    ref = pd.DataFrame({"table": ["T1", "T1"], "row": ["r", "r"], "column": ["CELM", "FedAvg"],
                        "value": [80.0, 70.0], "std": [1.0, float("nan")]})
    labels = {"celm": "CELM", "fedavg_uniform": "FedAvg", "cffl": "CFFL"}
    paper = frames.paper_values(ref, "T1", "r", ["celm", "fedavg_uniform", "cffl"], labels.__getitem__)
    assert paper["celm"] == (80.0, 1.0) and paper["fedavg_uniform"][0] == 70.0 and math.isnan(paper["cffl"][0])
    frame = frames.comparison([("r", {"celm": (80.0, 1.0)}, {"ours": {"celm": (78.123, 0.5)}})], labels)
    assert frame.loc[("r", "paper"), "CELM"] == "80.00 ± 1.00" and frame.loc[("r", "ours"), "CELM"] == "78.12 ± 0.50"
    chapter = FedMS("smoke", book.load_profile("fedms", "smoke"))
    chapter.reference = pd.DataFrame({"table": ["T1"], "row": ["r"], "column": ["FedMS"], "value": [89.6],
                                      "std": [float("nan")]})
    assert chapter.paper_values("T1", "r", ["fedms_x100"])["fedms_x100"][0] == 89.6  # a variant reads its method's
    assert chapter.comparison([("s", {"fedavg": (1.0, float("nan"))}, {})]).index.names == ["setting", "source"]
