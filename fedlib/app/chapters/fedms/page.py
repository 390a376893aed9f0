"""The FedMS page: Table 1 (MNIST, CIFAR-10), the softmax verdict, Figs. 2-5, Table 2 and the readings."""

from __future__ import annotations

import numpy as np

from ...kit import frames
from ...kit.stored import stored_results
from ...kit.tables import Table
from .. import precisions, readings
from ..base import OURS_STORED, Chapter, curve
from .analysis import (
    best_method,
    calibrate_cifar10_readings,
    calibrate_maverick_readings,
    diagnose_shortfall,
    softmax_verdict,
)
from .protocol import (
    METHOD_LABELS,
    REWARD_METHODS,
    ROLE_COLUMNS,
    SCREEN_READING,
    SOFTMAX_VARIANTS,
    adversarial_config,
    cifar10_reading_configs,
    fig2_config,
    maverick_class_accuracy,
    maverick_reading_configs,
    participation,
    precision_screen_configs,
    reward_series,
    run_config,
    table1_grid,
    table1_reading,
    table1_score,
)


class FedMS(Chapter):
    """The FedMS page: Table 1 (MNIST, CIFAR-10), the softmax verdict, Figs. 2-5 and Table 2."""

    name = "fedms"
    labels = METHOD_LABELS
    index = "setting"

    def column_of(self, method: str) -> str:
        """A softmax variant is compared with its method's paper value."""
        return METHOD_LABELS[SOFTMAX_VARIANTS.get(method, (method,))[0]]

    def table1_rows(self, cifar10: bool = False, sources=None) -> list[tuple[str, dict, dict]]:
        """(setting, paper, ours) per Dirichlet row of Table 1, MNIST or CIFAR-10: this build's rows,
        then the paper profile's rows that have stored runs (or the given (source, runs, params))."""
        sources = self.by_source() if sources is None else sources
        grids = [table1_grid(params, cifar10) for _, _, params in sources]
        splits, methods = (list(dict.fromkeys(x for grid in grids for x in grid[i])) for i in (0, 1))
        name = ("CIFAR-10 (JPEG copy)" if "JPEG" in self.cifar_note() else "CIFAR-10") if cifar10 else None
        rows = []
        for split in splits:
            def make(p, split=split):
                return {m: [run_config(p, split, m, s, cifar10) for s in p["seeds"]]
                        for m in table1_grid(p, cifar10)[1]}

            paper = self.paper_values("Table 1", f"{'CIFAR-10' if cifar10 else 'MNIST'} {split}", methods)
            ours = {source: frames.seed_mean_std(results, make(p), table1_score(p, cifar10))
                    for source, results, p in sources}
            rows.append((f"{name + ' ' if name else ''}Mavericks + {split}", paper, ours))
        return self.measured(rows)

    def cifar_note(self) -> str:
        """Where this build's (else the stored) CIFAR-10 runs read their data ("" when none ran)."""
        return self.data_source("cifar10")

    def table1(self) -> Table:
        """Table 1 (MNIST), styled (bold: the best per line on shared seeds), the numbers the text quotes (over the
        rows this build ran), its rows (``data``: the softmax verdict's and the headlines')."""
        rows = self.table1_rows()
        ours = self.ours
        ran = [(p, o[ours]) for _, p, o in rows if best_method(o[ours]) is not None]
        gain = [o["fedms"][0] - o["fedavg"][0] for _, o in ran if "fedms" in o and "fedavg" in o]
        dir1 = next((o[ours] for label, _, o in rows if label.endswith("Dir(1)")), {})
        values = {"t1_best_ours": sum(best_method(o) == "fedms" for _, o in ran),
                  "t1_best_paper": sum(best_method(p) == "fedms" for p, _ in ran if "fedms" in p),
                  "t1_rows": len(ran), "t1_gain": float(np.nanmean(gain)) if gain else float("nan"),
                  "t1_dir1_fedms": dir1.get("fedms", (float("nan"),))[0],
                  "t1_score": self.params.get("table1_score", "last round"),
                  "t1_score_paper": self.paper_params.get("table1_score", "last round")}
        return Table(self.styled(rows), values, data=rows)

    def softmax_table(self, rows) -> Table:
        """Which softmax of Eq. 12 lands nearer the paper, for this build and the stored runs (``rows``: Table 1's)."""
        # lazy: pandas (book extra); the queue imports the chapters without it
        import pandas as pd

        verdict = pd.DataFrame([{"source": src, **v} for src, _, _ in self.by_source()
                                for v in softmax_verdict(rows, src)])
        if not len(verdict):
            return Table.formatted(None, {"t1_softmax_source": "—", "t1_softmax_verdict": "not run in this profile"},
                                   "No softmax variants in this profile.")
        shown = verdict.source.iloc[-1]  # the stored paper-profile runs when they include the variants
        first = verdict[verdict.source == shown]
        text = "; ".join(f"{r.method}: {r.nearer} (mean gap {r['gap, softmax(Ŝ) (Eq. 12)']:.2f} vs "
                         f"{r['gap, softmax(100 Ŝ)']:.2f} points over {r.rows} setting(s))"
                         for _, r in first.iterrows())
        return Table.formatted(verdict.set_index(["source", "method"]),
                               {"t1_softmax_source": shown, "t1_softmax_verdict": text}, precision=2)

    def table1_cifar10(self) -> Table:
        """Table 1 (CIFAR-10), styled (bold: the best per line on shared seeds; None when not run), its numbers,
        a note (the data, or why there are no rows)."""
        rows = self.table1_rows(cifar10=True) if self.cifar_note() else []
        ran = [o[self.ours] for _, _, o in rows if best_method(o[self.ours]) is not None]
        values = {"t1c_best": sum(best_method(o) == "fedms" for o in ran), "t1c_n": len(ran)}
        if not rows:
            return Table(None, values, note="No CIFAR-10 runs in this build (not in the experiments, or no CIFAR-10 "
                                            "under the data root).")
        return Table(self.styled(rows), values, note=f"data: {self.cifar_note()}; local training in "
                                                     f"{precisions.in_force(self.params)} (the precision screen's choice)")

    def table1_cifar10_earlier(self) -> Table:
        """Table 1 (CIFAR-10) from stored runs the paper profile no longer backs, shown apart as stale: those
        of the original recipe, once the profile has adopted another (``cifar10_reading``), and those run
        under the earlier validation reading (held out of training, against §5.1). No frame when neither
        applies or none is stored."""
        earlier, values = readings.earlier_recipe(self.paper_params)
        if not self.cifar_note():
            return readings.earlier_table(None, values)
        sources = []
        if earlier is not None:
            sources.append((f"{OURS_STORED}, earlier recipe (stale)", {**earlier, "table1_reading": SCREEN_READING}))
        if table1_reading(self.paper_params) != SCREEN_READING:
            sources.append((f"{OURS_STORED}, validation held out of training (stale)",
                            {**self.paper_params, "table1_reading": SCREEN_READING}))
        found, n = [], 0
        for label, params in sources:
            splits, methods = table1_grid(params, True)
            stored = stored_results(self.name, [run_config(params, s, m, seed, True) for s in splits
                                                for m in methods for seed in params["seeds"]]).results
            n += len(stored)
            if stored:
                found.append((label, stored, params))
        values["t1c_earlier_n"] = n
        rows = self.table1_rows(True, found) if found else []
        return readings.earlier_table(self.comparison(rows) if rows else None, values)

    def fig2(self):
        """Fig. 2: FedAvg with and without the Maverick, and GTG vs MS-GTG rewards of each."""
        # lazy: matplotlib (~0.5 s); the queue imports the chapters without it
        import matplotlib.pyplot as plt

        nan = float("nan")
        if "fig2" not in self.params["experiments"]:
            return None, {"f2_gap": nan, "f2_gtg": nan, "f2_ms": nan, "f2_wins": 0, "f2_rounds": 0,
                          "f2_verdict": "not more"}
        seed = self.params["seeds"][0]
        with_mav = self.result(fig2_config(self.params, seed, True))
        without = self.result(fig2_config(self.params, seed, False))
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6), layout="constrained")
        for res, name in ((with_mav, "with all clients"), (without, "without the Maverick")):
            ax1.plot(*curve(res), label=name)
        ax1.set(xlabel="round", ylabel="test accuracy (%)", title="(a) accuracy")
        ax1.legend()
        mav = int(np.flatnonzero(np.asarray(with_mav.meta["client_roles"]) == "maverick")[0])
        gtg = np.array([h["diagnostics"]["rewards_gtg"] for h in with_mav.history])
        ms = np.array([h["diagnostics"]["rewards_ms"] for h in with_mav.history])
        others = np.arange(gtg.shape[1]) != mav
        r = np.arange(1, len(gtg) + 1)
        ax2.plot(r, gtg[:, mav], "C0-", label="Maverick, GTG")
        ax2.plot(r, ms[:, mav], "C3-", label="Maverick, MS-GTG")
        ax2.plot(r, gtg[:, others].mean(1), "C0:", label="others (mean), GTG")
        ax2.plot(r, ms[:, others].mean(1), "C3:", label="others (mean), MS-GTG")
        ax2.axhline(0, color="gray", lw=0.5)
        ax2.set(xlabel="round", ylabel="Shapley reward", title="(b) Shapley rewards")
        ax2.legend(fontsize=8)
        _integer_rounds(ax1, ax2)
        mav_gtg, mav_ms = float(gtg[:, mav].mean()), float(ms[:, mav].mean())
        return fig, {"f2_gap": 100 * (with_mav.final["accuracy"] - without.final["accuracy"]), "f2_gtg": mav_gtg,
                     "f2_ms": mav_ms, "f2_wins": int((ms[:, mav] > gtg[:, mav]).sum()), "f2_rounds": len(r),
                     "f2_verdict": "more" if mav_ms > mav_gtg else "not more"}

    def figs3_5(self) -> Table:
        """Figs. 3-5, one figure per Table 1 split: accuracy curves and cumulative rewards of the
        Mavericks vs the others (``figure``: the list, shown first); the table of final cumulative rewards."""
        # lazy: pandas (book extra), matplotlib (~0.5 s); the queue imports the chapters without them
        import matplotlib.pyplot as plt
        import pandas as pd

        methods = self.params["methods"]
        reward_methods = [m for m in REWARD_METHODS if m in methods]
        seed = self.params["seeds"][0]
        figures, ratios = [], {}
        for split in (self.params["splits"] if "table1" in self.params["experiments"] else []):
            # the runs of this split (an evidence build shows only the stored ones; a split without any is left out)
            found = {m: self.result(run_config(self.params, split, m, seed)) for m in methods}
            found = {m: r for m, r in found.items() if r is not None}
            if not found:
                continue
            fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6), layout="constrained")
            for i, m in enumerate(methods):
                if m in found:
                    ax1.plot(*curve(found[m]), color=f"C{i}", label=METHOD_LABELS[m])
            ax1.set(xlabel="round", ylabel="test accuracy (%)", title=f"(a) accuracy, Mavericks + {split}")
            ax1.legend(fontsize=7)
            for m in (m for m in reward_methods if m in found):
                s = reward_series(found[m])
                r = np.arange(1, len(s["cumulative_maverick"]) + 1)
                color = f"C{methods.index(m)}"
                ax2.plot(r, s["cumulative_maverick"], "-", color=color, label=f"{METHOD_LABELS[m]}: Mavericks")
                ax2.plot(r, s["cumulative_other"], ":", color=color, label=f"{METHOD_LABELS[m]}: others")
                ratios[(split, m)] = (s["cumulative_maverick"][-1], s["cumulative_other"][-1])
            ax2.axhline(0, color="gray", lw=0.5)
            ax2.set(xlabel="round", ylabel="cumulative reward per client", title="(b) Shapley rewards")
            ax2.legend(fontsize=7)
            _integer_rounds(ax1, ax2)
            figures.append(fig)
        frame = pd.DataFrame([{"setting": s, "method": METHOD_LABELS[m], "Mavericks": v[0], "others": v[1],
                               "Mavericks above others": v[0] > v[1]} for (s, m), v in ratios.items()])
        above = {m: int(sum(v[0] > v[1] for (_, mm), v in ratios.items() if mm == m)) for m in reward_methods}
        values = {"f35_fedms": above.get("fedms", 0), "f35_sfedavg": above.get("s_fedavg", 0),
                  "f35_greedy": above.get("greedyfed", 0), "f35_n": len({split for split, _ in ratios})}
        rewards = (frame.set_index(["setting", "method"]).style.format({"Mavericks": "{:.4f}", "others": "{:.4f}"})
                   if len(frame) else None)
        return Table(rewards, values, figure=figures, order=("figure", "frame"))

    def table2(self) -> Table:
        """Table 2: participation rate (%) per client role, paper vs ours (mean over seeds; None: not run)."""
        # lazy: pandas (book extra); the queue imports the chapters without it
        import pandas as pd

        nan = float("nan")
        if "table2" not in self.params["experiments"]:
            return Table(None, {"t2_bad": nan, "t2_mav": nan, "t2_fedavg_mav": nan})
        lines = []
        for m in self.params["methods"]:
            label = METHOD_LABELS[m]
            paper = {c: v[0] for c, v in frames.paper_values(self.reference, "Table 2", label, ROLE_COLUMNS.values(),
                                                              str).items()}
            rates = [participation(self.result(adversarial_config(self.params, m, s))) for s in self.params["seeds"]]
            mean = {ROLE_COLUMNS[k]: float(np.mean([r[k] for r in rates])) for k in ROLE_COLUMNS}
            lines += [{"method": label, "source": "paper", **paper}, {"method": label, "source": self.ours, **mean}]
        table = pd.DataFrame(lines).set_index(["method", "source"])
        ours = table.xs(self.ours, level="source")
        bad = ["Label-flipping", "Data-poisoned", "Update-poisoned", "Free-riding"]
        has = lambda m: m in ours.index  # noqa: E731
        values = {"t2_bad": float(ours.loc["FedMS", bad].mean()) if has("FedMS") else nan,
                  "t2_mav": float(ours.loc["FedMS", "Mavericks"]) if has("FedMS") else nan,
                  "t2_fedavg_mav": float(ours.loc["FedAvg", "Mavericks"]) if has("FedAvg") else nan}
        return Table(table.style.format(precision=1), values)

    def shortfalls(self, threshold: float = 10.0) -> Table:
        """Table 1 runs (this build's and the stored paper-profile ones) ending more than ``threshold``
        points below FedAvg on the same federation, each with its reading of the history (a note when none)."""
        # lazy: pandas (book extra); the queue imports the chapters without it
        import pandas as pd

        lines = []
        for source, results, params in self.by_source():
            for split in (params["splits"] if "table1" in params["experiments"] else []):
                for seed in params["seeds"]:
                    fedavg = results.get(run_config(params, split, "fedavg", seed).key())
                    for m in table1_grid(params)[1] if fedavg is not None else []:
                        run = results.get(run_config(params, split, m, seed).key())
                        gap = 100 * (fedavg.final["accuracy"] - run.final["accuracy"]) if run else 0.0
                        if gap > threshold:
                            lines.append({"source": source, "setting": f"Mavericks + {split}", "seed": seed,
                                          "method": METHOD_LABELS[m], "gap to FedAvg (points)": round(gap, 2),
                                          **diagnose_shortfall(run, fedavg)})
        if not lines:
            return Table(None, note=f"No Table 1 run ends more than {threshold:g} points below FedAvg.",
                         print_note=False)
        return Table(pd.DataFrame(lines).set_index(["source", "setting", "seed", "method"]))

    def maverick_readings(self) -> Table:
        """FedAvg's Table 1 under every reading of §5.1 (issue 30), from the stored paper-profile runs of
        seed 0: the candidates' numbers and gaps (a cell without a stored run says so), the chosen
        reading by ``calibrate_maverick_readings``'s rule (FedAvg only), and the Maverick classes'
        last-round accuracy of each run. No frame (a note) when no candidate has a stored run."""
        params = self.paper_params
        rows = maverick_reading_configs(params)
        stored = stored_results(self.name, [c for *_, c in rows]).results
        frame, chosen = calibrate_maverick_readings(params, stored, self.reference)
        n_runs = sum(c.key() in stored for *_, c in rows)
        values = {"mr_runs": n_runs, "mr_candidates": len(rows), "mr_chosen": "none (no candidate has a run)",
                  "mr_chosen_dir10": float("nan"), "mr_chosen_gap": float("nan"),
                  "mr_protocol": "the protocol stays as it was", "mr_runner_up": "none",
                  "mr_runner_up_gap": float("nan"), "mr_chosen_mav": float("nan"), "mr_runner_up_mav": float("nan")}
        missing = ("No stored FedAvg run of any reading yet (python -m fedlib results --chapter fedms --table "
                   "'Maverick readings').")
        if chosen is None:
            return Table.formatted(None, values, missing)
        for split, reading, config in rows:  # the evidence: do the runs miss the Maverick classes?
            run = stored.get(config.key())
            frame.loc[(reading, slice(None)), f"{split} Maverick classes, last round (%)"] = (
                maverick_class_accuracy(run) if run is not None else np.nan)
        line = frame.loc[chosen]
        within = bool(line["Dir(10) within 3 points"])
        adopted = within and (table1_reading(params), params.get("table1_score", "last round")) == chosen
        values.update({"mr_chosen": f"{chosen[0]}, read as the {chosen[1]}",
                       "mr_chosen_dir10": float(line["Dir(10) ours"]), "mr_chosen_gap": float(line["mean |ours − paper|"]),
                       "mr_protocol": ("it is the paper profile's protocol (params/fedms/paper.yaml: table1_reading "
                                       "and table1_score)" if adopted else
                                       "it lands within 3 points of the paper on Dir(10), but the paper profile does "
                                       "not use it yet" if within else
                                       "no candidate measured lands within 3 points of the paper on Dir(10), so the "
                                       "protocol stays as it was")})
        gaps = frame["mean |ours − paper|"].dropna()
        others = gaps[[i[0] != chosen[0] for i in gaps.index]]  # the best of the other run readings
        mav = "Dir(10) Maverick classes, last round (%)"
        values["mr_chosen_mav"] = float(line[mav])
        if len(others):
            runner_up = others.index[int(np.argmin(others.to_numpy()))]
            values.update({"mr_runner_up": f"{runner_up[0]}, read as the {runner_up[1]}",
                           "mr_runner_up_gap": float(others[runner_up]),
                           "mr_runner_up_mav": float(frame.loc[runner_up, mav])})
        measured = [c for c in frame.columns if c.endswith("ours") or "Maverick classes" in c]
        return Table.formatted(readings.shown(frame, chosen, measured), values, missing, precision=2)

    def cifar10_readings(self) -> Table:
        """FedAvg's CIFAR-10 Table 1 cells under every reading of ``CIFAR10_READINGS`` (issue 30), from the
        stored paper-profile runs of seed 0: ours against the paper per split, and the reading
        ``calibrate_cifar10_readings``'s rule picks. No frame (a note) while no reading has a stored run."""
        params = self.paper_params
        rows = cifar10_reading_configs(params)
        stored = stored_results(self.name, [c for *_, c in rows]).results
        frame, chosen = calibrate_cifar10_readings(params, stored, self.reference)
        shown, values = readings.page(frame, chosen, sum(c.key() in stored for *_, c in rows), len(rows),
                                      params=params, profile_file="params/fedms/paper.yaml")
        return Table.formatted(shown, values, "No stored FedAvg run of any CIFAR-10 reading yet (python -m fedlib "
                                              "results --chapter fedms --table 'CIFAR-10 readings').", precision=2)

    def precision_screen(self) -> Table:
        """The precision screen (issue 45): FedAvg on CIFAR-10 Dir(10) in float32 and in bfloat16 local training,
        paired by seed, from the stored paper-profile runs; the rule's choice beside the profile's (glue values
        ``ps_*``). No frame (a note) while no seed is paired."""
        rows = precision_screen_configs(self.paper_params)
        stored = stored_results(self.name, [c for _, c in rows]).results
        return precisions.page(self.name, rows, stored, self.paper_params)

    def headlines(self, rows1, t2_mav: float):
        """The page's headline claims for the book's front page."""
        out = [{"claim": f"FedMS accuracy, MNIST {label} (Table 1)", "paper": paper["fedms"][0],
                "ours": round(src[self.ours]["fedms"][0], 2), "unit": "%"}
               for label, paper, src in rows1
               if np.isfinite(src[self.ours].get("fedms", (np.nan,))[0])
               and np.isfinite(paper.get("fedms", (np.nan,))[0])]
        if "table2" in self.params["experiments"]:
            out.append({"claim": "FedMS Maverick participation, MNIST Dir(0.1) (Table 2)", "paper": 54.0,
                        "ours": round(t2_mav, 1), "unit": "%"})
        return self.record_headlines(out)


def _integer_rounds(*axes) -> None:
    # lazy: matplotlib (~0.5 s); the queue imports the chapters without it
    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
