"""Where a round's time goes, and how far each valuation method is from its arithmetic.

``round_breakdown``: FedAvg runs through ``fedlib.run`` (Fashion-MNIST, CELM's MLP, IID, every
client selected, 1 local epoch, batch 128, lr 0.1) at each N; per round, the median over rounds of

  - local training  (``time_train``: batches, the vectorized local steps, uploads),
  - evaluation      (``time_eval``: the global model on the test set),
  - server step     (``time_server``: screening, the method's weights, aggregation),
  - Python overhead (``time_round`` minus the three: hooks, bookkeeping, the history record).

``valuation_arithmetic``: each valuation method's server seconds per round against the arithmetic
it must do. Its floating-point operations are counted (``torch.utils.flop_counter``, matmuls and
convolutions) in a second, identical run of the method (same seed, so the same coalitions), and
turned into seconds at the FLOP rate of a training step measured on the same federation
(3 x forward FLOPs per trained sample, forward + backward, over ``time_train``). A multiple near 1
means the server step runs at the hardware's training speed; far above 1 means overhead
(Python per coalition, small batches, memo bookkeeping).

    python benchmarks/breakdown.py [--clients 5 20 100 500] [--rounds 3] [--fraction 1.0]
                                   [--valuation-clients 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fedlib  # noqa: E402
from fedlib.config import make_config  # noqa: E402
from fedlib.models import build_model  # noqa: E402
from fedlib.plans import execution_plan  # noqa: E402
from fedlib.population import LocalTraining  # noqa: E402

VALUATIONS = {  # label -> (method spec, which rounds carry the method's server work)
    "CELM probing (warm-up rounds)": ({"name": "celm", "warmup_fraction": 0.5}, "warmup"),
    "GTG-Shapley rewards": ({"name": "shapley_rewards", "estimator": "gtg"}, "all"),
    "FedMS (MS-GTG)": ({"name": "fedms"}, "all"),
    "exact class-wise Shapley": ({"name": "shapley_rewards", "estimator": "exact"}, "all"),
    "FLCE": ({"name": "flce"}, "all"),
}


def fedavg_base(n_clients: int, rounds: int, fraction: float, device: str, dataset: str = "fmnist",
                data_root: str | None = None, **extra) -> dict:
    return dict(dataset=dataset, data_root=data_root, model="mlp", n_clients=n_clients, rounds=rounds, lr=0.1,
                batch_size=128, local_epochs=1, fraction=fraction, device=device, seed=0, **extra)


def _median(history, key):
    values = [h.get(key) or 0.0 for h in history]
    return statistics.median(values) if values else 0.0


def round_breakdown(clients, rounds: int, fraction: float, device: str = "cpu", dataset: str = "fmnist",
                    data_root: str | None = None) -> list[dict]:
    """Median seconds per round of each part of a FedAvg round, for each N."""
    rows = []
    for n in clients:
        result = fedlib.run(make_config(fedavg_base(n, rounds, fraction, device, dataset, data_root), method="fedavg"),
                            cache=False, progress=False)
        hist = result.history
        parts = {k: _median(hist, f"time_{k}") for k in ("train", "eval", "server", "round")}
        overhead = statistics.median(
            h["time_round"] - h["time_train"] - h["time_server"] - (h.get("time_eval") or 0.0) for h in hist)
        rows.append({"N": n, "samples_per_client": min(result.meta["client_sizes"]),
                     "train_s": parts["train"], "eval_s": parts["eval"], "server_s": parts["server"],
                     "overhead_s": overhead, "round_s": parts["round"],
                     "warmup_s": result.meta.get("warmup_s"),
                     "plan": execution_plan(LocalTraining(batch_size=128), n, device, build_model("mlp", (1, 28, 28), 10),
                                            torch.zeros(1, 28, 28), sum(result.meta["client_sizes"]) / n / 128)})
    print(f"\nWhere a FedAvg round's time goes ({device}; median over {rounds} rounds; seconds)")
    print(f"{'N':>5} {'train':>8} {'eval':>8} {'server':>8} {'Python':>8} {'round':>8}  plan")
    for r in rows:
        print(f"{r['N']:>5} {r['train_s']:>8.3f} {r['eval_s']:>8.3f} {r['server_s']:>8.4f} "
              f"{r['overhead_s']:>8.4f} {r['round_s']:>8.3f}  {r['plan']}")
    return rows


def forward_flops_per_sample(model, input_shape, device) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    was = model.training
    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.zeros(1, *input_shape, device=device))
    model.train(was)
    return counter.get_total_flops()


def _counted_server_flops(config) -> list[int]:
    """FLOPs of each round's server step (the method's weigh + server_update hooks)."""
    from torch.utils.flop_counter import FlopCounterMode

    import importlib

    engine = importlib.import_module("fedlib.run")
    prepared = engine.prepare(config)
    method = prepared.method
    per_round: list[int] = []

    def counted(hook, new_round):
        def wrapper(*args, **kwargs):
            with FlopCounterMode(display=False) as counter:
                out = hook(*args, **kwargs)
            if new_round:
                per_round.append(0)
            per_round[-1] += counter.get_total_flops()
            return out
        return wrapper

    method.weigh = counted(method.weigh, True)
    method.server_update = counted(method.server_update, False)
    engine._execute(prepared, False)
    return per_round


def valuation_arithmetic(n_clients: int, rounds: int, fraction: float, device: str = "cpu",
                         dataset: str = "fmnist", data_root: str | None = None) -> list[dict]:
    """Server seconds per round of each valuation method, as a multiple of a FedAvg round and of
    the time its counted arithmetic takes at the measured training FLOP rate."""
    from fedlib.methods import scm
    from fedlib.models import build_model
    from torch.utils.flop_counter import FlopCounterMode

    base = fedavg_base(n_clients, rounds, fraction, device, dataset, data_root, test_samples=1000)
    fedavg = fedlib.run(make_config(base, method="fedavg"), cache=False, progress=False)
    hist = fedavg.history[1:] or fedavg.history
    fedavg_round = statistics.median(h["time_train"] + h["time_server"] for h in hist)
    shape = (1, 28, 28)
    fwd = forward_flops_per_sample(build_model("mlp", shape, 10).to(device), shape, device)
    trained = sum(fedavg.meta["client_sizes"])  # every client selected, 1 epoch
    rate = 3 * fwd * trained / _median(hist, "time_train")  # FLOP/s of a training step
    rows = [{"method": "FedAvg (one whole round)", "server_s": fedavg_round, "ratio": 1.0, "flops": None,
             "arithmetic_s": 3 * fwd * trained / rate, "multiple": None}]
    for label, (spec, which) in VALUATIONS.items():
        config = make_config(base, method=spec)
        r = fedlib.run(config, cache=False, progress=False)
        flops = _counted_server_flops(config)
        keep = (range(max(1, round(0.5 * rounds))) if which == "warmup" else range(1, len(r.history))) or [0]
        server = statistics.median(r.history[i]["time_server"] for i in keep)
        work = statistics.median(flops[i] for i in keep if i < len(flops))
        rows.append({"method": label, "server_s": server, "ratio": server / fedavg_round, "flops": work,
                     "forward_samples": work / fwd, "arithmetic_s": work / rate,
                     "multiple": server / (work / rate) if work else None})
    sample = scm.simulate_expertise(n_clients, 1000, 10, scm.expertise_levels(n_clients, 3), seed=0)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        scm.select(sample.probs, 2 / 3, "pgd")
        times.append(time.perf_counter() - t0)
    with FlopCounterMode(display=False) as counter:
        scm.select(sample.probs, 2 / 3, "pgd")
    work, server = counter.get_total_flops(), statistics.median(times)
    rows.append({"method": f"FedSCM selection (PGD, K = {n_clients}, n = 1,000; once per run)",
                 "server_s": server, "ratio": server / fedavg_round, "flops": work,
                 "forward_samples": work / fwd, "arithmetic_s": work / rate,
                 "multiple": server / (work / rate) if work else None})
    print(f"\nServer step per round, {n_clients} clients, {fraction:.0%} of {dataset}, MLP; training runs at "
          f"{rate / 1e9:.1f} GFLOP/s (3 x {fwd / 1e3:.0f} kFLOP forward per sample)")
    print(f"  {'method':<62} {'server s':>9} {'x FedAvg':>9} {'GFLOP':>9} {'x arithmetic':>12}")
    for row in rows:
        gflop = "-" if row["flops"] is None else f"{row['flops'] / 1e9:.3f}"
        mult = "-" if row["multiple"] is None else f"{row['multiple']:.1f}x"
        print(f"  {row['method']:<62} {row['server_s']:>9.4f} {row['ratio']:>8.2f}x {gflop:>9} {mult:>12}")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[5, 20, 100, 500])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fraction", type=float, default=1.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dataset", default="fmnist")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--valuation-clients", type=int, default=10, help="0: skip the valuation lines")
    ap.add_argument("--valuation-rounds", type=int, default=4)
    ap.add_argument("--valuation-fraction", type=float, default=0.2)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    out = {"breakdown": round_breakdown(args.clients, args.rounds, args.fraction, args.device, args.dataset,
                                        args.data_root)}
    if args.valuation_clients:
        out["valuation"] = valuation_arithmetic(args.valuation_clients, args.valuation_rounds,
                                                args.valuation_fraction, args.device, args.dataset, args.data_root)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
