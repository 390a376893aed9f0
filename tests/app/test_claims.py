"""Claims judged on synthetic stored runs with known margins: each verdict class as constructed, the
spread and interval texts, and which stored runs count (never another protocol's or a superseded rule's)."""

import dataclasses
import math

import pandas as pd
import pytest

from fedlib.app import claims
from fedlib.app.kit import stored as kit_stored
from fedlib.app.kit.claim_types import Claim, Comparison, Side

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
    monkeypatch.setattr(claims, "load_reference", lambda chapter: REFERENCE)
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

    root = Path(__file__).resolve().parents[2] / "book"
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
    from fedlib.store import stored_payload

    data = {"source": "synthetic", "files": [], "sha256": data_sha}
    meta = {"resolved": config.resolved(), "rule_versions": config.rule_versions(), "data": data, **meta_overrides}
    result = {"config": config.to_dict(), "history": [], "meta": meta,
              "final": {"accuracy": accuracy, "balanced_accuracy": accuracy, "f1": None, "rounds_completed": 0}}
    ResultCache(root, protect=True).put(config.key(data), stored_payload(config.to_dict(), result))


def test_a_stored_run_counts_on_its_recorded_fingerprint_with_or_without_the_data(tmp_path):
    config = _synthetic_config(seed=0)
    _store(tmp_path, config, 0.8)
    index = kit_stored.StoredIndex.read(tmp_path)
    result, here = index.run_of(config, {"sha256": None})  # data not on this machine
    assert result["final"]["accuracy"] == 0.8 and here is False
    assert index.run_of(config, {"sha256": "d" * 64})[1] is True  # the same data here
    assert index.run_of(config, {"sha256": "e" * 64}) is None  # other data here: not this run's


def test_a_superseded_rule_or_another_protocol_is_never_counted(tmp_path):
    config = _synthetic_config(seed=0)
    clipped = _synthetic_config(seed=0, update_clip=5.0)  # another protocol (the FedAvg page's clipping)
    _store(tmp_path, config, 0.9, rule_versions={**config.rule_versions(), "engine": "0"})  # superseded rule
    _store(tmp_path, clipped, 0.7)
    index = kit_stored.StoredIndex.read(tmp_path)
    assert index.run_of(config, {"sha256": None}) is None
    assert index.run_of(clipped, {"sha256": None})[0]["final"]["accuracy"] == 0.7
    # a file whose key is not the config's key on the data it recorded is not this config's run either
    from fedlib.cache import ResultCache

    entry = ResultCache(tmp_path, protect=True).read(clipped.key({"sha256": "d" * 64}))[0]
    clean = tmp_path / "renamed"
    ResultCache(clean, protect=True).put("0" * 20, entry)
    assert kit_stored.StoredIndex.read(clean).run_of(clipped, {"sha256": None}) is None


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
    monkeypatch.setattr("fedlib.store.default_root", lambda: tmp_path)
    monkeypatch.setattr(claims, "load_reference", lambda chapter: REFERENCE)
    judged = {}
    for here, sha in (("absent", None), ("present", "d" * 64)):
        monkeypatch.setattr("fedlib.config.RunConfig.data_fingerprint", lambda self, sha=sha: {"sha256": sha})
        (v,) = claims.verdicts("celm")
        judged[here] = (v.verdict, v.margin_text(), v.worst.interval_text(), v.data_note)
    assert judged["absent"][:3] == judged["present"][:3] == (claims.HOLDS, "+3.00 ± 1.00 (3) (r1)", "[+0.52, +5.48]")
    assert judged["absent"][3] == claims.DATA_ABSENT and judged["present"][3] == ""


def test_the_queue_counts_a_stored_run_whose_data_is_not_here(tmp_path, monkeypatch):
    from fedlib.app import queue
    from fedlib.app.queue import store as queue_store

    config = _synthetic_config(seed=0)
    _store(tmp_path / "runs", config, 0.8)
    item = queue.QueueItem("celm", "Table 1", "r1", "A", 0, config, queue.run_round)
    monkeypatch.setattr("fedlib.store.default_root", lambda: tmp_path)
    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path / "elsewhere"))
    monkeypatch.setattr("fedlib.config.RunConfig.data_fingerprint", lambda self: {"sha256": None})
    monkeypatch.setattr(queue_store, "data_missing", lambda dataset: f"{dataset} data absent")
    assert not (tmp_path / "runs" / f"{item.key}.json").exists() and queue.is_stored(item)
    other = queue.QueueItem("celm", "Table 1", "r1", "A", 1, _synthetic_config(seed=1), queue.run_round)
    assert not queue.is_stored(other)


def test_a_chapter_reads_a_gpu_run_stored_under_its_cpu_key_without_the_data(tmp_path, monkeypatch):
    """The queue stores a GPU run under the chapter's (CPU) key; with the data absent here the chapter
    (``kit.stored.stored_results``) and the claims both find it by the fingerprint it recorded."""
    config = _synthetic_config(seed=0)
    _store(tmp_path / "runs", config, 0.8, resolved={**config.resolved(), "device": "cuda"}, config_key="gpu-own-key")
    monkeypatch.setattr("fedlib.store.default_root", lambda: tmp_path)
    monkeypatch.setattr("fedlib.config.RunConfig.data_fingerprint", lambda self: {"sha256": None})
    stored = kit_stored.stored_results("celm", [config])
    assert list(stored.results) == [config.key()] and stored.provenance[config.key()]["data_unverified"]
    assert kit_stored.StoredIndex.read(tmp_path / "runs").run_of(config)[0]["final"]["accuracy"] == 0.8


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


# ----------------------------------------------------------------------------- the paper's margin, rejected or not
# Margins of 3 seeds, by hand (t(0.975, 2) = 4.302653): [2, 3, 4] -> 3 ± 2.484 = [0.516, 5.484];
# [-2, -3, -4] -> [-5.484, -0.516]; [-1, 1, 3] -> 1 ± 4.968 = [-3.968, 5.968]; [5, 6, 7] -> [3.516, 8.484].


@pytest.mark.parametrize("values, paper, verdict, check", [
    ([2.0, 3.0, 4.0], 3.0, claims.HOLDS, claims.INSIDE),  # above 0, the paper's margin inside
    ([2.0, 3.0, 4.0], 0.4, claims.HOLDS, claims.REJECTED),  # above 0, the paper's margin below our interval
    ([5.0, 6.0, 7.0], 1.43, claims.HOLDS, claims.REJECTED),  # much larger than the paper's (the logit meta-model)
    ([-2.0, -3.0, -4.0], -1.0, claims.FAILS, claims.INSIDE),  # below 0, and so is the paper's margin
    ([-2.0, -3.0, -4.0], 3.08, claims.FAILS, claims.REJECTED),  # below 0, the paper's margin far above
    ([-1.0, 1.0, 3.0], 3.08, claims.NOISE, claims.INSIDE),  # sign open, the paper's margin inside: not rejected
    ([-1.0, 1.0, 3.0], 9.01, claims.NOISE, claims.REJECTED),  # sign open, yet the paper's +9 is excluded
    ([-1.0, 1.0, 3.0], -5.0, claims.NOISE, claims.REJECTED),  # excluded from below
    ([-1.0, 1.0, 3.0], None, claims.NOISE, None),  # no margin from the paper: nothing to reject
    ([10.0, 11.0], 100.0, "indicative (2 seeds)", None),  # 2 seeds: indicative, no verdict of either kind
    ([], 3.0, None, None),  # not measured
])
def test_the_sign_verdict_and_the_paper_margin_verdict_are_orthogonal(values, paper, verdict, check):
    m = claims.Margin("r", values, paper)
    assert m.verdict == verdict and m.paper_check == check and m.rejected is (check == claims.REJECTED)
    assert claims.paper_margin_check(values, paper) == check
    assert m.verdict_text() == (verdict or claims.UNMEASURED) + (f"; {check}" if check else "")


def test_the_interval_bounds_themselves_do_not_reject():
    lo, hi = 3.0 - T_2 / math.sqrt(3), 3.0 + T_2 / math.sqrt(3)  # [2, 3, 4]'s interval
    assert claims.paper_margin_check([2.0, 3.0, 4.0], lo + 1e-9) == claims.INSIDE
    assert claims.paper_margin_check([2.0, 3.0, 4.0], hi + 1e-6) == claims.REJECTED


def test_a_claim_in_one_line():
    M = claims.Margin
    # the case: does not hold on 2 of 3, the third's sign open; the paper's margin rejected on all 3
    assert claims.summary_line([M("a", [-2.0, -3.0, -4.0], 3.08), M("b", [-2.0, -3.0, -4.0], 3.87),
                                M("c", [-1.0, 1.0, 3.0], 9.01)]) == \
        "does not hold on 2 of 3, sign open on 1 of 3; the paper's margin is rejected on 3 of 3"
    # every class at once; only the 3 comparisons with a paper margin and 3 seeds judge the paper's margin
    assert claims.summary_line([M("a", [2.0, 3.0, 4.0], 3.0), M("b", [-2.0, -3.0, -4.0], 3.08),
                                M("c", [-1.0, 1.0, 3.0], 2.0), M("d", [10.0, 11.0], 5.0), M("e", [], 1.0),
                                M("f", [-1.0, 1.0, 3.0], None)]) == \
        ("holds on 1 of 6, does not hold on 1 of 6, sign open on 2 of 6, indicative (< 3 seeds) on 1 of 6, "
         "no runs yet on 1 of 6; the paper's margin is rejected on 1 of 3")
    assert claims.summary_line([M("a", [2.0, 3.0, 4.0], 3.0)]) == \
        "holds on 1 of 1; the paper's margin is inside our interval on 1 of 1"
    assert claims.summary_line([M("a", [2.0, 3.0, 4.0])]) == "holds on 1 of 1; the paper states no margin"
    assert claims.summary_line([M("a", [10.0, 11.0], 3.0), M("b", [], 2.0)]) == \
        "indicative (< 3 seeds) on 1 of 2, no runs yet on 1 of 2; the paper's margin is not testable yet (< 3 seeds)"


def test_a_judged_claim_carries_its_summary_and_its_rejections():
    # r1: margins 2, 3, 4 against the paper's +2 (inside); r2: 2, 3, 4 against the paper's -1 (rejected)
    v = claims.judge(CLAIM, three_seeds([2.0, 3.0, 4.0], [2.0, 3.0, 4.0]), reference=REFERENCE)
    assert v.verdict == claims.HOLDS and (v.n_testable, v.n_rejected) == (2, 1)
    assert v.summary == "holds on 2 of 2; the paper's margin is rejected on 1 of 2"
    assert claims.table([v]).loc[0, "summary"] == v.summary
    comps = claims.comparisons([v]).set_index("comparison")
    assert comps.loc["r1", "the paper's margin"] == claims.INSIDE and comps.loc["r2", "the paper's margin"] == \
        claims.REJECTED
    tally = claims.count([v])
    assert (tally["n_comparisons"], tally["n_testable"], tally["n_rejected"], tally["n_claims_rejected"]) == (2, 2, 1, 1)


def test_the_claims_html_shows_the_margins_the_verdict_and_the_summary():
    import html

    v = claims.judge(CLAIM, three_seeds([-2.0, -3.0, -4.0], [2.0, 3.0, 4.0]), reference=REFERENCE)
    page = html.unescape(claims.claims_html([v], page="celm.html"))
    # the deciding comparison r1: ours -3 ± 1 (3) in [-5.48, -0.52]; the paper's +2 rejected
    assert "-3.00 ± 1.00 (3)" in page and "[-5.48, -0.52]" in page and "+2.00" in page
    assert "rejected by our interval" in page and '<a href="celm.html#table-1">Table 1</a>' in page
    assert claims.FAILS in page and v.summary in page and "its 2 comparisons" in page
    assert v.summary == "holds on 1 of 2, does not hold on 1 of 2; the paper's margin is rejected on 2 of 2"
    unmeasured = html.unescape(claims.claims_html([claims.judge(CLAIM, {})]))
    assert "from: no runs yet" in unmeasured and claims.UNMEASURED in unmeasured


# ----------------------------------------------------------------------------- "in most settings"


def _rows(n):
    return Claim("A beats B in most settings", "Table 1", "table-1",
                 tuple(Comparison(f"r{i}", Side(("Table 1", f"r{i}", "A")), Side(("Table 1", f"r{i}", "B")))
                       for i in range(1, n + 1)), quantifier=claims.MOST)


def _evidence_of(*rows):
    """Evidence whose row r<i> has the per-seed margins rows[i-1] (points; [] for no runs)."""
    cells = {}
    for i, ms in enumerate(rows, 1):
        if ms:
            cells[(f"r{i}", "B")] = {s: 0.5 for s in range(len(ms))}
            cells[(f"r{i}", "A")] = {s: 0.5 + m / 100 for s, m in enumerate(ms)}
    return evidence(cells)


H, F, N = [2.0, 3.0, 4.0], [-2.0, -3.0, -4.0], [-1.0, 1.0, 3.0]


@pytest.mark.parametrize("rows, most, every", [
    ((H, H, H, F), claims.HOLDS, claims.FAILS),  # 3 of 4 hold: a majority, though one does not
    ((H, H, F, F), claims.FAILS, claims.FAILS),  # 2 of 4 do not: a majority can no longer hold
    ((H, H, N, F), claims.NOISE, claims.FAILS),  # 2 hold, 1 fails, 1 open: undecided
    ((H, H, H, []), claims.HOLDS, claims.PARTIAL),  # the majority holds already
    ((H, F, [], []), claims.PARTIAL, claims.FAILS),  # undecided until the rest is run
    ((H, [10.0, 11.0], H, []), "indicative (2 seeds)", "indicative (2 seeds)"),
])
def test_a_claim_in_most_settings_needs_a_majority(rows, most, every):
    ev = _evidence_of(*rows)
    assert claims.judge(_rows(len(rows)), ev).verdict == most
    assert claims.judge(dataclasses.replace(_rows(len(rows)), quantifier=claims.EVERY), ev).verdict == every


def test_the_papers_own_verdict_on_a_claim_in_most_settings():
    M = claims.Margin
    assert claims.paper_verdict([M("a", [], 1.0), M("b", [], 2.0), M("c", [], -1.15)], claims.MOST) == "holds (2 of 3)"
    assert claims.paper_verdict([M("a", [], 1.0), M("b", [], -2.0)], claims.MOST) == "does not hold (1 of 2)"
    assert claims.paper_verdict([M("a", [], 1.0), M("b", [], -2.0)]) == "does not hold (1 of 2)"
    with pytest.raises(ValueError, match="quantifier"):
        Claim("x", "Table 1", "t", (), quantifier="some")


# ----------------------------------------------------------------------------- every baseline the text claims against


def _paper_margins(chapter, text):
    from fedlib.app.kit.sources import load_reference

    claim = next(c for c in claims.claims_of(chapter) if c.text.startswith(text))
    v = claims.judge(claim, {}, reference=load_reference(chapter))
    return claim, v, {m.label: round(m.paper, 2) for m in v.margins}


def test_fedms_is_judged_against_every_table1_baseline_in_most_settings():
    """FedMS §5.2: "better model performance than baselines in most settings": a claim per baseline of
    Table 1, on its six splits, the paper's margins from its Table 1 (FedMS minus the baseline)."""
    rows = ["MNIST Dir(10)", "MNIST Dir(1)", "MNIST Dir(0.1)", "CIFAR-10 Dir(10)", "CIFAR-10 Dir(1)",
            "CIFAR-10 Dir(0.1)"]
    for baseline in ("FedAvg", "FedProx", "PoC", "FedEMD", "S-FedAvg", "GreedyFed"):
        claim = next(c for c in claims.claims_of("fedms") if c.text.startswith(f"FedMS beats {baseline} "))
        assert [c.label for c in claim.comparisons] == rows
        assert {(c.better.cell[2], c.worse.cell[2], c.better.metric) for c in claim.comparisons} == \
            {("FedMS", baseline, "fedms_table1")}
        assert claim.quantifier == (claims.EVERY if baseline == "FedAvg" else claims.MOST)
    _, v, paper = _paper_margins("fedms", "FedMS beats PoC ")
    # 92.96 - 91.27, 65.92 - 67.07 (PoC ahead on CIFAR-10 Dir(10)), 89.62 - 54.63
    assert (paper["MNIST Dir(10)"], paper["CIFAR-10 Dir(10)"], paper["MNIST Dir(0.1)"]) == (1.69, -1.15, 34.99)
    assert v.paper_verdict == "holds (5 of 6)" and v.verdict == claims.UNMEASURED
    _, v, paper = _paper_margins("fedms", "FedMS beats GreedyFed ")
    assert paper["MNIST Dir(0.1)"] == -0.11 and v.paper_verdict == "holds (5 of 6)"  # 89.62 - 89.73
    _, v, paper = _paper_margins("fedms", "FedMS beats FedProx ")
    assert paper["CIFAR-10 Dir(0.1)"] == 18.69 and v.paper_verdict == "holds (6 of 6)"  # 59.75 - 41.06


def test_celm_is_judged_against_cffl_and_cgsv_on_table1():
    """CELM §6: top score in four of five F.MNIST splits (CFFL is best on SLS) and in all five CIFAR-10 splits."""
    claim, v, paper = _paper_margins("celm", "CELM beats CFFL ")
    assert "F.MNIST SLS" not in paper and len(paper) == 9 and v.paper_verdict == "holds"
    assert paper["F.MNIST PLS"] == 2.75 and paper["CIFAR-10 Dir. (0.10)"] == 8.8  # 83.70 - 80.95, 69.21 - 60.41
    assert {(c.better.cell, c.worse.cell[2]) for c in claim.comparisons if c.label == "CIFAR-10 SLS"} == \
        {(("Table 1", "CIFAR-10 SLS", "CELM"), "CFFL")}
    claim, v, paper = _paper_margins("celm", "CELM beats CGSV ")
    assert len(paper) == 10 and paper["CIFAR-10 SLS"] == 38.38 and v.paper_verdict == "holds"  # 71.96 - 33.58
