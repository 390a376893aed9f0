"""FedSCM timings: one selection and the K clients' predictions on the server set.

1. One FedSCM selection with K = 500 clients, n = 1,000 server samples, C = 10 classes
   (predictions simulated from the expertise model, Def. 4; 3 experts, γ = 2/3): PGD and
   SLSQP, each with the analytic gradient of Prop. 7.
2. All K client models' predictions on the n server samples: one batched (vmapped) pass
   per chunk of models (``scm_pipeline.client_probabilities``) vs a loop over clients
   (``client_probabilities_loop``), for the MLP on Fashion-MNIST-shaped inputs and,
   optionally, the CNN.

Every number is the median of ``--repeats`` runs after a warm-up, all measured in this
one invocation; ratios are computed from those medians.

    python benchmarks/scm_speed.py [--clients 500] [--samples 1000] [--models mlp cnn] [--device cpu]

Memory: a batched pass holds ``model_chunk x batch_size`` samples' activations; for the CNN on
a CPU use e.g. ``--model-chunk 10 --batch-size 250``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from fedlib.methods import scm
from fedlib.models import build_model
from fedlib.population import ParamLayout
from fedlib.scm_pipeline import client_probabilities
from fedlib.testing import client_probabilities_loop


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, repeats: int, device) -> float:
    fn()  # warm-up
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def population(name: str, k: int, device):
    torch.manual_seed(0)
    model = build_model(name, (1, 28, 28), 10).to(device)
    layout = ParamLayout(model)
    flat = layout.flat_of(model).unsqueeze(0) + 0.01 * torch.randn(k, layout.size, device=device)
    bufs = {n: b.unsqueeze(0).expand(k, *b.shape).clone() for n, b in layout.buffers_of(model).items()}
    return model, flat, bufs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=500)
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--models", nargs="+", default=["mlp"])
    ap.add_argument("--model-chunk", type=int, default=100, help="models per batched pass")
    ap.add_argument("--batch-size", type=int, default=1000, help="server samples per batched pass")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    k, n, c = args.clients, args.samples, args.classes
    print(f"device {device} ({platform.machine()}, {torch.get_num_threads()} threads), torch {torch.__version__}")

    sample = scm.simulate_expertise(k, n, c, scm.expertise_levels(k, 3, seed=0), seed=0)
    rows = {}
    for solver in ("pgd", "slsqp"):
        out = scm.select(sample.probs, 2 / 3, solver)
        ok = set(out.selected) == set(sample.experts)
        rows[solver] = timed(lambda s=solver: scm.select(sample.probs, 2 / 3, s), args.repeats, device)
        print(f"selection  K={k} n={n} C={c} {solver.upper():5s} {rows[solver]:8.3f} s  "
              f"({out.iterations} iterations, experts recovered: {ok})", flush=True)
    print(f"selection  ratio SLSQP / PGD: {rows['slsqp'] / rows['pgd']:.1f}x")

    for name in args.models:
        model, flat, bufs = population(name, k, device)
        x = torch.randn(n, 1, 28, 28, generator=torch.Generator().manual_seed(1)).to(device)
        def batched_pass(m=model, f=flat, b=bufs, xs=x):
            return client_probabilities(m, f, b, xs, model_chunk=args.model_chunk, batch_size=args.batch_size)

        def loop_pass(m=model, f=flat, b=bufs, xs=x):
            return client_probabilities_loop(m, f, b, xs, batch_size=args.batch_size)

        batched = timed(batched_pass, args.repeats, device)
        looped = timed(loop_pass, args.repeats, device)
        diff = (batched_pass() - loop_pass()).abs().max().item()
        print(f"predictions {name:4s} K={k} n={n}: batched {batched:7.3f} s, loop over clients {looped:7.3f} s, "
              f"ratio loop / batched {looped / batched:.2f}x (max |difference| {diff:.1e})")


if __name__ == "__main__":
    main()
