"""Golden values of every registered method on one tiny, fixed federation.

``tests/golden_methods.json`` keeps, per method, its ``rule_version`` and the numbers a 2-round
run produced (per round: aggregation weights, scores, cosine similarity of each update to the new
global model, test loss and accuracy; the final per-class accuracy). ``test_golden_methods.py``
fails when a method's numbers change while its ``rule_version`` did not (a silent rule change),
and when its version changed but its golden value was not regenerated.

After changing a method's rule: bump its ``rule_version`` and regenerate its golden value only
(a changed default shows in the key already; regenerate that method too). After an engine change
that changes numbers, bump ``fedlib.config.ENGINE_VERSION`` and regenerate every method:

    python tests/golden_methods.py --regenerate shapfed [cgsv ...]
    python tests/golden_methods.py --regenerate-changed   # every method whose version changed
    python tests/golden_methods.py --check                # what the test checks, as a report
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fedlib.config import ENGINE_VERSION, ConfigError, make_config  # noqa: E402
from fedlib.methods import METHODS  # noqa: E402
from fedlib.methods.base import Method  # noqa: E402
from fedlib.run import run  # noqa: E402

GOLDEN = Path(__file__).with_name("golden_methods.json")
FEDERATION = dict(dataset="synthetic", fraction=0.15, test_samples=120, model="mlp", n_clients=4, rounds=2,
                  batch_size=32, lr=0.05, split={"name": "dirichlet", "alpha": 0.5}, seed=7)
FAST = {  # smaller inner loops; the rule is the same
    "celm": {"lm_steps": 5},
    "flce": {"completion_steps": 50},
    "fedsv": {"permutations": 4},
    "logit_meta": {"meta_labeled": 20, "meta_steps": 10},
}
RTOL, ATOL = 1e-4, 1e-6  # bitwise on one machine; float noise across CPUs stays far below a rule change


PARTIAL = dict(clients_per_round=2, rounds=4)  # methods that choose clients: their rule must show


def config_of(name: str):
    extra = {"server_val": 60} if METHODS[name].needs_validation else {}
    if METHODS[name].select_clients is not Method.select_clients:
        try:
            return make_config(FEDERATION, method={"name": name, **FAST.get(name, {})}, **extra, **PARTIAL)
        except ConfigError:  # a method that needs every client each round
            pass
    return make_config(FEDERATION, method={"name": name, **FAST.get(name, {})}, **extra)


def values_of(name: str) -> dict:
    """The numbers one run of ``name`` produces on the golden federation."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = run(config_of(name), cache=False, progress=False)
    finally:
        torch.set_num_threads(threads)
    rounds = [{k: h.get(k) for k in ("aggregated", "weights", "scores", "similarity", "loss", "accuracy")}
              for h in result.history]
    return {"rounds": rounds, "final_per_class_accuracy": result.final.get("per_class_accuracy"),
            "stopped": result.final.get("stopped")}


def load() -> dict:
    return json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}


def differences(expected, got, where: str = "") -> list[str]:
    """Places where ``got`` differs from ``expected`` beyond float noise."""
    if isinstance(expected, dict) and isinstance(got, dict):
        out = []
        for k in sorted(set(expected) | set(got)):
            out += differences(expected.get(k), got.get(k), f"{where}.{k}" if where else k)
        return out
    if isinstance(expected, list) and isinstance(got, list):
        if len(expected) != len(got):
            return [f"{where}: length {len(expected)} -> {len(got)}"]
        return [d for i, (e, g) in enumerate(zip(expected, got)) for d in differences(e, g, f"{where}[{i}]")]
    if isinstance(expected, float) or isinstance(got, float):
        if isinstance(expected, (int, float)) and isinstance(got, (int, float)) and \
                math.isclose(expected, got, rel_tol=RTOL, abs_tol=ATOL):
            return []
        return [f"{where}: {expected} -> {got}"]
    return [] if expected == got else [f"{where}: {expected} -> {got}"]


def regenerate(names: list[str]) -> None:
    golden = load()
    for name in names:
        if name not in METHODS:
            raise SystemExit(f"unknown method {name!r}; known: {', '.join(sorted(METHODS))}")
        golden[name] = {"rule_version": METHODS[name].rule_version, "engine_version": ENGINE_VERSION,
                        "values": values_of(name)}
        print(f"{name}: regenerated (rule version {METHODS[name].rule_version})")
    GOLDEN.write_text(json.dumps(dict(sorted(golden.items())), indent=1) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--regenerate", nargs="+", metavar="METHOD", help="recompute these methods' golden values")
    parser.add_argument("--regenerate-changed", action="store_true",
                        help="recompute the methods whose rule_version differs from the stored one (or new ones)")
    parser.add_argument("--check", action="store_true", help="report every method's difference")
    args = parser.parse_args(argv)
    golden = load()
    if args.regenerate:
        regenerate(args.regenerate)
    if args.regenerate_changed:
        changed = [n for n in sorted(METHODS) if (golden.get(n, {}).get("rule_version"), golden.get(n, {}).get(
            "engine_version")) != (METHODS[n].rule_version, ENGINE_VERSION)]
        regenerate(changed) if changed else print("no rule version changed")
    if args.check:
        for name in sorted(METHODS):
            diff = differences(golden.get(name, {}).get("values"), values_of(name))
            print(f"{name}: {'ok' if not diff else f'{len(diff)} difference(s), first: {diff[0]}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
