"""The CELM page: Tables 1-8, Figs. 4-7, the readings and CFFL studies, and the "Baselines" paragraph."""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Any

import numpy as np

from ....data import data_missing
from ....methods import build_method
from ....metrics import (
    detection_summary,
    emd_1d,
    hellinger,
    joint_distances,
    js_distance,
    jsd,
    kl,
)
from ....stats import mean_std, pm
from ...kit import frames
from ...kit.pages import PROSE_SYMBOLS
from ...kit.sources import reference_value
from ...kit.stored import stored_results
from ...kit.tables import Table
from .. import precisions, readings, resolved_methods
from ..base import OURS_STORED, Chapter, dataset_label
from .analysis import (
    CLASS_SIZES,
    DIAGNOSED,
    PLS_MATCHES,
    TABLE4_ROWS,
    best_counts,
    calibrate_maverick_readings,
    cffl_study_frame,
    choose_pls_allocation,
    diagnose_baseline,
    pls_class_count_search,
    split_counts,
)
from .protocol import (
    DETECTORS,
    METHOD_LABELS,
    PLS_ALLOCATION,
    SPLITS,
    TABLE7_DATASET,
    TABLE7_PREFIX,
    cffl_study_configs,
    cifar10_reading_configs,
    detection_splits,
    experiment_configs,
    fidelity,
    free_riders,
    last_evidence,
    maverick_classes,
    maverick_reading_configs,
    precision_screen_configs,
    rare_class_accuracy,
    run_config,
    score_history,
    table2_reading,
    table2_split,
    table7_configs,
    table7_split,
)


def method_configs(spec, methods, **options):
    """``make_configs`` for ``Chapter.sources``: each method's seeds' runs of one split (``options``
    go to ``run_config``; ``spec`` or an option that is callable is read from the profile's parameters)."""
    def make(p):
        kw = {k: v(p) if callable(v) else v for k, v in options.items()}
        split = spec(p) if callable(spec) else spec
        return {m: [run_config(p, split, m, s, **kw) for s in p["seeds"]] for m in methods}

    return make


class CELM(Chapter):
    """The CELM page: Tables 1-8, Figs. 4-7 and why a baseline falls short of FedAvg."""

    name = "celm"
    labels = METHOD_LABELS

    @property
    def prefix(self) -> str:
        """The dataset's name in the paper's table rows."""
        return dataset_label(self.params["dataset"])

    def split_rows(self, table: str, splits, prefix: str | None = None, label: str = "{split}", **options):
        """(label, paper, ours) per split of a paper-vs-ours accuracy table (``options``: ``method_configs``')."""
        methods = self.params["methods"]
        prefix = prefix or self.prefix
        return [(label.format(split=split), self.paper_values(table, f"{prefix} {SPLITS[split][1]}", methods),
                 self.sources(method_configs(SPLITS[split][0], methods, **options))) for split in splits]

    def table1(self) -> Table:
        """Table 1 on the profile's dataset: the styled frame, the numbers the text quotes, its rows (``data``:
        the headlines')."""
        rows = self.split_rows("Table 1", self.params["splits"])
        best_ours, best_paper, n_rows = best_counts(rows, self.ours)
        gain = [o[self.ours]["celm"][0] - o[self.ours]["fedavg_uniform"][0] for _, _, o in rows]
        return Table(self.styled(rows), {"t1_best_ours": best_ours, "t1_best_paper": best_paper, "t1_rows": n_rows,
                                         "t1_gain": float(np.nanmean(gain))}, data=rows)

    def shortfalls(self, threshold: float = 10.0) -> list:
        """A paragraph and a table (``diagnose_baseline``) per baseline run ``threshold`` points below FedAvg."""
        # lazy: IPython (book extra); the queue imports the chapters without it
        from IPython.display import Markdown

        source, results, params = self.by_source()[-1]  # the stored paper-profile runs when there are any
        out = []
        for cifar10, split, seed in itertools.product((False, True), params["splits"], params["seeds"]):
            spec, data = SPLITS[split][0], "CIFAR-10 " if cifar10 else ""
            base = results.get(run_config(params, spec, "fedavg_uniform", seed, cifar10=cifar10).key())
            for method in DIAGNOSED:
                run = results.get(run_config(params, spec, method, seed, cifar10=cifar10).key())
                if base is None or run is None or method not in params["methods"]:
                    continue
                acc, ref = 100 * run.final["accuracy"], 100 * base.final["accuracy"]
                if ref - acc > threshold:
                    text, table = diagnose_baseline(run, method)
                    out += [Markdown(f"**{METHOD_LABELS[method]}, {data}{split}, seed {seed}** ({source}): "
                                     f"{acc:.2f} % against uniform FedAvg's {ref:.2f} %. {text}"), table]
        return out or [Markdown(f"No baseline ends more than {threshold:g} points below uniform FedAvg in these runs "
                                f"({source}).")]

    def cifar10_readings(self) -> Table:
        """Uniform FedAvg's CIFAR-10 Table 1 cells under every reading of the CIFAR-10 recipe
        (``fedlib.app.chapters.readings``; issue 30), from the stored paper-profile runs of seed 0, against the
        paper, and the reading the rule picks. No frame (a note) while no reading has a stored run."""
        params = self.paper_params
        rows = cifar10_reading_configs(params)
        stored = stored_results(self.name, [c for *_, c in rows]).results

        def paper_of(split):
            return frames.paper_values(self.reference, "Table 1", f"CIFAR-10 {SPLITS[split][1]}", ["fedavg_uniform"],
                                       METHOD_LABELS.get)["fedavg_uniform"][0]

        frame, chosen = readings.calibrate(rows, stored, paper_of)
        shown, values = readings.page(frame, chosen, sum(c.key() in stored for *_, c in rows), len(rows),
                                      params=params, profile_file="params/celm/paper.yaml")
        return Table.formatted(shown, values, "No stored FedAvg run of any CIFAR-10 reading yet (python -m fedlib "
                                              "results --chapter celm --table 'CIFAR-10 readings').", precision=2)

    def maverick_readings(self) -> Table:
        """Uniform FedAvg's Table 2 cells (balanced and rare-class accuracy) under every reading of §6.1's
        Maverick split, from the stored paper-profile runs of seed 0, against the paper, and the reading the
        rule picks (``calibrate_maverick_readings``). No frame (a note) while no reading has a stored run."""
        rows = maverick_reading_configs(self.paper_params)
        stored = stored_results(self.name, [c for _, c in rows]).results
        paper = {metric: frames.paper_values(self.reference, "Table 2", f"F.MNIST {metric}", ["fedavg_uniform"],
                                             METHOD_LABELS.get)["fedavg_uniform"][0]
                 for metric in ("Balanced Acc.", "Rare Class Acc.")}
        frame, chosen = calibrate_maverick_readings(rows, stored, paper)
        shown, values = readings.page(frame, chosen, sum(c.key() in stored for _, c in rows), len(rows), prefix="mr")
        permitted = frame[frame["keeps its classes rare"]].dropna(subset=["mean |ours − paper|"])
        rare_gap = (permitted["Rare Class Acc. ours"] - paper["Rare Class Acc."]).abs()
        values["mr_reproduces"] = (
            "No permitted reading is measured yet." if permitted.empty else
            f"Uniform FedAvg's rare-class accuracy reproduces (within 2 points of the paper's "
            f"{paper['Rare Class Acc.']:.2f}) under: {', '.join(rare_gap.index[rare_gap <= 2])}." if (rare_gap <= 2).any()
            else f"No permitted reading brings uniform FedAvg's rare-class accuracy within 2 points of the paper's "
                 f"{paper['Rare Class Acc.']:.2f}: the closest, {rare_gap.idxmin()}, is "
                 f"{permitted.loc[rare_gap.idxmin(), 'Rare Class Acc. ours']:.2f}, {rare_gap.min():.2f} points away. "
                 f"That cell does not reproduce under any reading the text permits.")
        used = table2_reading(self.paper_params)
        values["mr_protocol"] = (f"the paper profile's Table 2 uses it (`table2_reading` in params/celm/paper.yaml)"
                                 if used == chosen else f"the paper profile's Table 2 still uses “{used}”")
        return Table.formatted(shown, values, "No stored FedAvg run of any Maverick reading yet (python -m fedlib "
                                              "results --chapter celm --table 'Maverick readings').", precision=2)

    def precision_screen(self) -> Table:
        """The precision screen (issue 45): uniform FedAvg on CIFAR-10 Dir(0.05) in float32 and in bfloat16 local
        training, paired by seed, from the stored paper-profile runs; the rule's choice beside the profile's
        (glue values ``ps_*``). No frame (a note) while no seed is paired."""
        rows = precision_screen_configs(self.paper_params)
        stored = stored_results(self.name, [c for _, c in rows]).results
        return precisions.page(self.name, rows, stored, self.paper_params)

    def table1_cifar10(self) -> Table:
        """Table 1's CIFAR-10 rows (this build's, and the stored paper-profile runs' where there are any):
        the styled frame (None: not run), the numbers, a note (the data, or why there are no rows)."""
        source = self.data_source("cifar10")
        if not source:
            return Table(None, {"t1c_best": 0, "t1c_paper": 0, "t1c_n": 0},
                         note="No CIFAR-10 data under the data root and no stored CIFAR-10 runs: these rows were not run.")
        name = "CIFAR-10 (JPEG copy)" if "JPEG" in source else "CIFAR-10"
        splits = list(dict.fromkeys(split for _, _, params in self.by_source() for split in params["splits"]))
        rows = self.measured(self.split_rows("Table 1", splits, "CIFAR-10", name + " {split}", cifar10=True))
        best, paper, n = best_counts(rows, self.ours)
        precision = precisions.in_force(self.params)
        return Table(self.styled(rows), {"t1c_best": best, "t1c_paper": paper, "t1c_n": n},
                     note=f"data: {source}; local training in {precision} (the precision screen's choice)")

    def table1_cifar10_earlier(self) -> Table:
        """Table 1's CIFAR-10 rows from the stored runs of the original recipe, once the paper profile has
        adopted another (``cifar10_reading``): stale, shown apart under their recipe. No frame otherwise."""
        earlier, values = readings.earlier_recipe(self.paper_params)
        if earlier is None or not self.data_source("cifar10"):
            return readings.earlier_table(None, values)
        methods = earlier["methods"]
        made = {split: method_configs(SPLITS[split][0], methods, cifar10=True)(earlier) for split in earlier["splits"]}
        stored = stored_results(self.name, [c for by in made.values() for cs in by.values() for c in cs]).results
        rows = self.measured([(f"CIFAR-10 {split}", self.paper_values("Table 1", f"CIFAR-10 {SPLITS[split][1]}", methods),
                               {f"{OURS_STORED}, earlier recipe (stale)": frames.seed_mean_std(stored, by)})
                              for split, by in made.items()])
        values["t1c_earlier_n"] = len(stored)
        return readings.earlier_table(self.comparison(rows) if rows else None, values)

    def table7(self) -> Table:
        """Table 7, EMNIST (47 classes): the paper's five splits, ours beside them from this build's and the stored
        paper-profile runs where there are any (styled frame, numbers, note); the note says what the rows need
        when no EMNIST run exists: the data (absent here) and the command that makes them."""
        methods = self.params["methods"]
        splits = list(dict.fromkeys(split for _, _, params in self.by_source() for split in params["splits"]))
        rows = [(f"{TABLE7_PREFIX} {split}",
                 self.paper_values("Table 7", f"{TABLE7_PREFIX} {SPLITS[split][1]}", methods),
                 self.sources(method_configs(table7_split(split), methods, dataset=TABLE7_DATASET)))
                for split in splits]
        measured = self.measured(rows)
        best, paper, n = best_counts(measured, self.ours) if measured else (0, 0, 0)
        values = {"t7_best": best, "t7_paper": paper, "t7_n": n}
        source = self.data_source(TABLE7_DATASET)
        if measured:
            return Table(self.styled(measured), values, note=f"data: {source}")
        missing = data_missing(TABLE7_DATASET)
        runs = len(table7_configs(self.paper_params))
        note = (f"needs {TABLE7_PREFIX}: " + ("it is not under the data root here (torchvision's EMNIST/raw layout, "
                                               "README 'Choosing a data root')" if missing else
                                               "no Table 7 run is stored yet")
                + f"; where it is present, `python -m fedlib results --chapter celm --table 'Table 7'` makes and "
                  f"stores its {runs} paper-protocol runs. The rows show the paper's values only.")
        return Table(self.styled([(label, paper, {}) for label, paper, _ in rows]), values, note=note)

    def table2(self) -> Table:
        """Table 2, balanced and rare-class accuracy: the styled frame, the numbers, the Maverick's classes (note)."""
        methods = self.params["methods"]
        make = method_configs(table2_split, methods)
        rows = [(row, self.paper_values("Table 2", f"{self.prefix} {row}", methods), self.sources(make, value))
                for row, value in (("Balanced Acc.", lambda r: 100 * r.final["balanced_accuracy"]),
                                   ("Rare Class Acc.", rare_class_accuracy))]
        (_, paper, ours), classes = rows[1], maverick_classes(self.result(make(self.params)["celm"][0]))
        return Table(self.styled(rows), {
            "t2_rare_celm": ours[self.ours]["celm"][0], "t2_rare_fedavg": ours[self.ours]["fedavg_uniform"][0],
            "t2_rare_paper_celm": paper["celm"][0]}, note=f"Maverick classes: {classes}")

    def table3(self) -> Table:
        """Table 3 and Fig. 4, free-rider detection: AUROC and FPR per method, the numbers, the FPR curves."""
        # lazy: pandas and IPython (book extra), matplotlib (~0.5 s); the queue imports the chapters without them
        import matplotlib.pyplot as plt
        import pandas as pd
        from IPython.display import Markdown

        detectors = [m for m in DETECTORS if m in self.params["methods"]]
        lines, curves, thresholds = [], {}, None
        for split, spec in detection_splits(self.params).items():
            for m in detectors:
                runs = [self.result(run_config(self.params, spec, m, s)) for s in self.params["seeds"]]
                runs = [r for r in runs if r is not None]  # an evidence build: a stale or missing run is not shown
                summaries = [detection_summary(score_history(r), free_riders(r)) for r in runs]
                if summaries:
                    curves[(split, m)] = np.mean([s["fpr_curve"] for s in summaries], axis=0)
                    thresholds = summaries[0]["thresholds"]
                for metric, key in (("AUROC", "auroc"), ("FPR", "fpr")):
                    paper = reference_value(self.reference, "Table 3", f"{self.prefix} {split}",
                                            f"{metric} {METHOD_LABELS[m]}")[0]
                    lines.append({"split": split, "metric": metric, "method": METHOD_LABELS[m], "paper": paper,
                                  self.ours: float(np.mean([s[key] for s in summaries])) if summaries else np.nan})
        table = pd.DataFrame(lines).pivot_table(index=["split", "metric"], columns="method",
                                                values=["paper", self.ours]).swaplevel(0, 1, axis=1).sort_index(axis=1)
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=True, layout="constrained")
        for ax, split in zip(axes, ("FR", "FRM")):
            for m in (m for m in detectors if (split, m) in curves):
                ax.plot(thresholds, curves[(split, m)], label=METHOD_LABELS[m])
            ax.set(title=f"{split}: FPR vs threshold", xlabel="z-score threshold", ylabel="false-positive rate")
            ax.grid(alpha=0.3)
        axes[0].legend()
        frm = [r for r in lines if r["split"] == "FRM" and r["metric"] == "AUROC"]
        measured = [r for r in frm if np.isfinite(r[self.ours])]
        return Table(table.style.format("{:.2f}", na_rep="—"), {
            "t3_celm_frm": next(r[self.ours] for r in frm if r["method"] == "CELM"),
            "t3_best_frm": Markdown(max(measured, key=lambda r: r[self.ours])["method"] if measured else "none measured")},
            figure=fig)

    def table4(self) -> Table:
        """Table 4 and Fig. 5: how far CELM's evidence and the uniform matrix are from the true counts."""
        # lazy: pandas (book extra), matplotlib (~0.5 s); the queue imports the chapters without them
        import matplotlib.pyplot as plt
        import pandas as pd

        splits, seed = self.params["fidelity_splits"], self.params["seeds"][0]
        lines = []
        for split in splits:
            spec, row = SPLITS[split]
            values = [fidelity(self.result(run_config(self.params, spec, "celm", s))) for s in self.params["seeds"]]
            mean = {k: float(np.mean([v[k] for v in values])) for k in values[0]}
            lines += [{"split": split, "source": "paper",
                       **{k: reference_value(self.reference, "Table 4", f"{self.prefix} {row}", k)[0] for k in mean}},
                      {"split": split, "source": self.ours, **mean}]
        table = pd.DataFrame(lines).set_index(["split", "source"])
        ours = table.xs(self.ours, level="source")
        values = {"t4_better": int((ours["JSD CELM"] < ours["JSD Uniform"]).sum()), "t4_n": len(ours)}

        run = self.result(run_config(self.params, SPLITS[splits[-1]][0], "celm", seed))
        true, est = np.asarray(run.meta["client_class_counts"], float), last_evidence(run)
        est_total = max(est.sum(), 1e-12)
        fig, axes = plt.subplots(1, 4, figsize=(15, 3.2), layout="constrained")
        for ax, matrix, title in ((axes[0], true / true.sum(), "(a) true"),
                                  (axes[1], est / est_total, "(b) CELM estimate")):
            im = ax.imshow(matrix, cmap="Blues", aspect="auto")
            ax.set(title=title, xlabel="class", ylabel="client")
            fig.colorbar(im, ax=ax, shrink=0.8)
        for ax, axis, what in ((axes[2], 1, "client"), (axes[3], 0, "class")):
            x = np.arange(true.shape[1 - axis])
            ax.bar(x - 0.2, true.sum(axis) / true.sum(), 0.4, label="true")
            ax.bar(x + 0.2, est.sum(axis) / est_total, 0.4, label="CELM")
            ax.set(title=f"({'c' if axis else 'd'}) {what} marginals", xlabel=what)
        axes[3].legend()
        fig.suptitle(f"{splits[-1]}, seed {seed}")
        return Table(table.style.format("{:.3f}"), values, figure=fig)

    def table4_uniform(self, seeds=(0, 1, 2)) -> Table:
        """Table 4's Uniform column from the splits alone, paper vs ours under the Table 4 and the earlier
        definitions (JSD in bits, EMD between cell probabilities) and on the PLS splits of ``PLS_MATCHES``;
        a paper value counts as reproduced within our seed range ± its rounding (0.0005)."""
        # lazy: pandas (book extra), scipy.stats (~1 s); the queue imports the chapters without them
        import pandas as pd
        from scipy.stats import wasserstein_distance

        names = ("JSD", "EMD", "Hellinger")

        def uniform(counts):  # the Table 4 definitions
            return joint_distances(counts, np.ones_like(counts, dtype=float))

        def earlier(counts):
            joint = (counts / counts.sum()).ravel()
            flat = np.full_like(joint, 1.0 / joint.size)
            return {"JSD": float(jsd(joint, flat)), "EMD": float(wasserstein_distance(joint, flat)),
                    "Hellinger": float(hellinger(joint, flat))}

        def spread(part, source):
            return {"source": f"{source}, seeds {list(seeds)}",
                    **{m: pm(*mean_std(part[m]), digits=3) for m in names}}

        lines, inside, means, papers = [], dict.fromkeys(names, 0), {}, {}
        for dataset, paper_row, split in TABLE4_ROWS:
            row = f"{dataset} {paper_row}"
            paper = papers[row] = {m: reference_value(self.reference, "Table 4", row, f"{m} Uniform")[0] for m in names}
            counts = [split_counts(SPLITS[split][0], CLASS_SIZES[dataset], seed=s) for s in seeds]
            ours = pd.DataFrame([uniform(c) for c in counts])
            lines += [{"row": row, "source": "paper", **{m: f"{paper[m]:.3f}" for m in names}},
                      {"row": row, **spread(ours, "ours (Table 4) definitions")},
                      {"row": row, **spread(pd.DataFrame([earlier(c) for c in counts]), "earlier definitions")}]
            inside = {m: inside[m] + int(ours[m].min() - 5e-4 <= paper[m] <= ours[m].max() + 5e-4) for m in names}
            means[row] = {m: float(ours[m].mean()) for m in names}
            for ks in PLS_MATCHES if paper_row == "PLS" else ():
                spec = {"name": "pls", "classes_per_client": list(ks)}
                part = pd.DataFrame([uniform(split_counts(spec, CLASS_SIZES[dataset], seed=s)) for s in seeds])
                lines.append({"row": row, **spread(part, f"our PLS rule with k = {ks}")})
        found = pls_class_count_search()
        chosen, rule = choose_pls_allocation(found)
        pls, sls = means["F.MNIST PLS"], "CIFAR-10 SLS"
        values = {"t4u_rows": len(TABLE4_ROWS), **{f"t4u_{m}": inside[m] for m in names},
                  "t4u_pls": ", ".join(str(k) for k in found), "t4u_pls_JSD": pls["JSD"],
                  "t4u_pls_choice": ", ".join(map(str, PLS_ALLOCATION)), "t4u_pls_rule": rule,
                  "t4u_pls_rule_agrees": "yes" if chosen == PLS_ALLOCATION else "no",
                  "t4u_pls_Hellinger": pls["Hellinger"],
                  "t4u_sls_gap": max(abs(means[sls][m] - papers[sls][m]) for m in ("JSD", "Hellinger"))}
        note = (f"equal-size PLS allocations with the paper's Uniform JSD 0.508 and Hellinger 0.586: {found}; "
                f"the page's PLS split uses {PLS_ALLOCATION} ({rule})")
        return Table(pd.DataFrame(lines).set_index(["row", "source"]), values, note=note)

    @staticmethod
    def definitions() -> Table:
        """The JSD, Hellinger and EMD variants tried for Table 4's Uniform column on our PLS split
        (``PLS_ALLOCATION``, seed 0), over
        the joint client x class cells, the client rows or the class columns (means)."""
        # lazy: pandas (book extra), scipy.stats (~1 s); the queue imports the chapters without them
        import pandas as pd
        from scipy.stats import wasserstein_distance

        c = split_counts(SPLITS["PLS"][0], CLASS_SIZES["F.MNIST"]).astype(float)
        n, k = c.shape
        views = {"joint cells": ((c / c.sum()).ravel()[None], np.full((1, n * k), 1.0 / (n * k))),
                 "client rows (mean)": (c / c.sum(1, keepdims=True), np.full((n, k), 1.0 / k)),
                 "class columns (mean)": ((c / c.sum(0, keepdims=True)).T, np.full((k, n), 1.0 / n))}

        def js_div_nats(p, q):
            m = 0.5 * (p + q)
            return 0.5 * (np.atleast_1d(kl(p, m)) + np.atleast_1d(kl(q, m)))

        candidates = {
            "JSD: divergence, bits": lambda p, q: jsd(p, q),
            "JSD: divergence, nats": js_div_nats,
            "JSD: distance (sqrt), bits": lambda p, q: js_distance(p, q, base=2),
            "JSD: distance (sqrt), nats": lambda p, q: js_distance(p, q),
            "Hellinger (1/√2 scale)": hellinger,
            "Hellinger without 1/√2": lambda p, q: np.sqrt(2.0) * np.asarray(hellinger(p, q)),
            "EMD: class bins |i-j|": lambda p, q: emd_1d(p, q),
            "EMD: class bins |i-j|/(C-1)": lambda p, q: np.asarray(emd_1d(p, q)) / (p.shape[-1] - 1),
            "EMD: scipy on the probability values": lambda p, q: np.array(
                [wasserstein_distance(a, b) for a, b in zip(p, q)]),
        }
        rows = [{"candidate": name, **{view: float(np.mean(np.atleast_1d(f(p, q)))) for view, (p, q) in views.items()}}
                for name, f in candidates.items()]
        return Table(pd.DataFrame(rows).set_index("candidate").style.format("{:.4f}"))

    def tables5_6(self) -> Table:
        """Table 5 (IID) and Table 6 (many clients): the styled frame and Table 6's numbers."""
        many = self.params["many_clients"]
        rows6 = self.split_rows("Table 6", self.params["many_client_splits"], label=f"{{split}}, {many} clients",
                                n_clients=lambda p: p["many_clients"])
        best, paper, n = best_counts(rows6, self.ours)
        return Table(self.styled(self.split_rows("Table 5", ["IID"]) + rows6),
                     {"t6_best": best, "t6_paper": paper, "t6_n": n})

    def table8(self) -> Table:
        """Table 8: CELM's accuracy per warm-up horizon T_w / T, paper vs ours (styled)."""
        fractions = {f"{round(100 * f)}%": f for f in self.params["warmup_fractions"]}
        rows = []
        for split in self.params["warmup_splits"]:
            spec, row = SPLITS[split]
            per_fraction = {label: [run_config(self.params, spec, "celm", s, warmup_fraction=f)
                                    for s in self.params["seeds"]] for label, f in fractions.items()}
            rows.append((split, frames.paper_values(self.reference, "Table 8", f"{self.prefix} {row}", fractions, str),
                         {self.ours: frames.seed_mean_std(self.results, per_fraction)}))
        return Table(frames.styled_comparison(rows, {label: label for label in fractions}, index="split"))

    def fig6(self):
        """Fig. 6: CELM's final accuracy (%) over the probe steps L x Adam step size η grid."""
        # lazy: matplotlib (~0.5 s); the queue imports the chapters without it
        import matplotlib.pyplot as plt

        p = self.params
        steps, rates, spec = p["lm_steps_grid"], p["lm_lr_grid"], SPLITS[p["sensitivity_split"]][0]
        grid = np.array([[100.0 * self.result(run_config(p, spec, "celm", p["seeds"][0], lm_steps=st, lm_lr=lr))
                          .final["accuracy"] for lr in rates] for st in steps])
        fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(rates), 1.2 + 0.8 * len(steps)), layout="constrained")
        ax.imshow(grid, cmap="viridis", aspect="auto")
        ax.set(xticks=range(len(rates)), xticklabels=rates, yticks=range(len(steps)), yticklabels=steps,
               xlabel="LM learning rate η", ylabel="LM steps L", title=f"CELM accuracy (%), {p['sensitivity_split']}")
        for (i, j), v in np.ndenumerate(grid):
            ax.text(j, i, f"{v:.1f}", ha="center", va="center", color="white" if v < grid.mean() else "black")
        return fig, {"f6_spread": float(grid.max() - grid.min())}

    def fig7(self):
        """Fig. 7: the final probe images per model (row 0 global) and class; red: classes the client holds."""
        # lazy: matplotlib (~0.5 s); the queue imports the chapters without it
        import matplotlib.pyplot as plt

        run = self.result(run_config(self.params, SPLITS["PLS"][0], "celm", self.params["seeds"][0],
                                     keep_probe_images=True))
        images = np.asarray(next(h["diagnostics"]["probe_images"] for h in reversed(run.history)
                                 if "probe_images" in h.get("diagnostics", {})), dtype=float)  # [N+1, K, C, H, W]
        counts = np.asarray(run.meta["client_class_counts"])
        rows, cols = images.shape[:2]
        fig, axes = plt.subplots(rows, cols, figsize=(1.1 * cols, 1.1 * rows), layout="constrained")
        for (i, c), ax in np.ndenumerate(axes):
            img = images[i, c]
            img = img[0] if img.shape[0] == 1 else np.moveaxis(img, 0, -1)
            ax.imshow((img - img.min()) / max(img.max() - img.min(), 1e-12), cmap="gray")
            ax.set(xticks=[], yticks=[])
            held = i > 0 and counts[i - 1, c] > 0
            for side in ax.spines.values():
                side.set(color="red" if held else "lightgray", linewidth=2.5 if held else 0.5)
            if i == 0:
                ax.set_title(str(c), fontsize=9)
            if c == 0:
                ax.set_ylabel("global" if i == 0 else f"client {i - 1}", fontsize=9)
        return fig

    def cffl_study(self) -> Table:
        """CFFL's removals at coefficients 1/3 and 1/6 and with removal off, beside uniform FedAvg, on the
        profile's reduced ``cffl_study`` run: the table (None: not run), the numbers, the computed conclusion
        (note)."""
        # lazy: IPython (book extra); the queue imports the chapters without it
        from IPython.display import Markdown

        study = self.params["cffl_study"]
        runs = [(label, self.result(c)) for label, c in cffl_study_configs(self.params)]
        header = (f"{study['split']}, {study['rounds']} rounds, {100 * study['fraction']:g} % of the training data, "
                  f"seed {study['seed']} (reduced: the paper runs 100 rounds on all of it). ")
        if any(r is None for _, r in runs):
            values = dict.fromkeys(("cs_fedavg", "cs_third", "cs_sixth", "cs_removed_third", "cs_removed_sixth",
                                    "cs_off", "cs_off_gap"), float("nan"))
            return Table(None, {**values, "cs_off_reaches_fedavg": "not run"},
                         note=Markdown(header + "These runs did not run in this build (no data)."))
        table, text, values = cffl_study_frame(runs)
        paper = reference_value(self.reference, "Table 1", f"{self.prefix} {SPLITS[study['split']][1]}", "CFFL")[0]
        return Table(table, values, note=Markdown(header + text + f" (The paper reports {paper:.2f} % for CFFL on "
                                                                  f"{study['split']} under its full protocol.)"))

    def headlines(self, rows1, table2_values: dict):
        """The page's headline claims for the book's front page (Table 1's CELM cells, Table 2's rare classes)."""
        out = [{"claim": f"CELM accuracy, {self.prefix} {split} (Table 1)", "paper": paper["celm"][0],
                "ours": round(src[self.ours]["celm"][0], 2), "unit": "%"}
               for split, paper, src in rows1 if paper["celm"][0] == paper["celm"][0]]
        out.append({"claim": f"CELM rare-class accuracy, {self.prefix} Maverick (Table 2)",
                    "paper": table2_values["t2_rare_paper_celm"], "ours": round(table2_values["t2_rare_celm"], 2),
                    "unit": "%"})
        return self.record_headlines(out)


def baselines_text(params: dict[str, Any]) -> str:
    """The page's "Baselines" paragraph, its hyper-parameters rendered from what the ``params`` runs of Table 1
    resolve (``fedlib.app.chapters.resolved_methods``; the paper profile's values for a method ``params`` does not
    run)."""
    runs = dict(resolved_methods("celm", "paper"))
    table1 = experiment_configs(params, "table1")
    runs |= {c.method.name: {**c.resolved()["method"], "server_val": c.resolved().get("server_val")} for c in table1}
    sym = lambda method, s: PROSE_SYMBOLS[method][s](runs[method])  # noqa: E731
    cffl = runs["cffl"]
    by_coefficient: dict[Fraction, list[str]] = {}  # the removal coefficient each split's CFFL runs use
    for split in params["splits"]:
        run = next((c for c in table1 if c.method.name == "cffl" and c.split.name == SPLITS[split][0]["name"]
                    and c.split.params == {k: v for k, v in SPLITS[split][0].items() if k != "name"}), None)
        if run is not None:
            coefficient = Fraction(build_method("cffl", run.method.params).coefficient).limit_denominator(100)
            by_coefficient.setdefault(coefficient, []).append(split)
    ordered = sorted(by_coefficient.items(), key=lambda item: -len(item[1]))
    coefficients = f"{ordered[0][0]}" if ordered else f"{Fraction(cffl['threshold']).limit_denominator(100)}"
    coefficients += "".join(f", or {c} on {' and '.join(splits)} (its authors' code uses it for their label-imbalance "
                            "split)" for c, splits in ordered[1:])
    return (
        "**Baselines** (as this page's runs resolve them; `fedlib.methods.gradient` / `fairness`): FedAvg with "
        "uniform weights (the paper's choice: no client metadata), CFFL (server validation accuracy `acc_i` → "
        "reputation `r_i ← fade·r_i + (1 − fade)·acc_i / Σ acc`, weights `sinh(α r) / Σ sinh(α r)` with "
        f"α = {sym('cffl', 'α')} and fade = {sym('cffl', 'fade')}, clients below coefficient / |R| of the reputation "
        f"removed, coefficient {coefficients}, updates clipped to ±{cffl['clip']:g} and the largest "
        f"{100 * cffl['theta']:g} % of their entries uploaded; the server holds out {cffl['server_val']:,} training "
        f"samples as its validation set), CGSV (cosine of each update with the aggregate, reputation EMA "
        f"α = {sym('cgsv', 'α')}), ShapFed (class-wise cosine of the classifier rows' "
        f"{SHAPFED_SIGNALS[runs['shapfed']['signal']]}, μ = {sym('shapfed', 'μ')}).")


SHAPFED_SIGNALS = {"params": "parameters", "updates": "updates"}
