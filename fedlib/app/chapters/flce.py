"""The FLCE chapter: class contribution momentum, its five ablations and nine baselines.

Experiments (FLCE §4), each a list of run configs sharing one protocol (paper: 50 clients,
10 per round, 1,000 rounds, ResNet-20, batch 64, lr 0.01, Dir(0.5)):
  table2  accuracy and macro-F1 of the ten methods, IID and Non-IID, per dataset  (Table 2)
          — their contributions also give Fig. 2 (KL to the data-size share), Fig. 3 (KL to
          the class-diversity share), Fig. 5 (class-level weights) and Fig. 8 (server time)
  table3  the ablations FLCE−M, −V, −Q, −CL (−CMC needs no run: it is FLCE's own run with the
          missing entries of X left at 0, since completion does not feed back into training),
          and our earlier simplifications: Eq. 4 without the self-pair (a run) and Eq. 11 on the
          class-summed matrix (FLCE's own run)
  fig4    the canonical (exact) Shapley value run, the reference of Fig. 4
  noise   feature noise, label noise and both (Figs. 6-7)
  fig9    FLCE under Dir(δ) for the sweep's δ (Fig. 9)
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import numpy as np

from ... import models
from ...config import RunConfig, make_config
from ...contributions import contribution_vector, flce_contributions, flce_tensor, similarity_contributions  # noqa: F401
from ...metrics import kl
from ...results import RunResult
from ...stats import mean_std, pm
from ..kit import frames
from ..kit.claim_types import Claim, Comparison, Side
from ..kit.sources import reference_value
from . import Paper, run_options, configs_of
from .base import Chapter, curve, dataset_label, queue_item
from .profiles import FederationProfile, Names, Seeds

METHOD_LABELS = {"fedavg": "FedAvg", "fedprox": "FedProx", "ditto": "Ditto", "fedfv": "FedFV", "cgsv": "CGSV",
                 "moon": "MOON", "qfedavg": "qFedAvg", "fedfa": "FedFa", "fedsv": "FedSV", "flce": "FLCE"}
VARIANTS: dict[str, dict[str, Any]] = {  # §4.4
    "FLCE": {}, "FLCE-M": {"mass": False}, "FLCE-V": {"velocity": False}, "FLCE-Q": {"momentum": False},
    "FLCE-CL": {"lam": 0.0}, "FLCE-CMC": {},  # −CMC: FLCE's run, contributions without completion
    # our earlier simplifications, beside the equations as printed (FLCE runs Eq. 4 and Eq. 11 as printed)
    "FLCE summed-CMC": {},  # FLCE's run, Eq. 11 on Σ_c X[t, k, c] instead of the client x class structure
    "FLCE simplified-CL": {"contrastive": "simplified"},  # Eq. 4 without the self-pair
}
# variants computed from FLCE's own run (completion does not feed back into training)
FROM_FLCE_RUN = {"FLCE-CMC": {"complete": False}, "FLCE summed-CMC": {"over": "summed"}}
SPLITS = {"IID": {"name": "iid"}, "Non-IID": None}  # Non-IID: Dir(alpha) from the parameters
NOISE = ("feature", "label", "both")


def split_spec(params: dict[str, Any], split: str, alpha: float | None = None) -> dict[str, Any]:
    if split == "IID":
        return {"name": "iid"}
    return {"name": "dirichlet", "alpha": float(alpha if alpha is not None else params["alpha"])}


def noise_spec(params: dict[str, Any], split: str, kind: str) -> dict[str, Any]:
    """The split with §4.7's noise on the first ``noisy_fraction`` of the clients."""
    noise = {f"{k}_noise": params[f"{k}_noise"] for k in ("feature", "label") if kind in (k, "both")}
    clients = list(range(int(round(params["noisy_fraction"] * params["n_clients"]))))
    return {**split_spec(params, split), **noise, "noisy_clients": clients}


def run_config(params: dict[str, Any], dataset: str, split: dict, method: str, seed: int,
               **method_params) -> RunConfig:
    spec = {"name": method, **params.get("method_params", {}).get(method, {}), **method_params}
    return make_config(
        dataset=dataset, model=params["model"], fraction=params["fraction"], n_clients=params["n_clients"],
        clients_per_round=params["clients_per_round"], rounds=params["rounds"], lr=params["lr"],
        batch_size=params["batch_size"], local_epochs=params["local_epochs"], test_samples=params["test_samples"],
        server_val=params["server_val"], split=split, method=spec, seed=seed, **run_options(params),
    )


def experiment_configs(params: dict[str, Any], experiment: str) -> list[RunConfig]:
    seeds, methods, datasets = params["seeds"], params["methods"], params["datasets"]
    if experiment == "table2":
        return [run_config(params, d, split_spec(params, s), m, seed) for d in datasets for s in SPLITS
                for m in methods for seed in seeds]
    if experiment == "table3":
        variants = [v for v in list(params["ablations"]) + list(params.get("simplifications", []))
                    if v not in FROM_FLCE_RUN]
        return [run_config(params, d, split_spec(params, s), "flce", seed, **VARIANTS[v]) for d in datasets
                for s in SPLITS for v in variants for seed in seeds]
    if experiment == "fig4":
        return [run_config(params, datasets[0], split_spec(params, "Non-IID"), "fedsv", seed, exact=True)
                for seed in seeds]
    if experiment == "noise":
        return [run_config(params, datasets[0], noise_spec(params, s, kind), m, seed) for kind in NOISE
                for s in params["noise_splits"] for m in params["noise_methods"] for seed in seeds]
    if experiment == "fig9":
        return [run_config(params, datasets[0], split_spec(params, "Non-IID", a), "flce", seed)
                for a in params["dirichlet_sweep"] for seed in seeds]
    raise ValueError(f"experiments: unknown experiment {experiment!r}")




# ----------------------------------------------------------------------------- contributions

contributions = contribution_vector  # the one rule (fedlib.contributions)


def variant_run(variant: str) -> str:
    """The variant whose run a Table 3 variant reads (FLCE's for those computed from it)."""
    return "FLCE" if variant in FROM_FLCE_RUN else variant


def data_share(result) -> np.ndarray:
    sizes = np.asarray(result.meta["client_sizes"], dtype=float)
    return sizes / sizes.sum()


def diversity_share(result) -> np.ndarray:
    """§4.5: data volume × (classes held / all classes), normalised."""
    counts = np.asarray(result.meta["client_class_counts"], dtype=float)
    quality = counts.sum(1) * (counts > 0).sum(1) / counts.shape[1]
    return quality / quality.sum()


def kl_to(result, share=data_share, contribute=contributions) -> float:
    """KL(contribute(result) ‖ share(result)) in nats (FLCE §4.1.3: P = contributions, Q = data quality)."""
    return float(kl(contribute(result), share(result)))


def last_rounds_mean(result, key: str, last: int) -> float:
    """Mean of a per-round metric over the last ``last`` evaluated rounds (%, the paper's 'average
    test performance of the global model over the last hundred rounds')."""
    values = [h[key] for h in result.history if h.get(key) is not None][-last:]
    return 100.0 * float(np.mean(values)) if values else float("nan")


# ----------------------------------------------------------------------------- Table 4


def communication_cost(feature_dim: int = 64) -> list[dict[str, Any]]:
    """Table 4 from our ResNet-20: parameters counted from the model, prototypes = C × 64.
    Ratio: prototypes / (model down + model up + prototypes), one client's traffic per round."""
    rows = []
    for label, shape, classes in (("CIFAR-10", (3, 32, 32), 10), ("CIFAR-100", (3, 32, 32), 100),
                                  ("EuroSAT", (3, 64, 64), 10)):
        model = models.build_model("resnet20", shape, classes)
        assert model.feature_dim == feature_dim
        params = sum(p.numel() for p in model.parameters())
        protos = classes * feature_dim
        rows.append({"Dataset": label, "Prototype": protos, "Model": params,
                     "Ratio": protos / (2 * params + protos)})
    return rows


# ----------------------------------------------------------------------------- the results queue


def runs(params: dict[str, Any]) -> list:
    """Every run of the profile for ``python -m fedlib results`` (fedlib.app.queue), labelled with
    the paper cell it backs; headline row: the first dataset's Non-IID split."""
    seeds, datasets, experiments, items = params["seeds"], params["datasets"], params["experiments"], []
    d0 = dataset_label(datasets[0])

    def item(table, row, column, config, rank=0, backs=(), headline=None):
        return queue_item("flce", params, table, row, column, config, headline=row == (headline or f"{d0} Non-IID"),
                          table_rank=rank, backs=tuple(backs))

    for d in datasets:
        label = dataset_label(d)
        for s in SPLITS:
            row, spec = f"{label} {s}", split_spec(params, s)
            if "table2" in experiments:
                for m in params["methods"]:
                    name = METHOD_LABELS[m]
                    backs = [("Table 2", row, f"{name} Acc"), ("Table 2", row, f"{name} F1")]
                    if m == "flce":  # FLCE's own run is Table 3's full model and its −CMC column
                        backs += [("Table 3", row, "FLCE"), ("Table 3", row, "FLCE-CMC"), ("Table 4", label, "*")]
                    items += [item("Table 2", row, name, run_config(params, d, spec, m, seed), backs=backs)
                              for seed in seeds]
            if "table3" in experiments:
                items += [item("Table 3", row, v, run_config(params, d, spec, "flce", seed, **VARIANTS[v]), 1)
                          for v in [*params["ablations"], *params.get("simplifications", [])] for seed in seeds]
    if "fig4" in experiments:
        items += [item("Fig. 4", f"{d0} Non-IID", "exact FedSV", c, 2) for c in experiment_configs(params, "fig4")]
    if "noise" in experiments:
        items += [item("§4.7 noise", f"{d0} {s} {kind} noise", METHOD_LABELS[m],
                       run_config(params, datasets[0], noise_spec(params, s, kind), m, seed), 2,
                       headline=f"{d0} Non-IID both noise")
                  for kind in NOISE for s in params["noise_splits"] for m in params["noise_methods"] for seed in seeds]
    if "fig9" in experiments:
        items += [item("Fig. 9", f"{d0} Dir({a:g})", "FLCE",
                       run_config(params, datasets[0], split_spec(params, "Non-IID", a), "flce", seed), 2,
                       backs=[("Fig. 9", f"{d0} Dir({a:g})", "*")])
                  for a in params["dirichlet_sweep"] for seed in seeds]
    return items


# ----------------------------------------------------------------------------- the page

TABLE4_FORMAT = {"Prototype": "{:,}", "Prototype (paper)": "{:,.0f}", "Model": "{:,}", "Model (paper)": "{:,.0f}",
                 "Ratio": "{:.6f}", "Ratio (paper)": "{:.6f}"}


class FLCE(Chapter):
    """The FLCE page: Tables 2-4, Figs. 2-9 and the closing note (figures on the first dataset run)."""

    name = "flce"
    labels = METHOD_LABELS

    def run(self, configs=None, stored_configs=None, quiet: bool = False) -> list:
        """The runs (``Chapter.run``), then where each dataset's data came from."""
        self.started = time.perf_counter()  # the page's wall time counts from its runs
        runs = super().run(configs, stored_configs, quiet)
        self.sources = {r.config["dataset"]: r.meta["dataset_source"] for r in self.runs}
        self.datasets_run = [d for d in self.params["datasets"] if d in self.sources]  # skipped: not in the data root
        if not quiet:
            print("\n".join(f"data {d}: {source}" for d, source in self.sources.items()))
        return runs

    def label(self, dataset: str) -> str:
        name = dataset_label(dataset)
        if dataset == "cifar10" and "JPEG" in self.sources.get(dataset, ""):
            name += " (JPEG copy)"
        if dataset == "fmnist":
            name += f" stand-in, {self.params['model']}"
        return name

    def run_of(self, dataset: str, split, method: str, seed: int | None = None, **method_params):
        """This build's run (default: the first seed); ``split``: 'IID', 'Non-IID' or a split spec."""
        spec = split_spec(self.params, split) if isinstance(split, str) else split
        seed = self.params["seeds"][0] if seed is None else seed
        return self.results[run_config(self.params, dataset, spec, method, seed, **method_params).key()]

    def mean(self, value, dataset: str, split, method: str, **method_params) -> float:
        """The mean over seeds of ``value(run)``."""
        return mean_std(value(self.run_of(dataset, split, method, s, **method_params))
                        for s in self.params["seeds"])[0]

    def accuracy(self, result) -> float:
        return last_rounds_mean(result, "accuracy", self.params["last_rounds"])

    def f1(self, result) -> float:
        return last_rounds_mean(result, "f1", self.params["last_rounds"])

    @staticmethod
    def paper_row(dataset: str, split: str) -> str:  # the paper's CIFAR-10 beside the Fashion-MNIST stand-in
        return f"{dataset_label(dataset) if dataset in ('cifar10', 'cifar100', 'eurosat') else 'CIFAR-10'} {split}"

    def paper(self, table: str, dataset: str, split: str, column: str) -> float:
        return reference_value(self.reference, table, self.paper_row(dataset, split), column)[0]

    def table2(self):
        """Table 2: accuracy and macro-F1 (%, last rounds, mean ± std over seeds) beside the paper's; FLCE's rank."""
        # lazy: pandas (book extra); the queue imports the chapters without it
        import pandas as pd

        methods, seeds, lines = self.params["methods"], self.params["seeds"], []
        for d in self.datasets_run:
            for split in SPLITS:
                for m in methods:
                    line = {"data": self.label(d), "split": split, "method": METHOD_LABELS[m]}
                    for metric, value in (("Acc", self.accuracy), ("F1", self.f1)):
                        ours = mean_std(value(self.run_of(d, split, m, s)) for s in seeds)
                        paper = self.paper("Table 2", d, split, f"{METHOD_LABELS[m]} {metric}")
                        line.update({f"{metric} ours": pm(*ours), f"{metric} paper": pm(paper, float("nan"))})
                    lines.append(line)
        d0 = self.datasets_run[0]
        rank = {s: sorted(methods, key=lambda m: -self.mean(self.accuracy, d0, s, m)).index("flce") + 1 for s in SPLITS}
        values = {"t2_rank_noniid": rank["Non-IID"], "t2_rank_iid": rank["IID"], "t2_n_methods": len(methods),
                  "t2_data": self.label(d0)}
        return pd.DataFrame(lines).set_index(["data", "split", "method"]), values

    def figs2_3(self):
        """Figs. 2-3: KL of each method's contributions to the data-size and class-diversity shares, and the table."""
        # lazy: pandas (book extra), matplotlib (~0.5 s); the queue imports the chapters without them
        import matplotlib.pyplot as plt
        import pandas as pd

        methods, columns = self.params["methods"], [METHOD_LABELS[m] for m in self.params["methods"]]
        shares = {"Fig. 2 (data size)": data_share, "Fig. 3 (class diversity)": diversity_share}
        kl = pd.DataFrame([{"data": self.label(d), "split": split, "figure": fig, "method": METHOD_LABELS[m],
                            "KL": self.mean(lambda r: kl_to(r, share), d, split, m)}
                           for d in self.datasets_run for split in SPLITS for m in methods
                           for fig, share in shares.items()])
        groups = kl.groupby(["data", "figure"])
        fig, axes = plt.subplots(1, len(groups), figsize=(6.2 * len(groups), 3.6), layout="constrained", squeeze=False)
        for ax, ((d, name), frame) in zip(axes[0], groups):
            frame.pivot(index="method", columns="split", values="KL").loc[columns].plot.bar(ax=ax, rot=45)
            ax.set(title=f"{name}, {d}", ylabel="KL(contribution ‖ quality)", xlabel="")
            ax.grid(axis="y", alpha=0.3)
        wide = kl.pivot_table(index=["data", "split", "figure"], columns="method", values="KL")[columns]
        first = wide.xs((self.label(self.datasets_run[0]), "Non-IID", "Fig. 2 (data size)"))
        values = {"f2_rank": int(first.rank().loc["FLCE"]), "f2_best": first.idxmin(),
                  "f2_flce": float(first.loc["FLCE"])}
        return fig, wide, values

    def table3(self):
        """Table 3: KL to the data-size share of FLCE, its ablations and our simplifications, paper vs ours."""
        # lazy: pandas (book extra); the queue imports the chapters without it
        import pandas as pd

        simplifications = list(self.params.get("simplifications", []))
        variants = ["FLCE"] + list(self.params["ablations"]) + ["FLCE-CMC"] + simplifications
        readers = {v: partial(flce_contributions, **FROM_FLCE_RUN[v]) if v in FROM_FLCE_RUN else contributions
                   for v in variants}  # −CMC and summed-CMC read FLCE's own run
        kl, lines = {}, []
        for d in self.datasets_run:
            for split in SPLITS:
                row = {"data": self.label(d), "split": split}
                paper = frames.paper_values(self.reference, "Table 3", self.paper_row(d, split), variants, str)
                kl.update({(d, split, v): self.mean(partial(kl_to, contribute=readers[v]), d, split, "flce",
                                                    **VARIANTS[variant_run(v)]) for v in variants})
                lines += [{**row, "source": "paper",
                           **{v: pm(p[0], float("nan"), digits=4) for v, p in paper.items()}},
                          {**row, "source": self.ours,
                           **{v: pm(kl[(d, split, v)], float("nan"), digits=4) for v in variants}}]
        flce = lambda key: kl[(*key[:2], "FLCE")]  # noqa: E731
        ablated = [(k, v) for k, v in kl.items() if k[2] != "FLCE" and k[2] not in simplifications]
        effects = []
        for name in simplifications:
            deltas = [v - flce(k) for k, v in kl.items() if k[2] == name]
            effects.append(f"{name}: KL {np.mean(deltas):+.4f} nats on average over {len(deltas)} setting(s) "
                           f"(from {min(deltas):+.4f} to {max(deltas):+.4f})" if deltas else f"{name}: not run")
        values = {"t3_worse": int(sum(v > flce(k) for k, v in ablated)), "t3_pairs": len(ablated),
                  "t3_simplifications": "; ".join(effects) if effects else "not run in this profile"}
        return pd.DataFrame(lines).set_index(["data", "split", "source"]), values

    def fig4(self):
        """Fig. 4: distance and KL of each method's contributions to the exact Shapley value, per checkpoint round."""
        # lazy: matplotlib (~0.5 s); the queue imports the chapters without it
        import matplotlib.pyplot as plt

        d0, methods = self.datasets_run[0], self.params["methods"]
        canonical = self.run_of(d0, "Non-IID", "fedsv", exact=True)
        runs = {m: self.run_of(d0, "Non-IID", m) for m in methods}
        rounds = len(canonical.history)
        checkpoints = sorted(set(np.linspace(1, rounds, min(rounds, 12)).round().astype(int)))
        distance, divergence = {m: [] for m in methods}, {m: [] for m in methods}
        for t in checkpoints:
            ref = np.clip(np.asarray(canonical.history[t - 1]["scores"], float), 0, None)
            ref = ref / ref.sum() if ref.sum() > 0 else np.full(len(ref), 1 / len(ref))
            for m in methods:
                c = contributions(runs[m], upto=t)
                distance[m].append(float(np.linalg.norm(c - ref)))
                divergence[m].append(float(kl(c + 1e-6, ref + 1e-6)))  # a client with no value yet has 0
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), layout="constrained")
        for m in methods:
            style = dict(lw=2.5, color="black") if m == "flce" else dict(lw=1)
            axes[0].plot(checkpoints, distance[m], label=METHOD_LABELS[m], **style)
            axes[1].plot(checkpoints, divergence[m], label=METHOD_LABELS[m], **style)
        axes[0].set(title="(a) Euclidean distance to canonical SV", xlabel="round", ylabel="distance")
        axes[1].set(title="(b) KL to canonical SV", xlabel="round", ylabel="KL")
        axes[1].legend(fontsize=8, ncol=2)
        ranked = sorted(methods, key=lambda m: distance[m][-1])
        return fig, {"f4_rank": ranked.index("flce") + 1, "f4_closest": METHOD_LABELS[ranked[0]]}

    def fig5(self):
        """Fig. 5: FLCE's class profiles (Σ_t Q[k, c] per client, CE-weighted globally) against the true shares."""
        # lazy: matplotlib (~0.5 s); the queue imports the chapters without it
        import matplotlib.pyplot as plt

        run = self.run_of(self.datasets_run[0], "Non-IID", "flce")
        q = np.asarray(run.history[-1]["diagnostics"]["class_momentum_sum"], dtype=float)
        counts = np.asarray(run.meta["client_class_counts"], dtype=float)
        profile, truth = (x / np.clip(x.sum(1, keepdims=True), 1e-12, None) for x in (q, counts))
        uniform, seen = 1 / counts.shape[1], q.sum(1) > 0
        fig, axes = plt.subplots(1, 5, figsize=(17, 3.2), layout="constrained")
        axes[0].plot(counts.sum(0) / counts.sum(), "r-", lw=2, label="ground truth")
        axes[0].plot(contributions(run) @ profile, "b-.", label="FLCE")
        axes[0].axhline(uniform, color="green", ls="--", label="baselines (uniform)")
        axes[0].set(title="(a) global", xlabel="class", ylabel="weight")
        axes[0].legend(fontsize=8)
        for ax, k in zip(axes[1:], np.flatnonzero(seen)[:4]):
            ax.plot(truth[k], "r-", lw=2)
            ax.plot(profile[k], "b-.")
            ax.axhline(uniform, color="green", ls="--")
            ax.set(title=f"(b) client {k}", xlabel="class")
        return fig, {"f5_flce": float(np.abs(profile[seen] - truth[seen]).sum(1).mean()),
                     "f5_uniform": float(np.abs(uniform - truth[seen]).sum(1).mean())}

    def figs6_7(self):
        """Figs. 6-7: accuracy per round and KL to the data-size share with noisy clients, and their table."""
        # lazy: pandas (book extra), matplotlib (~0.5 s); the queue imports the chapters without them
        import matplotlib.pyplot as plt
        import pandas as pd

        d0, splits, methods = self.datasets_run[0], self.params["noise_splits"], self.params["noise_methods"]
        fig, axes = plt.subplots(len(splits), 4, figsize=(17, 3.3 * len(splits)), layout="constrained", squeeze=False)
        lines = []
        for i, split in enumerate(splits):
            for j, kind in enumerate(NOISE):
                spec = noise_spec(self.params, split, kind)
                for m in methods:
                    axes[i, j].plot(*curve(self.run_of(d0, spec, m)), label=METHOD_LABELS[m],
                                    **(dict(lw=2.5, color="black") if m == "flce" else {}))
                    lines.append({"split": split, "noise": kind, "method": METHOD_LABELS[m],
                                  "final acc (%)": self.mean(self.accuracy, d0, spec, m),
                                  "KL": self.mean(kl_to, d0, spec, m)})
                axes[i, j].set(title=f"Fig. 6: {kind} noise, {split}", xlabel="round", ylabel="accuracy (%)")
            axes[i, 0].legend(fontsize=8)
            frame = pd.DataFrame([line for line in lines if line["split"] == split])
            frame.pivot(index="noise", columns="method", values="KL").plot.bar(ax=axes[i, 3], rot=0)
            axes[i, 3].set(title=f"Fig. 7: KL, {split}", ylabel="KL(contribution ‖ data share)")
        table = pd.DataFrame(lines).set_index(["split", "noise", "method"])
        scenarios = [table.xs((s, k), level=["split", "noise"]) for s in splits for k in NOISE]
        values = {"f6_best": int(sum(t["final acc (%)"].idxmax() == "FLCE" for t in scenarios)),
                  "f6_n": len(scenarios), "f7_best": int(sum(t["KL"].idxmin() == "FLCE" for t in scenarios))}
        return fig, table, values

    def table4(self):
        """Table 4: prototype and model sizes of our ResNet-20 beside the paper's (style: ``TABLE4_FORMAT``)."""
        # lazy: pandas (book extra); the queue imports the chapters without it
        import pandas as pd

        table = pd.DataFrame(communication_cost()).set_index("Dataset")
        for column in ("Prototype", "Model", "Ratio"):
            table[f"{column} (paper)"] = [reference_value(self.reference, "Table 4", d, column)[0]
                                     for d in table.index]
        match = all(table["Model"] == table["Model (paper)"]) and all(table["Prototype"] == table["Prototype (paper)"])
        return table[list(TABLE4_FORMAT)], {"t4_match": "match" if match else "do not match"}

    def fig8(self):
        """Fig. 8: mean server seconds per round under Non-IID."""
        # lazy: matplotlib (~0.5 s); the queue imports the chapters without it
        import matplotlib.pyplot as plt

        d0 = self.datasets_run[0]
        times = {METHOD_LABELS[m]: float(np.mean([h["time_server"] for h in self.run_of(d0, "Non-IID", m).history]))
                 for m in self.params["methods"]}
        fig, ax = plt.subplots(figsize=(8, 3.2), layout="constrained")
        ax.bar(list(times), list(times.values()), color=["black" if k == "FLCE" else "tab:blue" for k in times])
        ax.set(yscale="log", ylabel="server s / round",
               title=f"Fig. 8: server time per round ({self.label(d0)}, Non-IID)")
        plt.xticks(rotation=45)
        return fig, {"f8_flce": times["FLCE"], "f8_fedavg": times["FedAvg"], "f8_fedsv": times["FedSV"]}

    def fig9(self):
        """Fig. 9: FLCE's accuracy (last rounds) and KL under Dir(δ) for the sweep's δ, and IID as 'Max'."""
        # lazy: pandas (book extra), matplotlib (~0.5 s); the queue imports the chapters without them
        import matplotlib.pyplot as plt
        import pandas as pd

        d0 = self.datasets_run[0]
        settings = {str(a): split_spec(self.params, "Non-IID", a) for a in self.params["dirichlet_sweep"]}
        settings["Max (IID)"] = "IID"
        sweep = pd.DataFrame([{"δ": name, "accuracy (%)": self.mean(self.accuracy, d0, split, "flce"),
                               "KL": self.mean(kl_to, d0, split, "flce")}
                              for name, split in settings.items()]).set_index("δ")
        fig, ax = plt.subplots(figsize=(6, 3.2), layout="constrained")
        ax.plot(sweep.index, sweep["accuracy (%)"], "o-", color="tab:blue")
        ax.set(ylabel="accuracy (%)", xlabel="Dirichlet δ", title="Fig. 9: FLCE vs heterogeneity")
        ax2 = ax.twinx()
        ax2.plot(sweep.index, sweep["KL"], "s--", color="tab:red")
        ax2.set_ylabel("KL", color="tab:red")
        low, high = sweep.iloc[0], sweep.iloc[-1]
        return fig, sweep, {"f9_acc_low": float(low["accuracy (%)"]), "f9_acc_max": float(high["accuracy (%)"]),
                            "f9_kl_low": float(low["KL"]), "f9_kl_max": float(high["KL"]), "f9_low": str(low.name)}

    def closing(self):
        """Accuracy, F1 (last rounds, %) and KL of the closing note's methods, Non-IID, first dataset."""
        # lazy: pandas (book extra); the queue imports the chapters without it
        import pandas as pd

        d0 = self.datasets_run[0]
        return pd.DataFrame([{"method": METHOD_LABELS[m], "accuracy (%)": self.mean(self.accuracy, d0, "Non-IID", m),
                              "F1 (%)": self.mean(self.f1, d0, "Non-IID", m), "KL": self.mean(kl_to, d0, "Non-IID", m),
                              "paper acc (CIFAR-10)": self.paper("Table 2", d0, "Non-IID", f"{METHOD_LABELS[m]} Acc")}
                             for m in ("fedavg", "cgsv", "fedsv", "flce") if m in self.params["methods"]]
                            ).set_index("method")

    def wall_times(self) -> dict[str, float]:
        """The page's wall time so far and its runs' compute time (printed)."""
        page, runs = time.perf_counter() - self.started, sum(r.meta["wall_time"] for r in self.runs)
        print(f"profile {self.profile}: this page took {page:.0f} s to execute ({runs:.0f} s of run compute "
              "when first computed)")
        return {"wall_page": page, "wall_runs": runs}

    def headlines(self, closing):
        """The page's headline claims for the book's front page (from the closing table)."""
        d0 = self.datasets_run[0]
        claims = [("FLCE accuracy", "Table 2", "FLCE Acc", "accuracy (%)", 2, "%"),
                  ("FLCE KL to data share", "Table 3", "FLCE", "KL", 4, "nats")]
        return self.record_headlines([
            {"claim": f"{claim}, {self.label(d0)} Non-IID ({table})", "paper": self.paper(table, d0, "Non-IID", column),
             "ours": round(float(closing.loc["FLCE", ours]), digits), "unit": unit}
            for claim, table, column, ours, digits, unit in claims])


# ----------------------------------------------------------------------------- the declaration


class FLCEProfile(FederationProfile):
    datasets: Names
    model: str
    clients_per_round: int
    server_val: int
    alpha: float  # Dir(alpha) of the Non-IID split
    last_rounds: int  # Table 2 reads the mean over the last rounds
    methods: Names
    ablations: list[str]
    simplifications: list[str]
    method_params: dict[str, dict[str, Any]]  # method -> hyper-parameters over its defaults
    experiments: Names
    noise_methods: list[str]
    noise_splits: list[str]
    noisy_fraction: float
    feature_noise: float
    label_noise: float
    dirichlet_sweep: list[float]


def last_100_accuracy(result: dict) -> float:
    """A stored run's mean accuracy (%) over its last 100 rounds: the claims' reading of Table 2."""
    return last_rounds_mean(RunResult.from_dict(result), "accuracy", 100)


CLAIMS = (
    Claim("FLCE is more accurate than FedAvg on CIFAR-10 (IID and Non-IID)", "Table 2",
          "table-2-accuracy-and-f1-fidelity",
          tuple(Comparison(row, Side(("Table 2", row, "FLCE"), "last_100_accuracy", ref=("Table 2", row, "FLCE Acc")),
                           Side(("Table 2", row, "FedAvg"), "last_100_accuracy", ref=("Table 2", row, "FedAvg Acc")))
                for row in ("CIFAR-10 Non-IID", "CIFAR-10 IID"))),
)

PAPER = Paper("flce", "FLCE", FLCEProfile, runs, reference="flce", claims=CLAIMS,
              metrics={"last_100_accuracy": last_100_accuracy}, rank=2)


configs = partial(configs_of, runs)  # every run once, in the order of the first cell naming it
