"""Claims judged on synthetic stored runs with known margins: each verdict class as constructed, the
spread and interval texts, and which stored runs count (never another protocol's or a superseded rule's)."""

import math

import pandas as pd
import pytest

from fedlib.app import claims
from fedlib.app.claims import Claim, Comparison, Side

CLAIM = Claim("A beats B on both rows", "Table 1", "table-1", (
    Comparison("r1", Side(("Table 1", "r1", "A")), Side(("Table 1", "r1", "B"))),
    Comparison("r2", Side(("Table 1", "r2", "A")), Side(("Table 1", "r2", "B"))),
))
REFERENCE = pd.DataFrame([
    {"table": "Table 1", "row": "r1", "column": "A", "value": 80.0},
    {"table": "Table 1", "row": "r1", "column": "B", "value": 78.0},
    {"table": "Table 1", "row": "r2", "column": "A", "value": 70.0},
    {"table": "Table 1", "row": "r2", "column": "B", "value": 71.0},
])


def run(acc):
    return {"final": {"accuracy": acc}, "history": [], "meta": {}}


def evidence(cells):
    """{(row, column): {seed: accuracy}} -> evidence with result dicts."""
    return {("Table 1", row, col): {s: run(a) for s, a in seeds.items()} for (row, col), seeds in cells.items()}


def test_paired_margins_sample_std_and_the_deciding_comparison():
    ev = evidence({("r1", "A"): {0: 0.82, 1: 0.84, 2: 0.90}, ("r1", "B"): {0: 0.80, 1: 0.80},
                   ("r2", "A"): {0: 0.75}, ("r2", "B"): {0: 0.74}})
    v = claims.judge(CLAIM, ev, reference=REFERENCE)
    r1 = v.margins[0]
    # seeds 0 and 1 are paired (seed 2 of A has no B): margins 2 and 4 points -> 3, sample std sqrt(2)
    assert r1.values == pytest.approx([2.0, 4.0]) and r1.mean == pytest.approx(3.0)
    assert r1.std == pytest.approx(math.sqrt(2.0)) and r1.n == 2
    # two comparisons on fewer than 3 seeds: indicative, on the fewest (r2: one seed, no ±)
    assert v.verdict == "indicative (1 seed)" and v.worst.label == "r2" and math.isnan(v.worst.std)
    assert v.margin_text() == "+1.00 (1) (r2)" and v.worst.interval_text() == "—"
    # the paper's own numbers: +2 on r1, -1 on r2
    assert v.paper_verdict == "does not hold (1 of 2)" and v.paper_margin_text() == "-1.00"
    assert v.source == "stored paper profile" and v.seeds == 2


T_2 = 4.302652729911275  # t(0.975, 2 degrees of freedom)


def three_seeds(r1, r2):
    """Evidence whose per-seed margins (points) are ``r1`` and ``r2``: B at 50 %, A at 50 % + margin."""
    cells = {}
    for row, ms in (("r1", r1), ("r2", r2)):
        cells[(row, "B")] = {s: 0.5 for s in range(len(ms))}
        cells[(row, "A")] = {s: 0.5 + m / 100 for s, m in enumerate(ms)}
    return evidence(cells)


@pytest.mark.parametrize("r1, r2, verdict, label, interval", [
    # r2: margins 2, 3, 4 -> mean 3, sd 1, half-width t * 1 / sqrt 3 = 2.484; r1 has the lower bound
    ([1.5, 2.5, 3.5], [2.0, 3.0, 4.0], claims.HOLDS, "r1", (2.5 - T_2 / math.sqrt(3), 2.5 + T_2 / math.sqrt(3))),
    # r2 lies below 0 whatever r1 does
    ([-1.0, 1.0, 3.0], [-2.0, -3.0, -4.0], claims.FAILS, "r2", (-3 - T_2 / math.sqrt(3), -3 + T_2 / math.sqrt(3))),
    # r1: margins -1, 1, 3 -> mean 1, sd 2, interval 1 ± 4.968 contains 0
    ([-1.0, 1.0, 3.0], [2.0, 3.0, 4.0], claims.NOISE, "r1", (1 - 2 * T_2 / math.sqrt(3), 1 + 2 * T_2 / math.sqrt(3))),
    # large and positive, but on two seeds: indicative, never "holds"
    ([10.0, 11.0], [10.0, 12.0], "indicative (2 seeds)", "r1", (10.5 - 12.706204736 * 0.5, 10.5 + 12.706204736 * 0.5)),
])
def test_each_verdict_class_comes_out_as_constructed(r1, r2, verdict, label, interval):
    v = claims.judge(CLAIM, three_seeds(r1, r2))
    assert v.verdict == verdict and v.worst.label == label
    assert v.worst.interval == pytest.approx(interval, abs=1e-6)


def test_the_interval_and_the_spread_texts_of_a_judged_claim():
    v = claims.judge(CLAIM, three_seeds([-1.0, 1.0, 3.0], [2.0, 3.0, 4.0]))
    assert v.margin_text() == "+1.00 ± 2.00 (3) (r1)" and v.worst.interval_text() == "[-3.97, +5.97]"
    row = claims.table([v]).iloc[0]
    assert row["our margin ± sd (n)"] == "+1.00 ± 2.00 (3) (r1)" and row["95 % interval"] == "[-3.97, +5.97]"
    comps = claims.comparisons([v]).set_index("comparison")
    assert comps.loc["r2", "verdict"] == claims.HOLDS and comps.loc["r1", "verdict"] == claims.NOISE
    assert comps.loc["r2", "our margin ± sd (n)"] == "+3.00 ± 1.00 (3)"


def test_a_failing_comparison_decides_even_beside_unmeasured_ones():
    ev = three_seeds([-2.0, -3.0, -4.0], [])
    assert claims.judge(CLAIM, ev).verdict == claims.FAILS


def test_partly_measured_and_not_measured():
    ev = three_seeds([2.0, 3.0, 4.0], [])  # r2 has no runs
    assert claims.judge(CLAIM, ev).verdict == claims.PARTIAL
    v = claims.judge(CLAIM, {})
    assert v.verdict == claims.UNMEASURED and v.source == "—" and v.margin_text() == "—"


def test_build_profile_numbers_only_where_nothing_is_stored():
    stored = evidence({("r1", "A"): {0: 0.5}, ("r1", "B"): {0: 0.6}})
    build = three_seeds([2.0, 3.0, 4.0], [2.0, 3.0, 4.0])
    v = claims.judge(CLAIM, stored, build, "smoke")
    assert v.verdict == "indicative (1 seed)" and v.source == "stored paper profile"
    v = claims.judge(CLAIM, {}, build, "smoke")
    assert v.verdict == claims.HOLDS and v.source == "smoke profile (reduced protocol)"


def test_a_one_sided_claim_needs_a_positive_metric():
    claim = Claim("gap > 0", "Fig. 2", "fig-2", (Comparison("gap", Side(("Fig. 2", "r", "c"), "accuracy")),))
    ev = {("Fig. 2", "r", "c"): {0: run(0.02), 1: run(0.04), 2: run(0.03)}}
    v = claims.judge(claim, ev)
    assert v.margins[0].values == pytest.approx([2.0, 4.0, 3.0]) and v.verdict == claims.HOLDS  # 3 ± 2.48
    assert v.paper_verdict == "stated in the text"


def test_every_claim_names_cells_its_chapter_queue_produces():
    from fedlib.app import queue

    for chapter in claims.papers():
        cells = {(i.table, i.row, i.column) for i in queue.chapter_items(chapter, "paper")}
        for claim in claims.claims_of(chapter):
            for comp in claim.comparisons:
                for side in (comp.better, comp.worse):
                    if side is not None:
                        assert side.cell in cells, (claim.text, side.cell)
                        assert callable(claims.metric(side.metric))


def test_fedms_reward_gap_metric_by_hand():
    # two rounds, the Maverick is client 1: MS-GTG - GTG = (0.5 - 0.25) and (0.25 - 0.5) -> mean 0
    result = {"meta": {"client_roles": ["benign", "maverick"]}, "history": [
        {"diagnostics": {"rewards_gtg": [0.1, 0.25], "rewards_ms": [0.0, 0.5]}},
        {"diagnostics": {"rewards_gtg": [0.1, 0.5], "rewards_ms": [0.0, 0.25]}}]}
    assert claims.metric("maverick_reward_gap")(result) == pytest.approx(0.0)


def test_table_and_scorecard_render_links():
    v = claims.judge(CLAIM, {})
    frame = claims.table([v], links=True)
    assert frame.loc[0, "decided by"] == '<a href="#table-1">Table 1</a>'
    assert frame.loc[0, "ours"] == claims.UNMEASURED


def test_numbers_prefer_stored_runs_and_count_seeds(monkeypatch):
    monkeypatch.setattr(claims, "claims_of", lambda chapter: [CLAIM])
    monkeypatch.setattr("fedlib.app.sources.load_reference", lambda chapter: REFERENCE)
    stored = evidence({("r1", "A"): {0: 0.80, 1: 0.84}})
    build = evidence({("r1", "A"): {0: 0.10}, ("r1", "B"): {0: 0.20}})
    f = claims.numbers("celm", "smoke", stored=stored, build=build).set_index(["row", "column"])
    assert f.loc[("r1", "A"), "ours"] == pytest.approx(82.0)
    assert f.loc[("r1", "A"), "± std"] == pytest.approx(2 * math.sqrt(2))  # sample std of 80 and 84
    assert f.loc[("r1", "A"), "ours ± sd (n)"] == "82.00 ± 2.83 (2)" and f.loc[("r1", "A"), "paper ± std"] == "80.00"
    # |82 - 80| = 2 <= max(2, -, t(0.975, 1) * 2.83 / sqrt 2 = 25.4): reproduces, on two seeds
    assert f.loc[("r1", "A"), "reproduces"] == "yes, indicative (2 seeds)"
    assert f.loc[("r1", "A"), "seeds"] == 2 and f.loc[("r1", "A"), "from"] == "stored paper profile"
    assert f.loc[("r1", "B"), "ours ± sd (n)"] == "20.00 (1)" and f.loc[("r1", "B"), "reproduces"].startswith("no")
    assert f.loc[("r1", "B"), "ours"] == pytest.approx(20.0) and f.loc[("r1", "B"), "from"] == "smoke profile (reduced)"
    assert f.loc[("r2", "A"), "seeds"] == 0 and f.loc[("r2", "A"), "paper"] == 70.0


def test_every_claim_links_to_a_section_of_its_chapter_page():
    """The anchor is the section id Sphinx gives one of the chapter's headings (docutils make_id)."""
    from pathlib import Path

    import nbformat
    from docutils.nodes import make_id

    root = Path(__file__).resolve().parent.parent / "book"
    for chapter in claims.papers():
        nb = nbformat.read(root / f"{chapter}.ipynb", as_version=4)
        ids = {make_id(line.lstrip("#").strip()) for c in nb.cells if c.cell_type == "markdown"
               for line in c.source.splitlines() if line.startswith("#")}
        for claim in claims.claims_of(chapter):
            assert claim.anchor in ids, (chapter, claim.anchor)


# ----------------------------------------------------------------------------- the reproduction rule


@pytest.mark.parametrize("ours, paper, paper_std, expected", [
    ([80.0, 81.0, 82.0], 84.0, 0.5, False),  # |81 - 84| = 3 > max(2, 0.5, half-width 4.3027 * 1 / sqrt 3 = 2.484)
    ([80.0, 81.0, 82.0], 83.4, float("nan"), True),  # 2.4 <= our half-width 2.484
    ([80.0, 81.0, 82.0], 84.0, 3.5, True),  # the paper's own std is the widest
    ([80.9, 81.0, 81.1], 79.0, None, True),  # half-width 0.248: 2 points, the floor, decides
    ([80.9, 81.0, 81.1], 78.9, None, False),
])
def test_reproduction_is_within_the_widest_of_two_points_the_papers_std_and_our_half_width(ours, paper, paper_std,
                                                                                           expected):
    from fedlib import stats

    assert stats.half_width(ours) == pytest.approx(T_2 * stats.mean_std(ours).std / math.sqrt(3))
    assert stats.reproduces(ours, paper, paper_std) is expected
    assert stats.reproduction_text(ours, paper, paper_std) == ("yes" if expected else "no")


def test_spread_texts_use_the_sample_std_and_show_n():
    from fedlib import stats

    assert stats.mean_std([80.0, 84.0]) == (82.0, pytest.approx(2 * math.sqrt(2)), 2)
    assert stats.pm(*stats.mean_std([82.0, 83.0, 81.57])) == "82.19 ± 0.73 (3)"
    assert stats.pm(*stats.mean_std([82.19])) == "82.19 (1)"  # one seed: no ±
    assert stats.pm(80.0, 1.0) == "80.00 ± 1.00" and stats.pm(float("nan")) == "—"  # a paper's value: no n


# ----------------------------------------------------------------------------- which stored runs count


def _synthetic_config(**overrides):
    from fedlib.config import RunConfig

    return RunConfig.make({"dataset": "synthetic", "model": "mlp", "n_clients": 2, "rounds": 1,
                           "method": {"name": "fedavg"}, **overrides})


def _store(root, config, accuracy, data_sha="d" * 64, **meta_overrides):
    """A stored run of ``config`` made on data of fingerprint ``data_sha`` (its file key: the config's key
    on that data), with ``meta_overrides`` replacing what the run records about itself."""
    from fedlib.cache import ResultCache
    from fedlib.results import stored_payload

    data = {"source": "synthetic", "files": [], "sha256": data_sha}
    meta = {"resolved": config.resolved(), "rule_versions": config.rule_versions(), "data": data, **meta_overrides}
    result = {"config": config.to_dict(), "history": [], "meta": meta,
              "final": {"accuracy": accuracy, "balanced_accuracy": accuracy, "f1": None, "rounds_completed": 0}}
    ResultCache(root, protect=True).put(config.key(data), stored_payload(config.to_dict(), result))


def test_a_stored_run_counts_on_its_recorded_fingerprint_with_or_without_the_data(tmp_path):
    config = _synthetic_config(seed=0)
    _store(tmp_path, config, 0.8)
    index = claims.StoredIndex.read(tmp_path)
    result, here = index.run_of(config, {"sha256": None})  # data not on this machine
    assert result["final"]["accuracy"] == 0.8 and here is False
    assert index.run_of(config, {"sha256": "d" * 64})[1] is True  # the same data here
    assert index.run_of(config, {"sha256": "e" * 64}) is None  # other data here: not this run's


def test_a_superseded_rule_or_another_protocol_is_never_counted(tmp_path):
    config = _synthetic_config(seed=0)
    clipped = _synthetic_config(seed=0, update_clip=5.0)  # another protocol (the FedAvg page's clipping)
    _store(tmp_path, config, 0.9, rule_versions={**config.rule_versions(), "engine": "0"})  # superseded rule
    _store(tmp_path, clipped, 0.7)
    index = claims.StoredIndex.read(tmp_path)
    assert index.run_of(config, {"sha256": None}) is None
    assert index.run_of(clipped, {"sha256": None})[0]["final"]["accuracy"] == 0.7
    # a file whose key is not the config's key on the data it recorded is not this config's run either
    from fedlib.cache import ResultCache

    entry = ResultCache(tmp_path, protect=True).read(clipped.key({"sha256": "d" * 64}))[0]
    clean = tmp_path / "renamed"
    ResultCache(clean, protect=True).put("0" * 20, entry)
    assert claims.StoredIndex.read(clean).run_of(clipped, {"sha256": None}) is None


def test_verdicts_from_stored_files_are_the_same_with_and_without_the_data(tmp_path, monkeypatch):
    """Synthetic stored runs through the whole path (index, queue cells, judging): margins 2, 3, 4 points."""
    from fedlib.app import queue

    items = []
    for s, margin in enumerate((2.0, 3.0, 4.0)):
        for column, acc in (("A", 0.5 + margin / 100), ("B", 0.5)):
            config = _synthetic_config(seed=s, lr=0.1 if column == "A" else 0.2)
            _store(tmp_path / "runs", config, acc)
            items.append(queue.QueueItem("celm", "Table 1", "r1", column, s, config, queue.run_round))
    # a stored run of another protocol for the same cell and seed never enters
    _store(tmp_path / "runs", _synthetic_config(seed=0, lr=0.1, update_clip=5.0), 0.99)
    claim = Claim("A beats B", "Table 1", "table-1", (CLAIM.comparisons[0],))
    monkeypatch.setattr(claims, "claims_of", lambda chapter: [claim])
    monkeypatch.setattr(queue, "chapter_items", lambda chapter, profile="paper": items)
    monkeypatch.setattr(queue, "repo_results", lambda: tmp_path)
    monkeypatch.setattr("fedlib.app.sources.load_reference", lambda chapter: REFERENCE)
    judged = {}
    for here, sha in (("absent", None), ("present", "d" * 64)):
        monkeypatch.setattr("fedlib.config.RunConfig.data_fingerprint", lambda self, sha=sha: {"sha256": sha})
        (v,) = claims.verdicts("celm")
        judged[here] = (v.verdict, v.margin_text(), v.worst.interval_text(), v.data_note)
    assert judged["absent"][:3] == judged["present"][:3] == (claims.HOLDS, "+3.00 ± 1.00 (3) (r1)", "[+0.52, +5.48]")
    assert judged["absent"][3] == claims.DATA_ABSENT and judged["present"][3] == ""


def test_the_queue_counts_a_stored_run_whose_data_is_not_here(tmp_path, monkeypatch):
    from fedlib.app import queue

    config = _synthetic_config(seed=0)
    _store(tmp_path / "runs", config, 0.8)
    item = queue.QueueItem("celm", "Table 1", "r1", "A", 0, config, queue.run_round)
    monkeypatch.setattr(queue, "repo_results", lambda: tmp_path)
    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path / "elsewhere"))
    monkeypatch.setattr("fedlib.config.RunConfig.data_fingerprint", lambda self: {"sha256": None})
    monkeypatch.setattr(queue, "data_missing", lambda dataset: f"{dataset} data absent")
    assert not (tmp_path / "runs" / f"{item.key}.json").exists() and queue.is_stored(item)
    other = queue.QueueItem("celm", "Table 1", "r1", "A", 1, _synthetic_config(seed=1), queue.run_round)
    assert not queue.is_stored(other)


def test_a_chapter_reads_a_gpu_run_stored_under_its_cpu_key_without_the_data(tmp_path, monkeypatch):
    """The queue stores a GPU run under the chapter's (CPU) key; with the data absent here the chapter
    (``book.stored_results``) and the claims both find it by the fingerprint it recorded."""
    from fedlib.app import book

    config = _synthetic_config(seed=0)
    _store(tmp_path, config, 0.8, resolved={**config.resolved(), "device": "cuda"}, config_key="gpu-own-key")
    monkeypatch.setattr(book, "results_dir", lambda chapter=None: tmp_path)
    monkeypatch.setattr("fedlib.config.RunConfig.data_fingerprint", lambda self: {"sha256": None})
    stored = book.stored_results("celm", [config])
    assert list(stored.results) == [config.key()] and stored.provenance[config.key()]["data_unverified"]
    assert claims.StoredIndex.read(tmp_path).run_of(config)[0]["final"]["accuracy"] == 0.8


def test_fedms_table1_claim_reads_a_run_as_the_page_does():
    """One number per cell: the FedMS Table 1 claim reads MNIST and CIFAR-10 runs alike, with the paper
    profile's table1_score (the final accuracy, issue 44), as the chapter's table does."""
    from fedlib.app import claims

    history = [{"round": t, "accuracy": a} for t, a in enumerate((0.5, 0.7, 0.9))]
    mnist = {"config": {"dataset": "mnist"}, "history": history, "final": {"accuracy": 0.9}, "meta": {}}
    cifar = {**mnist, "config": {"dataset": "cifar10"}}
    assert claims.metric("fedms_table1")(mnist) == pytest.approx(90.0)
    assert claims.metric("fedms_table1")(cifar) == pytest.approx(90.0)
    claim = next(c for c in claims.claims_of("fedms") if "beats FedAvg" in c.text)
    assert {side.metric for comp in claim.comparisons for side in (comp.better, comp.worse)} == {"fedms_table1"}
