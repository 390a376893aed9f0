"""Packed vs separate runs: runs per device-minute at pack sizes 1, 5, 25 and 75, in one invocation.

The workload is CELM Table 1's CIFAR-10 rows at the paper profile (CNN, 5 clients, batch 128, 5 splits x
5 methods x 3 seeds = 75 runs; ``fedlib.app.chapters.celm``), taken in queue order: a pack of R is its first R
runs. Each size runs them separately (one after another, ``fedlib.run``) and packed (``run_many(pack=True)``,
one population), from a warm process, and reports runs per device-minute, the ratio packed/separate and the
achieved FLOP/s: training sample passes x FLOPs of one sample's forward and backward pass
(``torch.utils.flop_counter``), as a fraction of a 4096 x 4096 float32 matmul's FLOP/s measured on the same
device (the device's practical peak).

``--reduce`` (default on a CPU) shrinks every run the same way, and the output says so: ``--rounds`` rounds,
``--fraction`` of the training data (and 100 server validation samples), ``--test-samples`` test samples. ``--models mlp lenet5`` adds
Fashion-MNIST runs of CELM Table 1 with that model (pack sizes up to 25), the CPU goal of issue #28.

    python benchmarks/packed.py [--device cpu|cuda] [--sizes 1 5 25 75] [--models cnn mlp lenet5]
                                [--rounds 2 --fraction 0.01 --test-samples 200] [--json out.json]
                                [--cudnn-benchmark] [--top-kernels 15] [--conv native matmul]
                                [--compact on off] [--precision float32 bfloat16]

``--cudnn-benchmark`` lets cuDNN time its algorithms per shape (torch.backends.cudnn.benchmark; packs have
fixed shapes): run it beside a plain run to see what it is worth. ``--top-kernels N`` first profiles one
packed round of a pack of 5 runs, or of the largest size if smaller (torch.profiler), and reports the N
operators with the most device time (self time; CPU time on a CPU): where a packed step spends it. ``--conv
native matmul`` measures each pack under both convolution lowerings (``fedlib.layers.Conv2d``: vmap's grouped
convolution, or unfold + one matmul per model); ``auto`` is the engine's own choice (native on a CPU, timed
per shape on CUDA). ``--compact on off`` measures each pack with captured steps that replay only the clients
with samples (``FEDLIB_COMPACT``, a CUDA plan: on a CPU the eager steps skip them under
``FEDLIB_CPU_BALANCE``) and with the masked replay. The JSON is rewritten after every row, so a run stopped by
a timeout keeps its rows. ``--precision float32 bfloat16`` measures every pack in each local-training precision
(``RunConfig.precision``; on CUDA, float32 convolutions run in TF32, cuDNN's default, and the record says so),
each with its own kernel profile under ``--top-kernels``.

``--repeats K`` (default 3 on a CPU, 1 on a GPU) measures each pack size K times, separate and packed
interleaved, so a change of load hits both alike: a row reports the medians and the range of the K ratios.
Load average before and after each measurement is recorded: on a shared machine the ratios are noise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from fedlib.app.book import load_profile  # noqa: E402
from fedlib.app.chapters.celm import protocol as celm_protocol  # noqa: E402
from fedlib.app.queue import work  # noqa: E402
from fedlib.data import load_dataset  # noqa: E402
from fedlib.models import build_model  # noqa: E402
from fedlib.training import CONV_CHOICES  # noqa: E402
from fedlib.run import run, run_many  # noqa: E402


def table1_configs(model: str, device: str, rounds: int | None, fraction: float | None, test_samples: int | None,
                   precision: str = "float32"):
    """CELM Table 1 runs of the paper profile: CIFAR-10 (model cnn) or Fashion-MNIST with ``model``."""
    params = load_profile("celm", "paper")
    experiment = "table1_cifar10" if model == "cnn" else "table1"
    configs = [c for c in celm_protocol.experiment_configs(params, experiment)]
    change = {"device": device, "precision": precision}
    if model != "cnn":
        change["model"] = model
    if rounds:
        change["rounds"] = rounds
    if fraction:
        change["fraction"] = fraction
        change["server_val"] = 100  # the servers' validation hold-out, shrunk with the data
    if test_samples:
        change["test_samples"] = test_samples
    return [c.model_copy(update=change) for c in configs]


def flops_per_sample(config) -> float:
    """FLOPs of one training sample's forward and backward pass through the config's model."""
    ds = load_dataset(config.dataset)
    model = build_model(config.model, ds.input_shape, ds.num_classes)
    x = torch.zeros(8, *ds.input_shape)
    y = torch.zeros(8, dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    return counter.get_total_flops() / 8


def matmul_peak(device: str) -> float:
    """FLOP/s of a 4096 x 4096 float32 matmul on ``device`` (median of 5)."""
    a = torch.randn(4096, 4096, device=device)
    b = torch.randn(4096, 4096, device=device)
    times = []
    for _ in range(6):
        sync(device)
        t = time.perf_counter()
        a @ b
        sync(device)
        times.append(time.perf_counter() - t)
    return 2 * 4096**3 / sorted(times[1:])[2]


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn) -> tuple[float, tuple, tuple]:
    before = os.getloadavg()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t, before, os.getloadavg()


def measure(configs, sizes, device, peak, label, convs=("auto",), on_row=None, compacts=("on",),
            repeats: int = 1) -> list[dict]:
    """Per pack size: the runs separately (under the first of ``convs`` and ``compacts``), then packed
    under each convolution lowering of ``convs`` (FEDLIB_CONV: native, matmul, auto) and each setting of
    ``compacts`` (FEDLIB_COMPACT: captured steps replay only the clients with samples; CUDA only), all of
    it ``repeats`` times in turn; a row holds the median times and the range of the per-repeat ratios.
    ``on_row`` gets each row as it is measured."""
    flops = flops_per_sample(configs[0])
    warm = [c.model_copy(update={"rounds": 1}) for c in configs[:2]]  # data decoded, code paths warm, both ways
    for conv in convs:
        os.environ["FEDLIB_CONV"] = conv
        run_many(warm, cache=False, progress=False, pack=True)
    os.environ["FEDLIB_CONV"], os.environ["FEDLIB_COMPACT"] = convs[0], compacts[0]
    run_many(warm, cache=False, progress=False)
    rows = []
    for size in sizes:
        chosen = configs[:size]
        passes = sum(work(c) for c in chosen)
        variants = [(c, k) for c in convs for k in compacts]
        separates, packs, loads = [], {v: [] for v in variants}, []
        for _ in range(repeats):  # interleaved: a change of load during the size hits both ways alike
            os.environ["FEDLIB_CONV"], os.environ["FEDLIB_COMPACT"] = convs[0], compacts[0]
            seconds, load_a, _ = timed(lambda: [run(c, cache=False, progress=False) for c in chosen])
            separates.append(seconds)
            for conv, compact in variants:
                os.environ["FEDLIB_CONV"], os.environ["FEDLIB_COMPACT"] = conv, compact
                seconds, _, load_d = timed(lambda: run_many(chosen, cache=False, progress=False, pack=True))
                packs[conv, compact].append(seconds)
            loads += [load_a[0], load_d[0]]
        separate = float(np.median(separates))
        for conv, compact in variants:
            packed = float(np.median(packs[conv, compact]))
            ratios = [s / p for s, p in zip(separates, packs[conv, compact])]
            row = {"workload": label, "pack_size": size, "runs": len(chosen), "conv": conv, "compact": compact,
                   "separate_conv": convs[0], "separate_compact": compacts[0], "repeats": repeats,
                   "separate_s": round(separate, 3), "packed_s": round(packed, 3),
                   "separate_runs_per_min": round(len(chosen) / separate * 60, 3),
                   "packed_runs_per_min": round(len(chosen) / packed * 60, 3),
                   "packed_over_separate": round(separate / packed, 3),
                   "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
                   "training_flops": passes * flops,
                   "packed_flops_per_s": passes * flops / packed,
                   "packed_fraction_of_peak": round(passes * flops / packed / peak, 5),
                   "load_before_after": [round(loads[0], 2), round(max(loads[1:]), 2)]}
            rows.append(row)
            if on_row is not None:
                on_row(row)
            print(f"{label:28} R={size:3d}  separate {separate:8.1f} s ({row['separate_runs_per_min']:7.2f} runs/min)"
                  f"  packed [conv {conv:6}, compact {compact:3}] {packed:8.1f} s ({row['packed_runs_per_min']:7.2f} runs/min)  "
                  f"packed/separate {row['packed_over_separate']:5.2f}x  "
                  f"(range {min(ratios):.2f}-{max(ratios):.2f}, {repeats} repeats)  "
                  f"{row['packed_fraction_of_peak'] * 100:6.2f} % of peak  load {loads[0]:.1f} -> max {max(loads[1:]):.1f}",
                  flush=True)
    return rows


PROFILED_PACK = 5  # runs in the profiled pack: the size that trained the most samples per second on an H100


def top_kernels(configs, device: str, n: int) -> list[dict]:
    """The ``n`` operators with the most self device time (CPU time on a CPU) in one packed round of
    ``configs``, printed and returned as rows (name, calls, milliseconds, share of the total)."""
    from torch.profiler import ProfilerActivity, profile

    one_round = [c.model_copy(update={"rounds": 1}) for c in configs]
    run_many(one_round, cache=False, progress=False, pack=True)  # warm: captured steps, data
    cuda = torch.device(device).type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        run_many(one_round, cache=False, progress=False, pack=True)
        sync(device)
    events = prof.key_averages()
    own = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    total = sum(own(e) for e in events) or 1
    rows = [{"name": e.key[:120], "calls": e.count, "ms": round(own(e) / 1000, 3), "share": round(own(e) / total, 4)}
            for e in sorted(events, key=own, reverse=True)[:n]]
    print(f"top {n} operators of one packed round ({len(configs)} runs, {'device' if cuda else 'CPU'} self time):")
    for r in rows:
        print(f"  {r['share'] * 100:5.1f} %  {r['ms']:10.1f} ms  {r['calls']:6d} x  {r['name']}")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 5, 25, 75])
    parser.add_argument("--models", nargs="+", default=["cnn"], choices=["cnn", "mlp", "lenet5"],
                        help="cnn: the CIFAR-10 rows with the paper profile's CNN (its cifar10_reading); "
                             "mlp, lenet5: Fashion-MNIST")
    parser.add_argument("--rounds", type=int, help="rounds per run (default: the paper's; 2 on a CPU)")
    parser.add_argument("--fraction", type=float, help="share of the training data (default: all; 0.01 on a CPU)")
    parser.add_argument("--test-samples", type=int, help="test samples (default: all; 200 on a CPU)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark = True")
    parser.add_argument("--conv", nargs="+", default=["auto"], choices=["native", "matmul", "auto"],
                        help="convolution lowerings to measure packed (FEDLIB_CONV; default auto)")
    parser.add_argument("--compact", nargs="+", default=["on"], choices=["on", "off"],
                        help="captured steps replay only the clients with samples (FEDLIB_COMPACT; CUDA only; "
                             "default on)")
    parser.add_argument("--repeats", type=int, help="measurements per pack size, separate and packed in turn "
                        "(default: 3 on a CPU, 1 on a GPU); a row reports the medians and the ratios' range")
    parser.add_argument("--precision", nargs="+", default=["float32"], choices=["float32", "bfloat16"],
                        help="local training's precision(s) to measure every pack in (RunConfig.precision)")
    parser.add_argument("--top-kernels", type=int, default=0, metavar="N",
                        help="first, profile one packed round of a pack of 5 runs (or the largest size); report the N costliest operators")
    args = parser.parse_args(argv)
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    reduced = torch.device(args.device).type == "cpu"
    rounds = args.rounds or (2 if reduced else None)
    fraction = args.fraction or (0.01 if reduced else None)
    test_samples = args.test_samples or (200 if reduced else None)
    repeats = args.repeats if args.repeats is not None else (3 if reduced else 1)
    if repeats < 1:
        parser.error(f"--repeats must be at least 1 (got {repeats})")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    peak = matmul_peak(args.device)
    from fedlib.provenance import device_name as name_of
    from fedlib.provenance import environment

    device_name = name_of(args.device)
    print(f"device: {device_name}; 4096^2 float32 matmul: {peak / 1e9:.1f} GFLOP/s; protocol: "
          + ("paper" if not (rounds or fraction or test_samples) else
             f"REDUCED (rounds {rounds or 'paper'}, fraction {fraction or 1}, test samples {test_samples or 'all'})"),
          flush=True)
    rows: list[dict] = []
    record = {"benchmark": "packed", **environment(args.device), "matmul_flops_per_s": peak,
              "cudnn_benchmark": args.cudnn_benchmark, "conv": args.conv, "compact": args.compact, "repeats": repeats,
              "precision": args.precision, "top_kernels": None, "top_kernels_by_precision": {},
              "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
              "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
              "reduced": {"rounds": rounds, "fraction": fraction, "test_samples": test_samples}, "rows": rows}

    def save(_row=None) -> None:  # after every row: a benchmark stopped by a timeout keeps what it measured
        if args.json:
            record["conv_choices"] = {" | ".join(map(str, k)): v for k, v in CONV_CHOICES.items()}
            args.json.parent.mkdir(parents=True, exist_ok=True)
            partial = args.json.with_name(args.json.name + ".part")
            partial.write_text(json.dumps(record, indent=1) + "\n")
            partial.replace(args.json)

    for i, model in enumerate(args.models):
        for precision in args.precision:
            configs = table1_configs(model, args.device, rounds, fraction, test_samples, precision)
            label = f"CELM T1 CIFAR-10 {configs[0].model}" if model == "cnn" else f"CELM T1 F-MNIST {model}"
            label += "" if precision == "float32" else f" {precision}"
            sizes = [s for s in args.sizes if s <= len(configs)]
            if args.top_kernels and i == 0:  # first: a sweep cut off by a timeout must not cost the profile
                previous = os.environ.get("FEDLIB_CONV")
                os.environ["FEDLIB_CONV"] = args.conv[0]
                kernels = top_kernels(configs[:min(PROFILED_PACK, max(sizes))], args.device, args.top_kernels)
                record["top_kernels_by_precision"][precision] = kernels
                record["top_kernels"] = record["top_kernels"] or kernels
                os.environ.pop("FEDLIB_CONV") if previous is None else os.environ.update(FEDLIB_CONV=previous)
                save()
            measure(configs, sizes, args.device, peak, label, tuple(args.conv),
                    on_row=lambda row, p=precision: (rows.append({**row, "precision": p}), save()),
                    compacts=tuple(args.compact), repeats=repeats)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
