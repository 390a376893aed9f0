"""The FedMS chapter: Maverick-Shapley valuation and FedMS client selection.

Experiments (FedMS §5), each a list of run configs sharing one protocol (the MLP on MNIST,
batch 64, SGD lr 0.05; the paper's reading: FedAvg weighs by n_i (Eq. 3) and the server's
validation set is 20 % of the test set (§5.1), the other 80 % evaluated):
  table1          accuracy of 7 methods, 50 clients (48 + 2 Mavericks), 10 % per round,
                  Mavericks + Dir(10 / 1 / 0.1)                                  (Table 1)
  table1_cifar10  the same on CIFAR-10 with the CNN, when the data root has it    (Table 1)
  fig2            5 clients (4 IID + 1 Maverick, all take part): FedAvg with and without
                  the Maverick, Shapley rewards by GTG and MS-GTG               (Fig. 2)
  table2          58 clients with 2 label-flipping, 2 random-data, 2 random-update clients
                  and 2 free-riders, Mavericks + Dir(0.1): participation rates  (Table 2)
  maverick_readings  FedAvg on Table 1's splits under readings of §5.1 (the Mavericks' share of
                  their class, FedAvg's weights, where the validation set comes from), seed 0
  cifar10_readings   FedAvg on Table 1's CIFAR-10 splits under readings of the CIFAR-10 protocol the
                  paper leaves open (augmentation, weight decay), seed 0
Figs. 3–5 (rewards of Mavericks vs non-Mavericks under FedMS, S-FedAvg and GreedyFed) are
read from the Table 1 runs.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from ...config import RunConfig, make_config
from ...methods import METHODS
from ...results import RunResult
from ..kit import frames
from ..kit.claim_types import Claim, Comparison, Side, cells_row, final
from ..kit.sources import load_profile
from ..kit.stored import stored_results
from . import Paper, readings, run_options, unique_configs
from .base import OURS_STORED, Chapter, curve, dataset_label, queue_item
from .profiles import FederationProfile, Names, Seeds

METHOD_LABELS = {"fedavg": "FedAvg", "fedprox": "FedProx", "poc": "PoC", "fedemd": "FedEMD",
                 "s_fedavg": "S-FedAvg", "greedyfed": "GreedyFed", "fedms": "FedMS",
                 "fedms_x100": "FedMS (softmax ×100)", "s_fedavg_x100": "S-FedAvg (softmax ×100)"}
# Eq. 12 as printed is softmax(Ŝ_i) (the methods' default); these run the scaled softmax
# softmax(100 Ŝ_i), scores in percentage points, beside it (Table 1 only).
SOFTMAX_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "fedms_x100": ("fedms", {"score_scale": 100.0}), "s_fedavg_x100": ("s_fedavg", {"score_scale": 100.0})}
REWARD_METHODS = ("fedms", "s_fedavg", "greedyfed")  # Figs. 3-5: MS-GTG, MR, GTG
SPLITS = {"Dir(10)": 10.0, "Dir(1)": 1.0, "Dir(0.1)": 0.1}

# §5.1 hyper-parameters; per-setting values where the paper tuned them per setting.
PAPER_HPARAMS: dict[str, dict[str, dict[str, Any]]] = {
    "fedprox": {"*": {"mu": 1.0}},
    "poc": {"Dir(10)": {"decay": 1.0}, "*": {"decay": 0.9}},
    "fedemd": {"Dir(10)": {"beta": 0.001}, "*": {"beta": 0.01}},
    "s_fedavg": {"*": {"alpha": 0.7}},
    "greedyfed": {"*": {"alpha": 0.7}},
    "fedms": {"Dir(10)": {"alpha": 0.8}, "*": {"alpha": 0.6, "temperature": 0.01}},
}
ROLE_COLUMNS = {"label_flip": "Label-flipping", "random_data": "Data-poisoned", "random_update": "Update-poisoned",
                "free_rider": "Free-riding", "maverick": "Mavericks"}


def method_spec(method: str, split: str, dataset: str = "mnist", extra: dict | None = None) -> dict[str, Any]:
    """The method with the paper's hyper-parameters for this setting (§5.1)."""
    table = PAPER_HPARAMS.get(method, {})
    spec = {"name": method, **table.get("*", {}), **table.get(split, {})}
    if method == "fedms":
        spec.setdefault("temperature", 0.01)
        if split == "Dir(0.1)" and dataset == "mnist":
            spec["eps_d_end"] = 0.2  # §5.1: the one exception
    return {**spec, **(extra or {})}


def _config(params: dict[str, Any], seed: int, cifar10: bool = False, **fields) -> RunConfig:
    """A run of the chapter's protocol (``cifar10``: the CNN on CIFAR-10 with the profile's ``cifar10_``
    fraction, rounds and local epochs, under its ``cifar10_reading`` recipe); ``fields`` set the rest or
    override."""
    data = {f: params[("cifar10_" if cifar10 else "") + f] for f in ("fraction", "rounds", "local_epochs")}
    return make_config(**{
        **data, "dataset": "cifar10" if cifar10 else params["dataset"], "model": "cnn" if cifar10 else params["model"],
        "lr": params["lr"], "batch_size": params["batch_size"], "test_samples": params["test_samples"],
        "server_val": params["server_val"], "seed": seed, **run_options(params),
        **(readings.recipe(params) if cifar10 else {}), **fields})


def run_config(params: dict[str, Any], split: str, method: str, seed: int, cifar10: bool = False) -> RunConfig:
    """One Table 1 run: 50 clients (48 + 2 Mavericks), Mavericks + Dir(γ), 10 % per round.
    ``method`` may name a softmax variant (``SOFTMAX_VARIANTS``). The profile's ``table1_reading`` (a name of
    ``MAVERICK_RUN_READINGS``, calibrated on MNIST FedAvg; absent: the first, the chapter's original protocol)
    sets, for the whole table (MNIST and CIFAR-10, every method), the Mavericks' share of their class and
    where the validation set comes from, and FedAvg's weights."""
    method, variant = SOFTMAX_VARIANTS.get(method, (method, {}))
    reading = table1_reading(params)
    spec = MAVERICK_RUN_READINGS[reading]
    if method == "fedavg":
        method = spec["method"]
    fields = validation_fields(params, method) if spec["validation"] == "test" else {}
    extra = {**params.get("method_params", {}).get(method, {}), **variant}
    return _config(params, seed, cifar10, n_clients=params["n_clients"], clients_per_round=params["clients_per_round"],
                   split=maverick_split(params, split, maverick_share(params, reading)),
                   method=method_spec(method, split, "cifar10" if cifar10 else params["dataset"], extra), **fields)


def validation_fields(params: dict[str, Any], method: str) -> dict[str, Any]:
    """§5.1: "we randomly split 20 % of testing samples as validation dataset". The other 80 % is evaluated;
    a method with a validation set takes ``server_val`` samples of the rest (``validation_from: test``),
    one without trains on every training sample."""
    n_test = int(round(TEST_SHARE * (params["test_samples"] or 10_000)))
    if METHODS[method].needs_validation:
        return {"validation_from": "test", "server_val": params["server_val"], "test_samples": n_test}
    return {"server_val": None, "test_samples": n_test}


def table1_reading(params: dict[str, Any]) -> str:
    """The profile's ``table1_reading`` (absent: the first run reading, the chapter's original protocol)."""
    name = params.get("table1_reading", next(iter(MAVERICK_RUN_READINGS)))
    if name not in MAVERICK_RUN_READINGS:
        raise ValueError(f"table1_reading: must be one of {', '.join(map(repr, MAVERICK_RUN_READINGS))} (got {name!r})")
    return name


def table1_score(params: dict[str, Any], cifar10: bool = False):
    """How a Table 1 run is read (for ``frames.seed_mean_std``): the profile's ``table1_score``, a name of
    ``MAVERICK_SCORE_READINGS`` calibrated on MNIST (absent: the last round); None is the final accuracy."""
    name = params.get("table1_score", "last round")
    if name not in MAVERICK_SCORE_READINGS:
        raise ValueError(f"table1_score: must be one of {', '.join(map(repr, MAVERICK_SCORE_READINGS))} (got {name!r})")
    return None if name == "last round" else partial(reading_score, last=MAVERICK_SCORE_READINGS[name])


def maverick_split(params: dict[str, Any], split: str, share: float = 1.0) -> dict[str, Any]:
    """Table 1's split spec: Mavericks + Dir(γ), each Maverick holding ``share`` of its class (1, the whole
    class, stays out of the spec and the key, as before the share existed)."""
    spec = {"name": "maverick", "n_mavericks": params["n_mavericks"], "gamma": SPLITS[split]}
    return spec if share == 1.0 else {**spec, "maverick_share": float(share)}


def fig2_config(params: dict[str, Any], seed: int, with_maverick: bool) -> RunConfig:
    """Fig. 2: 4 IID clients + 1 Maverick, all in every round, FedAvg with GTG / MS-GTG rewards."""
    method = {"name": "shapley_rewards", "temperature": 0.01}
    if not with_maverick:
        method["excluded"] = [4]  # maverick_iid puts the Maverick last
    return _config(params, seed, rounds=params["fig2_rounds"], n_clients=5, split={"name": "maverick_iid"},
                   method=method)


def adversarial_config(params: dict[str, Any], method: str, seed: int) -> RunConfig:
    """Table 2: 48 benign + 2 Mavericks + 2 label-flip + 2 random-data + 2 random-update + 2 free-riders,
    Mavericks + Dir(0.1), 10 % of 58 rounded (6) per round."""
    return _config(params, seed, n_clients=58, clients_per_round=params["adversarial_per_round"],
                   split={"name": "adversarial", "gamma": 0.1},
                   method=method_spec(method, "Dir(0.1)", params["dataset"],
                                      params.get("method_params", {}).get(method, {})))


def experiment_configs(params: dict[str, Any], experiment: str) -> list[RunConfig]:
    seeds, methods = params["seeds"], params["methods"]
    if experiment in ("table1", "table1_cifar10"):
        splits, methods = table1_grid(params, experiment == "table1_cifar10")
        return [run_config(params, s, m, seed, experiment == "table1_cifar10") for s in splits for m in methods
                for seed in seeds]
    if experiment == "fig2":
        return [fig2_config(params, seed, w) for w in (True, False) for seed in seeds]
    if experiment == "table2":
        return [adversarial_config(params, m, seed) for m in methods for seed in seeds]
    if experiment == "maverick_readings":
        return [config for *_, config in maverick_reading_configs(params)]
    if experiment == "cifar10_readings":
        return [config for *_, config in cifar10_reading_configs(params)]
    raise ValueError(f"experiments: unknown experiment {experiment!r}")


def table1_grid(params: dict[str, Any], cifar10: bool = False) -> tuple[list[str], list[str]]:
    """Table 1's splits and methods: on MNIST the profile's methods and the softmax variants of those it
    runs, on CIFAR-10 the profile's ``cifar10_`` splits and methods."""
    if cifar10:
        return params["cifar10_splits"], params["cifar10_methods"]
    variants = [v for v in params.get("softmax_variants", []) if SOFTMAX_VARIANTS[v][0] in params["methods"]]
    return params["splits"], list(params["methods"]) + variants


configs = partial(unique_configs, experiment_configs)  # every run of the chapter once


# ----------------------------------------------------------------------------- reading runs


def participation(result) -> dict[str, float]:
    """Participation rate (%) per role: the share of rounds in which a client of that role was
    aggregated with a positive weight (FedMS: in the coreset), averaged over the role's clients."""
    roles, taken = np.asarray(result.meta["client_roles"]), aggregated_rounds(result)
    return {role: float(100.0 * taken[roles == role].mean() / len(result.history)) if (roles == role).any()
            else float("nan") for role in ROLE_COLUMNS}


def reward_series(result, key: str = "rewards") -> dict[str, np.ndarray]:
    """Per round, the mean Shapley reward of the Mavericks and of the other clients among the
    round's valued clients (NaN when none of the group took part), and their cumulative sums
    per client of the group."""
    roles = np.asarray(result.meta["client_roles"])
    mav = roles == "maverick"
    rounds = len(result.history)
    mean = {"maverick": np.full(rounds, np.nan), "other": np.full(rounds, np.nan)}
    total = {"maverick": np.zeros(rounds), "other": np.zeros(rounds)}
    for t, h in enumerate(result.history):
        values = (h.get("diagnostics") or {}).get(key)
        if values is None:
            continue
        clients = np.asarray(h["aggregated"], dtype=np.int64)
        values = np.asarray(values, dtype=float)
        for group, mask in (("maverick", mav[clients]), ("other", ~mav[clients])):
            if mask.any():
                mean[group][t] = values[mask].mean()
                total[group][t] = values[mask].sum()
    n_mav, n_other = max(int(mav.sum()), 1), max(int((~mav).sum()), 1)
    return {"mean_maverick": mean["maverick"], "mean_other": mean["other"],
            "cumulative_maverick": np.cumsum(total["maverick"]) / n_mav,
            "cumulative_other": np.cumsum(total["other"]) / n_other}


def best_method(values: dict[str, tuple]) -> str | None:
    """The best method of ``values`` on the seeds they share (the first of a tie); None: none comparable."""
    best = frames.best_on_shared_seeds(values)
    return next((m for m in values if m in best), None)


def softmax_verdict(rows: list[tuple[str, dict, dict]], source: str) -> list[dict[str, Any]]:
    """Which softmax lands nearer the paper's Table 1: per method with a variant, the mean
    |ours − paper| (points) over the rows where both were run, for Eq. 12 as printed and for
    the ×100 variant, and the nearer one."""
    out = []
    for variant, (method, _) in SOFTMAX_VARIANTS.items():
        gaps = {"printed": [], "x100": []}
        for _, paper, ours in rows:
            values = ours.get(source, {})
            p, a, b = (x.get(m, (np.nan,))[0] for x, m in ((paper, method), (values, method), (values, variant)))
            if p == p and a == a and b == b:
                gaps["printed"].append(abs(a - p))
                gaps["x100"].append(abs(b - p))
        if gaps["printed"]:
            printed, scaled = float(np.mean(gaps["printed"])), float(np.mean(gaps["x100"]))
            out.append({"method": METHOD_LABELS[method], "rows": len(gaps["printed"]),
                        "gap, softmax(Ŝ) (Eq. 12)": printed, "gap, softmax(100 Ŝ)": scaled,
                        "nearer": "Eq. 12 as printed" if printed <= scaled else "×100"})
    return out


# ----------------------------------------------------------------------------- the results queue


def queue_items(params: dict[str, Any]) -> list:
    """Every run of the profile for ``python -m fedlib results`` (fedlib.app.queue), labelled with
    the paper cell it backs; headline row of Table 1: Dir(0.1), where Mavericks matter most."""
    item = partial(queue_item, "fedms", params)
    seeds, experiments, items = params["seeds"], params["experiments"], []
    for cifar10 in [e == "table1_cifar10" for e in ("table1", "table1_cifar10") if e in experiments]:
        splits, methods = table1_grid(params, cifar10)
        data = "CIFAR-10" if cifar10 else dataset_label(params["dataset"])
        items += [item("Table 1", f"{data} {s}", METHOD_LABELS[m], run_config(params, s, m, seed, cifar10),
                       headline=s == "Dir(0.1)") for s in splits for m in methods for seed in seeds]
    if "maverick_readings" in experiments:  # FedAvg under the readings of §5.1, seed 0 (issue 30)
        items += maverick_reading_items(params)
    if "cifar10_readings" in experiments:  # FedAvg under readings of the CIFAR-10 protocol, seed 0 (issue 30)
        items += [queue_item("fedms", params, "CIFAR-10 readings", f"CIFAR-10 {split}", reading, config,
                             table_rank=1, headline=split == "Dir(10)")
                  for split, reading, config in cifar10_reading_configs(params)]
    if "table2" in experiments:
        items += [item("Table 2", METHOD_LABELS[m], "participation", adversarial_config(params, m, seed),
                       headline=m == "fedms", table_rank=1, backs=(("Table 2", METHOD_LABELS[m], "*"),))
                  for m in params["methods"] for seed in seeds]
    if "fig2" in experiments:
        items += [item("Fig. 2", "with Maverick" if w else "without Maverick", "GTG / MS-GTG rewards",
                       fig2_config(params, seed, w), headline=w, table_rank=1) for w in (True, False) for seed in seeds]
    return items


# ----------------------------------------------------------------------------- why a baseline falls short


def aggregated_rounds(result) -> np.ndarray:
    """Per client, the rounds in which it was aggregated with a positive weight."""
    n = len(result.meta["client_roles"])
    used = [np.asarray(h["aggregated"], dtype=np.int64)[np.asarray(h["weights"]) > 0] for h in result.history]
    return np.bincount(np.concatenate(used + [np.zeros(0, dtype=np.int64)]), minlength=n)


def late_gain(result, share: float = 0.2) -> float:
    """Accuracy points gained over the last ``share`` of the rounds (a run still learning gains)."""
    _, acc = curve(result)
    back = max(1, int(len(acc) * share))
    return float(acc[-1] - acc[-1 - back]) if len(acc) > back else float("nan")


def diagnose_shortfall(result, fedavg) -> dict[str, Any]:
    """Why a run ends far below FedAvg on the same federation, from both runs' histories: how often
    the Mavericks (the only holders of their classes) were aggregated, their classes' final
    accuracy, and whether the run was still learning at the end."""
    counts = np.asarray(result.meta["client_class_counts"])
    mavericks = np.asarray(result.meta["client_roles"]) == "maverick"
    classes = np.flatnonzero((counts[mavericks].sum(0) > 0) & (counts[~mavericks].sum(0) == 0))
    taken, taken_avg = aggregated_rounds(result)[mavericks], aggregated_rounds(fedavg)[mavericks]
    acc = 100 * np.asarray(result.final["per_class_accuracy"])[classes]
    acc_avg = 100 * np.asarray(fedavg.final["per_class_accuracy"])[classes]
    gain, gain_avg = late_gain(result), late_gain(fedavg)
    rounds = len(result.history)
    why = []
    if taken.mean() < 0.5 * taken_avg.mean():
        why.append(f"the Mavericks (sole holders of classes {', '.join(map(str, classes))}) were aggregated in "
                   f"{', '.join(map(str, taken))} of {rounds} rounds (FedAvg: {', '.join(map(str, taken_avg))}), so "
                   f"their classes end at {', '.join(f'{a:.0f}' for a in acc)} % (FedAvg: "
                   f"{', '.join(f'{a:.0f}' for a in acc_avg)} %)")
    elif (acc < acc_avg - 30).any():
        mu = result.config["method"].get("mu")
        why.append(f"the Mavericks took part as often as under FedAvg, yet their classes end at "
                   f"{', '.join(f'{a:.0f}' for a in acc)} % (FedAvg: {', '.join(f'{a:.0f}' for a in acc_avg)} %): "
                   f"their rounds moved the global model less"
                   + (f" (the proximal term, μ = {mu:g}, holds each local model near the global one)" if mu else ""))
    if gain > max(2.0, 1.5 * gain_avg):
        why.append(f"it was still learning: +{gain:.1f} points over the last fifth of the rounds (FedAvg "
                   f"{gain_avg:+.1f}), so it converges more slowly within the {rounds} rounds")
    return {"Mavericks aggregated (rounds)": ", ".join(map(str, taken)),
            "Maverick classes' accuracy (%)": ", ".join(f"{a:.0f}" for a in acc),
            "gain, last fifth (points)": round(gain, 2),
            "why (from the run's history)": "; ".join(why) or "neither Maverick starvation nor slow convergence"}


# ----------------------------------------------------------------------------- the page


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

    def table1(self):
        """Table 1 (MNIST): the frame and the numbers the text quotes (over the rows this build ran)."""
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
        return self.comparison(rows), rows, values

    def softmax_table(self, rows):
        """Which softmax of Eq. 12 lands nearer the paper, for this build and the stored runs."""
        import pandas as pd

        verdict = pd.DataFrame([{"source": src, **v} for src, _, _ in self.by_source()
                                for v in softmax_verdict(rows, src)])
        if not len(verdict):
            return None, {"t1_softmax_source": "—", "t1_softmax_verdict": "not run in this profile"}
        shown = verdict.source.iloc[-1]  # the stored paper-profile runs when they include the variants
        first = verdict[verdict.source == shown]
        text = "; ".join(f"{r.method}: {r.nearer} (mean gap {r['gap, softmax(Ŝ) (Eq. 12)']:.2f} vs "
                         f"{r['gap, softmax(100 Ŝ)']:.2f} points over {r.rows} setting(s))"
                         for _, r in first.iterrows())
        return verdict.set_index(["source", "method"]), {"t1_softmax_source": shown, "t1_softmax_verdict": text}

    def table1_cifar10(self):
        """Table 1 (CIFAR-10), styled (bold: the best per line on shared seeds; None when not run), and its numbers."""
        rows = self.table1_rows(cifar10=True) if self.cifar_note() else []
        ran = [o[self.ours] for _, _, o in rows if best_method(o[self.ours]) is not None]
        values = {"t1c_best": sum(best_method(o) == "fedms" for o in ran), "t1c_n": len(ran)}
        return (self.styled(rows) if rows else None), values

    def table1_cifar10_earlier(self):
        """Table 1 (CIFAR-10) from stored runs the paper profile no longer backs, shown apart as stale: those
        of the original recipe, once the profile has adopted another (``cifar10_reading``), and those run
        under the earlier validation reading (held out of training, against §5.1). (None, values) when
        neither applies or none is stored."""
        earlier, values = readings.earlier_recipe(self.paper_params)
        if not self.cifar_note():
            return None, values
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
        return (self.comparison(rows) if rows else None), values

    def fig2(self):
        """Fig. 2: FedAvg with and without the Maverick, and GTG vs MS-GTG rewards of each."""
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

    def figs3_5(self):
        """Figs. 3-5, one figure per Table 1 split: accuracy curves and cumulative rewards of the
        Mavericks vs the others; the table of final cumulative rewards."""
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
        return figures, (frame.set_index(["setting", "method"]) if len(frame) else None), values

    def table2(self):
        """Table 2: participation rate (%) per client role, paper vs ours (mean over seeds)."""
        import pandas as pd

        nan = float("nan")
        if "table2" not in self.params["experiments"]:
            return None, {"t2_bad": nan, "t2_mav": nan, "t2_fedavg_mav": nan}
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
        return table, values

    def shortfalls(self, threshold: float = 10.0):
        """Table 1 runs (this build's and the stored paper-profile ones) ending more than ``threshold``
        points below FedAvg on the same federation, each with its reading of the history."""
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
        return pd.DataFrame(lines).set_index(["source", "setting", "seed", "method"]) if lines else None

    def maverick_readings(self):
        """FedAvg's Table 1 under every reading of §5.1 (issue 30), from the stored paper-profile runs of
        seed 0: the candidates' numbers and gaps (a cell without a stored run says so), the chosen
        reading by ``calibrate_maverick_readings``'s rule (FedAvg only), and the Maverick classes'
        last-round accuracy of each run. The frame is None when no candidate has a stored run."""
        params = self.paper_params
        rows = maverick_reading_configs(params)
        stored = stored_results(self.name, [c for *_, c in rows]).results
        frame, chosen = calibrate_maverick_readings(params, stored, self.reference)
        n_runs = sum(c.key() in stored for *_, c in rows)
        values = {"mr_runs": n_runs, "mr_candidates": len(rows), "mr_chosen": "none (no candidate has a run)",
                  "mr_chosen_dir10": float("nan"), "mr_chosen_gap": float("nan"),
                  "mr_protocol": "the protocol stays as it was", "mr_runner_up": "none",
                  "mr_runner_up_gap": float("nan"), "mr_chosen_mav": float("nan"), "mr_runner_up_mav": float("nan")}
        if chosen is None:
            return None, values
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
        return readings.shown(frame, chosen, measured), values

    def cifar10_readings(self):
        """FedAvg's CIFAR-10 Table 1 cells under every reading of ``CIFAR10_READINGS`` (issue 30), from the
        stored paper-profile runs of seed 0: ours against the paper per split, and the reading
        ``calibrate_cifar10_readings``'s rule picks. (None, values) while no reading has a stored run."""
        params = self.paper_params
        rows = cifar10_reading_configs(params)
        stored = stored_results(self.name, [c for *_, c in rows]).results
        frame, chosen = calibrate_cifar10_readings(params, stored, self.reference)
        return readings.page(frame, chosen, sum(c.key() in stored for *_, c in rows), len(rows), params=params,
                             profile_file="params/fedms/paper.yaml")

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
    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


# ----------------------------------------------------------------------------- FedAvg under readings of §5.1 (issue 30)

# Readings of FedMS §5.1 / Fig. 1 that change what FedAvg's Table 1 number is, calibrated on FedAvg
# only (never on FedMS). Run readings change the run; score readings only how a run is read.
MAVERICK_RUN_READINGS: dict[str, dict[str, Any]] = {
    # the paper's: sample-count weights (Eq. 3); §5.1: "we randomly split 20 % of testing samples as
    # validation dataset" (every method: a fixed 2,000 of the 10,000 validate, the other 8,000 test);
    # each Maverick holds its whole class
    "n_i weights, validation from the test set": {"method": "fedavg", "validation": "test"},
    # the chapter's earlier protocol: 2,000 training samples held out as the validation set
    "n_i weights, validation held out of training": {"method": "fedavg", "validation": "train",
                                                     "departs": "§5.1 (validation from 20 % of the test set)"},
    # Fig. 1's circle sizes read as a Maverick holding only part of its class (``maverick_share``;
    # the rest of the class is left out): 1/N, as much as an average client holds of a shared class
    # (equal circles), and 10 %; otherwise the chapter's protocol
    "Mavericks hold 1/N of their class, n_i weights": {"method": "fedavg", "validation": "train",
                                                       "maverick_share": "1/N",
                                                       "departs": "§5.1 (validation from 20 % of the test set)"},
    "Mavericks hold 10 % of their class, n_i weights": {"method": "fedavg", "validation": "train",
                                                        "maverick_share": 0.1,
                                                        "departs": "§5.1 (validation from 20 % of the test set)"},
    # FedAvg averaging the K selected clients equally (1/K each)
    "uniform weights, validation held out of training": {"method": "fedavg_uniform", "validation": "train",
                                                         "departs": "Eq. 3 and Algorithm 2 line 16 (n_i weights); "
                                                                    "§5.1 (validation from 20 % of the test set)"},
    "uniform weights, validation from the test set": {"method": "fedavg_uniform", "validation": "test",
                                                      "departs": "Eq. 3 and Algorithm 2 line 16 (n_i weights)"},
}
PAPER_READING = next(iter(MAVERICK_RUN_READINGS))  # the one no stated detail contradicts


def departure(reading: str) -> str | None:
    """The sentence or equation a run reading contradicts (None: the paper's reading, or one filling a gap)."""
    return MAVERICK_RUN_READINGS[reading].get("departs")
# name -> (rounds read from the end of the history, None = all rounds); the value is their mean accuracy
MAVERICK_SCORE_READINGS: dict[str, int | None] = {"last round": 1, "mean of the last 10 rounds": 10,
                                                  "mean over all rounds": None}
TEST_SHARE = 0.8  # the share of the test set left for testing when the validation set comes from it


def maverick_share(params: dict[str, Any], reading: str) -> float:
    """The share of its class each Maverick holds under a run reading (1: the whole class)."""
    share = MAVERICK_RUN_READINGS[reading].get("maverick_share", 1.0)
    return 1.0 / params["n_clients"] if share == "1/N" else float(share)


def maverick_reading_config(params: dict[str, Any], split: str, reading: str, seed: int) -> RunConfig:
    """FedAvg on the Table 1 protocol under one of ``MAVERICK_RUN_READINGS``: Table 1's FedAvg run of a
    profile whose ``table1_reading`` is ``reading`` (the first reading: Table 1's original FedAvg run)."""
    return run_config({**params, "table1_reading": reading}, split, "fedavg", seed)


def maverick_reading_configs(params: dict[str, Any], seed: int | None = None) -> list[tuple[str, str, RunConfig]]:
    """(split, run reading, config) for every Table 1 split and run reading, on one seed (default the
    profile's first): the queue-able list of FedAvg candidates (``maverick_reading_items``)."""
    seed = params["seeds"][0] if seed is None else seed
    return [(split, reading, maverick_reading_config(params, split, reading, seed))
            for split in params["splits"] for reading in MAVERICK_RUN_READINGS]


def maverick_reading_items(params: dict[str, Any], seed: int | None = None) -> list:
    """``fedlib.app.queue`` items for ``maverick_reading_configs`` (table "Maverick readings", rank 1)."""
    return [queue_item("fedms", params, "Maverick readings", f"MNIST {split}", reading, config, table_rank=1,
                       headline=split == "Dir(10)" and reading == next(iter(MAVERICK_RUN_READINGS)))
            for split, reading, config in maverick_reading_configs(params, seed)]


def maverick_class_accuracy(result) -> float:
    """Mean last-round test accuracy (%) of the classes only the Mavericks hold."""
    counts = np.asarray(result.meta["client_class_counts"])
    mavericks = np.asarray(result.meta["client_roles"]) == "maverick"
    classes = (counts[mavericks].sum(0) > 0) & (counts[~mavericks].sum(0) == 0)
    return float(100.0 * np.asarray(result.final["per_class_accuracy"])[classes].mean())


def reading_score(result, last: int | None) -> float:
    """Test accuracy (%) of a run read as the mean over its last ``last`` rounds (None: every round)."""
    accuracy = np.asarray([h["accuracy"] for h in result.history], dtype=float)
    return float(100.0 * accuracy[-last if last else 0:].mean())


def calibrate_maverick_readings(params: dict[str, Any], results: dict[str, Any], reference: dict,
                                seed: int | None = None):
    """Every candidate (run reading × score reading) of FedAvg against the paper's FedAvg row of Table 1.

    Rule: calibrate on FedAvg only, and only among the readings the text permits (no ``departs``: a
    reading contradicting Eq. 3 or §5.1 is shown, labelled, and never chosen); choose the candidate with
    the smallest mean |ours − paper| over the splits it has runs for, a tie going to the earlier
    candidate (the paper's reading and the last round come first). ``results``: runs by key (a build's or the stored ones). Returns (frame of
    every candidate: ours and the gap per split, the mean gap, whether Dir(10) is within 3 points;
    the chosen candidate's (run reading, score reading) or None when no candidate has a run)."""
    import pandas as pd

    lines = []
    for reading in MAVERICK_RUN_READINGS:
        runs = {split: results.get(config.key()) for split, r, config in maverick_reading_configs(params, seed)
                if r == reading}
        for score, last in MAVERICK_SCORE_READINGS.items():
            line: dict[str, Any] = {"run reading": reading, "score reading": score,
                                    "departs from": departure(reading) or "—"}
            gaps = []
            for split, run in runs.items():
                paper = frames.paper_values(reference, "Table 1", f"MNIST {split}", ["fedavg"],
                                            METHOD_LABELS.get)["fedavg"][0]
                ours = reading_score(run, last) if run is not None else float("nan")
                line[f"{split} ours"], line[f"{split} paper"] = ours, paper
                if np.isfinite(ours):
                    gaps.append(abs(ours - paper))
            line["splits with a run"] = len(gaps)
            line["mean |ours − paper|"] = float(np.mean(gaps)) if gaps else float("nan")
            line["Dir(10) within 3 points"] = bool(abs(line.get("Dir(10) ours", np.nan)
                                                       - line.get("Dir(10) paper", np.nan)) <= 3.0)
            lines.append(line)
    frame = pd.DataFrame(lines).set_index(["run reading", "score reading"])
    measured = frame.loc[frame["departs from"] == "—", "mean |ours − paper|"].dropna()
    chosen = None if measured.empty else measured.index[int(np.argmin(measured.to_numpy()))]
    return frame, chosen


# ----------------------------------------------------------------------------- FedAvg under readings of the CIFAR-10 protocol (issue 30)

# §5.1 names the CNN, 200 rounds, 1 local epoch, batch 64 and lr 0.05 for CIFAR-10, not the augmentation,
# a weight decay or SGD's momentum: the readings of fedlib.app.chapters.readings, screened on FedAvg only.
CIFAR10_READINGS = readings.CIFAR10_READINGS
SCREEN_READING = "n_i weights, validation held out of training"  # the CIFAR-10 screen's runs (a model recipe)


def cifar10_reading_configs(params: dict[str, Any], seed: int | None = None) -> list[tuple[str, str, RunConfig]]:
    """(split, reading, config): FedAvg's CIFAR-10 Table 1 run under each of ``CIFAR10_READINGS``, on one
    seed (default the profile's first); the first reading is Table 1's own FedAvg run."""
    seed = params["seeds"][0] if seed is None else seed
    # each reading changes the original recipe, whichever is adopted; the screen was run (issue 30) under the
    # earlier validation reading, which for FedAvg only holds 2,000 training samples out, and stays on it
    base = {**readings.screen_params(params), "table1_reading": SCREEN_READING}
    return readings.reading_configs(lambda split: run_config(base, split, "fedavg", seed, cifar10=True),
                                    params["cifar10_splits"])


def calibrate_cifar10_readings(params: dict[str, Any], results: dict[str, Any], reference: dict,
                               seed: int | None = None):
    """``readings.calibrate`` on FedMS's CIFAR-10 rows against the paper's FedAvg row of Table 1."""
    def paper_of(split):
        return frames.paper_values(reference, "Table 1", f"CIFAR-10 {split}", ["fedavg"], METHOD_LABELS.get)["fedavg"][0]

    return readings.calibrate(cifar10_reading_configs(params, seed), results, paper_of)


# ----------------------------------------------------------------------------- the declaration


class FedMSProfile(FederationProfile):
    dataset: str
    model: str
    clients_per_round: int
    n_mavericks: int
    server_val: int  # the server's validation set (from the test set under the paper's reading)
    methods: Names
    method_params: dict[str, dict[str, Any]]  # method -> hyper-parameters over §5.1's
    experiments: Names
    splits: Names
    table1_reading: str = next(iter(MAVERICK_RUN_READINGS))  # a name of MAVERICK_RUN_READINGS
    table1_score: str = "last round"  # a name of MAVERICK_SCORE_READINGS
    softmax_variants: list[str]
    fig2_rounds: int
    adversarial_per_round: int
    cifar10_fraction: float
    cifar10_rounds: int
    cifar10_local_epochs: int
    cifar10_methods: list[str]
    cifar10_splits: list[str]
    cifar10_reading: str = readings.ORIGINAL  # a name of readings.CIFAR10_READINGS: the CIFAR-10 recipe


def maverick_reward_gap(result: dict) -> float:
    """Mean over rounds of the Maverick's MS-GTG reward minus its GTG-Shapley reward (FedMS Fig. 2)."""
    roles = np.asarray(result["meta"]["client_roles"])
    mav = np.flatnonzero(roles == "maverick")
    gtg = np.asarray([h["diagnostics"]["rewards_gtg"] for h in result["history"]], dtype=float)
    ms = np.asarray([h["diagnostics"]["rewards_ms"] for h in result["history"]], dtype=float)
    return float((ms[:, mav] - gtg[:, mav]).mean())


def maverick_participation(result: dict) -> float:
    """A stored run's Maverick participation rate (%): the claims' reading of Table 2."""
    return participation(RunResult.from_dict(result))["maverick"]


def table1_claim_score(result: dict) -> float:
    """A FedMS Table 1 run read as the page reads it: the paper profile's ``table1_score`` on MNIST (the
    reading calibrated on FedAvg, e.g. the mean over all rounds), the final accuracy on CIFAR-10."""
    score = table1_score(load_profile("fedms", "paper"), result["config"]["dataset"] == "cifar10")
    return final(result) if score is None else score(RunResult.from_dict(result))


def table1_claim_rows(prefixes=("MNIST", "CIFAR-10")) -> list[str]:
    return [f"{p} {s}" for p in prefixes for s in ("Dir(10)", "Dir(1)", "Dir(0.1)")]


CLAIMS = (
    Claim("FedMS gives the Maverick a larger reward than GTG-Shapley (Fig. 2)", "Fig. 2",
          "fig-2-the-maverick-matters-and-ms-gtg-rewards-it",
          (Comparison("MS-GTG − GTG reward of the Maverick",
                      Side(("Fig. 2", "with Maverick", "GTG / MS-GTG rewards"), "maverick_reward_gap")),),
          unit="reward"),
    Claim("FedMS beats FedAvg on every Table 1 split (Mavericks + Dir)", "Table 1",
          "table-1-accuracy-with-two-mavericks-mnist",
          cells_row(table1_claim_rows(), "FedMS", "FedAvg", metric="fedms_table1")),
    Claim("FedMS lets the Mavericks take part more often than FedAvg (Table 2)", "Table 2",
          "table-2-participation-of-adversaries-free-riders-and-mavericks",
          (Comparison("Maverick participation", Side(("Table 2", "FedMS", "participation"), "maverick_participation",
                                                     ref=("Table 2", "FedMS", "Mavericks")),
                      Side(("Table 2", "FedAvg", "participation"), "maverick_participation",
                           ref=("Table 2", "FedAvg", "Mavericks"))),), unit="% of rounds"),
    # §5.2: "our proposed FedMS maintains high accuracy and achieves better model performance than baselines in
    # most settings": every baseline of Table 1, judged on more than half of its six splits
    *(Claim(f"FedMS beats {baseline} in most Table 1 settings (§5.2)", "Table 1",
            "table-1-accuracy-with-two-mavericks-mnist",
            cells_row(table1_claim_rows(), "FedMS", baseline, metric="fedms_table1"), quantifier="most")
      for baseline in ("FedProx", "PoC", "FedEMD", "S-FedAvg", "GreedyFed")),
)

PAPER = Paper("fedms", "FedMS", FedMSProfile, configs, queue_items, reference="fedms", claims=CLAIMS,
              metrics={"maverick_reward_gap": maverick_reward_gap, "maverick_participation": maverick_participation,
                       "fedms_table1": table1_claim_score}, rank=5)
