"""The baseline chapter: FedAvg under CELM's label-skew splits on Fashion-MNIST.

Reproduces the FedAvg column of CELM Table 1 (F.MNIST rows; CELM reports FedAvg with
uniform weights) and adds sample-count FedAvg beside it. Protocol (CELM §5): 5 clients,
the 4-layer MLP, 1 local epoch, batch 128, SGD lr 0.1 decayed x0.1 after half the rounds,
100 rounds, 3 seeds.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..config import RunConfig, make_config
from . import run_options

# split label -> (split spec, CELM Table 1 row)
SPLITS: dict[str, tuple[dict[str, Any], str]] = {
    "Dir(0.01)": ({"name": "dirichlet", "alpha": 0.01}, "F.MNIST Dir. (0.01)"),
    "Dir(0.05)": ({"name": "dirichlet", "alpha": 0.05}, "F.MNIST Dir. (0.05)"),
    "Dir(0.10)": ({"name": "dirichlet", "alpha": 0.1}, "F.MNIST Dir. (0.10)"),
    "PLS": ({"name": "pls"}, "F.MNIST PLS"),
    "SLS": ({"name": "sls"}, "F.MNIST SLS"),
}
METHOD_LABELS = {"fedavg_uniform": "FedAvg (uniform)", "fedavg": "FedAvg (sample count)"}
PAPER_METHOD = "fedavg_uniform"  # CELM's FedAvg column uses uniform weights


def config(params: dict[str, Any], split: str, method: str, seed: int) -> RunConfig:
    if split not in SPLITS:
        raise ValueError(f"splits: unknown split {split!r}; known: {', '.join(SPLITS)}")
    return make_config(
        dataset=params["dataset"], model="mlp", n_clients=params["n_clients"], rounds=params["rounds"],
        lr=params["lr"], lr_milestones=params["lr_milestones"], batch_size=params["batch_size"],
        local_epochs=params["local_epochs"], fraction=params["fraction"], test_samples=params["test_samples"],
        split=SPLITS[split][0], method=method, seed=seed, **run_options(params),
    )


def configs(params: dict[str, Any]) -> list[RunConfig]:
    """Every run of the chapter: splits x methods x seeds."""
    return [config(params, s, m, seed) for s in params["splits"] for m in params["methods"]
            for seed in params["seeds"]]


def final_accuracy(results: dict[str, Any], params, split: str, method: str) -> list[float]:
    """Final test accuracies (%) over seeds, for the runs present in ``results`` (key -> RunResult)."""
    out = []
    for seed in params["seeds"]:
        r = results.get(config(params, split, method, seed).key())
        if r is not None:
            out.append(100.0 * r.final["accuracy"])
    return out


def split_summary(results_by_key: dict[str, Any], params):
    """Client sizes and classes held per client for each split (first seed), from the runs."""
    import pandas as pd

    rows = []
    for split in params["splits"]:
        r = results_by_key[config(params, split, params["methods"][0], params["seeds"][0]).key()]
        counts = np.asarray(r.meta["client_class_counts"])
        rows.append({"split": split, "samples per client": ", ".join(str(int(v)) for v in counts.sum(1)),
                     "classes per client": ", ".join(str(int(v)) for v in (counts > 0).sum(1))})
    return pd.DataFrame(rows).set_index("split")


def queue_items(params: dict[str, Any]) -> list:
    """Every run of the profile for ``python -m fedlib results`` (fedlib.queue): CELM Table 1's
    FedAvg column and sample-count FedAvg beside it; headline row Dir(0.05)."""
    from ..queue import QueueItem, run_round

    return [QueueItem("fedavg", "Table 1 (FedAvg)", SPLITS[s][1], METHOD_LABELS[m], seed, config(params, s, m, seed),
                      run_round, headline=s == "Dir(0.05)", first_seed=seed == params["seeds"][0])
            for s in params["splits"] for m in params["methods"] for seed in params["seeds"]]
