"""FedMS issue 30, point 1: FedAvg under readings of §5.1 (run readings x score readings), the
queue-able configs and the calibration rule, on hand-made histories."""

import numpy as np
import pytest

from fedlib.book import load_profile, load_reference
from fedlib.chapters import fedms
from fedlib.run import RunResult


@pytest.fixture(scope="module")
def params():
    return {**load_profile("fedms", "paper"), "splits": ["Dir(10)", "Dir(1)", "Dir(0.1)"]}


def _run(accuracies):
    return RunResult(config={}, history=[{"round": t, "accuracy": a} for t, a in enumerate(accuracies)],
                     final={"accuracy": accuracies[-1]}, meta={})


def test_reading_configs_change_only_what_their_reading_names(params):
    rows = fedms.maverick_reading_configs(params)
    assert len(rows) == 3 * len(fedms.MAVERICK_RUN_READINGS) and len({c.key() for *_, c in rows}) == len(rows)
    by = {(s, r): c for s, r, c in rows}
    table1 = fedms.run_config(params, "Dir(10)", "fedavg", params["seeds"][0])
    assert by[("Dir(10)", "n_i weights, validation held out of training")].key() == table1.key()
    uniform = by[("Dir(10)", "uniform weights, validation held out of training")]
    assert uniform.method.name == "fedavg_uniform" and uniform.server_val == 2000 and uniform.test_samples is None
    test = by[("Dir(10)", "n_i weights, validation from the test set")]
    assert (test.method.name, test.server_val, test.test_samples) == ("fedavg", None, 8000)  # 80 % of 10,000
    assert test.resolved()["server_val"] == 0  # FedAvg trains on all 60,000 images
    keep = {k: v for k, v in table1.resolved().items() if k not in ("server_val", "test_samples", "method")}
    assert {k: v for k, v in test.resolved().items() if k in keep} == keep
    items = fedms.maverick_reading_items(params)
    assert [i.key for i in items] == [c.key() for *_, c in rows]
    assert sum(i.headline for i in items) == 1 and {i.table for i in items} == {"Maverick readings"}


def test_reading_score_by_hand():
    run = _run([0.5, 0.6, 0.7, 0.8])
    assert fedms.reading_score(run, 1) == pytest.approx(80.0)
    assert fedms.reading_score(run, 2) == pytest.approx(75.0)
    assert fedms.reading_score(run, None) == pytest.approx(65.0)


def test_calibration_picks_the_smallest_mean_gap_by_hand(params):
    """Paper FedAvg: 79.13 / 79.00 / 74.55. Reading 1 (Table 1's FedAvg) ends at 96 % after 90 % rounds:
    last round gaps 16.87 + 17.00 + 21.45 -> mean 18.44; reading 2 (uniform) sits at 80 % in every round:
    gaps 0.87, 1.00, 5.45 -> mean 2.44 for every score reading; the first of its ties (last round) wins."""
    rows = fedms.maverick_reading_configs(params)
    results = {}
    for split, reading, config in rows:
        if reading == "n_i weights, validation held out of training":
            results[config.key()] = _run([0.9] * 9 + [0.96])
        elif reading == "uniform weights, validation held out of training":
            results[config.key()] = _run([0.8] * 10)
    frame, chosen = fedms.calibrate_maverick_readings(params, results, load_reference("fedms"))
    first = frame.loc[("n_i weights, validation held out of training", "last round")]
    assert first["mean |ours − paper|"] == pytest.approx((16.87 + 17.0 + 21.45) / 3)
    assert first["mean |ours − paper|"] == pytest.approx(18.44)
    assert frame.loc[("n_i weights, validation held out of training", "mean of the last 10 rounds"),
                     "Dir(10) ours"] == pytest.approx(90.6)
    uniform = frame.loc["uniform weights, validation held out of training"]
    assert uniform["mean |ours − paper|"].tolist() == pytest.approx([(0.87 + 1.0 + 5.45) / 3] * 3)
    assert uniform["Dir(10) within 3 points"].all() and not first["Dir(10) within 3 points"]
    assert chosen == ("uniform weights, validation held out of training", "last round")
    assert np.isnan(frame.loc[("n_i weights, validation from the test set", "last round"), "mean |ours − paper|"])
    _, none = fedms.calibrate_maverick_readings(params, {}, load_reference("fedms"))
    assert none is None
