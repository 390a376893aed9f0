"""Exact class-wise Shapley values of n clients: batched coalition evaluation vs a loop over subsets.

The MLP of the FedMS chapter on MNIST (synthetic 28x28 data when MNIST is not under the
data root), 2,000 validation samples, n client models (perturbed copies of one model).
"batched" is ``exact_shapley(coalition_utility(...))``: all 2^n coalition models are rows of
one ``S @ W`` and are evaluated in batched passes. "loop" builds and evaluates one coalition
model at a time with a plain module forward (the test oracle of tests/core/test_shapley.py) and
then applies Eq. 6. Both give the same values (checked here). Each time is the best of
``--repeat`` runs, all measured in this one invocation.

    python benchmarks/shapley_speed.py [--clients 5 8 10] [--repeat 2] [--device cpu]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time

import torch

from fedlib.data import load_dataset
from fedlib.data_files import DataNotFoundError
from fedlib.valuation import all_coalitions, coalition_utility, exact_shapley
from fedlib.models import build_model
from fedlib.population import ParamLayout


def validation_set(n: int, device):
    try:
        ds = load_dataset("mnist", root=os.environ.get("FEDLIB_DATA"))
        source = "MNIST"
    except DataNotFoundError:
        ds = load_dataset("synthetic", num_classes=10, image_shape=(1, 28, 28), n_train=10, n_test=n, seed=0)
        source = "synthetic 1x28x28"
    return ds.x_test[:n].to(device), ds.y_test[:n].to(device), source


def loop_shapley(model, layout, flat, sizes, x, y, n_classes, empty):
    """Reference: one coalition at a time (weighted average, module forward), then Eq. 6."""
    n = flat.shape[0]
    coalitions = all_coalitions(n)
    local = build_model("mlp", (1, 28, 28), n_classes).to(flat.device).eval()
    values = torch.zeros(len(coalitions), n_classes, dtype=torch.float64)
    counts = torch.bincount(y, minlength=n_classes).clamp(min=1)
    for k, q in enumerate(coalitions):
        members = torch.nonzero(q).flatten()
        w = empty if len(members) == 0 else (sizes[members] @ flat[members]) / sizes[members].sum()
        layout.load_into(local, w)
        with torch.no_grad():
            pred = local(x).argmax(1)
        values[k] = (torch.bincount(y[pred == y], minlength=n_classes) / counts).double().cpu()
    phi = torch.zeros(n, n_classes, dtype=torch.float64)
    for i in range(n):
        for k, q in enumerate(coalitions):
            if not q[i]:
                s = int(q.sum())
                w = math.factorial(s) * math.factorial(n - s - 1) / math.factorial(n)
                phi[i] += w * (values[k | (1 << i)] - values[k])
    return phi


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[5, 8, 10])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    x, y, source = validation_set(args.samples, device)
    torch.manual_seed(0)
    model = build_model("mlp", (1, 28, 28), 10).to(device)
    layout = ParamLayout(model)
    base = layout.flat_of(model)
    print(f"exact class-wise Shapley, MLP ({layout.size:,} parameters), {len(y)} {source} validation samples, "
          f"device {device} ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)")
    print(f"{'n':>3} {'coalitions':>10} {'batched s':>10} {'loop s':>9} {'ratio':>7}  max |diff|")
    for n in args.clients:
        g = torch.Generator().manual_seed(n)
        flat = (base + 0.05 * torch.randn(n, layout.size, generator=g)).to(device)
        sizes = torch.randint(100, 1000, (n,), generator=g).float().to(device)
        batched_t, loop_t = float("inf"), float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            u = coalition_utility(model, flat, {}, sizes, x, y, 10, base.to(device))
            phi = exact_shapley(u, n)
            batched_t = min(batched_t, time.perf_counter() - t0)
            t0 = time.perf_counter()
            ref = loop_shapley(model, layout, flat, sizes, x, y, 10, base.to(device))
            loop_t = min(loop_t, time.perf_counter() - t0)
        diff = float((phi - ref).abs().max())
        print(f"{n:>3} {2**n:>10} {batched_t:>10.3f} {loop_t:>9.3f} {loop_t / batched_t:>6.2f}x  {diff:.1e}",
              flush=True)


if __name__ == "__main__":
    main()
