"""What the poisoning monitor (``fedlib.screening.update_disagreement``, issue 43) costs at N = 500.

Two measurements, printed as ratios measured in this one run:

  - ``kernels``: the monitor's statistics on random updates [N, P] (P = 242,762, the synthetic MLP)
    against the FedAvg aggregation of the same updates (``fedlib.population.aggregate``) and against
    the full-vector coordinate-wise median the monitor used before issue 43 (best of ``--repeat``);
  - ``round``: one FedAvg round through ``fedlib.run`` (synthetic data, MLP, N clients, 1 local epoch),
    its history's ``time_monitor`` against ``time_server`` and the whole round (``time_round``).

    python benchmarks/monitor_cost.py [--clients 500] [--repeat 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def kernels(n: int, size: int, repeat: int) -> dict[str, float]:
    from fedlib.methods.robust import coordinate_median
    from fedlib.population import aggregate
    from fedlib.screening import update_disagreement

    g = torch.Generator().manual_seed(0)
    global_flat = torch.randn(size, generator=g) * 0.05
    flat = global_flat + 0.01 * torch.randn(n, size, generator=g)
    weights = torch.full((n,), 1.0 / n)
    clients = np.arange(n)
    return {"monitor": best_of(lambda: update_disagreement(clients, flat, global_flat, []), repeat),
            "aggregate": best_of(lambda: aggregate(flat, weights, {}), repeat),
            "full_median": best_of(lambda: coordinate_median(flat - global_flat), 1)}


def one_round(n: int) -> dict[str, float]:
    import fedlib
    from fedlib.config import make_config

    cfg = make_config(dataset="synthetic", model="mlp", n_clients=n, rounds=1, batch_size=16, local_epochs=1,
                      lr=0.1, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        h = fedlib.run(cfg, cache=False, progress=False).history[0]
    return {k: h[k] for k in ("time_monitor", "time_server", "time_train", "time_round")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    size = 242_762
    k = kernels(args.clients, size, args.repeat)
    print(f"N = {args.clients}, P = {size}, {args.threads} thread(s)")
    print(f"kernels: monitor {k['monitor']:.4f} s, FedAvg aggregation {k['aggregate']:.4f} s "
          f"(monitor / aggregation = {k['monitor'] / k['aggregate']:.2f}); full-vector median (before issue 43) "
          f"{k['full_median']:.3f} s ({k['full_median'] / k['monitor']:.0f}x the monitor)")
    r = one_round(args.clients)
    print(f"round: monitor {r['time_monitor']:.4f} s of server {r['time_server']:.4f} s, train {r['time_train']:.3f} s, "
          f"round {r['time_round']:.3f} s (monitor / round = {100 * r['time_monitor'] / r['time_round']:.2f} %)")


if __name__ == "__main__":
    main()
