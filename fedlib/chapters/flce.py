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

from typing import Any

import numpy as np

from ..config import RunConfig, make_config
from ..contributions import contribution_vector, flce_contributions, flce_tensor, similarity_contributions  # noqa: F401
from . import run_options, unique_configs

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
DATASET_LABELS = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "eurosat": "EuroSAT", "fmnist": "F.MNIST"}


def split_spec(params: dict[str, Any], split: str, alpha: float | None = None) -> dict[str, Any]:
    if split == "IID":
        return {"name": "iid"}
    return {"name": "dirichlet", "alpha": float(alpha if alpha is not None else params["alpha"])}


def noise_spec(params: dict[str, Any], split: str, kind: str) -> dict[str, Any]:
    """The split with §4.7's noise on the first ``noisy_fraction`` of the clients."""
    spec = split_spec(params, split)
    clients = list(range(int(round(params["noisy_fraction"] * params["n_clients"]))))
    if kind in ("feature", "both"):
        spec["feature_noise"] = params["feature_noise"]
    if kind in ("label", "both"):
        spec["label_noise"] = params["label_noise"]
    spec["noisy_clients"] = clients
    return spec


def run_config(params: dict[str, Any], dataset: str, split: dict, method: str, seed: int,
               **method_params) -> RunConfig:
    spec = {"name": method, **params.get("method_params", {}).get(method, {}), **method_params}
    return make_config(
        dataset=dataset, model=params["model"], fraction=params["fraction"], n_clients=params["n_clients"],
        clients_per_round=params["clients_per_round"], rounds=params["rounds"], lr=params["lr"],
        batch_size=params["batch_size"], local_epochs=params["local_epochs"], test_samples=params["test_samples"],
        server_val=params["server_val"], split=split, method=spec, seed=seed, **run_options(params),
    )


def variant_config(params, dataset, split, variant, seed) -> RunConfig:
    return run_config(params, dataset, split, "flce", seed, **VARIANTS[variant])


def experiment_configs(params: dict[str, Any], experiment: str) -> list[RunConfig]:
    seeds, methods, datasets = params["seeds"], params["methods"], params["datasets"]
    if experiment == "table2":
        return [run_config(params, d, split_spec(params, s), m, seed) for d in datasets for s in SPLITS
                for m in methods for seed in seeds]
    if experiment == "table3":
        variants = [v for v in list(params["ablations"]) + list(params.get("simplifications", []))
                    if v not in FROM_FLCE_RUN]
        return [variant_config(params, d, split_spec(params, s), v, seed) for d in datasets for s in SPLITS
                for v in variants for seed in seeds]
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


def configs(params: dict[str, Any]) -> list[RunConfig]:
    """Every run of the chapter, without duplicates."""
    return unique_configs(experiment_configs, params)


# ----------------------------------------------------------------------------- contributions

contributions = contribution_vector  # the one rule (fedlib.contributions)


def variant_contributions(result, variant: str) -> np.ndarray:
    """A Table 3 variant's contributions from its run (FLCE's own run for ``FROM_FLCE_RUN``)."""
    if variant in FROM_FLCE_RUN:
        return flce_contributions(result, **FROM_FLCE_RUN[variant])
    return contributions(result)


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


def kl_to(result, reference: np.ndarray, contribution: np.ndarray | None = None) -> float:
    """KL(contribution ‖ reference) in nats (FLCE §4.1.3: P = contributions, Q = data quality)."""
    from ..metrics import kl

    c = contributions(result) if contribution is None else contribution
    return float(kl(c, reference))


def smoothed_kl(p: np.ndarray, q: np.ndarray, eps: float = 1e-6) -> float:
    """KL(p ‖ q) after adding ``eps`` to every entry (a client with 0 Shapley value so far)."""
    from ..metrics import kl

    return float(kl(np.asarray(p) + eps, np.asarray(q) + eps))


def last_rounds_mean(result, key: str, last: int) -> float:
    """Mean of a per-round metric over the last ``last`` evaluated rounds (%, the paper's 'average
    test performance of the global model over the last hundred rounds')."""
    values = [h[key] for h in result.history if h.get(key) is not None][-last:]
    return 100.0 * float(np.mean(values)) if values else float("nan")


def server_time(result) -> float:
    """Mean server seconds per round (aggregation + contribution; FLCE's completion included)."""
    return float(np.mean([h["time_server"] for h in result.history]))


def class_weights(result) -> dict[str, np.ndarray]:
    """Fig. 5 from a FLCE run: each client's class profile (its summed class momentum Σ_t Q[k, c],
    normalised over classes), the global class weights Σ_k CE_k profile_k, and the ground truth
    (the clients' class distributions and the federation's class shares)."""
    last = result.history[-1]["diagnostics"]
    q = np.asarray(last["class_momentum_sum"], dtype=float)
    profile = q / np.clip(q.sum(1, keepdims=True), 1e-12, None)
    counts = np.asarray(result.meta["client_class_counts"], dtype=float)
    truth = counts / np.clip(counts.sum(1, keepdims=True), 1e-12, None)
    ce = contributions(result)
    return {"profile": profile, "client_truth": truth, "global": ce @ profile,
            "global_truth": counts.sum(0) / counts.sum(), "seen": q.sum(1) > 0}


# ----------------------------------------------------------------------------- Table 4


def communication_cost(feature_dim: int = 64) -> list[dict[str, Any]]:
    """Table 4 from our ResNet-20: parameters counted from the model, prototypes = C × 64.
    Ratio: prototypes / (model down + model up + prototypes), one client's traffic per round."""
    from ..models import build_model

    rows = []
    for label, shape, classes in (("CIFAR-10", (3, 32, 32), 10), ("CIFAR-100", (3, 32, 32), 100),
                                  ("EuroSAT", (3, 64, 64), 10)):
        model = build_model("resnet20", shape, classes)
        assert model.feature_dim == feature_dim
        params = sum(p.numel() for p in model.parameters())
        protos = classes * feature_dim
        rows.append({"Dataset": label, "Prototype": protos, "Model": params,
                     "Ratio": protos / (2 * params + protos)})
    return rows


# ----------------------------------------------------------------------------- the results queue


def queue_items(params: dict[str, Any]) -> list:
    """Every run of the profile for ``python -m fedlib results`` (fedlib.queue), labelled with
    the paper cell it backs; headline row: the first dataset's Non-IID split."""
    from ..queue import QueueItem, run_round

    seeds, first, datasets = params["seeds"], params["seeds"][0], params["datasets"]
    experiments = params["experiments"]
    head = f"{DATASET_LABELS.get(datasets[0], datasets[0])} Non-IID"
    items = []

    def item(table, row, column, seed, config, rank=0, backs=(), headline=None):
        return QueueItem("flce", table, row, column, seed, config, run_round, headline=row == (headline or head),
                         table_rank=rank, first_seed=seed == first, backs=tuple(backs))

    for d in datasets:
        label = DATASET_LABELS.get(d, d)
        for s in SPLITS:
            row = f"{label} {s}"
            if "table2" in experiments:
                for m in params["methods"]:
                    name = METHOD_LABELS[m]
                    backs = [("Table 2", row, f"{name} Acc"), ("Table 2", row, f"{name} F1")]
                    if m == "flce":  # FLCE's own run is Table 3's full model and its −CMC column
                        backs += [("Table 3", row, "FLCE"), ("Table 3", row, "FLCE-CMC"), ("Table 4", label, "*")]
                    items += [item("Table 2", row, name, seed, run_config(params, d, split_spec(params, s), m, seed),
                                   backs=backs) for seed in seeds]
            if "table3" in experiments:
                items += [item("Table 3", row, v, seed, variant_config(params, d, split_spec(params, s), v, seed), 1)
                          for v in list(params["ablations"]) + list(params.get("simplifications", [])) for seed in seeds]
    d0 = DATASET_LABELS.get(datasets[0], datasets[0])
    if "fig4" in experiments:
        items += [item("Fig. 4", f"{d0} Non-IID", "exact FedSV", seed, c, 2)
                  for seed, c in zip(seeds, experiment_configs(params, "fig4"))]
    if "noise" in experiments:
        items += [item("§4.7 noise", f"{d0} {s} {kind} noise", METHOD_LABELS[m], seed,
                       run_config(params, datasets[0], noise_spec(params, s, kind), m, seed), 2,
                       headline=f"{d0} Non-IID both noise")
                  for kind in NOISE for s in params["noise_splits"] for m in params["noise_methods"] for seed in seeds]
    if "fig9" in experiments:
        items += [item("Fig. 9", f"{d0} Dir({a:g})", "FLCE", seed,
                       run_config(params, datasets[0], split_spec(params, "Non-IID", a), "flce", seed), 2,
                       backs=[("Fig. 9", f"{d0} Dir({a:g})", "*")])
                  for a in params["dirichlet_sweep"] for seed in seeds]
    return items
