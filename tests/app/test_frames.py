"""Paper-vs-ours helpers shared by the chapters (fedlib.app.kit.frames, the Chapter base), on hand-made runs."""

import math

import pandas as pd
import pytest

from fedlib.app.kit import frames, sources
from fedlib.app.chapters.fedms import FedMS
from fedlib.run import RunResult
from fedlib.stats import pm


class _Config:
    def __init__(self, key, seed=None):
        self._key = key
        if seed is not None:
            self.seed = seed

    def key(self):
        return self._key


def _run(acc):
    return RunResult(config={}, history=[], final={"accuracy": acc}, meta={})


def test_seed_mean_std_leaves_out_missing_runs_and_accuracies():
    results = {"a0": _run(0.5), "a1": _run(0.7), "b0": _run(None)}
    per_method = {"a": [_Config("a0"), _Config("a1"), _Config("a2")], "b": [_Config("b0")]}
    out = frames.seed_mean_std(results, per_method)
    assert out["a"] == pytest.approx((60.0, 10.0 * math.sqrt(2), 2))  # mean of 50 and 70, sample std 14.14, 2 seeds
    assert out["a"].by_seed == {0: 50.0, 1: 70.0} and pm(*out["a"]) == "60.00 ± 14.14 (2)"
    assert math.isnan(out["b"].mean) and math.isnan(out["b"].std) and out["b"].n == 0
    assert frames.seed_mean_std(results, {"a": per_method["a"]}, value=lambda r: 1.0)["a"][0] == 1.0
    chapter = FedMS("smoke", sources.load_profile("fedms", "smoke"))
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
    frame = frames.comparison([("r", {}, {"ours": {"celm": (78.123, 0.5, 3), "cffl": (70.0, float("nan"), 1)}})],
                              labels)
    assert frame.loc[("r", "ours"), "CELM"] == "78.12 ± 0.50 (3)" and frame.loc[("r", "ours"), "CFFL"] == "70.00 (1)"
    chapter = FedMS("smoke", sources.load_profile("fedms", "smoke"))
    chapter.reference = pd.DataFrame({"table": ["T1"], "row": ["r"], "column": ["FedMS"], "value": [89.6],
                                      "std": [float("nan")]})
    assert chapter.paper_values("T1", "r", ["fedms_x100"])["fedms_x100"][0] == 89.6  # a variant reads its method's
    assert chapter.comparison([("s", {"fedavg": (1.0, float("nan"))}, {})]).index.names == ["setting", "source"]


def test_the_best_method_is_judged_on_the_seeds_the_methods_share():
    from fedlib.stats import SeedSpread

    # CELM on seeds 0-1 (mean 82), FedAvg on seed 0 only (81): on the shared seed 0, FedAvg's 81 beats CELM's 80
    celm, fedavg = SeedSpread.of({0: 80.0, 1: 84.0}), SeedSpread.of({0: 81.0})
    assert celm.mean > fedavg.mean and frames.best_on_shared_seeds({"celm": celm, "fedavg": fedavg}) == {"fedavg"}
    assert frames.best_on_shared_seeds({"celm": celm, "x": SeedSpread.of({2: 99.0})}) == set()  # no seed in common
    assert frames.best_on_shared_seeds({"celm": (80.0, 1.0), "fedavg": (81.0, 0.5)}) == {"fedavg"}  # a paper's line
    labels = {"celm": "CELM", "fedavg": "FedAvg"}
    styled = frames.styled_comparison([("r", {"celm": (82.0, 1.0), "fedavg": (81.0, 1.0)},
                                        {"ours": {"celm": celm, "fedavg": fedavg}})], labels)
    ctx = styled._compute().ctx  # noqa: SLF001 - the cells' styles: per line, the paper's CELM, our FedAvg
    assert ctx[(0, 0)] == [("font-weight", "bold")] and ctx[(1, 1)] == [("font-weight", "bold")]
    assert not ctx.get((1, 0))


def test_every_reference_table_declares_its_scale():
    import yaml

    for path in sorted((sources.book_dir() / "reference").glob("*.yaml")):
        scales = frames.reference_scales(path.stem)
        entries = yaml.safe_load(path.read_text())["entries"]
        for e in entries:
            scale = frames.scale_of(scales, e["table"], e["column"])
            if scale in ("percent", "fraction"):
                assert 0.0 <= e["value"] <= (100.0 if scale == "percent" else 1.0), (path.name, e)
    # the logit-FL paper prints fractions: transcribed once, in percent (our scale)
    ref = sources.load_reference("logitfl")
    assert ref.set_index("column").loc["UWA", "value"] == 94.54


def test_an_undeclared_or_unknown_scale_is_refused(tmp_path, monkeypatch):
    (tmp_path / "reference").mkdir()
    monkeypatch.setattr(frames, "book_dir", lambda: tmp_path)
    entry = '  - {table: "T1", row: "r", column: "c", value: 0.5}\n'
    (tmp_path / "reference" / "p.yaml").write_text("entries:\n" + entry)
    with pytest.raises(ValueError, match=r"^reference/p.yaml: no scale declared for table\(s\) T1$"):
        frames.reference_scales("p")
    (tmp_path / "reference" / "p.yaml").write_text('scales: {"T1": percnt}\nentries:\n' + entry)
    with pytest.raises(ValueError, match="unknown scale"):
        frames.reference_scales("p")
    (tmp_path / "reference" / "p.yaml").write_text('scales: {"T1": fraction}\nprinted_as: {"T1": fraction}\n'
                                                  'entries:\n' + entry)
    with pytest.raises(ValueError, match="must be transcribed in percent"):
        frames.reference_scales("p")
