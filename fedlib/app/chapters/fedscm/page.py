"""The FedSCM page (book/fedscm.ipynb): Theorems 3, 6 and 9 by simulation, Tables 1, 2 and 4, Figs. 5 and 8
and the issue-22 diagnosis."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ....data_files import DataNotFoundError
from ....events import report
from ....methods import scm
from ....results import RunResult
from ....scm_pipeline import run_pipeline
from ....stats import pm
from ...kit import frames
from ...kit.stored import NothingStored, evidence_summary
from ...kit.tables import Table
from ..base import Chapter
from .analysis import (
    EXPERTISE,
    SOLVER_VARIANTS,
    _expert_sample,
    accuracy_rows,
    constant_predictor_demo,
    diagnosis_rows,
    recovery_curve,
)
from .protocol import (
    diagnosis_configs,
    experiment_configs,
    pipeline_config,
    selected_vs_unselected,
    stored_results,
)

if TYPE_CHECKING:
    pass


# ----------------------------------------------------------------------------- the page

TABLE2_LABELS = ["FedAvg", "K3DA", "Co-MDA", "FMDA-OT", "SDEA", "Source Free", "Best Source", "Random (K = 3)",
                 "Random (K = 5)", "Random (K = 10)", "FedSCM (γ = 0.67)", "FedSCM (γ = 0.8)", "FedSCM (γ = 0.9)"]
TABLE4_LABELS = ["FedAvg", "K3DA", "Co-MDA", "FMDA-OT", "SDEA", "Source Free", "Best Source",
                 "FedSCM (γ = 0.67)", "FedSCM (γ = 0.8)"]
HEADLINE_LABELS = ("FedSCM (γ = 0.67)", "FedSCM (γ = 0.8)", "FedAvg", "Random (K = 3)")
DISSIMILARITIES = ("D.R.", "Hamming", "Entropy", "Cosine", "F1")


def _markdown(text: str):
    # lazy: IPython (book extra); the queue imports the chapters without it
    from IPython.display import Markdown

    return Markdown(text)


def _best(values: dict[str, tuple[float, float]], prefix: str) -> float:
    """The best mean of the methods whose label starts with ``prefix`` (e.g. every FedSCM γ)."""
    return max(v[0] for m, v in values.items() if m.startswith(prefix))


def _column(values: dict[str, tuple[float, float]], labels) -> dict[str, str]:
    """A table column: "mean ± std" per method label, "—" where there is none."""
    return {m: pm(*values.get(m, (np.nan, np.nan))) for m in labels}


def _weights_over_accuracy(ax, acc, weights, color=None):
    """A client scatter of ``weights`` against target accuracy over the histogram of accuracies."""
    twin = ax.twinx()
    twin.hist(acc, bins=20, color="tab:orange", alpha=0.35)
    twin.set_ylabel("clients", color="tab:orange")
    ax.scatter(acc, weights, s=14, color=color, zorder=3)
    ax.set_zorder(twin.get_zorder() + 1)
    ax.patch.set_visible(False)


class FedSCM(Chapter):
    """The FedSCM page: the theory in simulation, then the pipeline's Tables 1, 2 and 4, Figs. 5 and 8,
    the γ counts and issue 22's diagnosis. Its runs are pipeline records (``RunResult``s whose sections are in
    ``parts``), not engine runs."""

    name = "fedscm"

    @property
    def paper_name(self) -> str:
        """The paper's dataset compared with ours (the Fashion-MNIST stand-in is compared with CIFAR-10)."""
        return {"cifar100": "CIFAR-100", "svhn": "SVHN"}.get(self.params["dataset"], "CIFAR-10")

    @property
    def paper_table(self) -> str:
        return "Table 3" if self.params["dataset"] == "svhn" else "Table 2"

    # -- the runs ------------------------------------------------------------------------
    def run(self, configs=None) -> dict[str, RunResult]:
        """This build's federations by config key (none when the data is missing), then the stored
        paper-profile ones (``stored``); prints a summary."""
        configs, p, self.ours = self.configs() if configs is None else configs, self.params, "ours"
        if self.evidence:  # the stored paper-profile federations stand for this build's: nothing trains
            return self._stored_federations(configs)
        report("batch", total=len(configs))
        try:
            self.results = {c.key(): run_pipeline(c) for c in configs}
        except DataNotFoundError as err:
            print(f"Pipeline skipped: {err}")
        if self.results:
            first = self.results[configs[0].key()]
            source, name = first.meta["dataset_source"], first.config["dataset"]
            jpeg = " (JPEG copy)" if name == "cifar10" and "jpeg" in source.lower() else ""
            name = {"fmnist": "Fashion-MNIST stand-in", "cifar10": "CIFAR-10"}.get(name, name)  # as the page names it
            self.ours, t = f"ours ({name}{jpeg}, {p['model']})", first.meta["timings"]
            print(f"{len(self.results)} federation(s); data: {source}; device: {first.meta['device']}")
            print(f"first federation: local training of {p['n_clients']} clients {t['local_training']:.1f} s, "
                  f"predictions on {p['server_samples']} server samples {t['predictions']:.2f} s, "
                  f"selection ({len(p['gammas'])} γ, {p['solver'].upper()}) {t['selection']:.2f} s; "
                  f"wall time {sum(r.meta['wall_time'] for r in self.results.values()):.0f} s in all")
        self.stored = self.stored_runs()
        print(f"{len(self.stored)} stored paper-profile federation(s) under results/runs/"
              + (" (shown in their own column of Table 2)" if self.stored else ""))
        return self.results

    def _stored_federations(self, configs) -> dict[str, RunResult]:
        """The evidence profile's run: the stored federations of ``configs`` (NothingStored: none)."""
        self.stored = self.stored_runs()
        self.results = {c.key(): self.stored[c.key()] for c in configs if c.key() in self.stored}
        summary = evidence_summary(self.name, len(configs), len(configs) - len(self.results))
        if not self.results:
            raise NothingStored(summary)
        self.ours = "stored paper profile"
        print(summary)
        return self.results

    def stored_runs(self, configs=None) -> dict[str, RunResult]:
        """The stored paper-profile pipeline records, by config key."""
        return stored_results(self.paper_params)

    def fig5_result(self) -> RunResult:
        """The federation of Figs. 5 and 8, Table 1 and issue 22: label shift, α = stability_alpha, first seed."""
        p = self.params
        return self.results[pipeline_config(p, "label", p["stability_alpha"], p["seeds"][0]).key()]

    def paper_column(self, table: str, column: str, labels) -> dict[str, tuple[float, float]]:
        """The paper's (mean, std) of each method label in one column of ``table`` (NaN where it has none)."""
        transposed = self.reference.rename(columns={"row": "column", "column": "row"})  # methods are its rows
        return frames.paper_values(transposed, table, column, labels, str)

    # -- theory ----------------------------------------------------------------------------
    def theorem3(self, k: int = 50, n: int = 200, c: int = 10) -> Table:
        """Theorem 3 per γ and solver: non-zero weights of the raw output (the selection), Σλ, the L1
        distance to the vertex its weights rank highest, and whether it has the vertex's structure."""
        # lazy: pandas (book extra); the queue imports the chapters without it
        import pandas as pd

        if self.evidence and not self.stored_runs():  # the simulations take minutes: not for a page with no runs
            configs = self.configs()
            raise NothingStored(evidence_summary(self.name, len(configs), len(configs)))
        trials, rows = max(2, self.params["theory_trials"] // 4), []
        for gamma in self.params["sparsity_gammas"]:
            full, rest, count = scm.vertex_counts(gamma)
            for label, (solver, extra) in SOLVER_VARIANTS.items():
                outs = [scm.select(_expert_sample(k, n, c, 3, t, hard=False, noise_alpha=1.0).probs, gamma, solver,
                                   **extra) for t in range(trials)]
                vertices = sum(scm.is_sparse_vertex(o.raw, gamma, atol=1e-5) for o in outs)
                rows.append({"γ": gamma, "solver": label, "⌈1/(1−γ)⌉": count,
                             "Σλ (min)": min(float(o.raw.sum()) for o in outs), "weights at 1−γ": full,
                             "remainder weight": round(rest, 4),
                             "non-zero (raw, mean)": float(np.mean([len(o.selected) for o in outs])),
                             "L1 to vertex (raw, max)": max(float((o.raw - scm.to_vertex(o.raw, gamma)).abs().sum())
                                                            for o in outs),
                             "raw output is a vertex": f"{vertices}/{trials}"})
        sparsity = pd.DataFrame(rows)
        values = {"t3_ok": int((sparsity["raw output is a vertex"] == f"{trials}/{trials}").sum()),
                  "t3_rows": len(sparsity), "t3_dist": float(sparsity["L1 to vertex (raw, max)"].max())}
        return Table(sparsity.style.format(precision=3).hide(axis="index"), values)

    def theorem6(self):
        """Theorem 6: exact recovery in the issue's setting, then against n and against K (the figure)."""
        # lazy: matplotlib (~0.5 s); the queue imports the chapters without it
        import matplotlib.pyplot as plt

        p = self.params
        trials, k_grid_n = p["theory_trials"], p["k_grid_n"]
        # the issue's setting: Dirichlet(1) noise, 3 experts with η ≥ 0.9, the others η ≤ 0.1
        samples = [_expert_sample(50, 200, 10, 3, t, hard=False, noise_alpha=1.0) for t in range(trials)]
        easy = {solver: sum(set(scm.select(s.probs, 2 / 3, solver).selected) == set(s.experts) for s in samples)
                / trials for solver in ("pgd", "slsqp")}
        print(f"K = 50, n = 200, γ = 2/3, {trials} trials: exact recovery PGD {easy['pgd']:.0%}, "
              f"SLSQP {easy['slsqp']:.0%}")
        by_n = recovery_curve(p["n_grid"], "n", dict(k=50, c=10), trials)
        by_k = recovery_curve(p["k_grid"], "k", dict(n=k_grid_n, c=10), trials)
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), layout="constrained")
        for ax, vary, curve, xlabel, title in ((axes[0], "n", by_n, "server samples n (K = 50)", "recovery vs n"),
                                               (axes[1], "k", by_k, f"clients K (n = {k_grid_n})", "recovery vs K")):
            for solver_name, marker in (("PGD", "o"), ("SLSQP", "s")):
                part = curve[curve.solver == solver_name]
                ax.plot(part[vary], part["recovery"], marker=marker, label=solver_name)
            ax.set(xscale="log", xlabel=xlabel, ylabel="P(exact recovery)", title=title, ylim=(-0.05, 1.05))
            ax.grid(alpha=0.3)
            ax.legend()
        pgd_n = by_n[(by_n.solver == "PGD") & (by_n.recovery >= 0.95)]["n"]
        pgd_k = by_k[by_k.solver == "PGD"].set_index("k")["recovery"]
        return fig, {"easy_pgd": 100 * easy["pgd"], "easy_slsqp": 100 * easy["slsqp"],
                     "n95": _markdown(f"n = {int(pgd_n.min())}" if len(pgd_n) else f"no n up to {max(p['n_grid'])}"),
                     "k_small": f"{pgd_k.iloc[0]:.2f} at K = {pgd_k.index[0]}",
                     "k_large": f"{pgd_k.iloc[-1]:.2f} at K = {pgd_k.index[-1]}"}

    def theorem9(self, k: int = 10, n: int = 60, c: int = 6) -> Table:
        """Theorem 9: how often PGD (Algorithm 1's step) and SLSQP reach the exhaustive global optimum, and the
        worst objective gap at the vertex of their output (Algorithm 1's step can leave Σλ < 1)."""
        # lazy: pandas (book extra); the queue imports the chapters without it
        import pandas as pd

        trials, rows = self.params["optimum_trials"], []
        for gamma in (2 / 3, 0.7, 0.8):
            samples = [_expert_sample(k, n, c, 3, t, hard=False, noise_alpha=0.5) for t in range(trials)]
            best = [scm.exhaustive(s.probs, gamma) for s in samples]
            for solver in ("pgd", "slsqp"):
                outs = [scm.select(s.probs, gamma, solver) for s in samples]
                gaps = np.array([float(scm.objective(scm.to_vertex(o.raw, gamma), s.probs)) - b.objective
                                 for o, s, b in zip(outs, samples, best)])
                same = sum(set(o.selected) == set(b.selected) for o, b in zip(outs, best))
                rows.append({"γ": gamma, "solver": solver.upper(), "vertices searched": len(scm.all_vertices(k, gamma)),
                             "global optimum reached": f"{int((gaps < 1e-9).sum())}/{trials}",
                             "same clients as the optimum": f"{same}/{trials}", "max objective gap": float(gaps.max())})
        optimum = pd.DataFrame(rows)
        pgd = optimum[optimum["solver"] == "PGD"]
        at_two_thirds = np.isclose(pgd["γ"], 2 / 3)
        rest = ", ".join(f"{r['global optimum reached']} at γ = {r['γ']:g}" for _, r in pgd[~at_two_thirds].iterrows())
        values = {"opt_pgd": _markdown(pgd[at_two_thirds].iloc[0]["global optimum reached"]),
                  "opt_rest": _markdown(rest)}
        return Table(optimum.style.format({"γ": "{:.3f}", "max objective gap": "{:.2e}"}).hide(axis="index"), values)

    # -- the pipeline's tables and figures ---------------------------------------------------
    def table2(self) -> Table:
        """Tables 2–3 (label shift): paper vs ours (and the stored paper-profile runs) per α (None: not run, a
        note says so), the numbers, and the per-α bests behind the verdict and the headlines (``data``; [] when
        not run)."""
        # lazy: pandas (book extra); the queue imports the chapters without it
        import pandas as pd

        p, stored_params, paper_name, frame, wins = self.params, self.paper_params, self.paper_name, {}, []
        if self.results and "table2" in p["experiments"]:
            for alpha in p["alphas"]:
                ours = accuracy_rows(self.results, [pipeline_config(p, "label", alpha, s) for s in p["seeds"]])
                paper = self.paper_column(self.paper_table, f"{paper_name} α={alpha}", TABLE2_LABELS)
                frame[(f"α = {alpha}", f"paper ({paper_name})")] = _column(paper, TABLE2_LABELS)
                frame[(f"α = {alpha}", self.ours)] = _column(ours, TABLE2_LABELS)
                stored_cfgs = [pipeline_config(stored_params, "label", alpha, s) for s in stored_params["seeds"]]
                if alpha in stored_params["alphas"] and any(c.key() in self.stored for c in stored_cfgs):
                    frame[(f"α = {alpha}", "stored paper profile")] = _column(accuracy_rows(self.stored, stored_cfgs),
                                                                              TABLE2_LABELS)
                wins.append({"α": alpha, "FedSCM": _best(ours, "FedSCM"), "Random": _best(ours, "Random"),
                             "FedAvg": ours.get("FedAvg", (np.nan,))[0], "ours": ours, "paper": paper})
        table = pd.DataFrame(frame) if frame else None  # tuple keys: (α, source) column levels
        detail = "; ".join(
            f"α = {w['α']}: FedSCM {w['FedSCM']:.1f} %, best Random {w['Random']:.1f} %, FedAvg {w['FedAvg']:.1f} % "
            f"(paper, {paper_name}: {_best(w['paper'], 'FedSCM'):.1f} / {_best(w['paper'], 'Random'):.1f} / "
            f"{w['paper']['FedAvg'][0]:.1f} %)" for w in wins)
        values = {"t2_beats": sum(w["FedSCM"] > max(w["Random"], w["FedAvg"]) for w in wins), "t2_n": len(wins),
                  "t2_detail": _markdown(detail or "not run")}
        return Table(table, values, note=None if frame else "Table 2 not run (no pipeline results).", data=wins)

    def table4(self) -> Table:
        """Table 4 (covariate shift): paper vs ours, the methods the paper lacks below its own (None: not run)."""
        # lazy: pandas (book extra); the queue imports the chapters without it
        import pandas as pd

        if not (self.results and "table4" in self.params["experiments"]):
            return Table(None, {**dict.fromkeys(("t4_scm", "t4_fedavg", "t4_best"), np.nan),
                                "t4_paper": _markdown("not compared")}, note="Table 4 not run.")
        ours = accuracy_rows(self.results, experiment_configs(self.params, "table4"))
        paper = self.paper_column("Table 4", self.paper_name, TABLE4_LABELS)
        rows = TABLE4_LABELS + [m for m in ours if m not in TABLE4_LABELS]
        table = pd.DataFrame({f"paper ({self.paper_name})": _column(paper, rows), self.ours: _column(ours, rows)})
        paper_text = f"{_best(paper, 'FedSCM'):.2f} %, {paper['FedAvg'][0]:.2f} %, {paper['Best Source'][0]:.2f} %"
        return Table(table, {"t4_scm": _best(ours, "FedSCM"), "t4_fedavg": ours["FedAvg"][0],
                             "t4_best": ours["Best Source"][0], "t4_paper": _markdown(f"{self.paper_name}: {paper_text}")})

    def fig5(self) -> Table:
        """Fig. 5: every client's FedSCM weight against its target accuracy, per γ (shown first); Fig. 6 as numbers:
        the selected clients against the others (None, no figure: not run)."""
        # lazy: pandas (book extra), matplotlib (~0.5 s); the queue imports the chapters without them
        import matplotlib.pyplot as plt
        import pandas as pd

        if not self.results:
            return Table(None, {"f5_rank": np.nan, "f5_best": np.nan, "f5_sel": _markdown("not run")},
                         order=("figure", "frame"))
        fed5, gammas = self.fig5_result(), self.params["gammas"]
        selections = fed5.parts["selections"]
        acc = 100 * np.asarray(fed5.parts["clients"]["target_accuracy"])
        fig, axes = plt.subplots(1, len(gammas), figsize=(4.2 * len(gammas), 3.3), layout="constrained", squeeze=False)
        for ax, g in zip(axes[0], gammas):
            _weights_over_accuracy(ax, acc, np.asarray(selections[f"{g:g}"]["weights"]), color="tab:green")
            ax.set(xlabel="client accuracy on the target (%)", ylabel="FedSCM weight λ", title=f"γ = {g:g}")
        gk = f"{gammas[0]:g}"
        chosen = selections[gk]["selected"]
        split = pd.DataFrame(selected_vs_unselected(fed5, gk)).T.style.format(precision=3)
        rank = float(np.mean([100.0 * (acc < acc[i]).mean() for i in chosen]))  # percentile among the K clients
        return Table(split, {"f5_rank": rank, "f5_best": float(acc.max()),
                             "f5_sel": _markdown(", ".join(f"{acc[i]:.1f} %" for i in chosen))},
                     figure=fig, order=("figure", "frame"))

    def counts(self) -> Table:
        """Issue 18.4, per γ over this build's federations: the solver's raw support (the selection), Σλ of
        the raw output, the count after vertex rounding (Theorem 3's ⌈1/(1−γ)⌉) and the paper's stated count."""
        # lazy: pandas (book extra); the queue imports the chapters without it
        import pandas as pd

        rows, paper_count = [], {0.67: 3, 0.7: 4, 0.8: 5, 0.9: 10}
        for g in self.params["gammas"] if self.results else []:
            sel = [r.parts["selections"][f"{g:g}"] for r in self.results.values()
                   if f"{g:g}" in r.parts.get("selections", {})]
            full, rest, count = scm.vertex_counts(g)
            rows.append({"γ": g, "cap 1 − γ": round(1 - g, 4),
                         "raw support (selected), runs": ", ".join(str(len(s["raw_selected"])) for s in sel),
                         "Σλ raw (min)": min((float(np.sum(s["raw_weights"])) for s in sel), default=np.nan),
                         "vertex rounding": ", ".join(str(len(s["vertex_selected"])) for s in sel), "⌈1/(1−γ)⌉": count,
                         "clients at the cap": full, "remainder": round(rest, 4),
                         "paper says": paper_count.get(g, "—")})
        at_067 = next((r for r in rows if np.isclose(r["γ"], 0.67)), None)
        values = {"cnt_raw": _markdown(at_067["raw support (selected), runs"] if at_067 else "not run"),
                  "cnt_vertex": _markdown(at_067["vertex rounding"] if at_067 else "not run"),
                  "cnt_sum": at_067["Σλ raw (min)"] if at_067 else np.nan,
                  **dict(zip(("cnt_full", "cnt_rest", "cnt_theorem"), scm.vertex_counts(0.67)))}
        return Table(pd.DataFrame(rows).style.format(precision=4).hide(axis="index") if self.results else None, values)

    def fig8(self):
        """Fig. 8: estimated expertise η̂ against target accuracy (the federation of Fig. 5)."""
        # lazy: matplotlib (~0.5 s); the queue imports the chapters without it
        import matplotlib.pyplot as plt

        clients = self.fig5_result().parts["clients"] if self.results else {}
        if "eta_hat" not in clients:
            return None, {"f8_corr": np.nan}
        acc = 100 * np.asarray(clients["target_accuracy"])
        eta_hat = np.asarray(clients["eta_hat"])
        fig, ax = plt.subplots(figsize=(5.5, 3.4), layout="constrained")
        _weights_over_accuracy(ax, acc, eta_hat)
        ax.set(xlabel="client accuracy on the target (%)", ylabel="estimated expertise η̂")
        return fig, {"f8_corr": float(np.corrcoef(acc, eta_hat)[0, 1])}

    def issue22(self) -> dict[str, Any]:
        """Issue 22: (a) bug checks, (b) the trained clients against Def. 4, (c) temperatures and protocol
        variants, and the noise-model simulation; displays its tables and returns the glued values."""
        # lazy: pandas and IPython (book extra); the queue imports the chapters without them
        import pandas as pd
        from IPython.display import display

        if not self.results:
            return {**dict.fromkeys(["d_sum", "d_align", "d_tv", "d_overlap", "d_obj_sel", "d_obj_top",
                                     *(name for _, name in EXPERTISE.values()), "d_sel_share", "d_demo_ok",
                                     "d_demo_bad", "d_demo_const"], np.nan),
                    **{k: _markdown("not run") for k in ("d_temps", "d_variants", "d_good", "d_a", "d_b", "d_above",
                                                           "d_wide", "d_struct")}}
        dg = self.fig5_result().parts["diagnosis"]
        checks, ex = dg["checks"], dg.get("expertise", {})
        print("(a) bug checks on the Fig. 5 federation")
        display(pd.Series(checks, name="value").to_frame())
        if "expertise" in dg:
            print("(b) trained clients against Def. 4 (same η̂)")
            display(pd.Series(ex, name="value").to_frame())
        modal, share = np.asarray(dg["modal_class"]), np.asarray(dg["mode_share"])
        selected = np.asarray(dg["selected"], dtype=int)
        print(f"selected clients {selected.tolist()}: modal predicted classes {modal[selected].tolist()}, "
              f"share of inputs on their modal class {np.round(share[selected], 2).tolist()}; "
              f"target's majority class {dg['target_majority_class']}")
        if dg["temperatures"]:
            print("(c) selection at other prediction temperatures (same client models)")
            display(pd.DataFrame(dg["temperatures"]).style.format(precision=1).hide(axis="index"))
        variants = {}
        for name, cfg in diagnosis_configs(self.params):
            try:
                variants[name] = run_pipeline(cfg)
            except DataNotFoundError as err:
                print(f"variant {name!r} skipped: {err}")
        print("(c) protocol variants, selection only (γ = first of gammas)")
        diag = diagnosis_rows(variants)
        display(diag.style.format(precision=2).hide(axis="index"))
        stored = stored_results(self.paper_params, diagnosis=True)
        stored = {name: stored[c.key()] for name, c in diagnosis_configs(self.paper_params) if c.key() in stored}
        if stored:
            print("stored paper-profile variants (CIFAR-10, VGG-11, K = 500; selection only)")
            display(diagnosis_rows(stored).style.format(precision=2).hide(axis="index"))
        else:
            print("No stored paper-profile variants yet (CIFAR-10 / VGG-11 / K = 500 needs a GPU: "
                  "fedlib.app.chapters.fedscm.store_results('paper', diagnosis=True)).")
        demo = constant_predictor_demo(max(4, self.params["theory_trials"] // 2))
        print("Simulation: the same expertise levels, two noise models for the non-experts (K = 50, n = 200, γ = 2/3)")
        display(demo.style.format(precision=2).hide(axis="index"))

        def variants_where(mask, none: str = "none of them"):
            names = diag[mask]["variant"].tolist()
            return _markdown(", ".join(names) if names else none)

        good = diag[diag["share of selection in top-m"] >= 0.5]["variant"].tolist()
        prob_err, overlap = checks["max |Σ_c h_k(X) − 1|"], checks["server/eval overlap (samples)"]
        aligned = checks["clients whose modal prediction is their majority training class"]
        obj_sel, obj_top = checks["objective at the selection"], checks["objective at the most accurate clients"]
        failed = [name for name, bad in (("probabilities", prob_err > 1e-4), ("class alignment", aligned < 0.5),
                                         ("server/eval split", overlap > 0), ("solver", obj_sel > obj_top + 1e-9))
                  if bad]
        broken = (ex.get("trained: mean mode share", 0) > ex.get("Def. 4 simulation: mean mode share", 1) + 0.2
                  or ex.get("trained: non-expert pairs agreeing on ≥ 90 % of inputs", 0)
                  > ex.get("Def. 4 simulation: non-expert pairs agreeing on ≥ 90 %", 1) + 0.02)
        return {
            "d_sum": prob_err, "d_align": 100 * aligned, "d_tv": checks["TV(server labels, target proportions)"],
            "d_overlap": overlap, "d_obj_sel": obj_sel, "d_obj_top": obj_top,
            **{name: float(ex.get(key, np.nan)) for key, (_, name) in EXPERTISE.items()},
            "d_sel_share": float(share[selected].mean()) if len(selected) else np.nan,
            "d_temps": _markdown("; ".join(f"T = {r['temperature']:g}: {r['selected accuracy (%)']:.1f} %"
                                           for r in dg["temperatures"]) or "not run"),
            "d_variants": _markdown("; ".join(
                f"{r['variant']}: {r['selected accuracy (%)']:.1f} % (top-m {r['top-m accuracy (%)']:.1f} %, "
                f"mean client {r['mean client (%)']:.1f} %, mode share {r['mode share (trained)']:.2f})"
                for _, r in diag.iterrows()) or "not run"),
            "d_good": variants_where(diag["share of selection in top-m"] >= 0.5),
            "d_above": variants_where(diag["selected accuracy (%)"] > diag["mean client (%)"]),
            "d_wide": variants_where(diag["selected"] > diag["selected"].min(), "none"),
            "d_struct": _markdown(
                "The protocol choices tried here (the variants above) change the numbers, not this structure: no "
                "variant puts half of its selection among the most accurate clients." if not good else
                f"Some protocol choices do move the selection into the most accurate clients ({', '.join(good)}); "
                "compare their mode share and agreeing pairs with the others."),
            "d_demo_ok": float(demo["exact recovery"].iloc[0]), "d_demo_bad": float(demo["exact recovery"].iloc[1]),
            "d_demo_const": float(demo["selection = constant predictors of one class"].iloc[1]),
            "d_a": _markdown("*(a) No bug found.*" if not failed else f"*(a) Check(s) failed: {', '.join(failed)}.*"),
            "d_b": _markdown("*(b) The trained clients break the expertise model, and that explains the result.*"
                             if broken else "*(b) On this run the trained clients are not clearly further from Def. 4 "
                                            "than its simulation.*")}

    def table1(self) -> Table:
        """Table 1: stability of repeated selections without and with the size regulariser, paper vs ours (None:
        not run)."""
        # lazy: pandas (book extra); the queue imports the chapters without it
        import pandas as pd

        ours = self.fig5_result().parts.get("stability") if self.results else None
        if ours is None:
            return Table(None, dict.fromkeys(("t1_dr", "t1_dr_sr", "t1_better"), np.nan), note="Table 1 not run.")
        rows = []
        for label in ("FedSCM", "FedSCM+SR"):
            paper = frames.paper_values(self.reference, "Table 1", label, scm.STABILITY_METRICS, str)
            rows += [{"method": label, "source": "paper", **{m: v[0] for m, v in paper.items()}},
                     {"method": label, "source": "ours", **ours[label]}]
        table = pd.DataFrame(rows).set_index(["method", "source"]).style.format(precision=3)
        return Table(table, {"t1_dr": ours["FedSCM"]["D.R."], "t1_dr_sr": ours["FedSCM+SR"]["D.R."],
                             "t1_better": sum(ours["FedSCM+SR"][m] <= ours["FedSCM"][m] for m in DISSIMILARITIES)})

    def headlines(self, wins: list[dict]):
        """The page's headline claims (Table 2, per α) for the book's front page."""
        return self.record_headlines([
            {"claim": f"{label}, label shift α = {w['α']} ({self.paper_table}; paper: {self.paper_name}; {self.ours})",
             "paper": w["paper"][label][0], "ours": round(w["ours"][label][0], 2), "unit": "%", "notes": self.ours}
            for w in wins for label in HEADLINE_LABELS if label in w["ours"]])
