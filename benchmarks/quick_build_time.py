"""How long the quick book takes: from an empty cache, re-executed from a warm cache, unchanged.

Measure (on a quiet machine; benchmarks/README.md's figure comes from this):

    python benchmarks/quick_build_time.py [--profile quick] [--jobs 2]

runs ``python -m fedlib book`` three times in a fresh temporary result cache and stage:
1. cold: empty result cache, nothing executed (what a fresh clone's ``make book`` does);
2. warm: every chapter re-executed (``--force``), its runs read from the result cache;
3. unchanged: nothing changed, chapters kept, only the HTML rebuilt.
It prints each chapter's time in each build and writes them, with the machine, to
``benchmarks/results/quick_build_<host>.json``.

Estimate (minutes, no book build; what the quick profiles were sized with):

    python benchmarks/quick_build_time.py --estimate celm fedms

For each chapter with a ``configs(params)`` (fedavg, celm, fedms, flce, leaderboard, ...), one
3-round run of every distinct (data, model, clients, method) group of its profile is timed in
process CPU seconds with one thread (robust to other load on the machine), and scaled to the
group's runs and rounds: est = sum over runs of T3 + (rounds - 3) x (time of round 2). Chapter
overheads (kernel start, figures) and chapters without ``configs`` are not included.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_once(profile: str, jobs: int, env: dict, force: bool) -> dict:
    cmd = [sys.executable, "-m", "fedlib", "book", "--profile", profile, "--jobs", str(jobs)] + (["--force"] if force
                                                                                                  else [])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    wall = time.perf_counter() - t0
    print(proc.stdout, flush=True)
    stage = Path(env["FEDLIB_BOOK_OUT"]) / profile
    timings = json.loads((stage / "timings.json").read_text())["chapters"] if (stage / "timings.json").is_file() else {}
    log = [line.replace(str(env["FEDLIB_BOOK_OUT"]), "<stage>") for line in proc.stdout.splitlines()[-20:]]
    return {"wall": wall, "returncode": proc.returncode, "log": log,  # no machine paths in the record
            "chapters": {c: t["wall"] for c, t in timings.items()}}


def measure(profile: str, jobs: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="fedlib-quick-build-"))
    env = {**os.environ, "FEDLIB_CACHE": str(work / "cache"), "FEDLIB_BOOK_OUT": str(work / "executed"),
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    # datasets are read through the data cache: keep the usual one so that "cold" means cold *results*
    default_cache = Path(os.environ.get("FEDLIB_CACHE") or Path.home() / ".cache" / "fedlib")
    if (default_cache / "datasets").is_dir():
        (work / "cache").mkdir(parents=True)
        (work / "cache" / "datasets").symlink_to(default_cache / "datasets")
    out = {"profile": profile, "jobs": jobs, "host": socket.gethostname(), "cpu": platform.processor() or
           platform.machine(), "cores": os.cpu_count(), "date": _dt.datetime.now(_dt.timezone.utc).isoformat(
               timespec="seconds")}
    for name, force in (("cold", False), ("warm", True), ("unchanged", False)):
        print(f"== {name} build", flush=True)
        out[name] = build_once(profile, jobs, env, force)
    return out


def estimate(chapter: str, profile: str) -> float:
    import torch

    torch.set_num_threads(1)
    from fedlib.app.book import load_profile
    from fedlib.app.chapters import record
    from fedlib.config import make_config
    from fedlib.run import run

    configs = record(chapter).configs(load_profile(chapter, profile))
    groups = defaultdict(list)
    for c in configs:
        groups[(c.dataset, c.model, c.fraction, c.n_clients, c.local_epochs, c.method.name,
                c.reference_values)].append(c)
    total = 0.0
    for key, members in groups.items():
        sample = members[0].to_dict()
        sample.update(rounds=min(3, sample["rounds"]), lr_milestones=[])
        stamps: list[float] = []
        t0 = time.process_time()
        run(make_config(sample), cache=False, progress=False, on_round=lambda _r: stamps.append(time.process_time()))
        t3 = time.process_time() - t0
        per_round = stamps[1] - stamps[0] if len(stamps) >= 2 else t3
        seconds = sum(t3 + max(m.rounds - 3, 0) * per_round for m in members)
        total += seconds
        print(f"  {chapter} {key}: {len(members)} run(s), 3 rounds {t3:.1f} s, a round {per_round:.2f} s "
              f"-> {seconds:.0f} s", flush=True)
    print(f"{chapter}: about {total / 60:.1f} CPU min for {len(configs)} runs", flush=True)
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="quick")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--estimate", nargs="*", metavar="CHAPTER", help="estimate these chapters' runs instead")
    args = parser.parse_args()
    if args.estimate is not None:
        from fedlib.app.chapters import registry

        chapters = args.estimate or list(registry())
        totals = {c: estimate(c, args.profile) for c in chapters}
        print("\n".join(f"{c:12s} {s / 60:5.1f} CPU min" for c, s in totals.items()))
        return 0
    result = measure(args.profile, args.jobs)
    lines = [f"{'chapter':12s} {'cold':>8s} {'warm':>8s} {'unchanged':>10s}"]
    for chapter in result["cold"]["chapters"]:
        cells = [result[b]["chapters"].get(chapter) for b in ("cold", "warm")]
        lines.append(f"{chapter:12s} " + " ".join(f"{c:7.0f}s" if c is not None else "       -" for c in cells))
    lines.append(f"{'total wall':12s} {result['cold']['wall']:7.0f}s {result['warm']['wall']:7.0f}s "
                 f"{result['unchanged']['wall']:9.0f}s   (jobs={args.jobs}, {os.cpu_count()} cores)")
    print("\n".join(lines))
    path = ROOT / "benchmarks" / "results" / f"quick_build_{socket.gethostname()}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"written: {path}")
    return 0 if all(result[b]["returncode"] == 0 for b in ("cold", "warm", "unchanged")) else 1


if __name__ == "__main__":
    sys.exit(main())
