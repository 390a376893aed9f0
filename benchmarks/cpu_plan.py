"""The CPU plan of local training, balanced vs plain, on the paper's unequal splits, in one invocation.

CELM Table 1's Fashion-MNIST rows (MLP, 5 clients, batch 128, every client every round) at seed 0,
one per split. Each is trained ``--rounds`` rounds twice in turn, ``--repeats`` times:

  - plain    (``FEDLIB_CPU_BALANCE=off``): every step computes every client of a thread's group, a
             finished client on masked padding; groups are contiguous halves of the clients;
  - balanced (``on``, the default): a step trains only the clients with samples left, and the
             threads' groups are dealt by steps (``fedlib.plans.balanced_groups``).

The table gives the median seconds of local training per round (``time_train``), the ratio
plain / balanced, and ``waste``: the client-steps the plain plan computes over those with samples
(the ratio's ceiling on one thread). Both plans end with the same global model (checked: the
largest parameter difference is printed; 0 for the MLP). The load average is recorded: ratios
measured while other work shares the cores are indicative.

    python benchmarks/cpu_plan.py [--rounds 3] [--repeats 2] [--splits dir0.01 dir0.05 dir0.1 pls sls]
                                  [--json benchmarks/results/cpu_plan_<device>.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from fedlib.app.book import load_profile  # noqa: E402
from fedlib.app.chapters.celm import protocol as celm_protocol  # noqa: E402
from fedlib.provenance import device_name, environment  # noqa: E402
from fedlib.engine import _execute  # noqa: E402
from fedlib.federation import prepare  # noqa: E402

SPLITS = {"dir0.01": ("dirichlet", 0.01), "dir0.05": ("dirichlet", 0.05), "dir0.1": ("dirichlet", 0.1),
          "pls": ("pls", None), "sls": ("sls", None)}


def table1_fedavg(split: str, rounds: int):
    """CELM Table 1 Fashion-MNIST, FedAvg, seed 0, on ``split``, cut to ``rounds`` rounds."""
    name, alpha = SPLITS[split]
    for config in celm_protocol.experiment_configs(load_profile("celm", "paper"), "table1"):
        if (config.method.name.startswith("fedavg") and config.seed == 0 and config.split.name == name
                and (alpha is None or math.isclose(getattr(config.split, "alpha", -1.0), alpha))):
            return config.model_copy(update={"rounds": rounds})
    raise SystemExit(f"no CELM Table 1 FedAvg seed-0 run on {split}")


def timed(config, plan: str):
    os.environ["FEDLIB_CPU_BALANCE"] = plan
    result = _execute(replace(prepare(config), keep_model=True), False, None)
    return statistics.median(h["time_train"] for h in result.history), result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--splits", nargs="+", default=list(SPLITS), choices=list(SPLITS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = []
    print(f"device: {device_name('cpu')}; torch threads {torch.get_num_threads()}; rounds {args.rounds}", flush=True)
    for split in args.splits:
        config = table1_fedavg(split, args.rounds)
        timed(config, "on")  # warm: data, code paths
        times = {"off": [], "on": []}
        load_before = os.getloadavg()[0]
        for _ in range(args.repeats):
            for plan in ("off", "on"):
                seconds, result = timed(config, plan)
                times[plan].append(seconds)
                if plan == "off":
                    plain_model = result.model[0]
                else:
                    difference = float((result.model[0] - plain_model).abs().max())
        sizes = result.meta["client_sizes"]
        steps = [max(1, math.ceil(s / config.batch_size)) for s in sizes]
        row = {"split": split, "client_sizes": sizes, "waste": round(len(steps) * max(steps) / sum(steps), 3),
               "plain_s": round(min(times["off"]), 4), "balanced_s": round(min(times["on"]), 4),
               "plain_over_balanced": round(min(times["off"]) / min(times["on"]), 3),
               "max_parameter_difference": difference,
               "load_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
        rows.append(row)
        print(f"{split:8} waste {row['waste']:4.2f}  plain {row['plain_s']:7.3f} s/round  balanced "
              f"{row['balanced_s']:7.3f} s/round  plain/balanced {row['plain_over_balanced']:5.2f}x  "
              f"max |dw| {difference:.1e}  load {row['load_before_after'][0]:.1f} -> {row['load_before_after'][1]:.1f}",
              flush=True)
    if args.json:
        record = {"benchmark": "cpu_plan", **environment("cpu"), "rounds": args.rounds, "repeats": args.repeats,
                  "rows": rows}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
