"""CELM's logit-maximization probe of one warm-up round: batched vs the per-probe loop.

Fashion-MNIST shape (1x28x28, 10 classes), CELM's MLP, N client models + the global model
(M = N + 1, independent random initialisations), L Adam steps (lr 0.01, lambda 0.001) per
(model, class) probe from the same N(0, 1) images. ``batched`` is ``fedlib.methods.celm.probe``
(all M x 10 probes in one vmapped optimisation), ``loop`` is ``probe_loop`` (one torch.optim.Adam
per probe). Each time is the median of ``--repeats`` runs after a short warm-up, all measured
in this one invocation; the last columns check that both give the same final logits.

    python benchmarks/celm_probe.py [--clients 5 20] [--steps 200] [--repeats 1] [--device cpu]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from functools import partial

import torch

from fedlib.data import load_dataset
from fedlib.methods.celm import probe
from fedlib.testing import probe_loop
from fedlib.models import build_model
from fedlib.population import ParamLayout

LR, L2 = 0.01, 0.001  # the paper's eta and lambda


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, repeats, device):
    times, out = [], None
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[5, 20])
    ap.add_argument("--steps", type=int, default=200, help="L, Adam steps per probe")
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per implementation (median)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    ds = load_dataset("fmnist", device="cpu")
    shape, n_classes = ds.input_shape, ds.num_classes
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    print(f"device: {device} ({name}), torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"CELM probe, Fashion-MNIST {shape} x {n_classes} classes, MLP, L = {args.steps} Adam steps, "
          f"M = N + 1 models; median of {args.repeats} run(s)")
    print(f"{'N':>4} {'probes':>7} {'batched s':>10} {'loop s':>9} {'speed-up':>9} {'max |u|':>8} {'max |du|':>9}")
    for n in args.clients:
        torch.manual_seed(n)
        models = [build_model("mlp", shape, n_classes) for _ in range(n + 1)]
        layout = ParamLayout(models[0])
        flats = torch.stack([layout.flat_of(m) for m in models]).to(device)
        model = models[0].to(device)
        images = torch.randn(n + 1, n_classes, *shape, generator=torch.Generator().manual_seed(0)).to(device)
        probe(model, flats, {}, images, 2, LR, L2)  # warm-up (vmap tracing, allocator)
        batched, (u, _) = timed(partial(probe, model, flats, {}, images, args.steps, LR, L2), args.repeats, device)
        loop, (u_loop, _) = timed(partial(probe_loop, model, flats, {}, images, args.steps, LR, L2), args.repeats,
                                  device)
        gap, top = (u - u_loop).abs().max().item(), u.abs().max().item()
        print(f"{n:>4} {(n + 1) * n_classes:>7} {batched:>10.3f} {loop:>9.3f} {loop / batched:>8.1f}x "
              f"{top:>8.3f} {gap:>9.1e}")


if __name__ == "__main__":
    main()
