"""The CPU order of a round's clients, vectorized vs one client at a time, in one invocation.

One round of local training (``fedlib.training.train_clients``: 1 epoch, batch 128, SGD lr 0.1) of
N clients on 60,000 Fashion-MNIST-shaped samples (1 x 28 x 28, random: the timing does not depend on
the values), for CELM's MLP and LeNet-5, under three plans, interleaved ``--repeats`` times:

  - vectorized (``LocalTraining.order="vectorized"``): each worker thread trains its clients as one
                vmapped call (torch.func grad + vmap);
  - clients    (``order="clients"``): each worker thread trains its clients one at a time, longest
                first, by plain autograd; the last N mod workers clients then take all threads;
  - loop       (``fedlib.testing.train_clients_loop``): the test oracle, one client after another with
                torch.optim.SGD and all intra-op threads.

Splits: ``iid`` (N equal clients) and, for N = 5, ``celm`` (CELM's Dir(0.01) client sizes: 24,046 /
18,000 / 9,952 / 6,000 / 2,002). The table gives the median seconds per round, the ratios
vectorized/clients and loop/clients (> 1: the client order is faster) and the largest parameter
difference between the plans (random labels at lr 0.1 amplify float-order differences over an epoch;
the plans' equality to 1e-6 is tested on short runs, tests/core/test_cpu_order.py). The load average before and after is recorded: ratios measured while
other work shares the cores are indicative. The rule ``fedlib.plans.client_order`` cites
this table.

    python benchmarks/cpu_order.py [--clients 5 20 100 500] [--models mlp lenet5] [--repeats 3]
                                   [--json benchmarks/results/cpu_order_cpu-2core.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from fedlib.models import build_model  # noqa: E402
from fedlib.plans import execution_plan  # noqa: E402
from fedlib.population import LocalTraining, ParamLayout, make_client_batches, stack_buffers  # noqa: E402
from fedlib.training import train_clients  # noqa: E402
from fedlib.provenance import environment  # noqa: E402
from fedlib.testing import train_clients_loop  # noqa: E402

SAMPLES = 60_000
CELM_SIZES = [24046, 18000, 9952, 6000, 2002]  # CELM Dir(0.01) on Fashion-MNIST, seed 0


def measure(model_name: str, sizes: list[int], repeats: int, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    model = build_model(model_name, (1, 28, 28), 10)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(sizes), 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (len(x),), generator=g)
    indices = np.split(np.arange(len(x)), np.cumsum(sizes)[:-1])
    layout = ParamLayout(model)
    start, buffers = layout.flat_of(model), stack_buffers(layout.buffers_of(model), 1)
    batches = make_client_batches(indices, 128, 1, torch.Generator().manual_seed(seed + 1))
    cfg = LocalTraining(epochs=1, batch_size=128, lr=0.1)
    plans = {
        "vectorized": lambda: train_clients(model, start, buffers, x, y, batches, replace(cfg, order="vectorized")),
        "clients": lambda: train_clients(model, start, buffers, x, y, batches, replace(cfg, order="clients")),
        "loop": lambda: train_clients_loop(model, start, buffers, x, y, batches, cfg),
    }
    flats = {name: plan()[0] for name, plan in plans.items()}  # warm-up, and the numbers to compare
    seconds: dict[str, list[float]] = {name: [] for name in plans}
    for _ in range(repeats):
        for name, plan in plans.items():
            t0 = time.perf_counter()
            plan()
            seconds[name].append(time.perf_counter() - t0)
    median = {name: statistics.median(s) for name, s in seconds.items()}
    return {
        "model": model_name, "N": len(sizes), "client_sizes": sizes,
        "plan": execution_plan(cfg, len(sizes), "cpu", model, x[0], float((batches.mask.sum(2) > 0).sum(0).float().mean())),
        "seconds": {name: round(s, 4) for name, s in median.items()},
        "vectorized_over_clients": round(median["vectorized"] / median["clients"], 3),
        "loop_over_clients": round(median["loop"] / median["clients"], 3),
        "max_parameter_difference": {f"{a} vs {b}": float((flats[a] - flats[b]).abs().max())
                                     for a, b in (("clients", "vectorized"), ("clients", "loop"))},
    }


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[5, 20, 100, 500])
    ap.add_argument("--models", nargs="+", default=["mlp", "lenet5"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if any(n < 1 or n > SAMPLES for n in args.clients):
        ap.error(f"--clients: each must be between 1 and {SAMPLES}")
    if args.repeats < 1:
        ap.error("--repeats: must be >= 1")
    load_before = os.getloadavg()[0]
    rows = []
    print(f"{'model':8} {'split':5} {'N':>4} {'vectorized':>11} {'clients':>8} {'loop':>7} {'vec/cli':>8} {'loop/cli':>9}")
    for model_name in args.models:
        for n in args.clients:
            splits = [("iid", [SAMPLES // n] * n)] + ([("celm", CELM_SIZES)] if n == len(CELM_SIZES) else [])
            for split, sizes in splits:
                row = {"split": split, **measure(model_name, sizes, args.repeats)}
                rows.append(row)
                s = row["seconds"]
                print(f"{model_name:8} {split:5} {n:>4} {s['vectorized']:>11.3f} {s['clients']:>8.3f} {s['loop']:>7.3f} "
                      f"{row['vectorized_over_clients']:>8.2f} {row['loop_over_clients']:>9.2f}", flush=True)
    out = {"benchmark": "cpu_order", **environment("cpu", commit=False), "repeats": args.repeats,
           "load_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)], "rows": rows}
    if args.json:
        tmp = args.json.with_suffix(".json.part")
        tmp.write_text(json.dumps(out, indent=1))
        tmp.replace(args.json)
    return rows


if __name__ == "__main__":
    main()
