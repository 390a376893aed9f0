"""One FedAvg round: vectorized engine vs the per-client loop vs one centralized epoch.

Fashion-MNIST, CELM's MLP, 1 local epoch, batch 128, lr 0.1, all clients selected, IID
split of the 60,000 training samples over N clients. Each number is the median of
several rounds after a warm-up round, all measured in this one invocation.

    python benchmarks/round_speed.py [--clients 5 20 100 500] [--rounds 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from fedlib.data import load_dataset
from fedlib.models import build_model
from fedlib.partition import iid
from fedlib.population import LocalTraining, ParamLayout, aggregate, make_client_batches
from fedlib.training import train_clients
from fedlib.testing import train_clients_loop


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fedavg_round(engine, model, flat, x, y, indices, cfg, seed, device):
    batches = make_client_batches(indices, cfg.batch_size, cfg.epochs, torch.Generator().manual_seed(seed))
    batches.index, batches.mask = batches.index.to(device), batches.mask.to(device)
    trained, _ = engine(model, flat, {}, x, y, batches, cfg)
    sizes = torch.tensor([len(ix) for ix in indices], dtype=torch.float32, device=device)
    return aggregate(trained, sizes / sizes.sum())


def centralized_epoch(model, x, y, batch_size, lr, seed):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed)).to(x.device)
    for lo in range(0, len(y), batch_size):
        idx = order[lo : lo + batch_size]
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()


def timed(fn, rounds, device):
    times = []
    for r in range(rounds + 1):  # the first call is a warm-up
        _sync(device)
        t0 = time.perf_counter()
        fn(r)
        _sync(device)
        if r:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[5, 20, 100, 500])
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per engine (median)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--skip-loop-above", type=int, default=10**9, help="skip the loop oracle for larger N")
    args = ap.parse_args()
    device = torch.device(args.device)
    ds = load_dataset("fmnist", device=device)
    x, y = ds.x_train, ds.y_train
    torch.manual_seed(0)
    model = build_model("mlp", ds.input_shape, ds.num_classes).to(device)
    flat = ParamLayout(model).flat_of(model)
    cfg = LocalTraining(epochs=1, batch_size=128, lr=0.1)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    print(f"device: {device} ({name}), torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"FedAvg round, Fashion-MNIST MLP, 1 epoch, batch 128, {len(y)} samples; median of {args.rounds} rounds")
    central = timed(lambda r: centralized_epoch(model, x, y, 128, 0.1, r), args.rounds, device)
    header = f"{'N':>5} {'samples/client':>14} {'vectorized s':>12} {'loop s':>8} {'central s':>9} {'vec/central':>11} {'loop/vec':>8}"
    print(header)
    for n in args.clients:
        indices = iid(y.cpu().numpy(), n, seed=0).indices
        vec = timed(lambda r: fedavg_round(train_clients, model, flat, x, y, indices, cfg, r, device),
                    args.rounds, device)
        if n <= args.skip_loop_above:
            loop = timed(lambda r: fedavg_round(train_clients_loop, model, flat, x, y, indices, cfg, r, device),
                         args.rounds, device)
            loop_text, ratio = f"{loop:8.3f}", f"{loop / vec:7.2f}x"
        else:
            loop_text, ratio = f"{'-':>8}", f"{'-':>8}"
        print(f"{n:>5} {len(y) // n:>14} {vec:>12.3f} {loop_text} {central:>9.3f} {vec / central:>10.2f}x {ratio}")


if __name__ == "__main__":
    main()
