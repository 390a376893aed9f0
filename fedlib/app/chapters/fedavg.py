"""The baseline chapter: FedAvg under CELM's label-skew splits on Fashion-MNIST.

Sets the FedAvg column of CELM Table 1 (F.MNIST rows; CELM reports FedAvg with uniform
weights) beside ours and adds sample-count FedAvg. Protocol (CELM §5): 5 clients, the
4-layer MLP, 1 local epoch, batch 128, SGD lr 0.1 decayed x0.1 after half the rounds, 100
rounds, 3 seeds.

One number per paper cell: the paper's cell is read, as on the CELM page and the status page,
from the CELM protocol's stored runs (``fedlib.app.kit.stored.evidence_of``: update clipping off).
This page's own runs keep the engine's defenses (the profile's ``update_clip``, default on): they
are labelled as this page's protocol, never as the paper's cell.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from ... import stats
from ...config import RunConfig
from ...stats import pm
from ..kit import frames
from ..kit.sources import reference_value
from ..kit.stored import evidence_of
from . import ENGINE_DEFAULT_CLIP, Paper, configs_of, profiles, record
from .celm import protocol as celm_protocol
from .base import Chapter, queue_item
from .profiles import FederationProfile, Names, Seeds

# split label -> (split spec, CELM Table 1 row): CELM's label-skew splits
SPLITS = {split: (spec, f"F.MNIST {row}") for split, (spec, row) in celm_protocol.SPLITS.items() if split != "IID"}
METHOD_LABELS = {"fedavg_uniform": "FedAvg (uniform)", "fedavg": "FedAvg (sample count)"}
PAPER_METHOD = "fedavg_uniform"  # CELM's FedAvg column uses uniform weights
CELM_PROTOCOL = "CELM protocol (stored; clipping off)"  # the paper cell's runs, shared with the CELM page


def own_protocol(params: dict[str, Any]) -> str:
    """The label of this page's runs: its own protocol, named by its update clipping."""
    clip = params.get("update_clip", ENGINE_DEFAULT_CLIP)
    return f"this page's protocol ({'clipping off' if clip is None else f'update clipping {clip:g}×'})"


def config(params: dict[str, Any], split: str, method: str, seed: int) -> RunConfig:
    if split not in SPLITS:
        raise ValueError(f"splits: unknown split {split!r}; known: {', '.join(SPLITS)}")
    return celm_protocol.run_config({**params, "model": "mlp"}, SPLITS[split][0], method, seed)  # CELM's protocol


def runs(params: dict[str, Any]) -> list:
    """Every run of the profile for ``python -m fedlib results`` (fedlib.app.queue): CELM Table 1's
    FedAvg column and sample-count FedAvg beside it; headline row Dir(0.05)."""
    return [queue_item("fedavg", params, "Table 1 (FedAvg)", SPLITS[s][1], METHOD_LABELS[m], config(params, s, m, seed),
                       headline=s == "Dir(0.05)")
            for s in params["splits"] for m in params["methods"] for seed in params["seeds"]]


class FedAvg(Chapter):
    """The page: the splits, CELM Table 1's FedAvg column beside ours, the training curves."""

    name = "fedavg"
    labels = METHOD_LABELS

    def run(self) -> list:
        """This build's runs and the stored paper-profile runs (their provenance is printed below the table)."""
        runs = super().run(quiet=True)
        wall = sum(r.meta["wall_time"] for r in runs)
        print(f"{len(runs)} runs; {wall:.0f} s of training when first computed (device: {runs[0].meta['device']})")
        return runs

    def _grid(self, height: float, **kwargs):
        """A figure with one axis per split, three to a row, and its (axis, split) pairs."""
        # lazy: matplotlib (~0.5 s); the queue imports the chapters without it
        import matplotlib.pyplot as plt

        p = self.params
        columns = min(3, len(p["splits"]))
        rows = -(-len(p["splits"]) // columns)
        fig, axes = plt.subplots(rows, columns, figsize=(4.4 * columns, height * rows), squeeze=False, **kwargs)
        for ax in axes.flat[len(p["splits"]):]:
            ax.remove()
        return fig, zip(axes.flat, p["splits"])

    def split_figure(self):
        """Bubble plots of each split's client x class counts (first seed), and each client's samples and classes."""
        # lazy: pandas (book extra); the queue imports the chapters without it
        import pandas as pd

        # lazy: fedlib.plots (matplotlib, ~0.5 s); the queue imports the chapters without it
        from ...plots import bubble_plot

        fig, axes = self._grid(4.6)
        rows = []
        for ax, split in axes:
            run = self.result(config(self.params, split, self.params["methods"][0], self.params["seeds"][0]))
            counts = np.asarray(run.meta["client_class_counts"])
            bubble_plot(counts, ax=ax, title=split)
            rows.append({"split": split, "samples per client": ", ".join(str(int(v)) for v in counts.sum(1)),
                         "classes per client": ", ".join(str(int(v)) for v in (counts > 0).sum(1))})
        return fig, pd.DataFrame(rows).set_index("split")

    def celm_protocol(self) -> dict[str, stats.SeedSpread]:
        """CELM Table 1's FedAvg cell per split from the CELM protocol's stored runs (the runs the CELM
        page and the status page read), by seed."""
        evidence = evidence_of(record("celm").runs(profiles.load("celm", "paper")))
        return {split: stats.SeedSpread.of({s: 100.0 * r["final"]["accuracy"] for s, r in
                                            evidence.get(("Table 1", SPLITS[split][1], "FedAvg"), {}).items()})
                for split in self.params["splits"]}

    def table1(self):
        """Final accuracy per split, mean ± sample std (seeds): CELM Table 1's FedAvg, the same cell from the
        CELM protocol's stored runs (whether it reproduces the paper, ``stats.reproduces``), and this page's
        own runs (this build and the stored ones), labelled with this page's protocol; the headline
        claims and the numbers the verdict quotes."""
        # lazy: pandas (book extra); the queue imports the chapters without it
        import pandas as pd

        methods, own = self.params["methods"], own_protocol(self.params)
        celm_cells = self.celm_protocol()
        rows, claims, sample_count_better, judged, within = [], [], 0, 0, 0
        for split in self.params["splits"]:
            paper, paper_std = reference_value(self.reference, "Table 1", SPLITS[split][1], "FedAvg")
            cell = celm_cells[split]
            sources = self.sources(lambda p, split=split: {m: [config(p, split, m, s) for s in p["seeds"]]
                                                           for m in methods})
            ours = sources[self.ours]
            ours_columns = {f"{own}, {src}: {METHOD_LABELS[m]}": pm(*sources[src][m])
                            for m in methods for src in sources}
            verdict = stats.reproduction_text(list(cell.by_seed.values()), paper, paper_std)
            rows.append({"split": split, "paper: FedAvg (uniform)": pm(paper, paper_std),
                         f"{CELM_PROTOCOL}: FedAvg (uniform)": pm(*cell), "reproduces the paper": verdict,
                         **ours_columns})
            if cell.n:
                judged += 1
                within += bool(stats.reproduces(list(cell.by_seed.values()), paper, paper_std))
                claims.append({"claim": f"FedAvg (uniform) accuracy, F.MNIST {split} (CELM Table 1, CELM protocol)",
                               "paper": paper, "ours": round(cell.mean, 2), "unit": "%"})
            pair = {m: ours[m] for m in ("fedavg", PAPER_METHOD) if m in ours}
            sample_count_better += len(pair) == 2 and frames.best_on_shared_seeds(pair) == {"fedavg"}
        gaps = np.asarray([celm_cells[s].mean - reference_value(self.reference, "Table 1", SPLITS[s][1],
                                                                 "FedAvg")[0]
                           for s in self.params["splits"] if celm_cells[s].n])
        values = {"n_splits": len(self.params["splits"]), "n_judged": judged, "n_within": within,
                  "mean_gap": float(gaps.mean()) if gaps.size else float("nan"),
                  "worst_gap": float(gaps[np.argmax(np.abs(gaps))]) if gaps.size else float("nan"),
                  "min_seeds": min((c.n for c in celm_cells.values() if c.n), default=0),
                  "n_sample_count_better": int(sample_count_better), "own_protocol": own}
        return pd.DataFrame(rows).set_index("split"), claims, values

    def curves(self):
        """Test accuracy after every round, one axis per split (first seed)."""
        # lazy: fedlib.plots (matplotlib, ~0.5 s); the queue imports the chapters without it
        from ...plots import accuracy_curves

        fig, axes = self._grid(3.4, layout="constrained")
        for ax, split in axes:
            accuracy_curves({METHOD_LABELS[m]: self.result(config(self.params, split, m, self.params["seeds"][0]))
                             for m in self.params["methods"]}, ax=ax)
            ax.set_title(split)
        return fig


# ----------------------------------------------------------------------------- the declaration


class FedAvgProfile(FederationProfile):
    dataset: str
    lr_milestones: list[int]
    splits: Names  # CELM's label-skew splits (SPLITS)
    methods: Names


# the page compares with CELM Table 1's FedAvg column
PAPER = Paper("fedavg", "FedAvg", FedAvgProfile, runs, reference="celm", ours=True, rank=0)


configs = partial(configs_of, runs)  # every run once, in the order of the first cell naming it
