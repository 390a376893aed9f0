"""FLCE's client and server extras: batched prototypes vs the per-client loop, and the server step.

Fashion-MNIST, the small CNN, N clients of 200 samples each: (1) Eq. 5 prototypes of all N
client models in one batched pass vs one client at a time; (2) one server round of Eq. 6-10
for N clients and 10 classes; (3) the rank-1 completion of Eq. 11 on a 1,000 x 50 matrix with 20 %
observed (the paper's rounds x clients). Medians of a few repetitions in this one invocation.

    python benchmarks/flce_prototypes.py [--clients 5 10 20] [--repeat 3]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np
import torch

from fedlib.data import load_dataset
from fedlib.methods import ClientUpdates, Federation, RoundState, build_method
from fedlib.methods.flce import class_prototypes, complete_matrix
from fedlib.testing import class_prototypes_loop
from fedlib.models import build_model
from fedlib.population import ParamLayout


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[5, 10, 20])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    ds = load_dataset("fmnist", device="cpu")
    torch.manual_seed(0)
    model = build_model("cnn", ds.input_shape, ds.num_classes)
    layout = ParamLayout(model)
    print(f"torch {torch.__version__}, {platform.machine()}, {torch.get_num_threads()} threads")
    for n in args.clients:
        flats = layout.flat_of(model).unsqueeze(0) + 0.01 * torch.randn(n, layout.size)
        indices = [np.arange(i * 200, (i + 1) * 200) for i in range(n)]
        batched = median_time(lambda: class_prototypes(model, flats, {}, ds.x_train, ds.y_train, indices, 10),
                              args.repeat)
        loop = median_time(lambda: class_prototypes_loop(model, flats, {}, ds.x_train, ds.y_train, indices, 10),
                           args.repeat)
        method = build_method("flce")
        method.setup(Federation(model=model, n_clients=n, n_classes=10, rounds=2, clients_per_round=n,
                                client_sizes=np.full(n, 200), device=torch.device("cpu")))
        protos, counts = class_prototypes(model, flats, {}, ds.x_train, ds.y_train, indices, 10)
        updates = ClientUpdates(clients=np.arange(n), flat=flats, buffers={}, sizes=np.full(n, 200),
                                extras={"prototypes": protos, "prototype_counts": counts})
        state = RoundState(round=0, rng=np.random.default_rng(0), global_flat=flats[0], global_buffers={}, lr=0.1)
        server = median_time(lambda: method.weigh(state, updates), args.repeat)
        print(f"N = {n:3d}: prototypes batched {batched:.3f} s, per-client loop {loop:.3f} s "
              f"(x{loop / batched:.2f}); server Eq. 6-10 {1000 * server:.2f} ms")
    x = torch.rand(1000, 2, dtype=torch.float64) @ torch.rand(2, 50, dtype=torch.float64)
    observed = torch.rand(1000, 50) < 0.2
    completion = median_time(lambda: complete_matrix(torch.where(observed, x, torch.zeros_like(x)), observed),
                             args.repeat)
    print(f"completion of a 1000 x 50 matrix (20 % observed, rank 1, 2,000 steps): {completion:.2f} s")


if __name__ == "__main__":
    main()
