"""Precision and memory format of local training on a CPU, in one invocation (issue 45).

For each model (CELM's MLP and LeNet-5 on Fashion-MNIST-shaped inputs 1 x 28 x 28; the CIFAR-10 CNN, ``cnn_wide``
and ResNet-20 on CIFAR-10-shaped inputs 3 x 32 x 32; random values: the timing does not depend on them) and each
variant

  - float32 contiguous (the baseline), float32 channels-last,
  - bfloat16 contiguous, bfloat16 channels-last   (``LocalTraining.precision``, ``LocalTraining.memory_format``;
    channels-last only for the models with convolutions, where it applies),

two workloads are timed, the variants interleaved ``--repeats`` times (repeat r runs every variant once, in turn,
so a ratio compares measurements taken seconds apart):

  - step:  one client's local steps (``train_clients`` of one client, ``order="clients"``: plain autograd, the
           path a convolutional model's clients take on a CPU), batch 128, ``--steps`` steps per measurement;
  - round: a short federated round: ``--clients`` clients of ``--round-steps`` steps each under the engine's own
           plan (``execution_plan``), their weighted average and the new model's evaluation on 1,024 test samples.

Each row gives runs (steps or rounds) per core-hour, median over the repeats (core-hours: seconds x the intra-op
threads), and each variant's ratio to float32 contiguous: the median and the min-max of the per-repeat ratios.
It also gives the relative parameter difference ||w - w_ref|| / ||w_ref - w_start|| of the variant's step vs
float32 contiguous (float summation order for channels-last; bfloat16's rounding for bfloat16). The load average
before and after is recorded: ratios measured while other work shares the cores are indicative.

Under vmap (the vectorized plan) a convolution of M clients is one grouped convolution whose batching rule copies
the input back to contiguous, so channels-last applies only where a client trains alone (and to a one-model
evaluation); bfloat16 applies everywhere.

    nice -n 5 python benchmarks/precision.py [--models mlp lenet5 cnn cnn_wide resnet20] [--repeats 5]
                                             [--json benchmarks/results/precision_cpu-2core.json]
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
from fedlib.population import (LocalTraining, ParamLayout, aggregate, evaluate, make_client_batches, stack_buffers)  # noqa: E402
from fedlib.training import train_clients  # noqa: E402
from fedlib.provenance import environment  # noqa: E402

SHAPES = {"mlp": (1, 28, 28), "lenet5": (1, 28, 28), "cnn": (3, 32, 32), "cnn_wide": (3, 32, 32), "resnet20": (3, 32, 32)}
BATCH = 128
TEST = 1024


def variants(model: torch.nn.Module) -> list[tuple[str, str]]:
    """(precision, memory format) pairs; the baseline first. Channels-last only where a convolution is."""
    conv = any(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    formats = ("contiguous", "channels_last") if conv else ("contiguous",)
    return [(p, f) for p in ("float32", "bfloat16") for f in formats]


def label(variant: tuple[str, str]) -> str:
    return f"{variant[0]} {variant[1].replace('_', '-')}"


def measure(name: str, repeats: int, steps: int, clients: int, round_steps: int, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    shape = SHAPES[name]
    model = build_model(name, shape, 10)
    layout = ParamLayout(model)
    start, buffers = layout.flat_of(model), stack_buffers(layout.buffers_of(model), 1)
    g = torch.Generator().manual_seed(seed)
    pool = max(BATCH * steps, clients * BATCH * round_steps)
    x = torch.randn(pool, *shape, generator=g)
    y = torch.randint(0, 10, (pool,), generator=g)
    x_test, y_test = torch.randn(TEST, *shape, generator=g), torch.randint(0, 10, (TEST,), generator=g)
    one = make_client_batches([np.arange(BATCH * steps)], BATCH, 1, torch.Generator().manual_seed(seed + 1))
    many = make_client_batches(np.split(np.arange(clients * BATCH * round_steps), clients), BATCH, 1,
                               torch.Generator().manual_seed(seed + 2))
    sizes = torch.full((clients,), float(BATCH * round_steps))
    base = LocalTraining(epochs=1, batch_size=BATCH, lr=0.05, momentum=0.9, workers=1)
    runs = variants(model)

    def step(variant):
        cfg = replace(base, precision=variant[0], memory_format=variant[1], order="clients")
        return train_clients(model, start, buffers, x, y, one, cfg)[0]

    def federated_round(variant):
        cfg = replace(base, precision=variant[0], memory_format=variant[1])
        os.environ["FEDLIB_MEMORY_FORMAT"] = variant[1]  # the evaluation's format (it has no LocalTraining)
        flat, bufs = train_clients(model, start, buffers, x, y, many, cfg)
        new, new_bufs = aggregate(flat, sizes / sizes.sum(), bufs)
        evaluate(model, new.unsqueeze(0), {k: v.unsqueeze(0) for k, v in new_bufs.items()}, x_test, y_test, 10)
        return new

    threads = torch.get_num_threads()
    out: dict = {"model": name, "input_shape": list(shape), "parameters": layout.size, "batch": BATCH,
                 "intra_op_threads": threads}
    for workload, fn, unit in (("step", step, f"{steps} steps of one client"),
                               ("round", federated_round, f"{clients} clients x {round_steps} steps + evaluation")):
        results = {v: fn(v) for v in runs}  # warm-up, and the numbers to compare
        seconds: dict = {v: [] for v in runs}
        for _ in range(repeats):
            for v in runs:
                t0 = time.perf_counter()
                fn(v)
                seconds[v].append(time.perf_counter() - t0)
        ref = runs[0]
        moved = float((results[ref] - start).norm())
        rows = {}
        for v in runs:
            ratios = [a / b for a, b in zip(seconds[ref], seconds[v])]
            per_run = statistics.median(seconds[v]) / (steps if workload == "step" else 1)
            rows[label(v)] = {
                "seconds": [round(s, 4) for s in seconds[v]],
                "per_core_hour": round(3600 / (per_run * threads), 1),
                "ratio_to_float32_contiguous": round(statistics.median(ratios), 3),
                "ratio_min_max": [round(min(ratios), 3), round(max(ratios), 3)],
                "parameter_difference": float((results[v] - results[ref]).norm()) / max(moved, 1e-30),
            }
        os.environ.pop("FEDLIB_MEMORY_FORMAT", None)  # the plan "auto" takes, not the last variant's
        cfg = replace(base, order="clients") if workload == "step" else base
        n = 1 if workload == "step" else clients
        out[workload] = {"unit": unit, "per_core_hour_of": "steps" if workload == "step" else "rounds",
                         "plan": execution_plan(cfg, n, "cpu", model, x[0], float(steps if n == 1 else round_steps)),
                         "variants": rows}
    os.environ.pop("FEDLIB_MEMORY_FORMAT", None)
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="steps per measurement of one client")
    ap.add_argument("--clients", type=int, default=5, help="clients of the federated round")
    ap.add_argument("--round-steps", type=int, default=2, help="steps of each client in the round")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    for flag in ("repeats", "steps", "clients", "round_steps"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')}: must be >= 1")
    if os.environ.get("FEDLIB_MEMORY_FORMAT"):
        ap.error("unset FEDLIB_MEMORY_FORMAT: the benchmark sets the format of each variant")
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    rows = []
    print(f"{'model':9} {'workload':8} {'variant':27} {'per core-hour':>14} {'ratio':>6} {'min-max':>12}")
    for name in args.models:
        row = measure(name, args.repeats, args.steps, args.clients, args.round_steps)
        rows.append(row)
        for workload in ("step", "round"):
            for v, r in row[workload]["variants"].items():
                lo, hi = r["ratio_min_max"]
                print(f"{name:9} {workload:8} {v:27} {r['per_core_hour']:>14.0f} {r['ratio_to_float32_contiguous']:>6.2f} "
                      f"{lo:>5.2f}-{hi:<5.2f}", flush=True)
    out = {"benchmark": "precision", **environment("cpu", commit=False), "repeats": args.repeats,
           "cpu_bf16": _cpu_bf16(), "load_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
           "wall_s": round(time.perf_counter() - t0, 1), "rows": rows}
    if args.json:
        tmp = args.json.with_suffix(".json.part")
        tmp.write_text(json.dumps(out, indent=1))
        tmp.replace(args.json)
    return out


def _cpu_bf16() -> bool | None:
    """Whether the CPU has native bfloat16 arithmetic (AVX-512 BF16 or AMX), from /proc/cpuinfo (None: unknown)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return "avx512_bf16" in flags or "amx_bf16" in flags


if __name__ == "__main__":
    main()
