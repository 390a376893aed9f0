"""The LogitFL page (book/logitfl.ipynb): the calibration, the k sweep, CIFAR-10, communication, UWA's weights
and the ablations."""

from __future__ import annotations

from typing import Any

import numpy as np

from ....stats import mean_std, pm
from ...kit import frames
from ...kit.tables import Table
from ..base import OURS_STORED, Chapter, curve
from .calibration import (
    FIRST,
    PAPER_SIMPLE,
    calibrated_choice,
    calibration_table,
    load_calibration,
)
from .protocol import LABELS, communication, logit_config, row, row_configs, stored

# ----------------------------------------------------------------------------- the page


def _accuracy_frame(rows: dict, index):
    """{row label: {method: Spread}} as a table of "mean ± sd (n)" (bold: each row's best, on the seeds
    the row's methods share); ``index`` names the row level(s) (tuple labels make a MultiIndex)."""
    # lazy: pandas (book extra); the queue imports the chapters without it
    import pandas as pd

    def table(cell):
        return pd.DataFrame.from_dict({label: {m: cell(v) for m, v in r.items()} for label, r in rows.items()},
                                      orient="index").rename(columns=LABELS).rename_axis(index)

    return frames.bold_best(table(lambda v: pm(*v)), table(lambda v: v))


def _k_sweep_counts(by_k: dict, methods: list[str]) -> tuple[int, int]:
    """For {k: {method: Spread}}: how many k have the meta-model best, and UWA ahead of simple averaging,
    each on the seeds the methods compared share (``frames.best_on_shared_seeds``)."""
    return (sum(frames.best_on_shared_seeds({m: r[m] for m in methods if m in r}) == {"meta"} for r in by_k.values()),
            sum(frames.best_on_shared_seeds({m: r[m] for m in ("uwa", "simple")}) == {"uwa"} for r in by_k.values()))


class LogitFL(Chapter):
    """The logit-FL page: calibration, headline, k sweep, CIFAR-10, communication, UWA weights, ablations."""

    name = "logitfl"
    labels = LABELS

    k0 = property(lambda self: self.params["ks"][0])  # the first k: the headline's and the ablations'

    @staticmethod
    def glue(values: dict[str, Any]) -> None:
        """Every number the text quotes; a text is glued as Markdown (``{glue:md}``)."""
        # lazy: IPython (book extra); the queue imports the chapters without it
        from IPython.display import Markdown

        Chapter.glue({n: Markdown(v) if isinstance(v, str) else v for n, v in values.items()})

    def first_seed_run(self, aggregator: str, **overrides):
        return self.result(logit_config(self.params, aggregator, self.k0, self.params["seeds"][0], **overrides))

    def calibration_search(self) -> Table:
        """The calibration record's notes (shown first), its points as a table and a figure (None, None: no
        points)."""
        # lazy: matplotlib (~0.5 s); the queue imports the chapters without it
        import matplotlib.pyplot as plt

        record = load_calibration()
        points = record["points"]
        if not points:
            return Table(note="No calibration recorded yet (run fedlib.app.chapters.logitfl.calibrate()).",
                         order=("note", "frame", "figure"))
        fig, ax = plt.subplots(figsize=(9, 3.4), layout="constrained")
        for stage, color in {"pilot": "gray", "structure": "C0", "tuning": "C1", "edge": "C2", "confirm": "C3"}.items():
            at = [i for i, r in enumerate(points) if r["stage"] == stage]
            ax.scatter([i + 1 for i in at], [100 * points[i]["accuracy"] for i in at], color=color, label=stage,
                       zorder=3)
        ax.axhspan(PAPER_SIMPLE - 3, PAPER_SIMPLE + 3, color="green", alpha=0.12, label="paper ± 3 points")
        ax.axhline(PAPER_SIMPLE, color="green", linestyle="--")
        ax.set(xlabel="search point (order run)", ylabel="simple averaging, test accuracy (%)",
               title="Calibration on simple averaging (MNIST, k = 2, seed 0)", xticks=range(1, len(points) + 1))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        notes = "\n".join(record[n] for n in ("note", "note_confirm") if record.get(n))
        return Table(calibration_table(record), note=notes, figure=fig, order=("note", "frame", "figure"))

    def calibration_verdict(self) -> Table:
        """The first protocol's stored runs (or None), ``cal_text``, the calibrated choice vs this profile's (note)."""
        # lazy: pandas (book extra); the queue imports the chapters without it
        import pandas as pd

        points = load_calibration()["points"]
        first_frame, choice = None, ""
        if points:
            first_params = {**self.paper_params, **FIRST}
            first, _ = stored(first_params)
            if first:
                line = {LABELS[a]: pm(*v) for a, v in row(first_params, first, self.k0, with_fedavg=False).items()}
                first_frame = pd.DataFrame([line], index=pd.Index(
                    ["first (uncalibrated), stored paper profile, k = 2"], name="protocol"))
            chosen = calibrated_choice({"points": points})
            in_force = {f: self.params.get(f) for f in chosen}
            choice = (f"calibrated choice: {chosen}\nthis profile uses: {in_force} "
                      + ("" if in_force == chosen else "(differs: a reduced profile or a stale search)"))
        confirmed = [r for r in points if r["stage"] == "confirm"]
        text = "No point has been confirmed at the paper protocol yet."
        if confirmed:
            best = max(confirmed, key=lambda r: r["accuracy"])
            gap = PAPER_SIMPLE - 100 * best["accuracy"]
            text = ("At the paper protocol (LeNet-5, seed 0) simple averaging reaches "
                    + ", ".join(f"{100 * r['accuracy']:.2f} % (lr {r['choice']['lr']:g}, {r['choice']['local_epochs']} "
                                f"local, {r['choice']['distill_epochs']} distillation epoch(s), "
                                f"T = {r['choice']['temperature']:g})" for r in confirmed)
                    + f"; the best, the calibrated protocol, is {100 * best['accuracy']:.2f} % against the paper's "
                    f"{PAPER_SIMPLE:.2f} %: " + ("within 3 points." if abs(gap) <= 3 else f"{gap:.2f} points short."))
        screened = [r for r in points if r["protocol"] == "screen" and r["config"]["model"] == "mlp"]
        if screened:
            top = max(screened, key=lambda r: r["accuracy"])
            clients = [100 * r["mean_client_accuracy"] for r in points]
            text += (f" {'A' if abs(100 * top['accuracy'] - PAPER_SIMPLE) <= 3 else 'No'} screened point comes "
                     f"within 3 points of the paper: the best reaches {100 * top['accuracy']:.2f} % ({top['stage']} "
                     "stage, MLP screen).")
            if max(clients) <= 25:
                text += (f" In every point the clients' own test accuracy after private training is "
                         f"{min(clients):.1f}–{max(clients):.1f} % (a perfect 2-class expert scores about 20 %): "
                         "private training undoes what the refinement taught, so simple averaging averages the "
                         "logits of 2-class experts on classes most of them never saw, and the protocol choices "
                         "move it only within that regime.")
        simple = [100 * r.final["accuracy"] for c in row_configs(self.paper_params, self.k0)["simple"]
                  if (r := self.stored.results.get(c.key()))]
        if simple:
            mean, std, n = mean_std(simple)
            text += (f" Stored paper-profile runs at the profile's protocol: simple averaging "
                     f"{pm(mean, std, n)} % (mean ± sd (seeds)) ("
                     + ("" if abs(mean - PAPER_SIMPLE) <= 3 else "not ") + "within 3 points of the paper).")
        return Table(first_frame, {"cal_text": text}, note=choice)

    def headline(self) -> Table:
        """MNIST, k = ks[0]: paper, ours and stored per method (bold: the best), and the gains over simple averaging."""
        # lazy: pandas (book extra); the queue imports the chapters without it
        import pandas as pd

        aggregators = self.params["aggregators"]
        paper = {m: v[0] for m, v in self.paper_values("Headline", "MNIST k=2", LABELS).items()}  # %; FedAvg: NaN
        sources = self.sources(lambda p: row_configs(p, self.k0))
        head, stored_head = sources[self.ours], sources.get(OURS_STORED, {})
        lines = {"paper (LeNet, full protocol)": {m: (paper[m], float("nan")) for m in head}, self.ours: head}
        if any(v[0] == v[0] for v in stored_head.values()):
            seeds = sorted({r.config["seed"] for r in self.stored.results.values()})
            lines[f"{OURS_STORED} (seeds {seeds})"] = stored_head

        def table(cell):
            return (pd.DataFrame.from_dict({k: {m: cell(v) for m, v in line.items()} for k, line in lines.items()},
                                           orient="index").rename(columns=LABELS).rename_axis("source"))

        return Table(frames.bold_best(table(lambda v: pm(*v)), table(lambda v: v)), {
            "head_k": self.k0, "head_best": LABELS[max(aggregators, key=lambda a: head[a][0])],
            "head_uwa_gain": head["uwa"][0] - head["simple"][0], "head_meta_gain": head["meta"][0] - head["simple"][0],
            "paper_uwa_gain": paper["uwa"] - paper["simple"], "paper_meta_gain": paper["meta"] - paper["simple"],
            "head_fedavg": head["fedavg"][0]})

    def accuracy_table(self, settings: dict, index: str, **row_args):
        """Final accuracy (bold: the best) per setting {label: row() arguments}, and the rows."""
        rows = {label: row(self.params, self.results, **row_args, **args) for label, args in settings.items()}
        return _accuracy_frame(rows, index), rows

    def k_sweep_table(self, by_k: dict):
        """Final accuracy per k (bold: the best): this build's rows, then the stored paper-profile runs'
        mean ± std over their seeds."""
        rows = {(self.ours, k): r for k, r in by_k.items()}
        for k in self.paper_params["ks"] if self.stored is not None else []:
            configs = row_configs(self.paper_params, k)
            stored = frames.seed_mean_std(self.stored.results, configs)
            seeds = sorted({c.seed for cs in configs.values() for c in cs if c.key() in self.stored.results})
            if seeds:
                rows[(f"{OURS_STORED}, seeds {seeds}", k)] = stored
        return (_accuracy_frame(rows, ["source", "k"]),
                {k: r for (source, k), r in rows.items() if source != self.ours})

    def simple_instability(self) -> Table:
        """Why simple averaging at the first k spreads over seeds (issue 30), from the stored paper-profile runs:
        per seed, the final accuracy, the clients' test accuracy after their first round of private training
        (min, mean, max over the clients) and at the last round, and the aggregated labels' accuracy on the
        public set. No frame (a note) while no run is stored."""
        # lazy: pandas (book extra); the queue imports the chapters without it
        import pandas as pd

        params = self.paper_params
        k0 = params["ks"][0]
        configs = row_configs(params, k0, with_fedavg=False)["simple"]
        stored = {} if self.stored is None else self.stored.results
        lines = []
        for config in configs:
            run = stored.get(config.key())
            if run is None:
                lines.append({"seed": config.seed, "final accuracy (%)": np.nan})
                continue
            first = [a for a in run.history[0]["diagnostics"]["client_accuracy"] if a is not None]
            last = [a for a in run.history[-1]["diagnostics"]["client_accuracy"] if a is not None]
            lines.append({"seed": config.seed, "final accuracy (%)": 100 * run.final["accuracy"],
                          "clients after private training: min (%)": 100 * min(first),
                          "mean (%)": 100 * float(np.mean(first)), "max (%)": 100 * max(first),
                          "clients at the last round: mean (%)": 100 * float(np.mean(last)),
                          "public labels' accuracy, last round (%)": 100 * run.history[-1]["diagnostics"]["public_accuracy"]})
        frame = pd.DataFrame(lines).set_index("seed")
        finals = frame["final accuracy (%)"].dropna()
        values = {"si_n": int(len(finals)), "si_seeds": len(configs), "si_k": k0,
                  "si_mean": float(finals.mean()) if len(finals) else float("nan"),
                  "si_std": float(finals.std(ddof=1)) if len(finals) > 1 else float("nan"),
                  "si_min": float(finals.min()) if len(finals) else float("nan"),
                  "si_max": float(finals.max()) if len(finals) else float("nan"),
                  "si_corr": float("nan"), "si_private_range": float("nan")}
        both = frame.dropna(subset=["final accuracy (%)"])
        if len(both):  # how far apart the seeds' clients are after private training (mean over clients)
            values["si_private_range"] = float(both["mean (%)"].max() - both["mean (%)"].min())
        if len(both) >= 3:  # does a seed's final accuracy follow the quality of the averaged soft labels?
            with np.errstate(invalid="ignore", divide="ignore"):  # constant columns: nan, said on the page
                values["si_corr"] = float(np.corrcoef(both["final accuracy (%)"],
                                                      both["public labels' accuracy, last round (%)"])[0, 1])
        shown = frame.astype(object).where(frame.notna(), "no stored run yet") if len(finals) else None
        return Table.formatted(shown, values, "No stored simple-averaging run yet (python -m fedlib results --chapter "
                                             "logitfl --table 'k sweep').", precision=2, na_rep="")

    def k_sweep(self) -> Table:
        """Final accuracy for every k and its figure: accuracy vs k, accuracy per round at ks[0]."""
        # lazy: matplotlib (~0.5 s); the queue imports the chapters without it
        import matplotlib.pyplot as plt

        ks, seed, methods = self.params["ks"], self.params["seeds"][0], [*self.params["aggregators"], "fedavg"]
        by_k = {k: row(self.params, self.results, k=k) for k in ks}
        table, stored = self.k_sweep_table(by_k)
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), layout="constrained")
        for m in methods:
            axes[0].plot(ks, [by_k[k][m][0] for k in ks], marker="o", label=LABELS[m])
        axes[0].set(xlabel="classes per client k", ylabel="test accuracy (%)", title="(a) final accuracy vs k",
                    xticks=ks)
        first_seed = row_configs(self.params, self.k0)
        for m in methods:
            x, y = curve(self.result(first_seed[m][0]))
            axes[1].plot(x, y, marker=".", label=LABELS[m], **({"color": "gray"} if m == "fedavg" else {}))
        axes[1].set(xlabel="round", ylabel="test accuracy (%)",
                    title=f"(b) accuracy per round, k = {self.k0}, seed {seed}", xticks=x)
        for ax in axes:
            ax.grid(alpha=0.3)
            ax.legend()
        meta_best, uwa_wins = _k_sweep_counts(by_k, methods)
        stored_text = ""
        if stored:
            stored_meta, stored_uwa = _k_sweep_counts(stored, methods)
            stored_text = (f"On the stored paper-profile runs (means on the seeds the methods share), the meta-model "
                           f"is best for {stored_meta} of {len(stored)} values of k and UWA is ahead of simple "
                           f"averaging for {stored_uwa} of {len(stored)}; whether a margin exceeds the seeds' noise "
                           f"is judged in the scorecard (95 % t-intervals of the paired margins).")
        return Table(table, {"k_meta_best": meta_best, "k_uwa_wins": uwa_wins, "k_n": len(ks),
                             "k_stored_text": stored_text}, figure=fig)

    def cifar10(self) -> Table:
        """The CIFAR-10 rows (None: not run), the best method, a line on the data (or on why there are no rows)."""
        note = next((r.meta["dataset_source"] for r in self.runs if r.config["dataset"] == "cifar10"), None)
        if note is None:
            return Table(None, {"c_best": "not run"},
                         note="No CIFAR-10 under the data root (or not in this profile): these rows were not run.")
        label, ks = "CIFAR-10 (JPEG copy)" if "JPEG" in note else "CIFAR-10", self.params["cifar10_ks"]
        table, rows = self.accuracy_table({f"{label}, k = {k}": {"k": k} for k in ks}, "data", cifar10=True)
        first = rows[f"{label}, k = {ks[0]}"]
        return Table(table, {"c_best": LABELS[max(first, key=lambda m: first[m][0])]}, note=f"data: {note}")

    def communication_table(self) -> Table:
        """Floats per round of each aggregator against FedAvg's (k = ks[0], first seed), a line on the model."""
        # lazy: pandas (book extra); the queue imports the chapters without it
        import pandas as pd

        lines = {}
        for a in self.params["aggregators"]:
            c = communication(self.first_seed_run(a))
            lines[LABELS[a]] = {"up (floats)": f"{c['up']:,.0f}", "down (floats)": f"{c['down']:,.0f}",
                                "total": f"{c['total']:,.0f}", "FedAvg (floats)": f"{c['fedavg']:,.0f}",
                                "FedAvg / logit": f"{c['ratio']:.2f}x"}
        simple = self.first_seed_run("simple")
        note = (f"model: {self.params['model']}, {simple.meta['model_parameters']:,} parameters; "
                f"public set: {simple.config['server_val']:,} samples")
        return Table(pd.DataFrame.from_dict(lines, orient="index").rename_axis("aggregator"),
                     {"comm_ratio": communication(simple)["ratio"]}, note=note)

    def uwa_weights(self):
        """The last round's UWA weights (k = ks[0], first seed): by class, largest weight, entropy."""
        # lazy: matplotlib (~0.5 s); the queue imports the chapters without it
        import matplotlib.pyplot as plt

        uwa = self.first_seed_run("uwa")
        info = uwa.final["uwa_weights"]
        class_weight = np.asarray(info["class_weight"])
        held = np.asarray(uwa.meta["client_class_counts"]) > 0
        edges = np.asarray(info["hist_edges"])
        fig, axes = plt.subplots(1, 3, figsize=(14, 3.6), layout="constrained")
        im = axes[0].imshow(class_weight, cmap="viridis", aspect="auto", vmin=0)
        for i, c in zip(*np.nonzero(held)):
            axes[0].add_patch(plt.Rectangle((c - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.5))
        axes[0].set(xlabel="class of the public sample", ylabel="client", title="(a) mean weight by class")
        fig.colorbar(im, ax=axes[0], shrink=0.8)
        axes[1].bar(edges[:-1], info["max_weight_hist"], width=edges[1] - edges[0], align="edge")
        axes[1].axvline(info["uniform_weight"], color="red", linestyle="--", label="uniform 1/N")
        axes[1].set(xlabel="largest client weight", ylabel="public samples", title="(b) largest weight per sample")
        axes[1].legend()
        axes[2].bar(edges[:-1], info["entropy_hist"], width=edges[1] - edges[0], align="edge")
        axes[2].set(xlabel="normalised entropy of the weights", ylabel="public samples", title="(c) weight entropy")
        return fig, {"w_max": info["mean_max_weight"], "w_uniform": info["uniform_weight"],
                     "w_entropy": info["mean_entropy"], "w_holder": float((class_weight * held).sum(0).mean()),
                     "w_random": float(held.sum(0).mean() / held.shape[0])}

    def public_size(self) -> Table:
        """Final accuracy per public-set size (bold: the best) and what the smallest costs."""
        sizes = [self.params["public_size"], *self.params["public_sizes_ablation"]]
        big, small = sizes[0], sizes[-1]
        table, rows = self.accuracy_table({n: {"public_size": n} if n != big else {} for n in sizes}, "public samples",
                                          k=self.k0, with_fedavg=False)
        drop = ", ".join(f"{LABELS[a]} {rows[big][a][0] - rows[small][a][0]:+.2f}" for a in self.params["aggregators"])
        return Table(table, {"p_small": small, "p_big": big, "p_drop": drop})

    def dropout(self) -> Table:
        """Final accuracy per dropout rate, the change (values), the meta-model's clients per round at the largest
        (note)."""
        rates = [0.0, *self.params["dropouts"]]
        table, rows = self.accuracy_table({f"{p:g}": {"dropout": p} if p else {} for p in rates}, "dropout p",
                                          k=self.k0, with_fedavg=False)
        last, meta = rates[-1], self.first_seed_run("meta", dropout=rates[-1])
        present = np.asarray([h["diagnostics"]["present"] for h in meta.history])
        delta = ", ".join(f"{LABELS[a]} {rows[f'{last:g}'][a][0] - rows['0'][a][0]:+.2f}"
                          for a in self.params["aggregators"])
        return Table(table, {"d_p": last, "d_delta": delta,
                             "d_meta_ok": "completed every round" if len(meta.history) == meta.config["rounds"]
                             else "failed"},
                     note=f"meta-model, p = {last}: clients present per round: {present.sum(1).tolist()}")

    def uwa_tau(self):
        """UWA's final accuracy per τ (1: the paper's rule, ∞: simple averaging), ours and stored."""
        # lazy: pandas (book extra); the queue imports the chapters without it
        import pandas as pd

        def column(aggregator, **overrides):  # the other aggregators ignore uwa_tau
            sources = self.sources(lambda p: row_configs(p, self.k0, with_fedavg=False, **overrides))
            return {source: pm(*values[aggregator]) for source, values in sources.items()}

        taus = {f"{tau:g}" + (" (paper)" if tau == 1.0 else ""): {} if tau == 1.0 else {"uwa_tau": tau}
                for tau in [1.0, *self.params["uwa_taus"]]}
        lines = {label: column("uwa", **overrides) for label, overrides in taus.items()}
        lines["∞ (simple averaging)"] = column("simple")
        return pd.DataFrame.from_dict(lines, orient="index").rename_axis("UWA τ")

    def closing(self) -> Table:
        """Paper, ours and stored per k and aggregator, the stored UWA runs per round (note); records the
        headlines."""
        # lazy: pandas (book extra); the queue imports the chapters without it
        import pandas as pd

        aggregators, lines, headlines = self.params["aggregators"], [], []
        paper = {a: v[0] for a, v in self.paper_values("Headline", "MNIST k=2", aggregators).items()}  # %
        for k in self.params["ks"]:
            sources = self.sources(lambda p: row_configs(p, k, with_fedavg=False))
            for a in aggregators:
                lines.append({"k": k, "aggregator": LABELS[a], "paper": f"{paper[a]:.2f}" if k == 2 else "—",
                              **{source: pm(*values[a]) for source, values in sources.items()}})
                if k == 2:
                    headlines.append({"claim": f"{LABELS[a]} accuracy, MNIST k = 2", "paper": round(paper[a], 2),
                                      "ours": round(sources[self.ours][a][0], 2), "unit": "%"})
        self.record_headlines(headlines)
        notes = [f"stored paper-profile UWA, k = 2, seed {s}: accuracy per round (%) "
                 f"{[round(100 * h['accuracy'], 1) for h in run.history]}; mean largest client weight per round "
                 f"{[round(h['diagnostics']['mean_max_weight'], 2) for h in run.history]}"
                 for s in sorted({r.config["seed"] for r in self.stored.results.values()})
                 if (run := self.stored.results.get(logit_config(self.paper_params, "uwa", 2, s).key()))]
        return Table(pd.DataFrame(lines).set_index(["k", "aggregator"]), note="\n".join(notes))
